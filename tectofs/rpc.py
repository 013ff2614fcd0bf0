"""asyncio transports for the frame codec: a request/response server and a client pool.

Both sides use ``asyncio.BufferedProtocol`` so payloads are received straight into their
final buffers (``FrameDecoder.get_buffer``). A peer that sends an invalid frame gets one
ERROR frame and its connection closed; every other connection keeps being served.

A server serves one table of operations (``tectofs.messages``): each request header is
converted into the operation's request type before its handler (``rpc_<op>(request,
payload) -> (reply, payload)``) runs, so a handler only ever sees valid, typed requests; an
invalid one is answered ``InvalidArgument`` naming the field, and logged as one line. A
handler raising a :class:`~tectofs.errors.TectofsError` sends that error to the caller, who
gets the same class re-raised by :meth:`RpcClient.call`.

Every connection opens with a hello (``messages.Hello``: role and protocol version) before
anything else: a server closes a connection that sends anything else first (at once), or
nothing within ``limits.hello_wait_server_s``; a client that gets bytes that are not a tectofs
frame fails at once with an error that says the peer is not a tectofs server, and one that
gets no answer within ``limits.hello_timeout_s`` (twice) says that.

Failover and exactly-once. An address may name a group of equivalent servers,
``"HOST:PORT,HOST:PORT"`` (metadata services sharing one PostgreSQL store): the client sticks
to one member and moves on to the next when it cannot reach it (:class:`RpcClient`). A
request not marked idempotent carries a *call id* (``call_id`` in its header, 16 random
bytes, the same on every retry of one call), so it can be retried after any failure, on any
member: the server makes the call take effect at most once (the metadata service records
each call's result in its store, in the transaction that applied it:
:mod:`tectofs.store.requests`). While a request is served, :data:`current_call` holds its
:class:`Call`.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import random
import uuid
from typing import Any, Awaitable, Callable

import msgspec

from . import limits, messages
from .diagnostics import RateLimitedLog
from .errors import (
    Busy,
    ConnectionLost,
    InvalidArgument,
    ProtocolError,
    TectofsError,
    Timeout,
    from_wire,
    to_wire,
)
from .protocol import PROTOCOL_VERSION, Frame, FrameDecoder, FrameKind, PayloadAllocator, encode_frame

log = logging.getLogger(__name__)

Payload = bytes | bytearray | memoryview
_SEND_SLICE_BYTES = 1 << 20
Reply = tuple[Any, Payload]
SOFTWARE = "tectofs 0.1"


class HelloTimeout(Timeout):
    """A peer accepted the connection but did not answer the hello in time."""


def parse_address(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; raises InvalidArgument with the bad text."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"bad address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def parse_group(group: str) -> list[str]:
    """``"HOST:PORT,HOST:PORT,..."`` (a failover group of equivalent servers; one address is a
    group of one) -> its member addresses, in order; raises InvalidArgument with the bad text."""
    members = [m.strip() for m in group.split(",")]
    if len(members) > limits.address_group_members_max:
        raise InvalidArgument(f"bad address group {group[:200]!r}: more than {limits.address_group_members_max} members")
    if len(set(members)) != len(members):
        raise InvalidArgument(f"bad address group {group!r}: an address is named twice")
    for member in members:
        parse_address(member)
    return members


CALL_ID_BYTES = 16


class Call:
    """One logical call being served: its call id, and how many store operations its handler
    ran so far (``next_key``), so that a handler running several (``makedirs``) has each
    recorded under its own key, in the same order on every retry."""

    def __init__(self, call_id: bytes) -> None:
        assert len(call_id) == CALL_ID_BYTES
        self.call_id = call_id
        self.steps = 0

    def next_key(self) -> str:
        self.steps += 1
        return f"{self.call_id.hex()}:{self.steps}"


# The call the current task serves (None: the request carried no call id, or no request).
current_call: contextvars.ContextVar[Call | None] = contextvars.ContextVar("tectofs_current_call", default=None)


class _FramedProtocol(asyncio.BufferedProtocol):
    """Shared plumbing: decoder, write flow control, close handling."""

    def __init__(self, allocate_payload: PayloadAllocator | None = None) -> None:
        self.decoder = FrameDecoder(allocate_payload) if allocate_payload else FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._send_lock = asyncio.Lock()
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.decoder.advance(nbytes)
        except ProtocolError as exc:
            self.protocol_failed(exc)
            return
        for frame in frames:
            self.frame_received(frame)

    def frame_received(self, frame: Frame) -> None:
        raise NotImplementedError

    def protocol_failed(self, exc: ProtocolError) -> None:
        raise NotImplementedError

    async def send(self, kind: FrameKind, request_id: int, header: Any, payload: Payload = b"") -> None:
        await self.send_encoded(encode_frame(kind, request_id, header, len(payload)), payload)

    async def send_encoded(self, head: bytes, payload: Payload = b"") -> None:
        """Send a frame whose header ``encode_frame`` made, then its payload."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionLost("connection closed")
        view = memoryview(payload).cast("B") if payload else None
        # The transport copies what the socket does not take at once into a bytearray and
        # memmoves it forward after every send: handing it a 16 MiB payload costs far more
        # than the payload itself. So payloads go in slices, each once the buffer drained,
        # and a lock keeps concurrent frames from interleaving.
        async with self._send_lock:
            await self._writable(transport)
            transport.write(head)
            if view is None:
                return
            for offset in range(0, len(view), _SEND_SLICE_BYTES):
                if offset:
                    await self._writable(transport)
                transport.write(view[offset : offset + _SEND_SLICE_BYTES])

    async def _writable(self, transport: asyncio.Transport) -> None:
        await self._can_write.wait()
        if transport.is_closing():
            raise ConnectionLost("connection closed")


