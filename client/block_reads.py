"""Reading one block from its chunks: a small state machine (``BlockIO.read_block`` runs one).

::

    LAUNCH --(needed chunks in flight: data first, chunks on servers known down last)--> WAIT
    WAIT   --a chunk arrived, fewer than needed-------------------------------------> LAUNCH
           --a chunk failed (missing, corrupt, unreachable): a stand-in from parity-> LAUNCH
           --one chunk much slower than its siblings---------------------------------> HEDGE
           --as many chunks as the policy needs-----------------------------------> GATHERED
    HEDGE  --one more chunk in flight, the slow one still awaited--------------------> WAIT
    GATHERED --stragglers cancelled and diverted; anything failed or skipped?--> REPORT_BAD | DECODE
    REPORT_BAD --the metadata service told (it rebuilds corrupt and missing chunks)--> DECODE
    DECODE --decoded into the target (a copy when every data chunk came)------------> DONE

    LAUNCH with nothing left to launch and nothing in flight: DataUnavailable.
    A refused capability ends the read at once (the caller fetches a fresh layout and retries:
    ``AsyncFile._read_block``).

The machine does no I/O of its own: the chunk gets, the reports and the decode are asked of
a :class:`ChunkSource` (``BlockIO`` is one; ``tests/test_block_machines.py`` has a fake).
"""

from __future__ import annotations

import asyncio
import enum
import statistics
import time
from typing import Any, Callable, Protocol

from tectofs import erasure, limits
from tectofs.buffers import BufferPool
from tectofs.errors import (
    CapabilityRefused,
    ChecksumMismatch,
    ChunkMissing,
    ConnectionLost,
    DataUnavailable,
    InvalidArgument,
    TectofsError,
    Timeout,
)
from tectofs.policy import Policy
from tectofs.policy import parse as parse_policy
from tectofs.regions import Regions
from tectofs.wire import messages
from tectofs.wire.client import ReplySink


class ReadState(enum.Enum):
    LAUNCH = "launch"          # put chunk gets in flight until the policy's needed count is
    WAIT = "wait"              # wait for one, at most until the hedge threshold
    HEDGE = "hedge"            # a straggler: one more chunk from the rest
    GATHERED = "gathered"      # enough chunks: stop the others
    REPORT_BAD = "report_bad"  # tell the metadata service of the chunks that failed
    DECODE = "decode"          # rebuild the block into its target
    DONE = "done"


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


class ChunkSource(Protocol):
    """What a block read needs of the client's block I/O (``BlockIO``)."""

    buffers: BufferPool
    down: DownServers

    async def get_chunk(self, block: messages.Block, chunk: messages.ChunkRef,
                        placed: erasure.InPlaceChunk | None, sink: ReplySink | None) -> Any: ...

    async def report_bad_chunk(self, block: messages.Block, chunk: messages.ChunkRef, reason: str,
                               kind: messages.BadChunkKind) -> None: ...

    async def decode_into(self, policy: Policy, got: dict[int, Any], out: memoryview | Regions) -> None: ...

    def note(self, event: str) -> None: ...

    def release_payload(self, payload: Any) -> None: ...


