"""The FUSE mount: a thin adapter from the kernel's inode-based requests (libfuse 3's
low-level API through pyfuse3, in asyncio mode) to client-library calls and errno.

    tectofs mount --meta HOST:PORT /mnt/tectofs          # or tectofs.client.fuse.mount.mount(...)

Every handler is a coroutine on the event loop that reads ``/dev/fuse`` and calls the async
client there (``state.py``); the metadata service is path based, so each request's inode
becomes a path by walking the inode table (``inodes.py``). File contents: ``file_operations.py``;
attribute changes: ``setattrs.py``; what the kernel may cache and for how long:
``kernel_cache.py``.

Users: a mount run by root (or by a user when /etc/fuse.conf has ``user_allow_other``) over
a proxy credential (root's, or ``tectofs user add --proxy``) is multi-user: ``allow_other``
lets every local user in and each request runs as its caller (:class:`Callers`: uid, gid
and supplementary groups, through ``AsyncFileSystem.acting_as``), so the metadata service
checks that user's permissions and what they create is theirs; ``default_permissions`` has
the kernel check mode bits against the attributes first. Otherwise the mount is single-user,
as the credential's user (one log line says which and why).

Files: hard links are names of one inode; a file unlinked while open stays readable and
writable through the handles that have it open (each holds a lease) and goes with the last
one; special files are metadata the kernel serves. Listings bring every entry's attributes
(READDIRPLUS, ``readdir.py``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import stat as statmod
from typing import Awaitable, Callable, Sequence

import pyfuse3

from tectofs import xattr_names
from tectofs.client.core import AsyncFileSystem, DirectoryChange, Stat
from tectofs.client.fuse import kernel_opendir
from tectofs.client.fuse.attributes import directory_entry, statvfs
from tectofs.client.fuse.file_operations import FileOperations
from tectofs.client.fuse.inodes import ROOT_INODE
from tectofs.client.fuse.kernel_cache import KernelCache
from tectofs.client.fuse.process import raise_read_ahead
from tectofs.client.fuse.readdir import Entry, fill
from tectofs.client.fuse.setattrs import set_attributes
from tectofs.client.fuse.state import handler
from tectofs.client.fuse.users import Caller, Callers, Identity
from tectofs.errors import InvalidArgument, NoAttribute, NotFound
from tectofs.modes import killed_by_write

max_readahead_bytes = 8 * 1024 * 1024  # the kernel caps it at the device's read-ahead setting

assert pyfuse3.ROOT_INODE == ROOT_INODE  # the kernel's root inode is tectofs's root inode (1)


class TectofsOperations(FileOperations):
    """The handlers pyfuse3 calls (``pyfuse3.init(TectofsOperations(...), mountpoint, options)``)."""

    enable_writeback_cache = False  # a write is the client's at once: close-to-open across mounts
    enable_acl = False
    supports_dot_lookup = False  # no NFS export: the kernel looks up neither "." nor ".."

    def __init__(self, fs: AsyncFileSystem, mountpoint: str, attr_timeout_s: float = 1.0,
                 on_ready: Callable[[], None] | None = None, callers: Callers | None = None,
                 entry_timeout_s: float | None = None, negative_cache_s: float = 0.0, xattrs: bool = True) -> None:
        """``entry_timeout_s`` (default ``attr_timeout_s``): how long the kernel may reuse a name
        it looked up without asking again; 0 when the metadata service alone checks
        permissions (a path walk through a cached name asks nobody, so a caller who lost search
        permission on a directory would still reach the names below it). ``negative_cache_s``
        (0: off): how long after its last change to a directory it made the mount answers
        lookups of absent names there itself (``KnownListings``; not when names are not cached).
        ``on_ready``: called once the kernel initialized the mount. ``xattrs=False``: the mount
        has no extended attributes (:meth:`_no_xattrs`)."""
        super().__init__(fs, os.path.abspath(mountpoint),
                         KernelCache(attr_timeout_s, entry_timeout_s, leases=fs.lease_session), callers, negative_cache_s)
        self._on_ready = on_ready
        self._xattrs = xattrs
        self._listing_callers: dict[int, tuple[int, Identity | None]] = {}  # directory fh -> (inode, opener)

    def init(self) -> None:
        """The kernel's INIT request, before its reply: once the reply is sent (the loop's next
        turn), raise the read-ahead and say the mount is ready."""
        asyncio.get_running_loop().call_soon(self._initialized)

    def _initialized(self) -> None:
        # The kernel sets the device's read-ahead to the lesser of its setting and the INIT
        # reply's max_readahead, which pyfuse3 leaves at the kernel's offer (128 KiB): raised
        # after the reply, reads arrive as 1 MiB requests, several in flight (8 times fewer).
        raise_read_ahead(self.mountpoint, max_readahead_bytes)
        if self._on_ready is not None:
            self._on_ready()

    # ------------------------------------------------------------------ names and attributes

    @handler
    async def lookup(self, parent_inode: int, name: bytes, ctx: Caller) -> pyfuse3.EntryAttributes:
        identity = self.identity(ctx)
        text, path = await self.checked_child(parent_inode, name, identity)
        try:
            if self.listings.absent(parent_inode, text):
                raise NotFound(f"{path}: no such file")  # the lookup before a create, mostly
            st = await self.as_caller(identity, lambda fs: fs.stat(path))
        except NotFound:
            negative = self.cache.absent(parent_inode, text)
            if negative is None:
                raise
            return negative
        self.named(parent_inode, text, st.ino)
        return self.entry(st)

    @handler
    async def forget(self, inode_list: Sequence[tuple[int, int]]) -> None:
        for inode, count in inode_list:
            self.inodes.forget(inode, count)

    @handler
    async def getattr(self, inode: int, ctx: Caller) -> pyfuse3.EntryAttributes:
        identity = self.identity(ctx)
        st = self.fresh.take(inode, identity)  # what a create, unlink or setattr just made of it
        if st is None and (writer := self.creating_writer(inode, identity)) is not None:
            st = Stat.from_attrs(writer.file.attrs)  # the file this caller is writing: as created, and changed since
        if st is None:
            st = await self.stat_inode(inode, identity)
        return self.entry(st)

    @handler
    async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields, fh: int | None,
                      ctx: Caller) -> pyfuse3.EntryAttributes:
        st = await set_attributes(self, inode, attr, fields, fh, self.identity(ctx))
        if fields.update_mode and killed_by_write(attr.st_mode):
            self.files.privileges_granted(inode)
        return self.entry(st)

    @handler
    async def statfs(self, ctx: Caller) -> pyfuse3.StatvfsData:
        return statvfs(await self.as_caller(self.identity(ctx), lambda fs: fs.statfs()))

    # ------------------------------------------------------------------ listings

    @handler
    async def opendir(self, inode: int, ctx: Caller) -> int:
        """A handle of its own per open directory, for ``OpenListings`` (its listing is read
        as the opener: readdir requests carry no caller). Where the kernel checks no
        permission (``--no-default-permissions``), the open reads the listing, so that a
        caller who may not read the directory is refused here (EACCES), as by a local disk.
        With leases, the reply lets the kernel keep the listing (:meth:`keeps_listing`), or is
        ENOSYS, and the kernel opens directories by itself from then on (``kernel_opendir.py``)."""
        if kernel_opendir.active():
            raise pyfuse3.FUSEError(errno.ENOSYS)
        identity = self.identity(ctx)
        listing = None if self.cache.caches_names else await self._list(inode, identity)
        fh = self.files.new_number()
        self.open_listings.opened(fh, listing, self.cache.request_epoch())
        self._listing_callers[fh] = (inode, identity)
        return fh

    def keeps_listing(self, inode: int) -> bool:
        """Whether the reply to an OPENDIR of ``inode`` lets the kernel keep its listing
        (``opendir_reply.install``: called before :meth:`opendir`, on the event loop)."""
        return inode in self.inodes and self.cache.keep_listing(inode)

    @handler
    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """A page of a listing, read as the directory's opener; a directory the kernel opened
        by itself is read as the mount's own user (the kernel checked the opener's permission)."""
        kernel_opened = kernel_opendir.inode_of(fh)
        if kernel_opened is not None:
            inode, identity = kernel_opened, None
            self.open_listings.kernel_opened(fh)
        else:
            inode, identity = self._listing_callers[fh]
        entries, fresh, epoch = await self.open_listings.page(fh, start_id, lambda: self._list(inode, identity),
                                                              self.cache.request_epoch())
        fill(token, entries, start_id, self.entry, directory_entry, fresh,
             lambda name, st: self.named(inode, name, st.ino))
        self.cache.listing_replied(inode, epoch)

    async def _list(self, inode: int, identity: Identity | None) -> list[Entry]:
        """"." and ".." (inode numbers), then every entry with its attributes."""
        path = await self.checked_path(inode, identity)
        entries = await self.as_caller(identity, lambda fs: fs.scandir(path))
        dots: list[Entry] = [(".", inode), ("..", self.inodes.parent_of(inode))]
        return dots + list(entries)

    @handler
    async def releasedir(self, fh: int) -> None:
        self.open_listings.released(fh)
        self._listing_callers.pop(fh, None)

    # ------------------------------------------------------------------ namespace changes

    @handler
    async def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Caller) -> pyfuse3.EntryAttributes:
        identity = self.identity(ctx)
        text, path = await self.checked_child(parent_inode, name, identity)
        started, made = self.fresh.begin_change(), None
        try:
            made = await self.as_caller(identity, lambda fs: fs.make_directory(path, mode & 0o7777))
        finally:
            change = None if made is None else made[1]
            self.fresh.end_change(started, parent_inode, identity, None if change is None else change.after)
            self.follow(parent_inode, text, change, present=True)
        st = made[0]
        self.listings.made(st.ino, st.ctime)  # empty, as of its creation: lookups in it answered here
        self.named(parent_inode, text, st.ino)
        return self.entry(st)

    @handler
    async def rmdir(self, parent_inode: int, name: bytes, ctx: Caller) -> None:
        await self._remove(parent_inode, name, ctx, lambda fs, path: fs.rmdir(path))

    @handler
    async def unlink(self, parent_inode: int, name: bytes, ctx: Caller) -> None:
        await self._remove(parent_inode, name, ctx, lambda fs, path: fs.remove(path))

    async def _remove(self, parent_inode: int, name: bytes, ctx: Caller,
                      remove: Callable[[AsyncFileSystem, str], Awaitable[DirectoryChange | None]]) -> None:
        """An unlink or rmdir of ``name`` in ``parent_inode``: the reply's directory attributes
        answer the kernel's next question about the parent, and keep its listing current."""
        identity = self.identity(ctx)
        text, path = await self.checked_child(parent_inode, name, identity)
        started, change = self.fresh.begin_change(), None
        try:
            change = await self.as_caller(identity, lambda fs: remove(fs, path))
        finally:
            self.fresh.end_change(started, parent_inode, identity, None if change is None else change.after)
            self.follow(parent_inode, text, change, present=False)
        self.inodes.removed(parent_inode, text)

    @handler
    async def rename(self, parent_inode_old: int, name_old: bytes, parent_inode_new: int, name_new: bytes, flags: int,
                     ctx: Caller) -> None:
        identity = self.identity(ctx)
        old_text, old = await self.checked_child(parent_inode_old, name_old, identity)
        new_text, new = await self.checked_child(parent_inode_new, name_new, identity)
        if flags == pyfuse3.RENAME_EXCHANGE:  # atomic swap, e.g. a new checkpoint directory for the old one
            await self.as_caller(identity, lambda fs: fs.exchange(old, new))
            self.inodes.exchanged(parent_inode_old, old_text, parent_inode_new, new_text)
        elif flags & ~pyfuse3.RENAME_NOREPLACE:
            raise InvalidArgument(f"rename flags {flags:#x}: only RENAME_NOREPLACE or RENAME_EXCHANGE")
        else:
            noreplace = bool(flags & pyfuse3.RENAME_NOREPLACE)
            await self.as_caller(identity, lambda fs: fs.rename(old, new, noreplace=noreplace))
            self.inodes.moved(parent_inode_old, old_text, parent_inode_new, new_text)
        self.moved_files()

    @handler
    async def link(self, inode: int, new_parent_inode: int, new_name: bytes, ctx: Caller) -> pyfuse3.EntryAttributes:
        """``ln SOURCE TARGET``: ``new_name`` becomes another name of the file ``inode``."""
        identity = self.identity(ctx)
        source = await self.checked_path(inode, identity)
        text, target = await self.checked_child(new_parent_inode, new_name, identity)
        st = await self.as_caller(identity, lambda fs: fs.link(source, target))
        self.named(new_parent_inode, text, st.ino)
        return self.entry(st)

    @handler
    async def symlink(self, parent_inode: int, name: bytes, target: bytes, ctx: Caller) -> pyfuse3.EntryAttributes:
        identity = self.identity(ctx)
        text, path = await self.checked_child(parent_inode, name, identity)
        destination = target.decode("utf-8", "surrogateescape")
        st = await self.as_caller(identity, lambda fs: fs.symlink(destination, path))
        self.named(parent_inode, text, st.ino)
        return self.entry(st)

    @handler
    async def readlink(self, inode: int, ctx: Caller) -> bytes:
        identity = self.identity(ctx)
        path = await self.checked_path(inode, identity)
        target = await self.as_caller(identity, lambda fs: fs.readlink(path))
        return target.encode("utf-8", "surrogateescape")

    @handler
    async def mknod(self, parent_inode: int, name: bytes, mode: int, rdev: int, ctx: Caller) -> pyfuse3.EntryAttributes:
        identity = self.identity(ctx)
        text, path = await self.checked_child(parent_inode, name, identity)
        if statmod.S_ISREG(mode):
            file = await self.as_caller(identity, lambda fs: fs.open(path, "xb", file_mode=mode & 0o7777))
            await file.close()
            st = Stat.from_attrs(file.attrs)
        else:  # a FIFO, socket or device node: metadata; the kernel serves it
            st = await self.as_caller(identity, lambda fs: fs.mknod(path, mode, rdev))
        self.named(parent_inode, text, st.ino)
        return self.entry(st)

    # ------------------------------------------------------------------ extended attributes

    def _no_xattrs(self) -> None:
        """``--no-xattrs``: the first extended-attribute request of each kind answers ENOSYS, so
        the kernel never sends that kind again and fails it itself, EOPNOTSUPP ("Operation not
        supported"), as on a filesystem without them: ``ls -l``'s per-file probes and the
        ``security.capability`` check before every write then cost no round trip (JuiceFS's
        default, mergerfs's ``xattr=nosys``)."""
        if not self._xattrs:
            raise pyfuse3.FUSEError(errno.ENOSYS)

    @handler
    async def getxattr(self, inode: int, name: bytes, ctx: Caller) -> bytes:
        self._no_xattrs()
        text = name.decode("utf-8", "surrogateescape")
        xattr_names.namespace_of(text)  # a name never kept is "not supported" (ls -l learns it), not absent
        identity = self.identity(ctx)
        if self.has_no_xattrs(inode, identity):
            raise NoAttribute("no such extended attribute")
        path = await self.checked_path(inode, identity)
        return bytes(await self.as_caller(identity, lambda fs: fs.getxattr(path, text)))

    @handler
    async def listxattr(self, inode: int, ctx: Caller) -> list[bytes]:
        self._no_xattrs()
        identity = self.identity(ctx)
        if self.has_no_xattrs(inode, identity):
            return []
        path = await self.checked_path(inode, identity)
        names = await self.as_caller(identity, lambda fs: fs.listxattr(path))
        return [n.encode("utf-8", "surrogateescape") for n in names]

    @handler
    async def setxattr(self, inode: int, name: bytes, value: bytes, ctx: Caller) -> None:
        """(pyfuse3 checks ``XATTR_CREATE`` and ``XATTR_REPLACE`` with a ``getxattr`` first.)"""
        self._no_xattrs()
        self.xattrs_set(inode)
        identity = self.identity(ctx)
        path, text = await self.checked_path(inode, identity), name.decode("utf-8", "surrogateescape")
        await self.as_caller(identity, lambda fs: fs.setxattr(path, text, value))
        if text == xattr_names.CAPABILITY:
            self.files.privileges_granted(inode)

    @handler
    async def removexattr(self, inode: int, name: bytes, ctx: Caller) -> None:
        self._no_xattrs()
        self.xattrs_set(inode)
        identity = self.identity(ctx)
        path, text = await self.checked_path(inode, identity), name.decode("utf-8", "surrogateescape")
        await self.as_caller(identity, lambda fs: fs.removexattr(path, text))

