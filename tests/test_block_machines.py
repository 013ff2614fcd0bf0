"""The machines that read a block from its chunks (``client/block_reads.py``) and place one
on chunk servers (``client/block_puts.py``), driven in process by fake chunk servers: which
states they go through for a healthy, a degraded and a hedged block, and what they refuse."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from typing import Any

import pytest

from tectofs import checksum, erasure, limits
from tectofs.buffers import BufferPool
from tectofs.client.block_puts import BlockPlacement, PutState
from tectofs.client.block_reads import BlockRead, DownServers, ReadState
from tectofs.errors import CapabilityRefused, ChecksumMismatch, ChunkMissing, ConnectionLost, DataUnavailable, NoSpace
from tectofs.policy import Policy, parse
from tectofs.wire import messages

HANG = "hang"


class _Chunks:
    """A ChunkSource and a ChunkSink: chunk servers by position (reads) or address (puts),
    each answering at once, failing with its fault, or hanging."""

    def __init__(self, chunks: list[bytes] | None = None, faults: dict[Any, Any] | None = None,
                 delays: dict[Any, float] | None = None) -> None:
        self.chunks = chunks or []
        self.faults = faults or {}
        self.delays = delays or {}
        self.buffers = BufferPool(1 << 24)
        self.down = DownServers()
        self.events: Counter[str] = Counter()
        self.asked: list[int] = []
        self.reports: list[tuple[int, str]] = []
        self.stored: dict[int, str] = {}  # position -> address it went to

    async def _answer(self, key: Any) -> None:
        await asyncio.sleep(self.delays.get(key, 0))
        fault = self.faults.get(key)
        if fault == HANG:
            await asyncio.Event().wait()
        if fault is not None:
            raise fault

    async def get_chunk(self, block: messages.Block, chunk: messages.ChunkRef, placed: Any, sink: Any) -> Any:
        self.asked.append(chunk.position)
        await self._answer(chunk.position)
        data = self.chunks[chunk.position]
        payload = self.buffers.get(len(data))
        payload[:] = data
        return payload

    async def report_bad_chunk(self, block: messages.Block, chunk: messages.ChunkRef, reason: str, kind: str) -> None:
        self.reports.append((chunk.position, kind))

    async def decode_into(self, policy: Policy, got: dict[int, Any], out: Any) -> None:
        erasure.decode_into(policy, got, out)

    def note(self, event: str) -> None:
        self.events[event] += 1

    def release_payload(self, payload: Any) -> None:
        if not isinstance(payload, erasure.InPlaceChunk):
            self.buffers.put(payload)

    async def put_chunk(self, address: str, block_id: int, position: int, chunk: Any, crcs: Any, cap: Any) -> None:
        await self._answer(address)
        self.stored[position] = address


def _block(policy: Policy, data: bytes) -> tuple[messages.Block, list[bytes]]:
    chunks = [bytes(c) for c in erasure.encode(policy, data)]
    refs = [messages.ChunkRef(position=p, server_id=p, address=f"127.0.0.1:{1000 + p}", length=len(c),
                              crc=checksum.crc(c)) for p, c in enumerate(chunks)]
    return messages.Block(idx=0, block_id=1, policy=str(policy), length=len(data), valid=len(data), chunks=refs), chunks


def _read(source: _Chunks, block: messages.Block) -> tuple[bytes, BlockRead]:
    machine = BlockRead(source, block, None)

    async def go() -> bytes:
        out = await machine.run()
        assert isinstance(out, memoryview)  # (no target given: a buffer of the pool)
        data = bytes(out)
        source.buffers.put(out)
        return data

    return asyncio.run(go()), machine


POLICY = parse("rs(4,2)")
DATA = os.urandom(3 * erasure.SEGMENT_BYTES + 999)


def test_a_healthy_read_takes_the_data_chunks_and_decodes():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks)
    data, machine = _read(source, block)
    assert data == DATA
    assert sorted(source.asked) == [0, 1, 2, 3]  # data chunks only
    assert machine.visited[-3:] == [ReadState.GATHERED, ReadState.DECODE, ReadState.DONE]
    assert ReadState.REPORT_BAD not in machine.visited and not source.events


def test_failed_chunks_get_stand_ins_and_are_reported_by_kind():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={1: ChunkMissing("gone"), 2: ChecksumMismatch("flipped")})
    data, machine = _read(source, block)
    assert data == DATA
    assert sorted(source.asked) == [0, 1, 2, 3, 4, 5]  # parity stood in
    assert sorted(source.reports) == [(1, "missing"), (2, "corrupt")]
    assert ReadState.REPORT_BAD in machine.visited
    assert source.events["degraded_reads"] == 1 and source.events["checksum_failures"] == 1


def test_an_unreachable_server_is_remembered_and_skipped_next_time():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={0: ConnectionLost("refused")})
    assert _read(source, block)[0] == DATA
    assert source.reports == [(0, "unreachable")] and source.down.is_down(block.chunks[0].address)
    source.faults.clear()
    source.asked.clear()
    assert _read(source, block)[0] == DATA
    assert 0 not in source.asked and source.events["skipped_down_servers"] == 1


def test_a_hung_chunk_is_hedged(monkeypatch):
    monkeypatch.setattr(limits, "hedge_after_min_s", 0.05)
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={3: HANG})
    data, machine = _read(source, block)
    assert data == DATA
    assert ReadState.HEDGE in machine.visited and source.events["hedged_reads"] == 1
    assert not source.reports  # slow is not bad


def test_too_few_chunks_is_data_unavailable_and_a_refused_capability_goes_to_the_caller():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={p: ChunkMissing("gone") for p in (0, 2, 5)})
    with pytest.raises(DataUnavailable, match="only 3 of 4"):
        _read(source, block)
    source = _Chunks(chunks, faults={1: CapabilityRefused("expired")})
    with pytest.raises(CapabilityRefused):
        _read(source, block)
    assert not source.reports


# ---------------------------------------------------------------------- placement


def _allocation(policy: Policy, spares: int = 0, write_min: int = 0) -> messages.Allocation:
    servers = [messages.ServerRef(server_id=s, address=f"s{s}") for s in range(policy.width + spares)]
    return messages.Allocation(block_id=7, policy=str(policy), servers=servers, write_min=write_min)


def _place(sink: _Chunks, allocation: messages.Allocation) -> tuple[messages.Block, BlockPlacement, set[int]]:
    policy = parse(allocation.policy)
    encoded = erasure.encode(policy, DATA)
    crcs = [checksum.piece_and_whole_crcs(c) for c in encoded]
    failed: set[int] = set()
    machine = BlockPlacement(sink, 0, len(DATA), allocation, policy, list(encoded), crcs, failed, {})
    return asyncio.run(machine.run()), machine, failed


def test_a_healthy_placement_puts_each_chunk_on_its_primary():
    block, machine, failed = _place(_Chunks(), _allocation(POLICY, spares=2))
    assert [(c.position, c.address) for c in block.chunks] == [(p, f"s{p}") for p in range(6)]
    assert all(p.visited == [PutState.WAIT, PutState.PLACED] for p in machine.positions) and not failed


def test_a_failed_put_moves_to_a_spare():
    sink = _Chunks(faults={"s2": ConnectionLost("refused")})
    block, machine, failed = _place(sink, _allocation(POLICY, spares=1))
    assert {c.position: c.address for c in block.chunks}[2] == "s6"
    assert machine.positions[2].visited == [PutState.WAIT, PutState.TO_SPARE, PutState.WAIT, PutState.PLACED]
    assert failed == {2} and sink.events["spare_writes"] == 1


def test_a_slow_put_is_hedged_to_a_spare(monkeypatch):
    monkeypatch.setattr(limits, "hedge_after_min_s", 0.05)
    monkeypatch.setattr(limits, "hedge_check_interval_s", 0.01)
    sink = _Chunks(faults={"s4": HANG})  # (write_min: the width, so the block does not give it up instead)
    block, machine, _ = _place(sink, _allocation(POLICY, spares=1, write_min=6))
    assert {c.position: c.address for c in block.chunks}[4] == "s6"
    assert PutState.HEDGE in machine.positions[4].visited and sink.events["hedged_writes"] == 1


def test_without_spares_a_block_is_stored_degraded_down_to_write_min_and_no_further(monkeypatch):
    monkeypatch.setattr(limits, "hedge_after_min_s", 0.05)
    sink = _Chunks(faults={"s5": ConnectionLost("refused")})
    block, _, failed = _place(sink, _allocation(POLICY, write_min=5))
    assert sorted(c.position for c in block.chunks) == [0, 1, 2, 3, 4] and failed == {5}
    assert sink.events["degraded_writes"] == 1
    sink = _Chunks(faults={"s3": HANG})  # a hung server: given up once write_min are durable
    block, _, _ = _place(sink, _allocation(POLICY, write_min=5))
    assert sorted(c.position for c in block.chunks) == [0, 1, 2, 4, 5]
    sink = _Chunks(faults={"s1": ConnectionLost("refused"), "s5": ConnectionLost("refused")})
    with pytest.raises(NoSpace, match="4 of 6 chunks stored"):
        _place(sink, _allocation(POLICY, write_min=5))
