"""The mount's requests on file contents: create, open, read, write, flush, fsync, release.

Open files are :class:`AsyncFile` handles, which buffer writes per block, send full blocks
in parallel, prefetch on sequential reads and commit at ``flush``/``fsync``/``release``
(close-to-open consistency: what a ``close`` returned from is what any later ``open``, on any
mount, sees). An open file keeps the identity it was opened with (POSIX checks permission
at open): its reads, writes and commits are the opener's, whoever shares the descriptor.
Within one mount a new descriptor reads what the file's other descriptors wrote (their
changes are committed first, ``OpenFiles.commit_peers``), as on a local disk.

The kernel keeps a file's page cache across opens only while it holds the very version the
new open sees (``page_cache.py``), and an open that finds the file committed by someone else
since the kernel last saw its attributes invalidates them
(``KernelCache.changed_since_reported``), so reads see the new size.
"""

from __future__ import annotations

import os

import pyfuse3

from tectofs import xattr_names
from tectofs.client.core import DirectoryChange, Stat
from tectofs.client.files import AsyncFile
from tectofs.client.fuse.handles import OpenFile
from tectofs.client.fuse.state import MountState, handler, log
from tectofs.client.fuse.users import Caller, Identity
from tectofs.errors import NoAttribute, NotFound, NotSupported, StaleFile
from tectofs.modes import killed_by_write
from tectofs.wire import messages

_ACCESS_MODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR


def writes_direct(flags: int, mode: int, xattrs: int | None) -> bool:
    """Whether an open with ``flags`` of a file with ``mode`` and ``xattrs`` extended attributes
    (None: not known) has its writes bypass the kernel's page cache (``direct_io``): a
    write-only descriptor of a file with nothing a write must take away. Each write then goes
    to the mount as written, with no page-cache pages to allocate and fill on the way (on this
    VM 92 us against 43 us per 10 KiB write through a bare pyfuse3 file system); such a
    descriptor can neither read nor be mapped, so it loses nothing by it. The kernel leaves the
    clearing of set-id bits and of ``security.capability`` at a write through such a descriptor
    to the file system (libfuse 3.14 does not pass its flag on), so a file with either is opened
    through the page cache, and privileges that may have been given since (through this mount,
    or recalled: another client's change) are checked for at the descriptor's next write
    (``OpenFiles.privileges_granted``, :meth:`FileOperations.write`)."""
    return flags & _ACCESS_MODE == os.O_WRONLY and not killed_by_write(mode) and xattrs == 0  # (None is not 0)


def open_reply(fh: int, direct: bool, keep_cache: bool = False) -> pyfuse3.FileInfo:
    """The reply to an open (or create) of handle ``fh``; ``direct``: :func:`writes_direct`;
    ``keep_cache``: the kernel may keep the pages it has of the file (``page_cache.py``)."""
    return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache and not direct,  # (pyfuse3's default keeps it)
                            direct_io=direct)


