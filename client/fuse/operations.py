"""The FUSE mount: a thin adapter from kernel calls to client-library calls and errno.

    tectofs mount --meta HOST:PORT /mnt/tectofs          # or tectofs.client.fuse.mount.mount(...)

Every kernel request becomes one call on the blocking client (:class:`FileSystem`), whose
event-loop thread moves the data; every tectofs error leaves as its one ``errno``. Nothing
here caches or buffers data: open files are :class:`AsyncFile` handles, which buffer writes
per block, send full blocks in parallel, prefetch on sequential reads and commit at
``flush``/``fsync``/``release`` (close-to-open consistency: what a ``close`` returned from is
what any later ``open``, on any mount, sees).

Users: a mount run by root (or by a user when /etc/fuse.conf has ``user_allow_other``) over
a proxy credential (root's, or ``tectofs user add --proxy``) is multi-user: ``allow_other``
lets every local user in and each request runs as its caller (:class:`Callers`: uid, gid
and supplementary groups, through ``AsyncFileSystem.acting_as``), so the metadata service
checks that user's permissions and what they create is theirs; ``default_permissions`` has
the kernel check mode bits against the attributes first. An open file keeps the identity it
was opened with (POSIX checks permission at open): its reads, writes and commits are the
opener's, whoever shares the descriptor. Otherwise the mount is single-user, as the
credential's user (one log line says which and why).

Threads: libfuse serves requests from several threads (``threads=True``); the client is
thread-safe and each open file serializes its own calls with a lock, so one slow request
stalls only callers of the same file.

Kernel settings (``init_with_config``): 1 MiB writes (``conn.max_write``; ``-o max_write``
is rejected by libfuse3), attribute and entry timeouts of ``attr_timeout_s``, no negative
cache (a name created on another mount is visible at once), ``use_ino`` (tectofs inode
numbers), ``hard_remove`` (libfuse must not rename open files to ``.fuse_hidden*`` on
unlink: the kernel releases files asynchronously, so a ``rm`` right after ``close`` would
leave such names behind and make ``rmdir`` fail), no page cache kept across opens, and
READDIRPLUS for every listing request (``readdir``: listings bring each entry's
attributes, so stats right after a listing need no lookup per file).

Files: hard links are names of one inode; a file unlinked while open stays readable and
writable through the handles that have it open (each holds a lease) and goes with the last
one; special files are metadata the kernel serves.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import logging
import os
import stat as statmod
import threading
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable, TypeVar

import mfusepy

from tectofs import limits
from tectofs.client.core import AsyncFileSystem, DirectoryChange, Stat
from tectofs.client.files import AsyncFile
from tectofs.client.fuse.process import (
    MountProcess,
    is_mounted,
    raise_read_ahead,
    start_mount_process,
    unmount_wait_s,
)
from tectofs.errors import PermissionDenied, TectofsError
from tectofs.wire import messages

__all__ = ["MountProcess", "TectofsOperations", "is_mounted", "start_mount_process", "unmount_wait_s"]
from tectofs.client.fuse.fresh import FreshAttributes
from tectofs.client.fuse.handles import OpenFile, Uncommitted
from tectofs.client.fuse.links import LinkedNames
from tectofs.client.fuse.listings import KnownListings
from tectofs.client.fuse.readdir import Entry, OpenListings
from tectofs.client.fuse.users import Callers, on_view
from tectofs.client.sync import FileSystem

log = logging.getLogger("tectofs.fuse")

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

max_write_bytes = 1 * limits.MiB          # largest kernel write request (libfuse3's buffer limit)
max_readahead_bytes = 8 * limits.MiB      # the kernel caps it at the device's read-ahead setting
io_size_hint_bytes = 1 * limits.MiB       # st_blksize: buffer size that cp, dd conv=... pick
reported_attrs_max = 65_536               # remembered per-inode attributes (for close-to-open)
free_inodes_reported = 2**32               # statfs: tectofs has no inode limit; df -i shows this many free

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2
_SET_ID = statmod.S_ISUID | statmod.S_ISGID
_ACCESS_MODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR
_CAP_READDIRPLUS_AUTO = 1 << 14  # FUSE_CAP_READDIRPLUS_AUTO (libfuse3)
_KIND_BITS = {"file": statmod.S_IFREG, "dir": statmod.S_IFDIR, "symlink": statmod.S_IFLNK, "fifo": statmod.S_IFIFO,
              "socket": statmod.S_IFSOCK, "char": statmod.S_IFCHR, "block": statmod.S_IFBLK}


# Requests that change no directory's attributes, or tell FreshAttributes themselves (create,
# unlink, chmod, chown, utimens; those change no listing either); every other request moves its
# epoch and drops the known listings.
_LEAVE_DIRECTORIES = frozenset({
    "getattr", "read", "readinto", "write", "flush", "fsync", "release", "readlink", "statfs",
    "getxattr", "listxattr", "access", "open", "releasedir", "fsyncdir", "create", "unlink",
    "chmod", "chown", "utimens",
})


def _errno(method: F) -> F:
    """Turn tectofs errors into ``FuseOSError(errno)``; anything unexpected is EIO, logged.
    A request that may change a directory is a change for ``FreshAttributes``, and drops the
    ``KnownListings`` when it starts and ends (``mkdir`` keeps track itself)."""
    changes = method.__name__ not in _LEAVE_DIRECTORIES
    drops_listings = changes and method.__name__ != "mkdir"

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if drops_listings:
            args[0].listings.forget_all()
        started = args[0].fresh.begin_change() if changes else 0
        try:
            return method(*args, **kwargs)
        except TectofsError as exc:
            log.debug("%s%r: %s", method.__name__, args[1:3], exc)
            raise mfusepy.FuseOSError(exc.errno) from None
        except OSError:
            raise
        except Exception:
            log.exception("FUSE %s%r failed unexpectedly", method.__name__, args[1:3])
            raise mfusepy.FuseOSError(errno.EIO) from None
        finally:
            if changes:
                args[0].fresh.end_change(started)
            if drops_listings:
                args[0].listings.forget_all()

    return wrapper  # type: ignore[return-value]


async def _listing(fs: AsyncFileSystem, path: str) -> tuple[messages.AttrsReply, list[tuple[str, Stat]]]:
    """A directory's attributes and entries."""
    directory = await fs.metadata.lookup(messages.PathRequest(path=path))
    return directory, await fs.scandir(path)


