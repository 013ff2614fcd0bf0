"""fsspec filesystem for protocol ``tectofs``: pandas, pyarrow, zarr, dask and every other
fsspec user reach tectofs through the client library, data straight to the chunk servers.

    import fsspec
    fs = fsspec.filesystem("tectofs", meta="127.0.0.1:7420")
    with fsspec.open("tectofs://127.0.0.1:7420/runs/a/table.csv", "wb") as f:
        f.write(payload)

URLs are ``tectofs://HOST:PORT/path`` (``HOST:PORT,HOST:PORT`` for a failover group of
metadata services) or ``tectofs:///path``, which takes the address from ``$TECTOFS_META``.
Paths inside the filesystem are absolute (``/runs/a``); ``ls``, ``find`` and ``info`` name
entries that way, and ``unstrip_protocol`` turns them back into URLs with the address.

Semantics are the client library's: a file written through ``open``, ``pipe``, ``put`` or
``copy`` is published whole at close or not at all (see ``tectofs.fsspec_file``); ``mv`` is one
metadata rename (atomic; a directory moves with everything below it); ``rm`` of a directory
without ``recursive`` removes it only if it is empty. Errors are the client library's, which
subclass the builtins fsspec users catch (FileNotFoundError, FileExistsError,
IsADirectoryError, NotADirectoryError, PermissionError).

The client (:class:`tectofs.client.AsyncFileSystem`) is asyncio-native: it is made on first
use, on the loop the call runs on (fsspec's IO thread, or the caller's own loop with
``asynchronous=True``), and closed by ``close()`` (``await _close()`` when asynchronous), or at
interpreter exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import posixpath
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from glob import has_magic
from typing import Any, AsyncIterator, Awaitable, Callable

from fsspec.asyn import AsyncFileSystem as FsspecAsyncFileSystem
from fsspec.asyn import _run_coros_in_chunks, sync, sync_wrapper
from fsspec.callbacks import DEFAULT_CALLBACK, Callback
from fsspec.utils import isfilelike, stringify_path

from tectofs.client import DEFAULT_ADDRESS_ENV, AsyncFile, AsyncFileSystem, Stat
from tectofs.wire.transport import parse_group

from .fsspec_file import TectofsFile

PROTOCOL = "tectofs"
_URL_PREFIX = PROTOCOL + "://"
_WRITE_MODES = {"overwrite": "wb", "create": "xb"}  # fsspec's pipe/put ``mode`` -> open mode
_TYPES = {"file": "file", "dir": "directory"}  # anything else (symlinks, FIFOs, devices): "other"
_CLOSE_TIMEOUT_S = 10.0
_EXIT_CLOSE_TIMEOUT_S = 2.0


@dataclass
class _Connection:
    """The client of one filesystem instance and the loop it lives on (None: not made yet).
    Kept outside the instance so the exit-time finalizer can close it without keeping the
    instance alive."""

    client: AsyncFileSystem | None = None
    loop: asyncio.AbstractEventLoop | None = None

    async def close(self) -> None:
        client, self.client, self.loop = self.client, None, None
        if client is not None:
            await client.close()


def _close_at_exit(connection: _Connection) -> None:
    """Close a client still open when the interpreter exits (its loop thread still runs)."""
    loop = connection.loop
    if connection.client is None or loop is None or not loop.is_running():
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(connection.close(), loop).result(_EXIT_CLOSE_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _closing(handle: AsyncFile) -> AsyncIterator[AsyncFile]:
    """Close a read handle when the block ends (its lease ends with it)."""
    try:
        yield handle
    finally:
        await handle.close()


def _info(path: str, stat: Stat) -> dict[str, Any]:
    """An fsspec info entry: ``name`` (absolute path), ``size`` (0 for a directory), ``type``
    (``file``, ``directory`` or ``other``), ``mtime`` and the rest of the client's Stat."""
    entry: dict[str, Any] = {
        "name": path, "size": stat.size if stat.kind != "dir" else 0, "type": _TYPES.get(stat.kind, "other"),
        "mtime": stat.mtime, "ctime": stat.ctime, "atime": stat.atime, "mode": stat.mode, "uid": stat.uid,
        "gid": stat.gid, "ino": stat.ino, "nlink": stat.nlink, "kind": stat.kind, "islink": stat.kind == "symlink",
    }
    if stat.kind == "symlink":
        entry["destination"] = stat.target
    if stat.kind in ("file", "dir"):
        entry.update(policy=stat.policy, block_size=stat.block_size)
    return entry