class BlockRead:
    """One read of one block (``run`` once). See the module's docstring for its states."""

    def __init__(self, source: ChunkSource, block: messages.Block, into: memoryview | Regions | None) -> None:
        self.source = source
        self.block = block
        self.policy = parse_policy(block.policy)
        if into is not None and len(into) != block.length:
            raise InvalidArgument(f"decode target of {len(into)} bytes for a block of {block.length}")
        self.by_position = {c.position: c for c in block.chunks}
        # Data chunks first (with all of them, decoding is a copy), but chunks on servers this
        # client just found down last: parity from live servers stands in at once, without a
        # failed connection and its retry per block. They are still tried if nothing else is left.
        self.known_down = {p for p, c in self.by_position.items() if source.down.is_down(c.address)}
        self.candidates = sorted(self.by_position, key=lambda p: (p in self.known_down, p))
        self.into = into
        self.out: memoryview | Regions | None = None
        self.pooled: memoryview | None = None
        self.placed: dict[int, erasure.InPlaceChunk] = {}
        self.sinks: dict[int, ReplySink] = {}
        self.launched: set[int] = set()
        self.got: dict[int, Any] = {}
        self.failed: dict[int, str] = {}
        self.kinds: dict[int, messages.BadChunkKind] = {}
        self.running: dict[asyncio.Task[Any], int] = {}
        self.finished_s: list[float] = []
        self.loop: asyncio.AbstractEventLoop | None = None  # the running loop, once running
        self.state = ReadState.LAUNCH
        self.visited = [ReadState.LAUNCH]  # the states this read went through, in order (for tests and logs)
        self._steps = {
            ReadState.LAUNCH: self._launch, ReadState.WAIT: self._wait, ReadState.HEDGE: self._hedge,
            ReadState.GATHERED: self._gathered, ReadState.REPORT_BAD: self._report_bad,
            ReadState.DECODE: self._decode,
        }

    async def run(self) -> memoryview | Regions:
        """The block's bytes, in ``into`` or in a pool buffer (the caller gives it back).
        Nothing writes into the target once this returns or raises."""
        assert self.state is ReadState.LAUNCH and self.loop is None, "a BlockRead runs once"
        self.loop = asyncio.get_running_loop()
        self._prepare_target()
        try:
            try:
                while self.state is not ReadState.DONE:
                    self.state = await self._steps[self.state]()
                    self.visited.append(self.state)
            finally:
                self._stop_fetches()
        except BaseException:
            if self.pooled is not None:
                self.source.buffers.put(self.pooled)
            raise
        finally:
            for payload in self.got.values():
                self.source.release_payload(payload)
        assert self.out is not None
        return self.out

    def _prepare_target(self) -> None:
        """The target, and the data chunks of an rs block received straight into their place
        there (``erasure.InPlaceChunk``): with all of them, nothing is copied."""
        if self.into is None:
            self.out = self.pooled = self.source.buffers.get(self.block.length)
        else:
            self.out = self.into
        policy = self.policy
        if policy.kind == "rs":
            self.placed = {p: erasure.InPlaceChunk(policy, p, self.out) for p in self.by_position if p < policy.data}
        self.sinks = {p: _sink_for(chunk, self.by_position[p].length) for p, chunk in self.placed.items()}

    # ------------------------------------------------------------------ states

    async def _launch(self) -> ReadState:
        """First the needed chunks, then stand-ins for failures."""
        while self.candidates and len(self.got) + len(self.running) < self.policy.needed:
            self._fetch_next()
        if not self.running:
            raise DataUnavailable(
                f"block {self.block.block_id}: only {len(self.got)} of {self.policy.needed} needed chunks readable; "
                + "; ".join(f"chunk {p}: {why}" for p, why in sorted(self.failed.items()))
            )
        return ReadState.WAIT

    async def _wait(self) -> ReadState:
        done, _ = await asyncio.wait(list(self.running), timeout=self._hedge_delay(),
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            return ReadState.HEDGE
        for task in done:
            self._settle(self.running.pop(task), task)
        return ReadState.GATHERED if len(self.got) >= self.policy.needed else ReadState.LAUNCH

    async def _hedge(self) -> ReadState:
        """Hedged read: a chunk much slower than its siblings (a hung server) gets a stand-in
        from the remaining chunks instead of waiting for the RPC timeout."""
        self.source.note("hedged_reads")
        self._fetch_next()
        return ReadState.WAIT

    async def _gathered(self) -> ReadState:
        self._stop_fetches()
        for position in list(self.got)[self.policy.needed :]:  # a hedge and its original both arrived
            self.source.release_payload(self.got.pop(position))
        if self._skipped():
            self.source.note("skipped_down_servers")
        return ReadState.REPORT_BAD if self.failed or self._skipped() else ReadState.DECODE

    async def _report_bad(self) -> ReadState:
        self.source.note("degraded_reads")
        for position, reason in self.failed.items():
            await self.source.report_bad_chunk(self.block, self.by_position[position], reason, self.kinds[position])
        return ReadState.DECODE

    async def _decode(self) -> ReadState:
        assert self.out is not None
        await self.source.decode_into(self.policy, self.got, self.out)
        return ReadState.DONE

    # ------------------------------------------------------------------ helpers

    def _fetch_next(self) -> None:
        position = self.candidates.pop(0)
        self.launched.add(position)
        assert self.loop is not None
        self.running[self.loop.create_task(self._fetch(position))] = position

    async def _fetch(self, position: int) -> Any:
        assert self.loop is not None
        started = self.loop.time()
        payload = await self.source.get_chunk(
            self.block, self.by_position[position], self.placed.get(position), self.sinks.get(position))
        self.finished_s.append(self.loop.time() - started)
        return payload

    def _hedge_delay(self) -> float | None:
        """How long to wait for the chunks in flight before hedging (None: no hedge, nothing
        left to hedge with or too few siblings timed yet)."""
        if len(self.finished_s) < max(1, self.policy.needed // 2) or not self.candidates:
            return None
        return max(limits.hedge_after_min_s, limits.hedge_slowdown_factor * statistics.median(self.finished_s))

    def _settle(self, position: int, task: asyncio.Task[Any]) -> None:
        """Record a finished get: the chunk, or why it failed (and what to report)."""
        exc = task.exception()
        if exc is None:
            self.got[position] = task.result()
        elif isinstance(exc, CapabilityRefused):
            raise exc  # the layout's capability expired (or was refused): the caller fetches a new one
        elif isinstance(exc, ChecksumMismatch):
            self.source.note("checksum_failures")
            self.failed[position], self.kinds[position] = str(exc), "corrupt"
        elif isinstance(exc, (TectofsError, OSError)):
            self.failed[position] = str(exc)
            self.kinds[position] = "missing" if isinstance(exc, ChunkMissing) else "unreachable"
            if isinstance(exc, (ConnectionLost, Timeout)):
                self.source.down.mark(self.by_position[position].address)
        else:
            raise exc

    def _skipped(self) -> set[int]:
        """Data chunks on servers known down that were never asked for: parity read instead."""
        return {p for p in self.known_down if p not in self.launched and p < self.policy.needed}

    def _stop_fetches(self) -> None:
        """No straggler's bytes land in the target from here on (now, not when its task
        unwinds), and a stand-in that fails after we stopped waiting is not reported unseen."""
        for task in self.running:
            task.cancel()
            task.add_done_callback(consume_outcome)
        self.running.clear()
        for sink in self.sinks.values():
            sink.divert()


def _sink_for(placed: erasure.InPlaceChunk, chunk_length: int) -> ReplySink:
    """Receive a chunk of the recorded length into its place (any other length: into a buffer of
    the pool, and the length check fails it)."""
    fits = sum(len(piece) for piece in placed.pieces) == chunk_length  # (a layout that disagrees: not placed)
    return ReplySink(lambda n: placed.pieces if fits and n == chunk_length else None)


def consume_outcome(task: "asyncio.Task[Any]") -> None:
    """Retrieve a finished task's outcome that nobody waits for any more (no "never retrieved")."""
    if not task.cancelled():
        task.exception()
