"""What an open file holds of each block it writes: one state machine per block index.

A handle writes a block through these states (``WriteState``); every move is one method of
:class:`BlockWrites`, which checks that the block is in a state the move may start from and
raises :class:`IllegalTransition` otherwise (a bug in the caller, never a peer's doing)::

                        rewrite (read back, patched)
        +--------------------------------------------------+
        v                                                  |
    BUFFERING --send--> PUTTING --put done--> WRITTEN --stage--> STAGED
      |    ^              ^   \\                   (MDS holds it, unpublished)
      |    |  whole write |    +--put failed or cancelled--> FAILED (the handle is poisoned)
      | zeros|            |
      v    |              |
     HOLE -+--------------+
      |  \\--stage--> HOLE_STAGED (-> BUFFERING or PUTTING, as HOLE)

    BUFFERING --inline (a small file's block 0, at its commit)--> WRITTEN (its bytes in the Block)
    (absent) --first touch--> BUFFERING, or PUTTING for a block written whole
    any state --cut (truncate) or release (close, abort)--> (absent)
    every entry --commit--> (absent): the commit's layout holds the blocks now

Besides its state, an entry remembers what the metadata service holds *staged* for its index
from this handle (``staged_at_mds``): a block or hole sent ahead stays there, overridden by
whatever the handle sends next for the index, until the commit publishes it or a cut drops
it; so a commit must name the writer, and a truncation must tell the service, even when the
block has been rewritten since. ``hole_at_mds``: the staged thing is a hole this index still
wants (a block that was a staged hole and is being rewritten keeps it, so zeros written
there do not send the hole a second time).

This module does no I/O: ``AsyncFile`` (``client/files.py``) does the sending and calls the
moves, and ``tests/test_block_writes.py`` drives them alone.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from typing import Iterator, Mapping

from tectofs.wire import messages


class WriteState(enum.Enum):
    BUFFERING = "buffering"      # its bytes sit in a block buffer (``buffer``, ``valid`` of them)
    PUTTING = "putting"          # encode and chunk puts in flight (``task``)
    WRITTEN = "written"          # its chunks are durable (``block``): the next stage or commit names it
    STAGED = "staged"            # ``block`` sent to the MDS ahead of the commit (``stage``)
    HOLE = "hole"                # written as zeros whole: committed as a hole, nothing stored
    HOLE_STAGED = "hole_staged"  # such a hole, sent ahead
    FAILED = "failed"            # its write failed or was cancelled: the handle is poisoned


class IllegalTransition(AssertionError):
    """A move asked of a block in a state it cannot start from: the caller's bug."""


_STATES = tuple(WriteState)  # (iterating the enum class itself is slow: a handle per open makes this)

_FROM: dict[str, frozenset[WriteState | None]] = {
    # move: the states (None: absent) it may start from
    "buffer": frozenset({None, WriteState.WRITTEN, WriteState.STAGED, WriteState.HOLE, WriteState.HOLE_STAGED}),
    "put": frozenset({None, WriteState.BUFFERING, WriteState.HOLE, WriteState.HOLE_STAGED}),
    "hole": frozenset({WriteState.BUFFERING}),
    "written": frozenset({WriteState.PUTTING}),
    "inline": frozenset({WriteState.BUFFERING}),
    "failed": frozenset({WriteState.PUTTING}),
    "staged": frozenset({WriteState.WRITTEN, WriteState.HOLE}),
}


@dataclass(slots=True, eq=False)
class BlockWrite:
    """One block index this handle is writing. Which fields mean something depends on
    ``state``: ``buffer`` and ``valid`` while BUFFERING, ``task`` while PUTTING, ``block``
    while WRITTEN or STAGED."""

    idx: int
    state: WriteState
    buffer: memoryview | None = None
    valid: int = 0
    task: asyncio.Task[messages.Block] | None = None
    block: messages.Block | None = None
    staged_at_mds: bool = False
    hole_at_mds: bool = False


