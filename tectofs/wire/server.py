"""asyncio transports for the frame codec: a request/response server and a client pool.

Both sides use ``asyncio.BufferedProtocol`` so payloads are received straight into their
final buffers (``FrameDecoder.get_buffer``). A peer that sends an invalid frame gets one
ERROR frame and its connection closed; every other connection keeps being served.

A server serves one table of operations (``tectofs.wire.messages``): each request header is
converted into the operation's request type before its handler (``rpc_<op>(request,
payload) -> (reply, payload)``) runs, so a handler only ever sees valid, typed requests; an
invalid one is answered ``InvalidArgument`` naming the field, and logged as one line. A
handler raising a :class:`~tectofs.errors.TectofsError` sends that error to the caller, who
gets the same class re-raised by :meth:`RpcClient.call`.

Every connection opens with a hello (``messages.Hello``: role and protocol version) before
anything else: a server closes a connection that sends anything else first (at once), or
that has not finished its hello (and authentication) within ``limits.hello_wait_server_s``
(``ConnectionPolicy.hello_wait_s``); a client that gets bytes that are not a tectofs
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
import dataclasses
import hmac
import logging
import os
import time
from typing import Any, Awaitable, Callable, Protocol, TypeVar

import msgspec

from tectofs import limits
from tectofs.diagnostics import RateLimitedLog
from tectofs.errors import (
    AuthenticationFailed,
    Busy,
    ConnectionLost,
    InvalidArgument,
    ProtocolError,
    TectofsError,
    to_wire,
)
from tectofs.wire import auth, local_sockets, messages, tls
from tectofs.wire.connlimits import ConnectionGuard, ConnectionPolicy, ProgressWindow, principal
from tectofs.wire.framing import PROTOCOL_VERSION, Frame, FrameHeader, FrameKind, PayloadAllocator, encode_frame
from tectofs.wire.sendfile import FileRegion
from tectofs.wire.transport import SOFTWARE, FramedProtocol, Payload, ReplyPayload

log = logging.getLogger(__name__)

HandlerReply = tuple[Any, ReplyPayload]  # a reply as a handler gives it


RequestT = TypeVar("RequestT", bound=messages.Message)
ReplyT = TypeVar("ReplyT", bound=messages.Message)
Handler = Callable[[RequestT, memoryview], Awaitable[tuple[ReplyT, ReplyPayload]]]
"""What serves one operation: its validated request and the request payload in, its reply
and a reply payload out."""


class Handlers:
    """A service's handlers: one per operation of its table (but the hello, which the
    connection answers), each registered with its operation, so that mypy holds the handler
    to the operation's request and reply types. :class:`RpcServer` dispatches through this
    mapping, never by a name made at run time."""

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[messages.AnyOperation, Handler[Any, Any]]] = {}

    def add(self, operation: messages.Operation[RequestT, ReplyT], handler: Handler[RequestT, ReplyT]) -> None:
        """``handler`` serves ``operation``; a second handler for one operation is a bug (ValueError)."""
        if operation.name in self._by_name:
            raise ValueError(f"two handlers for the operation {operation.name}")
        self._by_name[operation.name] = (operation, handler)

    def items(self) -> list[tuple[messages.AnyOperation, Handler[Any, Any]]]:
        return list(self._by_name.values())

    def serving(self, operations: dict[str, messages.AnyOperation]) -> dict[str, Handler[Any, Any]]:
        """Operation name -> handler for the table ``operations``; ValueError naming what is
        off unless every operation but the hello has a handler, each registered with that very
        operation, and there is none for an operation not in the table."""
        expected = {name for name, op in operations.items() if op is not messages.HELLO}
        missing, extra = expected - self._by_name.keys(), self._by_name.keys() - expected
        other = [name for name, (op, _) in self._by_name.items() if name in expected and op != operations[name]]
        if missing or extra or other:
            raise ValueError(f"handlers out of step with the table: none for {sorted(missing)}, for operations not"
                             f" in it {sorted(extra)}, registered with another operation {sorted(other)}")
        return {name: handler for name, (_, handler) in self._by_name.items()}


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
# Who sent the request being served (what its connection's hello proved).
current_peer: contextvars.ContextVar[auth.Peer] = contextvars.ContextVar("tectofs_current_peer", default=auth.ANONYMOUS)


class Authenticator(Protocol):
    """A server's source of secrets for authenticating hellos."""

    async def resolve(self, claim: messages.HelloAuth) -> tuple[bytes, auth.Peer]:
        """The secret the claimed identity shares with this server, and who that makes the
        peer; raises AuthenticationFailed for an unknown key, user, or a refused ``act_as``."""
        ...


