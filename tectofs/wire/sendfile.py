"""Reply payloads sent straight from a file with ``sendfile(2)``.

A chunk server answering a large read would otherwise copy the chunk from the page cache into
a buffer, check it, and copy it again into the socket. With a :class:`FileRegion` as the
reply's payload the kernel moves the bytes from the page cache to the socket itself: no copy
into Python, no check on the server. Every reader of a chunk checks it against the crc the
metadata service recorded at write (end to end, as HDFS's datanodes serve reads) and reports
a damaged chunk for rebuilding; the scrubber still re-reads every chunk in the background.

:func:`send_region` runs on one of this module's own threads (:func:`pool`, never the event
loop's default executor), on a duplicate of the connection's socket, while the transport has
nothing buffered and the connection's send lock is held. At most
``limits.send_file_regions_max`` regions are open in a process (:func:`try_open`): beyond that,
and for peers too slow to take a region within its deadline, readers are served the ordinary
way, so slow peers can never hold up others.

Large payloads from memory (a client's chunk puts) go out the same way, with writev(2), on
threads of their own (:func:`buffer_pool`); a send claims one first
(:func:`reserve_buffer_send`) and, with all of them taken, goes through the transport instead.
"""

from __future__ import annotations

import os
import select
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from tectofs import limits
from tectofs.errors import ChecksumMismatch, ConnectionLost, Timeout

_lock = threading.Lock()
_open_regions = 0
_pools: dict[str, ThreadPoolExecutor] = {}  # thread name prefix -> its pool (pool(), buffer_pool())
_buffer_sends = 0  # buffer_pool threads claimed (reserve_buffer_send)
_pid = os.getpid()


class FileRegion:
    """``length`` bytes of the open file ``fd`` from ``offset``, to be sent as a payload. Whoever
    holds it owns ``fd``: :meth:`close` it once sent, or on any failure (idempotent). Made by
    :func:`try_open`, which counts it until it is closed."""

    __slots__ = ("fd", "offset", "length", "counted")

    def __init__(self, fd: int, offset: int, length: int, counted: bool = False) -> None:
        self.fd, self.offset, self.length = fd, offset, length
        self.counted = counted  # made by try_open: one of the regions open in this process

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def close(self) -> None:
        global _open_regions
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)
            if self.counted:
                with _lock:
                    _open_regions -= 1

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, length={self.length})"


def try_open(fd: int, offset: int, length: int) -> FileRegion | None:
    """A region of ``fd`` (which it then owns), or None when ``limits.send_file_regions_max``
    are open already: the caller then reads the bytes itself (and still owns ``fd``)."""
    global _open_regions
    with _lock:
        if _open_regions >= limits.send_file_regions_max:
            return None
        _open_regions += 1
    return FileRegion(fd, offset, length, counted=True)


def open_regions() -> int:
    """Regions open in this process now."""
    return _open_regions


def _forked() -> None:
    """In a forked child the parent's threads are gone: start afresh (called with ``_lock``)."""
    global _buffer_sends, _pid
    if _pid != os.getpid():
        _pools.clear()
        _buffer_sends = 0
        _pid = os.getpid()


def _threads(name: str, count: int) -> ThreadPoolExecutor:
    with _lock:
        _forked()
        if name not in _pools:
            _pools[name] = ThreadPoolExecutor(count, thread_name_prefix=name)
        return _pools[name]


def pool() -> ThreadPoolExecutor:
    """The threads that run :func:`send_region` for file regions (one per region that can be open)."""
    return _threads("tectofs-sendfile", limits.send_file_regions_max)


def buffer_pool() -> ThreadPoolExecutor:
    """The threads that send large payloads from memory (``limits.send_buffer_threads``; apart
    from :func:`pool`, so that they never hold up regions)."""
    return _threads("tectofs-send", limits.send_buffer_threads)