def _byte_range(start: int | None, end: int | None, size: int) -> tuple[int, int]:
    """fsspec's ``start``/``end`` (None: the file's ends; negative: from its end), clipped
    to the file: ``(offset, stop)`` with ``0 <= offset <= stop <= size``."""
    offset = 0 if start is None else start + size if start < 0 else start
    stop = size if end is None else end + size if end < 0 else end
    offset = min(max(offset, 0), size)
    return offset, min(max(stop, offset), size)


Reader = Callable[[int, int], Awaitable[Any]]
Writer = Callable[[int, Any], Awaitable[Any]]


async def _pump(read: Reader, write: Writer, size: int, chunk: int, callback: Callback, what: str) -> None:
    """Copy ``size`` bytes, ``chunk`` at a time, from ``read(offset, length)`` to
    ``write(offset, data)``, reporting progress to ``callback``. A short read (a local file
    that shrank meanwhile) is an error naming ``what`` was copied, never a shorter copy."""
    assert chunk > 0
    callback.set_size(size)
    for offset in range(0, size, chunk):
        length = min(chunk, size - offset)
        data = await read(offset, length)
        if len(data) != length:
            raise OSError(f"{what}: short read, {len(data)} of {length} bytes at offset {offset} of {size}: the "
                          "source changed during the copy; nothing was published, copy it again")
        await write(offset, data)
        callback.relative_update(length)


def _local_reader(fd: int) -> Reader:
    async def read(offset: int, length: int) -> bytes:
        return await asyncio.to_thread(os.pread, fd, length, offset)
    return read


def _local_writer(target: Any) -> Writer:
    """Writes to a local file descriptor (positioned) or to a file-like object (in order)."""
    if isinstance(target, int):
        async def write_fd(offset: int, data: Any) -> None:
            view = memoryview(data)
            while view:  # os.pwrite may write less than asked
                written = await asyncio.to_thread(os.pwrite, target, view, offset)
                view, offset = view[written:], offset + written
        return write_fd

    async def write_file(offset: int, data: Any) -> None:
        await asyncio.to_thread(target.write, data)
    return write_file


