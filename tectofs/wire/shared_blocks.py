"""Messages of the operations on blocks shared between files (``tectofs.store.sharing``):
``reference_blocks`` (an incremental checkpoint's file takes the unchanged blocks of the
previous checkpoint's) and ``shared_blocks`` (what ``tectofs du`` needs to count a subtree's
unique bytes). Listed in ``messages.META_OPERATIONS`` like every other operation."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from tectofs import limits
from tectofs.wire.operation import Operation
from tectofs.wire.values import Attrs, Id, Int64, Message, Name, Path

# Rows of one shared_blocks reply (each a few integers): well inside the reply budget.
SHARED_BLOCKS_PER_REPLY_MAX = 16384


class ReferenceBlocksRequest(Message, frozen=True, kw_only=True):
    """Make block ``pairs[i][0]`` of file ``path`` the block ``pairs[i][1]`` of file ``source``
    (the same chunks, one more reference), for every pair, in one transaction."""

    path: Path
    source: Path
    pairs: Annotated[list[tuple[Int64, Int64]], msgspec.Meta(min_length=1, max_length=limits.commit_blocks_max)]


class ReferenceBlocksReply(Message, frozen=True, kw_only=True):
    attrs: Attrs


class SharedBlocksRequest(Message, frozen=True, kw_only=True):
    """The shared blocks of the files ``names`` of ``directory`` (names of anything else are
    skipped), from row ``offset`` on of the answer's order."""

    directory: Path
    names: Annotated[list[Name], msgspec.Meta(min_length=1, max_length=limits.health_inos_per_call_max)]
    offset: Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)] = 0


class SharedBlock(Message, frozen=True, array_like=True):
    """One use of a block another use shares: the file (its index in the request's ``names``),
    the block, and the bytes it stores."""

    name: Annotated[int, msgspec.Meta(ge=0)]
    block_id: Id
    nbytes: Int64


class SharedBlocksReply(Message, frozen=True, kw_only=True):
    blocks: Annotated[list[SharedBlock], msgspec.Meta(max_length=SHARED_BLOCKS_PER_REPLY_MAX)]
    more: bool = False  # ask again from offset + len(blocks)


REFERENCE_BLOCKS: Final = Operation("reference_blocks", ReferenceBlocksRequest, ReferenceBlocksReply, idempotent=True)
SHARED_BLOCKS: Final = Operation("shared_blocks", SharedBlocksRequest, SharedBlocksReply, idempotent=True)
