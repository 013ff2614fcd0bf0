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

from tectofs.client.core import DirectoryChange, Stat
from tectofs.client.fuse.state import MountState, handler, log
from tectofs.client.fuse.users import Caller, Identity
from tectofs.errors import StaleFile

_ACCESS_MODE = os.O_RDONLY | os.O_WRONLY | os.O_RDWR


def open_reply(fh: int, flags: int, keep_cache: bool = False) -> pyfuse3.FileInfo:
    """The reply to an open (or create) with ``flags`` of handle ``fh``; ``keep_cache``: the
    kernel may keep the pages it has of the file (``page_cache.py``). A write-only
    descriptor's writes bypass the kernel's page cache (``direct_io``): each goes to the mount
    as written, with no page-cache pages to allocate and fill on the way (on this VM 92 us
    against 43 us per 10 KiB write through a bare pyfuse3 file system); it can neither read
    nor be mapped, so it loses nothing by it."""
    direct = flags & _ACCESS_MODE == os.O_WRONLY
    return pyfuse3.FileInfo(fh=fh, keep_cache=keep_cache and not direct,  # (pyfuse3's default keeps it)
                            direct_io=direct)


class FileOperations(MountState, pyfuse3.Operations):
    """File handlers (see the module docstring); namespace handlers: ``operations.py``."""

    @handler
    async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                     ctx: Caller) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        text, path = self.child(parent_inode, name)
        identity = self.identity(ctx)
        if flags & os.O_EXCL:
            client_mode = "xb"
        elif flags & os.O_TRUNC:
            client_mode = "w+b"
        else:
            client_mode = "a+b"  # create if missing, keep content if another client just made it
        started, file = self.fresh.begin_change(), None
        try:
            file = await self.as_caller(identity, lambda fs: fs.open(path, client_mode, file_mode=mode & 0o7777))
        finally:
            change = None if file is None else file.directory
            self.fresh.end_change(started, parent_inode, identity, None if change is None else change.after)
            self.follow(parent_inode, text, change, present=True)
        file.readable = True  # the kernel enforces the access mode of each descriptor
        fh = self.files.register(file, append=bool(flags & os.O_APPEND), dirty=True)
        self.page_cache.opened(file, [])  # a writer: the record goes
        self.named(parent_inode, text, file.ino)
        return open_reply(fh, flags), self.entry(Stat.from_attrs(file.attrs))

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
        path = self.path(inode)
        file = await self.as_caller(self.identity(ctx), lambda fs: fs.open(path, client_mode,
                                                                          write_only=access == os.O_WRONLY))
        if file.ino != inode:  # another client put another file there: the kernel walks the path again
            await file.close()
            raise StaleFile(f"{path} is no longer inode {inode}")
        file.readable = True
        if self.cache.changed_since_reported(inode, file.attrs.size, file.attrs.mtime):
            self.cache.invalidate_inode(inode)  # committed elsewhere since the kernel last saw it
        fh = self.files.register(file, append=bool(flags & os.O_APPEND), dirty=client_mode == "w+b")
        await self.files.commit_peers(self.files.get(fh))
        others = [h.file for h in self.files.of(inode) if h.file is not file]
        return open_reply(fh, flags, keep_cache=self.page_cache.opened(file, others))

    @handler
    async def read(self, fh: int, off: int, size: int) -> bytes:
        handle = self.files.get(fh)
        async with handle.lock:
            return bytes(await handle.file.read(off, size))

    @handler
    async def write(self, fh: int, off: int, buf: bytes) -> int:
        handle = self.files.get(fh)
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
        await self.files.commit(self.files.get(fh))

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

    def xattrs_set(self, inode: int) -> None:
        for handle in self.files.of(inode):
            handle.xattrs_set = True
