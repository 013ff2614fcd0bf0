"""Synchronous facade: a dedicated event-loop thread runs the async client.

Like zarr's ``sync`` and fsspec's ``asyn``: every blocking call is submitted to the loop
thread and waited for; calling from inside that loop would deadlock, so it is refused.
Safe to use from many threads at once (calls interleave on the loop; each open file
serializes its own calls).
"""

from __future__ import annotations

import asyncio
import io
import threading
from typing import Any, Awaitable, Iterator, Sequence, TypeVar

from tectofs import limits
from tectofs.errors import InvalidArgument
from tectofs.wire import messages

from .core import AsyncFileSystem, Stat, normalize_mode
from .files import AsyncFile

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tectofs-loop", daemon=True)
        self.thread.start()

    def run(self, coro: Awaitable[T]) -> T:
        """Run ``coro`` on the loop and wait for it. If the wait is interrupted (Ctrl-C), the
        coroutine is cancelled and has unwound before the interruption propagates, so the
        caller's cleanup (an ``abort``) never races with it."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("a tectofs sync call from its own event loop would deadlock: use the async API")
        finished = threading.Event()

        async def tracked() -> T:
            try:
                return await coro
            finally:
                finished.set()

        future = asyncio.run_coroutine_threadsafe(tracked(), self.loop)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()
            finished.wait(timeout=limits.interrupt_unwind_s)
            raise

    def stop(self) -> None:
        """Cancel what still runs on the loop (writes of a handle never closed, prefetches),
        let it unwind, then stop the loop and its thread."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=5)

        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(timeout=10)
        except Exception:  # a stuck task must not keep the caller from closing
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class RawFile(io.RawIOBase):
    """``io.RawIOBase`` over an :class:`AsyncFile`; wrap in ``io.Buffered*`` (``FileSystem.open`` does)."""

    def __init__(self, fs: "FileSystem", handle: AsyncFile, append: bool) -> None:
        self._fs = fs
        self.handle = handle
        self._position = handle.size if append else 0
        self._append = append
        self.name = handle.path
        self._lock = threading.Lock()
        self._aborted = False

    def readable(self) -> bool:
        return self.handle.readable

    def writable(self) -> bool:
        return self.handle.writable

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with self._lock:
            n = self._fs.run(self.handle.readinto(self._position, buffer))
            self._position += n
            return n

    def preadv(self, buffers: Any, offset: int) -> int:
        """Consecutive bytes from ``offset`` into ``buffers`` in turn, as ``os.preadv``: the
        count read, short only at end of file; the file position does not move. Blocks the
        buffers cover whole are decoded straight into them."""
        with self._lock:
            return self._fs.run(self.handle.preadv(offset, list(buffers)))

    def readall(self) -> bytes:
        with self._lock:
            data = self._fs.run(self.handle.read(self._position, max(0, self.handle.size - self._position)))
            self._position += len(data)
            return data

    def write(self, data: Any) -> int:
        if self._aborted:
            return len(memoryview(data))  # what the buffered layer flushes while closing after an abort
        with self._lock:
            if self._append:
                self._position = self.handle.size
            n = self._fs.run(self.handle.write(self._position, data))
            self._position += n
            return n

    def pwritev(self, buffers: Any, offset: int) -> int:
        """Write ``buffers`` end to end from ``offset``, as ``os.pwritev``: the count written;
        the file position does not move, and ``offset`` is used as given in append mode too.
        Blocks the buffers cover whole are encoded straight from them; they may be reused once
        this returns."""
        if self._aborted:
            raise InvalidArgument(f"{self.name}: the write was aborted")
        with self._lock:
            return self._fs.run(self.handle.pwritev(offset, list(buffers)))

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        with self._lock:
            if whence == io.SEEK_SET:
                position = offset
            elif whence == io.SEEK_CUR:
                position = self._position + offset
            elif whence == io.SEEK_END:
                position = self.handle.size + offset
            else:
                raise InvalidArgument(f"bad whence {whence}")
            if position < 0:
                raise InvalidArgument("negative seek position")
            self._position = position
            return position

    def tell(self) -> int:
        return self._position

    def truncate(self, size: int | None = None) -> int:
        with self._lock:
            size = self._position if size is None else size
            self._fs.run(self.handle.truncate(size))
            return size

    def fsync(self) -> None:
        """Commit what was written so far (other clients that open the file see it)."""
        with self._lock:
            self._fs.run(self.handle.flush())

    def abort(self) -> None:
        """Close without publishing anything written since the last commit (see ``AsyncFile.abort``)."""
        self._aborted = True
        with self._lock:
            self._fs.run(self.handle.abort())

    def close(self) -> None:
        if self.closed:
            return
        try:
            with self._lock:
                self._fs.run(self.handle.close())
        finally:
            super().close()

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self.writable() and not self.closed:
            self.abort()
        self.close()


