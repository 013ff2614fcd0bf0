"""Background checks of this server's chunks against the metadata service's view.

- ``Scrubber``: re-reads every chunk at a bounded rate (``--scrub-rate``), checking its
  footer, piece crcs and whole crc; a chunk that fails is reported corrupt, and the metadata
  service schedules its rebuild. One pass after another; progress goes out in heartbeats. It
  pauses while clients have writes in flight on this server (a checkpoint burst comes first).
- ``Inventory``: a full report of the chunks on disk (a directory listing, so a chunk file
  deleted behind the server's back is noticed), at start and every ``--inventory-interval``.
  The metadata service marks chunks it expected and the report lacks as missing (rebuilt),
  and collects chunks nobody refers to after a grace period. Between full reports, a read of
  a chunk that is not there is reported at once (``report_missing``).

Both reach the metadata service through its typed operations (``reports.MetadataReports``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

from tectofs import limits
from tectofs.errors import ChecksumMismatch, ChunkMissing, TectofsError
from tectofs.throttle import RateLimiter
from tectofs.wire import messages

from .reports import MetadataReports
from .storage import ChunkStore

log = logging.getLogger("tectofs.chunk.scrub")

InThread = Callable[..., Awaitable[Any]]


class Scrubber:
    def __init__(
        self, store: ChunkStore, metadata: MetadataReports, in_thread: InThread, rate_bytes_per_s: float,
        server_id: Callable[[], int | None], busy: Callable[[], bool] = lambda: False,
        pass_interval_s: float = limits.scrub_pass_interval_s,
    ) -> None:
        self.pass_interval_s = pass_interval_s
        self.store = store
        self.busy = busy  # clients' writes come first: scrubbing waits while they run
        self.metadata = metadata
        self.in_thread = in_thread
        self.limiter = RateLimiter(rate_bytes_per_s)
        self.server_id = server_id
        self.stats = {"scrub_passes": 0, "scrub_pass_chunks": 0, "scrub_pass_checked": 0, "scrub_bytes": 0,
                      "scrub_corrupt": 0, "scrub_pass_started": 0}

    async def run(self) -> None:
        """Scrub forever; one pass is every chunk on disk when it starts, and passes start at
        most every ``pass_interval_s`` (a pass over a large disk at the rate takes longer)."""
        loop = asyncio.get_running_loop()  # its clock: virtual under the simulator, so a seed replays exactly
        while True:
            started = loop.time()
            block_ids = await self.in_thread(self.store.block_ids)
            self.stats.update(scrub_pass_chunks=len(block_ids), scrub_pass_checked=0,
                              scrub_pass_started=int(time.time()))
            for block_id in block_ids:
                await self.check(block_id)
                self.stats["scrub_pass_checked"] += 1
            if block_ids:
                self.stats["scrub_passes"] += 1
            await asyncio.sleep(max(1.0, self.pass_interval_s - (loop.time() - started)))

    async def check(self, block_id: int) -> bool:
        """Verify one chunk; report it if it is damaged. Returns whether it was sound."""
        try:
            size = await self.in_thread(self.store.stored_bytes, block_id)
            await self.limiter.take(size)
            while self.busy():
                await asyncio.sleep(limits.scrub_busy_pause_s)
            await self.in_thread(self.store.verify, block_id)
            self.stats["scrub_bytes"] += size
            return True
        except ChunkMissing:
            return True  # deleted since the listing (GC): nothing to report
        except ChecksumMismatch as exc:
            self.stats["scrub_corrupt"] += 1
            log.error("scrub: %s", exc)
            await report(self.metadata, self.server_id(), block_id, "corrupt", f"scrub: {exc}")
            return False
        except OSError as exc:
            # A chunk the disk cannot read (EIO: a bad sector) is as lost as a damaged one. Before,
            # the error ended the scrubber for the life of the process: the simulator's seed 166
            # (a disk that failed reads for a while) left a bit flipped later unfound for good.
            self.stats["scrub_corrupt"] += 1
            log.error("scrub: chunk %x cannot be read: %s", block_id, exc)
            await report(self.metadata, self.server_id(), block_id, "corrupt", f"scrub: read failed: {exc}")
            return False


async def report(
    metadata: MetadataReports, server_id: int | None, block_id: int, kind: messages.BadChunkKind, reason: str,
) -> None:
    """Tell the metadata service a chunk of ``block_id`` here is corrupt or missing (it finds
    the position from its own records)."""
    if server_id is None:
        return
    try:
        await metadata.report_bad_chunk(messages.ReportBadChunkRequest(
            block_id=block_id, position=0, server_id=server_id, reason=reason[:500], kind=kind,
        ))
    except TectofsError as exc:
        log.warning("could not report chunk %x as %s: %s", block_id, kind, exc)


class Inventory:
    def __init__(self, store: ChunkStore, metadata: MetadataReports, in_thread: InThread,
                 server_id: Callable[[], int | None]) -> None:
        self.store = store
        self.metadata = metadata
        self.in_thread = in_thread
        self.server_id = server_id
        self.stats = {"inventory_reports": 0, "inventory_missing": 0, "inventory_orphans": 0}
        self._missing_reported: set[int] = set()

    async def run(self, interval_s: float) -> None:
        """A full report now and every ``interval_s``; a failed one is tried again sooner."""
        while True:
            try:
                await self.full_report()
                await asyncio.sleep(interval_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("chunk inventory report failed: %s", exc)
                await asyncio.sleep(min(interval_s, 10.0))

    async def full_report(self) -> dict[str, int]:
        server_id = self.server_id()
        if server_id is None:
            raise TectofsError("not registered yet")
        begin = await self.metadata.inventory_begin(messages.InventoryBeginRequest(server_id=server_id))
        block_ids = sorted(await self.in_thread(self.store.block_ids))  # listed after the report began
        totals = {"missing": 0, "orphans": 0}
        batch = limits.inventory_batch_max
        for start in range(0, max(1, len(block_ids)), batch):
            reply = await self.metadata.inventory(messages.InventoryRequest(
                server_id=server_id, report=begin.report, block_ids=block_ids[start : start + batch],
                last=start + batch >= len(block_ids),
            ))
            totals["missing"] += reply.missing
            totals["orphans"] += reply.orphans
        self.stats["inventory_reports"] += 1
        self.stats["inventory_missing"] += totals["missing"]
        self.stats["inventory_orphans"] += totals["orphans"]
        self._missing_reported.clear()
        if totals["missing"] or totals["orphans"]:
            log.warning("inventory: %d chunks the metadata service expected are missing here; %d orphans here",
                        totals["missing"], totals["orphans"])
        return totals

    async def report_missing(self, block_id: int) -> None:
        """A client asked for a chunk that is not here: tell the metadata service (once per
        chunk until the next full report); it marks it only if a block places it here."""
        if block_id in self._missing_reported or len(self._missing_reported) >= 100_000:
            return
        self._missing_reported.add(block_id)
        await report(self.metadata, self.server_id(), block_id, "missing", "not on disk when read")
