"""Rebuilding chunks on this server, as the metadata service orders (heartbeat replies).

For an order ``(block, position, sources)``: a source at ``position`` itself (a server being
drained) is copied; otherwise ``needed`` other chunks are pulled from their servers, each
checked against the crc the metadata service recorded, and only the missing chunk is
reconstructed (``erasure.reconstruct``). The result is checked against the recorded crc
when there is one, stored durably, and reported (``repair_done``): only then does the
metadata service place it here. A source that fails its checksum is reported corrupt.
Reports go through the chunk server's typed calls to the metadata service (``reports.py``).

Bounded per server: ``concurrency`` rebuilds at once, and the bytes pulled from peers pass a
``RateLimiter`` (``--repair-rate``), and a slower one while clients have writes in flight on
this server (``limits.repair_busy_rate_bytes_per_s``), so a checkpoint keeps its speed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from tectofs import checksum, erasure, limits
from tectofs.errors import AlreadyExists, ChecksumMismatch, ChunkMissing, DataUnavailable, TectofsError
from tectofs.policy import parse as parse_policy
from tectofs.throttle import RateLimiter
from tectofs.wire import messages
from tectofs.wire.client import RpcClient

from .reports import MetadataReports, RepairReport, operation_name, send
from .storage import ChunkStore

log = logging.getLogger("tectofs.chunk.repair")


class Repairer:
    def __init__(
        self, store: ChunkStore, peers: RpcClient, metadata: MetadataReports, in_thread: Callable[..., Awaitable[Any]],
        concurrency: int, rate_bytes_per_s: float, deletes_done: Callable[[], Awaitable[Any]] | None = None,
        busy: Callable[[], bool] = lambda: False, busy_rate_bytes_per_s: float = limits.repair_busy_rate_bytes_per_s,
    ) -> None:
        self.store = store
        self.peers = peers
        self.metadata = metadata
        self.in_thread = in_thread
        self.limiter = RateLimiter(rate_bytes_per_s)
        # While clients write to this server, rebuilds slow to this rate: a checkpoint burst keeps
        # its speed, and a rebuild still progresses under a never-ending stream of writes.
        self.busy = busy
        self.busy_limiter = RateLimiter(busy_rate_bytes_per_s)
        self._slots = asyncio.Semaphore(concurrency)
        self._running: dict[tuple[int, int], asyncio.Task[None]] = {}
        self.server_id = 0
        self.stats = {"repairs_done": 0, "repairs_failed": 0, "repair_bytes": 0, "repairs_running": 0}
        self.on_idle: Callable[[], None] = lambda: None
        # Waits for every delete order received so far: one for this block sent before the
        # rebuild was ordered must not remove the rebuilt chunk.
        self.deletes_done = deletes_done
        # Outcomes the metadata service did not hear (it was restarting): sent again after the
        # next heartbeat it answers. A rebuilt chunk it never hears of is never placed, and a
        # block whose other chunks fail meanwhile would look unreadable though it is not.
        self.unreported: dict[tuple[int, int], RepairReport] = {}

    def submit(self, order: messages.RepairOrder) -> None:
        """Start an order unless the same one is already running (a heartbeat resent it)."""
        key = (order.block_id, order.position)
        if key in self._running:
            return
        task = asyncio.get_running_loop().create_task(self._run(order))
        self._running[key] = task
        task.add_done_callback(lambda _: self._finished(key))

    def _finished(self, key: tuple[int, int]) -> None:
        self._running.pop(key, None)
        if not self._running:
            self.on_idle()

    async def close(self) -> None:
        for task in list(self._running.values()):
            task.cancel()

    async def _run(self, order: messages.RepairOrder) -> None:
        async with self._slots:
            self.stats["repairs_running"] += 1
            try:
                length, crc = await self._rebuild(order)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats["repairs_failed"] += 1
                log.warning("rebuild of chunk %d of block %d failed: %s", order.position, order.block_id, exc)
                await self._tell(messages.RepairFailedRequest(
                    block_id=order.block_id, position=order.position, server_id=self.server_id,
                    reason=str(exc)[:500], occupied=isinstance(exc, AlreadyExists),
                ))
                return
            finally:
                self.stats["repairs_running"] -= 1
            self.stats["repairs_done"] += 1
            await self._tell(messages.RepairDoneRequest(
                block_id=order.block_id, position=order.position, server_id=self.server_id, length=length, crc=crc,
            ))

    async def _tell(self, report: RepairReport) -> bool:
        """Report one outcome; one that does not get through is kept for ``resend_reports``
        (the newest outcome per chunk wins). Returns whether it got through."""
        key = (report.block_id, report.position)
        try:
            await send(self.metadata, report)
        except TectofsError as exc:
            log.warning("could not report %s for block %d: %s (sent again after the next heartbeat)",
                        operation_name(report), report.block_id, exc)
            if len(self.unreported) < limits.repair_unreported_max or key in self.unreported:
                self.unreported[key] = report
            return False
        self.unreported.pop(key, None)
        return True

    async def resend_reports(self) -> int:
        """Send the outcomes the metadata service did not hear, oldest first; stops at the
        first that fails again. Returns how many got through. The service accepts a late
        ``repair_done`` whose chunk still fits the block's placement, and orphans it otherwise."""
        sent = 0
        for key, report in list(self.unreported.items()):
            if self.unreported.get(key) != report:
                continue  # a newer outcome for that chunk was reported meanwhile
            if isinstance(report, messages.RepairDoneRequest):
                report = await self._still_stored(report)
            if not await self._tell(report):
                break
            sent += 1
        return sent

    async def _still_stored(
        self, done: messages.RepairDoneRequest,
    ) -> messages.RepairDoneRequest | messages.RepairFailedRequest:
        """A late ``repair_done`` stands only if its chunk is still on disk, intact and as
        rebuilt: one lost or damaged since (the report waited for the service) would be placed
        as sound. Otherwise it becomes ``repair_failed``, and the block is scheduled again."""
        try:
            info = await self.in_thread(self.store.verify, done.block_id)
            if (info.position, info.whole_crc) != (done.position, done.crc):
                raise ChunkMissing(f"chunk {done.block_id:x} here is now position {info.position},"
                                   f" crc {info.whole_crc:08x}")
        except (ChecksumMismatch, ChunkMissing) as exc:
            log.warning("rebuilt chunk %d of block %d was lost before its report got through: %s",
                        done.position, done.block_id, exc)
            return messages.RepairFailedRequest(
                block_id=done.block_id, position=done.position, server_id=done.server_id,
                reason=f"rebuilt chunk lost before its report: {exc}"[:500], occupied=False,
            )
        return done

    async def _rebuild(self, order: messages.RepairOrder) -> tuple[int, int]:
        policy = parse_policy(order.policy)
        own = [s for s in order.sources if s.position == order.position]
        if own:  # a move: the chunk itself is readable
            data = await self._fetch(order.block_id, own[0])
        else:
            data = await self._reconstruct(order, policy)
        crcs, whole = await self.in_thread(checksum.piece_and_whole_crcs, data)
        if order.crc is not None and whole != order.crc:
            raise ChecksumMismatch(
                f"rebuilt chunk has crc {whole:08x}, the metadata service recorded {order.crc:08x}; not stored"
            )
        if self.deletes_done is not None:
            await self.deletes_done()
        await self.in_thread(self.store.write, order.block_id, order.position, memoryview(data), crcs, whole, True)
        self.stats["repair_bytes"] += len(data)
        return len(data), whole

    async def _reconstruct(self, order: messages.RepairOrder, policy: Any) -> Any:
        """Pull ``needed`` verified chunks (data chunks first: fewer decodes), then rebuild."""
        candidates = sorted((s for s in order.sources if s.position != order.position), key=lambda s: s.position)
        got: dict[int, Any] = {}
        failures: list[str] = []
        while len(got) < policy.needed:
            wanted = policy.needed - len(got)
            batch, candidates = candidates[:wanted], candidates[wanted:]
            if not batch:
                raise DataUnavailable(
                    f"only {len(got)} of the {policy.needed} chunks needed could be read: " + "; ".join(failures)
                )
            results = await asyncio.gather(*(self._fetch(order.block_id, s) for s in batch), return_exceptions=True)
            for source, result in zip(batch, results):
                if isinstance(result, BaseException):
                    if not isinstance(result, (TectofsError, OSError)):
                        raise result
                    failures.append(f"chunk {source.position} on server {source.server_id}: {result}")
                else:
                    got[source.position] = result
        rebuilt = await self.in_thread(erasure.reconstruct, policy, got, [order.position], order.length)
        return rebuilt[order.position]

    async def _fetch(self, block_id: int, source: messages.ChunkRef) -> Any:
        """A whole chunk from its server, checked against its recorded crc (a bad one is
        reported, so it gets rebuilt too)."""
        if not source.address:
            raise ChunkMissing(f"chunk server {source.server_id} is not registered")
        await self.limiter.take(source.length)
        if self.busy():
            await self.busy_limiter.take(source.length)
        try:
            _, payload = await self.peers.call(source.address, messages.GET_CHUNK,
                                               messages.GetChunkRequest(block_id=block_id), retries_max=1)
            whole = await self.in_thread(checksum.crc, payload)
            if len(payload) != source.length or whole != source.crc:
                raise ChecksumMismatch(f"chunk from {source.address} does not match the crc recorded at write")
        except (ChecksumMismatch, ChunkMissing) as exc:
            kind: messages.BadChunkKind = "corrupt" if isinstance(exc, ChecksumMismatch) else "missing"
            await self._tell(messages.ReportBadChunkRequest(
                block_id=block_id, position=source.position, server_id=source.server_id,
                reason=f"rebuild source: {exc}"[:500], kind=kind,
            ))
            raise
        return payload


