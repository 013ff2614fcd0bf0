"""The client's side of metadata leases (``server/meta/leases.py`` says how they work).

A :class:`LeaseSession` names itself in every hello of its metadata connections and keeps one
keepalive outstanding. What it offers a cache built over the client (the FUSE mount's kernel
cache, ``client/fuse/kernel_cache.py``):

- ``remaining()``: for how many more seconds what the client read may be answered from a cache
  without asking (0 while no lease is held: before the first keepalive, after a failed one).
  Counted from when the renewing keepalive was *sent*, less a margin for clock rates, so it
  ends before the service's count does.
- ``epoch``: grows at every recall and every loss of the session. A reader notes it before a
  call and caches the answer only if it did not move meanwhile (``still(epoch)``): an answer
  that crossed a recall on the wire may predate the change that caused it. A cache that must
  also not keep answers that crossed this client's own changes (the library's; the kernel
  orders a mount's own changes itself) notes ``token()`` instead (``still_token``).
- listeners, awaited for every recall (``on_recall(recall)``: a ``tectofs.wire.leases.Recall``,
  the attributes, names and listings to drop) and when everything must go (``on_recall(None)``:
  the session was lost or restarted); the recall is acknowledged once every listener returned,
  so a change completes only after every cache dropped what it changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Awaitable, Callable

from tectofs import limits
from tectofs.errors import TectofsError
from tectofs.wire.client import RpcClient
from tectofs.wire.leases import SESSION_BYTES, KeepaliveRequest, Recall

from .metadata import MetadataClient

log = logging.getLogger("tectofs.client")

RecallListener = Callable[["Recall | None"], Awaitable[None]]
CLOCK_RATE_MARGIN = 0.1  # the client trusts a lease for 90% of its life: clocks may run 10% apart


class LeaseSession:
    """One client's lease session over ``metadata`` (whose connections' hellos must name
    ``session_id``: :meth:`attach` sets that before the first call)."""

    def __init__(self, metadata: MetadataClient, *, clock: Callable[[], float] = time.monotonic,
                 session_id: bytes | None = None) -> None:
        """``session_id``: random by default (it is the session's secret); the simulator gives
        one from its seeded source, so a seed replays exactly."""
        self.metadata = metadata
        self.session_id = session_id or os.urandom(SESSION_BYTES)
        self.clock = clock
        self.epoch = 0
        self.own_changes = 0  # changes this client made (``note_own_change``)
        self.listeners: list[RecallListener] = []
        # Whether this client holds creates it has not sent (``KeepaliveRequest.unsent``).
        self.unsent: Callable[[], bool] | None = None
        self.recalls_done = 0
        self._valid_until = 0.0
        self._task: asyncio.Task[None] | None = None

    def attach(self, rpc: RpcClient) -> None:
        """Have ``rpc`` name this session in its hellos (before its first connection)."""
        rpc.session = self.session_id

    def start(self) -> None:
        """Start keeping the session alive (on the running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._keep_alive())

    async def close(self) -> None:
        """Stop, and end the session at the service (so changes need not wait for its leases
        to run out; if that fails, they do)."""
        self._valid_until = 0.0
        if self._task is None:
            return
        self._task.cancel()
        try:
            await self._task
        except (asyncio.CancelledError, Exception):
            pass
        self._task = None
        try:
            await asyncio.wait_for(self.metadata.keepalive(KeepaliveRequest(end=True)), limits.lease_s / 10)
        except (asyncio.TimeoutError, TectofsError, OSError) as exc:
            log.info("could not end the lease session (%s): its leases run out by themselves", exc)

    def remaining(self) -> float:
        """Seconds for which cached answers may still be trusted (0: none)."""
        return max(0.0, self._valid_until - self.clock())

    def still(self, epoch: int) -> bool:
        """Whether an answer asked for at ``epoch`` may be cached: no recall nor loss since, and a lease held."""
        return epoch == self.epoch and self.remaining() > 0

    def note_own_change(self) -> None:
        """This client changed something (answers on their way may predate it)."""
        self.own_changes += 1

    def token(self) -> tuple[int, int]:
        return self.epoch, self.own_changes

    def still_token(self, token: tuple[int, int]) -> bool:
        """``still``, and no change of this client's own since ``token()``."""
        return token == (self.epoch, self.own_changes) and self.remaining() > 0

    async def _keep_alive(self) -> None:
        acked: list[int] = []
        wait_s = 0.0
        failures = 0
        while True:
            sent = self.clock()
            try:
                reply = await self.metadata.keepalive(KeepaliveRequest(
                    acked=acked, wait_s=wait_s, unsent=self.unsent is not None and self.unsent()))
            except asyncio.CancelledError:
                raise
            except (TectofsError, OSError) as exc:
                failures += 1
                if self._valid_until:
                    log.warning("metadata leases lost (%s); answering from the service until they are back", exc)
                await self._lost()
                await asyncio.sleep(min(limits.lease_s / 3, 0.2 * 2 ** min(failures, 6)))
                continue
            failures = 0
            acked = []
            if reply.restarted:
                await self._lost()
            for recall in reply.recalls:
                self.epoch += 1
                await self._tell(recall)
                acked.append(recall.id)
                self.recalls_done += 1
            if reply.renewed:
                self._valid_until = sent + reply.lease_s * (1 - CLOCK_RATE_MARGIN)
            wait_s = 0.0 if acked else min(limits.lease_keepalive_wait_s, reply.lease_s / 3)

    async def _lost(self) -> None:
        """Nothing cached so far may be trusted any more."""
        self._valid_until = 0.0
        self.epoch += 1
        await self._tell(None)

    async def _tell(self, recall: "Recall | None") -> None:
        for listener in list(self.listeners):
            try:
                await listener(recall)
            except Exception:  # a listener's failure must not stop the acknowledgements
                log.exception("a lease recall listener failed")
