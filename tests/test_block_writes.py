"""The per-block write state machine of an open file (``client/writes.py``), alone: the moves
a handle makes, and the ones it must never make refused."""

from __future__ import annotations

import asyncio

import pytest

from tectofs.client.writes import BlockWrites, IllegalTransition, WriteState
from tectofs.wire import messages


def _block(idx: int) -> messages.Block:
    return messages.Block(idx=idx, block_id=100 + idx, policy="rs(4,2)", length=10, valid=10, chunks=[])


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _put(writes: BlockWrites, idx: int, loop: asyncio.AbstractEventLoop) -> None:
    writes.put(idx, loop.create_future())  # type: ignore[arg-type]


def test_a_block_goes_from_buffer_to_commit(loop):
    writes = BlockWrites()
    buffer = memoryview(bytearray(16))
    writes.buffer(3, buffer, 4)
    writes.update(3, buffer, 16)
    assert writes.state(3) is WriteState.BUFFERING and writes.get(3).valid == 16  # type: ignore[union-attr]
    assert not writes.untouched(3) and not writes.sent(3)
    _put(writes, 3, loop)
    assert writes.state(3) is WriteState.PUTTING and writes.get(3).buffer is None  # type: ignore[union-attr]
    assert writes.sent(3) and writes.count(WriteState.PUTTING) == 1
    writes.written(3, _block(3))
    assert writes.state(3) is WriteState.WRITTEN and not writes.anything_staged()
    writes.staged(3)
    assert writes.state(3) is WriteState.STAGED and writes.anything_staged() and writes.staged_from(3)
    assert not writes.staged_from(4)
    writes.committed()
    assert len(writes) == 0 and not writes.anything_staged()
    assert writes.state(3) is None and writes.untouched(3)


def test_a_block_written_whole_skips_the_buffer_and_a_failed_put_is_terminal(loop):
    writes = BlockWrites()
    _put(writes, 0, loop)
    writes.failed(0)
    assert writes.state(0) is WriteState.FAILED
    for move in (lambda: writes.written(0, _block(0)), lambda: writes.staged(0), lambda: _put(writes, 0, loop),
                 lambda: writes.buffer(0, memoryview(bytearray(1)), 0), lambda: writes.hole(0)):
        with pytest.raises(IllegalTransition):
            move()
    with pytest.raises(IllegalTransition, match="FAILED"):
        writes.committed()  # a poisoned handle never commits
    writes.drop(0)
    writes.committed()


def test_zeros_make_a_hole_and_a_staged_hole_is_not_sent_twice(loop):
    writes = BlockWrites()
    buffer = memoryview(bytearray(8))
    writes.buffer(5, buffer, 8)
    assert writes.hole(5) is buffer  # back to the pool
    assert writes.state(5) is WriteState.HOLE and writes.untouched(5)
    writes.staged(5)
    assert writes.state(5) is WriteState.HOLE_STAGED and writes.anything_staged()
    writes.buffer(5, memoryview(bytearray(8)), 0)  # rewritten in part, over the staged hole
    writes.hole(5)  # ... with zeros again
    assert writes.state(5) is WriteState.HOLE_STAGED
    writes.buffer(5, memoryview(bytearray(8)), 8)
    _put(writes, 5, loop)  # data this time: the staged hole is overridden
    writes.written(5, _block(5))
    writes.staged(5)
    writes.buffer(5, memoryview(bytearray(8)), 0)
    writes.hole(5)
    assert writes.state(5) is WriteState.HOLE  # a hole to send (over the staged block)
    assert writes.get(5).staged_at_mds  # type: ignore[union-attr]


def test_a_sent_block_is_read_back_to_be_rewritten(loop):
    writes = BlockWrites()
    _put(writes, 1, loop)
    writes.written(1, _block(1))
    assert writes.take_block(1).block_id == 101
    writes.buffer(1, memoryview(bytearray(4)), 4)
    assert writes.state(1) is WriteState.BUFFERING
    with pytest.raises(IllegalTransition):
        writes.take_block(1)


def test_illegal_moves_are_refused(loop):
    writes = BlockWrites()
    with pytest.raises(IllegalTransition, match="absent"):
        writes.written(0, _block(0))
    with pytest.raises(IllegalTransition):
        writes.hole(0)
    with pytest.raises(IllegalTransition):
        writes.staged(0)
    with pytest.raises(IllegalTransition):
        writes.update(0, memoryview(bytearray(1)), 1)
    writes.buffer(0, memoryview(bytearray(1)), 1)
    with pytest.raises(IllegalTransition, match="BUFFERING"):
        writes.buffer(0, memoryview(bytearray(1)), 1)  # a buffering block changes with update
    with pytest.raises(IllegalTransition):
        writes.staged(0)  # only written blocks and holes are staged
    with pytest.raises(IllegalTransition):
        writes.committed()  # the commit sends buffered blocks first
    _put(writes, 0, loop)
    with pytest.raises(IllegalTransition):
        _put(writes, 0, loop)
    with pytest.raises(IllegalTransition):
        writes.buffer(0, memoryview(bytearray(1)), 1)  # reaped first (the handle waits for it)
    with pytest.raises(IllegalTransition):
        writes.committed()


def test_entries_of_a_state_keep_their_age_and_drop_forgets(loop):
    writes = BlockWrites()
    for idx in (7, 2, 9):
        writes.buffer(idx, memoryview(bytearray(4)), 1)
    writes.update(7, memoryview(bytearray(8)), 8)  # a growing buffer keeps its place
    assert list(writes.in_state(WriteState.BUFFERING)) == [7, 2, 9]
    _put(writes, 7, loop)
    writes.written(7, _block(7))
    writes.staged(7)
    dropped = writes.drop(7)
    assert dropped.state is WriteState.STAGED and not writes.anything_staged()
    assert list(writes.in_state(WriteState.BUFFERING)) == [2, 9] and len(writes) == 2
