"""Bounds on a server's connections: how many it keeps, how many one peer address may hold, and
how long one may stall mid-frame or sit idle (``RpcServer`` in ``tectofs.wire.server``).

- **Caps.** At most ``connections_max`` connections per server process (lowered to what the
  file descriptor limit leaves, after raising its soft limit to the hard one) and
  ``connections_per_peer_max`` from one IP address. A connection over a cap gets one ERROR
  frame (``Busy``: clients retry with backoff) that says which limit, and is closed; the
  connections already served are not affected, except as follows.
- **Unauthenticated connections cannot crowd out the others** (issue 29, part 3). On a server
  that pools them (``RpcServer(pool_anonymous=True)``: the metadata service, where anonymous
  peers may only ping), every connection is in the *anonymous pool* from accept until its
  hello's authentication checks out; the pool holds at most ``anonymous_connections_max``
  (1,024), and a new connection that finds it (or the server) full evicts the oldest pooled one
  (an ERROR frame, ``Busy``, then closed). So authenticated connections always keep
  ``connections_max - anonymous_connections_max`` places, and a new client's connection is
  evicted only after a thousand newer ones. The handshake itself is bounded:
  ``hello_wait_s`` (10 s) after connecting, hello and authentication must be done.
- **Authenticated connections are shared by principal** (issue 51, part 4), on the same
  servers, as a chunk server's admission shares its budget: a connection counts against its
  *principal* once its hello proved who it is (:func:`principal`: a user's uid; root and cluster
  members, who hold the cluster key, are one reserved class). Users together hold at most
  ``connections_max - connections_reserved`` (``connections_reserved``: 1,024, at most a
  quarter of the cap), so root and the cluster's own servers always find places. At that limit
  a user's new connection evicts the longest idle connection (as below) of the user holding
  the most, if the newcomer holds less than its fair share (users' places / users holding
  any); a user at its share is refused (``Busy``) instead. One user may still use every place
  nobody else wants (a 24k-rank job), but never keeps one from another user or from root. A
  new connection that finds the server itself full (root and members over their reserve) with
  no anonymous one to evict evicts for itself as if it were a new user.
- **Per-peer fairness where everyone is anonymous** (chunk servers: clients carry
  capabilities, not credentials). A new connection that finds the server full, from a peer
  address holding fewer than its fair share (``connections_max`` / peers), evicts the longest
  idle connection (no frame begun, no request in flight; among the first
  ``limits.eviction_scan_max`` in connection order) of the peer holding the most; with none
  idle, it is refused as before.
- **Stalls.** A connection whose begun frame gets no byte for ``frame_stall_timeout_s``, or
  that has not finished it within that timeout plus its size at
  ``frame_receive_rate_min_bytes_per_s``, or that got less than ``frame_progress_window_s``
  of bytes at ``frame_progress_min_bytes_per_s`` over the last such window (sliding, sampled
  by the sweep; not while the server itself paused reading it), gets an ERROR frame
  (``Timeout``) and is closed: whatever its frame reserved (a chunk server's admission
  budget) is released with it. The window is what makes a trickle cheap to survive: a byte
  every few seconds kept a 64 MiB reservation for 94 s under the whole-frame deadline alone.
- **Idleness.** A connection with no frame in flight and no request being served for
  ``connection_idle_timeout_s`` is closed without a word (clients reconnect transparently).

One sweep per ``sweep_interval_s`` checks every connection (no timer per read). Defaults come
from ``tectofs.limits``; each can be overridden by the environment variable named after it,
upper-cased, with ``TECTOFS_`` before it (``TECTOFS_FRAME_STALL_TIMEOUT_S=2``): what the tests
use to see timeouts in seconds.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import time
from collections.abc import Set
from typing import Mapping, Protocol

from tectofs import limits
from tectofs.diagnostics import RateLimitedLog
from tectofs.errors import Busy, Timeout
from tectofs.wire import auth
from tectofs.wire.framing import FrameDecoder, encode_error

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ConnectionPolicy:
    connections_max: int = limits.connections_max
    connections_per_peer_max: int = limits.connections_per_peer_max
    frame_stall_timeout_s: float = limits.frame_stall_timeout_s
    frame_receive_rate_min_bytes_per_s: float = limits.frame_receive_rate_min_bytes_per_s
    connection_idle_timeout_s: float = limits.connection_idle_timeout_s
    hello_wait_s: float = limits.hello_wait_server_s  # a connection whose hello (and auth) is not done by then is closed
    frame_progress_window_s: float = limits.frame_progress_window_s
    frame_progress_min_bytes_per_s: float = limits.frame_progress_min_bytes_per_s
    anonymous_connections_max: int = limits.anonymous_connections_max  # where the server pools them
    connections_reserved: int = limits.connections_reserved  # ... and users' connections are shared by principal

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> "ConnectionPolicy":
        """The defaults, with each ``TECTOFS_<FIELD>`` set in ``environ`` instead."""
        values: dict[str, float] = {}
        for field in dataclasses.fields(cls):
            name = f"TECTOFS_{field.name.upper()}"
            text = environ.get(name)
            if text is None:
                continue
            kind = int if field.type in ("int", int) else float
            try:
                value = kind(text)
            except ValueError:
                raise ValueError(f"{name}={text!r}: expected a {kind.__name__}") from None
            if not value > 0:
                raise ValueError(f"{name}={text!r}: must be positive")
            values[field.name] = value
        return cls(**values)  # type: ignore[arg-type]

    @property
    def sweep_interval_s(self) -> float:
        return min(2.0, self.frame_progress_window_s / 4,
                   max(0.05, min(self.frame_stall_timeout_s, self.connection_idle_timeout_s) / 10))


def raise_fd_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; return the soft limit."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1 << 31
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    target = hard if hard != infinite else max(soft, limits.connections_max + limits.file_descriptors_reserved)
    if soft != infinite and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.info("cannot raise the open files limit from %d to %d: %s", soft, target, exc)
    return soft if soft != infinite else 1 << 31


class ProgressWindow:
    """The bytes one connection received over its last ``window_s`` seconds, from samples the
    sweep takes (``(time, bytes received so far)``): the oldest kept is the newest one at least
    ``window_s`` old, so the window slides with the sweep instead of restarting."""

    __slots__ = ("samples",)

    def __init__(self) -> None:
        self.samples: collections.deque[tuple[float, int]] = collections.deque()

    def too_slow(self, now: float, received_bytes: int, window_s: float, rate_min_bytes_per_s: float) -> bool:
        """Record a sample; whether, watched for a whole window, fewer than ``window_s`` x
        ``rate_min_bytes_per_s`` bytes arrived within it."""
        samples = self.samples
        samples.append((now, received_bytes))
        while len(samples) > 1 and now - samples[1][0] >= window_s:
            samples.popleft()
        started_s, started_bytes = samples[0]
        return now - started_s >= window_s and received_bytes - started_bytes < window_s * rate_min_bytes_per_s


RESERVED = ""
"""The principal of root's and cluster members' connections: they hold the cluster key, take the
reserved places, and are never evicted for another principal's connection."""


