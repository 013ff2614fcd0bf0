"""What the mount keeps per kernel file handle (``OpenFile``, registered in ``OpenFiles``),
and what this mount's open writers of a file changed without committing it yet
(``Uncommitted``), which the kernel's view of the file shows before the commit.

Every method runs on the mount's one event loop; a handle's ``lock`` (an ``asyncio.Lock``)
serializes the calls on its file, so one slow request stalls only callers of the same file.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import itertools
import logging
from typing import Iterator

from tectofs.client.files import AsyncFile
from tectofs.errors import TectofsError

log = logging.getLogger("tectofs.fuse")


@dataclasses.dataclass(frozen=True, slots=True)
class Uncommitted:
    """What this mount's open writers of a file changed and did not commit yet."""

    size: int
    modified_at: float | None  # their last write or truncation: mtime and ctime at least this
    mtime: float | None  # set (utimens) on the file being written: exactly this
    atime: float | None
    mode: int | None  # a chmod riding on the commit

    @classmethod
    def of(cls, dirty: list[AsyncFile]) -> "Uncommitted | None":
        """What the ``dirty`` handles (open writers with uncommitted changes) of one file
        changed; None if there are none."""
        if not dirty:
            return None
        changes = [f.modified_at for f in dirty if f.modified_at is not None]
        atime = next((f.stamped_times[0] for f in dirty if f.stamped_times[0] is not None), None)
        mtime = next((f.stamped_times[1] for f in dirty if f.stamped_times[1] is not None), None)
        mode = next((f.stamped_mode for f in dirty if f.stamped_mode is not None), None)
        return cls(max(f.size for f in dirty), max(changes) if changes else None, mtime, atime, mode)


class OpenFile:
    """One kernel file handle: the client handle, its lock, and what the kernel asked for."""

    __slots__ = ("file", "lock", "append", "dirty", "just_created", "xattrs_set", "direct", "kill_on_write")

    def __init__(self, file: AsyncFile, append: bool, dirty: bool, direct: bool = False) -> None:
        self.file = file
        self.lock = asyncio.Lock()
        self.append = append
        self.dirty = dirty  # written or truncated since the last commit
        self.just_created = False  # by ``create``, whose reply carried the attributes
        self.xattrs_set = False  # an extended attribute of its file was set or removed through this mount
        self.direct = direct  # its writes bypass the kernel's page cache (and so its privilege checks)
        self.kill_on_write = False  # set-id bits or capabilities were granted since: its next write drops them


class OpenFiles:
    """The mount's open file handles, by kernel file handle number and by inode."""

    def __init__(self) -> None:
        self._handles: dict[int, OpenFile] = {}
        self._by_ino: dict[int, set[OpenFile]] = {}
        self._next_fh = itertools.count(1)
        self.grants = 0  # privileges that may have been given to some file, so far (privileges_granted)

    def new_number(self) -> int:
        """A file handle number no open file or directory has."""
        return next(self._next_fh)

    def register(self, file: AsyncFile, append: bool, dirty: bool, direct: bool = False) -> int:
        """Keep ``file`` open under a new kernel file handle number (returned); ``direct``: the
        kernel was told its writes bypass the page cache."""
        handle = OpenFile(file, append=append, dirty=dirty, direct=direct)
        fh = self.new_number()
        self._handles[fh] = handle
        self._by_ino.setdefault(file.ino, set()).add(handle)
        return fh

    def privileges_granted(self, ino: int | None) -> None:
        """Set-id bits or capabilities may have been given to inode ``ino`` (None: to any file):
        each of its open descriptors that bypass the page cache checks at its next write
        (``FileOperations.write``), as the kernel does at every write through the page cache."""
        self.grants += 1
        for handle in (self._handles.values() if ino is None else self._by_ino.get(ino, ())):
            if handle.direct:
                handle.kill_on_write = True

    def unregister(self, fh: int) -> OpenFile | None:
        handle = self._handles.pop(fh, None)
        if handle is not None:
            peers = self._by_ino.get(handle.file.ino, set())
            peers.discard(handle)
            if not peers:
                self._by_ino.pop(handle.file.ino, None)
        return handle

    def get(self, fh: int) -> OpenFile:
        """The open file of handle ``fh``; ``OSError(EBADF)`` if none."""
        try:
            return self._handles[fh]
        except KeyError:
            raise OSError(errno.EBADF, f"file handle {fh} is not open") from None

    def numbers(self) -> list[int]:
        return list(self._handles)

    def __iter__(self) -> Iterator[OpenFile]:
        return iter(list(self._handles.values()))

    def of(self, ino: int) -> list[OpenFile]:
        """Every open handle of inode ``ino``."""
        return list(self._by_ino.get(ino, ()))

    def writers(self, ino: int) -> list[OpenFile]:
        return [h for h in self._by_ino.get(ino, ()) if h.file.writable]

    def any_dirty(self) -> bool:
        return any(h.dirty for h in self._handles.values())

    def uncommitted(self, ino: int) -> Uncommitted | None:
        """What open writers of ``ino`` changed and did not commit (the size, which the kernel
        already believes; when they last changed the data; times and a mode set on the file);
        None: no uncommitted change."""
        return Uncommitted.of([h.file for h in self._by_ino.get(ino, ()) if h.file.writable and h.dirty])

    def creating_writer(self, ino: int, uid: int | None) -> OpenFile | None:
        """The handle that created inode ``ino`` and writes it, if it is its only writer here
        and caller ``uid`` (None: the mount's own user) opened it; else None."""
        writers = self.writers(ino)
        if len(writers) != 1:
            return None
        handle = writers[0]
        return handle if handle.file.created and handle.file.context.acting_uid == uid else None

    async def commit(self, handle: OpenFile) -> None:
        """Commit ``handle``'s changes (if any) and share them with the file's other handles
        here (local-file semantics within one mount; across mounts: close-to-open)."""
        async with handle.lock:
            changed = handle.dirty
            await handle.file.flush()
            handle.dirty = False
        if not changed or handle.file.committed_layout is None:
            return
        layout = handle.file.committed_layout
        for peer in self.of(handle.file.ino):
            if peer is not handle:
                async with peer.lock:
                    peer.file.adopt(layout)

    async def commit_writers(self, ino: int) -> None:
        """Commit every dirty writer of ``ino`` (before a change that must not be undone by
        their later commits), shared with the file's other handles here as ``commit`` does."""
        for handle in self.writers(ino):
            if handle.dirty:
                await self.commit(handle)

    async def commit_peers(self, opener: OpenFile) -> None:
        """A new descriptor reads what the file's other descriptors on this mount wrote, as on
        a local disk: their changes are committed now and shared. A peer's failure is its own:
        it surfaces at that descriptor's close, and the opener reads the last commit."""
        for handle in self.writers(opener.file.ino):
            if handle is opener or not handle.dirty:
                continue
            try:
                await self.commit(handle)
            except TectofsError as exc:
                log.debug("committing another descriptor of inode %d for an open: %s", opener.file.ino, exc)