# --------------------------------------------------------------------------- server


class _ServerConnection(FramedProtocol):
    def __init__(self, server: "RpcServer") -> None:
        self.greeted = False
        self.refused = False  # over its principal's share of connections: told so, reads nothing more
        self.server = server
        super().__init__(self._admit_payload)
        self.inflight = 0
        self.reading_paused = False
        self.peer = "?"
        self._hello_deadline: asyncio.TimerHandle | None = None
        self.identity = auth.ANONYMOUS  # who the hello proved this peer to be
        self._resolving = False  # an authenticating hello is being looked up
        self._session = b""  # the lease session the hello named
        self._challenge: tuple[bytes, bytes, bytes, auth.Peer] | None = None  # (secret, nonces, who): awaiting auth
        self.peer_ip: str | None = None  # set while the server's ConnectionGuard counts this connection,
        self.received_s = self.frame_started_s = self.quiet_since_s = 0.0  # ... which closes it stalled or idle
        self.progress: ProgressWindow | None = None  # ... or too slow (its samples, while mid-frame)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "local socket"
        local_sockets.tune(transport)
        if not self.server.guard.admit(self):
            return  # over a connection cap: refused with an ERROR frame
        self.server.connections.add(self)
        self._hello_deadline = asyncio.get_running_loop().call_later(self.server.guard.policy.hello_wait_s, self._no_hello)

    def _admit_payload(self, header: FrameHeader, length: int) -> "bytearray | memoryview | None":
        """Nothing is admitted before the hello (a payload reserved then would never be
        released: the connection is closed at the first frame that is not a hello)."""
        return self.server.admit_payload(header, length, self.identity) if self.greeted else None

    def _no_hello(self) -> None:
        if not self.greeted:
            self.protocol_failed(ProtocolError(f"no tectofs hello within {self.server.guard.policy.hello_wait_s:g} s"))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._hello_deadline is not None:
            self._hello_deadline.cancel()
        self.server.connections.discard(self)
        self.server.guard.release(self)
        abandoned = self.decoder.receiving_payload_bytes
        release = getattr(self.server.handler, "payload_abandoned", None)
        if abandoned and release is not None:
            release(abandoned, self.decoder.header)

    def protocol_failed(self, exc: TectofsError) -> None:
        log.warning("%s: closing connection from %s after protocol error: %s", self.server.name, self.peer, exc)
        assert self.transport is not None
        if self.transport.is_closing():
            return
        if self.sending_file:  # an error frame now would land inside the file's bytes
            self.transport.abort()
            return
        code, message = to_wire(exc)
        try:
            self.transport.write(encode_frame(FrameKind.ERROR, 0, {"code": code, "message": message}))
        finally:
            self.transport.close()

    def frame_received(self, frame: Frame) -> None:
        if self.refused:
            return  # a frame that came with the refused auth frame
        if frame.kind != FrameKind.REQUEST:
            self.protocol_failed(ProtocolError(f"server received a {frame.kind.name} frame"))
            return
        if not self.greeted:
            self._greet(frame)
            return
        self.inflight += 1
        if self.inflight >= self.server.requests_per_connection_max and not self.reading_paused:
            assert self.transport is not None
            self.transport.pause_reading()
            self.reading_paused = True
        task = asyncio.get_running_loop().create_task(self._serve(frame))
        self.server.tasks.add(task)
        task.add_done_callback(self.server.tasks.discard)

    def _greet(self, frame: Frame) -> None:
        """The first frame must be a valid hello; answer it, or close the connection. A hello
        with ``auth`` starts the challenge-response (``tectofs.wire.auth``): the connection is served
        only once the client's ``auth`` frame proved the same secret."""
        if self._challenge is not None:
            self._authenticate(frame)
            return
        if self._resolving:
            self.protocol_failed(ProtocolError("a frame arrived before the hello was answered"))
            return
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
        self._session = hello.session
        if hello.auth is not None:
            self._resolving = True
            task = asyncio.get_running_loop().create_task(self._challenge_peer(frame.request_id, hello.auth))
            self.server.tasks.add(task)
            task.add_done_callback(self.server.tasks.discard)
            return
        self._welcome(auth.ANONYMOUS)
        local = self._local_offer()
        reply = messages.HelloReply(role=self.server.role, version=PROTOCOL_VERSION, software=SOFTWARE,
                                    local=local, pid=os.getpid() if local else 0)
        assert self.transport is not None
        self.transport.write(encode_frame(FrameKind.RESPONSE, frame.request_id, reply))

    def _local_offer(self) -> str:
        """The server's local socket name for a TCP peer on this host, else "" (tectofs.wire.local_sockets)."""
        name = self.server.local_name
        if not name or self.transport is None or not local_sockets.same_host(self.transport):
            return ""
        return name

    def _welcome(self, identity: auth.Peer) -> None:
        if self._hello_deadline is not None:
            self._hello_deadline.cancel()
        if identity.kind != "anonymous" and not self.server.guard.authenticated(self, principal(identity)):
            self.refused = True  # over its principal's share (tectofs.wire.connlimits): the guard answered
            self.server.connections.discard(self)
            return
        self.identity = dataclasses.replace(identity, session=self._session) if self._session else identity
        self.greeted = True

    async def _challenge_peer(self, request_id: int, claim: messages.HelloAuth) -> None:
        """Find the secret the claimed identity shares with us; answer with our proof of it
        and our challenge."""
        try:
            if self.server.authenticator is None:
                raise AuthenticationFailed(f"{self.server.name} does not authenticate peers")
            secret, identity = await self.server.authenticator.resolve(claim)
        except AuthenticationFailed as exc:
            self.server.auth_failures += 1
            self.protocol_failed(exc)
            return
        except Exception as exc:  # e.g. a store that cannot answer: refuse, never crash
            log.exception("%s: authenticating %s failed", self.server.name, self.peer)
            self.protocol_failed(AuthenticationFailed(f"{self.server.name} could not check the credential: {exc}"))
            return
        self._resolving = False
        if self.transport is None or self.transport.is_closing():
            return
        nonce = os.urandom(auth.NONCE_BYTES)
        self._challenge = (secret, claim.nonce, nonce, identity)
        local = self._local_offer()
        reply = messages.HelloReply(
            role=self.server.role, version=PROTOCOL_VERSION, software=SOFTWARE, nonce=nonce,
            proof=auth.server_proof(secret, claim.nonce, nonce, self.server.role), local=local,
            pid=os.getpid() if local else 0,
        )
        self.transport.write(encode_frame(FrameKind.RESPONSE, request_id, reply))

    def _authenticate(self, frame: Frame) -> None:
        """The frame after an authenticating hello: the client's proof, or the end."""
        assert self._challenge is not None
        secret, client_nonce, server_nonce, identity = self._challenge
        self._challenge = None
        try:
            if frame.header.get("op") != "auth":
                raise AuthenticationFailed(f"expected the auth frame, got {str(frame.header.get('op'))[:40]!r}")
            proof = messages.convert(frame.header, messages.AuthRequest).proof
        except (msgspec.ValidationError, AuthenticationFailed) as exc:
            self.protocol_failed(exc if isinstance(exc, AuthenticationFailed) else ProtocolError(f"invalid auth: {exc}"))
            return
        if not hmac.compare_digest(proof, auth.client_proof(secret, client_nonce, server_nonce)):
            self.server.auth_failures += 1
            self.protocol_failed(AuthenticationFailed(
                f"{identity.describe()}: wrong secret (the credential or cluster key does not match the cluster's)"))
            return
        self._welcome(identity)

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
            if self.reading_paused and self.inflight < self.server.requests_per_connection_max // 2:
                self.reading_paused = False
                if self.transport is not None and not self.transport.is_closing():
                    self.transport.resume_reading()

    async def _answer(self, frame: Frame) -> tuple[bytes, ReplyPayload]:
        """The encoded reply header and the payload for one request: the handler's, or an error."""
        op = str(frame.header.get("op"))[:40]
        try:
            reply, payload = await self.server.dispatch(frame, self.peer, self.identity)
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
    """Serves one table of operations (``tectofs.wire.messages``) over TCP: each operation is
    handled by its handler in ``handlers`` (:class:`Handlers`, one per operation), which gets
    the validated request and returns ``(reply, payload)``. ``handler``: the service, for its
    optional hooks (``payload_sent``, ``payload_unused``, ``payload_refusal``, ``authorize``).

    ``allocate_payload(header, length)`` chooses where request payloads are received; it may
    return None to have the payload drained and the request rejected as BUSY (admission
    control before the bytes are buffered). Payloads sent to operations that take none are
    drained and refused as invalid, whatever the allocator says.

    Authentication: ``authenticator.resolve(claim)`` gives the secret and identity of a hello's
    ``auth`` claim (or raises AuthenticationFailed); each request is then dispatched with that
    identity in :data:`current_peer`, after ``handler.authorize(identity, operation_name)`` (if
    the handler has one) let it through. ``pool_anonymous``: unauthenticated connections share a
    pool of ``anonymous_connections_max`` places, oldest evicted first, and users' authenticated
    ones are shared by principal, root's and members' keeping reserved places
    (``tectofs.wire.connlimits``).
    """

    requests_per_connection_max = 64

    def __init__(
        self,
        handler: object,
        name: str,
        operations: dict[str, messages.AnyOperation],
        role: messages.Role,
        handlers: Handlers,
        allocate_payload: PayloadAllocator | None = None,
        authenticator: "Authenticator | None" = None,
        observe: Callable[[str, str, float], None] | None = None,
        pool_anonymous: bool = False,
    ) -> None:
        self.handler = handler
        # Unauthenticated connections get a small pool of their own, oldest evicted first
        # (tectofs.wire.connlimits): for servers that serve anonymous peers next to nothing.
        self.pool_anonymous = pool_anonymous
        # Told (operation, outcome: "ok" or the error's wire code, seconds) of every request of a
        # known operation once it is answered (tectofs.metrics.RequestMetrics.observe).
        self.observe = observe
        self.authenticator = authenticator
        self.auth_failures = 0
        self.name = name
        self.role = role
        self.operations = operations
        self.methods = handlers.serving(operations)
        # Called with each reply payload once the transport no longer needs it (buffer reuse).
        self.payload_sent: Callable[[Payload], None] | None = getattr(handler, "payload_sent", None)
        # Called with an admitted request payload that no handler will take (an invalid request),
        # and its frame's header.
        self.payload_unused: Callable[[memoryview, FrameHeader], None] | None = getattr(handler, "payload_unused", None)
        # Why a peer may not send this payload at all (an error), or None.
        self.payload_refusal: Callable[[auth.Peer, FrameHeader], TectofsError | None] | None = getattr(
            handler, "payload_refusal", None)
        # Raises PermissionDenied for an operation the peer may not call at all.
        self.authorize: Callable[[auth.Peer, str], None] | None = getattr(handler, "authorize", None)
        self.allocate_payload = allocate_payload
        self.connections: set[_ServerConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        # What bounds the connections when start() is given no policy (None: the limits, overridden by the environment).
        self.policy: ConnectionPolicy | None = None
        self._server: asyncio.base_events.Server | None = None
        self._local_server: asyncio.base_events.Server | None = None
        self.address = ""
        self.local_name = ""  # the abstract Unix socket name it also listens on (tectofs.wire.local_sockets), or ""
        self.tls = False  # set by start(): connections use TLS (the bytes must pass through the transport)
        self.invalid_requests = 0
        self._invalid_log = RateLimitedLog(log, limits.peer_log_lines_per_s, f"invalid requests to the {name}")

    def _operation(self, header: FrameHeader) -> messages.AnyOperation | None:
        name = header.get("op")
        operation = self.operations.get(name) if isinstance(name, str) else None
        return None if operation is None or operation.name == "hello" else operation

    def admit_payload(self, header: FrameHeader, length: int, identity: auth.Peer = auth.MEMBER) -> Any:
        """Where a request's payload goes, or None to drain it. A handler's
        ``payload_refusal(peer, header)`` (an error, or None) refuses payloads the peer may not
        send (a put without its capability) before any memory is reserved for them."""
        operation = self._operation(header)
        if operation is None or not operation.payload:
            return None  # drained; dispatch answers that this operation takes none
        if self.payload_refusal is not None and self.payload_refusal(identity, header) is not None:
            return None  # drained; dispatch answers with the refusal
        return self.allocate_payload(header, length) if self.allocate_payload else (lambda: bytearray(length))

    def release_reply_payload(self, payload: ReplyPayload) -> None:
        if isinstance(payload, FileRegion):
            payload.close()
        elif payload and self.payload_sent is not None:
            self.payload_sent(payload)

    async def start(self, host: str, port: int, policy: ConnectionPolicy | None = None) -> str:
        """Listen on ``host:port`` (port 0 picks a free one); returns ``"HOST:PORT"``. The
        connections are bounded by ``policy`` (default: :attr:`policy` if set, else the limits,
        overridden by the environment; ``tectofs.wire.connlimits``), and use TLS when a certificate is configured
        (``tectofs.wire.tls``)."""
        loop = asyncio.get_running_loop()
        self.guard = ConnectionGuard(self, policy or self.policy or ConnectionPolicy.from_env())
        context = tls.server_context()
        self.tls = context is not None
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), host, port, reuse_address=True, backlog=limits.listen_backlog_max,
            ssl=context,
        )
        self.guard.start(self._server)
        sock_host, sock_port = self._server.sockets[0].getsockname()[:2]
        self.address = f"{sock_host}:{sock_port}"
        if context is None and local_sockets.enabled():
            await self._listen_locally()
        return self.address

    async def _listen_locally(self) -> None:
        """Also listen on a fresh abstract Unix socket name, offered to peers on this host
        (``tectofs.wire.local_sockets``); without one (an old kernel, say) TCP serves them all."""
        name = local_sockets.new_name(self.role)
        try:
            self._local_server = await asyncio.get_running_loop().create_unix_server(
                lambda: _ServerConnection(self), local_sockets.abstract_path(name), backlog=limits.listen_backlog_max)
        except OSError as exc:
            log.info("%s: no local socket (%s); peers on this host use TCP", self.name, exc)
            return
        self.local_name = name

    async def dispatch(self, frame: Frame, peer: str = "?", identity: auth.Peer = auth.MEMBER) -> HandlerReply:
        operation = self._operation(frame.header)
        if operation is None:
            raise self._invalid(peer, f"{self.name}: unknown operation {str(frame.header.get('op'))[:64]!r}")
        if self.observe is None:
            return await self._authorized(operation, frame, peer, identity)
        started = time.perf_counter()
        outcome = "error"
        try:
            reply = await self._authorized(operation, frame, peer, identity)
            outcome = "ok"
            return reply
        except TectofsError as exc:
            outcome = exc.code
            raise
        finally:
            self.observe(operation.name, outcome, time.perf_counter() - started)

    async def _authorized(self, operation: messages.AnyOperation, frame: Frame, peer: str, identity: auth.Peer) -> HandlerReply:
        if self.authorize is not None:
            try:
                self.authorize(identity, operation.name)
            except TectofsError:
                if operation.payload and not frame.discarded and self.payload_unused is not None:
                    self.payload_unused(frame.payload, frame.header)
                raise
        peer_token = current_peer.set(identity)
        try:
            return await self._dispatch(operation, frame, peer)
        finally:
            current_peer.reset(peer_token)

    async def _dispatch(self, operation: messages.AnyOperation, frame: Frame, peer: str) -> HandlerReply:
        if frame.discarded:
            if not operation.payload:
                raise self._invalid(peer, f"{operation.name} takes no payload")
            refusal = self.payload_refusal(current_peer.get(), frame.header) if self.payload_refusal else None
            if refusal is not None:
                raise refusal
            raise Busy(f"{self.name} is at its in-flight limit (or the caller's fair share of it); retry later")
        try:
            request = messages.convert(frame.header, operation.request)
        except msgspec.ValidationError as exc:
            if operation.payload and self.payload_unused is not None:
                self.payload_unused(frame.payload, frame.header)  # admitted, but no handler will take it
            raise self._invalid(peer, f"{operation.name}: {exc}") from None
        call_id = frame.header.get("call_id")
        if call_id is None:
            return await self.methods[operation.name](request, frame.payload)
        if not isinstance(call_id, bytes) or len(call_id) != CALL_ID_BYTES:
            if operation.payload and self.payload_unused is not None:
                self.payload_unused(frame.payload, frame.header)
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
        if self._local_server is not None:
            self._local_server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        for task in list(self.tasks):
            task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
        if self._local_server is not None:
            await self._local_server.wait_closed()

__all__ = ["CALL_ID_BYTES", "Call", "Handler", "Handlers", "RpcServer", "current_call", "current_peer"]