def reserve_buffer_send() -> bool:
    """Claim one of :func:`buffer_pool`'s threads for a send (give it back with
    :func:`release_buffer_send`); False when all are taken (by peers slow to read, say): the
    caller then sends through its transport, so a send never waits in the pool's queue."""
    global _buffer_sends
    with _lock:
        _forked()
        if _buffer_sends >= limits.send_buffer_threads:
            return False
        _buffer_sends += 1
        return True


def release_buffer_send() -> None:
    global _buffer_sends
    with _lock:
        _buffer_sends = max(0, _buffer_sends - 1)


def deadline_s(length: int) -> float:
    """How long sending ``length`` bytes may take: the stall allowance plus the bytes at the
    minimum rate (a peer that trickles never holds a thread longer)."""
    return limits.send_file_stall_s + length / limits.send_file_rate_min_bytes_per_s


def send_region(sock_fd: int, head: bytes, region: "FileRegion | memoryview", closing: Callable[[], bool]) -> None:
    """Send ``head`` (the frame's header), then every byte of ``region`` — a file region, with
    sendfile(2), or a buffer in memory, in writes as large as the socket takes — on the
    (non-blocking) socket ``sock_fd``; then close ``sock_fd`` (a duplicate this call owns,
    whatever happens). Blocks: run it on :func:`pool` (a region) or :func:`buffer_pool`.
    Raises Timeout past :func:`deadline_s`, ConnectionLost when ``closing()`` turns true
    (checked at least every 0.1 s) or the socket fails, ChecksumMismatch when the file ends
    before the region does. After any exception the frame may be incomplete: the caller must
    drop the connection."""
    try:
        poller = select.poll()
        poller.register(sock_fd, select.POLLOUT)
        deadline = time.monotonic() + deadline_s(len(region) + len(head))
        if not isinstance(region, FileRegion):
            _write_all(sock_fd, poller, [memoryview(head), region], deadline, closing)
            return
        _write_all(sock_fd, poller, [memoryview(head)], deadline, closing)
        offset, left = region.offset, region.length
        while left:
            if closing():
                raise ConnectionLost("connection closed while sending a file")
            if time.monotonic() > deadline:
                raise Timeout(f"the peer took {region.length - left} of {region.length} bytes in {deadline_s(region.length):.0f} s")
            try:
                sent = os.sendfile(sock_fd, region.fd, offset, left)
            except BlockingIOError:
                poller.poll(100)
                continue
            except OSError as exc:
                raise ConnectionLost(f"sending a file: {exc}") from None
            if sent == 0:
                raise ChecksumMismatch(f"file ended {left} bytes before the region sent from it")
            offset += sent
            left -= sent
    finally:
        os.close(sock_fd)


def _write_all(sock_fd: int, poller: "select.poll", views: list[memoryview], deadline: float,
               closing: Callable[[], bool]) -> None:
    """Write every byte of ``views`` (writev: as much as the socket takes per call)."""
    total = sum(len(v) for v in views)
    views = [v for v in views if len(v)]
    while views:
        if closing():
            raise ConnectionLost("connection closed while sending a frame")
        if time.monotonic() > deadline:
            left = sum(len(v) for v in views)
            raise Timeout(f"the peer took {total - left} of {total} bytes in time")
        try:
            sent = os.writev(sock_fd, views)
        except BlockingIOError:
            poller.poll(100)
            continue
        except OSError as exc:
            raise ConnectionLost(f"sending a frame: {exc}") from None
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0] = views[0][sent:]
                sent = 0


def read_region(region: FileRegion) -> bytearray:
    """The region's bytes, read (where they cannot leave by sendfile: a TLS connection)."""
    out = bytearray(region.length)
    view, done = memoryview(out), 0
    while done < region.length:
        n = os.preadv(region.fd, [view[done:]], region.offset + done)
        if n == 0:
            raise ChecksumMismatch(f"file ended {region.length - done} bytes before the region read from it")
        done += n
    return out