class FileOperations(MountState, pyfuse3.Operations):
    """File handlers (see the module docstring); namespace handlers: ``operations.py``."""

    @handler
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Caller) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        identity = self.identity(ctx)
        text, path = await self.checked_child(parent_inode, name, identity)
        if flags & os.O_EXCL:
            client_mode = "xb"
        elif flags & os.O_TRUNC:
            client_mode = "w+b"
        else:
            client_mode = "a+b"  # create if missing, keep content if another client just made it
        started, file, grants = self.fresh.begin_change(), None, self.files.grants
        try:
            file = await self.as_caller(identity, lambda fs: fs.open(path, client_mode, file_mode=mode & 0o7777))
        finally:
            change = None if file is None else file.directory
            self.fresh.end_change(started, parent_inode, identity, None if change is None else change.after)
            self.follow(parent_inode, text, change, present=True)
        file.readable = True  # the kernel enforces the access mode of each descriptor
        direct = self._writes_direct(flags, file)
        fh = self.files.register(file, append=bool(flags & os.O_APPEND), dirty=True, direct=direct)
        self._granted_meanwhile(fh, grants)
        self.page_cache.opened(file, [])  # a writer: the record goes
        self.named(parent_inode, text, file.ino)
        return open_reply(fh, direct), self.entry(Stat.from_attrs(file.attrs))

    def follow(self, parent_inode: int, name: str, change: DirectoryChange | None, present: bool) -> None:
        """A create (``present``) or unlink of ``name`` through this mount ended; ``change``
        (None: it failed, or the service did not say) keeps its directory's listing current."""
        if change is None:
            self.listings.forget(parent_inode)
        else:
            self.listings.changed(parent_inode, name, present, change.ctime_before, change.after.ctime)

    @handler
    async def open(self, inode: int, flags: int, ctx: Caller) -> pyfuse3.FileInfo:
        access = flags & _ACCESS_MODE
        if access == os.O_RDONLY:
            client_mode = "rb"
        elif flags & os.O_TRUNC:
            client_mode = "w+b"  # new content replaces the old at the first commit
        else:
            client_mode = "r+b"
        identity = self.identity(ctx)
        path, grants = await self.checked_path(inode, identity), self.files.grants
        try:
            file = await self.as_caller(identity, lambda fs: fs.open(path, client_mode,
                                                                     write_only=access == os.O_WRONLY))
        except NotFound as exc:  # unlinked elsewhere since the kernel got the name: it walks the path
            if self.fs.metadata_cache is not None:  # again (O_CREAT: and creates), asking the service: the
                self.fs.metadata_cache.forget_path(path)  # cache may still hold it (its recall on its way)
            raise StaleFile(f"{path} is no longer inode {inode}") from exc
        if file.ino != inode:  # another client put another file there: the kernel walks the path again
            await file.close()
            raise StaleFile(f"{path} is no longer inode {inode}")
        file.readable = True
        if self.cache.changed_since_reported(inode, file.attrs.size, file.attrs.mtime):
            self.cache.invalidate_inode(inode)  # committed elsewhere since the kernel last saw it
        direct = self._writes_direct(flags, file)
        fh = self.files.register(file, append=bool(flags & os.O_APPEND), dirty=client_mode == "w+b", direct=direct)
        self._granted_meanwhile(fh, grants)
        await self.files.commit_peers(self.files.get(fh))
        others = [h.file for h in self.files.of(inode) if h.file is not file]
        return open_reply(fh, direct, keep_cache=self.page_cache.opened(file, others))

    @handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.files.get(fh)
        async with handle.lock:
            return bytes(await handle.file.read(off, size))

    @handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.files.get(fh)
        if handle.kill_on_write:
            await self._kill_privileges(handle)
            handle.kill_on_write = False  # (only once done: a failed check is tried again at the next write)
        async with handle.lock:
            if handle.append:
                off = handle.file.size
            written = int(await handle.file.write(off, buf))
            handle.dirty = True
            return written

    @handler
    async def flush(self, fh: int) -> None:
        """Called at every ``close`` of a descriptor: commit, so the close reports errors."""
        await self.files.commit(self.files.get(fh))

    @handler
    async def fsync(self, fh: int, datasync: bool) -> None:
        """Commit, and wait until the metadata service stored it and every create before it
        (a small new file's commit at ``close`` may still be on its way: ``client/claims.py``)."""
        await self.files.commit(self.files.get(fh))
        await self.fs.sync()

    @handler
    async def release(self, fh: int) -> None:
        handle = self.files.unregister(fh)
        if handle is not None:
            self.page_cache.closed(handle.file)
            async with handle.lock:
                await handle.file.close()

    async def close_all(self) -> None:
        """At unmount: commit and close every file still open (failures logged)."""
        for fh in self.files.numbers():
            handle = self.files.unregister(fh)
            if handle is None:
                continue
            try:
                await handle.file.close()
            except Exception as exc:
                log.warning("commit of %s at unmount failed: %s", handle.file.path, exc)

    def moved_files(self) -> None:
        """After a rename: open files go by their inode's path now (what their ``abort`` removes)."""
        for handle in self.files:
            try:
                handle.file.path = self.path(handle.file.ino)
            except StaleFile:
                continue

    def has_no_xattrs(self, inode: int, identity: Identity | None) -> bool:
        """A file the caller's descriptor on this mount created, whose extended attributes
        nobody set through this mount since: it has none, and the kernel's probes (it asks
        for ``security.capability`` at every write) cost no call."""
        writer = self.creating_writer(inode, identity)
        return writer is not None and not writer.xattrs_set

    def _writes_direct(self, flags: int, file: AsyncFile) -> bool:
        """:func:`writes_direct` for ``file`` opened with ``flags``, where the mount learns of
        privileges given elsewhere: with leases (their recalls say which files changed)."""
        return self.cache.leases is not None and writes_direct(flags, file.attrs.mode, file.attrs.xattrs)

    def _granted_meanwhile(self, fh: int, grants: int) -> None:
        """Privileges may have been given while handle ``fh`` was being opened (the count of
        grants moved since it was ``grants``): its first write checks."""
        handle = self.files.get(fh)
        if handle.direct and self.files.grants != grants:
            handle.kill_on_write = True

    async def _kill_privileges(self, handle: OpenFile) -> None:
        """What the kernel's ``file_remove_privs`` does before a write through the page cache:
        clear the set-id bits a write clears, unless the descriptor was opened by root (standing
        for ``CAP_FSETID``), through the descriptor as its opener (who may: it writes the file);
        and remove ``security.capability`` whoever writes, with the mount's own authority as the
        kernel uses its own (by path, once the path was checked to still name the file)."""
        file = handle.file
        ino_handle = messages.InoRequest(ino=file.ino, handle=file.handle)
        attrs = (await file.context.metadata.getattr(ino_handle)).attrs
        root = file.context.acting_uid == 0 or (file.context.acting_uid is None and os.geteuid() == 0)
        kill = 0 if root else killed_by_write(attrs.mode)
        if kill:
            await file.context.metadata.setattr(messages.SetattrRequest(
                ino=file.ino, handle=file.handle, mode=attrs.mode & 0o7777 & ~kill))
        if attrs.xattrs != 0:  # (None: not known)
            try:
                path = self.path(file.ino)
                if (await self.fs.stat(path)).ino == file.ino:
                    await self.fs.removexattr(path, xattr_names.CAPABILITY)
            except (StaleFile, NotFound, NoAttribute, NotSupported):
                pass  # unlinked or renamed away meanwhile (nothing runs it by that name), or none there
        self.cache.invalidate_inode(file.ino)

    def xattrs_set(self, inode: int) -> None:
        for handle in self.files.of(inode):
            handle.xattrs_set = True
