"""A chunk server's rebuild outcomes reach the metadata service even when it was away at the
moment a rebuild finished: they are kept and sent again after the next heartbeat."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from tectofs import checksum
from tectofs.errors import ConnectionLost
from tectofs.server.chunk.repair import Repairer
from tectofs.server.chunk.reports import RepairReport
from tectofs.server.chunk.storage import ChunkStore
from tectofs.wire import messages


class FlakyService:
    """The metadata service's operations a rebuild reports by (``MetadataReports``); away
    until ``up``, and then it hears each report (in ``heard``)."""

    def __init__(self) -> None:
        self.up = False
        self.heard: list[RepairReport] = []

    def _hear(self, report: RepairReport) -> messages.Empty:
        if not self.up:
            raise ConnectionLost("the metadata service is restarting")
        self.heard.append(report)
        return messages.Empty()

    async def report_bad_chunk(self, request: messages.ReportBadChunkRequest) -> messages.Empty:
        return self._hear(request)

    async def repair_done(self, request: messages.RepairDoneRequest) -> messages.Empty:
        return self._hear(request)

    async def repair_failed(self, request: messages.RepairFailedRequest) -> messages.Empty:
        return self._hear(request)

    async def inventory_begin(self, request: messages.InventoryBeginRequest) -> messages.InventoryBeginReply:
        raise AssertionError("a rebuild sends no inventory")

    async def inventory(self, request: messages.InventoryRequest) -> messages.InventoryReply:
        raise AssertionError("a rebuild sends no inventory")


def _repairer(service: FlakyService, store: ChunkStore) -> Repairer:
    return Repairer(store, None, service, asyncio.to_thread, concurrency=1, rate_bytes_per_s=1e9)  # type: ignore[arg-type]


def _rebuilt(store: ChunkStore, block_id: int, position: int, data: bytes) -> messages.RepairDoneRequest:
    """A chunk as a rebuild leaves it on disk, and the repair_done that reports it."""
    store.write(block_id, position, memoryview(data), checksum.piece_crcs(data), checksum.crc(data), True)
    return messages.RepairDoneRequest(block_id=block_id, position=position, server_id=5, length=len(data),
                                      crc=checksum.crc(data))


def test_outcomes_the_service_missed_are_sent_after_it_returns(tmp_path: Path) -> None:
    service = FlakyService()
    store = ChunkStore(str(tmp_path))
    repairer = _repairer(service, store)
    done = _rebuilt(store, 8, 3, os.urandom(5080))

    async def scenario() -> None:
        failed = messages.RepairFailedRequest(block_id=9, position=0, server_id=5, reason="sources unreadable")
        assert not await repairer._tell(done)
        assert not await repairer._tell(failed)
        assert await repairer.resend_reports() == 0  # still away: kept
        assert len(repairer.unreported) == 2
        service.up = True
        assert await repairer.resend_reports() == 2
        assert service.heard == [done, failed]
        assert repairer.unreported == {}

    asyncio.run(scenario())


def test_the_newest_outcome_per_chunk_is_the_one_kept(tmp_path: Path) -> None:
    service = FlakyService()
    store = ChunkStore(str(tmp_path))
    repairer = _repairer(service, store)
    done = _rebuilt(store, 1, 2, b"x")

    async def scenario() -> None:
        await repairer._tell(messages.RepairFailedRequest(block_id=1, position=2, server_id=5, reason="x"))
        await repairer._tell(done)
        service.up = True
        assert await repairer.resend_reports() == 1
        assert service.heard == [done]

    asyncio.run(scenario())


def test_a_rebuilt_chunk_lost_before_its_late_report_is_reported_failed_not_done(tmp_path: Path) -> None:
    """Bit rot or a deleted file between the rebuild and the service's return: placing the
    chunk would place a bad one as sound, so the resend says the rebuild failed instead."""
    service = FlakyService()
    store = ChunkStore(str(tmp_path))
    repairer = _repairer(service, store)
    damaged = _rebuilt(store, 8, 3, os.urandom(5080))
    deleted = _rebuilt(store, 9, 1, os.urandom(100))

    async def scenario() -> None:
        assert not await repairer._tell(damaged)
        assert not await repairer._tell(deleted)
        with open(store.path(8), "r+b") as chunk_file:
            chunk_file.seek(100)
            byte = chunk_file.read(1)
            chunk_file.seek(100)
            chunk_file.write(bytes([byte[0] ^ 0x10]))
        store.delete(9)
        service.up = True
        assert await repairer.resend_reports() == 2
        assert [(type(r), r.block_id, r.position) for r in service.heard] == [
            (messages.RepairFailedRequest, 8, 3), (messages.RepairFailedRequest, 9, 1)]
        assert all(isinstance(r, messages.RepairFailedRequest) and "lost before its report" in r.reason
                   and not r.occupied for r in service.heard)
        assert repairer.unreported == {}

    asyncio.run(scenario())
