"""A chunk server's rebuild outcomes reach the metadata service even when it was away at the
moment a rebuild finished: they are kept and sent again after the next heartbeat."""

from __future__ import annotations

import asyncio
from typing import Any

from tectofs.errors import ConnectionLost
from tectofs.server.chunk.repair import Repairer


class FlakyService:
    def __init__(self) -> None:
        self.up = False
        self.heard: list[tuple[str, dict[str, Any]]] = []

    async def __call__(self, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        if not self.up:
            raise ConnectionLost("the metadata service is restarting")
        self.heard.append((op, fields))
        return {}


def _repairer(service: FlakyService) -> Repairer:
    return Repairer(None, None, service, None, concurrency=1, rate_bytes_per_s=1e9)  # type: ignore[arg-type]


def test_outcomes_the_service_missed_are_sent_after_it_returns() -> None:
    service = FlakyService()
    repairer = _repairer(service)

    async def scenario() -> None:
        done = {"block_id": 8, "position": 3, "server_id": 5, "length": 5080, "crc": 1888196745}
        failed = {"block_id": 9, "position": 0, "server_id": 5, "reason": "sources unreadable", "occupied": False}
        assert not await repairer._tell("repair_done", done)
        assert not await repairer._tell("repair_failed", failed)
        assert await repairer.resend_reports() == 0  # still away: kept
        assert len(repairer.unreported) == 2
        service.up = True
        assert await repairer.resend_reports() == 2
        assert service.heard == [("repair_done", done), ("repair_failed", failed)]
        assert repairer.unreported == {}

    asyncio.run(scenario())


def test_the_newest_outcome_per_chunk_is_the_one_kept() -> None:
    service = FlakyService()
    repairer = _repairer(service)

    async def scenario() -> None:
        await repairer._tell("repair_failed", {"block_id": 1, "position": 2, "server_id": 5, "reason": "x"})
        await repairer._tell("repair_done", {"block_id": 1, "position": 2, "server_id": 5, "length": 1, "crc": 3})
        service.up = True
        assert await repairer.resend_reports() == 1
        assert [op for op, _ in service.heard] == ["repair_done"]

    asyncio.run(scenario())