# --------------------------------------------------------------------------- server


class _ServerConnection(_FramedProtocol):
    def __init__(self, server: "RpcServer") -> None:
        self.greeted = False
        self.server = server
        super().__init__(self._admit_payload)
        self.inflight = 0
        self._reading_paused = False
        self.peer = "?"
        self._hello_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._hello_deadline = asyncio.get_running_loop().call_later(limits.hello_wait_server_s, self._no_hello)

    def _admit_payload(self, header: dict[str, Any], length: int) -> "bytearray | memoryview | None":
        """Nothing is admitted before the hello (a payload reserved then would never be
        released: the connection is closed at the first frame that is not a hello)."""
        return self.server.admit_payload(header, length) if self.greeted else None

    def _no_hello(self) -> None:
        if not self.greeted:
            self.protocol_failed(ProtocolError(f"no tectofs hello within {limits.hello_wait_server_s:g} s"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._hello_deadline is not None:
            self._hello_deadline.cancel()
        self.server.connections.discard(self)
        abandoned = self.decoder.receiving_payload_bytes
        release = getattr(self.server.handler, "payload_abandoned", None)
        if abandoned and release is not None:
            release(abandoned)

    def protocol_failed(self, exc: ProtocolError) -> None:
        log.warning("%s: closing connection from %s after protocol error: %s", self.server.name, self.peer, exc)
        assert self.transport is not None
        if self.transport.is_closing():
            return
        code, message = to_wire(exc)
        try:
            self.transport.write(encode_frame(FrameKind.ERROR, 0, {"code": code, "message": message}))
        finally:
            self.transport.close()

    def frame_received(self, frame: Frame) -> None:
        if frame.kind != FrameKind.REQUEST:
            self.protocol_failed(ProtocolError(f"server received a {frame.kind.name} frame"))
            return
        if not self.greeted:
            self._greet(frame)
            return
        self.inflight += 1
        if self.inflight >= self.server.requests_per_connection_max and not self._reading_paused:
            assert self.transport is not None
            self.transport.pause_reading()
            self._reading_paused = True
        task = asyncio.get_running_loop().create_task(self._serve(frame))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def _greet(self, frame: Frame) -> None:
        """The first frame must be a valid hello; answer it, or close the connection."""
        if frame.header.get("op") != "hello":
            self.protocol_failed(ProtocolError(f"expected a hello first, got {str(frame.header.get('op'))[:40]!r}"))
            return
        try:
            hello = messages.convert(frame.header, messages.Hello)
        except msgspec.ValidationError as exc:
            self.protocol_failed(ProtocolError(f"invalid hello: {exc}"))
            return
        if hello.version != PROTOCOL_VERSION:
            self.protocol_failed(ProtocolError(
                f"{self.server.name} speaks tectofs protocol version {PROTOCOL_VERSION}, the peer {hello.version}"
            ))
            return
        self.greeted = True
        if self._hello_deadline is not None:
            self._hello_deadline.cancel()
        reply = messages.HelloReply(role=self.server.role, version=PROTOCOL_VERSION, software=SOFTWARE)
        assert self.transport is not None
        self.transport.write(encode_frame(FrameKind.RESPONSE, frame.request_id, reply))

    async def _serve(self, frame: Frame) -> None:
        try:
            head, payload = await self._answer(frame)
            try:
                await self.send_encoded(head, payload)
            except ConnectionLost:
                pass
            finally:
                self.server.release_reply_payload(payload)
        finally:
            self.inflight -= 1
            if self._reading_paused and self.inflight < self.server.requests_per_connection_max // 2:
                self._reading_paused = False
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.resume_reading()

    async def _answer(self, frame: Frame) -> tuple[bytes, Payload]:
        """The encoded reply header and the payload for one request: the handler's, or an error."""
        op = str(frame.header.get("op"))[:40]
        try:
            reply, payload = await self.server.dispatch(frame, self.peer)
        except TectofsError as exc:
            return _error_frame(frame.request_id, exc), b""
        except Exception as exc:  # a handler bug must not take the server down
            log.exception("%s: handler for %r failed", self.server.name, op)
            return _error_frame(frame.request_id, exc), b""
        try:
            return encode_frame(FrameKind.RESPONSE, frame.request_id, reply, len(payload)), payload
        except ProtocolError as exc:  # our bug: replies are bounded by construction
            log.error("%s: reply to %r not sent: %s", self.server.name, op, exc)
            self.server.release_reply_payload(payload)
            return _error_frame(frame.request_id, TectofsError(f"the reply to {op} exceeded the frame limit")), b""


def _error_frame(request_id: int, exc: BaseException) -> bytes:
    code, message = to_wire(exc)
    return encode_frame(FrameKind.ERROR, request_id, {"code": code, "message": message})


class RpcServer:
    """Serves one table of operations (``tectofs.messages``) over TCP: operation ``op`` is
    handled by ``handler.rpc_<op>(request, payload)``, which gets the validated request and
    returns ``(reply, payload)``.

    ``allocate_payload(header, length)`` chooses where request payloads are received; it may
    return None to have the payload drained and the request rejected as BUSY (admission
    control before the bytes are buffered). Payloads sent to operations that take none are
    drained and refused as invalid, whatever the allocator says."""

    requests_per_connection_max = 64

    def __init__(
        self,
        handler: object,
        name: str,
        operations: dict[str, messages.Operation],
        role: str,
        allocate_payload: PayloadAllocator | None = None,
    ) -> None:
        self.handler = handler
        self.name = name
        self.role = role
        self.operations = operations
        self.methods: dict[str, Callable[[Any, memoryview], Awaitable[Reply]]] = {
            name: getattr(handler, f"rpc_{name}") for name in operations if name != "hello"
        }
        # Called with each reply payload once the transport no longer needs it (buffer reuse).
        self.payload_sent: Callable[[Payload], None] | None = getattr(handler, "payload_sent", None)
        # Called with an admitted request payload that no handler will take (an invalid request).
        self.payload_unused: Callable[[memoryview], None] | None = getattr(handler, "payload_unused", None)
        self.allocate_payload = allocate_payload
        self.connections: set[_ServerConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.base_events.Server | None = None
        self.address = ""
        self.invalid_requests = 0
        self._invalid_log = RateLimitedLog(log, limits.peer_log_lines_per_s, f"invalid requests to the {name}")

    def _operation(self, header: dict[str, Any]) -> messages.Operation | None:
        name = header.get("op")
        operation = self.operations.get(name) if isinstance(name, str) else None
        return None if operation is None or operation.name == "hello" else operation

    def admit_payload(self, header: dict[str, Any], length: int) -> "bytearray | memoryview | None":
        operation = self._operation(header)
        if operation is None or not operation.payload:
            return None  # drained; dispatch answers that this operation takes none
        return self.allocate_payload(header, length) if self.allocate_payload else bytearray(length)

    def release_reply_payload(self, payload: Payload) -> None:
        if payload and self.payload_sent is not None:
            self.payload_sent(payload)

    async def start(self, host: str, port: int) -> str:
        """Listen on ``host:port`` (port 0 picks a free one); returns ``"HOST:PORT"``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), host, port, reuse_address=True, backlog=limits.listen_backlog_max
        )
        sock_host, sock_port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{sock_host}:{sock_port}"
        return self.address

    async def dispatch(self, frame: Frame, peer: str = "?") -> Reply:
        operation = self._operation(frame.header)
        if operation is None:
            raise self._invalid(peer, f"{self.name}: unknown operation {str(frame.header.get('op'))[:64]!r}")
        if frame.discarded:
            if not operation.payload:
                raise self._invalid(peer, f"{operation.name} takes no payload")
            raise Busy(f"{self.name} is at its in-flight limit; retry later")
        try:
            request = messages.convert(frame.header, operation.request)
        except msgspec.ValidationError as exc:
            if operation.payload and self.payload_unused is not None:
                self.payload_unused(frame.payload)  # admitted, but no handler will take it
            raise self._invalid(peer, f"{operation.name}: {exc}") from None
        call_id = frame.header.get("call_id")
        if call_id is None:
            return await self.methods[operation.name](request, frame.payload)
        if not isinstance(call_id, bytes) or len(call_id) != CALL_ID_BYTES:
            if operation.payload and self.payload_unused is not None:
                self.payload_unused(frame.payload)
            raise self._invalid(peer, f"{operation.name}: call_id must be {CALL_ID_BYTES} bytes")
        token = current_call.set(Call(call_id))  # this request's own task: no other request sees it
        try:
            return await self.methods[operation.name](request, frame.payload)
        finally:
            current_call.reset(token)

    def _invalid(self, peer: str, message: str) -> InvalidArgument:
        """A client's mistake: one log line (rate-limited), never a traceback."""
        self.invalid_requests += 1
        self._invalid_log.warning("%s: invalid request from %s: %s", self.name, peer, message)
        return InvalidArgument(message)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for task in list(self.tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()


# --------------------------------------------------------------------------- client


class _ClientConnection(_FramedProtocol):
    def __init__(self, address: str, allocate_payload: PayloadAllocator | None = None) -> None:
        super().__init__(allocate_payload)
        self.address = address
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self.failure: BaseException | None = None
        self.greeted = False
        self.peer_role = ""
        self.greeting: asyncio.Task[None] | None = None  # the hello's answer, awaited by every call

    def start_hello(self, role: str, expect_role: str | None) -> None:
        """Open the conversation: the hello goes out now, and requests may follow it on the wire
        at once (the server answers the hello before it reads on); each of them waits for the
        hello's answer (``greeting``) before it trusts its own. The answer must come within
        ``limits.hello_timeout_s``: a peer that is not tectofs (or not the kind of tectofs
        server expected) gives ProtocolError, one that says nothing HelloTimeout, and the
        connection is then closed."""
        assert self.transport is not None
        request_id = next(self._ids)
        answer: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = answer
        hello = messages.Hello(role=role, version=PROTOCOL_VERSION, software=SOFTWARE)  # type: ignore[arg-type]
        self.transport.write(encode_frame(FrameKind.REQUEST, request_id, {"op": "hello", **messages.to_plain(hello)}))
        self.greeting = asyncio.get_running_loop().create_task(self._greeted(request_id, answer, expect_role))

    async def _greeted(self, request_id: int, answer: "asyncio.Future[Frame]", expect_role: str | None) -> None:
        try:
            try:
                frame = await asyncio.wait_for(answer, limits.hello_timeout_s)
            except asyncio.TimeoutError:
                raise HelloTimeout(
                    f"{self.address} accepted the connection but did not answer the tectofs hello within"
                    f" {limits.hello_timeout_s:g} s: is a tectofs server listening there (not another program)?"
                ) from None
            finally:
                self.pending.pop(request_id, None)
            if frame.kind == FrameKind.ERROR:
                raise from_wire(str(frame.header.get("code")), str(frame.header.get("message")))
            try:
                reply = messages.convert(frame.header, messages.HelloReply)
            except msgspec.ValidationError as exc:
                raise ProtocolError(f"{self.address} answered the hello with something else: {exc}") from None
            if expect_role is not None and reply.role != expect_role:
                raise ProtocolError(f"{self.address} is a tectofs {reply.role} server, not a {expect_role} server")
        except BaseException as exc:
            self.failure = self.failure or exc
            self.close()
            raise
        self.peer_role = reply.role
        self.greeted = True

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._fail_all(ConnectionLost(f"connection to {self.address} lost" + (f": {exc}" if exc else "")))

    def _fail_all(self, exc: BaseException) -> None:
        self.failure = exc
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self.pending.clear()

    def protocol_failed(self, exc: ProtocolError) -> None:
        if self.greeted:
            failure = ProtocolError(f"{self.address} sent an invalid frame: {exc}")
        else:
            answered = self.decoder.fixed_bytes[:8]  # what the peer sent where our magic belongs
            failure = ProtocolError(
                f"{self.address} is not a tectofs server: it answered the hello with {answered!r}..."
                f" ({exc}); check the address and port"
            )
        self._fail_all(failure)
        if self.transport is not None:
            self.transport.close()

    def frame_received(self, frame: Frame) -> None:
        if frame.request_id == 0 and frame.kind == FrameKind.ERROR:
            # The server rejected our stream as a whole and is closing the connection.
            self._fail_all(from_wire(str(frame.header.get("code")), str(frame.header.get("message"))))
            return
        fut = self.pending.pop(frame.request_id, None)
        if fut is not None and not fut.done():
            fut.set_result(frame)

    @property
    def usable(self) -> bool:
        return self.failure is None and self.transport is not None and not self.transport.is_closing()

    async def call(self, header: dict[str, Any], payload: Payload, timeout_s: float) -> Reply:
        request_id = next(self._ids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = fut
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            try:
                # The send has the same deadline: a peer that stops reading (hung) must not hold
                # us waiting for its socket to drain. A frame cut off mid-way ruins the stream.
                await asyncio.wait_for(self.send(FrameKind.REQUEST, request_id, header, payload), timeout_s)
            except asyncio.TimeoutError:
                self.close()
                raise Timeout(f"sending {header.get('op')} to {self.address} stalled for {timeout_s:.0f}s") from None
            if self.greeting is not None:
                await self.greeting  # its error (not tectofs, wrong server, silent) wins over ours
            try:
                frame = await asyncio.wait_for(fut, max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                raise Timeout(f"{header.get('op')} to {self.address} timed out after {timeout_s:.0f}s") from None
        except TectofsError as exc:
            greeting = self.greeting
            if greeting is not None and greeting.done() and not greeting.cancelled():
                failed = greeting.exception()
                if failed is not None and failed is not exc:
                    raise failed from None  # the peer's answer to the hello says more than ours
            raise
        finally:
            self.pending.pop(request_id, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # failed with the connection after we stopped waiting: seen
        if frame.kind == FrameKind.ERROR:
            raise from_wire(str(frame.header.get("code")), str(frame.header.get("message")))
        return frame.header, frame.payload

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _Group:
    """The members of one address group and the one calls use now (sticky: all calls go to one
    member until it fails, so clients of one group do not spread conflicting transactions over
    several metadata services; the first named is the preferred one)."""

    def __init__(self, members: list[str]) -> None:
        self.members = members
        self.current = 0

    @property
    def member(self) -> str:
        return self.members[self.current]

    def failed(self, member: str) -> None:
        """``member`` failed a call: move on to the next, unless another call already did."""
        if self.member == member:
            self.current = (self.current + 1) % len(self.members)


class RpcClient:
    """A pool of connections to many servers, owned by one event loop.

    ``call`` takes an address or an address group (``parse_group``): calls go to one member
    of the group (the first, until it fails); a connection refused, lost or timed out moves
    that call, and the calls after it, to the next member at once, and only a whole round of
    members failing costs a retry and a backoff. A group that stays down fails the call with
    an error naming every member and what each answered.

    What is retried is safe to retry: BUSY answers (nothing was done), and any connection
    failure or timeout — requests marked ``idempotent`` blindly, the others thanks to their
    call id (see the module docstring): every retry of one call carries the same one, so the
    server applies the call at most once and answers a retry with the recorded reply.
    Retries are bounded (``retries_max`` rounds, exponential backoff with jitter)."""

    def __init__(
        self,
        connections_per_server: int = limits.connections_per_server,
        timeout_s: float = limits.rpc_timeout_s,
        retries_max: int = limits.rpc_retries_max,
        allocate_payload: PayloadAllocator | None = None,
        role: str = "client",
    ) -> None:
        """``allocate_payload`` chooses where reply payloads are received (e.g. a buffer
        pool); whoever takes a reply's payload then owns that buffer. ``role`` is what this
        side says it is in each connection's hello."""
        self.allocate_payload = allocate_payload
        self.connections_per_server = connections_per_server
        self.timeout_s = timeout_s
        self.retries_max = retries_max
        self.role = role
        self._pools: dict[str, list[_ClientConnection]] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._expected_roles: dict[str, str] = {}
        self._groups: dict[str, _Group] = {}

    def _group(self, address: str) -> _Group:
        group = self._groups.get(address)
        if group is None:
            group = self._groups[address] = _Group(parse_group(address))
        return group

    def expect_role(self, address: str, role: str) -> None:
        """Connections to ``address`` (every member of a group) must reach a tectofs server of
        this role ("meta", "chunk")."""
        for member in self._group(address).members:
            self._expected_roles[member] = role

    async def _connect(self, address: str) -> _ClientConnection:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _ClientConnection(address, self.allocate_payload), host, port),
                limits.rpc_connect_timeout_s,
            )
        except asyncio.TimeoutError:
            raise Timeout(f"connecting to {address} timed out") from None
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {address}: {exc.strerror or exc}") from None
        proto.start_hello(self.role, self._expected_roles.get(address))
        return proto

    async def _connection(self, address: str) -> _ClientConnection:
        """An idle pooled connection, else a new one (up to ``connections_per_server``), else
        the least busy. Connections open only when concurrency needs them, so a thousand
        clients starting at once do not double their connection storm."""
        pool = [c for c in self._pools.get(address, []) if c.usable]
        self._pools[address] = pool
        idle = [c for c in pool if not c.pending]
        if idle:
            return idle[0]
        if len(pool) < self.connections_per_server:
            lock = self._connecting.setdefault(address, asyncio.Lock())
            async with lock:
                pool = [c for c in self._pools.get(address, []) if c.usable]
                if len(pool) < self.connections_per_server and not any(not c.pending for c in pool):
                    pool.append(await self._connect(address))
                    self._pools[address] = pool
        return min(pool, key=lambda c: len(c.pending))

    async def call(
        self,
        address: str,
        op: str,
        header: dict[str, Any] | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = False,
        timeout_s: float | None = None,
        retries_max: int | None = None,
        call_id: bytes | None = None,
    ) -> Reply:
        """Send ``op`` to ``address`` (or a member of the group it names); return the reply
        header and payload, or raise the server's error. See the class docstring for retries.
        ``call_id``: this call's id (``CALL_ID_BYTES`` bytes), for a caller that retries one
        logical call itself; by default a non-idempotent call draws a new one."""
        group = self._group(address)
        request = {"op": op, **(header or {})}
        if call_id is not None or not idempotent:
            request["call_id"] = call_id or uuid.uuid4().bytes  # one per logical call, reused by its retries
        retries = self.retries_max if retries_max is None else retries_max
        backoff = limits.rpc_backoff_initial_s
        attempt = 0
        hello_timeouts = 0
        failures: dict[str, str] = {}  # member -> how it failed, this round
        while True:
            member = group.member
            try:
                conn = await self._connection(member)
                return await conn.call(request, payload, timeout_s or self.timeout_s)
            except Busy:
                if attempt >= retries:
                    raise
            except (ConnectionLost, Timeout) as exc:
                self.forget(member)
                group.failed(member)
                failures[member] = str(exc)
                if group.member not in failures:
                    continue  # another member, at once: this round is not over
                if isinstance(exc, HelloTimeout):
                    # Silent peers: not tectofs, or hung. Few tries, so the caller hears in seconds.
                    hello_timeouts += 1
                    if hello_timeouts > limits.hello_retries_max:
                        raise _group_down(group, exc, failures) from None
                if attempt >= retries:
                    raise _group_down(group, exc, failures) from None
                failures = {}
            attempt += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, limits.rpc_backoff_max_s)

    def forget(self, address: str) -> None:
        """Drop pooled connections to ``address`` (every member of a group; e.g. a server
        known to be dead)."""
        for member in address.split(","):
            for conn in self._pools.pop(member.strip(), []):
                conn.close()

    async def close(self) -> None:
        for address in list(self._pools):
            self.forget(address)
        await asyncio.sleep(0)


def _group_down(group: _Group, last: TectofsError, failures: dict[str, str]) -> TectofsError:
    """The error of a call no member of ``group`` answered: a single server's own error, or,
    for a group, one of the last one's class that names every member and its failure."""
    if len(group.members) == 1:
        return last
    tried = "; ".join(reason if member in reason else f"{member}: {reason}" for member, reason in failures.items())
    return type(last)(f"no server of the group {','.join(group.members)} answered: {tried}")
