"""Synchronous calls to memory agents, for the checkpoint writer and reader and ``latest()``.

One client per process (``agent_client(step)``; a forked child makes its own), running the async
RPC client on a loop thread of its own (``tectofs.client.sync``'s facade). Its connections prove
the identity this process has in the step's cluster, with a ticket of it
(``tectofs.agent.identity``). An agent that does
not answer within the call's timeout is treated as absent by lookups (``locate``, ``listing``)
and fails the call otherwise.

Agent lists are written ``HOST:PORT,HOST:PORT,...``: the first is this host's agent, the others
its peers (``TECTOFS_AGENT`` gives the default)."""

from __future__ import annotations

import asyncio
import os
import threading
import warnings
from typing import TypeVar

from tectofs import errors
from tectofs import uri as _uri
from tectofs.client.sync import _LoopThread
from tectofs.wire import messages as wire
from tectofs.wire.client import ReplySink, RpcClient

from . import messages
from .identity import TicketSource

ENVIRONMENT = "TECTOFS_AGENT"
LOOKUP_TIMEOUT_S = 3.0  # an agent that takes longer to say what it holds counts as absent
SEAL_TIMEOUT_S = 900.0
PUTS_IN_FLIGHT = 2  # pieces of one file being sent at once  # a seal may wait for replication, or for persistence when no peer takes a copy
RequestT = TypeVar("RequestT", bound=wire.Message)
ReplyT = TypeVar("ReplyT", bound=wire.Message)


def agents(value: str | None = None) -> list[str]:
    """The agent list ``value`` (else ``$TECTOFS_AGENT``) as addresses, local first; [] if none."""
    text = os.environ.get(ENVIRONMENT, "") if value is None else value
    return [a.strip() for a in text.split(",") if a.strip()]


