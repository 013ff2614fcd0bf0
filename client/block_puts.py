"""Placing one encoded block on chunk servers: small state machines (``BlockIO.place_block``
runs one :class:`BlockPlacement` per allocation it tries).

Each chunk position has its own machine (:class:`ChunkPlacement`)::

    WAIT --put succeeded---------------------------------------------------> PLACED
         --every put of it failed (refused, lost, timed out, BUSY, corrupt)--> TO_SPARE
         --the put is hedge_slowdown_factor x slower than its siblings'-----> HEDGE
         --still going, nothing to decide yet (re-checked as siblings finish)-> WAIT
    TO_SPARE --the next spare of the allocation gets the chunk--------------> WAIT
             --no spare left: NoSpace for this chunk
    HEDGE --the same chunk also goes to a spare; the first to succeed wins--> WAIT
          --no spare left: keep waiting for the slow one--------------------> WAIT

and the block (:class:`BlockPlacement`) puts every position at once, then waits until every
chunk is placed, except stragglers: once ``write_min`` chunks are durable, a chunk still
unplaced ``hedge_slowdown_factor`` x the median put time (at least ``hedge_after_min_s``)
after the block started is given up, and the block is stored degraded (the metadata service
records the missing positions for repair). Fewer than ``write_min``: NoSpace, and
``place_block`` asks for a new placement without the servers that failed. Losers' copies
(a hedge's or a given-up put's) are deleted by the metadata service's GC after the commit.

No I/O here: puts and counts are asked of a :class:`ChunkSink` (``BlockIO``);
``tests/test_block_machines.py`` drives the machines with a fake.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import statistics
from typing import Any, Protocol

from tectofs import limits
from tectofs.errors import Busy, ChecksumMismatch, ConnectionLost, NoSpace, Timeout
from tectofs.policy import Policy
from tectofs.wire import messages

log = logging.getLogger("tectofs.client")

# Errors after which another server should be tried for the same chunk.
SERVER_FAILURES = (ConnectionLost, Timeout, Busy, NoSpace, ChecksumMismatch)


class PutState(enum.Enum):
    WAIT = "wait"          # puts of the chunk in flight: its primary's, then spares'
    TO_SPARE = "to_spare"  # every put so far failed: the next spare
    HEDGE = "hedge"        # a put much slower than its siblings': a spare too
    PLACED = "placed"


class ChunkSink(Protocol):
    """What placing a block needs of the client's block I/O (``BlockIO``)."""

    async def put_chunk(self, address: str, block_id: int, position: int, chunk: Any, crcs: tuple[list[int], int],
                        cap: messages.Capability | None) -> None: ...

    def note(self, event: str) -> None: ...