class _AbortsOnError:
    """Mixed into ``io.Buffered*``: ``abort()``, and leaving a ``with`` block by an exception
    aborts instead of committing, so a half-written file is never published."""

    raw: RawFile

    def abort(self) -> None:
        self.raw.abort()
        self.close()  # type: ignore[attr-defined]  # flushes into the aborted raw file: discarded

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self.raw.writable() and not self.raw.closed:
            self.abort()
        else:
            self.close()  # type: ignore[attr-defined]


class BufferedWriter(_AbortsOnError, io.BufferedWriter):  # type: ignore[misc]  # raw: our RawFile, typeshed says RawIOBase
    pass


class BufferedRandom(_AbortsOnError, io.BufferedRandom):  # type: ignore[misc]  # raw: our RawFile, typeshed says RawIOBase
    pass


class FileSystem:
    """Blocking client for one tectofs cluster (``tectofs.client.connect`` returns one).

    Methods mirror :class:`AsyncFileSystem`; ``open`` returns ordinary Python binary file
    objects. ``fs.aio`` is the async client and ``fs.run(coro)`` runs a coroutine on it."""

    _viewed: "FileSystem | None" = None  # the client this one is a view of (``acting_as``)

    def __init__(self, meta_address: str, credentials: Any = None, leases: bool = False) -> None:
        """``credentials``, ``leases``: see :class:`AsyncFileSystem`."""
        self._loop = _LoopThread()
        try:
            self.aio = self._loop.run(_make_async(meta_address, credentials, leases))
        except BaseException:
            self._loop.stop()
            raise
        self.meta_address = meta_address

    def run(self, coro: Awaitable[T]) -> T:
        return self._loop.run(coro)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop (on its own thread) that every call of this client runs on."""
        return self._loop.loop

    def open(self, path: str, mode: str = "rb", buffering: int = -1) -> Any:
        canonical = normalize_mode(mode)
        handle = self.run(self.aio.open(path, canonical))
        raw = RawFile(self, handle, append="a" in canonical)
        if buffering == 0:
            return raw
        size = buffering if buffering > 1 else 1 << 20
        if handle.readable and handle.writable:
            return BufferedRandom(raw, size)
        if handle.writable:
            return BufferedWriter(raw, size)
        return io.BufferedReader(raw, size)

    def stat(self, path: str) -> Stat:
        return self.run(self.aio.stat(path))

    def exists(self, path: str) -> bool:
        return self.run(self.aio.exists(path))

    def listdir(self, path: str) -> list[str]:
        return self.run(self.aio.listdir(path))

    def scandir(self, path: str) -> list[tuple[str, Stat]]:
        return self.run(self.aio.scandir(path))

    def iter_scandir(self, path: str) -> Iterator[tuple[str, Stat]]:
        """A directory's entries, sorted by name, fetched a page at a time as they are consumed."""
        after: str | None = ""
        while after is not None:
            page, after = self.run(self.aio.readdir_page(path, after))
            yield from page

    def mkdir(self, path: str, mode: int = 0o755, policy: str | None = None, block_size: int | None = None,
              parents: bool = False, exist_ok: bool = False) -> Stat:
        return self.run(self.aio.mkdir(path, mode, policy, block_size, parents, exist_ok))

    def makedirs(self, path: str, exist_ok: bool = True, **kwargs: Any) -> Stat:
        return self.mkdir(path, parents=True, exist_ok=exist_ok, **kwargs)

    def set_policy(
        self, path: str, policy: str | None = None, block_size: int | None = None, write_min: int | None = None
    ) -> Stat:
        return self.run(self.aio.set_policy(path, policy, block_size, write_min))

    def rename(self, src: str, dst: str, noreplace: bool = False) -> None:
        self.run(self.aio.rename(src, dst, noreplace))

    def exchange(self, a: str, b: str) -> None:
        self.run(self.aio.exchange(a, b))

    def remove(self, path: str) -> None:
        self.run(self.aio.remove(path))

    def link(self, src: str, dst: str) -> Stat:
        return self.run(self.aio.link(src, dst))

    def getxattr(self, path: str, name: str) -> bytes:
        return self.run(self.aio.getxattr(path, name))

    def listxattr(self, path: str) -> list[str]:
        return self.run(self.aio.listxattr(path))

    def setxattr(self, path: str, name: str, value: bytes, flags: int = 0) -> None:
        self.run(self.aio.setxattr(path, name, value, flags))

    def removexattr(self, path: str, name: str) -> None:
        self.run(self.aio.removexattr(path, name))

    def rmdir(self, path: str) -> None:
        self.run(self.aio.rmdir(path))

    def rmtree(self, path: str) -> None:
        self.run(self.aio.rmtree(path))

    def truncate(self, path: str, size: int) -> None:
        self.run(self.aio.truncate(path, size))

    def reference_blocks(self, path: str, source: str, pairs: Sequence[tuple[int, int]]) -> Stat:
        return self.run(self.aio.reference_blocks(path, source, pairs))

    def shared_blocks(self, directory: str, names: Sequence[str]) -> list[tuple[str, int, int]]:
        return self.run(self.aio.shared_blocks(directory, names))

    def chmod(self, path: str, mode: int) -> Stat:
        return self.run(self.aio.setattr(path, mode=mode))

    def chown(self, path: str, uid: int, gid: int) -> Stat:
        return self.run(self.aio.setattr(path, uid=uid, gid=gid))

    def utime(self, path: str, times: tuple[float, float]) -> Stat:
        return self.run(self.aio.setattr(path, atime=times[0], mtime=times[1]))

    def symlink(self, target: str, path: str) -> Stat:
        return self.run(self.aio.symlink(target, path))

    def mknod(self, path: str, mode: int, rdev: int = 0) -> Stat:
        return self.run(self.aio.mknod(path, mode, rdev))

    def readlink(self, path: str) -> str:
        return self.run(self.aio.readlink(path))

    def read_bytes(self, path: str) -> bytes:
        return self.run(self.aio.read_bytes(path))

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        return self.run(self.aio.read_range(path, offset, length))

    def write_bytes(self, path: str, data: bytes | bytearray | memoryview, *, exclusive: bool = False,
                    mtime: float | None = None, xattrs: Sequence[tuple[str, bytes]] = ()) -> Stat:
        """``AsyncFileSystem.write_bytes``: a small file in one call."""
        return self.run(self.aio.write_bytes(path, data, exclusive=exclusive, mtime=mtime, xattrs=xattrs))

    def statfs(self) -> messages.StatfsReply:
        return self.run(self.aio.statfs())

    def servers(self) -> list[messages.ServerInfo]:
        return self.run(self.aio.servers())

    def acting_as(self, uid: int, gid: int, groups: "tuple[int, ...] | list[int]" = ()) -> "FileSystem":
        """This client as another user (:meth:`AsyncFileSystem.acting_as`; a proxy credential):
        a view on the same connections and loop thread. Its ``close`` closes nothing: the
        client's does."""
        view = object.__new__(FileSystem)
        view._loop = self._loop
        view.aio = self.run(_acting(self.aio, uid, gid, tuple(groups)))
        view.meta_address = self.meta_address
        view._viewed = self
        return view

    def close(self) -> None:
        if self._viewed is not None:
            return
        try:
            self.run(self.aio.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> "FileSystem":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


async def _acting(fs: AsyncFileSystem, uid: int, gid: int, groups: tuple[int, ...]) -> AsyncFileSystem:
    return fs.acting_as(uid, gid, groups)  # on the client's loop: a view closes its evicted peers there


async def _make_async(meta_address: str, credentials: Any = None, leases: bool = False) -> AsyncFileSystem:
    fs = AsyncFileSystem(meta_address, credentials, leases=leases)
    # With a credential, a wrong one (or another cluster's) fails here, at connect.
    if fs.credential is not None:
        await fs.metadata.whoami()
    else:
        await fs.metadata.ping()
    return fs
