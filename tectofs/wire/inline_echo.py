"""A commit's answer without the inline bytes the writer just sent, and those bytes put back.

A small file is committed inline: its bytes travel in the ``commit`` call, and the answer is
the file's new layout, whose block 0 holds those same bytes. Echoing them would send every
small file back over the wire and, since the service records each answer for exactly-once
retries (``tectofs.store.requests``), store it a second time in the metadata store until the
record is pruned. A writer that says ``CommitRequest.echo_inline=False`` gets the layout with
that block's ``inline.data`` empty and ``LayoutSegment.inline_omitted`` set (:func:`omit`, on
the service); its client puts its own bytes back (:func:`restore`) before anything reads the
layout. The crc32c stays in the answer: a block is put back only from bytes sent with that
same crc32c (which the service checked against them when it stored them).
"""

from __future__ import annotations

from typing import Iterable

import msgspec

from tectofs.errors import ChecksumMismatch

from .values import Block, InlineData, LayoutSegment, WrittenBlock

_EMPTY = b""


def omit(segment: LayoutSegment, sent: Iterable[WrittenBlock]) -> LayoutSegment:
    """``segment`` with the bytes of each inline block that ``sent`` carried with the same
    index, length and crc32c left out (``inline_omitted`` set if any was)."""
    carried = {(b.idx, b.length, b.inline.crc) for b in sent if b.inline is not None}
    if not carried:
        return segment
    blocks, omitted = [], False
    for block in segment.blocks:
        if block.inline is not None and (block.idx, block.length, block.inline.crc) in carried:
            block = msgspec.structs.replace(block, inline=InlineData(data=_EMPTY, crc=block.inline.crc))
            omitted = True
        blocks.append(block)
    return msgspec.structs.replace(segment, blocks=blocks, inline_omitted=True) if omitted else segment


def restore(segment: LayoutSegment, sent: Iterable[WrittenBlock]) -> LayoutSegment:
    """``segment`` (a commit's answer) whole again: each inline block left out gets the bytes
    ``sent`` carried for it with the crc32c the service kept. Raises
    ``ChecksumMismatch`` if an omitted block matches nothing sent (a service answering another
    commit's layout: never used as this file's bytes)."""
    if not segment.inline_omitted:
        return segment
    carried = {b.idx: b.inline for b in sent if b.inline is not None}
    blocks: list[Block] = []
    for block in segment.blocks:
        if block.inline is not None and not block.inline.data and block.length:
            data = carried.get(block.idx)
            if data is None or len(data.data) != block.length or data.crc != block.inline.crc:
                raise ChecksumMismatch(f"inode {segment.attrs.ino}: the commit's answer leaves out inline block"
                                       f" {block.idx}, which does not match the bytes this commit carried")
            block = msgspec.structs.replace(block, inline=data)
        blocks.append(block)
    return msgspec.structs.replace(segment, blocks=blocks, inline_omitted=False)
