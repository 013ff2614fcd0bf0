"""The in-memory file system ``tectofs bench fuse-bindings`` serves through each FUSE binding
(:mod:`tectofs.benchmarks.fuse_binding_servers`): a dict of inodes, names as bytes, file
contents in bytearrays (:class:`MemoryTree`), and the two ways a thread binding's handler
runs a request's work on it (:class:`Direct`, :class:`HandOff`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat as statmod
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, TypeVar

ROOT_INODE = 1
HAND_OFF_TIMEOUT_S = 120.0    # HandOff: longest wait for the loop thread to answer one request
BLOCK_SIZE = 4096             # st_blksize reported
LISTING_HANDLES = 1 << 62     # directory handles count from here: never an inode number
UTIME_NOW = (1 << 30) - 1     # utimensat's special nanosecond values
UTIME_OMIT = (1 << 30) - 2

T = TypeVar("T")


# ---------------------------------------------------------------------- the tree


@dataclass
class Inode:
    """One file or directory. ``children``: name -> inode number (directories only)."""

    ino: int
    mode: int
    uid: int
    gid: int
    nlink: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    data: bytearray = field(default_factory=bytearray)
    children: dict[bytes, int] | None = None
    opened: int = 0  # open handles: an unlinked file lives until its last release

    @property
    def size(self) -> int:
        return len(self.data) if self.children is None else BLOCK_SIZE


class MemoryTree:
    """The inode table every adapter serves, names as bytes. Errors are ``OSError(errno)``.

    Not thread-safe: adapters call it from one thread at a time (a lock, or one loop thread).
    Handles: a file's is its inode number (``opened`` counts them); a directory's names a
    snapshot of its entries taken at ``opendir`` (paged by index, stable while it lives).
    The kernel's lookup counts are not tracked: an inode goes when its last name and its
    last open handle do."""

    def __init__(self) -> None:
        now = time.time_ns()
        self.inodes: dict[int, Inode] = {
            ROOT_INODE: Inode(ROOT_INODE, statmod.S_IFDIR | 0o755, os.getuid(), os.getgid(), 2, now, now, now,
                              children={})}
        self.next_ino = ROOT_INODE + 1
        self.listings: dict[int, list[tuple[bytes, int]]] = {}
        self.next_listing = LISTING_HANDLES  # never an inode number: a path API's fgetattr may pass either
        self.calls: Counter[str] = Counter()  # requests served, by kind (for the result file)
        self.threads: set[int] = set()        # threads that ran the tree's code
        self.largest_write_bytes = 0
        self.largest_read_bytes = 0
        self.handler_loops: int | None = None  # pyfuse3: distinct event loops its handlers ran on

    def _seen(self, kind: str) -> None:
        self.calls[kind] += 1
        self.threads.add(threading.get_ident())

    def get(self, ino: int) -> Inode:
        self._seen("getattr")
        inode = self.inodes.get(ino)
        if inode is None:
            raise OSError(errno.ENOENT, "no such inode")
        return inode

    def _directory(self, ino: int) -> dict[bytes, int]:
        inode = self.inodes.get(ino)
        if inode is None:
            raise OSError(errno.ENOENT, "no such inode")
        if inode.children is None:
            raise OSError(errno.ENOTDIR, "not a directory")
        return inode.children

    def lookup(self, parent: int, name: bytes) -> Inode:
        self._seen("lookup")
        child = self._directory(parent).get(name)
        if child is None:
            raise OSError(errno.ENOENT, "no such name")
        return self.inodes[child]

    def resolve(self, path: str) -> Inode:
        """The inode at ``path`` (``/a/b``), walked from the root (the path API's way)."""
        self._seen("resolve")
        inode = self.inodes[ROOT_INODE]
        for part in path.split("/"):
            if not part:
                continue
            if inode.children is None:
                raise OSError(errno.ENOTDIR, "not a directory")
            child = inode.children.get(os.fsencode(part))
            if child is None:
                raise OSError(errno.ENOENT, "no such name")
            inode = self.inodes[child]
        return inode

    def parent_and_name(self, path: str) -> tuple[int, bytes]:
        head, _, tail = path.rstrip("/").rpartition("/")
        return self.resolve(head or "/").ino, os.fsencode(tail)

    def make(self, parent: int, name: bytes, mode: int, uid: int, gid: int) -> Inode:
        """A new file (``S_IFREG`` in ``mode``) or directory (``S_IFDIR``) named ``name``."""
        self._seen("mkdir" if statmod.S_ISDIR(mode) else "create")
        children = self._directory(parent)
        if name in children:
            raise OSError(errno.EEXIST, "name exists")
        now = time.time_ns()
        directory = statmod.S_ISDIR(mode)
        inode = Inode(self.next_ino, mode, uid, gid, 2 if directory else 1, now, now, now,
                      children={} if directory else None)
        self.next_ino += 1
        self.inodes[inode.ino] = inode
        children[name] = inode.ino
        parent_inode = self.inodes[parent]
        parent_inode.mtime_ns = parent_inode.ctime_ns = now
        if directory:
            parent_inode.nlink += 1
        return inode

    def remove(self, parent: int, name: bytes, directory: bool) -> None:
        self._seen("rmdir" if directory else "unlink")
        children = self._directory(parent)
        child = children.get(name)
        if child is None:
            raise OSError(errno.ENOENT, "no such name")
        inode = self.inodes[child]
        if directory and inode.children is None:
            raise OSError(errno.ENOTDIR, "not a directory")
        if not directory and inode.children is not None:
            raise OSError(errno.EISDIR, "is a directory")
        if directory and inode.children:
            raise OSError(errno.ENOTEMPTY, "directory not empty")
        del children[name]
        now = time.time_ns()
        parent_inode = self.inodes[parent]
        parent_inode.mtime_ns = parent_inode.ctime_ns = inode.ctime_ns = now
        if directory:
            parent_inode.nlink -= 1
        inode.nlink = 0 if directory else inode.nlink - 1
        self._collect(inode)

    def _collect(self, inode: Inode) -> None:
        if inode.nlink <= 0 and inode.opened <= 0:
            self.inodes.pop(inode.ino, None)

    def setattr(self, ino: int, mode: int | None = None, uid: int | None = None, gid: int | None = None,
                size: int | None = None, atime_ns: int | None = None, mtime_ns: int | None = None) -> Inode:
        """Change what is given (``None``: leave it); ``mode`` keeps the file type bits."""
        self._seen("setattr")
        inode = self.inodes.get(ino)
        if inode is None:
            raise OSError(errno.ENOENT, "no such inode")
        if mode is not None:
            inode.mode = statmod.S_IFMT(inode.mode) | statmod.S_IMODE(mode)
        if uid is not None and uid != -1:
            inode.uid = uid
        if gid is not None and gid != -1:
            inode.gid = gid
        if size is not None:
            if inode.children is not None:
                raise OSError(errno.EISDIR, "is a directory")
            if size < len(inode.data):
                del inode.data[size:]
            else:
                inode.data.extend(bytes(size - len(inode.data)))
            inode.mtime_ns = time.time_ns()
        if atime_ns is not None:
            inode.atime_ns = atime_ns
        if mtime_ns is not None:
            inode.mtime_ns = mtime_ns
        inode.ctime_ns = time.time_ns()
        return inode

    def open(self, ino: int) -> int:
        self._seen("open")
        inode = self.inodes.get(ino)
        if inode is None:
            raise OSError(errno.ENOENT, "no such inode")
        inode.opened += 1
        return ino

    def release(self, fh: int) -> None:
        self._seen("release")
        inode = self.inodes.get(fh)
        if inode is not None:
            inode.opened -= 1
            self._collect(inode)

    def read(self, fh: int, offset: int, size: int) -> bytes:
        self._seen("read")
        self.largest_read_bytes = max(self.largest_read_bytes, size)
        return bytes(self.inodes[fh].data[offset:offset + size])

    def write(self, fh: int, offset: int, data: bytes | memoryview) -> int:
        self._seen("write")
        self.largest_write_bytes = max(self.largest_write_bytes, len(data))
        inode = self.inodes[fh]
        end = offset + len(data)
        if offset > len(inode.data):
            inode.data.extend(bytes(offset - len(inode.data)))
        inode.data[offset:end] = data
        inode.mtime_ns = inode.ctime_ns = time.time_ns()
        return len(data)

    def opendir(self, ino: int) -> int:
        """A handle on a snapshot of the directory's entries (``.`` and ``..`` not included)."""
        self._seen("opendir")
        handle = self.next_listing
        self.next_listing += 1
        self.listings[handle] = list(self._directory(ino).items())
        return handle

    def listing(self, handle: int) -> list[tuple[bytes, int]]:
        self._seen("readdir")
        return self.listings[handle]

    def releasedir(self, handle: int) -> None:
        self._seen("releasedir")
        self.listings.pop(handle, None)

    def getxattr(self) -> None:
        """No extended attributes anywhere: ENODATA (the kernel asks before every write)."""
        self._seen("getxattr")
        raise OSError(errno.ENODATA, "no such attribute")

    def stats(self) -> dict[str, Any]:
        """What the result file records: requests by kind, threads, largest requests."""
        return {"calls": dict(self.calls), "threads_that_ran_the_tree": len(self.threads),
                "largest_write_bytes": self.largest_write_bytes, "largest_read_bytes": self.largest_read_bytes,
                "handler_loops": self.handler_loops}


def times_ns(times: tuple[int, int] | None) -> tuple[int | None, int | None]:
    """(atime, mtime) in ns from mfusepy's ``utimens`` (``use_ns``: ``tv_sec * 10**9 + tv_nsec``):
    ``None`` for UTIME_OMIT, now for UTIME_NOW. Those come as a ``tv_nsec`` past 10**9 added to
    whatever ``tv_sec`` holds, so they are known by the remainder they leave (a real time with
    exactly that many nanoseconds would be taken for them: one in 10**9)."""
    if times is None:
        now = time.time_ns()
        return now, now
    chosen: list[int | None] = []
    for value in times:
        remainder = value % 10**9
        chosen.append(None if remainder == UTIME_OMIT % 10**9 else
                      time.time_ns() if remainder == UTIME_NOW % 10**9 else value)
    return chosen[0], chosen[1]


# ---------------------------------------------------------------------- how a thread binding runs a request


class Direct:
    """The handler's thread does the work itself, one at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __call__(self, work: Callable[..., T], *args: Any) -> T:
        with self.lock:
            return work(*args)

    def close(self) -> None:
        pass


async def _run(work: Callable[..., T], args: tuple[Any, ...]) -> T:
    return work(*args)


class HandOff:
    """Each request's work runs on an asyncio loop in a thread of its own; the handler's thread
    waits (``run_coroutine_threadsafe(...).result()``, as ``tectofs mount`` calls the client
    library). ``released``: a context the wait runs in (llfuse: its global lock released)."""

    def __init__(self, released: Callable[[], ContextManager[Any]] = contextlib.nullcontext) -> None:
        self.loop = asyncio.new_event_loop()
        self.released = released
        self.thread = threading.Thread(target=self.loop.run_forever, name="file-system-loop", daemon=True)
        self.thread.start()

    def __call__(self, work: Callable[..., T], *args: Any) -> T:
        future = asyncio.run_coroutine_threadsafe(_run(work, args), self.loop)
        with self.released():
            return future.result(timeout=HAND_OFF_TIMEOUT_S)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


Runner = Direct | HandOff
