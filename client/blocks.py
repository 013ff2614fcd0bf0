"""Moving one block to and from chunk servers: encode, checksum, parallel put with spares;
parallel get, end-to-end verification, degraded decode, and reports of bad chunks (the
metadata service has them rebuilt). Every get and put carries the block's capability from
the layout or allocation (``tectofs.wire.auth``).

Blocks are ``tectofs.wire.messages.Block`` values (as in a layout); allocations are
``messages.Allocation``. This module moves a block's ``length`` stored bytes; where they sit
in the block (``start``) and what reads as zeros around them is the caller's business
(``client/files.py``).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any, Awaitable, Callable

from tectofs import checksum, erasure, limits
from tectofs.buffers import BufferPool
from tectofs.errors import Busy, ChecksumMismatch, ConnectionLost, NoSpace, TectofsError
from tectofs.metrics import ClientMetrics
from tectofs.policy import Policy
from tectofs.policy import parse as parse_policy
from tectofs.regions import Regions
from tectofs.wire import messages
from tectofs.wire.client import ReplySink, RpcClient

from .block_puts import BlockPlacement
from .block_reads import BlockRead, consume_outcome
from .server_health import DownServers

log = logging.getLogger("tectofs.client")

# Encoding or checksumming this many bytes or fewer runs on the event loop: measured here
# (python3 -m tectofs.benchmarks.loop_compute), rs(4,2) of 64 KiB takes 110-180 us and rep(3)
# 7-15 us, a hand-off to a codec thread and back 220-300 us.
LOOP_COMPUTE_BYTES_MAX = 64 * 1024

Reallocate = Callable[[set[int]], Awaitable[messages.Allocation]]

__all__ = ["BlockIO", "DownServers", "Reallocate", "consume_outcome"]


class BlockIO:
    """Block-level data path shared by every open file of one client."""

    def __init__(
        self, rpc: RpcClient, meta_address: str, executor: Executor, buffers: BufferPool, metrics: ClientMetrics,
    ) -> None:
        """``buffers`` backs block buffers, encoded chunks and received chunks; ``rpc`` must
        receive reply payloads into it. Events go to ``stats`` (this client's counts) and to
        ``metrics`` (the process's)."""
        self.buffers = buffers
        self.rpc = rpc
        self.meta_address = meta_address
        self.executor = executor
        self.metrics = metrics
        self.stats = {"degraded_reads": 0, "degraded_writes": 0, "spare_writes": 0, "hedged_writes": 0, "hedged_reads": 0,
                      "bad_chunks": 0, "checksum_failures": 0, "skipped_down_servers": 0, "chunk_gets": 0,
                      "hedges_refused": 0, "servers_set_aside": 0}
        self.down = DownServers(on_set_aside=self._tell_set_aside)
        self._last_get: dict[str, tuple[messages.Block, messages.ChunkRef]] = {}  # address -> a chunk asked of it
        self._telling: set[asyncio.Task[None]] = set()
        # Policies encoded before: the first encode of an rs policy in a process checks ISA-L
        # against pyeclib (~50 ms here), on a codec thread whatever the block's size.
        self._encoded: set[Policy] = set()
        # rs policies whose decode check (erasure.check_direct_decode) a parity get started
        self._decode_checks: dict[Policy, asyncio.Future[None]] = {}

    def note(self, event: str) -> None:
        self.stats[event] += 1
        self.metrics.event(event)

    async def _compute(self, size: int, fn: Any, *args: Any, on_loop: bool = True) -> Any:
        """``fn(*args)``, which encodes or checksums ``size`` bytes: on the event loop when
        ``on_loop`` and ``size`` is at most :data:`LOOP_COMPUTE_BYTES_MAX` (a thread hand-off
        costs more than the work: a small file's block, a mostly-hole block), else on a codec thread."""
        if on_loop and size <= LOOP_COMPUTE_BYTES_MAX:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # ------------------------------------------------------------------ write

    async def write_block(
        self, idx: int, data: memoryview, allocation: messages.Allocation, reallocate: Reallocate | None = None
    ) -> messages.Block:
        """Encode ``data`` under the allocation's policy and store every chunk on a distinct
        server, falling back to the allocation's spare servers; returns the block descriptor
        to commit. If the servers run out, ``reallocate(failed_server_ids)`` is asked for a
        fresh placement (at most ``limits.placement_attempts_max`` times in all) before NoSpace
        is raised."""
        policy = parse_policy(allocation.policy)
        encoded = await self.encode(policy, data)
        return await self.place_block(idx, len(data), encoded, allocation, reallocate)

    async def encode(self, policy: Any, data: memoryview | Regions) -> tuple[list[Any], list[tuple[list[int], int]]]:
        """The block's chunks under ``policy`` and their (piece, whole) crcs, computed on a codec
        thread, or on the loop for a small block of a policy encoded before (``_compute``)
        (``data``: one buffer, or several end to end). rs chunks are pool buffers of their
        own: ``data`` is not needed any more once this returns. rep chunks are ``data`` itself
        (joined into one buffer if it came in several)."""
        seen = policy in self._encoded
        self._encoded.add(policy)
        return await self._compute(len(data), _encode_and_checksum, policy, data, self.buffers.get, on_loop=seen)

    async def place_block(
        self, idx: int, length: int, encoded: tuple[list[Any], list[tuple[list[int], int]]],
        allocation: messages.Allocation, reallocate: Reallocate | None = None,
    ) -> messages.Block:
        """Store chunks ``encode`` made for a block of ``length`` bytes, as ``write_block`` does;
        gives rs chunk buffers back to the pool when done, whatever happened."""
        policy = parse_policy(allocation.policy)
        chunks, crcs = encoded
        failed: set[int] = set()
        busy: dict[int, str] = {}  # of the failed servers, those that answered BUSY (admission): id -> address
        try:
            for attempt in range(limits.placement_attempts_max):
                try:
                    return await BlockPlacement(self, idx, length, allocation, policy, chunks, crcs, failed, busy).run()
                except NoSpace:
                    if reallocate is None or not failed or attempt + 1 == limits.placement_attempts_max:
                        raise
                    log.info("block %d: servers %s failed; asking for a new placement", idx, sorted(failed))
                    self.metrics.retried("chunk", "placement")
                    try:
                        allocation = await reallocate(failed)
                    except NoSpace as exc:
                        if not busy:
                            raise
                        # The servers are live, just full: say so, not "0 are live" (the
                        # metadata service was asked to leave out every server that failed).
                        raise Busy(
                            f"block {idx}: {len(busy)} of the {len(failed)} chunk servers that failed it are busy"
                            f" (their in-flight admission budget is taken: {', '.join(sorted(busy.values()))});"
                            f" none other is left ({exc}); retry later") from None
            raise AssertionError("unreachable")
        finally:
            if policy.kind == "rs":
                for chunk in chunks:
                    self.buffers.put(chunk)

    async def put_chunk(
        self, address: str, block_id: int, position: int, chunk: Any, crcs: tuple[list[int], int],
        cap: messages.Capability | None,
    ) -> None:
        pieces, whole = crcs
        request = messages.PutChunkRequest(block_id=block_id, position=position, crcs=pieces, crc=whole, cap=cap)
        await self.rpc.call(address, messages.PUT_CHUNK, request, chunk)

    # ------------------------------------------------------------------ read

    async def read_block(self, block: messages.Block, into: "memoryview | Regions | None" = None) -> "memoryview | Regions":
        """Return the block's ``length`` bytes, reading any ``needed`` chunks in parallel,
        data chunks first; parity (or other replicas) stand in for chunks that are missing,
        unreachable or fail their checksum, and such chunks are reported (the metadata service
        rebuilds them). One :class:`~tectofs.client.block_reads.BlockRead` (its states are there).

        The block is decoded into ``into`` (exactly the block's length: one buffer, or several
        end to end) when given, saving a copy; otherwise into a buffer of the pool, which the caller gives back with
        ``self.buffers.put`` when done. The data chunks of an rs block are received straight
        into their place there (``erasure.InPlaceChunk``): with all of them, nothing is copied.
        Nothing writes into ``into`` once this returns or raises."""
        return await BlockRead(self, block, into).run()

    async def decode_into(self, policy: Policy, got: dict[int, Any], out: "memoryview | Regions") -> None:
        """Decode the chunks ``got`` (by position) into ``out`` on a codec thread."""
        check = self._decode_checks.get(policy)
        if check is not None and not check.done():
            await asyncio.shield(check)  # (else the decode would run the same check again, at once)
        decoding = asyncio.get_running_loop().run_in_executor(self.executor, erasure.decode_into, policy, got, out)
        try:
            await asyncio.shield(decoding)
        except asyncio.CancelledError:
            await asyncio.wait([decoding])  # it writes into a caller's buffer: finish before returning
            raise

    def release_payload(self, payload: Any) -> None:
        """Give a received chunk's buffer back to the pool (one received in place has none)."""
        if not isinstance(payload, erasure.InPlaceChunk):
            self.buffers.put(payload)

    async def get_chunk(
        self, block: messages.Block, chunk: messages.ChunkRef, placed: erasure.InPlaceChunk | None,
        sink: ReplySink | None,
    ) -> Any:
        """Chunk ``chunk`` of ``block``, verified against its recorded crc: a buffer of the pool,
        or ``placed`` when ``sink`` received it there."""
        if not chunk.address:
            raise ConnectionLost(f"chunk server {chunk.server_id} is not registered")
        self._last_get[chunk.address] = (block, chunk)
        policy = parse_policy(block.policy)
        if chunk.position >= policy.data and policy.kind == "rs" and policy not in self._decode_checks:
            self._decode_checks[policy] = asyncio.get_running_loop().run_in_executor(
                self.executor, erasure.check_direct_decode, policy)
        request = messages.GetChunkRequest(block_id=block.block_id, cap=block.cap)
        self.stats["chunk_gets"] += 1  # (the process's metrics count gets by outcome: chunk_done)
        try:
            _, payload = await self.rpc.call(chunk.address, messages.GET_CHUNK, request, retries_max=1, receive_into=sink)
        finally:
            if sink is not None:
                sink.divert()  # done, failed or cancelled: no later byte goes into the block
        self.down.answered(chunk.address)
        if placed is not None and sink is not None and sink.complete:
            whole = await self._compute(chunk.length, checksum.crc_joined, placed.pieces)
            if whole != chunk.crc:
                raise ChecksumMismatch(f"chunk from {chunk.address} does not match the checksum recorded at write")
            return placed
        if len(payload) != chunk.length:
            self.buffers.put(payload)
            raise ChecksumMismatch(f"chunk of {len(payload)} bytes where {chunk.length} were written")
        whole = await self._compute(len(payload), checksum.crc, payload)
        if whole != chunk.crc:
            self.buffers.put(payload)
            raise ChecksumMismatch(f"chunk from {chunk.address} does not match the checksum recorded at write")
        return payload

    async def report_bad_chunk(
        self, block: messages.Block, chunk: messages.ChunkRef, reason: str, kind: messages.BadChunkKind,
    ) -> None:
        """Tell the metadata service; "corrupt" and "missing" chunks get rebuilt."""
        self.note("bad_chunks")
        try:
            await self.rpc.call(
                self.meta_address, messages.REPORT_BAD_CHUNK,
                messages.ReportBadChunkRequest(block_id=block.block_id, position=chunk.position,
                                               server_id=chunk.server_id, reason=reason[:500], kind=kind),
                retries_max=0, timeout_s=5,
            )
        except TectofsError:
            pass

    def _tell_set_aside(self, address: str) -> None:
        """Tell the metadata service, in the background, of a server this client set aside (an
        "unreachable" report: ``server/meta/set_aside.py``)."""
        asked = self._last_get.get(address)
        if asked is None:
            return
        block, chunk = asked
        request = messages.ReportBadChunkRequest(block_id=block.block_id, position=chunk.position,
                                                 server_id=chunk.server_id, kind="unreachable",
                                                 reason="no answer within its deadline: set aside")
        task = asyncio.get_running_loop().create_task(self._tell(request))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    async def _tell(self, request: messages.ReportBadChunkRequest) -> None:
        try:
            await self.rpc.call(self.meta_address, messages.REPORT_BAD_CHUNK, request, retries_max=0, timeout_s=5)
        except TectofsError:
            pass


def _encode_and_checksum(
    policy: Any, data: memoryview | Regions, allocate: Any
) -> tuple[list[Any], list[tuple[list[int], int]]]:
    chunks = erasure.encode(policy, data, allocate)
    if policy.kind == "rep":
        sums = checksum.piece_and_whole_crcs(chunks[0])
        return chunks, [sums] * len(chunks)
    return chunks, [checksum.piece_and_whole_crcs(c) for c in chunks]
