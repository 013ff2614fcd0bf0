"""Local sockets: a client on the same host as a server talks to it over a Unix socket.

Over TCP loopback every byte pays for the TCP stack at both ends (segments, acks, the
loopback softirq) on top of the one copy into the reader's buffer; a Unix stream socket pays
for little more than that copy. Loading a 1 GiB checkpoint from six chunk servers on this host
cost 0.48 CPU seconds per GB in the client and 0.18 in the chunk servers, against 0.76 and 0.36
over TCP; saving it, 0.79 and 0.76 against 0.88 and 0.89 (``bench/cpu_per_gb.py --tcp-arm``,
medians of 9). HDFS's short-circuit local reads serve the same case: storage on the hosts that
compute.

The contract:

* A server without TLS listens, besides its TCP port, on a name in Linux's *abstract* socket
  namespace (:func:`new_name`: its role and 128 random bits). Abstract names belong to a network
  namespace and vanish with the process: nothing to clean up, and a client in another network
  namespace (another container, or another host) can never reach it.
* The server offers the name in its hello reply only to a peer on its own host
  (:func:`same_host`: the connection's two ends have the same IP address, or are loopback).
* A client that sees the offer (and does not use TLS) opens its next connections to that
  server on the name, and retires its TCP connection (no new calls; closed at its next call to
  that server once idle). The offer carries the server's process id, and the kernel's account
  of the process at the other end of the Unix socket (``SO_PEERCRED``, which no one can forge)
  must match it: once a server exits, any local user could bind its name. A name that refuses
  the client or leads elsewhere (the server restarted and offers a new one; another network or
  process namespace) is never tried again, and TCP carries on.
* Nothing else changes: the same frames, the same hello and authentication (a Unix socket
  proves no more than TCP does), the same connection limits.

``TECTOFS_LOCAL_SOCKETS=0`` turns it off, in a server (it offers no name) or a client (it
takes none).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import secrets
import socket
import struct
import time

from tectofs import limits

ENV = "TECTOFS_LOCAL_SOCKETS"
_PREFIX = "tectofs-"


def enabled() -> bool:
    """Whether this process offers (a server) or takes (a client) local sockets."""
    return os.environ.get(ENV, "1") != "0"


def new_name(role: str) -> str:
    """A fresh abstract socket name for a server of ``role`` (printable: no leading NUL)."""
    return f"{_PREFIX}{role}-{secrets.token_hex(16)}"


def valid_name(name: str) -> bool:
    """Whether ``name`` (from a peer's hello) is one :func:`new_name` could have made."""
    return name.startswith(_PREFIX) and 0 < len(name) <= 100 and name.isascii() and name.isprintable()


def abstract_path(name: str) -> str:
    """The socket address of ``name`` in the abstract namespace."""
    return "\0" + name


def same_host(transport: asyncio.BaseTransport) -> bool:
    """Whether ``transport`` (a TCP connection) joins two ends on this host: loopback, or a
    connection to one of this host's own addresses (the kernel then picks that same address as
    the source)."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    peer, own = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    if not isinstance(peer, tuple) or not isinstance(own, tuple):
        return False
    try:
        peer_ip = ipaddress.ip_address(str(peer[0]).split("%")[0])
    except ValueError:
        return False
    if isinstance(peer_ip, ipaddress.IPv6Address) and peer_ip.ipv4_mapped is not None:
        peer_ip = peer_ip.ipv4_mapped  # an IPv4 peer of a server listening on "::"
    return peer_ip.is_loopback or str(peer[0]) == str(own[0])


def tune(transport: asyncio.BaseTransport) -> None:
    """Give a Unix socket connection send (and receive) buffers of
    ``limits.local_socket_buffer_bytes``, capped by the kernel's ``net.core.wmem_max``. A Unix
    stream's sender may queue only its send buffer's worth; the default (about 200 KiB, not
    autotuned as TCP's is) made saves cost 17-25% more CPU than over TCP."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, limits.local_socket_buffer_bytes)
        except OSError:
            pass


async def connect(name: str, timeout_s: float) -> socket.socket:
    """A connected, non-blocking Unix socket to ``name``. Retries while the server's listen
    queue is full: a Unix socket's ``connect`` then fails with EAGAIN at once, which asyncio's
    ``create_unix_connection`` would take for "in progress" and hand back unconnected. Raises
    ConnectionRefusedError (nobody listens on ``name``), TimeoutError, or another OSError."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    deadline = time.monotonic() + timeout_s
    pause = 0.001
    try:
        while True:
            try:
                sock.connect(abstract_path(name))
                return sock
            except BlockingIOError:
                if time.monotonic() + pause > deadline:
                    raise TimeoutError(f"the local socket {name} stayed full for {timeout_s:g} s") from None
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.05)
    except BaseException:
        sock.close()
        raise


def peer_pid(sock: socket.socket) -> int:
    """The process id at the other end of a connected Unix socket, as the kernel tells it
    (``SO_PEERCRED``: it cannot be forged); 0 when unknown (e.g. another pid namespace)."""
    try:
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    except OSError:
        return 0
    return int(pid)

