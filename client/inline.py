"""Small files stored inline: a file of at most ``inline_max`` bytes keeps its block 0 in the
metadata store (``tectofs/store/blockmaps.py``), its bytes carried by the commit that writes it
and by the layout that opens it, with their crc32c: no allocation, no chunk put or get."""

from __future__ import annotations

from tectofs import checksum, sparse
from tectofs.buffers import BufferPool
from tectofs.errors import ChecksumMismatch
from tectofs.metrics import ClientMetrics
from tectofs.regions import Regions
from tectofs.wire import messages


def inline_block(content: memoryview, policy: str) -> messages.Block | None:
    """Block 0 of a small file holding ``content`` (its bytes up to the file's size), to commit
    inline: its stored span trimmed of zeros at either end; None for zeros only (a hole)."""
    start, end = sparse.data_span(content)
    if end == 0:
        return None
    data = bytes(content[start:end])
    return messages.Block(idx=0, block_id=0, policy=policy, start=start, length=end - start, valid=end, chunks=[],
                          inline=messages.InlineData(data=data, crc=checksum.crc(data)))


def inline_bytes(block: messages.Block, into: memoryview | Regions | None, buffers: BufferPool,
                 metrics: ClientMetrics, path: str) -> memoryview | Regions:
    """The stored bytes of a block kept inline, checked against their crc32c, in ``into``
    (None: a buffer of ``buffers``, which the caller gives back)."""
    assert block.inline is not None
    data = block.inline.data
    if checksum.crc(data) != block.inline.crc:
        metrics.event("inline_checksum_failures")
        raise ChecksumMismatch(f"{path}: the inline data of block {block.idx} fails its crc32c")
    metrics.event("inline_reads")
    if into is None:
        out = buffers.get(len(data))
        out[:] = data
        return out
    if isinstance(into, Regions):
        into.write(0, data)
    else:
        into[: len(data)] = data
    return into
