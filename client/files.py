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
import os
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Sequence

import msgspec

from tectofs import limits, sparse
from tectofs.errors import CapabilityExpired, InvalidArgument, StaleFile, TectofsError
from tectofs.policy import parse as parse_policy
from tectofs.regions import Regions
from tectofs.wire import messages

from . import inline, partial_reads
from .allocations import Allocations
from .blocks import consume_outcome
from .handle_leases import HandleLeases
from .layout import LayoutMap
from .writes import BlockWrite, BlockWrites, WriteState

if TYPE_CHECKING:
    from .context import FileContext

Buffer = bytes | bytearray | memoryview


class AsyncFile:
    """One open file. Not safe for concurrent use by several tasks; the sync facade and the
    FUSE adapter serialize calls per handle. ``context``: what it uses of the client that
    opened it (``client/context.py``); the blocks it writes, each in its ``WriteState``, are
    in ``self._writes`` (``client/writes.py``)."""

    def __init__(
        self, context: "FileContext", path: str, layout: messages.LayoutSegment, readable: bool, writable: bool,
        truncate: bool,
    ) -> None:
        self.context = context
        self.path = path
        self.readable = readable
        self.writable = writable
        self.opened_layout = layout  # what it opened with (a read-only handle parks its lease under it)
        self._set_layout(layout)
        self.replace = truncate  # the next commit replaces every block
        self.size = 0 if truncate else self.attrs.size
        self.closed = False
        # Every block written since the last commit: buffered, in flight, written, staged, or
        # zeroed whole (a hole: nothing stored), one state machine per block index.
        self._writes = BlockWrites()
        self._writer = int.from_bytes(os.urandom(8), "big") >> 1  # names what this handle stages
        self._changed = truncate  # something to commit even without blocks (e.g. truncation to 0)
        # when this handle last wrote or truncated, since its last commit (the commit's mtime)
        self.modified_at: float | None = time.time() if truncate else None
        self._cache: OrderedDict[int, Any] = OrderedDict()
        self._prefetch: dict[int, asyncio.Task[Any]] = {}
        self._last_read_block = -1  # reading block 0 counts as sequential: prefetch block 1
        self._next_read = 0  # where the last read ended: a read from there goes on reading whole blocks
        self._reading_on = True  # the current read starts where the last one ended
        self._bytes_written = 0
        self._failure: BaseException | None = None
        # Since the last commit: the smallest size this handle truncated the file to (the
        # commit cuts the file there first, so cut-off bytes never come back).
        self._shrunk_to: int | None = None
        self.created = False  # this handle's open created the file (``abort`` removes it again)
        self.directory: Any = None  # a creating open's DirectoryChange (else None)
        self._leases = HandleLeases(context.metadata, path, self.ino, self.handle, self._writer)
        self._allocations = Allocations(context.metadata, lambda count: messages.AllocateRequest(
            ino=self.ino, handle=self.handle, count=count, writer=self._writer), self._leases.keep_writer)
        self._committed = False  # a commit of this handle succeeded
        self._last_commit: messages.LayoutSegment | None = None  # ... and the layout its last one answered
        # what the next commit also sets: (atime, mtime), None each for as a commit sets it; a mode
        self.stamped_times: tuple[float | None, float | None] = (None, None)
        self.stamped_mode: int | None = None
        self.committed_layout: messages.LayoutSegment | None = None  # by this handle's last commit

    def _set_layout(self, layout: messages.LayoutSegment) -> None:
        self.attrs = layout.attrs
        self.ino = self.attrs.ino
        self.handle = self.attrs.handle  # names the inode by number (tectofs.wire.auth)
        self.block_size = self.attrs.block_size
        low, high = limits.write_blocks_inflight_range
        self._inflight_max = max(low, min(high, limits.write_inflight_bytes_max // self.block_size))
        self.layout = LayoutMap(layout)
        self.blocks = self.layout.blocks  # the committed blocks this handle knows of, by index
        self.inline_max = layout.inline_max  # a file up to this size is committed inline (its block 0 in the MDS)
        self._blocks_per_call = messages.blocks_per_call(parse_policy(self.attrs.policy).width)

    async def _cover(self, first: int, last: int) -> None:
        """Make sure the layout of blocks ``first`` to ``last`` is known (fetching segments)."""
        while (missing := self.layout.first_unknown(first, last)) is not None:
            segment = await self.context.metadata.layout(messages.LayoutRequest(ino=self.ino, handle=self.handle, first=missing))
            self.layout.add(segment)

    # ------------------------------------------------------------------ write

    def _poison(self, exc: BaseException) -> None:
        """A failure (or an interruption) inside the write path: nothing this handle wrote
        since its last commit can be trusted any more, so every later write, flush and close
        raises, and nothing of it is ever committed."""
        if self._failure is None:
            self._failure = exc if isinstance(exc, TectofsError) else TectofsError(
                f"{self.path}: a write was interrupted ({type(exc).__name__}); "
                "nothing written since the last commit will be published"
            )

    async def write(self, offset: int, data: Buffer) -> int:
        """Write ``data`` at ``offset`` (beyond the end leaves a hole that reads as zeros)."""
        return await self.pwritev(offset, [data])

    async def pwritev(self, offset: int, buffers: Sequence[Buffer]) -> int:
        """Write ``buffers`` end to end from ``offset``, as pwritev(2); returns the count
        written. A block the buffers cover whole is encoded straight from them, however they
        split it; the rest is copied into block buffers. The buffers may be reused once this
        returns."""
        self._check_open(write=True)
        data = Regions(buffers)
        if offset < 0:
            raise InvalidArgument("negative offset")
        try:
            written = await self._write(offset, data)
        except BaseException as exc:
            self._poison(exc)
            raise
        self.context.metrics.wrote(written)
        return written

    async def _write(self, offset: int, data: Regions) -> int:
        written = 0
        while written < len(data):
            position = offset + written
            idx, within = divmod(position, self.block_size)
            n = min(len(data) - written, self.block_size - within)
            pieces = data.views(written, n)
            whole = pieces[0] if len(pieces) == 1 else Regions(pieces)
            if n == self.block_size and self._writes.untouched(idx) and await self._send_whole(idx, whole):
                written += n
                self._bytes_written += n
                self.size = max(self.size, position + n)
                self._changed = True
                self._touch()
                continue
            buffer, valid = await self._block_buffer(idx, within + n)
            if within > valid:  # a gap inside the block reads as zeros
                buffer[valid:within] = bytes(within - valid)
            at = within
            for piece in pieces:
                buffer[at : at + len(piece)] = piece
                at += len(piece)
            valid = max(valid, within + n)
            self._writes.update(idx, buffer, valid)
            written += n
            self._bytes_written += n
            self.size = max(self.size, position + n)
            self._changed = True
            self._touch()
            if within + n == self.block_size:  # this write ended the block: send it (a rewrite inside a
                await self._send(idx)          # block already full waits for its end or the commit)
            elif self.size > self.inline_max:  # a partial block that will need chunks: placed ahead
                self._allocations.ask_ahead()
        await self._bound_dirty()
        return written

    async def _block_buffer(self, idx: int, needed: int) -> tuple[memoryview, int]:
        """The buffer holding block ``idx`` for writing (at least ``needed`` bytes long),
        filled with the block's current content; returns it and its valid length. The block
        is BUFFERING afterwards."""
        entry = self._writes.get(idx)
        if entry is not None and entry.state is WriteState.BUFFERING:
            assert entry.buffer is not None
            buffer, valid = entry.buffer, entry.valid
            if needed > len(buffer):
                grown = self.context.buffers.get(self._capacity(needed))
                grown[:valid] = buffer[:valid]
                self.context.buffers.put(buffer)
                buffer = grown
                self._writes.update(idx, buffer, valid)
            return buffer, valid
        content, pooled = await self._current_content(idx)
        valid = len(content)
        buffer = self.context.buffers.get(self._capacity(max(needed, valid)))
        buffer[:valid] = content
        if pooled is not None:
            self.context.buffers.put(pooled)
        self._writes.buffer(idx, buffer, valid)
        return buffer, valid

    async def _current_content(self, idx: int) -> tuple[Buffer, memoryview | None]:
        """What block ``idx`` holds as this handle sees it, before a rewrite: the block it sent
        (read back: chunks are immutable, so the block is written anew), the committed one,
        or nothing (a hole, or a file being replaced); and the pool buffer to give back once
        the content is copied (None if none)."""
        state = self._writes.state(idx)
        hole = state in (WriteState.HOLE, WriteState.HOLE_STAGED)
        if not self.replace and not hole:
            await self._cover(idx, idx)
        if state is WriteState.PUTTING:
            await self._reap_one(idx)
        if self._writes.sent(idx):
            # Rewriting a block already sent by this handle: start again from its content (a
            # staged one is overridden at its index by what this handle sends next).
            block = self._writes.take_block(idx)
            data = await self._load_block(block)
            return data[: min(_stored_end(block), max(0, self.size - idx * self.block_size))], data
        if not hole and not self.replace and idx in self.blocks:
            return await self._committed_block(idx), None
        return memoryview(b""), None

    def _capacity(self, needed: int) -> int:
        """Buffer size for ``needed`` bytes of a block: small files must not pin a whole
        64 MiB block each (a thousand ranks writing 1 MiB shards), large writers get the
        whole block at once instead of growing (and copying) it."""
        if self._bytes_written >= self.block_size:
            return self.block_size
        return min(self.block_size, max(limits.KiB * 64, 1 << (needed - 1).bit_length()))

    async def _reap_one(self, idx: int) -> None:
        entry = self._writes.get(idx)
        assert entry is not None and entry.task is not None
        task = entry.task
        await asyncio.wait([task])
        self._collect(idx, task)

    def _collect(self, idx: int, task: asyncio.Task[messages.Block]) -> None:
        """Record a finished block write. A failed one poisons the handle: every later write,
        flush and close raises the same error, so a lost block can never be committed as a
        hole of zeros."""
        if task.cancelled():
            self._writes.failed(idx)
            self._failure = self._failure or TectofsError(f"{self.path}: write of block {idx} was cancelled")
        elif task.exception() is not None:
            self._writes.failed(idx)
            self._failure = self._failure or task.exception()
        else:
            self._writes.written(idx, task.result())
        if self._failure is not None:
            raise self._failure

    async def _send(self, idx: int) -> None:
        """Start writing block ``idx`` (only its span of data; a block of zeros becomes a
        hole); wait while too many blocks are in flight."""
        entry = self._writes.get(idx)
        assert entry is not None and entry.state is WriteState.BUFFERING and entry.buffer is not None
        buffer = entry.buffer
        start, end = sparse.data_span(buffer[: entry.valid])
        if end == 0:
            self.context.buffers.put(self._writes.hole(idx))
            return
        allocation = await self._slot_and_allocation()
        await self._launch(idx, self._write_block(idx, buffer, start, end, allocation))

    async def _slot_and_allocation(self) -> messages.Allocation:
        """Wait while too many blocks are in flight; then a placement for the next one."""
        while self._writes.count(WriteState.PUTTING) >= self._inflight_max:
            await self._reap(wait=True)
        return await self._allocations.take()

    async def _launch(self, idx: int, write: Any) -> None:
        """Put block ``idx``'s write (a coroutine giving its Block) in flight (it owns the
        block's buffer from here on: a data block sent now overrides a hole staged there)."""
        self._writes.put(idx, asyncio.get_running_loop().create_task(write))
        await self._reap(wait=False)
        await self._stage_excess()

    async def _send_whole(self, idx: int, data: memoryview | Regions) -> bool:
        """A write that covers block ``idx`` whole, sent without copying it into a block buffer:
        it is encoded straight from the caller's memory, and this returns once the encode is
        done with it (the puts go on in the background). False, having done nothing, where the
        block needs the buffered path: a block whose data does not run from its first byte to
        its last (``sparse.data_span``: zeros at either end are left out, a block of zeros is a
        hole), or a replicated policy (its chunks are the block's bytes themselves)."""
        if not sparse.spans_whole(data):
            return False
        allocation = await self._slot_and_allocation()
        policy = parse_policy(allocation.policy)
        if policy.kind != "rs":
            self._allocations.put_back(allocation)  # the buffered path takes it
            return False
        encoded = await self.context.blocks.encode(policy, data)
        await self._launch(idx, self.context.blocks.place_block(idx, len(data), encoded, allocation, self._reallocate))
        return True

    async def _write_block(
        self, idx: int, buffer: memoryview, start: int, end: int, allocation: messages.Allocation
    ) -> messages.Block:
        try:
            block = await self.context.blocks.write_block(idx, buffer[start:end], allocation, self._reallocate)
            return msgspec.structs.replace(block, start=start, valid=end)
        finally:
            self.context.buffers.put(buffer)

    def _holes_to_send(self) -> list[int]:
        """Holes that drop something: a block committed (or maybe committed) or staged there."""
        return sorted(
            i for i, entry in self._writes.in_state(WriteState.HOLE).items()
            if entry.staged_at_mds or (not self.replace and (i in self.blocks or not self.layout.known(i)))
        )

    async def _stage_excess(self) -> None:
        """Past what one commit carries, send written blocks and holes ahead (``stage``):
        they stay invisible until the commit, which publishes them with the rest."""
        written = self._writes.in_state(WriteState.WRITTEN)
        if len(written) + self._writes.count(WriteState.HOLE) < self._blocks_per_call:
            return
        holes = self._holes_to_send()
        sent = list(written)
        blocks = [messages.written(entry.block) for entry in written.values() if entry.block is not None]
        step = max(1, self._blocks_per_call // 2)  # blocks and holes together within one call's bound
        for first in range(0, max(len(blocks), len(holes)), step):
            await self.context.metadata.stage(messages.StageRequest(
                ino=self.ino, handle=self.handle, writer=self._writer, blocks=blocks[first : first + step],
                holes=holes[first : first + step],
            ))
        for idx in sent + holes:
            self._writes.staged(idx)

    async def _reap(self, wait: bool) -> None:
        """Collect the block writes that finished (with ``wait``: at least one)."""
        putting = self._writes.in_state(WriteState.PUTTING)
        if not putting:
            return
        if wait:
            await asyncio.wait([entry.task for entry in putting.values() if entry.task is not None],
                               return_when=asyncio.FIRST_COMPLETED)
        for idx, entry in list(putting.items()):
            if entry.task is not None and entry.task.done():
                self._collect(idx, entry.task)

    async def _reallocate(self, failed_servers: set[int]) -> messages.Allocation:
        reply = await self.context.metadata.allocate(messages.AllocateRequest(
            ino=self.ino, handle=self.handle, count=1, exclude=sorted(failed_servers), writer=self._writer))
        return reply.blocks[0]

    def hold_read_lease(self, reader: int, since: float | None = None) -> None:
        """Keep the reader's lease (taken by ``open``, granted or renewed when the event loop's
        clock read ``since``; None: now) while this handle is open: the chunks of the version
        it opened stay, even if the file is unlinked or replaced meanwhile."""
        self._leases.hold_reader(reader, since)

    async def _bound_dirty(self) -> None:
        """Random writes may dirty many partial blocks; send the oldest past the limit."""
        buffering = self._writes.in_state(WriteState.BUFFERING)
        while len(buffering) > self._inflight_max + 2:
            await self._send(next(iter(buffering)))

    async def truncate(self, size: int) -> None:
        """Set the file's size as seen by this handle; committed by the next flush. Bytes cut
        off by a shrink read as zeros if the file grows again, before and after the commit."""
        self._check_open(write=True)
        if size < 0:
            raise InvalidArgument("negative size")
        if size < self.size:
            try:
                await self._cut(size)
            except BaseException as exc:
                self._poison(exc)
                raise
        self.size = size
        self._changed = True
        self._touch()

    async def _cut(self, size: int) -> None:
        """Forget everything this handle holds or sees past ``size``: buffered, in-flight,
        written, staged and committed blocks."""
        first_gone = -(-size // self.block_size)  # blocks from here on lie wholly past size
        last, within = divmod(size, self.block_size)
        if within and not self.replace:
            await self._cover(last, last)
        if self._writes.staged_from(first_gone):
            await self.context.metadata.stage(
                messages.StageRequest(ino=self.ino, handle=self.handle, writer=self._writer, cut_from=first_gone))
        for entry in self._writes:
            if entry.idx >= first_gone:  # an in-flight put's chunks become orphans: the allocation expires to GC
                self._forget(self._writes.drop(entry.idx))
        self.layout.forget_from(first_gone)
        if within:
            kept = self._writes.get(last)
            if kept is not None and kept.state is WriteState.BUFFERING:
                assert kept.buffer is not None
                self._writes.update(last, kept.buffer, min(kept.valid, within))
            elif self._writes.sent(last):
                buffer, valid = await self._block_buffer(last, within)
                self._writes.update(last, buffer, min(valid, within))
            block = self.blocks.get(last)
            if block is not None:
                if min(block.valid, within) > block.start:
                    self.blocks[last] = msgspec.structs.replace(block, valid=min(block.valid, within))
                else:
                    del self.blocks[last]
        self._shrunk_to = size if self._shrunk_to is None else min(self._shrunk_to, size)
        self._drop_cache()

    async def flush(self) -> None:
        """Send every buffered block and commit blocks and size in one metadata call."""
        self._check_open(write=False)
        if not self.writable:
            return
        if self._failure is not None:
            raise self._failure
        self.committed_layout = None
        try:
            layout = await self._commit()
        except BaseException as exc:
            self._poison(exc)
            raise
        if layout is None:
            return
        self._committed = True
        self.stamped_times, self.stamped_mode = (None, None), None
        self.replace = False
        self._writes.committed()
        self._changed = False
        self.modified_at = None
        self._shrunk_to = None
        self._drop_cache()  # read before this commit: stale
        self._set_layout(layout)  # the commit answers with the new layout
        self.committed_layout = self._last_commit = layout

    def stamp_times(self, atime: float | None, mtime: float | None) -> None:
        """Have the next commit set these times (None: that time as a commit sets it), in the
        same call: ``utimens`` on a file being written (``tar``, ``cp -p``). A later write
        does not move a stamped mtime."""
        self._check_open(write=True)
        old_atime, old_mtime = self.stamped_times
        self.stamped_times = (old_atime if atime is None else atime, old_mtime if mtime is None else mtime)
        self._changed = True

    def _touch(self) -> None:
        """The data changed now: the next commit's mtime (a stamped one is overtaken)."""
        self.modified_at = time.time()
        self.stamped_times = (self.stamped_times[0], None)

    def stamp_mode(self, mode: int) -> None:
        """Have the next commit also set the permission bits to ``mode`` (a chmod of a file
        being written, carried by its commit)."""
        self._check_open(write=True)
        self.stamped_mode = mode
        self._changed = True

    @property
    def unchanged(self) -> bool:
        """Nothing written, truncated or in flight since this handle's open or last commit."""
        return not (self._changed or self._pending_writes() or self._writes.anything_staged())

    def _pending_writes(self) -> bool:
        """Blocks buffered, in flight or written and not yet committed nor staged."""
        return any(self._writes.count(state) for state in (WriteState.BUFFERING, WriteState.PUTTING, WriteState.WRITTEN))

    def adopt(self, layout: messages.LayoutSegment) -> bool:
        """Another handle of this process committed ``layout``: an unchanged handle takes it
        as its own view (as descriptors of a local file share one page cache), so its next
        reads return the new bytes. False (nothing done) if this handle has changes of its own."""
        if self.closed or not self.unchanged or layout.attrs.ino != self.ino:
            return False
        self._drop_cache()
        self._set_layout(layout)
        self.size = layout.attrs.size
        return True

    async def _commit(self) -> messages.LayoutSegment | None:
        """Send what is buffered, wait for every block, commit; None if nothing changed."""
        await self._place_block_zero()
        for idx in list(self._writes.in_state(WriteState.BUFFERING)):
            await self._send(idx)
        while self._writes.count(WriteState.PUTTING):
            await self._reap(wait=True)
        if not self._changed and not self._writes.count(WriteState.WRITTEN):
            return None
        await self._stage_excess()
        staged = self._writes.anything_staged()
        atime, mtime = self.stamped_times
        return await self.context.metadata.commit(messages.CommitRequest(
            ino=self.ino, handle=self.handle, size=self.size, replace=self.replace, atime=atime, mode=self.stamped_mode,
            mtime=mtime if mtime is not None else self.modified_at or time.time(),
            blocks=[messages.written(entry.block) for entry in self._writes.in_state(WriteState.WRITTEN).values()
                    if entry.block is not None and entry.idx * self.block_size < self.size],
            shrunk_to=self._shrunk_to, holes=self._holes_to_send(), writer=self._writer if staged else None,
        ))

    async def _place_block_zero(self) -> None:
        """Before a commit: a small file (at most ``inline_max`` bytes, all of it in block 0,
        which this handle buffers) is committed inline, its bytes in the commit itself, with no
        allocation and no chunk put; a file that outgrew that size, whose committed block 0 is
        inline, moves block 0 to chunks with this commit."""
        entry = self._writes.get(0)
        if 0 < self.size <= self.inline_max and len(self._writes) == 1 and entry is not None and (
                entry.state is WriteState.BUFFERING and not self._writes.anything_staged()):
            assert entry.buffer is not None
            block = inline.inline_block(entry.buffer[: min(entry.valid, self.size)], self.attrs.policy)
            if block is not None:  # (None: zeros only, sent as a hole)
                self.context.buffers.put(self._writes.inline(0, block))
                self.context.metrics.event("inline_writes")
        elif self.size > self.inline_max and not self.replace and self._writes.state(0) is None:
            await self._cover(0, 0)
            committed = self.blocks.get(0)
            if committed is not None and committed.inline is not None:
                await self._block_buffer(0, 0)  # its bytes, BUFFERING: sent to chunks like any block

    async def close(self) -> None:
        """Commit (readers that open the file afterwards see everything written) and close.
        If the commit fails, the handle aborts (see ``abort``) and the error is raised."""
        if self.closed:
            return
        try:
            await self.flush()
        except BaseException:
            await self.abort()
            raise
        self._release()

    async def abort(self) -> None:
        """Close without committing anything written since the last commit: readers keep
        seeing the previous version, and the chunks written go to garbage collection. A file
        this handle's open created and never committed is removed again, if it is still
        empty, still this file and open in no other handle (closed ones of this client's first)."""
        if self.closed:
            return
        reader = self._leases.reader
        self._release()
        if self.created and not self._committed and self.writable:
            try:
                await self.context.lease_endings.flush()
                await self.context.metadata.unlink(messages.UnlinkRequest(
                    path=self.path, ino=self.ino, only_if_empty=True, reader=reader))
            except TectofsError:
                pass  # renamed or removed meanwhile: nothing of ours to take back

    def _release(self) -> None:
        self.closed = True
        reader, since = self._leases.stop()
        self._allocations.forget()
        if reader:  # end the lease now (else it lapses): a file unlinked while open goes at once
            park = self.context.park_reader
            # a reader's, under the layout it opened; a writer's, under what its last commit
            # answered (the cache kept it) if nothing changed since
            layout = self.opened_layout if not self.writable else self._last_commit if not self._changed else None
            if park is not None and layout is not None and (self.writable or not self.created) and park(
                    layout, self.context.acting_uid, reader, since):
                pass  # the next open takes it; whatever drops its layout from the cache ends it
            else:
                self.context.lease_endings.end(self.ino, reader, self.handle, self.context.acting_uid)
        for entry in self._writes:
            self._forget(self._writes.drop(entry.idx))
        self._drop_cache()

    def _forget(self, entry: BlockWrite) -> None:
        """A block write given up (cut off or closed): its put cancelled, its buffer returned."""
        if entry.task is not None:
            entry.task.cancel()
        if entry.buffer is not None:
            self.context.buffers.put(entry.buffer)

    # ------------------------------------------------------------------ read

    async def read(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset``; short only at end of file."""
        buffer = bytearray(max(0, min(length, self.size - offset)))
        n = await self.readinto(offset, buffer)
        return bytes(memoryview(buffer)[:n])

    async def readinto(self, offset: int, target: Buffer) -> int:
        """Up to ``len(target)`` bytes at ``offset`` into ``target``; short only at end of file."""
        return await self.preadv(offset, [target])

    async def preadv(self, offset: int, targets: Sequence[Buffer]) -> int:
        """Consecutive bytes from ``offset`` into ``targets`` in turn, as preadv(2): the count
        read, short only at end of file. A block the targets cover whole is decoded straight
        into them, however they split it (``Regions``); the others are copied from a block read."""
        self._check_open(write=False)
        if not self.readable:
            raise InvalidArgument(f"{self.path} is not open for reading")
        if self._pending_writes() or self._changed:
            await self.flush()  # read what this handle wrote
        out = Regions(targets)
        end = min(self.size, offset + len(out))
        if end > offset:
            await self._cover(offset // self.block_size, (end - 1) // self.block_size + limits.read_prefetch_blocks)
        position = offset
        whole: list[tuple[int, memoryview | Regions]] = []
        self._reading_on = offset == self._next_read  # a read through: whole blocks, prefetched
        self._next_read = max(end, offset)
        while position < end:
            idx, within = divmod(position, self.block_size)
            n = min(end - position, self.block_size - within)
            at = position - offset
            if within == 0 and self._whole_block_read(idx, n):
                self._plan_whole_block(out, at, idx, n, whole)
            else:
                await self._copy_from_block(out, at, idx, within, n)
            position += n
        if whole:
            await self._read_whole_blocks(whole)
        self.context.metrics.read(max(0, end - offset))
        return max(0, end - offset)

    def _plan_whole_block(self, out: Regions, at: int, idx: int, n: int,
                          whole: list[tuple[int, memoryview | Regions]]) -> None:
        """Block ``idx``, read whole into ``out`` at ``at``: its zero head and tail (if sparse)
        written now, its stored span added to ``whole`` (decoded in place, several at once)."""
        spans = self.blocks[idx]
        stored_end = spans.start + spans.length
        if spans.start:
            out.write(at, bytes(spans.start))
        if stored_end < n:
            out.write(at + stored_end, bytes(n - stored_end))
        if spans.length:
            views = out.views(at + spans.start, spans.length)
            whole.append((idx, views[0] if len(views) == 1 else Regions(views)))

    async def _copy_from_block(self, out: Regions, at: int, idx: int, within: int, n: int) -> None:
        """``n`` bytes of block ``idx`` from ``within``, through the block cache, into ``out`` at
        ``at``. A small read of a large block that is not being read through (not cached, not
        prefetched, not the continuation of the last read) fetches only its own bytes."""
        if await self._copy_part(out, at, idx, within, n):
            return
        block = await self._committed_block(idx)
        available = max(0, min(n, len(block) - within))
        out.write(at, memoryview(block)[within : within + available])
        if available < n:  # hole or clipped tail: zeros
            out.write(at + available, bytes(n - available))

    async def _copy_part(self, out: Regions, at: int, idx: int, within: int, n: int) -> bool:
        """``_copy_from_block`` by a partial read (``client/partial_reads.py``); False, having
        done nothing, where the whole block is read instead."""
        block = self.blocks.get(idx)
        if block is None or idx in self._cache or idx in self._prefetch or self._reading_on:
            return False
        data = await partial_reads.read_within(self.context.blocks, block, within, n)
        if data is not None:
            out.write(at, data)
        return data is not None

    async def _read_whole_blocks(self, reads: list[tuple[int, memoryview | Regions]]) -> None:
        """Blocks the caller reads whole are decoded straight into its buffer (one copy of
        the block fewer, none on the event loop thread), several at once."""
        fewest, most = limits.read_blocks_parallel_range
        gate = asyncio.Semaphore(max(fewest, min(most, limits.read_inflight_bytes_max // self.block_size)))

        async def read(idx: int, into: memoryview | Regions) -> None:
            async with gate:
                await self._read_block(self.blocks[idx], into)

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
        """A read of ``n`` bytes from the start of block ``idx`` covers all of it (what it
        stores, and its zero head and tail if sparse), and it is neither cached nor being
        prefetched: such blocks are read several at once, straight into the caller's buffer.
        (A read of part of a block goes through the block cache: the next part is likely next.)"""
        block = self.blocks.get(idx)
        return (
            block is not None and block.start + block.length <= block.valid <= n
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
            data = await task if task is not None else await self._load_block(block)
            self._cache[idx] = data
            while len(self._cache) > 2:
                self.context.buffers.put(self._cache.popitem(last=False)[1])
        if idx == self._last_read_block + 1:
            self._start_prefetch(idx + 1)
        self._last_read_block = idx
        return memoryview(data)[: block.valid]

    def _start_prefetch(self, first: int) -> None:
        for idx in range(first, first + limits.read_prefetch_blocks):
            if idx in self.blocks and idx not in self._cache and idx not in self._prefetch:
                task = asyncio.get_running_loop().create_task(self._load_block(self.blocks[idx]))
                task.add_done_callback(consume_outcome)  # a prefetch nobody reads may fail unseen
                self._prefetch[idx] = task
        for idx, task in list(self._prefetch.items()):
            if idx < first - 1:
                task.cancel()
                del self._prefetch[idx]

    async def _load_block(self, block: messages.Block) -> memoryview:
        """The block's bytes from its offset 0 to the end of what it stores, in a pool buffer:
        the zeros before ``start``, then the stored span."""
        start = block.start
        if not start:
            data = await self._read_block(block)
            assert isinstance(data, memoryview)  # (no target given: a buffer of the pool)
            return data
        out = self.context.buffers.get(_stored_end(block))
        out[:start] = bytes(start)
        try:
            await self._read_block(block, out[start:])
        except BaseException:
            self.context.buffers.put(out)
            raise
        return out

    async def _read_block(self, block: messages.Block, into: memoryview | Regions | None = None) -> memoryview | Regions:
        """``BlockIO.read_block``; a capability that expired while the file was open (they live
        ``limits.capability_ttl_s``) is renewed from a fresh layout segment and the read
        retried. A block the file no longer has (it was rewritten meanwhile) is StaleFile.
        A block stored inline is its bytes, checked against their crc32c."""
        if block.inline is not None:
            return inline.inline_bytes(block, into, self.context.buffers, self.context.metrics, self.path)
        try:
            return await self.context.blocks.read_block(block, into=into)
        except CapabilityExpired:
            self.context.metrics.retried("chunk", "capability")
            segment = await self.context.metadata.layout(messages.LayoutRequest(ino=self.ino, handle=self.handle, first=block.idx))
            fresh = next((b for b in segment.blocks if b.block_id == block.block_id), None)
            if fresh is None:
                raise StaleFile(f"{self.path} was rewritten while open and its read capability expired;"
                                " open it again") from None
            renewed = msgspec.structs.replace(block, cap=fresh.cap)
            if self.blocks.get(block.idx) is block:
                self.blocks[block.idx] = renewed
            return await self.context.blocks.read_block(renewed, into=into)

    def _drop_cache(self) -> None:
        """Forget every block read (cached or being prefetched): it may be stale now."""
        for task in self._prefetch.values():
            task.cancel()
        self._prefetch.clear()
        for data in self._cache.values():
            self.context.buffers.put(data)
        self._cache.clear()

    def _check_open(self, write: bool) -> None:
        if self.closed:
            raise InvalidArgument(f"{self.path}: I/O on a closed file")
        if self._failure is not None and write:
            raise self._failure
        if write and not self.writable:
            raise InvalidArgument(f"{self.path} is not open for writing")


def _stored_end(block: messages.Block) -> int:
    """Offset within its block just past the last stored byte of ``block``."""
    return block.start + block.length
