"""What a chunk store needs from its disk: the chunk-disk seam.

``Disk`` is the real one, the POSIX calls the chunk-file layout (``storage.py``) and its
verified reads (``pieces.py``) make, unchanged. The simulator injects a subclass that fails
(EIO, ENOSPC), lies (flips bits on read) and forgets what was not made durable when its
machine crashes (``tectofs.testing.disk``). Packed segments (``packs.py``) still use the
real disk directly; the simulator runs chunk files only.
"""

from __future__ import annotations

import os
from typing import Any

from .fileio import fsync_dir, write_all


class Disk:
    """The real disk: every method is the ``os`` call of the same name (or the helper)."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        return os.open(path, flags, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        return os.pread(fd, length, offset)

    def preadv(self, fd: int, buffers: list[memoryview], offset: int) -> int:
        return os.preadv(fd, buffers, offset)

    def write_all(self, fd: int, buffers: list[Any]) -> None:
        write_all(fd, buffers)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def drop_cache(self, fd: int) -> None:
        """Clean pages of this file are not worth keeping (``POSIX_FADV_DONTNEED``)."""
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def fsync_dir(self, path: str) -> None:
        fsync_dir(path)

    def rename(self, source: str, target: str) -> None:
        os.rename(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def getsize(self, path: str) -> int:
        return os.path.getsize(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)


REAL_DISK = Disk()
