"""An open file: block buffering, pipelined writes, commit at close, cached and prefetched reads.

Writes land in per-block buffers. A buffer that fills up is encoded and sent at once, while
the caller goes on filling the next one (``write_inflight_bytes_max`` of blocks in flight per
file, so memory stays bounded). Partial writes into an existing block read that
block first and rewrite it as a new block (chunks are immutable: copy-on-write). Nothing is
visible to other clients until :meth:`AsyncFile.flush` commits the block list and size in one
metadata transaction; ``close`` flushes (close-to-open consistency).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from tectofs import limits
from tectofs.errors import InvalidArgument, NoSpace, TectofsError

if TYPE_CHECKING:
    from .core import AsyncFileSystem

Buffer = bytes | bytearray | memoryview


class AsyncFile:
    """One open file. Not safe for concurrent use by several tasks; the sync facade and the
    FUSE adapter serialize calls per handle."""

    def __init__(
        self, fs: "AsyncFileSystem", path: str, layout: dict[str, Any], readable: bool, writable: bool, truncate: bool
    ) -> None:
        self.fs = fs
        self.path = path
        self.readable = readable
        self.writable = writable
        self._set_layout(layout)
        self.replace = truncate  # the next commit replaces every block
        self.size = 0 if truncate else self.attrs["size"]
        self.closed = False
        self._dirty: OrderedDict[int, tuple[memoryview, int]] = OrderedDict()  # idx -> (buffer, valid bytes)
        self._inflight: dict[int, asyncio.Task[dict[str, Any]]] = {}
        self._written: dict[int, dict[str, Any]] = {}  # idx -> block descriptor, not yet committed
        self._allocations: list[dict[str, Any]] = []
        self._allocation_batch = 1
        self._changed = truncate  # something to commit even without blocks (e.g. truncation to 0)
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self._prefetch: dict[int, asyncio.Task[Any]] = {}
        self._last_read_block = -1  # reading block 0 counts as sequential: prefetch block 1
        self._bytes_written = 0
        self._failure: BaseException | None = None

    def _set_layout(self, layout: dict[str, Any]) -> None:
        self.attrs = layout["attrs"]
        self.ino = self.attrs["ino"]
        self.block_size = int(self.attrs["block_size"])
        low, high = limits.write_blocks_inflight_range
        self._inflight_max = max(low, min(high, limits.write_inflight_bytes_max // self.block_size))
        self.blocks = {b["idx"]: b for b in layout["blocks"]}

    # ------------------------------------------------------------------ write

    async def write(self, offset: int, data: Buffer) -> int:
        """Write ``data`` at ``offset`` (beyond the end leaves a hole that reads as zeros)."""
        self._check_open(write=True)
        view = memoryview(data).cast("B")
        if offset < 0:
            raise InvalidArgument("negative offset")
        written = 0
        while written < len(view):
            position = offset + written
            idx, within = divmod(position, self.block_size)
            n = min(len(view) - written, self.block_size - within)
            buffer, valid = await self._block_buffer(idx, within + n)
            if within > valid:  # a gap inside the block reads as zeros
                buffer[valid:within] = bytes(within - valid)
            buffer[within : within + n] = view[written : written + n]
            valid = max(valid, within + n)
            self._dirty[idx] = (buffer, valid)
            written += n
            self._bytes_written += n
            self.size = max(self.size, position + n)
            self._changed = True
            if valid == self.block_size:
                await self._send(idx)
        await self._bound_dirty()
        return written

    async def _block_buffer(self, idx: int, needed: int) -> tuple[memoryview, int]:
        """The buffer holding block ``idx`` for writing (at least ``needed`` bytes long),
        filled with the block's current content; returns it and its valid length."""
        if idx in self._dirty:
            buffer, valid = self._dirty[idx]
            if needed > len(buffer):
                grown = self.fs.buffers.get(self._capacity(needed))
                grown[:valid] = buffer[:valid]
                self.fs.buffers.put(buffer)
                buffer = grown
            return buffer, valid
        data: Any = None
        if idx in self._inflight or idx in self._written:
            # Rewriting a block already sent by this handle: start again from its content.
            if idx in self._inflight:
                await self._reap_one(idx)
            block = self._written.pop(idx)
            data = await self.fs.blocks.read_block(block)
            content = data[: min(block["length"], max(0, self.size - idx * self.block_size))]
        elif not self.replace and idx in self.blocks:
            content = await self._committed_block(idx)
        else:
            content = memoryview(b"")
        valid = len(content)
        buffer = self.fs.buffers.get(self._capacity(max(needed, valid)))
        buffer[:valid] = content
        if data is not None:
            self.fs.buffers.put(data)
        return buffer, valid

    def _capacity(self, needed: int) -> int:
        """Buffer size for ``needed`` bytes of a block: small files must not pin a whole
        64 MiB block each (a thousand ranks writing 1 MiB shards), large writers get the
        whole block at once instead of growing (and copying) it."""
        if self._bytes_written >= self.block_size:
            return self.block_size
        return min(self.block_size, max(limits.KiB * 64, 1 << (needed - 1).bit_length()))

    async def _reap_one(self, idx: int) -> None:
        task = self._inflight.pop(idx)
        await asyncio.wait([task])
        self._collect(idx, task)

    def _collect(self, idx: int, task: asyncio.Task[dict[str, Any]]) -> None:
        """Record a finished block write. A failed one poisons the handle: every later write,
        flush and close raises the same error, so a lost block can never be committed as a
        hole of zeros."""
        if task.cancelled():
            self._failure = self._failure or TectofsError(f"{self.path}: write of block {idx} was cancelled")
        elif task.exception() is not None:
            self._failure = self._failure or task.exception()
        else:
            self._written[idx] = task.result()
        if self._failure is not None:
            raise self._failure

    async def _send(self, idx: int) -> None:
        """Start writing block ``idx``; wait while too many blocks are in flight."""
        buffer, valid = self._dirty.pop(idx)
        while len(self._inflight) >= self._inflight_max:
            await self._reap(wait=True)
        allocation = await self._allocation()
        self._inflight[idx] = asyncio.get_running_loop().create_task(self._write_block(idx, buffer, valid, allocation))
        await self._reap(wait=False)

    async def _write_block(self, idx: int, buffer: memoryview, valid: int, allocation: dict[str, Any]) -> dict[str, Any]:
        try:
            return await self.fs.blocks.write_block(idx, buffer[:valid], allocation, self._reallocate)
        finally:
            self.fs.buffers.put(buffer)

    async def _reap(self, wait: bool) -> None:
        if not self._inflight:
            return
        if wait:
            await asyncio.wait(self._inflight.values(), return_when=asyncio.FIRST_COMPLETED)
        for idx, task in list(self._inflight.items()):
            if task.done():
                del self._inflight[idx]
                self._collect(idx, task)

    async def _allocation(self) -> dict[str, Any]:
        if not self._allocations:
            for attempt in range(limits.placement_attempts_max):
                try:
                    reply, _ = await self.fs.meta("allocate", ino=self.ino, count=self._allocation_batch)
                    break
                except NoSpace:
                    # Servers may look dead for a moment (a slow metadata service, a restart):
                    # a bounded wait before the error reaches the caller.
                    if attempt + 1 == limits.placement_attempts_max:
                        raise
                    await asyncio.sleep(limits.heartbeat_interval_s * (attempt + 1))
            self._allocations = reply["blocks"]
            self._allocation_batch = min(self._allocation_batch * 2, 8)
        return self._allocations.pop(0)

    async def _reallocate(self, failed_servers: set[int]) -> dict[str, Any]:
        reply, _ = await self.fs.meta("allocate", ino=self.ino, count=1, exclude=sorted(failed_servers))
        return reply["blocks"][0]

    async def _bound_dirty(self) -> None:
        """Random writes may dirty many partial blocks; send the oldest past the limit."""
        while len(self._dirty) > self._inflight_max + 2:
            await self._send(next(iter(self._dirty)))

    async def truncate(self, size: int) -> None:
        """Set the file's size as seen by this handle; committed by the next flush."""
        self._check_open(write=True)
        if size < 0:
            raise InvalidArgument("negative size")
        for idx in [i for i in self._dirty if i * self.block_size >= size]:
            del self._dirty[idx]
        last, within = divmod(size, self.block_size)
        if within and last in self._dirty:
            buffer, valid = self._dirty[last]
            buffer[within:] = bytes(len(buffer) - within)
            self._dirty[last] = (buffer, min(valid, within))
        elif within and size < self.size and (last in self.blocks or last in self._written or last in self._inflight):
            # Keep the head of the last block; its tail must read as zeros if the file grows again.
            buffer, valid = await self._block_buffer(last, within)
            buffer[within:] = bytes(len(buffer) - within)
            self._dirty[last] = (buffer, min(valid, within))
        self.size = size
        self._changed = True

    async def flush(self) -> None:
        """Send every buffered block and commit blocks and size in one metadata call."""
        self._check_open(write=False)
        if not self.writable:
            return
        if self._failure is not None:
            raise self._failure
        for idx in list(self._dirty):
            await self._send(idx)
        while self._inflight:
            await self._reap(wait=True)
        if not self._changed and not self._written:
            return
        blocks = [
            {"idx": b["idx"], "block_id": b["block_id"], "length": b["length"],
             "chunks": [{k: c[k] for k in ("position", "server_id", "length", "crc")} for c in b["chunks"]]}
            for b in self._written.values() if b["idx"] * self.block_size < self.size
        ]
        layout, _ = await self.fs.meta(
            "commit", ino=self.ino, size=self.size, blocks=blocks, replace=self.replace, mtime=time.time()
        )
        self.replace = False
        self._written.clear()
        self._changed = False
        self._drop_cache()
        for task in self._prefetch.values():  # prefetched before this commit: stale blocks
            task.cancel()
        self._prefetch.clear()
        self._set_layout(layout)  # the commit answers with the new layout

    async def close(self) -> None:
        if self.closed:
            return
        try:
            await self.flush()
        finally:
            self.closed = True
            for task in list(self._inflight.values()) + list(self._prefetch.values()):
                task.cancel()
            self._dirty.clear()
            self._drop_cache()

    async def abort(self) -> None:
        """Close without committing anything written since the last flush."""
        self.closed = True
        for task in list(self._inflight.values()) + list(self._prefetch.values()):
            task.cancel()
        self._dirty.clear()
        self._written.clear()

    # ------------------------------------------------------------------ read

    async def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``; short only at end of file."""
        buffer = bytearray(max(0, min(length, self.size - offset)))
        n = await self.readinto(offset, buffer)
        return bytes(memoryview(buffer)[:n])

    async def readinto(self, offset: int, target: Buffer) -> int:
        self._check_open(write=False)
        if not self.readable:
            raise InvalidArgument(f"{self.path} is not open for reading")
        if self._dirty or self._inflight or self._written or self._changed:
            await self.flush()  # read what this handle wrote
        out = memoryview(target).cast("B")
        end = min(self.size, offset + len(out))
        position = offset
        whole: list[tuple[int, memoryview]] = []
        while position < end:
            idx, within = divmod(position, self.block_size)
            n = min(end - position, self.block_size - within)
            target_view = out[position - offset : position - offset + n]
            if within == 0 and self._whole_block_read(idx, n):
                whole.append((idx, target_view))  # decoded straight into the caller's buffer, below
            else:
                block = await self._committed_block(idx)
                available = max(0, min(n, len(block) - within))
                target_view[:available] = memoryview(block)[within : within + available]
                if available < n:  # hole or clipped tail: zeros
                    target_view[available:] = bytes(n - available)
            position += n
        if whole:
            await self._read_whole_blocks(whole)
        return max(0, end - offset)

    async def _read_whole_blocks(self, reads: list[tuple[int, memoryview]]) -> None:
        """Blocks the caller reads whole are decoded straight into its buffer (one copy of
        the block fewer, none on the event loop thread), several at once."""
        gate = asyncio.Semaphore(limits.read_blocks_parallel_max)

        async def read(idx: int, into: memoryview) -> None:
            async with gate:
                await self.fs.blocks.read_block(self.blocks[idx], into=into)

        tasks = [asyncio.get_running_loop().create_task(read(idx, into)) for idx, into in reads]
        try:
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:  # nothing may write into the caller's buffer after we return (see read_block)
                task.cancel()
            await asyncio.wait(tasks)
            raise
        self._last_read_block = reads[-1][0]

    def _whole_block_read(self, idx: int, n: int) -> bool:
        block = self.blocks.get(idx)
        return (
            block is not None and block["valid"] == block["length"] == n
            and idx not in self._cache and idx not in self._prefetch
        )

    async def _committed_block(self, idx: int) -> Buffer:
        """The committed content of block ``idx`` (only its valid bytes; b"" for a hole)."""
        block = self.blocks.get(idx)
        if block is None:
            return b""
        if idx in self._cache:
            self._cache.move_to_end(idx)
            data = self._cache[idx]
        else:
            task = self._prefetch.pop(idx, None)
            data = await task if task is not None else await self.fs.blocks.read_block(block)
            self._cache[idx] = data
            while len(self._cache) > 2:
                self.fs.buffers.put(self._cache.popitem(last=False)[1])
        if idx == self._last_read_block + 1:
            self._start_prefetch(idx + 1)
        self._last_read_block = idx
        return memoryview(data)[: block["valid"]]

    def _start_prefetch(self, first: int) -> None:
        for idx in range(first, first + limits.read_prefetch_blocks):
            if idx in self.blocks and idx not in self._cache and idx not in self._prefetch:
                self._prefetch[idx] = asyncio.get_running_loop().create_task(self.fs.blocks.read_block(self.blocks[idx]))
        for idx, task in list(self._prefetch.items()):
            if idx < first - 1:
                task.cancel()
                del self._prefetch[idx]

    def _drop_cache(self) -> None:
        for data in self._cache.values():
            self.fs.buffers.put(data)
        self._cache.clear()

    def _check_open(self, write: bool) -> None:
        if self.closed:
            raise InvalidArgument(f"{self.path}: I/O on a closed file")
        if self._failure is not None and write:
            raise self._failure
        if write and not self.writable:
            raise InvalidArgument(f"{self.path} is not open for writing")