class BlockPlacement:
    """One try at storing a block's chunks on one allocation's servers (``run`` once).
    ``failed`` and ``busy`` collect the servers that failed (and, of them, those that
    answered BUSY: id -> address) across the tries of one block."""

    def __init__(
        self, sink: ChunkSink, idx: int, length: int, allocation: messages.Allocation, policy: Policy,
        chunks: list[Any], crcs: list[Any], failed: set[int], busy: dict[int, str],
    ) -> None:
        self.sink = sink
        self.idx = idx
        self.length = length
        self.allocation = allocation
        self.policy = policy
        self.chunks = chunks
        self.crcs = crcs
        self.failed = failed
        self.busy = busy
        servers = list(allocation.servers)
        self.primaries, self.spares = servers[: policy.width], servers[policy.width :]
        self.block_id = allocation.block_id
        self.write_min = allocation.write_min or policy.write_min
        self.finished_s: list[float] = []  # how long each successful put took
        self.positions: list[ChunkPlacement] = []  # one machine per chunk position, once running
        self.loop: asyncio.AbstractEventLoop | None = None  # the running loop, once running

    async def run(self) -> messages.Block:
        self.loop = loop = asyncio.get_running_loop()
        self.positions = [ChunkPlacement(self, p) for p in range(len(self.primaries))]
        tasks = [loop.create_task(position.run()) for position in self.positions]
        try:
            await self._until_placed(tasks, loop.time())
        except BaseException:  # cancelled: so are the puts
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            raise
        return self._judge(tasks)

    async def _until_placed(self, tasks: list[asyncio.Task[messages.ChunkRef]], started: float) -> None:
        """Wait for every chunk's placement, except stragglers once ``write_min`` are durable:
        a hung server costs a block a second or two, not a timeout."""
        loop = self._loop()
        pending = set(tasks)
        while pending:
            timeout = None
            placed = sum(1 for t in tasks if t.done() and not t.cancelled() and t.exception() is None)
            if placed >= self.write_min and self.finished_s:
                timeout = max(0.0, started + self.hedge_threshold_s() - loop.time())
            done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            if not done and timeout is not None:
                for task in pending:
                    task.cancel()
                await asyncio.wait(pending)
                return

    def _judge(self, tasks: list[asyncio.Task[messages.ChunkRef]]) -> messages.Block:
        """The block stored (whole or degraded), or NoSpace below ``write_min``."""
        placed, failures = _outcomes(tasks)
        unexpected = [f for f in failures if not isinstance(f, NoSpace)]
        if unexpected:
            raise unexpected[0]
        width = self.policy.width
        if len(placed) < self.write_min:
            reasons = "; ".join(str(f) for f in failures)
            raise NoSpace(
                f"block {self.block_id}: {len(placed)} of {width} chunks stored, {self.policy} needs at least"
                f" {self.write_min}" + (f" ({reasons})" if reasons else "")
            )
        if len(placed) < width:
            self.sink.note("degraded_writes")
            log.info("block %d stored degraded: %d of %d chunks", self.block_id, len(placed), width)
        return messages.Block(  # the write capability also reads it back (a partial block patched before commit)
            idx=self.idx, block_id=self.block_id, policy=str(self.policy), length=self.length, valid=self.length,
            chunks=placed, cap=self.allocation.cap,
        )

    def _loop(self) -> asyncio.AbstractEventLoop:
        assert self.loop is not None, "BlockPlacement.run first"
        return self.loop

    def hedge_threshold_s(self) -> float:
        return max(limits.hedge_after_min_s, limits.hedge_slowdown_factor * statistics.median(self.finished_s))

    def hedge_delay(self, started: float) -> float | None:
        """How long a chunk started at ``started`` may still take before it is hedged (None:
        no spare to hedge with, or too few siblings finished to judge)."""
        if not self.spares or len(self.finished_s) < max(1, self.policy.width // 2):
            return None
        return max(0.0, started + self.hedge_threshold_s() - self._loop().time())

    async def put(self, position: int, server: messages.ServerRef) -> messages.ChunkRef:
        """Chunk ``position`` on ``server``; a server that fails it is remembered in ``failed``."""
        loop = self._loop()
        started = loop.time()
        try:
            await self.sink.put_chunk(server.address, self.block_id, position, self.chunks[position],
                                      self.crcs[position], self.allocation.cap)
        except SERVER_FAILURES as exc:
            self.failed.add(server.server_id)
            if isinstance(exc, Busy):
                self.busy[server.server_id] = server.address or str(server.server_id)
            raise
        self.finished_s.append(loop.time() - started)
        return messages.ChunkRef(
            position=position, server_id=server.server_id, address=server.address,
            length=len(self.chunks[position]), crc=self.crcs[position][1],
        )


def _outcomes(tasks: list[asyncio.Task[messages.ChunkRef]]) -> tuple[list[messages.ChunkRef], list[BaseException]]:
    """The chunks placed, and the errors of those that were not (a chunk given up has none)."""
    placed: list[messages.ChunkRef] = []
    failures: list[BaseException] = []
    for task in tasks:
        if task.cancelled():
            continue
        exc = task.exception()
        if exc is None:
            placed.append(task.result())
        else:
            failures.append(exc)
    return placed, failures


class ChunkPlacement:
    """One chunk position of a block being placed (``run`` once): see the module docstring."""

    def __init__(self, block: BlockPlacement, position: int) -> None:
        self.block = block
        self.position = position
        self.pending: set[asyncio.Task[messages.ChunkRef]] = set()
        self.hedged = False
        self.errors: list[str] = []
        self.placed: messages.ChunkRef | None = None
        self.state = PutState.WAIT
        self.visited = [PutState.WAIT]  # the states it went through (a WAIT repeated counts once)
        self._steps = {PutState.WAIT: self._wait, PutState.TO_SPARE: self._to_spare, PutState.HEDGE: self._hedge}

    async def run(self) -> messages.ChunkRef:
        loop = self.block._loop()
        self.started = loop.time()
        self.pending.add(loop.create_task(self.block.put(self.position, self.block.primaries[self.position])))
        try:
            while self.state is not PutState.PLACED:
                state = await self._steps[self.state]()
                if state is not self.state:
                    self.visited.append(state)
                self.state = state
        finally:
            for task in self.pending:
                task.cancel()
            if self.pending:  # a put being sent by a thread reads its chunk until it stopped
                await asyncio.wait(self.pending)
        assert self.placed is not None
        return self.placed

    async def _wait(self) -> PutState:
        delay = None if self.hedged else self.block.hedge_delay(self.started)
        done, self.pending = await asyncio.wait(
            self.pending, timeout=delay if delay is not None else limits.hedge_check_interval_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        for task in done:
            exc = task.exception()
            if exc is None:
                self.placed = task.result()
                return PutState.PLACED
            if not isinstance(exc, SERVER_FAILURES):
                raise exc
            self.errors.append(str(exc))
        if not done:  # timed out: hedge at the threshold, else re-check it as siblings finish
            return PutState.WAIT if delay is None or self.hedged else PutState.HEDGE
        return PutState.WAIT if self.pending else PutState.TO_SPARE

    async def _to_spare(self) -> PutState:
        if not self.block.spares:
            raise NoSpace(f"block {self.block.block_id} chunk {self.position}: no chunk server accepted it"
                          f" ({'; '.join(self.errors)})")
        self.block.sink.note("spare_writes")
        self._also_to_spare()
        return PutState.WAIT

    async def _hedge(self) -> PutState:
        if not self.block.spares:
            return PutState.WAIT
        self.hedged = True
        self.block.sink.note("hedged_writes")
        self._also_to_spare()
        return PutState.WAIT

    def _also_to_spare(self) -> None:
        spare = self.block.spares.pop(0)
        log.info("chunk %d of block %d also goes to spare %s", self.position, self.block.block_id, spare.address)
        self.pending.add(self.block._loop().create_task(self.block.put(self.position, spare)))
