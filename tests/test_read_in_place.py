"""Chunks received straight into the reader's buffer (``erasure.InPlaceChunk`` through a
``protocol.Scatter``): the bytes are right, and a straggler's reply that arrives after the
read returned never writes into the caller's memory."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
from typing import cast

from prometheus_client import CollectorRegistry

from tectofs import checksum, erasure, limits
from tectofs.buffers import BufferPool
from tectofs.client.blocks import BlockIO
from tectofs.metrics import ClientMetrics
from tectofs.policy import parse
from tectofs.wire import messages
from tectofs.wire.client import RpcClient


class _Servers:
    """Stands in for the RPC client: each chunk server answers get_chunk at once, except
    ``hung``, which sends the first half of its reply and then stalls."""

    def __init__(self, chunks: dict[str, bytes], hung: str) -> None:
        self.chunks = chunks
        self.hung = hung
        self.stalled: list = []  # the hung server's scatters, to finish "late"
        self.buffers = BufferPool(1 << 24)

    async def call(self, address, op, header, payload=b"", *, receive_into=None, **options):
        data = self.chunks[address]
        if address == self.hung:
            scatter = receive_into.scatter(len(data))
            half = len(data) // 2
            while scatter.filled < half:
                region = scatter.region()[: half - scatter.filled]
                region[:] = data[scatter.filled : scatter.filled + len(region)]
                scatter.advance(len(region))
            self.stalled.append(scatter)
            await asyncio.Event().wait()  # hung
        reply = self.buffers.get(len(data))
        reply[:] = data
        return {}, reply


def test_a_straggler_finishing_after_the_read_writes_nothing_into_the_callers_buffer(monkeypatch):
    monkeypatch.setattr(limits, "hedge_after_min_s", 0.05)
    policy = parse("rs(4,2)")
    data = os.urandom(3 * erasure.SEGMENT_BYTES + 999)
    chunks = erasure.encode(policy, data)
    addresses = [f"127.0.0.1:{1000 + p}" for p in range(policy.width)]
    block = messages.Block(
        idx=0, block_id=1, policy=str(policy), length=len(data), valid=len(data),
        chunks=[messages.ChunkRef(position=p, server_id=p, address=addresses[p], length=len(c), crc=checksum.crc(c))
                for p, c in enumerate(chunks)],
    )
    servers = _Servers({addresses[p]: bytes(c) for p, c in enumerate(chunks)}, hung=addresses[1])
    with cf.ThreadPoolExecutor(2) as executor:
        io = BlockIO(cast(RpcClient, servers), "127.0.0.1:1", executor, BufferPool(1 << 26), ClientMetrics(CollectorRegistry()))

        async def read_then_straggle() -> bytes:
            into = memoryview(bytearray(len(data)))
            await io.read_block(block, into)
            got = bytes(into)
            for scatter in servers.stalled:  # the hung server wakes up and sends the rest
                while scatter.filled < scatter.total:
                    region = scatter.region()
                    region[:] = b"\xff" * len(region)
                    scatter.advance(len(region))
            await asyncio.sleep(0.05)
            assert bytes(into) == got, "a late reply wrote into the caller's buffer"
            return got

        assert asyncio.run(read_then_straggle()) == data
    assert servers.stalled and io.stats["hedged_reads"] == 1


def test_a_diverted_sink_never_hands_out_the_callers_buffers_again():
    """A reply that arrives after the caller diverted its sink (e.g. in the loop turn a cancelled
    wait still spends on Python 3.11) goes to an ordinary buffer; a diverted scatter lets the
    caller's buffers go at once."""
    from tectofs.wire.client import ReplySink

    target = memoryview(bytearray(100))
    sink = ReplySink(lambda n: [target[:n]])
    first = sink.scatter(50)
    assert first is not None and first.views
    sink.divert()
    assert first.diverted and first.views == []  # nothing holds ``target`` any more
    assert sink.scatter(50) is None
    assert not sink.complete and sink.received_bytes == 0


def test_a_reply_for_a_call_no_longer_waiting_is_not_scattered():
    from tectofs.wire.client import ReplySink, _ClientConnection

    async def main() -> None:
        conn = _ClientConnection("127.0.0.1:1")
        target = memoryview(bytearray(10))
        sink = ReplySink(lambda n: [target])
        waiting = asyncio.get_running_loop().create_future()
        conn.pending[5], conn.sinks[5] = waiting, sink
        conn.decoder._request_id = 5
        waiting.cancel()  # the caller stopped waiting, its cleanup not yet run
        buffer = conn._allocate_reply({}, 10)
        assert not sink.scatters and callable(buffer)  # an ordinary (deferred) buffer

    asyncio.run(main())
