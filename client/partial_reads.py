"""Reading part of a block: only the bytes asked for, from the data chunks that hold them.

A read of 4 KiB in the middle of a 64 MiB block need not fetch and decode the block. The
data chunks of a systematic code hold the block's bytes as they are (``erasure.data_extents``
says where), so the read asks each chunk that holds some of them for just that range, rounded
out to whole 64 KiB checksum pieces (a piece's crc covers all of it), and checks every piece
it receives against the crcs written with the chunk. Nothing is decoded.

This is the fast path only: a chunk on a server known to be down, unregistered, failing,
slow past its deadline or damaged makes :func:`read_part` answer None (a get still unanswered
at the deadline a whole-chunk get to its server would have, ``client/server_health.py``, also
sets that server aside: the whole-block read then reads parity instead), and the caller reads
the whole block instead, which reads around missing chunks, hedges slow ones, reports bad
ones and renews an expired capability (``client/block_reads.py``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tectofs import checksum, erasure, limits
from tectofs.errors import TectofsError
from tectofs.policy import parse as parse_policy
from tectofs.wire import messages

from .block_reads import consume_outcome

if TYPE_CHECKING:
    from .blocks import BlockIO

PIECE = limits.checksum_piece_bytes


def worth_reading_in_part(block: messages.Block, wanted: int) -> bool:
    """A read of ``wanted`` stored bytes of ``block`` fetches less in part than whole: the
    block stores at least four times that (and a block stored inline is never read in part)."""
    return block.inline is None and bool(block.chunks) and 0 < wanted <= limits.partial_read_max_bytes and (
        block.length >= 4 * max(wanted, PIECE))


async def read_within(blocks: "BlockIO", block: messages.Block, within: int, n: int) -> bytes | None:
    """Bytes ``[within, within + n)`` of ``block`` (offsets in the block: zeros outside its
    stored span and past its valid length) by a partial read; None where it is not worth it
    or the whole block must be read instead."""
    first, end = max(within, block.start), min(within + n, block.start + block.length, block.valid)
    if first >= end or not worth_reading_in_part(block, end - first):
        return None
    data = await read_part(blocks, block, first - block.start, end - first)
    if data is None:
        return None
    return bytes(first - within) + data + bytes(within + n - end)


async def read_part(blocks: "BlockIO", block: messages.Block, start: int, length: int) -> bytes | None:
    """Stored bytes ``[start, start + length)`` of ``block`` (offsets within its stored span),
    read from the data chunks that hold them, every piece checked; None where the whole block
    must be read instead (see the module docstring)."""
    policy = parse_policy(block.policy)
    runs = erasure.data_extents(policy, block.length, start, length)
    by_position = {c.position: c for c in block.chunks}
    sources = [c for c in block.chunks] if policy.kind == "rep" else None
    wanted: dict[int, tuple[int, int]] = {}  # position -> chunk range [first, end) of its runs
    for position, chunk_offset, _, n in runs:
        first, end = wanted.get(position, (chunk_offset, chunk_offset + n))
        wanted[position] = (min(first, chunk_offset), max(end, chunk_offset + n))
    chunks: dict[int, messages.ChunkRef] = {}
    for position in wanted:
        if sources is not None:  # rep: any live replica
            chunk = next((c for c in sources if c.address and not c.set_aside and not blocks.down.is_down(c.address)),
                         None)
        else:
            chunk = by_position.get(position)
        if chunk is None or not chunk.address or chunk.set_aside or blocks.down.is_down(chunk.address):
            return None
        chunks[position] = chunk
    # The deadline of a whole-chunk get to the slowest of these servers (``server_health``):
    # a range is no larger, so a get still unanswered then is late, and its server set aside.
    deadline = min(limits.partial_read_timeout_s, max(blocks.down.latencies.deadline(c.address) for c in chunks.values()))
    gets = {asyncio.ensure_future(_get_range(blocks, block, chunks[position], first, end)): position
            for position, (first, end) in wanted.items()}
    try:
        done, late = await asyncio.wait(gets, timeout=deadline, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in gets:
            if not task.done():
                task.cancel()
            task.add_done_callback(consume_outcome)
    errors = [error for task in done if (error := task.exception()) is not None]
    for error in errors:
        if not isinstance(error, TectofsError):
            raise error
    if errors:
        return None
    for task in late:  # (no get failed: these ran past the deadline)
        blocks.down.late(chunks[gets[task]].address)
        blocks.note("servers_set_aside")
    if late:
        return None
    ranges = {position: task.result() for task, position in gets.items()}
    out = bytearray(sum(n for *_, n in runs))
    at = 0
    for position, chunk_offset, _, n in runs:
        aligned, data = ranges[position]
        out[at : at + n] = data[chunk_offset - aligned : chunk_offset - aligned + n]
        at += n
    blocks.metrics.event("partial_reads")
    return bytes(out)


async def _get_range(blocks: "BlockIO", block: messages.Block, chunk: messages.ChunkRef, first: int,
                     end: int) -> tuple[int, Any]:
    """The whole pieces of ``chunk`` covering ``[first, end)``, checked: (where they start, bytes)."""
    aligned = first - first % PIECE
    assert chunk.address is not None
    request = messages.GetChunkRequest(block_id=block.block_id, cap=block.cap, offset=aligned, length=end - aligned)
    reply, payload = await blocks.rpc.call(chunk.address, messages.GET_CHUNK, request, retries_max=0)
    data = bytes(payload)
    blocks.buffers.put(payload)
    if len(data) < end - aligned:
        raise TectofsError(f"chunk {block.block_id:x} answered {len(data)} bytes where {end - aligned} were asked")
    checksum.verify_pieces(memoryview(data), reply.crcs, f"chunk {block.block_id:x} from {chunk.address}")
    return aligned, data