class TectofsOperations(mfusepy.Operations):
    """The operations table libfuse calls (paths are absolute, as tectofs paths are).

    Serve it with :class:`TectofsFuse`, which adds in-place reads and writes and rename flags."""

    use_ns = True  # times cross the boundary as integer nanoseconds

    def __init__(self, fs: FileSystem, mountpoint: str, attr_timeout_s: float = 1.0,
                 on_ready: Callable[[], None] | None = None, callers: Callers | None = None,
                 entry_timeout_s: float | None = None, negative_cache_s: float = 0.0) -> None:
        """``entry_timeout_s`` (default ``attr_timeout_s``): how long the kernel may reuse a name
        it looked up without asking again. 0 when the metadata service alone checks permissions:
        a path walk through a cached name asks nobody, so a caller who lost search permission
        on a directory would still reach the names below it. ``negative_cache_s`` (0: off):
        how long after its last change to a directory it made the mount answers lookups of
        absent names there itself (``KnownListings``; not when ``entry_timeout_s`` is 0)."""
        assert attr_timeout_s >= 0
        self.fs = fs
        self.mountpoint = os.path.abspath(mountpoint)
        self.attr_timeout_s = attr_timeout_s
        self.entry_timeout_s = attr_timeout_s if entry_timeout_s is None else entry_timeout_s
        self._on_ready = on_ready
        self._handles: dict[int, OpenFile] = {}
        self._by_ino: dict[int, set[OpenFile]] = {}
        self._registry_lock = threading.Lock()
        self._next_fh = itertools.count(1)
        self.open_listings = OpenListings(attributes_fresh_s=attr_timeout_s)
        # (size, mtime) last returned to the kernel per inode; an open that finds the file
        # changed since then tells the kernel to drop its cached attributes.
        self._reported: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._reported_lock = threading.Lock()
        self.callers = callers or Callers()
        self.links = LinkedNames()
        self.fresh = FreshAttributes(attr_timeout_s)
        self.listings = KnownListings(negative_cache_s if self.entry_timeout_s > 0 else 0.0)

    # ------------------------------------------------------------------ plumbing

    def _run(self, coro: Any) -> Any:
        return self.fs.run(coro)

    def _as_caller(self, call: Callable[[AsyncFileSystem], Awaitable[T]]) -> T:
        """``call(fs)`` with ``fs`` the client as the process that made this kernel request
        (``Callers``): what it creates is theirs, and the metadata service checks their
        permissions."""
        identity = self.callers.identity()
        return self.fs.run(on_view(self.fs.aio, identity, call))

    def _handle(self, fh: int) -> OpenFile:
        handle = self._handles.get(fh)
        if handle is None:
            raise mfusepy.FuseOSError(errno.EBADF)
        return handle

    def _register(self, file: AsyncFile, flags: int, dirty: bool) -> int:
        handle = OpenFile(file, append=bool(flags & os.O_APPEND), dirty=dirty)
        with self._registry_lock:
            fh = next(self._next_fh)
            self._handles[fh] = handle
            self._by_ino.setdefault(file.ino, set()).add(handle)
        return fh

    def _unregister(self, fh: int) -> OpenFile | None:
        with self._registry_lock:
            handle = self._handles.pop(fh, None)
            if handle is not None:
                peers = self._by_ino.get(handle.file.ino, set())
                peers.discard(handle)
                if not peers:
                    self._by_ino.pop(handle.file.ino, None)
        return handle

    def _writers(self, ino: int) -> list[OpenFile]:
        with self._registry_lock:
            return self._writers_locked(ino)

    def _writers_locked(self, ino: int) -> list[OpenFile]:
        return [h for h in self._by_ino.get(ino, ()) if h.file.writable]

    def _remember(self, ino: int, size: int, mtime: float) -> None:
        with self._reported_lock:
            self._reported[ino] = (size, mtime)
            self._reported.move_to_end(ino)
            while len(self._reported) > reported_attrs_max:
                self._reported.popitem(last=False)

    def _stat_dict(self, st: Stat, uncommitted: Uncommitted | None = None) -> dict[str, Any]:
        """The kernel's view of ``st``; what open writers changed and did not commit yet
        (their size, the time of their last change as mtime and ctime, times and a mode set
        on the file they write) overrides the committed attributes."""
        size, mtime, ctime, atime, mode = st.size, st.mtime, st.ctime, st.atime, st.mode
        if uncommitted is not None:
            size = uncommitted.size
            if uncommitted.modified_at is not None:
                mtime, ctime = max(mtime, uncommitted.modified_at), max(ctime, uncommitted.modified_at)
            mtime = mtime if uncommitted.mtime is None else uncommitted.mtime
            atime = atime if uncommitted.atime is None else uncommitted.atime
            mode = mode if uncommitted.mode is None else uncommitted.mode
        self._remember(st.ino, size, st.mtime)
        return {
            "st_ino": st.ino,
            "st_mode": _KIND_BITS[st.kind] | (mode & 0o7777),
            "st_nlink": st.nlink,
            "st_uid": st.uid,
            "st_gid": st.gid,
            "st_size": size,
            "st_blocks": (st.stored + 511) // 512,  # what is stored, so du sees holes
            "st_blksize": io_size_hint_bytes,
            "st_atime": int(atime * 1e9),
            "st_mtime": int(mtime * 1e9),
            "st_ctime": int(ctime * 1e9),
            "st_rdev": st.rdev,
        }

    def _seen_by_writers(self, ino: int) -> Uncommitted | None:
        """What open writers of this mount changed and did not commit (the size, which the
        kernel already believes; when they last changed the data; times and a mode set on
        the file); None: no uncommitted change."""
        return Uncommitted.of([h.file for h in self._writers(ino) if h.dirty])

    def _invalidate_if_changed(self, path: str, file: AsyncFile) -> None:
        """Close-to-open across mounts: the kernel may still hold attributes (size!) from
        before another client's commit; tell it to fetch them again."""
        with self._reported_lock:
            reported = self._reported.get(file.ino)
        if reported is None or reported == (file.attrs.size, file.attrs.mtime):
            return
        self._invalidate(path)

    @staticmethod
    def _invalidate(path: str) -> None:
        """Have the kernel drop its cached attributes of ``path`` (from a request's thread)."""
        try:
            fuse = ctypes.c_void_p(mfusepy._libfuse.fuse_get_context().contents.fuse)
            mfusepy._libfuse.fuse_invalidate_path(fuse, path.encode("utf-8", "surrogateescape"))
        except Exception as exc:  # best effort: attributes expire after attr_timeout_s anyway
            log.debug("could not invalidate cached attributes of %s: %s", path, exc)

    def _changed_through(self, path: str | None, others: list[str] | None = None) -> None:
        """A file changed through ``path``: the kernel's attributes of its other names (hard
        links, each a kernel inode of its own under libfuse's path API) are stale."""
        for name in (others if others is not None else self.links.others(path) if path else []):
            self._invalidate(name)

    # ------------------------------------------------------------------ lifecycle

    def init_with_config(self, conn: Any, config: Any) -> None:
        if conn is not None:
            conn.max_write = max_write_bytes
            conn.max_readahead = max_readahead_bytes
            # every listing request a READDIRPLUS, not just the first page of each listing
            conn.want &= ~_CAP_READDIRPLUS_AUTO
            # conn.max_read stays 0 (unlimited): libfuse3 refuses an init() whose max_read
            # differs from the -o max_read mount option.
        if config is not None:
            config.attr_timeout = self.attr_timeout_s
            config.entry_timeout = self.entry_timeout_s
            config.negative_timeout = 0.0
            config.use_ino = 1
            config.hard_remove = 1
            config.kernel_cache = 0
            config.auto_cache = 0
        raise_read_ahead(self.mountpoint, max_readahead_bytes)
        if self._on_ready is not None:
            self._on_ready()

    def destroy(self, path: str) -> None:
        for fh in list(self._handles):
            handle = self._unregister(fh)
            if handle is not None:
                try:
                    self._run(handle.file.close())
                except TectofsError as exc:
                    log.warning("commit of %s at unmount failed: %s", handle.file.path, exc)

    # ------------------------------------------------------------------ attributes

    @_errno
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        handle = None if fh is None else self._handles.get(fh)
        if handle is not None and handle.just_created:
            handle.just_created = False  # libfuse's getattr right after create: create answered it
            st = Stat.from_attrs(handle.file.attrs)
        elif handle is not None:  # fstat: as the handle's opener, like its other calls
            opened = handle.file
            fresh = self._run(opened.context.metadata.getattr(messages.InoRequest(ino=opened.ino, handle=opened.handle)))
            st = Stat.from_attrs(fresh.attrs)
        elif path is None:
            raise mfusepy.FuseOSError(errno.ESTALE)
        elif path != "/" and self.listings.absent(_directory_of(path), path.rsplit("/", 1)[1]):
            raise mfusepy.FuseOSError(errno.ENOENT)  # the lookup before a create, mostly
        elif (fresh := self.fresh.take(path, self.callers.identity())) is not None:
            st = fresh  # what a create, unlink or setattr just made of it
        elif (writer := self._creating_writer(path)) is not None and not self.links.others(path):
            st = Stat.from_attrs(writer.file.attrs)  # the file this caller is writing: as created, and what it changed since
        else:
            try:
                st = self._as_caller(lambda fs: fs.stat(path))
            except PermissionDenied as refusal:
                st = self._stat_through_open_file(path, refusal)
            self.links.seen(path, st.ino, st.nlink)
        return self._stat_dict(st, self._seen_by_writers(st.ino))

    def _stat_through_open_file(self, path: str, refusal: PermissionDenied) -> Stat:
        """``fstat`` reaches a high-level FUSE mount as a getattr by path: the kernel sends no
        file handle with it. When the caller may no longer walk ``path`` (a parent's search
        permission was taken away after its open), a descriptor open on it still answers, as
        fstat does on Linux: by inode number, with the file handle its open was issued. The
        metadata service takes that handle only from the uid it was issued to, so another
        user's descriptor at the same path answers nothing. Else the refusal stands."""
        with self._registry_lock:
            files = [h.file for h in self._handles.values() if h.file.path == path]
        for file in files:
            try:
                reply = self._as_caller(lambda fs: fs.metadata.getattr(messages.InoRequest(ino=file.ino, handle=file.handle)))
                return Stat.from_attrs(reply.attrs)
            except PermissionDenied:
                continue
        raise refusal

    # tar, cp -p and rsync create a file, write it, then set its times, owner and mode before
    # closing it. On a file the caller's descriptor on this mount created (and is the only one
    # writing), the changes that make nothing more restrictive ride on its commit at close, one
    # call for all: times, a chown that changes nothing, a chmod that only adds permission bits.
    # Anything else commits this mount's writers of the file first, then sets the attributes.

    @_errno
    def chmod(self, path: str, mode: int) -> int:
        writer = self._creating_writer(path)
        if writer is not None:
            current = writer.file.attrs.mode & 0o7777 if writer.file.stamped_mode is None else writer.file.stamped_mode
            bits = mode & 0o7777  # (the kernel's mode carries the file type bits too)
            if not bits & ~0o777 and not current & ~bits:  # grants, takes nothing away
                self._defer(path, writer, lambda file: file.stamp_mode(bits))
                return 0
        self._commit_writers_of(path)
        self._set_attributes(path, lambda: self._as_caller(lambda fs: fs.setattr(path, mode=mode & 0o7777)))
        return 0

    @_errno
    def chown(self, path: str, uid: int, gid: int) -> int:
        new_uid, new_gid = None if uid == -1 else uid, None if gid == -1 else gid
        writer = self._creating_writer(path)
        if writer is not None:
            attrs = writer.file.attrs
            mode = attrs.mode if writer.file.stamped_mode is None else writer.file.stamped_mode
            if new_uid in (None, attrs.uid) and new_gid in (None, attrs.gid) and not mode & _SET_ID:
                self._defer(path, writer, lambda file: None)  # nothing changes but the ctime, at the commit
                return 0
        self._commit_writers_of(path)
        self._set_attributes(path, lambda: self._as_caller(lambda fs: fs.setattr(path, uid=new_uid, gid=new_gid)))
        return 0

    @_errno
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        now = time.time()
        if times is None:
            atime: float | None = now
            mtime: float | None = now
        else:
            atime, mtime = (None if t == UTIME_OMIT else now if t == UTIME_NOW else t / 1e9 for t in times)
        if atime is None and mtime is None:
            return 0
        writer = self._creating_writer(path)
        if writer is not None:
            self._defer(path, writer, lambda file: file.stamp_times(atime, mtime))
            return 0
        # writers of it on this mount commit first, so that their commit at close does not
        # stamp the current time over the times set now
        self._commit_writers_of(path)
        self._set_attributes(path, lambda: self._as_caller(lambda fs: fs.setattr(path, atime=atime, mtime=mtime)))
        return 0

    def _set_attributes(self, path: str, change: Callable[[], Stat]) -> None:
        """Run ``change`` (a setattr, or what answers for one) as one change of this mount;
        the attributes it answers answer libfuse's ``getattr`` that follows it."""
        started, st = self.fresh.begin_change(), None
        try:
            st = change()
        finally:
            self.fresh.end_change(started, path, self.callers.identity(), st)
        self._changed_through(path)

    def _creating_writer(self, path: str) -> OpenFile | None:
        """The descriptor of this mount that created the file at ``path`` and writes it, if it
        is the only writer of that file here and the caller of this request opened it; else
        None. (By path: the kernel sends no file handle with ``futimens``, ``fchown`` or
        ``fchmod``.)"""
        identity = self.callers.identity()
        with self._registry_lock:
            named = [h for h in self._handles.values() if h.file.path == path and h.file.writable]
            if len(named) != 1 or len(self._writers_locked(named[0].file.ino)) != 1:
                return None
        handle = named[0]
        opener = handle.file.context.acting_uid
        return handle if handle.file.created and opener == (None if identity is None else identity[0]) else None

    def _defer(self, path: str, writer: OpenFile, stamp: Callable[[AsyncFile], None]) -> None:
        """An attribute change that rides on ``writer``'s next commit (``stamp`` records it on
        the file); the kernel sees it at once (``_seen_by_writers``). Nothing changed at the
        metadata service yet: the attributes other changes left fresh stay so."""
        with writer.lock:
            stamp(writer.file)
            writer.dirty = True
            st = Stat.from_attrs(writer.file.attrs)
        self.fresh.remember(path, self.callers.identity(), st)

    def _commit_writers_of(self, path: str) -> None:
        with self._registry_lock:
            if not any(h.dirty for h in self._handles.values()):
                return
        for handle in self._writers(self._as_caller(lambda fs: fs.stat(path)).ino):
            with handle.lock:
                if handle.dirty:
                    self._run(handle.file.flush())
                    handle.dirty = False

    @_errno
    def statfs(self, path: str) -> dict[str, int]:
        """``df``: what files can store (raw capacity of the live chunk servers times the
        data share of the root's policy, e.g. 4/6 for rs(4,2)), and inodes. tectofs has no
        inode table to fill: free inodes are reported as ``free_inodes_reported``."""
        reply = self._as_caller(lambda fs: fs.statfs())
        fragment = 4096
        usable, free, files = reply.usable, reply.usable_free, reply.files
        return {
            "f_bsize": io_size_hint_bytes,
            "f_frsize": fragment,
            "f_blocks": usable // fragment,
            "f_bfree": free // fragment,
            "f_bavail": free // fragment,
            "f_files": files + free_inodes_reported,
            "f_ffree": free_inodes_reported,
            "f_favail": free_inodes_reported,
            "f_namemax": reply.name_max or limits.name_length_max_bytes,
        }

    # ------------------------------------------------------------------ namespace

    def opendir(self, path: str) -> int:
        """A handle of its own per open directory, for ``OpenListings``."""
        fh = next(self._next_fh)
        self.open_listings.opened(fh)
        return fh

    def releasedir(self, path: str, fh: int) -> int:
        self.open_listings.released(fh)
        return 0

    @_errno
    def readdir(self, path: str, fh: int) -> list[tuple[str, Any, int]]:
        """The whole listing, in mfusepy's form. Defining it is what has mfusepy register the
        callback; ``TectofsFuse`` pages listings with ``listing_page`` instead."""
        return [(name, self.entry_attributes(path, name, st), 0) for name, st in self._list(path)]

    def listing_page(self, path: str, fh: int, offset: int) -> tuple[list[Entry], bool]:
        """Directory handle ``fh``'s listing to page from ``offset``, and whether its attributes
        are fresh (``OpenListings.page``)."""
        return self.open_listings.page(fh, offset, lambda: self._list(path))

    @_errno
    def _list(self, path: str) -> list[Entry]:
        """"." and ".." (inode number and type: readdir(3) hides an entry whose d_ino is 0),
        then every entry with its attributes."""
        directory, entries = self._as_caller(lambda fs: _listing(fs, path))
        dots: list[Entry] = [(".", {"st_ino": directory.attrs.ino, "st_mode": statmod.S_IFDIR}),
                             ("..", {"st_ino": directory.attrs.parent, "st_mode": statmod.S_IFDIR})]
        return dots + entries

    def entry_attributes(self, directory: str, name: str, st: Stat | dict[str, int]) -> dict[str, Any]:
        """The kernel's view of a listed entry, as ``getattr`` would give it."""
        if isinstance(st, dict):
            return st
        if st.nlink > 1:
            self.links.seen(directory.rstrip("/") + "/" + name, st.ino, st.nlink)
        return self._stat_dict(st, self._seen_by_writers(st.ino))

    @_errno
    def mkdir(self, path: str, mode: int) -> int:
        self.listings.forget(_directory_of(path))
        try:
            st = self._as_caller(lambda fs: fs.mkdir(path, mode & 0o7777))
        finally:
            self.listings.forget(_directory_of(path))
        self.listings.made(path, st.ctime)  # empty, as of its creation: lookups in it answered here
        return 0

    @_errno
    def rmdir(self, path: str) -> int:
        self._as_caller(lambda fs: fs.rmdir(path))
        return 0

    @_errno
    def unlink(self, path: str) -> int:
        others = self.links.others(path)
        started, change = self.fresh.begin_change(), None
        try:
            change = self._as_caller(lambda fs: fs.remove(path))
        finally:
            self.fresh.end_change(started, _directory_of(path), self.callers.identity(),
                                        None if change is None else change.after)
            self._follow(path, change, present=False)
        self.links.removed(path)
        self._changed_through(path, others)  # their link count dropped
        return 0

    @_errno
    def rename(self, old: str, new: str, flags: int = 0) -> int:
        if flags == RENAME_EXCHANGE:  # atomic swap, e.g. a new checkpoint directory for the old one
            self._as_caller(lambda fs: fs.exchange(old, new))
            self._moved_handles({old: new, new: old})
            return 0
        if flags & ~RENAME_NOREPLACE:
            raise mfusepy.FuseOSError(errno.EINVAL)  # NOREPLACE|EXCHANGE, RENAME_WHITEOUT
        replaced_others = self.links.others(new)
        self._as_caller(lambda fs: fs.rename(old, new, noreplace=bool(flags & RENAME_NOREPLACE)))
        self._moved_handles({old: new})
        self.links.renamed(old, new)
        self._changed_through(new, replaced_others + self.links.others(new))
        return 0

    def _moved_handles(self, moves: dict[str, str]) -> None:
        """Open files under a renamed path (``moves``: old -> new, the path itself or below it)
        go by their new path."""
        with self._registry_lock:
            for handle in self._handles.values():
                for old, new in moves.items():
                    path = handle.file.path
                    if path == old or path.startswith(old + "/"):
                        handle.file.path = new + path[len(old):]
                        break

    @_errno
    def symlink(self, path: str, target: str) -> int:
        self._as_caller(lambda fs: fs.symlink(target, path))
        return 0

    @_errno
    def readlink(self, path: str) -> str:
        return str(self._as_caller(lambda fs: fs.readlink(path)))

    @_errno
    def link(self, target: str, source: str) -> int:
        """``ln SOURCE TARGET``: ``target`` becomes another name of the file ``source``."""
        st = self._as_caller(lambda fs: fs.link(source, target))
        self.links.seen(source, st.ino, st.nlink)
        self.links.seen(target, st.ino, st.nlink)
        self._changed_through(target)
        return 0

    # ------------------------------------------------------------------ extended attributes

    @_errno
    def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
        if self._has_no_xattrs(path):
            raise mfusepy.FuseOSError(errno.ENODATA)
        return bytes(self._as_caller(lambda fs: fs.getxattr(path, name)))

    @_errno
    def listxattr(self, path: str) -> list[str]:
        if self._has_no_xattrs(path):
            return []
        return list(self._as_caller(lambda fs: fs.listxattr(path)))

    @_errno
    def setxattr(self, path: str, name: str, value: bytes, options: int, position: int = 0) -> int:
        self._xattrs_set(path)
        self._as_caller(lambda fs: fs.setxattr(path, name, value, options))
        return 0

    @_errno
    def removexattr(self, path: str, name: str) -> int:
        self._xattrs_set(path)
        self._as_caller(lambda fs: fs.removexattr(path, name))
        return 0

    def _has_no_xattrs(self, path: str) -> bool:
        """A file the caller's descriptor on this mount created, whose extended attributes
        nobody set through this mount since: it has none, and the kernel's probes (it asks
        for ``security.capability`` at every write) cost no call."""
        writer = self._creating_writer(path)
        return writer is not None and not writer.xattrs_set

    def _xattrs_set(self, path: str) -> None:
        with self._registry_lock:
            for handle in self._handles.values():
                if handle.file.path == path:
                    handle.xattrs_set = True

    @_errno
    def mknod(self, path: str, mode: int, dev: int) -> int:
        if not statmod.S_ISREG(mode):  # a FIFO, socket or device node: metadata; the kernel serves it
            self._as_caller(lambda fs: fs.mknod(path, mode, dev))
            return 0
        file = self._as_caller(lambda fs: fs.open(path, "xb", file_mode=mode & 0o7777))
        self._run(file.close())
        return 0

    # ------------------------------------------------------------------ files

    @_errno
    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        if flags & os.O_EXCL:
            client_mode = "xb"
        elif flags & os.O_TRUNC:
            client_mode = "w+b"
        else:
            client_mode = "a+b"  # create if missing, keep content if another client just made it
        started, file = self.fresh.begin_change(), None
        try:
            file = self._as_caller(lambda fs: fs.open(path, client_mode, file_mode=mode & 0o7777))
        finally:
            change = None if file is None else file.directory
            self.fresh.end_change(started, _directory_of(path), self.callers.identity(),
                                        None if change is None else change.after)
            self._follow(path, change, present=True)
        file.readable = True  # the kernel enforces the access mode of each descriptor
        fh = self._register(file, flags, dirty=True)
        self._handles[fh].just_created = True
        return fh

    @_errno
    def open(self, path: str, flags: int) -> int:
        access = flags & _ACCESS_MODE
        if access == os.O_RDONLY:
            client_mode = "rb"
        elif flags & os.O_TRUNC:
            client_mode = "w+b"  # new content replaces the old at the first commit
        else:
            client_mode = "r+b"
        file = self._as_caller(lambda fs: fs.open(path, client_mode, write_only=access == os.O_WRONLY))
        file.readable = True
        self._invalidate_if_changed(path, file)
        fh = self._register(file, flags, dirty=client_mode == "w+b")
        self._commit_peers(file.ino, self._handles[fh])
        return fh

    def _commit_peers(self, ino: int, opener: OpenFile) -> None:
        """A new descriptor reads what the file's other descriptors on this mount wrote, as on a
        local disk (not only while the kernel's page cache still holds it): their changes are
        committed now and shared (``_share_commit``). A peer's failure is its own: it surfaces
        at that descriptor's close, and the opener reads the last commit."""
        for handle in self._writers(ino):
            if handle is opener or not handle.dirty:
                continue
            try:
                self._commit_handle(handle, None)
            except TectofsError as exc:
                log.debug("committing another descriptor of inode %d for an open: %s", ino, exc)

    @_errno
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        handle = self._handle(fh)
        with handle.lock:
            return bytes(self._run(handle.file.read(offset, size)))

    @_errno
    def readinto(self, path: str, target: Any, offset: int, fh: int) -> int:
        """Fill ``target`` (the kernel's buffer) with bytes at ``offset``; returns the count."""
        handle = self._handle(fh)
        with handle.lock:
            return int(self._run(handle.file.readinto(offset, target)))

    @_errno
    def write(self, path: str, data: Any, offset: int, fh: int) -> int:
        handle = self._handle(fh)
        with handle.lock:
            if handle.append:
                offset = handle.file.size
            written = int(self._run(handle.file.write(offset, data)))
            handle.dirty = True
            return written

    @_errno
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None and fh in self._handles:
            handle = self._handles[fh]
            with handle.lock:
                self._run(handle.file.truncate(length))
                handle.dirty = True
            return 0
        if path is None:
            raise mfusepy.FuseOSError(errno.ESTALE)
        st = self._as_caller(lambda fs: fs.stat(path))
        writers = self._writers(st.ino)
        if not writers:
            self._as_caller(lambda fs: fs.truncate(path, length))
        for handle in writers:  # so that their next commits keep the new size
            with handle.lock:
                self._run(handle.file.truncate(length))
                self._run(handle.file.flush())
                handle.dirty = False
        self._changed_through(path)
        return 0

    def _follow(self, path: str, change: DirectoryChange | None, present: bool) -> None:
        """A create (``present``) or unlink of ``path`` through this mount ended; ``change``
        (None: it failed, or the service did not say) keeps its directory's listing current."""
        directory = _directory_of(path)
        if change is None:
            self.listings.forget(directory)
        else:
            self.listings.changed(directory, path.rsplit("/", 1)[1], present, change.ctime_before, change.after.ctime)

    def _commit(self, path: str | None, fh: int) -> int:
        return self._commit_handle(self._handle(fh), path)

    def _commit_handle(self, handle: OpenFile, path: str | None) -> int:
        with handle.lock:
            changed = handle.dirty
            self._run(handle.file.flush())
            handle.dirty = False
        if changed:
            self._share_commit(handle)
            self._changed_through(path)
        return 0

    def _share_commit(self, committer: OpenFile) -> None:
        """The other descriptors of the file on this mount read what ``committer`` just
        committed (local-file semantics within one mount; across mounts: close-to-open)."""
        layout = committer.file.committed_layout
        if layout is None:
            return
        with self._registry_lock:
            peers = [h for h in self._by_ino.get(committer.file.ino, ()) if h is not committer]
        for peer in peers:
            with peer.lock:
                peer.file.adopt(layout)

    @_errno
    def flush(self, path: str, fh: int) -> int:
        """Called at every ``close`` of a descriptor: commit, so the close reports errors."""
        return self._commit(path, fh)

    @_errno
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        return self._commit(path, fh)

    @_errno
    def release(self, path: str, fh: int) -> int:
        handle = self._unregister(fh)
        if handle is not None:
            with handle.lock:
                self._run(handle.file.close())
        return 0


def _directory_of(path: str) -> str:
    """The mount path of the directory holding ``path`` (``/`` for a top-level name)."""
    return path.rsplit("/", 1)[0] or "/"