class TectofsFileSystem(FsspecAsyncFileSystem):
    """fsspec ``AsyncFileSystem`` over one tectofs cluster (see the module docstring)."""

    protocol = PROTOCOL
    root_marker = "/"
    sep = "/"

    def __init__(
        self, meta: str | None = None, credentials: str | None = None, auto_mkdir: bool = True, **kwargs: Any
    ) -> None:
        """``meta``: the metadata service, ``HOST:PORT`` or a failover group (default:
        ``$TECTOFS_META``, read now). ``credentials``: a credential file (default: the one
        :func:`tectofs.wire.auth.find_credential` finds for the address). ``auto_mkdir``: writes
        (open for writing, pipe, put, copy) make missing parent directories, as object stores
        and fsspec's memory filesystem behave. Other keyword arguments are fsspec's
        (``asynchronous``, ``loop``, ``batch_size``, ``skip_instance_cache``)."""
        super().__init__(**kwargs)
        address = meta or os.environ.get(DEFAULT_ADDRESS_ENV)
        if not address:
            raise ValueError(f"no tectofs metadata service address: use tectofs://HOST:PORT/path, "
                             f"meta='HOST:PORT', or set ${DEFAULT_ADDRESS_ENV}")
        parse_group(address)
        self.meta = address
        self.credentials = credentials
        self.auto_mkdir = auto_mkdir
        self._connection = _Connection()
        weakref.finalize(self, _close_at_exit, self._connection)

    @property
    def fsid(self) -> str:
        return f"{PROTOCOL}-{self.meta}"

    # ------------------------------------------------------------------ URLs and paths

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """``tectofs://HOST:PORT/a/b/``, ``tectofs:///a/b``, ``/a//b`` and ``a/b`` -> ``/a/b``
        (lists element-wise). No ``.``/``..`` resolution: tectofs refuses such names."""
        if isinstance(path, (list, tuple)):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        if path.startswith(_URL_PREFIX):
            path = "/" + path[len(_URL_PREFIX):].partition("/")[2]
        path = re.sub("/+", "/", "/" + path)
        return path.rstrip("/") or cls.root_marker

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        """The address a URL names: ``{"meta": "HOST:PORT"}``; none for ``tectofs:///path``."""
        if not path.startswith(_URL_PREFIX):
            return {}
        address = path[len(_URL_PREFIX):].partition("/")[0]
        return {"meta": address} if address else {}

    def unstrip_protocol(self, name: str) -> str:
        """``/a/b`` -> ``tectofs://HOST:PORT/a/b`` (this filesystem's address)."""
        return f"{_URL_PREFIX}{self.meta}{self._strip_protocol(name)}"

    # ------------------------------------------------------------------ the client

    async def _client(self) -> AsyncFileSystem:
        """This instance's client, made on first use on the running loop. A client made on
        another loop (an ``asynchronous=True`` user that ran ``asyncio.run`` twice) cannot be
        used on this one: a new one is made."""
        loop = asyncio.get_running_loop()
        connection = self._connection
        if connection.client is None or connection.loop is not loop:
            connection.client = AsyncFileSystem(self.meta, self.credentials)
            connection.loop = loop
        return connection.client

    async def _close(self) -> None:
        """Close the client (connections to the metadata service and chunk servers). The
        filesystem stays usable: the next call makes a new client."""
        await self._connection.close()

    def close(self) -> None:
        """Blocking ``_close``, on the loop the client lives on."""
        loop = self._connection.loop
        if self._connection.client is not None and loop is not None and not loop.is_closed():
            sync(loop, self._close, timeout=_CLOSE_TIMEOUT_S)

    async def _open_handle(self, path: str, mode: str) -> AsyncFile:
        """A client-library handle (``mode``: ``rb``, ``wb``, ``xb``, ``ab``). A write whose
        parent directory is missing makes it first if ``auto_mkdir`` (one retry: the common
        case costs no extra call)."""
        client = await self._client()
        path = self._strip_protocol(path)
        try:
            return await client.open(path, mode)
        except FileNotFoundError:
            if mode == "rb" or not self.auto_mkdir or path == self.root_marker:
                raise
        await client.mkdir(self._parent(path), parents=True, exist_ok=True)
        return await client.open(path, mode)

    @contextlib.asynccontextmanager
    async def _writing(self, path: str, mode: str = "overwrite") -> AsyncIterator[AsyncFile]:
        """A write handle on ``path`` (fsspec ``mode``: ``overwrite`` or ``create``), published
        when the block ends normally, discarded (nothing published) when it raises."""
        if mode not in _WRITE_MODES:
            raise ValueError(f"write mode {mode!r}: use one of {', '.join(_WRITE_MODES)}")
        handle = await self._open_handle(path, _WRITE_MODES[mode])
        try:
            yield handle
        except BaseException:
            await handle.abort()
            raise
        await handle.close()  # a failed commit aborts the handle and raises

    # ------------------------------------------------------------------ metadata

    async def _info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        client = await self._client()
        return _info(path, await client.stat(path))

    async def _ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        """A directory's entries sorted by name; for a file, the file itself (fsspec's rule)."""
        path = self._strip_protocol(path)
        client = await self._client()
        try:
            entries = [_info(posixpath.join(path, name), stat) for name, stat in await client.scandir(path)]
        except NotADirectoryError:
            entries = [await self._info(path)]
        return entries if detail else [entry["name"] for entry in entries]

    async def _exists(self, path: str, **kwargs: Any) -> bool:
        """False also when a parent on the way is a file (as ``os.path.exists``)."""
        try:
            await self._info(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    async def _modified(self, path: str) -> datetime.datetime:
        return datetime.datetime.fromtimestamp((await self._info(path))["mtime"], tz=datetime.timezone.utc)

    modified = sync_wrapper(_modified)

    async def _mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Make a directory; FileExistsError if the name exists. ``kwargs``: the client's
        ``mode``, ``policy`` and ``block_size`` (what files below it get)."""
        client = await self._client()
        await client.mkdir(self._strip_protocol(path), parents=create_parents, exist_ok=False, **kwargs)

    async def _makedirs(self, path: str, exist_ok: bool = False) -> None:
        client = await self._client()
        await client.mkdir(self._strip_protocol(path), parents=True, exist_ok=exist_ok)

    async def _rmdir(self, path: str) -> None:
        """Remove an empty directory (OSError ENOTEMPTY otherwise)."""
        client = await self._client()
        await client.rmdir(self._strip_protocol(path))

    rmdir = sync_wrapper(_rmdir)

    async def _rm_file(self, path: str, **kwargs: Any) -> None:
        """Remove a file (IsADirectoryError for a directory: use ``rm`` or ``rmdir``)."""
        client = await self._client()
        await client.remove(self._strip_protocol(path))

    async def _rm(
        self, path: Any, recursive: bool = False, maxdepth: int | None = None, batch_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Remove files and directories (globs and lists too). Files go first, concurrently,
        then directories deepest first; a directory that is not empty then (no ``recursive``,
        or below ``maxdepth``) fails with OSError ENOTEMPTY. The root itself is never removed.
        A whole directory (``recursive``, one path, no glob, no ``maxdepth``) goes by
        ``rmtree``: a call per page of its files, not one per file."""
        client = await self._client()
        if recursive and maxdepth is None and isinstance(path, str) and not has_magic(path):
            whole = self._strip_protocol(path)
            if whole != self.root_marker and (await client.stat(whole)).is_dir:
                await client.rmtree(whole)
                return
        paths = await self._expand_path(path, recursive=recursive, maxdepth=maxdepth)
        directories: list[str] = []

        async def remove(name: str) -> None:
            try:
                await client.remove(name)
            except IsADirectoryError:
                directories.append(name)

        await _run_coros_in_chunks([remove(p) for p in paths], batch_size=batch_size or self.batch_size, nofiles=True)
        for directory in sorted(directories, reverse=True):  # a child sorts after its parent
            if directory != self.root_marker:
                await client.rmdir(directory)

    async def _mv(self, path1: Any, path2: str, recursive: bool = False, maxdepth: int | None = None,
                  **kwargs: Any) -> None:
        """Move by metadata renames, each atomic. One path: to ``path2``, or into it if it is
        an existing directory (or ends with ``/``); it replaces an existing file. Globs or
        lists: every match into directory ``path2`` (made if missing). A directory moves whole
        (``recursive`` and ``maxdepth`` change nothing: a rename takes the subtree along)."""
        client = await self._client()
        if isinstance(path1, str) and not has_magic(path1):
            source = self._strip_protocol(path1)
            target = await self._move_target(source, path2)
            if target != source:
                await client.rename(source, target)
            return
        sources = await self._expand_path(path1)
        await self._makedirs(path2, exist_ok=True)
        for source in sources:
            await client.rename(source, posixpath.join(self._strip_protocol(path2), posixpath.basename(source)))

    async def _move_target(self, source: str, path2: str) -> str:
        """Where ``mv(source, path2)`` puts ``source``: ``path2``, or inside it if it is a
        directory (made first if ``path2`` ends with ``/``)."""
        target = self._strip_protocol(path2)
        if path2.endswith("/"):
            await self._makedirs(target, exist_ok=True)
        elif target == source or not await self._isdir(target):
            return target
        return posixpath.join(target, posixpath.basename(source))

    mv = sync_wrapper(_mv)

    async def _mv_file(self, path1: str, path2: str) -> None:
        """Rename one path to exactly ``path2`` (atomic; replaces a file there)."""
        client = await self._client()
        await client.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    # ------------------------------------------------------------------ data

    def _open(
        self, path: str, mode: str = "rb", block_size: int | None = None, autocommit: bool = True,
        cache_options: dict[str, Any] | None = None, **kwargs: Any,
    ) -> TectofsFile:
        """A :class:`TectofsFile` (``rb``, ``wb``, ``xb``, ``ab``); the handle is opened here, so
        a missing file, a directory or an existing name for ``xb`` fail at once."""
        if mode not in ("rb", "wb", "xb", "ab"):
            raise ValueError(f"open mode {mode!r}: tectofs files open as rb, wb, xb or ab (or text r, w, x, a)")
        path = self._strip_protocol(path)
        handle = sync(self.loop, self._open_handle, path, mode)
        info = _info(path, Stat.from_attrs(handle.attrs))
        return TectofsFile(self, path, mode, handle, info, block_size=block_size, autocommit=autocommit,
                           cache_options=cache_options, **kwargs)

    async def _cat_file(self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any) -> bytes:
        """Bytes ``start`` to ``end`` of a file (fsspec's conventions, see ``_byte_range``)."""
        async with _closing(await self._open_handle(path, "rb")) as handle:
            offset, stop = _byte_range(start, end, handle.size)
            return await handle.read(offset, stop - offset)

    async def _cat_ranges(
        self, paths: list[str], starts: Any, ends: Any, max_gap: int | None = None, batch_size: int | None = None,
        on_error: str = "return", **kwargs: Any,
    ) -> list[Any]:
        """Byte ranges of files (``starts``/``ends``: sequences, or one value for all), in the
        order asked. Each file is opened once and its ranges read through that handle in
        offset order, so ranges within one block cost one block read (the handle caches it)
        rather than one each; files are read concurrently. ``on_error="return"`` puts a
        range's exception in its place, anything else raises the first. ``max_gap`` is
        accepted and needs nothing: nearby ranges share the handle's block cache anyway."""
        if not isinstance(paths, list):
            raise TypeError("paths must be a list")
        starts = list(starts) if isinstance(starts, Iterable) else [starts] * len(paths)
        ends = list(ends) if isinstance(ends, Iterable) else [ends] * len(paths)
        if not len(starts) == len(ends) == len(paths):
            raise ValueError(f"{len(paths)} paths, {len(starts)} starts and {len(ends)} ends: they must match")
        by_path: dict[str, list[int]] = {}
        for index, path in enumerate(paths):
            by_path.setdefault(self._strip_protocol(path), []).append(index)
        out: list[Any] = [None] * len(paths)

        async def read_file(path: str, indexes: list[int]) -> None:
            try:
                async with _closing(await self._open_handle(path, "rb")) as handle:
                    spans = {i: _byte_range(starts[i], ends[i], handle.size) for i in indexes}
                    for i in sorted(indexes, key=lambda i: spans[i]):
                        out[i] = await handle.read(spans[i][0], spans[i][1] - spans[i][0])
            except Exception as exc:  # handed back in place of the ranges not read
                for i in indexes:
                    out[i] = exc if out[i] is None else out[i]

        await _run_coros_in_chunks([read_file(p, ix) for p, ix in by_path.items()],
                                   batch_size=batch_size or self.batch_size, nofiles=True)
        if on_error != "return":
            failure = next((item for item in out if isinstance(item, Exception)), None)
            if failure is not None:
                raise failure
        return out

    async def _pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        """Write a whole file: all of ``value`` or, on any failure, nothing. ``mode="create"``
        fails with FileExistsError if the name exists. A small file is one call
        (``AsyncFileSystem.write_bytes``); a missing parent is made first if ``auto_mkdir``."""
        if mode not in _WRITE_MODES:
            raise ValueError(f"write mode {mode!r}: use one of {', '.join(_WRITE_MODES)}")
        client = await self._client()
        path = self._strip_protocol(path)
        try:
            await client.write_bytes(path, value, exclusive=mode == "create")
            return
        except FileNotFoundError:
            if not self.auto_mkdir or path == self.root_marker:
                raise
        await client.mkdir(self._parent(path), parents=True, exist_ok=True)
        await client.write_bytes(path, value, exclusive=mode == "create")

    async def _put_file(
        self, lpath: str, rpath: str, callback: Callback = DEFAULT_CALLBACK, mode: str = "overwrite", **kwargs: Any,
    ) -> None:
        """Upload a local file (a local directory: make ``rpath`` a directory), a block at a
        time; published whole when the upload ends, nothing on failure."""
        if os.path.isdir(lpath):
            await self._makedirs(rpath, exist_ok=True)
            return
        with open(lpath, "rb") as local:
            size = os.fstat(local.fileno()).st_size
            async with self._writing(rpath, mode) as handle:
                await _pump(_local_reader(local.fileno()), handle.write, size, handle.block_size, callback,
                            f"put {lpath} -> {rpath}")

    async def _get_file(
        self, rpath: str, lpath: Any, callback: Callback = DEFAULT_CALLBACK, **kwargs: Any,
    ) -> None:
        """Download a file to a local path or into a file-like object (a directory: make
        ``lpath`` a directory). A failed download removes the partial local file it made."""
        try:
            handle = await self._open_handle(rpath, "rb")
        except IsADirectoryError:
            if isfilelike(lpath):
                raise
            os.makedirs(lpath, exist_ok=True)
            return
        async with _closing(handle):
            what = f"get {rpath} -> {lpath}"
            if isfilelike(lpath):
                await _pump(handle.read, _local_writer(lpath), handle.size, handle.block_size, callback, what)
                return
            with open(lpath, "wb") as local:
                try:
                    await _pump(handle.read, _local_writer(local.fileno()), handle.size, handle.block_size, callback,
                                what)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(lpath)
                    raise

    async def _cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copy a file through this client (there is no server-side copy); ``path2`` is
        published whole at the end, nothing on failure. A directory: make ``path2`` one."""
        try:
            handle = await self._open_handle(path1, "rb")
        except IsADirectoryError:
            await self._makedirs(path2, exist_ok=True)
            return
        async with _closing(handle) as source, self._writing(path2) as target:
            await _pump(source.read, target.write, source.size, target.block_size, DEFAULT_CALLBACK,
                        f"copy {path1} -> {path2}")
