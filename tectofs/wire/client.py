"""The client side of the RPC layer: a pool of connections to many servers, address groups
with failover, retries with backoff, and the client half of the hello and its authentication.
It shares the framed connection with the server side (``tectofs.wire.server``) through
``tectofs.wire.transport``, and never imports the server's module.

Deadlines use ``asyncio.timeout``, never ``asyncio.wait_for``: Python 3.11's ``wait_for``
returns the result of a future that completes while its caller is being cancelled, and the
cancellation is lost (a cancelled write went on to commit; tests/test_atomic_publish.py)."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import uuid
from typing import Callable, TypeVar

import msgspec

from tectofs import limits
from tectofs.errors import Busy, ConnectionLost, ProtocolError, TectofsError, Timeout, from_wire
from tectofs.wire import auth, local_sockets, messages, tls
from tectofs.wire.framing import (
    PROTOCOL_VERSION,
    Buffer,
    Frame,
    FrameHeader,
    FrameKind,
    PayloadAllocator,
    Scatter,
    default_allocator,
    encode_frame,
)
from tectofs.wire.transport import (
    SOFTWARE,
    FramedProtocol,
    HelloTimeout,
    Payload,
    Reply,
    WrongPeer,
    parse_address,
    parse_group,
)

RequestT = TypeVar("RequestT", bound=messages.Message)
ReplyT = TypeVar("ReplyT", bound=messages.Message)

# --------------------------------------------------------------------------- client


class ReplySink:
    """Where a call's reply payload goes: ``views_for(length)`` gives the caller's buffers for
    a payload of ``length`` bytes (or None: a buffer of the connection's allocator, as usual).
    Asked once per attempt of the call; ``divert()`` stops every scatter handed out from
    writing into those buffers (a caller calls it before reusing them, whatever happened)."""

    def __init__(self, views_for: Callable[[int], "list[memoryview] | None"]) -> None:
        self._views_for = views_for
        self.scatters: list[Scatter] = []
        self.diverted = False

    def scatter(self, length: int) -> Scatter | None:
        """Where a reply of ``length`` bytes goes (None: a buffer of the connection's allocator).
        Once diverted, never the caller's buffers again."""
        if self.diverted:
            return None
        views = self._views_for(length)
        if views is None:
            return None
        scatter = Scatter(views)
        self.scatters.append(scatter)
        return scatter

    @property
    def complete(self) -> bool:
        """The last attempt's payload arrived whole into the caller's buffers."""
        return bool(self.scatters) and self.scatters[-1].complete

    @property
    def received_bytes(self) -> int:
        return self.scatters[-1].total if self.complete else 0

    def divert(self) -> None:
        """No byte lands in the caller's buffers after this: the scatters handed out are
        diverted, and any reply that arrives later goes to an ordinary buffer."""
        self.diverted = True
        for scatter in self.scatters:
            scatter.divert()


class _ClientConnection(FramedProtocol):
    def __init__(self, address: str, allocate_payload: PayloadAllocator | None = None) -> None:
        self._allocate_other = allocate_payload
        super().__init__(self._allocate_reply)
        self.address = address
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.sinks: dict[int, ReplySink] = {}  # request id -> where its reply's payload goes
        self._ids = itertools.count(1)
        self.failure: BaseException | None = None
        self.greeted = False
        self.peer_role = ""
        self.greeting: asyncio.Task[None] | None = None  # the hello's answer, awaited by every call
        self.authenticating = False  # requests must wait for the greeting (they follow our proof)
        self.local_offer = ""  # the local socket name the server offered in its hello (tectofs.wire.local_sockets)
        self.retiring = False  # a TCP connection replaced by a local socket: no new calls, closed once idle
        self.server_pid = 0  # the server's process id, as its hello said (checked on its local socket)

    def start_hello(self, role: str, expect_role: str | None, client_auth: auth.ClientAuth | None = None,
                    session: bytes = b"") -> None:
        """Open the conversation: the hello goes out now, and requests may follow it on the wire
        at once (the server answers the hello before it reads on); each of them waits for the
        hello's answer (``greeting``) before it trusts its own. The answer must come within
        ``limits.hello_timeout_s``: a peer that is not tectofs (or not the kind of tectofs
        server expected) gives ProtocolError, one that says nothing HelloTimeout, and the
        connection is then closed.

        With ``client_auth`` the hello carries a challenge and the connection authenticates
        (``tectofs.wire.auth``): requests wait until the server proved the secret and our proof
        went out (one round trip). ``session``: the lease session to name (``tectofs.wire.leases``)."""
        assert self.transport is not None
        request_id = next(self._ids)
        answer: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = answer
        header: FrameHeader = {"op": "hello", "role": role, "version": PROTOCOL_VERSION, "software": SOFTWARE}
        if session:
            header["session"] = session
        secret = nonce = b""
        if client_auth is not None:
            nonce = os.urandom(auth.NONCE_BYTES)
            header["auth"], secret = client_auth.hello(nonce)
            self.authenticating = True
        self.transport.write(encode_frame(FrameKind.REQUEST, request_id, header))
        self.greeting = asyncio.get_running_loop().create_task(
            self._greeted(request_id, answer, expect_role, (client_auth, secret, nonce)))
        # Its failure reaches every call through self.failure; a connection no call waited on
        # (refused as Busy while a burst opens thousands) must not log "never retrieved".
        self.greeting.add_done_callback(lambda task: task.cancelled() or task.exception())

    async def _greeted(
        self, request_id: int, answer: "asyncio.Future[Frame]", expect_role: str | None,
        proving: tuple[auth.ClientAuth | None, bytes, bytes],
    ) -> None:
        try:
            try:
                async with asyncio.timeout(limits.hello_timeout_s):
                    frame = await answer
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
                raise WrongPeer(f"{self.address} answered the hello with something else: {exc}") from None
            if expect_role is not None and reply.role != expect_role:
                raise WrongPeer(f"{self.address} is a tectofs {reply.role} server, not a {expect_role} server")
            client_auth, secret, nonce = proving
            if client_auth is not None:
                auth.check_server_proof(secret, nonce, reply.nonce, reply.role, reply.proof, self.address, client_auth.who())
                assert self.transport is not None
                proof = auth.client_proof(secret, nonce, reply.nonce)
                self.transport.write(encode_frame(FrameKind.REQUEST, next(self._ids), {"op": "auth", "proof": proof}))
        except BaseException as exc:
            self.failure = self.failure or exc
            self.close()
            raise
        self.peer_role = reply.role
        self.local_offer = reply.local if local_sockets.valid_name(reply.local) and reply.pid > 0 else ""
        self.server_pid = reply.pid
        self.greeted = True

    def _allocate_reply(self, header: FrameHeader, length: int) -> "Buffer | Scatter | Callable[[], Buffer] | None":
        sink = self.sinks.pop(self.decoder.request_id, None)
        waiting = self.pending.get(self.decoder.request_id)
        scatter = sink.scatter(length) if sink is not None and waiting is not None and not waiting.done() else None
        if scatter is not None:
            return scatter
        return self._allocate_other(header, length) if self._allocate_other else default_allocator(header, length)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        hint = "" if self.greeted else (" before it answered the hello (does it use TLS? --tls-ca / $TECTOFS_TLS_CA;"
                                         " or it refused this peer)")
        self._fail_all(ConnectionLost(f"connection to {self.address} lost{hint}" + (f": {exc}" if exc else "")))

    def _fail_all(self, exc: BaseException) -> None:
        self.failure = self.failure or exc  # the first failure is the cause (a close follows it)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self.pending.clear()

    def protocol_failed(self, exc: TectofsError) -> None:
        if self.greeted:
            failure = ProtocolError(f"{self.address} sent an invalid frame: {exc}")
        else:
            answered = self.decoder.fixed_bytes[:8]  # what the peer sent where our magic belongs
            failure = WrongPeer(
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

    async def call(
        self, header: FrameHeader, payload: Payload, timeout_s: float, receive_into: ReplySink | None = None,
    ) -> Reply:
        request_id = next(self._ids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self.pending[request_id] = fut
        if receive_into is not None:
            self.sinks[request_id] = receive_into
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            if self.authenticating and self.greeting is not None:
                await asyncio.shield(self.greeting)  # an authenticated connection serves nothing before our proof
            try:
                # The send has the same deadline: a peer that stops reading (hung) must not hold
                # us waiting for its socket to drain. A frame cut off mid-way ruins the stream.
                async with asyncio.timeout(timeout_s):
                    await self.send(FrameKind.REQUEST, request_id, header, payload)
            except asyncio.TimeoutError:
                self.close()
                raise Timeout(f"sending {header.get('op')} to {self.address} stalled for {timeout_s:.0f}s") from None
            if self.greeting is not None:
                await asyncio.shield(self.greeting)  # its error (not tectofs, wrong server, silent) wins over ours
            try:
                async with asyncio.timeout_at(deadline):
                    frame = await fut
            except asyncio.TimeoutError:
                raise Timeout(f"{header.get('op')} to {self.address} timed out after {timeout_s:.0f}s") from None
        except TectofsError as exc:
            greeting = self.greeting
            failed: BaseException | None = None
            if greeting is not None and greeting.done() and not greeting.cancelled():
                failed = greeting.exception()
            elif not self.greeted:
                failed = self.failure  # the hello failed (e.g. not tectofs); its task has not run yet
            if failed is not None and failed is not exc:
                raise failed from None  # the peer's answer to the hello says more than ours
            raise
        finally:
            self.pending.pop(request_id, None)
            self.sinks.pop(request_id, None)
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
        default_auth: auth.ClientAuth | None = None,
    ) -> None:
        """``allocate_payload`` chooses where reply payloads are received (e.g. a buffer
        pool); whoever takes a reply's payload then owns that buffer. ``role`` is what this
        side says it is in each connection's hello. ``default_auth``: how connections to
        addresses not given their own (``authenticate``) authenticate; None: anonymously."""
        self.allocate_payload = allocate_payload
        self.connections_per_server = connections_per_server
        self.timeout_s = timeout_s
        self.retries_max = retries_max
        self.role = role
        self.session = b""  # the lease session every hello names (tectofs.wire.leases); b"": none
        self._pools: dict[str, list[_ClientConnection]] = {}
        self._connecting: dict[str, asyncio.Lock] = {}
        self._expected_roles: dict[str, str] = {}
        self._auth: dict[str, auth.ClientAuth] = {}
        self.default_auth = default_auth
        self.ssl_context = tls.client_context()  # TLS when a CA is configured (tectofs.wire.tls)
        # Servers on this host reached by a local socket (tectofs.wire.local_sockets): address -> name.
        self._local: dict[str, tuple[str, int]] = {}  # address -> (name, the server's pid)
        self._local_refused: set[str] = set()  # names whose socket could not be reached
        self.local_sockets = self.ssl_context is None and local_sockets.enabled()
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

    def authenticate(self, address: str, client_auth: auth.ClientAuth) -> None:
        """Connections to ``address`` (every member of a group) authenticate with ``client_auth``
        (the cluster key, or a user credential); without it a connection is anonymous."""
        for member in self._group(address).members:
            self._auth[member] = client_auth

    async def _connect(self, address: str) -> _ClientConnection:
        """A new connection to ``address``, its hello sent: to the server's local socket when it
        offered one (a server on this host: ``tectofs.wire.local_sockets``), else by TCP. A TCP
        connection's hello is not waited for here (requests follow it on the wire); if its
        answer offers a local socket, the connection *retires* (``_offered``)."""
        offer = self._local.get(address)
        if offer is not None:
            local = await self._connect_locally(address, *offer)
            if local is not None:
                return local
        conn = await self._connect_tcp(address)
        assert conn.transport is not None
        greeting = conn.greeting
        if self.local_sockets and greeting is not None and local_sockets.same_host(conn.transport):
            greeting.add_done_callback(lambda _: self._offered(address, conn))
        return conn

    def _offered(self, address: str, conn: _ClientConnection) -> None:
        """``conn``'s hello was answered: with a local socket offered (and not one that refused
        us), new connections to ``address`` go there, and ``conn`` retires: it finishes its
        calls and takes no new ones (``_connection`` closes it once idle)."""
        name = conn.local_offer
        if conn.greeted and name and name not in self._local_refused:
            self._local[address] = (name, conn.server_pid)
            conn.retiring = True

    async def _connect_locally(self, address: str, name: str, pid: int) -> "_ClientConnection | None":
        """A connection to ``address``'s local socket ``name``, or None: TCP then. The kernel's
        account of the process at the other end (``SO_PEERCRED``) must be the server that
        offered the name over TCP (its ``pid``): after that server exits, anyone on the host may
        bind the name. A name that refuses us or leads elsewhere (the server restarted: it
        offers a new one; another network or process namespace) is never tried again."""
        try:
            sock = await local_sockets.connect(name, limits.rpc_connect_timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            if isinstance(exc, (ConnectionRefusedError, FileNotFoundError)):
                self._refuse_local(address, name)
            else:  # busy or out of descriptors: TCP this time, the name again next time
                self._local.pop(address, None)
            return None
        if local_sockets.peer_pid(sock) != pid:
            sock.close()
            self._refuse_local(address, name)
            return None
        try:
            _, proto = await asyncio.get_running_loop().create_unix_connection(
                lambda: _ClientConnection(address, self.allocate_payload), sock=sock)
        except OSError:
            sock.close()
            self._local.pop(address, None)
            return None
        assert proto.transport is not None
        local_sockets.tune(proto.transport)
        proto.start_hello(self.role, self._expected_roles.get(address), self._auth.get(address, self.default_auth),
                          self.session)
        return proto

    def _refuse_local(self, address: str, name: str) -> None:
        if self._local.get(address, ("", 0))[0] == name:
            del self._local[address]
        if len(self._local_refused) >= 4096:
            self._local_refused.clear()
        self._local_refused.add(name)

    async def _connect_tcp(self, address: str) -> _ClientConnection:
        host, port = parse_address(address)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(limits.rpc_connect_timeout_s):
                _, proto = await loop.create_connection(
                    lambda: _ClientConnection(address, self.allocate_payload), host, port, ssl=self.ssl_context)
        except asyncio.TimeoutError:
            raise Timeout(f"connecting to {address} timed out") from None
        except OSError as exc:
            raise ConnectionLost(f"cannot connect to {address}: {exc.strerror or exc}") from None
        proto.start_hello(self.role, self._expected_roles.get(address), self._auth.get(address, self.default_auth),
                          self.session)
        return proto

    async def _connection(self, address: str) -> _ClientConnection:
        """An idle pooled connection, else a new one (up to ``connections_per_server``), else
        the least busy. Connections open only when concurrency needs them, so a thousand
        clients starting at once do not double their connection storm."""
        serving = self._serving(address)
        idle = [c for c in serving if not c.pending]
        if idle:
            return idle[0]
        if len(serving) < self.connections_per_server:
            lock = self._connecting.setdefault(address, asyncio.Lock())
            async with lock:
                serving = self._serving(address)
                if len(serving) < self.connections_per_server and not any(not c.pending for c in serving):
                    conn = await self._connect(address)
                    self._pools.setdefault(address, []).append(conn)
                    return conn
            serving = self._serving(address)  # (what the awaits above left usable)
            if not serving:
                return await self._connection(address)
        return min(serving, key=lambda c: len(c.pending))

    def _serving(self, address: str) -> list[_ClientConnection]:
        """The usable pooled connections to ``address`` that take new calls. Drops the broken
        ones, and closes retired ones once idle (those still busy stay pooled until then)."""
        pool = []
        for c in self._pools.get(address, []):
            if c.retiring and not c.pending:
                c.close()
            elif c.usable:
                pool.append(c)
        self._pools[address] = pool
        return [c for c in pool if not c.retiring]

    async def call(
        self,
        address: str,
        operation: messages.Operation[RequestT, ReplyT],
        request: RequestT,
        payload: Payload = b"",
        *,
        timeout_s: float | None = None,
        retries_max: int | None = None,
        call_id: bytes | None = None,
        receive_into: ReplySink | None = None,
    ) -> tuple[ReplyT, Payload]:
        """Send ``request`` for ``operation`` to ``address`` (or a member of the group it names);
        return the reply, as the operation's reply type, and the reply payload, or raise the
        server's error (a reply that is not of its type: ProtocolError). Retried blindly only if
        the operation is idempotent (see the class docstring). On the wire the header is the
        request's fields next to ``"op"`` (and ``call_id``), as ever.
        ``call_id``: this call's id (``CALL_ID_BYTES`` bytes), for a caller that retries one
        logical call itself; by default a non-idempotent call draws a new one.
        ``receive_into``: asked for the reply's buffers once its payload length is known (once per
        attempt); a payload received into them comes back empty (``receive_into.complete``).
        The caller calls ``receive_into.divert()`` before it reuses those buffers."""
        header = msgspec.structs.asdict(request)  # shallow: nested messages are encoded as they are
        reply, reply_payload = await self.exchange(
            address, operation.name, header, payload, idempotent=operation.idempotent, timeout_s=timeout_s,
            retries_max=retries_max, call_id=call_id, receive_into=receive_into)
        try:
            return messages.convert(reply, operation.reply), reply_payload
        except msgspec.ValidationError as exc:
            raise ProtocolError(f"{address} answered {operation.name} with an invalid reply: {exc}") from None

    async def call_raw(
        self,
        address: str,
        op: str,
        header: FrameHeader | None = None,
        payload: Payload = b"",
        *,
        idempotent: bool = False,
        timeout_s: float | None = None,
        retries_max: int | None = None,
        call_id: bytes | None = None,
        receive_into: ReplySink | None = None,
    ) -> Reply:
        """Send a request made by hand — operation ``op``, header fields ``header`` — and return
        the reply header and payload as they arrived, unchecked. For tests and tools that must
        send what a typed caller cannot (malformed requests, other versions' fields); the
        library calls :meth:`call`."""
        return await self.exchange(address, op, dict(header or {}), payload, idempotent=idempotent,
                                   timeout_s=timeout_s, retries_max=retries_max, call_id=call_id,
                                   receive_into=receive_into)

    async def exchange(
        self,
        address: str,
        op: str,
        header: FrameHeader,
        payload: Payload,
        *,
        idempotent: bool,
        timeout_s: float | None,
        retries_max: int | None,
        call_id: bytes | None,
        receive_into: ReplySink | None,
    ) -> Reply:
        """What every call comes down to: ``header`` (the request's fields; this takes it and
        adds ``op`` and the call id) sent until answered, with the retries, failover and backoff
        of the class docstring."""
        group = self._group(address)
        request = header
        request["op"] = op
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
                return await conn.call(request, payload, timeout_s or self.timeout_s, receive_into)
            except Busy:
                if attempt >= retries:
                    raise
                reason = "busy"
            except (ConnectionLost, Timeout) as exc:
                self.forget(member)
                group.failed(member)
                failures[member] = str(exc)
                if group.member not in failures:
                    self.retrying(op, "failover")
                    continue  # another member, at once: this round is not over
                if isinstance(exc, HelloTimeout):
                    # Silent peers: not tectofs, or hung. Few tries, so the caller hears in seconds.
                    hello_timeouts += 1
                    if hello_timeouts > limits.hello_retries_max:
                        raise _group_down(group, exc, failures) from None
                if attempt >= retries:
                    raise _group_down(group, exc, failures) from None
                failures = {}
                reason = "connection"
            self.retrying(op, reason)
            attempt += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, limits.rpc_backoff_max_s)

    def retrying(self, op: str, reason: str) -> None:
        """Called before each retry of a call of ``op``: ``reason`` is ``busy`` (the server
        answered BUSY), ``failover`` (on to the next member of a group at once) or
        ``connection`` (the connection was lost or timed out; after a backoff). Nothing here:
        a subclass counts them (``tectofs.client.metered``)."""

    def forget(self, address: str) -> None:
        """Drop pooled connections to ``address`` (every member of a group; e.g. a server
        known to be dead)."""
        for member in address.split(","):
            self._local.pop(member.strip(), None)  # greet it over TCP again
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
