"""What the mount keeps per kernel file handle (``OpenFile``), and what this mount's open
writers of a file changed without committing it yet (``Uncommitted``), which the kernel's
view of the file shows before the commit."""

from __future__ import annotations

import dataclasses
import threading

from tectofs.client.files import AsyncFile


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

    __slots__ = ("file", "lock", "append", "dirty", "just_created", "xattrs_set")

    def __init__(self, file: AsyncFile, append: bool, dirty: bool) -> None:
        self.file = file
        self.lock = threading.Lock()
        self.append = append
        self.dirty = dirty  # written or truncated since the last commit
        self.just_created = False  # by ``create``, whose reply carried the attributes
        self.xattrs_set = False  # an extended attribute of its file was set or removed through this mount
