"""Whether an open may keep the kernel's page cache of a file (``FileInfo.keep_cache``).

Close-to-open consistency asks that an ``open`` reads what every ``close`` before it committed.
The kernel drops a file's cached pages at an open unless told to keep them; keeping them is
right when they hold the very version this open sees. A version is the committed size, mtime
and ctime (a commit always moves the ctime: ``rsync -t`` restoring size and mtime still
differs). The pages hold the version of the last open that did not keep them, provided that no
handle of another version, nor a writer of this mount (whose writes go through the pages), had
the file open since: so an open keeps them when its version is the one recorded, and the record
goes whenever a writer opens or a handle of another version is or was open at the same time.
"""

from __future__ import annotations

from collections import OrderedDict

from tectofs.client.files import AsyncFile

versions_max = 65_536  # files whose page-cache version is remembered (past it, the oldest are forgotten)

Version = tuple[int, float, float]


def version_of(file: AsyncFile) -> Version:
    """The committed version ``file`` opened."""
    attrs = file.attrs
    return attrs.size, attrs.mtime, attrs.ctime


class PageCacheVersions:
    def __init__(self) -> None:
        self._versions: OrderedDict[int, Version] = OrderedDict()

    def opened(self, file: AsyncFile, others: list[AsyncFile]) -> bool:
        """``file`` was just opened, while ``others`` of its inode are open on this mount:
        whether the kernel may keep the pages it has of it."""
        ino, version = file.ino, version_of(file)
        if file.writable or any(other.writable or version_of(other) != version for other in others):
            self._versions.pop(ino, None)
            return False
        keep = self._versions.get(ino) == version
        self._versions[ino] = version
        self._versions.move_to_end(ino)
        while len(self._versions) > versions_max:
            self._versions.popitem(last=False)
        return keep

    def closed(self, file: AsyncFile) -> None:
        """A handle closed: if it read another version than the one recorded, pages of that
        version may be in the cache."""
        if self._versions.get(file.ino) not in (None, version_of(file)):
            self._versions.pop(file.ino, None)