def principal(peer: auth.Peer) -> str:
    """Whose share of a server's connections an authenticated ``peer``'s draw on: its uid (a
    proxy acting for a user is that user), or :data:`RESERVED` for root and cluster members."""
    if peer.is_member or (peer.kind == "user" and peer.name == "root"):
        return RESERVED
    return f"uid {peer.uid}"


def _peer_ip(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    ip = str(peer[0]) if isinstance(peer, tuple) and peer else "local"  # a Unix socket (tectofs.wire.local_sockets)
    return ip[7:] if ip.startswith("::ffff:") else ip  # an IPv4 peer on a dual-stack socket


class GuardedConnection(Protocol):
    """What the guard reads and stamps of one server connection (``tectofs.wire.server``'s
    connection protocol): the guard depends on this, not on the server module."""

    transport: asyncio.Transport | None
    decoder: FrameDecoder
    peer: str
    peer_ip: str | None
    received_s: float
    frame_started_s: float
    quiet_since_s: float
    progress: ProgressWindow | None
    bytes_received: int
    inflight: int
    greeted: bool
    reading_paused: bool
    sending_file: bool


class GuardedServer(Protocol):
    """What the guard reads of the server it guards (``tectofs.wire.server.RpcServer``)."""

    @property
    def name(self) -> str: ...

    @property
    def connections(self) -> Set[GuardedConnection]: ...


class ConnectionGuard:
    """Enforces a :class:`ConnectionPolicy` for one ``RpcServer`` (see the module docstring).
    Each of the server's connections reports to it: ``admit`` when made (False: refused),
    ``release`` when lost; its ``buffer_updated`` stamps ``received_s`` and
    ``frame_started_s``."""

    def __init__(self, server: GuardedServer, policy: ConnectionPolicy) -> None:
        self.server = server
        self.policy = policy
        fd_room = raise_fd_limit() - limits.file_descriptors_reserved
        self.connections_max = max(1, min(policy.connections_max, fd_room))
        if self.connections_max < policy.connections_max:
            log.info("%s: at most %d connections (the open files limit leaves that many; connections_max is %d)",
                     server.name, self.connections_max, policy.connections_max)
        self.admitted = 0
        # Each peer address's connections, in connection order (dicts keep insertion order).
        self.per_peer: dict[str, dict[GuardedConnection, None]] = {}
        # The server's unauthenticated connections, oldest first (servers that pool them only).
        self.pool_anonymous = bool(getattr(server, "pool_anonymous", False))
        self.anonymous: dict[GuardedConnection, None] = {}
        # Users' authenticated connections, by principal, each in connection order (pooling servers only).
        self.reserved = min(policy.connections_reserved, self.connections_max // 4)
        self.users_max = self.connections_max - self.reserved  # places users may hold together
        self.by_principal: dict[str, dict[GuardedConnection, None]] = {}
        self.principal_of: dict[GuardedConnection, str] = {}
        # Users by how many connections each holds, and the most any holds: the busiest user is
        # found in O(1) (counts move by one, so the most moves by at most one).
        self._holding: dict[int, dict[str, None]] = {}
        self._most = 0
        self.stats = {"refused": 0, "stalled": 0, "idle_closed": 0, "evicted": 0}
        self.lingering = 0
        self._last_sweep_s = 0.0
        self._log = RateLimitedLog(log, limits.peer_log_lines_per_s, f"connections closed by the {server.name}")
        self._listener: asyncio.base_events.Server | None = None

    def start(self, listener: asyncio.base_events.Server) -> None:
        """Sweep the server's connections while ``listener`` serves."""
        self._listener = listener
        asyncio.get_running_loop().call_later(self.policy.sweep_interval_s, self._sweep)

    # ------------------------------------------------------------------ caps

    def admit(self, conn: GuardedConnection) -> bool:
        """Count a new connection in, evicting another to make room where the policy says so;
        False: refused (handed an ERROR frame)."""
        assert conn.transport is not None
        ip = _peer_ip(conn.transport)
        from_peer = len(self.per_peer.get(ip, ()))
        name = self.server.name
        reason = ""
        if from_peer >= self.policy.connections_per_peer_max:
            reason = (f"the {name} has {from_peer} connections from {ip}, its limit per peer address;"
                      f" retry later (or raise TECTOFS_CONNECTIONS_PER_PEER_MAX)")
        elif self.pool_anonymous:
            if self.admitted >= self.connections_max or len(self.anonymous) >= self.policy.anonymous_connections_max:
                if self.anonymous:
                    self.evict(next(iter(self.anonymous)), f"{len(self.anonymous)} unauthenticated connections,"
                               f" its limit for them (oldest closed first; authenticate in the hello)")
                elif (victim := self._share_victim(None, 0)) is not None:
                    self.evict(victim, self._share_why())
                else:
                    reason = self._full(name)
        elif self.admitted >= self.connections_max:
            victim = self._idle_victim(ip, from_peer)
            if victim is None:
                reason = self._full(name)
            else:
                self.evict(victim, f"{self.admitted} connections, its limit (the longest idle of the peer address"
                           f" holding the most is closed for another peer's)")
        if not reason:
            conn.peer_ip = ip
            self.per_peer.setdefault(ip, {})[conn] = None
            self.admitted += 1
            if self.pool_anonymous:
                self.anonymous[conn] = None
            conn.received_s = conn.frame_started_s = conn.quiet_since_s = time.monotonic()
            return True
        self.stats["refused"] += 1
        self._log.warning("%s: refused a connection from %s: %s", name, conn.peer, reason)
        refusal = _Refusal(self, conn.transport, encode_error(0, Busy(reason)))  # type: ignore[arg-type]
        conn.transport.set_protocol(refusal)
        return False

    def _full(self, name: str) -> str:
        return (f"the {name} has {self.admitted} connections, its limit; retry later"
                f" (or raise TECTOFS_CONNECTIONS_MAX and the open files limit)")

    def _idle_victim(self, ip: str, from_peer: int) -> GuardedConnection | None:
        """The connection to close for a newcomer from ``ip`` at the cap: the longest idle one
        of the peer address holding the most, if ``ip`` holds less than its fair share."""
        peers = len(self.per_peer) + (ip not in self.per_peer)
        if from_peer >= self.connections_max / peers:
            return None  # it has its share already
        busiest = max(self.per_peer, key=lambda peer: len(self.per_peer[peer]))
        return longest_idle(self.per_peer[busiest], limits.eviction_scan_max)

    def _share_victim(self, newcomer: str | None, holds: int) -> GuardedConnection | None:
        """The connection to close for a connection of ``newcomer`` (None: not known yet, counted
        as a new user) that holds ``holds``, at the users' limit: the longest idle one of the user
        holding the most, if ``newcomer`` holds less than its fair share of users' places."""
        if not self.by_principal:
            return None
        users = len(self.by_principal) + (newcomer not in self.by_principal)
        if holds >= self.users_max / users:
            return None  # it has its share already
        busiest = next(iter(self._holding[self._most]))
        if busiest == newcomer:
            return None
        return longest_idle(self.by_principal[busiest], limits.eviction_scan_max)

    def _share_why(self) -> str:
        return (f"{self.users} connections of users (and {self.admitted - self.users} others), its limit: the longest"
                f" idle of the user holding the most ({self._most}) is closed for another's")

    @property
    def users(self) -> int:
        """Users' authenticated connections (pooling servers)."""
        return len(self.principal_of)

    def authenticated(self, conn: GuardedConnection, principal: str = RESERVED) -> bool:
        """``conn``'s hello proved who it is (``principal``, :func:`principal`): it leaves the
        anonymous pool and, on a server that pools those, counts against its principal's share,
        evicting another user's where the policy says so. False: refused, uncounted and handed
        a ``Busy`` ERROR frame (its protocol replaced: it reads nothing more)."""
        self.anonymous.pop(conn, None)
        if principal == RESERVED or not self.pool_anonymous or conn.peer_ip is None:
            return True
        held = self.by_principal.get(principal, {})
        if self.users >= self.users_max:
            victim = self._share_victim(principal, len(held))
            if victim is None:
                self._refuse_user(conn, principal, len(held))
                return False
            self.evict(victim, self._share_why())
        elif self.admitted >= self.connections_max and len(held) >= self.users_max / (len(self.by_principal) + (not held)):
            # The server is full, and this connection's place was made when it was accepted
            # (for a newcomer, not for a user over its share).
            self._refuse_user(conn, principal, len(held))
            return False
        self._count(principal, len(held), +1)
        self.by_principal.setdefault(principal, {})[conn] = None
        self.principal_of[conn] = principal
        return True

    def _count(self, user: str, holds: int, change: int) -> None:
        """``user``, holding ``holds`` connections, gets ``change`` (+1 or -1) more."""
        holding = self._holding
        if holds:
            bucket = holding[holds]
            del bucket[user]
            if not bucket:
                del holding[holds]
        if holds + change:
            holding.setdefault(holds + change, {})[user] = None
        self._most = max(self._most, holds + change)
        if self._most not in holding:
            self._most = max(0, self._most - 1)
        assert self._most == 0 or self._most in holding

    def _refuse_user(self, conn: GuardedConnection, principal: str, holds: int) -> None:
        name = self.server.name
        users = len(self.by_principal) + (principal not in self.by_principal)
        reason = (f"the {name} has {self.users} connections of users, their limit, and {principal} holds {holds}, at"
                  f" least its share ({self.users_max} / {users} users); close idle ones or retry later (or raise"
                  f" TECTOFS_CONNECTIONS_MAX and the open files limit)")
        self.release(conn)
        self.stats["refused"] += 1
        self._log.warning("%s: refused a connection from %s: %s", name, conn.peer, reason)
        assert conn.transport is not None
        refusal = _Refusal(self, conn.transport, encode_error(0, Busy(reason)), spoke=True)  # type: ignore[arg-type]
        conn.transport.set_protocol(refusal)

    def evict(self, conn: GuardedConnection, why: str) -> None:
        """Close ``conn`` to make room (uncounted at once), telling it why."""
        self.stats["evicted"] += 1
        self.release(conn)
        message = f"the {self.server.name} closed the connection: {why}"
        self._log.warning("%s: closing the connection from %s: %s", self.server.name, conn.peer, why)
        transport = conn.transport
        if transport is None or transport.is_closing():
            return
        if getattr(conn, "sending_file", False):  # an error frame now would land inside a file's bytes
            transport.abort()
            return
        try:
            transport.write(encode_error(0, Busy(message)))
        finally:
            transport.close()

    def release(self, conn: GuardedConnection) -> None:
        ip = conn.peer_ip
        if ip is None:
            return
        conn.peer_ip = None
        self.admitted -= 1
        self.anonymous.pop(conn, None)
        user = self.principal_of.pop(conn, None)
        if user is not None:
            held = self.by_principal[user]
            self._count(user, len(held), -1)
            del held[conn]
            if not held:
                del self.by_principal[user]
        from_peer = self.per_peer[ip]
        del from_peer[conn]
        if not from_peer:
            del self.per_peer[ip]

    # ------------------------------------------------------------------ stalls and idleness

    def _sweep(self) -> None:
        if self._listener is None or not self._listener.is_serving():
            return  # the server closed
        try:
            self.check(time.monotonic())
        finally:
            asyncio.get_running_loop().call_later(self.policy.sweep_interval_s, self._sweep)

    def check(self, now: float) -> None:
        """Close the connections that stalled mid-frame, sent too slowly over the last window or
        sat idle too long, as of ``now``."""
        policy = self.policy
        # A late sweep means this server's loop was busy, not that its peers were slow: the
        # progress windows restart rather than blame them.
        late = self._last_sweep_s > 0 and now - self._last_sweep_s > max(1.0, policy.frame_progress_window_s / 2)
        self._last_sweep_s = now
        for conn in list(self.server.connections):
            transport = conn.transport
            if transport is None or transport.is_closing():
                continue
            decoder = conn.decoder
            if decoder.mid_frame:
                silent_s = now - conn.received_s
                rate = policy.frame_receive_rate_min_bytes_per_s
                allowed_s = policy.frame_stall_timeout_s + decoder.frame_bytes / rate
                if late or conn.reading_paused:
                    conn.progress = None
                elif silent_s > policy.frame_stall_timeout_s:
                    self._close_stalled(conn, f"no byte of the frame it began for {silent_s:.0f} s")
                    continue
                elif now - conn.frame_started_s > allowed_s:
                    self._close_stalled(conn, f"its frame of {decoder.frame_bytes} bytes took over {allowed_s:.0f} s")
                    continue
                else:
                    if conn.progress is None:
                        conn.progress = ProgressWindow()
                    window_s = policy.frame_progress_window_s
                    if conn.progress.too_slow(now, conn.bytes_received, window_s, policy.frame_progress_min_bytes_per_s):
                        self._close_stalled(conn, f"its frame of {decoder.frame_bytes} bytes arrives slower than"
                                            f" {policy.frame_progress_min_bytes_per_s:.0f} bytes/s over {window_s:g} s")
                continue
            conn.progress = None
            if conn.inflight or not conn.greeted:
                conn.quiet_since_s = now  # serving it (or the hello deadline watches it)
            elif now - max(conn.quiet_since_s, conn.received_s) > policy.connection_idle_timeout_s:
                self.stats["idle_closed"] += 1
                log.debug("%s: closing %s, idle for %.0f s", self.server.name, conn.peer, now - conn.quiet_since_s)
                transport.close()

    def _close_stalled(self, conn: GuardedConnection, what: str) -> None:
        self.stats["stalled"] += 1
        message = f"the {self.server.name} closed the connection: {what}"
        self._log.warning("%s: closing the connection from %s: %s", self.server.name, conn.peer, what)
        assert conn.transport is not None
        if getattr(conn, "sending_file", False):  # an error frame now would land inside a file's bytes
            conn.transport.abort()
            return
        try:
            conn.transport.write(encode_error(0, Timeout(message)))
        finally:
            conn.transport.close()


def _idle(conn: GuardedConnection) -> bool:
    return conn.greeted and not conn.inflight and not conn.decoder.mid_frame and not conn.sending_file


def longest_idle(connections: dict[GuardedConnection, None], scan_max: int) -> GuardedConnection | None:
    """Of the first ``scan_max`` of ``connections`` (oldest first), the idle one (greeted, no
    frame begun, no request in flight) quiet the longest; None if none is idle. Bounded, so a
    server at its cap pays a fixed price per newcomer."""
    best, best_s = None, float("inf")
    for count, conn in enumerate(connections):
        if count == scan_max:
            break
        active_s = max(conn.quiet_since_s, conn.received_s)
        if active_s < best_s and _idle(conn):
            best, best_s = conn, active_s
    return best


class _Refusal(asyncio.Protocol):
    """What a connection over a cap is handed to: it gets its ERROR frame once it spoke (a
    client's hello: the error is then the hello's answer, not a race with it), or after
    ``limits.connection_refused_linger_s`` of silence, and is closed once the peer closed or
    that time is up. What it sends is dropped unread. ``spoke``: the peer spoke already (a
    hello's auth frame): answered at once."""

    def __init__(self, guard: ConnectionGuard, transport: asyncio.Transport, error: bytes, spoke: bool = False) -> None:
        self.guard = guard
        self.transport = transport
        self.error = error
        if guard.lingering >= limits.connections_refused_lingering_max:
            self.timer = None
            self._answer()
            transport.close()
            return
        guard.lingering += 1
        self.timer = asyncio.get_running_loop().call_later(limits.connection_refused_linger_s, self._end)
        if spoke:
            self._answer()

    def _answer(self) -> None:
        if self.error:
            self.transport.write(self.error)
            self.error = b""
            if self.transport.can_write_eof():
                self.transport.write_eof()

    def data_received(self, data: bytes) -> None:
        self._answer()

    def eof_received(self) -> bool:
        self._answer()
        return False  # close

    def _end(self) -> None:
        self._answer()
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
            self.guard.lingering -= 1
