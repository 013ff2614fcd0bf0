"""Reading one block from its chunks: a small state machine (``BlockIO.read_block`` runs one).

::

    LAUNCH --(needed chunks in flight: data first, chunks on servers known down last)--> WAIT
    WAIT   --a chunk arrived, fewer than needed-------------------------------------> LAUNCH
           --a chunk failed (missing, corrupt, unreachable): a stand-in from parity-> LAUNCH
           --a chunk late against its server's deadline, or its server set aside---> HEDGE
           --as many chunks as the policy needs-----------------------------------> GATHERED
    HEDGE  --one more chunk in flight (budget allowing), the late one still awaited---> WAIT
    GATHERED --late stragglers' servers set aside; stragglers cancelled and diverted;
               anything failed or skipped?----------------------------------------> REPORT_BAD | DECODE
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
from typing import Any, Protocol

from tectofs import erasure
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

from .server_health import DownServers

__all__ = ["BlockRead", "ChunkSource", "DownServers", "ReadState", "consume_outcome"]


CHECK_INTERVAL_S = 0.05  # a read waiting on a get that may be hedged looks again at least this often
LATE_TOLERANCE_S = 1e-6  # a get this close to its deadline counts as late (see BlockRead._late)


class ReadState(enum.Enum):
    LAUNCH = "launch"          # put chunk gets in flight until the policy's needed count is
    WAIT = "wait"              # wait for one, at most until the hedge threshold
    HEDGE = "hedge"            # a straggler: one more chunk from the rest
    GATHERED = "gathered"      # enough chunks: stop the others
    REPORT_BAD = "report_bad"  # tell the metadata service of the chunks that failed
    DECODE = "decode"          # rebuild the block into its target
    DONE = "done"


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
        # (Chunks the metadata service flags: another client set their server aside lately.)
        self.known_down = {p for p, c in self.by_position.items() if c.set_aside or source.down.is_down(c.address)}
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
        self.started: dict[asyncio.Task[Any], float] = {}  # loop time each get went out
        self.hedged: set[asyncio.Task[Any]] = set()  # gets a hedge went out for
        self.refused: set[asyncio.Task[Any]] = set()  # late gets the hedge budget refused a hedge
        self.flagged: set[asyncio.Task[Any]] = set()  # gets whose server was set aside while they ran
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
        done, _ = await asyncio.wait(list(self.running), timeout=self._next_check(),
                                     return_when=asyncio.FIRST_COMPLETED)
        if not done:
            return ReadState.HEDGE
        for task in done:
            self._settle(self.running.pop(task), task)
        return ReadState.GATHERED if len(self.got) >= self.policy.needed else ReadState.LAUNCH

    async def _hedge(self) -> ReadState:
        """Hedged reads: a get late against its server's deadline (``server_health``) gets a
        stand-in from the remaining chunks, if the hedge budget allows; a get to a server set
        aside (just now, for going unanswered too long, or by another read) gets one always.
        The late get is still awaited: the first ``needed`` to arrive are used."""
        assert self.loop is not None
        now = self.loop.time()
        down = self.source.down
        for task, position in list(self.running.items()):
            address = self.by_position[position].address
            deadline = self._deadline(address)
            if task not in self.flagged and self._late(task, down.latencies.set_aside_after(deadline), now):
                self.flagged.add(task)
                down.late(address)
                self.source.note("servers_set_aside")
            if task in self.hedged or not self.candidates:
                continue
            if down.is_down(address):
                pass  # presumed gone: this hedge replaces the get, it adds no load
            elif not self._late(task, deadline, now) or task in self.refused:
                continue
            elif not down.budget.take():
                self.refused.add(task)
                self.source.note("hedges_refused")
                continue
            self.hedged.add(task)
            self.source.note("hedged_reads")
            self._fetch_next()
        return ReadState.WAIT

    async def _gathered(self) -> ReadState:
        assert self.loop is not None
        now = self.loop.time()
        for task, position in self.running.items():  # late past its deadline and not needed: set aside
            address = self.by_position[position].address
            if task not in self.flagged and self._late(task, self._deadline(address), now):
                self.source.down.late(address)
                self.source.note("servers_set_aside")
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
        # The first candidate not on a server set aside (one may have been set aside since the
        # read began), else the first.
        down = self.source.down
        at = next((i for i, p in enumerate(self.candidates) if not down.is_down(self.by_position[p].address)), 0)
        position = self.candidates.pop(at)
        self.launched.add(position)
        down.budget.requested()
        assert self.loop is not None
        task = self.loop.create_task(self._fetch(position))
        self.running[task] = position
        self.started[task] = self.loop.time()

    async def _fetch(self, position: int) -> Any:
        assert self.loop is not None
        started = self.loop.time()
        chunk = self.by_position[position]
        payload = await self.source.get_chunk(self.block, chunk, self.placed.get(position), self.sinks.get(position))
        took = self.loop.time() - started
        self.finished_s.append(took)
        self.source.down.latencies.record(chunk.address, took)
        return payload

    def _deadline(self, address: str | None) -> float:
        """How long a get to ``address`` may run before it is late (``ServerLatencies.deadline``;
        the gets of this block that arrived count once half the needed ones did)."""
        siblings = self.finished_s if len(self.finished_s) >= max(1, self.policy.needed // 2) else None
        return self.source.down.latencies.deadline(address, siblings)

    def _late(self, task: asyncio.Task[Any], after_s: float, now: float) -> bool:
        """Has ``task`` run ``after_s`` or longer? Compared as ``_next_check`` computes its wake-up
        moment (``started + after_s``), so a wait that ends at that moment finds the get late: with
        ``now - started < after_s`` instead, rounding can leave it "not yet late" by 1e-16 s and the
        read waits again for no time at all, forever under a virtual clock. ``LATE_TOLERANCE_S``
        absorbs the rounding of the wait's own timer (``loop.time() + timeout``)."""
        return now + LATE_TOLERANCE_S >= self.started[task] + after_s

    def _next_check(self) -> float | None:
        """How long to wait for the gets in flight before ``_hedge`` looks at them again: until
        the next one is late or unanswered long enough to set its server aside, at most
        ``CHECK_INTERVAL_S`` (another read may set a server aside meanwhile); None: never."""
        assert self.loop is not None
        now = self.loop.time()
        down = self.source.down
        moments = []
        for task, position in self.running.items():
            address = self.by_position[position].address
            deadline = self._deadline(address)
            if task not in self.hedged and self.candidates:
                if down.is_down(address):
                    return 0.0
                moments.append(now + CHECK_INTERVAL_S)
                if task not in self.refused:
                    moments.append(self.started[task] + deadline)
            if task not in self.flagged:
                moments.append(self.started[task] + down.latencies.set_aside_after(deadline))
        return max(0.0, min(moments) - now) if moments else None

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
