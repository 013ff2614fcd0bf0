"""Reply payloads sent straight from a file with ``sendfile(2)``.

A chunk server answering a large read would otherwise copy the chunk from the page cache into
a buffer, check it, and copy it again into the socket. With a :class:`FileRegion` as the
reply's payload the kernel moves the bytes from the page cache to the socket itself: no copy
into Python, no check on the server. The reader checks every piece against the crcs sent with
the reply and the whole chunk against the crc the metadata service recorded at write (end to
end, as HDFS's datanodes serve reads), and reports a damaged chunk for rebuilding; the
scrubber still re-reads every chunk in the background.

:func:`send_region` runs on a worker thread, on a duplicate of the connection's socket, while
the event loop's transport has nothing buffered and the connection's send lock is held, so no
other frame can interleave. TLS connections never take this path (the bytes must be
encrypted): :func:`read_region` reads the region instead.
"""

from __future__ import annotations

import os
import select
from typing import Callable

from .errors import ChecksumMismatch, ConnectionLost, Timeout


class FileRegion:
    """``length`` bytes of the open file ``fd`` from ``offset``, to be sent as a payload. Whoever
    holds it owns ``fd``: :meth:`close` it once sent, or on any failure (idempotent)."""

    __slots__ = ("fd", "offset", "length")

    def __init__(self, fd: int, offset: int, length: int) -> None:
        self.fd, self.offset, self.length = fd, offset, length

    def __len__(self) -> int:
        return self.length

    def __bool__(self) -> bool:
        return self.length > 0

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)

    def __repr__(self) -> str:
        return f"FileRegion(fd={self.fd}, offset={self.offset}, length={self.length})"


def send_region(sock_fd: int, region: FileRegion, timeout_s: float, closing: Callable[[], bool]) -> None:
    """Send every byte of ``region`` on the (non-blocking) socket ``sock_fd``, waiting for room
    at most ``timeout_s`` at a time. Blocks: call it on a worker thread. Raises Timeout when the
    peer stops reading, ConnectionLost when ``closing()`` turns true or the socket fails, and
    ChecksumMismatch when the file ends before the region does (the chunk was cut short on
    disk). After any exception the frame is incomplete: the caller must drop the connection."""
    poller = select.poll()
    poller.register(sock_fd, select.POLLOUT)
    offset, left = region.offset, region.length
    while left:
        if closing():
            raise ConnectionLost("connection closed while sending a file")
        try:
            sent = os.sendfile(sock_fd, region.fd, offset, left)
        except BlockingIOError:
            if not poller.poll(int(timeout_s * 1000)):
                raise Timeout(f"the peer took no data for {timeout_s:g} s") from None
            continue
        except OSError as exc:
            raise ConnectionLost(f"sending a file: {exc}") from None
        if sent == 0:
            raise ChecksumMismatch(f"file ended {left} bytes before the region sent from it")
        offset += sent
        left -= sent


def read_region(region: FileRegion) -> bytearray:
    """The region's bytes, read (where they cannot be sent from the file: TLS)."""
    out = bytearray(region.length)
    view, done = memoryview(out), 0
    while done < region.length:
        n = os.preadv(region.fd, [view[done:]], region.offset + done)
        if n == 0:
            raise ChecksumMismatch(f"file ended {region.length - done} bytes before the region read from it")
        done += n
    return out
