"""The file system ``tectofs bench fuse-bindings`` mounts, once per FUSE binding: a dict of
inodes in memory (:class:`MemoryTree`), served by a thin adapter in the style each binding
wants, in a process of its own (started by :mod:`tectofs.benchmarks.fuse_bindings`):

    python3 -m tectofs.benchmarks.fuse_binding_servers pyfuse3 /mnt/x --stats /tmp/x.json
    python3 -m tectofs.benchmarks.fuse_binding_servers mfusepy /mnt/x --hand-off

- ``mfusepy``: libfuse3's high-level *path* API through ctypes (today's mount); libfuse's
  worker threads (``max_threads`` 16, as ``tectofs mount``) call the handlers; every request
  names its file by path, which the adapter walks from the root.
- ``llfuse``: libfuse2's low-level *inode* API in Cython; its worker threads call the handlers
  under llfuse's global lock.
- ``pyfuse3``: libfuse3's low-level inode API in Cython, in asyncio mode
  (``pyfuse3.asyncio.enable()``): the handlers are coroutines on the process's one event loop,
  which also waits for the kernel's requests (``loop.add_reader`` on ``/dev/fuse``).

``--hand-off`` (the thread bindings): each request's work runs on an asyncio loop in a thread
of its own, the caller waiting (``asyncio.run_coroutine_threadsafe(...).result()``), as
``tectofs mount`` hands every call to the client library's loop. Without it the handler
thread does the work itself (under a lock: the tree is not thread-safe).

Every binding is set up alike: attribute and entry timeouts 0 (every ``stat`` reaches the
daemon), no ``default_permissions`` (as a single-user ``tectofs mount``), the page cache
not kept across opens where the binding lets us say so, ``getxattr`` answered ENODATA (as a
file system with extended attributes answers the kernel's ``security.capability`` probe
before each write), nothing else cached by the adapter. Exit status
:data:`UNAVAILABLE_EXIT` (and one line on stderr) when the binding cannot be imported.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import functools
import json
import os
import stat as statmod
import sys
from typing import Any, Callable, Coroutine, Iterator, TypeVar

from tectofs.benchmarks.memory_tree import BLOCK_SIZE, Direct, HandOff, Inode, MemoryTree, Runner, times_ns

UNAVAILABLE_EXIT = 3          # the binding (or its libfuse) cannot be loaded
MFUSEPY_THREADS_MAX = 16      # libfuse3's max_threads / max_idle_threads, as tectofs mount
MFUSEPY_MAX_WRITE_BYTES = 1 << 20  # conn.max_write, as tectofs mount

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


# ---------------------------------------------------------------------- mfusepy: the path API


def serve_mfusepy(tree: MemoryTree, mountpoint: str, runner: Runner) -> None:
    import mfusepy

    def attributes(inode: Inode) -> dict[str, int]:
        return {"st_ino": inode.ino, "st_mode": inode.mode, "st_nlink": inode.nlink, "st_uid": inode.uid,
                "st_gid": inode.gid, "st_size": inode.size, "st_blksize": BLOCK_SIZE,
                "st_blocks": (inode.size + 511) // 512, "st_atime": inode.atime_ns, "st_mtime": inode.mtime_ns,
                "st_ctime": inode.ctime_ns}

    def by_path_or_handle(path: str | None, fh: int | None) -> Inode:
        if fh is not None and fh in tree.inodes:
            return tree.inodes[fh]
        if path is None:
            raise OSError(errno.EBADF, "no path and no handle")
        return tree.resolve(path)

    def caller() -> tuple[int, int]:
        uid, gid, _ = mfusepy.fuse_get_context()
        return uid, gid

    class Operations(mfusepy.Operations):  # type: ignore[misc]  # mfusepy has no type information
        use_ns = True

        def init_with_config(self, conn: Any, config: Any) -> None:
            if conn is not None:
                conn.max_write = MFUSEPY_MAX_WRITE_BYTES
            if config is not None:
                config.attr_timeout = 0.0
                config.entry_timeout = 0.0
                config.negative_timeout = 0.0
                config.use_ino = 1
                config.hard_remove = 1
                config.kernel_cache = 0
                config.auto_cache = 0

        def getattr(self, path: str | None, fh: int | None = None) -> dict[str, int]:
            return runner(lambda: attributes(by_path_or_handle(path, fh)))

        def access(self, path: str, amode: int) -> int:
            return 0

        def create(self, path: str, mode: int, fi: Any = None) -> int:
            uid, gid = caller()

            def work() -> int:
                parent, name = tree.parent_and_name(path)
                return tree.open(tree.make(parent, name, statmod.S_IFREG | statmod.S_IMODE(mode), uid, gid).ino)

            return runner(work)

        def mkdir(self, path: str, mode: int) -> int:
            uid, gid = caller()

            def work() -> int:
                parent, name = tree.parent_and_name(path)
                tree.make(parent, name, statmod.S_IFDIR | statmod.S_IMODE(mode), uid, gid)
                return 0

            return runner(work)

        def _remove(self, path: str, directory: bool) -> int:
            def work() -> int:
                parent, name = tree.parent_and_name(path)
                tree.remove(parent, name, directory)
                return 0

            return runner(work)

        def unlink(self, path: str) -> int:
            return self._remove(path, directory=False)

        def rmdir(self, path: str) -> int:
            return self._remove(path, directory=True)

        def open(self, path: str, flags: int) -> int:
            return runner(lambda: tree.open(tree.resolve(path).ino))

        def read(self, path: str | None, size: int, offset: int, fh: int) -> bytes:
            return runner(tree.read, fh, offset, size)

        def write(self, path: str | None, data: bytes, offset: int, fh: int) -> int:
            return runner(tree.write, fh, offset, data)

        def flush(self, path: str | None, fh: int) -> int:
            return 0

        def release(self, path: str | None, fh: int) -> int:
            runner(tree.release, fh)
            return 0

        def truncate(self, path: str | None, length: int, fh: int | None = None) -> int:
            runner(lambda: tree.setattr(by_path_or_handle(path, fh).ino, size=length))
            return 0

        def chmod(self, path: str | None, mode: int) -> int:
            runner(lambda: tree.setattr(by_path_or_handle(path, None).ino, mode=mode))
            return 0

        def chown(self, path: str | None, uid: int, gid: int) -> int:
            runner(lambda: tree.setattr(by_path_or_handle(path, None).ino, uid=uid, gid=gid))
            return 0

        def utimens(self, path: str | None, times: tuple[int, int] | None = None) -> int:
            atime_ns, mtime_ns = times_ns(times)
            runner(lambda: tree.setattr(by_path_or_handle(path, None).ino, atime_ns=atime_ns, mtime_ns=mtime_ns))
            return 0

        def opendir(self, path: str) -> int:
            return runner(lambda: tree.opendir(tree.resolve(path).ino))

        def readdir(self, path: str | None, fh: int) -> list[tuple[str, dict[str, int], int]]:
            # the whole listing with each entry's inode number and type (mfusepy passes no more; with
            # use_ino an entry numbered 0 is skipped by readdir(3)): libfuse's high-level API pages it
            def work() -> list[tuple[str, dict[str, int], int]]:
                here = {"st_ino": tree.resolve(path or "/").ino, "st_mode": statmod.S_IFDIR}
                listed = [(os.fsdecode(name), {"st_ino": ino, "st_mode": tree.inodes[ino].mode}, 0)
                          for name, ino in tree.listing(fh)]
                return [(".", here, 0), ("..", here, 0), *listed]

            return runner(work)

        def releasedir(self, path: str | None, fh: int) -> int:
            runner(tree.releasedir, fh)
            return 0

        def getxattr(self, path: str, name: str, position: int = 0) -> bytes:
            runner(tree.getxattr)
            raise AssertionError("unreachable: getxattr raises")

        def statfs(self, path: str) -> dict[str, int]:
            return {"f_bsize": BLOCK_SIZE, "f_frsize": BLOCK_SIZE, "f_blocks": 1 << 24, "f_bfree": 1 << 23,
                    "f_bavail": 1 << 23, "f_files": 1 << 20, "f_ffree": 1 << 19, "f_namemax": 255}

    mfusepy.FUSE(Operations(), mountpoint, foreground=True, fsname="bench-mfusepy", subtype="bench",
                 max_threads=MFUSEPY_THREADS_MAX, max_idle_threads=MFUSEPY_THREADS_MAX)


# ---------------------------------------------------------------------- llfuse: the inode API, threads


def serve_llfuse(tree: MemoryTree, mountpoint: str, runner: Runner) -> None:
    import llfuse

    def entry(inode: Inode) -> Any:
        attributes = llfuse.EntryAttributes()
        _fill(attributes, inode)
        return attributes

    def errors(handler: F) -> F:
        @functools.wraps(handler)
        def translated(*args: Any) -> Any:
            try:
                return handler(*args)
            except OSError as exc:
                raise llfuse.FUSEError(exc.errno or errno.EIO) from None

        return translated  # type: ignore[return-value]

    class Operations(llfuse.Operations):  # type: ignore[misc]  # llfuse has no type information
        @errors
        def lookup(self, parent_inode: int, name: bytes, ctx: Any) -> Any:
            return runner(lambda: entry(tree.lookup(parent_inode, name)))

        @errors
        def getattr(self, inode: int, ctx: Any) -> Any:
            return runner(lambda: entry(tree.get(inode)))

        @errors
        def setattr(self, inode: int, attr: Any, fields: Any, fh: int | None, ctx: Any) -> Any:
            changes = _setattr_changes(attr, fields)
            return runner(lambda: entry(tree.setattr(inode, **changes)))

        @errors
        def create(self, parent_inode: int, name: bytes, mode: int, flags: int, ctx: Any) -> tuple[int, Any]:
            def work() -> tuple[int, Any]:
                inode = tree.make(parent_inode, name, statmod.S_IFREG | statmod.S_IMODE(mode), ctx.uid, ctx.gid)
                return tree.open(inode.ino), entry(inode)

            return runner(work)

        @errors
        def mkdir(self, parent_inode: int, name: bytes, mode: int, ctx: Any) -> Any:
            return runner(lambda: entry(tree.make(parent_inode, name, statmod.S_IFDIR | statmod.S_IMODE(mode),
                                                  ctx.uid, ctx.gid)))

        @errors
        def unlink(self, parent_inode: int, name: bytes, ctx: Any) -> None:
            runner(tree.remove, parent_inode, name, False)

        @errors
        def rmdir(self, parent_inode: int, name: bytes, ctx: Any) -> None:
            runner(tree.remove, parent_inode, name, True)

        @errors
        def open(self, inode: int, flags: int, ctx: Any) -> int:
            return runner(tree.open, inode)

        @errors
        def read(self, fh: int, off: int, size: int) -> bytes:
            return runner(tree.read, fh, off, size)

        @errors
        def write(self, fh: int, off: int, buf: bytes) -> int:
            return runner(tree.write, fh, off, buf)

        def flush(self, fh: int) -> None:
            pass

        @errors
        def release(self, fh: int) -> None:
            runner(tree.release, fh)

        @errors
        def opendir(self, inode: int, ctx: Any) -> int:
            return runner(tree.opendir, inode)

        @errors
        def readdir(self, fh: int, off: int) -> Iterator[tuple[bytes, Any, int]]:
            # the rest of the listing, each entry with the offset after it (llfuse stops when the page is full)
            page = runner(lambda: [(name, entry(tree.inodes[ino])) for name, ino in tree.listing(fh)[off:]])
            return iter([(name, attributes, i) for i, (name, attributes) in enumerate(page, start=off + 1)])

        @errors
        def releasedir(self, fh: int) -> None:
            runner(tree.releasedir, fh)

        @errors
        def getxattr(self, inode: int, name: bytes, ctx: Any) -> bytes:
            runner(tree.getxattr)
            raise AssertionError("unreachable: getxattr raises")

        def forget(self, inode_list: list[tuple[int, int]]) -> None:
            pass

    options = set(llfuse.default_options) - {"default_permissions"} | {"fsname=bench-llfuse", "subtype=bench"}
    llfuse.init(Operations(), mountpoint, options)
    try:
        llfuse.main(workers=None)
    finally:
        llfuse.close(unmount=False)


# ---------------------------------------------------------------------- pyfuse3: the inode API, coroutines


def serve_pyfuse3(tree: MemoryTree, mountpoint: str, min_tasks: int = 1, use_trio: bool = False) -> None:
    """asyncio mode: the handlers are coroutines on this process's one loop (the one
    ``asyncio.run`` makes), which is also the loop that waits for the kernel's requests."""
    import pyfuse3
    import pyfuse3.asyncio

    if not use_trio:
        pyfuse3.asyncio.enable()
    loop_of_handlers: set[int] = set()

    def note_loop() -> None:
        if not use_trio:
            loop_of_handlers.add(id(asyncio.get_running_loop()))

    def entry(inode: Inode) -> pyfuse3.EntryAttributes:
        attributes = pyfuse3.EntryAttributes()
        _fill(attributes, inode)
        return attributes

    def errors(handler: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., Coroutine[Any, Any, T]]:
        @functools.wraps(handler)
        async def translated(*args: Any) -> T:
            try:
                return await handler(*args)
            except OSError as exc:
                raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None

        return translated

    def file_info(fh: int) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=fh, keep_cache=False)  # pyfuse3's default keeps the page cache

    class Operations(pyfuse3.Operations):
        @errors
        async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
            note_loop()
            return entry(tree.lookup(parent_inode, name))

        @errors
        async def getattr(self, inode: int, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
            note_loop()
            return entry(tree.get(inode))

        @errors
        async def setattr(self, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                          fh: int | None, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
            return entry(tree.setattr(inode, **_setattr_changes(attr, fields)))

        @errors
        async def create(self, parent_inode: int, name: bytes, mode: int, flags: int,
                         ctx: pyfuse3.RequestContext) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
            note_loop()
            inode = tree.make(parent_inode, name, statmod.S_IFREG | statmod.S_IMODE(mode), ctx.uid, ctx.gid)
            return file_info(tree.open(inode.ino)), entry(inode)

        @errors
        async def mkdir(self, parent_inode: int, name: bytes, mode: int,
                        ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
            return entry(tree.make(parent_inode, name, statmod.S_IFDIR | statmod.S_IMODE(mode), ctx.uid, ctx.gid))

        @errors
        async def unlink(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
            tree.remove(parent_inode, name, False)

        @errors
        async def rmdir(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> None:
            tree.remove(parent_inode, name, True)

        @errors
        async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
            return file_info(tree.open(inode))

        @errors
        async def read(self, fh: int, off: int, size: int) -> bytes:
            return tree.read(fh, off, size)

        @errors
        async def write(self, fh: int, off: int, buf: bytes) -> int:
            return tree.write(fh, off, buf)

        async def flush(self, fh: int) -> None:
            pass

        @errors
        async def release(self, fh: int) -> None:
            tree.release(fh)

        @errors
        async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
            return tree.opendir(inode)

        @errors
        async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
            # READDIRPLUS: every entry goes with its attributes (pyfuse3 registers no plain readdir)
            entries = tree.listing(fh)
            for i in range(start_id, len(entries)):
                name, ino = entries[i]
                if not pyfuse3.readdir_reply(token, name, entry(tree.inodes[ino]), i + 1):
                    break

        @errors
        async def releasedir(self, fh: int) -> None:
            tree.releasedir(fh)

        @errors
        async def getxattr(self, inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> bytes:
            tree.getxattr()
            raise AssertionError("unreachable: getxattr raises")

        async def forget(self, inode_list: Any) -> None:
            pass

    options = {"fsname=bench-pyfuse3", "subtype=bench"}  # pyfuse3.default_options less default_permissions
    pyfuse3.init(Operations(), mountpoint, options)
    try:
        if use_trio:
            import trio

            trio.run(functools.partial(pyfuse3.main, min_tasks=min_tasks))
        else:
            asyncio.run(pyfuse3.main(min_tasks=min_tasks))
    finally:
        pyfuse3.close(unmount=False)
    tree.handler_loops = None if use_trio else len(loop_of_handlers)


# ---------------------------------------------------------------------- shared by the inode adapters


def _fill(attributes: Any, inode: Inode) -> None:
    """An llfuse or pyfuse3 ``EntryAttributes`` from ``inode``, cached by the kernel for 0 s."""
    attributes.st_ino = inode.ino
    attributes.generation = 0
    attributes.entry_timeout = 0
    attributes.attr_timeout = 0
    attributes.st_mode = inode.mode
    attributes.st_nlink = inode.nlink
    attributes.st_uid = inode.uid
    attributes.st_gid = inode.gid
    attributes.st_rdev = 0
    attributes.st_size = inode.size
    attributes.st_blksize = BLOCK_SIZE
    attributes.st_blocks = (inode.size + 511) // 512
    attributes.st_atime_ns = inode.atime_ns
    attributes.st_mtime_ns = inode.mtime_ns
    attributes.st_ctime_ns = inode.ctime_ns


def _setattr_changes(attr: Any, fields: Any) -> dict[str, int]:
    """``MemoryTree.setattr``'s arguments from an inode binding's ``SetattrFields``."""
    changes = {}
    for flag, name in (("update_mode", "mode"), ("update_uid", "uid"), ("update_gid", "gid"),
                       ("update_size", "size"), ("update_atime", "atime_ns"), ("update_mtime", "mtime_ns")):
        if getattr(fields, flag):
            changes[name] = getattr(attr, "st_" + name)
    return changes


# ---------------------------------------------------------------------- the process


SERVERS = ("mfusepy", "llfuse", "pyfuse3")


def serve(binding: str, mountpoint: str, hand_off: bool, min_tasks: int = 1, use_trio: bool = False) -> MemoryTree:
    """Serve a new :class:`MemoryTree` on ``mountpoint`` until it is unmounted; the tree."""
    assert binding in SERVERS, binding
    assert not (hand_off and binding == "pyfuse3"), "pyfuse3's handlers are already on the loop"
    tree = MemoryTree()
    if binding == "pyfuse3":
        serve_pyfuse3(tree, mountpoint, min_tasks, use_trio)
        return tree
    if hand_off and binding == "llfuse":
        import llfuse

        runner: Runner = HandOff(lambda: llfuse.lock_released)
    else:
        runner = HandOff() if hand_off else Direct()
    try:
        if binding == "mfusepy":
            serve_mfusepy(tree, mountpoint, runner)
        else:
            serve_llfuse(tree, mountpoint, runner)
    finally:
        runner.close()
    return tree


def _loadable(binding: str) -> str | None:
    """Why ``binding`` cannot be used here (None: it loads)."""
    try:
        __import__(binding)
        if binding == "pyfuse3":
            __import__("pyfuse3.asyncio")
    except (ImportError, OSError) as exc:  # OSError: mfusepy finds no libfuse
        return f"{type(exc).__name__}: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("binding", choices=SERVERS)
    parser.add_argument("mountpoint")
    parser.add_argument("--hand-off", action="store_true",
                        help="run each request's work on an asyncio loop thread (thread bindings)")
    parser.add_argument("--min-tasks", type=int, default=1, help="pyfuse3: tasks kept waiting for requests")
    parser.add_argument("--trio", action="store_true", help="pyfuse3: trio mode, not asyncio")
    parser.add_argument("--stats", default=None, help="write the requests served (JSON) here at unmount")
    args = parser.parse_args(argv)
    why = _loadable(args.binding)
    if why is not None:
        print(f"{args.binding} unavailable: {why}", file=sys.stderr, flush=True)
        return UNAVAILABLE_EXIT
    tree = serve(args.binding, os.path.abspath(args.mountpoint), args.hand_off, args.min_tasks, args.trio)
    if args.stats:
        with open(args.stats, "w") as f:
            json.dump(tree.stats(), f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
