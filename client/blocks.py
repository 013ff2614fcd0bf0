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
import statistics
import time
from concurrent.futures import Executor
from typing import Any, Awaitable, Callable

from tectofs import checksum, erasure, limits
from tectofs.buffers import BufferPool
from tectofs.errors import (
    Busy,
    CapabilityRefused,
    ChecksumMismatch,
    ChunkMissing,
    ConnectionLost,
    DataUnavailable,
    InvalidArgument,
    NoSpace,
    TectofsError,
    Timeout,
)
from tectofs.metrics import ClientMetrics
from tectofs.policy import parse as parse_policy
from tectofs.regions import Regions
from tectofs.wire import messages
from tectofs.wire.client import ReplySink, RpcClient

log = logging.getLogger("tectofs.client")

Reallocate = Callable[[set[int]], Awaitable[messages.Allocation]]

# Errors after which another server should be tried for the same chunk.
_SERVER_FAILURES = (ConnectionLost, Timeout, Busy, NoSpace, ChecksumMismatch)


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
                      "bad_chunks": 0, "checksum_failures": 0, "skipped_down_servers": 0}
        self.down = DownServers()

    def _note(self, event: str) -> None:
        self.stats[event] += 1
        self.metrics.event(event)

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
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
        thread (``data``: one buffer, or several end to end). rs chunks are pool buffers of their
        own: ``data`` is not needed any more once this returns. rep chunks are ``data`` itself
        (joined into one buffer if it came in several)."""
        return await self._in_thread(_encode_and_checksum, policy, data, self.buffers.get)

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
                    return await self._place(idx, length, allocation, policy, chunks, crcs, failed, busy)
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

    async def _place(
        self, idx: int, length: int, allocation: messages.Allocation, policy: Any, chunks: list[Any],
        crcs: list[Any], failed: set[int], busy: dict[int, str],
    ) -> messages.Block:
        """Put chunk ``p`` on primary server ``p``. A put that fails moves to a spare; a put
        that is much slower than its siblings is *hedged*: the same chunk also goes to a spare
        and the first to succeed wins (Tectonic's hedged writes). Losers' copies are deleted by
        the MDS's GC after commit.

        The block is accepted once at least ``allocation.write_min`` chunks are durable (a degraded
        write: an allocation with fewer servers than ``width`` when servers are missing, or
        chunks no server took); the MDS records what is missing for repair. Fewer: NoSpace."""
        servers = list(allocation.servers)
        primaries, spares = servers[: policy.width], servers[policy.width :]
        block_id = allocation.block_id
        finished_s: list[float] = []
        loop = asyncio.get_running_loop()

        async def attempt(position: int, server: messages.ServerRef) -> messages.ChunkRef:
            started = loop.time()
            try:
                await self._put(server.address, block_id, position, chunks[position], crcs[position], allocation.cap)
            except _SERVER_FAILURES as exc:
                failed.add(server.server_id)
                if isinstance(exc, Busy):
                    busy[server.server_id] = server.address or str(server.server_id)
                raise
            finished_s.append(loop.time() - started)
            return messages.ChunkRef(
                position=position, server_id=server.server_id, address=server.address,
                length=len(chunks[position]), crc=crcs[position][1],
            )

        def hedge_delay(started: float) -> float | None:
            if not spares or len(finished_s) < max(1, policy.width // 2):
                return None
            threshold = max(limits.hedge_after_min_s, limits.hedge_slowdown_factor * statistics.median(finished_s))
            return max(0.0, started + threshold - loop.time())

        async def place(position: int) -> messages.ChunkRef:
            started = loop.time()
            pending = {loop.create_task(attempt(position, primaries[position]))}
            hedged = False
            errors: list[str] = []
            try:
                while True:
                    delay = None if hedged else hedge_delay(started)
                    done, pending = await asyncio.wait(
                        pending, timeout=delay if delay is not None else limits.hedge_check_interval_s,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                    for task in done:
                        if task.exception() is None:
                            return task.result()
                        exc = task.exception()
                        if not isinstance(exc, _SERVER_FAILURES):
                            raise exc  # type: ignore[misc]
                        errors.append(str(exc))
                    if not done and (delay is None or hedged):
                        continue  # re-check the hedge threshold as siblings finish
                    if not done or not pending:
                        if not spares:
                            if pending:
                                continue
                            raise NoSpace(f"block {block_id} chunk {position}: no chunk server accepted it ({'; '.join(errors)})")
                        spare = spares.pop(0)
                        if done:
                            self._note("spare_writes")
                        else:
                            hedged = True
                            self._note("hedged_writes")
                        log.info("chunk %d of block %d also goes to spare %s", position, block_id, spare.address)
                        pending.add(loop.create_task(attempt(position, spare)))
            finally:
                for task in pending:
                    task.cancel()
                if pending:  # a put being sent by a thread reads its chunk until it stopped
                    await asyncio.wait(pending)

        tasks = [loop.create_task(place(p)) for p in range(len(primaries))]
        block_started = loop.time()
        try:
            await self._until_placed(tasks, allocation.write_min or policy.write_min, finished_s, block_started)
        except BaseException:  # cancelled: so are the puts
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise
        outcomes = [None if t.cancelled() else (t.exception() or t.result()) for t in tasks]  # None: given up
        placed = [o for o in outcomes if isinstance(o, messages.ChunkRef)]
        unexpected = [o for o in outcomes if isinstance(o, BaseException) and not isinstance(o, NoSpace)]
        if unexpected:
            raise unexpected[0]
        minimum = allocation.write_min or policy.write_min
        if len(placed) < minimum:
            reasons = "; ".join(str(o) for o in outcomes if isinstance(o, BaseException))
            raise NoSpace(
                f"block {block_id}: {len(placed)} of {policy.width} chunks stored, {policy} needs at least"
                f" {minimum}" + (f" ({reasons})" if reasons else "")
            )
        if len(placed) < policy.width:
            self._note("degraded_writes")
            log.info("block %d stored degraded: %d of %d chunks", block_id, len(placed), policy.width)
        return messages.Block(  # the write capability also reads it back (a partial block patched before commit)
            idx=idx, block_id=block_id, policy=str(policy), length=length, valid=length, chunks=placed,
            cap=allocation.cap,
        )

    @staticmethod
    async def _until_placed(
        tasks: list[asyncio.Task[messages.ChunkRef]], write_min: int, finished_s: list[float], started: float
    ) -> None:
        """Wait for every chunk's placement, except stragglers: once ``write_min`` chunks are
        durable, a chunk still unplaced ``hedge_slowdown_factor`` x the median put time (and at
        least ``hedge_after_min_s``) after the block started is given up — a hung server costs
        a block a second or two, not a timeout — and the block is stored degraded."""
        loop = asyncio.get_running_loop()
        pending = set(tasks)
        while pending:
            timeout = None
            placed = sum(1 for t in tasks if t.done() and not t.cancelled() and t.exception() is None)
            if placed >= write_min and finished_s:
                threshold = max(limits.hedge_after_min_s, limits.hedge_slowdown_factor * statistics.median(finished_s))
                timeout = max(0.0, started + threshold - loop.time())
            done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done and timeout is not None:
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending)
                return

    async def _put(
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
        unreachable or fail their checksum, and such chunks are reported (the metadata service rebuilds them).

        The block is decoded into ``into`` (exactly the block's length: one buffer, or several
        end to end) when given, saving a copy; otherwise into a buffer of the pool, which the caller gives back with
        ``self.buffers.put`` when done. The data chunks of an rs block are received straight
        into their place there (``erasure.InPlaceChunk``): with all of them, nothing is copied.
        Nothing writes into ``into`` once this returns or raises."""
        policy = parse_policy(block.policy)
        if into is not None and len(into) != block.length:
            raise InvalidArgument(f"decode target of {len(into)} bytes for a block of {block.length}")
        by_position = {c.position: c for c in block.chunks}
        # Data chunks first (with all of them, decoding is a copy), but chunks on servers this
        # client just found down last: parity from live servers stands in at once, without a
        # failed connection and its retry per block. They are still tried if nothing else is left.
        known_down = {p for p, c in by_position.items() if self.down.is_down(c.address)}
        candidates = sorted(by_position, key=lambda p: (p in known_down, p))
        out: memoryview | Regions
        pooled: memoryview | None
        if into is None:
            out = pooled = self.buffers.get(block.length)
        else:
            out, pooled = into, None
        placed = {p: erasure.InPlaceChunk(policy, p, out) for p in by_position if policy.kind == "rs" and p < policy.data}
        sinks = {p: _sink_for(chunk, by_position[p].length) for p, chunk in placed.items()}
        launched: set[int] = set()
        got: dict[int, Any] = {}
        failed: dict[int, str] = {}
        corrupt: list[int] = []
        missing: list[int] = []  # the server answered that it does not have the chunk
        running: dict[asyncio.Task[Any], int] = {}
        finished_s: list[float] = []
        loop = asyncio.get_running_loop()

        async def fetch(position: int) -> Any:
            started = loop.time()
            payload = await self._get(block, by_position[position], placed.get(position), sinks.get(position))
            finished_s.append(loop.time() - started)
            return payload

        def launch() -> None:
            position = candidates.pop(0)
            launched.add(position)
            running[loop.create_task(fetch(position))] = position

        try:
            try:
                while len(got) < policy.needed:
                    while candidates and len(got) + len(running) < policy.needed:
                        launch()  # first the needed ones, then stand-ins for failures
                    if not running:
                        raise DataUnavailable(
                            f"block {block.block_id}: only {len(got)} of {policy.needed} needed chunks readable; "
                            + "; ".join(f"chunk {p}: {why}" for p, why in sorted(failed.items()))
                        )
                    # Hedged read: a chunk much slower than its siblings (a hung server) gets a
                    # stand-in from the remaining chunks instead of waiting for the RPC timeout.
                    hedge = len(finished_s) >= max(1, policy.needed // 2) and bool(candidates)
                    delay = (max(limits.hedge_after_min_s, limits.hedge_slowdown_factor * statistics.median(finished_s))
                             if hedge else None)
                    done, _ = await asyncio.wait(list(running), timeout=delay, return_when=asyncio.FIRST_COMPLETED)
                    if not done:
                        self._note("hedged_reads")
                        launch()
                        continue
                    for task in done:
                        position = running.pop(task)
                        exc = task.exception()
                        if exc is None:
                            got[position] = task.result()
                        elif isinstance(exc, CapabilityRefused):
                            raise exc  # the layout's capability expired (or was refused): the caller fetches a new one
                        elif isinstance(exc, ChecksumMismatch):
                            self._note("checksum_failures")
                            failed[position] = str(exc)
                            corrupt.append(position)
                        elif isinstance(exc, (TectofsError, OSError)):
                            failed[position] = str(exc)
                            if isinstance(exc, ChunkMissing):
                                missing.append(position)
                            elif isinstance(exc, (ConnectionLost, Timeout)):
                                self.down.mark(by_position[position].address)
                        else:
                            raise exc
            finally:
                for task in running:
                    task.cancel()
                    task.add_done_callback(consume_outcome)  # a stand-in that failed after we stopped waiting
                for sink in sinks.values():
                    sink.divert()  # a straggler's bytes no longer land in ``out`` (now, not when its task unwinds)
            for position in list(got)[policy.needed :]:  # a hedge and its original both arrived
                self._release(got.pop(position))
            skipped = {p for p in known_down if p not in launched and p < policy.needed}  # parity read instead
            if skipped:
                self._note("skipped_down_servers")
            if failed or skipped:
                self._note("degraded_reads")
                for position in failed:
                    kind: messages.BadChunkKind = "corrupt" if position in corrupt else "missing" if position in missing else "unreachable"
                    await self._report(block, by_position[position], failed[position], kind)
            decoding = asyncio.get_running_loop().run_in_executor(self.executor, erasure.decode_into, policy, got, out)
            try:
                await asyncio.shield(decoding)
            except asyncio.CancelledError:
                await asyncio.wait([decoding])  # it writes into a caller's buffer: finish before returning
                raise
        except BaseException:
            if pooled is not None:
                self.buffers.put(pooled)
            raise
        finally:
            for payload in got.values():
                self._release(payload)
        return out

    def _release(self, payload: Any) -> None:
        """Give a received chunk's buffer back to the pool (one received in place has none)."""
        if not isinstance(payload, erasure.InPlaceChunk):
            self.buffers.put(payload)

    async def _get(
        self, block: messages.Block, chunk: messages.ChunkRef, placed: erasure.InPlaceChunk | None = None,
        sink: ReplySink | None = None,
    ) -> Any:
        """Chunk ``chunk`` of ``block``, verified against its recorded crc: a buffer of the pool,
        or ``placed`` when ``sink`` received it there."""
        if not chunk.address:
            raise ConnectionLost(f"chunk server {chunk.server_id} is not registered")
        request = messages.GetChunkRequest(block_id=block.block_id, cap=block.cap)
        try:
            _, payload = await self.rpc.call(chunk.address, messages.GET_CHUNK, request, retries_max=1, receive_into=sink)
        finally:
            if sink is not None:
                sink.divert()  # done, failed or cancelled: no later byte goes into the block
        self.down.answered(chunk.address)
        if placed is not None and sink is not None and sink.complete:
            whole = await self._in_thread(checksum.crc_joined, placed.pieces)
            if whole != chunk.crc:
                raise ChecksumMismatch(f"chunk from {chunk.address} does not match the checksum recorded at write")
            return placed
        if len(payload) != chunk.length:
            self.buffers.put(payload)
            raise ChecksumMismatch(f"chunk of {len(payload)} bytes where {chunk.length} were written")
        whole = await self._in_thread(checksum.crc, payload)
        if whole != chunk.crc:
            self.buffers.put(payload)
            raise ChecksumMismatch(f"chunk from {chunk.address} does not match the checksum recorded at write")
        return payload

    async def _report(
        self, block: messages.Block, chunk: messages.ChunkRef, reason: str, kind: messages.BadChunkKind,
    ) -> None:
        """Tell the metadata service; "corrupt" and "missing" chunks get rebuilt."""
        self._note("bad_chunks")
        try:
            await self.rpc.call(
                self.meta_address, messages.REPORT_BAD_CHUNK,
                messages.ReportBadChunkRequest(block_id=block.block_id, position=chunk.position,
                                               server_id=chunk.server_id, reason=reason[:500], kind=kind),
                retries_max=0, timeout_s=5,
            )
        except TectofsError:
            pass


class DownServers:
    """Chunk servers this client recently failed to reach (connection refused, lost or timed
    out), so that reads try other chunks first for ``limits.server_down_memo_s``. Advice only:
    a server marked down is still asked when no other chunk is left, and a chunk it serves
    clears the mark."""

    def __init__(self, memo_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.memo_s = limits.server_down_memo_s if memo_s is None else memo_s
        self.clock = clock
        self._until: dict[str, float] = {}

    def mark(self, address: str | None) -> None:
        if address:
            self._until[address] = self.clock() + self.memo_s

    def answered(self, address: str) -> None:
        self._until.pop(address, None)

    def is_down(self, address: str | None) -> bool:
        if not address or address not in self._until:
            return False
        if self.clock() >= self._until[address]:
            del self._until[address]
            return False
        return True


def _sink_for(placed: erasure.InPlaceChunk, chunk_length: int) -> ReplySink:
    """Receive a chunk of the recorded length into its place (any other length: into a buffer of
    the pool, and the length check fails it)."""
    fits = sum(len(piece) for piece in placed.pieces) == chunk_length  # (a layout that disagrees: not placed)
    return ReplySink(lambda n: placed.pieces if fits and n == chunk_length else None)


def consume_outcome(task: "asyncio.Task[Any]") -> None:
    """Retrieve a finished task's outcome that nobody waits for any more (no "never retrieved")."""
    if not task.cancelled():
        task.exception()


def _encode_and_checksum(
    policy: Any, data: memoryview | Regions, allocate: Any
) -> tuple[list[Any], list[tuple[list[int], int]]]:
    chunks = erasure.encode(policy, data, allocate)
    if policy.kind == "rep":
        sums = checksum.piece_and_whole_crcs(chunks[0])
        return chunks, [sums] * len(chunks)
    return chunks, [checksum.piece_and_whole_crcs(c) for c in chunks]
