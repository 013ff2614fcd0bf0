"""A bounded pool of reusable byte buffers.

Fresh memory is slow in this kind of VM (first-touch page faults cost 4-7x a copy into a
warm buffer), and the data path allocates the same large sizes over and over: block
buffers, encoded chunks, received payloads. Buffers are kept by size class (the size rounded
up to a power of two below 1 MiB, to a whole MiB above: the big sizes repeat exactly, and
rounding a 16 MiB chunk up to 32 MiB would double the memory touched) and handed out as
exact-size memoryviews.

Contract: ``get(n)`` returns a writable memoryview of exactly ``n`` bytes whose content is
undefined; ``put(view)`` gives it back (once, and only after nothing uses it any more).
At most ``capacity_bytes`` are kept idle; beyond that returned buffers are dropped. With
``aligned=True`` every buffer starts on a page boundary (anonymous private memory maps):
what a chunk server receives into can then be written to disk with ``O_DIRECT``.
"""

from __future__ import annotations

import mmap
import threading

_MIN_CLASS = 1 << 16


_MiB = 1 << 20


def _size_class(n: int) -> int:
    if n > _MiB:
        return -(-n // _MiB) * _MiB
    return max(_MIN_CLASS, 1 << (max(n, 1) - 1).bit_length())


class BufferPool:
    def __init__(self, capacity_bytes: int, aligned: bool = False) -> None:
        self.capacity_bytes = capacity_bytes
        self.aligned = aligned
        self._idle: dict[int, list[bytearray | mmap.mmap]] = {}
        self._idle_bytes = 0
        self._lock = threading.Lock()

    def get(self, n: int) -> memoryview:
        size = _size_class(n)
        with self._lock:
            free = self._idle.get(size)
            if free:
                buffer = free.pop()
                self._idle_bytes -= size
            else:
                buffer = None
        if buffer is None:
            buffer = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if self.aligned else bytearray(size)
        return memoryview(buffer)[:n]

    def put(self, view: bytes | bytearray | memoryview) -> None:
        if not isinstance(view, memoryview):
            return
        buffer = view.obj
        if not isinstance(buffer, mmap.mmap if self.aligned else bytearray):
            return  # not one of this pool's kind (e.g. a view of a file's mapping): never reused
        size = len(buffer)
        with self._lock:
            if self._idle_bytes + size > self.capacity_bytes:
                return
            self._idle.setdefault(size, []).append(buffer)
            self._idle_bytes += size
