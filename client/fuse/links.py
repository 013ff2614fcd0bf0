"""The names the mount has seen of files that have several (hard links).

libfuse's path-based API gives every name its own kernel inode, so the kernel caches a
file's attributes once per name: after a chmod, a write or a new link through one name,
the others would show the old mode, size or link count until their cache expires. The FUSE
adapter records here the names of every file with ``nlink > 1`` it reports, and after a
change through one name tells the kernel to forget the attributes of the others.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

linked_files_max = 65_536  # files remembered (least recently seen forgotten first)
names_per_file_max = 64    # names remembered per file


class LinkedNames:
    """Thread-safe: the mount's worker threads share one."""

    def __init__(self, files_max: int = linked_files_max) -> None:
        self._files_max = files_max
        self._names: OrderedDict[int, set[str]] = OrderedDict()  # ino -> names seen
        self._ino_of: dict[str, int] = {}
        self._lock = threading.Lock()

    def seen(self, path: str, ino: int, nlink: int) -> None:
        """``path`` names ``ino``, which has ``nlink`` names."""
        with self._lock:
            if nlink <= 1 and ino not in self._names:
                return
            names = self._names.setdefault(ino, set())
            self._names.move_to_end(ino)
            if path not in names and len(names) < names_per_file_max:
                names.add(path)
                self._ino_of[path] = ino
            while len(self._names) > self._files_max:
                _, dropped = self._names.popitem(last=False)
                for name in dropped:
                    self._ino_of.pop(name, None)

    def others(self, path: str) -> list[str]:
        """The other names seen of the file ``path`` names (none if it has one)."""
        with self._lock:
            ino = self._ino_of.get(path)
            return [] if ino is None else [name for name in self._names.get(ino, ()) if name != path]

    def removed(self, path: str) -> None:
        with self._lock:
            ino = self._ino_of.pop(path, None)
            if ino is not None:
                names = self._names.get(ino, set())
                names.discard(path)
                if not names:
                    self._names.pop(ino, None)

    def renamed(self, old: str, new: str) -> None:
        """``old`` is now called ``new`` (whatever ``new`` named before is gone)."""
        self.removed(new)
        with self._lock:
            ino = self._ino_of.pop(old, None)
            if ino is not None and ino in self._names:
                self._names[ino].discard(old)
                self._names[ino].add(new)
                self._ino_of[new] = ino
