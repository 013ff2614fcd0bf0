"""The file object ``TectofsFileSystem.open`` returns: fsspec's buffered file over one
client-library handle (:class:`tectofs.client.AsyncFile`).

Contract:

- ``rb``: the handle is opened at once (a missing file or a directory fails in ``open``);
  reads go through fsspec's cache to ``AsyncFile.read``, ranged reads straight from the chunk
  servers. The handle's lease keeps the version it opened readable until ``close``, even if
  the file is replaced or removed meanwhile.
- ``wb``, ``xb``, ``ab``: the handle is opened at once (``xb`` on an existing name fails
  there, with FileExistsError). As in the client library, a new name exists, empty, from
  ``open`` on; the bytes written are published in one metadata transaction when the file is
  closed (``autocommit``) or when its fsspec transaction commits. Leaving a ``with`` block by
  an exception, ``discard()``, a failed write or a failed commit publish nothing: an existing
  file keeps its previous content, a name this open created is removed again. A writer that
  is garbage-collected without ``close`` is discarded too, never published.
- Not for concurrent use by several threads beyond what fsspec's buffered file allows; the
  calls into the handle are serialized, so the handle itself is never shared by two tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Awaitable, TypeVar

from fsspec.asyn import AsyncFileSystem, sync
from fsspec.spec import AbstractBufferedFile

from tectofs.client import AsyncFile

T = TypeVar("T")


class TectofsFile(AbstractBufferedFile):
    """An fsspec file over an open :class:`AsyncFile` (see the module docstring)."""

    DEFAULT_BLOCK_SIZE = 4 * 2**20  # bytes buffered per call into the handle (it buffers per block itself)

    def __init__(
        self, fs: AsyncFileSystem, path: str, mode: str, handle: AsyncFile, info: dict[str, Any], **kwargs: Any
    ) -> None:
        """``fs``: the ``TectofsFileSystem`` that opened it (its ``loop`` runs ``handle``'s calls).
        ``handle``: opened by ``fs`` in the matching client-library mode; this file owns it
        from now on. ``info``: the file's ``fs.info`` entry as of the open."""
        assert mode in ("rb", "wb", "xb", "ab"), mode
        assert handle.readable == (mode == "rb")
        self.handle = handle
        self._lock = threading.Lock()
        self._append_at = handle.size if mode == "ab" else 0  # where this writer's offset 0 lies
        size = handle.size if mode == "rb" else None
        super().__init__(fs, path, mode, size=size, **kwargs)
        if mode == "rb":
            self.details = info

    def _run(self, coro: Awaitable[T]) -> T:
        """Run a call into the handle on the filesystem's loop, one call at a time."""
        with self._lock:
            return sync(self.fs.loop, _awaited, coro)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ read

    def _fetch_range(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the version this file opened."""
        return self._run(self.handle.read(start, max(0, end - start)))

    # ------------------------------------------------------------------ write

    def _upload_chunk(self, final: bool = False) -> bool:
        """Hand the buffered bytes to the handle (it sends whole blocks as they fill); on the
        final call, commit if ``autocommit``. Any failure discards the whole file."""
        try:
            with self.buffer.getbuffer() as data:
                if len(data):
                    self._run(self.handle.write(self._append_at + self.offset, data))
            if final and self.autocommit:
                self.commit()
        except BaseException:
            self.closed = True  # a failed write ends the file: nothing more can be published
            self.discard()
            raise
        return True

    def commit(self) -> None:
        """Publish what was written (one metadata transaction) and close the handle. If the
        commit fails, the handle aborts itself and the error is raised."""
        self._run(self.handle.close())

    def discard(self) -> None:
        """Close the handle without publishing anything written through it."""
        self._run(self.handle.abort())

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Reading: end the handle's lease. Writing: publish (see ``commit``) unless this file
        is part of an fsspec transaction, which commits or discards it later."""
        if self.closed:
            return
        super().close()  # a writer's final flush commits or discards (``_upload_chunk``)
        if self.mode == "rb":
            self._run(self.handle.close())

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        """Leaving by an exception discards a writer: nothing of it is published."""
        if exc_type is not None and self.mode != "rb" and not self.closed:
            self.closed = True
            self.discard()
            return
        self.close()

    def __del__(self) -> None:
        """A file dropped without ``close``: its handle is abandoned (a writer's bytes are
        never published), without waiting, from any thread."""
        if self.closed or getattr(self, "handle", None) is None:
            return
        self.closed = True
        with contextlib.suppress(Exception):  # no loop any more (a forked child, interpreter exit)
            asyncio.run_coroutine_threadsafe(self.handle.abort(), self.fs.loop)


async def _awaited(coro: Awaitable[T]) -> T:
    """``fsspec.asyn.sync`` wants a coroutine function; this runs an existing awaitable."""
    return await coro