class AgentClient:
    """Blocking calls to agents from any thread (never from the client's own loop thread)."""

    def __init__(self) -> None:
        self._loop = _LoopThread()
        self._rpc = RpcClient(connections_per_server=4, timeout_s=30.0, retries_max=1, role="client")
        self._tickets: dict[int, TicketSource] = {}  # id(FileSystem) -> its tickets
        self._lock = threading.Lock()

    def prove(self, fs: object) -> None:
        """Let new connections prove the identity of ``fs`` (a :class:`tectofs.client.FileSystem`)
        to agents, with a fresh ticket of its cluster."""
        with self._lock:
            source = self._tickets.get(id(fs))
            if source is None or source.fs is not fs:
                source = self._tickets[id(fs)] = TicketSource(fs)  # type: ignore[arg-type]
        self._rpc.default_auth = source.client_auth()

    def call(self, address: str, operation: wire.Operation[RequestT, ReplyT], request: RequestT,
             payload: bytes | bytearray | memoryview = b"", timeout_s: float | None = None,
             retries_max: int | None = None, receive_into: ReplySink | None = None
             ) -> tuple[ReplyT, bytes | bytearray | memoryview]:
        reply, data = self._loop.run(self._rpc.call(address, operation, request, payload, timeout_s=timeout_s,
                                                    retries_max=retries_max, receive_into=receive_into))
        return reply, data  # type: ignore[return-value]  # a payload is one buffer unless a sink was given

    def put(self, address: str, step: str, save: str, name: str, offset: int, views: list[memoryview]) -> None:
        """Send ``views``, one after the other, as bytes ``offset..`` of file ``name``: in pieces
        the wire carries, ``PUTS_IN_FLIGHT`` at a time (the agent writes one while the next
        arrives). An empty list (or empty views) still makes the file."""
        pieces: list[tuple[int, memoryview]] = []
        position = offset
        for view in views:
            for start in range(0, view.nbytes, messages.PIECE_BYTES_MAX):
                piece = view[start:start + messages.PIECE_BYTES_MAX]
                pieces.append((position + start, piece))
            position += view.nbytes
        if not pieces:
            pieces.append((offset, memoryview(b"")))
        self._loop.run(self._put_pieces(address, step, save, name, pieces))

    async def _put_pieces(self, address: str, step: str, save: str, name: str,
                          pieces: list[tuple[int, memoryview]]) -> None:
        slots = asyncio.Semaphore(PUTS_IN_FLIGHT)

        async def one(at: int, piece: memoryview) -> None:
            async with slots:
                await self._rpc.call(address, messages.PUT, messages.PutRequest(step=step, save=save, file=name,
                                                                                offset=at), piece)

        results = await asyncio.gather(*(one(at, piece) for at, piece in pieces), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            raise failed[0]

    def verify(self, address: str, step: str, save: str, files: list[messages.HeldFileInfo]) -> None:
        """Have ``address`` check the files this rank sent (sizes and crc32cs)."""
        self.call(address, messages.VERIFY, messages.VerifyRequest(step=step, save=save, files=files),
                  timeout_s=SEAL_TIMEOUT_S)

    def seal(self, address: str, step: str, save: str, files: list[messages.HeldFileInfo], names: list[str],
             replicas: int | None) -> messages.SealReply:
        """Seal a save made of the files ``names`` (those not verified yet given in ``files``);
        ``replicas``: peers that must hold it too (None: the agent's own setting). Waits for
        replication (or persistence)."""
        request = messages.SealRequest(step=step, save=save, files=files, names=names, replicas=replicas)
        return self.call(address, messages.SEAL, request, timeout_s=SEAL_TIMEOUT_S, retries_max=0)[0]

    def locate(self, address: str, step: str) -> messages.LocateReply | None:
        """What ``address`` holds sealed of ``step``; None if it does not answer."""
        return self._lookup(address, messages.LOCATE, messages.StepRequest(step=step))

    def listing(self, address: str, prefix: str) -> messages.ListReply | None:
        """The sealed steps ``address`` holds under ``prefix``; None if it does not answer."""
        return self._lookup(address, messages.LIST, messages.ListRequest(prefix=prefix))

    def _lookup(self, address: str, operation: wire.Operation[RequestT, ReplyT], request: RequestT) -> ReplyT | None:
        """A question that an agent not answering within ``LOOKUP_TIMEOUT_S`` answers with None."""
        try:
            return self.call(address, operation, request, timeout_s=LOOKUP_TIMEOUT_S, retries_max=0)[0]
        except (errors.TectofsError, OSError):
            return None

    def read(self, address: str, step: str, save: str, name: str, offset: int, into: memoryview) -> None:
        """Fill ``into`` with bytes ``offset..`` of a sealed file held by ``address``."""
        position = 0
        while position < into.nbytes:
            length = min(messages.PIECE_BYTES_MAX, into.nbytes - position)
            window = into[position:position + length]
            sink = ReplySink(lambda n: [window] if n == length else None)  # received straight into ``into``
            try:
                _, data = self.call(address, messages.GET, messages.GetRequest(
                    step=step, save=save, file=name, offset=offset + position, length=length), receive_into=sink)
                if not sink.complete:
                    if len(data) != length:
                        raise errors.CheckpointError(f"memory agent {address} sent {len(data)} of {length} bytes"
                                                     f" of {name}")
                    window[:] = data
            finally:
                sink.divert()
            position += length


_clients: dict[int, AgentClient] = {}
_clients_lock = threading.Lock()


def agent_client(step: str) -> AgentClient:
    """This process's agent client, proving to agents the identity this process has in the
    cluster of ``step`` (a ``tectofs://`` id)."""
    with _clients_lock:
        client = _clients.get(os.getpid())
        if client is None:
            client = _clients[os.getpid()] = AgentClient()
    client.prove(_uri.resolve(step)[0])
    return client


def lookup_client(step: str) -> AgentClient | None:
    """``agent_client(step)`` for a lookup that may go without agents (a load, a listing):
    None, with a warning, if the step's cluster gives this process no ticket (a metadata
    service of a release before tickets, or one that refuses this client)."""
    try:
        return agent_client(step)
    except errors.TectofsError as exc:
        warnings.warn(f"tectofs: memory agents not asked about {step}: no ticket from its cluster ({exc})",
                      stacklevel=3)
        return None