class BlockWrites:
    """The blocks one handle writes, by index, each in one ``WriteState``; the moves between
    states are the methods below (and nothing else changes an entry's state). Entries of one
    state are kept in the order they entered it: the oldest buffered block is sent first."""

    def __init__(self) -> None:
        self._entries: dict[int, BlockWrite] = {}
        self._by_state: dict[WriteState, dict[int, BlockWrite]] = {state: {} for state in _STATES}
        self._staged_at_mds = 0  # entries with ``staged_at_mds``

    # ------------------------------------------------------------------ looking

    def state(self, idx: int) -> WriteState | None:
        entry = self._entries.get(idx)
        return None if entry is None else entry.state

    def get(self, idx: int) -> BlockWrite | None:
        return self._entries.get(idx)

    def in_state(self, state: WriteState) -> Mapping[int, BlockWrite]:
        """The entries in ``state``, by index, oldest first (do not change it while iterating
        over it: take a ``list`` first)."""
        return self._by_state[state]

    def count(self, state: WriteState) -> int:
        return len(self._by_state[state])

    def untouched(self, idx: int) -> bool:
        """Nothing of block ``idx`` is buffered, in flight or sent by this handle (a hole is
        nothing: a write of the whole block may replace it without reading it)."""
        return self.state(idx) in (None, WriteState.HOLE, WriteState.HOLE_STAGED)

    def sent(self, idx: int) -> bool:
        """Block ``idx`` has data this handle sent (in flight, written or staged)."""
        return self.state(idx) in (WriteState.PUTTING, WriteState.WRITTEN, WriteState.STAGED)

    def anything_staged(self) -> bool:
        """The metadata service holds something this handle staged (the commit names the writer)."""
        return self._staged_at_mds > 0

    def staged_from(self, first: int) -> bool:
        return any(entry.staged_at_mds for idx, entry in self._entries.items() if idx >= first)

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[BlockWrite]:
        return iter(list(self._entries.values()))

    # ------------------------------------------------------------------ moves

    def _check(self, move: str, idx: int) -> BlockWrite | None:
        entry = self._entries.get(idx)
        state = None if entry is None else entry.state
        if state not in _FROM[move]:
            raise IllegalTransition(f"block {idx}: {move} from {state.name if state else 'absent'}")
        return entry

    def _enter(self, entry: BlockWrite, state: WriteState) -> None:
        if entry.idx in self._entries:
            del self._by_state[entry.state][entry.idx]
        else:
            self._entries[entry.idx] = entry
        entry.state = state
        self._by_state[state][entry.idx] = entry

    def buffer(self, idx: int, buffer: memoryview, valid: int) -> BlockWrite:
        """Block ``idx`` is (again) being written through ``buffer``, whose first ``valid``
        bytes are its content: first touched, read back after it was sent, or a hole
        rewritten in part. A block already BUFFERING changes with ``update``."""
        entry = self._check("buffer", idx) or BlockWrite(idx, WriteState.BUFFERING)
        self._enter(entry, WriteState.BUFFERING)
        entry.buffer, entry.valid, entry.task, entry.block = buffer, valid, None, None
        return entry

    def update(self, idx: int, buffer: memoryview, valid: int) -> None:
        """A BUFFERING block's buffer grew or its content changed (it keeps its age)."""
        entry = self._entries.get(idx)
        if entry is None or entry.state is not WriteState.BUFFERING:
            raise IllegalTransition(f"block {idx}: update of a block not buffering")
        entry.buffer, entry.valid = buffer, valid

    def put(self, idx: int, task: asyncio.Task[messages.Block]) -> None:
        """Its data is being encoded and put (``task`` gives the Block, and owns the buffer the
        block was in, if any). Data sent there overrides a hole staged at the index."""
        entry = self._check("put", idx) or BlockWrite(idx, WriteState.PUTTING)
        self._enter(entry, WriteState.PUTTING)
        entry.buffer, entry.valid, entry.task, entry.hole_at_mds = None, 0, task, False

    def hole(self, idx: int) -> memoryview:
        """The BUFFERING block holds only zeros: it becomes a hole (staged already if it was a
        staged hole before this rewrite). Returns its buffer, for the pool."""
        entry = self._check("hole", idx)
        assert entry is not None and entry.buffer is not None
        buffer = entry.buffer
        self._enter(entry, WriteState.HOLE_STAGED if entry.hole_at_mds else WriteState.HOLE)
        entry.buffer, entry.valid = None, 0
        return buffer

    def written(self, idx: int, block: messages.Block) -> None:
        """Its put finished: ``block`` is durable, to be staged or committed."""
        entry = self._check("written", idx)
        assert entry is not None
        assert block.idx == idx
        self._enter(entry, WriteState.WRITTEN)
        entry.task, entry.block = None, block

    def inline(self, idx: int, block: messages.Block) -> memoryview:
        """The BUFFERING block is committed inline (``block`` carries its bytes: nothing to
        put). Returns its buffer, for the pool."""
        entry = self._check("inline", idx)
        assert entry is not None and entry.buffer is not None and block.idx == idx and block.inline is not None
        buffer = entry.buffer
        self._enter(entry, WriteState.WRITTEN)
        entry.buffer, entry.valid, entry.block = None, 0, block
        return buffer

    def failed(self, idx: int) -> None:
        """Its put failed or was cancelled (the handle is poisoned: nothing is committed)."""
        entry = self._check("failed", idx)
        assert entry is not None
        self._enter(entry, WriteState.FAILED)
        entry.task = None

    def staged(self, idx: int) -> None:
        """The WRITTEN block, or the HOLE, was sent to the metadata service ahead of the
        commit (``stage``)."""
        entry = self._check("staged", idx)
        assert entry is not None
        self._enter(entry, WriteState.STAGED if entry.state is WriteState.WRITTEN else WriteState.HOLE_STAGED)
        self._staged_at_mds += not entry.staged_at_mds
        entry.staged_at_mds = True
        entry.hole_at_mds = entry.state is WriteState.HOLE_STAGED

    def take_block(self, idx: int) -> messages.Block:
        """The Block of a WRITTEN or STAGED block that is about to be rewritten (the caller
        reads it back and moves it to BUFFERING with ``buffer``)."""
        entry = self._entries.get(idx)
        if entry is None or entry.state not in (WriteState.WRITTEN, WriteState.STAGED) or entry.block is None:
            raise IllegalTransition(f"block {idx}: no written block to take back")
        return entry.block

    def drop(self, idx: int) -> BlockWrite:
        """Forget block ``idx`` whatever its state (a truncation cut it off, or the handle
        closes); the caller cancels its task or gives back its buffer."""
        entry = self._entries.pop(idx)
        del self._by_state[entry.state][idx]
        self._staged_at_mds -= entry.staged_at_mds
        return entry

    def committed(self) -> None:
        """The commit published every WRITTEN and STAGED block and every hole: forget them.
        Nothing may be buffering or in flight then (the commit sends and waits for them first)."""
        for state in (WriteState.BUFFERING, WriteState.PUTTING, WriteState.FAILED):
            if self._by_state[state]:
                raise IllegalTransition(f"commit with blocks {sorted(self._by_state[state])} {state.name}")
        self._entries.clear()
        self._staged_at_mds = 0
        for entries in self._by_state.values():
            entries.clear()
