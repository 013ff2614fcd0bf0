"""Bounds on a server's connections: how many it keeps, how many one peer address may hold, and
how long one may stall mid-frame or sit idle (``RpcServer`` in ``tectofs.rpc``).

- **Caps.** At most ``connections_max`` connections per server process (lowered to what the
  file descriptor limit leaves, after raising its soft limit to the hard one) and
  ``connections_per_peer_max`` from one IP address. A connection over a cap gets one ERROR
  frame (``Busy``: clients retry with backoff) that says which limit, and is closed; the
  connections already served are not affected.
- **Stalls.** A connection whose begun frame gets no byte for ``frame_stall_timeout_s``, or
  that has not finished it within that timeout plus its size at
  ``frame_receive_rate_min_bytes_per_s``, gets an ERROR frame (``Timeout``) and is closed:
  whatever its frame reserved (a chunk server's admission budget) is released with it.
- **Idleness.** A connection with no frame in flight and no request being served for
  ``connection_idle_timeout_s`` is closed without a word (clients reconnect transparently).

One sweep per ``sweep_interval_s`` checks every connection (no timer per read). Defaults come
from ``tectofs.limits``; each can be overridden by the environment variable named after it,
upper-cased, with ``TECTOFS_`` before it (``TECTOFS_FRAME_STALL_TIMEOUT_S=2``): what the tests
use to see timeouts in seconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Mapping

from . import limits
from .diagnostics import RateLimitedLog
from .errors import Busy, Timeout
from .protocol import encode_error

if TYPE_CHECKING:
    from .rpc import RpcServer, _ServerConnection

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ConnectionPolicy:
    connections_max: int = limits.connections_max
    connections_per_peer_max: int = limits.connections_per_peer_max
    frame_stall_timeout_s: float = limits.frame_stall_timeout_s
    frame_receive_rate_min_bytes_per_s: float = limits.frame_receive_rate_min_bytes_per_s
    connection_idle_timeout_s: float = limits.connection_idle_timeout_s
    hello_wait_s: float = limits.hello_wait_server_s  # a connection that sent no hello by then is closed

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
        return min(2.0, max(0.05, min(self.frame_stall_timeout_s, self.connection_idle_timeout_s) / 10))


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


def _peer_ip(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    ip = str(peer[0]) if isinstance(peer, tuple) and peer else "local"  # a Unix socket (tectofs.local_sockets)
    return ip[7:] if ip.startswith("::ffff:") else ip  # an IPv4 peer on a dual-stack socket


class ConnectionGuard:
    """Enforces a :class:`ConnectionPolicy` for one ``RpcServer`` (see the module docstring).
    Each of the server's connections reports to it: ``admit`` when made (False: refused),
    ``release`` when lost; its ``buffer_updated`` stamps ``received_s`` and
    ``frame_started_s``."""

    def __init__(self, server: "RpcServer", policy: ConnectionPolicy) -> None:
        self.server = server
        self.policy = policy
        fd_room = raise_fd_limit() - limits.file_descriptors_reserved
        self.connections_max = max(1, min(policy.connections_max, fd_room))
        if self.connections_max < policy.connections_max:
            log.info("%s: at most %d connections (the open files limit leaves that many; connections_max is %d)",
                     server.name, self.connections_max, policy.connections_max)
        self.admitted = 0
        self.per_peer: dict[str, int] = {}
        self.stats = {"refused": 0, "stalled": 0, "idle_closed": 0}
        self.lingering = 0
        self._log = RateLimitedLog(log, limits.peer_log_lines_per_s, f"connections closed by the {server.name}")
        self._listener: asyncio.base_events.Server | None = None

    def start(self, listener: asyncio.base_events.Server) -> None:
        """Sweep the server's connections while ``listener`` serves."""
        self._listener = listener
        asyncio.get_running_loop().call_later(self.policy.sweep_interval_s, self._sweep)

    # ------------------------------------------------------------------ caps

    def admit(self, conn: "_ServerConnection") -> bool:
        assert conn.transport is not None
        ip = _peer_ip(conn.transport)
        from_peer = self.per_peer.get(ip, 0)
        name = self.server.name
        if self.admitted >= self.connections_max:
            reason = (f"the {name} has {self.admitted} connections, its limit; retry later"
                      f" (or raise TECTOFS_CONNECTIONS_MAX and the open files limit)")
        elif from_peer >= self.policy.connections_per_peer_max:
            reason = (f"the {name} has {from_peer} connections from {ip}, its limit per peer address;"
                      f" retry later (or raise TECTOFS_CONNECTIONS_PER_PEER_MAX)")
        else:
            conn.peer_ip = ip
            self.per_peer[ip] = from_peer + 1
            self.admitted += 1
            conn.received_s = conn.frame_started_s = conn.quiet_since_s = time.monotonic()
            return True
        self.stats["refused"] += 1
        self._log.warning("%s: refused a connection from %s: %s", name, conn.peer, reason)
        refusal = _Refusal(self, conn.transport, encode_error(0, Busy(reason)))  # type: ignore[arg-type]
        conn.transport.set_protocol(refusal)
        return False

    def release(self, conn: "_ServerConnection") -> None:
        ip = conn.peer_ip
        if ip is None:
            return
        conn.peer_ip = None
        self.admitted -= 1
        left = self.per_peer[ip] - 1
        if left:
            self.per_peer[ip] = left
        else:
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
        """Close the connections that stalled mid-frame or sat idle too long, as of ``now``."""
        policy = self.policy
        for conn in list(self.server.connections):
            transport = conn.transport
            if transport is None or transport.is_closing():
                continue
            decoder = conn.decoder
            if decoder.mid_frame:
                silent_s = now - conn.received_s
                rate = policy.frame_receive_rate_min_bytes_per_s
                allowed_s = policy.frame_stall_timeout_s + decoder.frame_bytes / rate
                if silent_s > policy.frame_stall_timeout_s:
                    self._close_stalled(conn, f"no byte of the frame it began for {silent_s:.0f} s")
                elif now - conn.frame_started_s > allowed_s:
                    self._close_stalled(conn, f"its frame of {decoder.frame_bytes} bytes took over {allowed_s:.0f} s")
            elif conn.inflight or not conn.greeted:
                conn.quiet_since_s = now  # serving it (or the hello deadline watches it)
            elif now - max(conn.quiet_since_s, conn.received_s) > policy.connection_idle_timeout_s:
                self.stats["idle_closed"] += 1
                log.debug("%s: closing %s, idle for %.0f s", self.server.name, conn.peer, now - conn.quiet_since_s)
                transport.close()

    def _close_stalled(self, conn: "_ServerConnection", what: str) -> None:
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


class _Refusal(asyncio.Protocol):
    """What a connection over a cap is handed to: it gets its ERROR frame once it spoke (a
    client's hello: the error is then the hello's answer, not a race with it), or after
    ``limits.connection_refused_linger_s`` of silence, and is closed once the peer closed or
    that time is up. What it sends is dropped unread."""

    def __init__(self, guard: ConnectionGuard, transport: asyncio.Transport, error: bytes) -> None:
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
