"""The simulator's chunk disk: real files (on tmpfs), with the faults of real disks.

``SimDisk`` is injected into a chunk server (``ChunkServer(disk=...)``, the seam of
``server/chunk/disk.py``). It keeps one machine's disk across its process's crashes and
misbehaves as told, with a seeded source of chance:

- ``eio_p``: a read, write or sync fails with EIO;
- ``lie_p``: a read returns data with one bit flipped (the piece checksums must catch it);
- ``full``: writes fail with ENOSPC;
- ``crash()``: the machine loses power: what was not made durable is lost. A file written
  but not ``fdatasync``-ed is torn (cut to a random length); a rename or an unlink whose
  directory was not ``fsync``-ed is undone (the file is back under its old name, or back
  at all).
"""

from __future__ import annotations

import errno
import os
import random
from collections import Counter
from typing import Any

from tectofs.server.chunk.disk import Disk


class SimDisk(Disk):
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.eio_p = 0.0
        self.lie_p = 0.0
        self.full = False
        self.stats: Counter[str] = Counter()
        self._writing: dict[int, str] = {}  # fd -> path, open for writing
        self._unsynced: set[str] = set()  # paths whose data is not durable
        self._renamed: dict[str, str] = {}  # new path -> old path, entry not durable
        self._unlinked: dict[str, bytes] = {}  # path -> content, removal not durable

    @property
    def flaky(self) -> bool:
        return bool(self.eio_p or self.lie_p or self.full)

    def heal(self) -> None:
        """The disk behaves again (replaced controller, freed space)."""
        self.eio_p = self.lie_p = 0.0
        self.full = False

    def _maybe_fail(self, what: str) -> None:
        if self.eio_p and self.rng.random() < self.eio_p:
            self.stats["eio"] += 1
            raise OSError(errno.EIO, f"simulated I/O error ({what})")

    # ------------------------------------------------------------------ reads

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._maybe_fail("read")
        return self._lie(super().pread(fd, length, offset))

    def preadv(self, fd: int, buffers: list[memoryview], offset: int) -> int:
        self._maybe_fail("read")
        n = super().preadv(fd, buffers, offset)
        if n and self.lie_p and self.rng.random() < self.lie_p:
            self.stats["lies"] += 1
            view = buffers[0]
            at = self.rng.randrange(min(n, len(view)))
            view[at] ^= 1 << self.rng.randrange(8)
        return n

    def _lie(self, data: bytes) -> bytes:
        if data and self.lie_p and self.rng.random() < self.lie_p:
            self.stats["lies"] += 1
            flipped = bytearray(data)
            flipped[self.rng.randrange(len(flipped))] ^= 1 << self.rng.randrange(8)
            return bytes(flipped)
        return data

    # ------------------------------------------------------------------ writes

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        fd = super().open(path, flags & ~os.O_DIRECT, mode)
        if flags & (os.O_WRONLY | os.O_RDWR):
            self._writing[fd] = path
            self._unsynced.add(path)
        return fd

    def close(self, fd: int) -> None:
        self._writing.pop(fd, None)
        super().close(fd)

    def write_all(self, fd: int, buffers: list[Any]) -> None:
        if self.full:
            self.stats["enospc"] += 1
            raise OSError(errno.ENOSPC, "simulated full disk")
        self._maybe_fail("write")
        super().write_all(fd, buffers)

    def fdatasync(self, fd: int) -> None:
        self._maybe_fail("fdatasync")
        super().fdatasync(fd)
        self._unsynced.discard(self._writing.get(fd, ""))

    def rename(self, source: str, target: str) -> None:
        super().rename(source, target)
        if source in self._unsynced:
            self._unsynced.discard(source)
            self._unsynced.add(target)
        self._unlinked.pop(target, None)
        self._renamed[target] = source

    def unlink(self, path: str) -> None:
        try:
            with open(path, "rb") as f:
                content = f.read()
        except FileNotFoundError:
            content = None
        super().unlink(path)
        self._unsynced.discard(path)
        self._renamed.pop(path, None)
        if content is not None and path.endswith(".chunk"):
            self._unlinked[path] = content

    def fsync_dir(self, path: str) -> None:
        self._maybe_fail("fsync")
        super().fsync_dir(path)
        for done in [p for p in self._renamed if os.path.dirname(p) == path]:
            del self._renamed[done]
        for done in [p for p in self._unlinked if os.path.dirname(p) == path]:
            del self._unlinked[done]

    # ------------------------------------------------------------------ power loss

    def crash(self) -> None:
        """What was not durable is lost (see the module's docstring)."""
        for path in sorted(self._unsynced):
            if os.path.exists(path):
                size = os.path.getsize(path)
                os.truncate(path, self.rng.randrange(size + 1) if size else 0)
                self.stats["torn_files"] += 1
        for target, source in sorted(self._renamed.items()):
            if os.path.exists(target) and not os.path.exists(source):
                os.rename(target, source)
                self.stats["renames_undone"] += 1
        for path, content in sorted(self._unlinked.items()):
            if not os.path.exists(path) and os.path.isdir(os.path.dirname(path)):
                with open(path, "wb") as f:
                    f.write(content)
                self.stats["unlinks_undone"] += 1
        self._writing.clear()
        self._unsynced.clear()
        self._renamed.clear()
        self._unlinked.clear()
