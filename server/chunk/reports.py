"""What a chunk server's background work tells the metadata service, as a typed interface.

The rebuilds (``repair.py``), the scrubber and the inventory (``scrub.py``) call the metadata
service through :class:`MetadataReports`: its five operations, each taking its request type
and returning its reply type (``tectofs.wire.messages``). The chunk server hands them its
:class:`~tectofs.client.metadata.MetadataClient`, which has these methods among all the
others; ``tests/simulation.py`` hands them its own, which answers from the simulated store.
Every one of these operations is idempotent (retried blindly, no call id).
"""

from __future__ import annotations

from typing import Protocol

from tectofs.wire import messages

# The outcomes a rebuild reports, kept until the metadata service hears them (``Repairer``).
RepairReport = messages.RepairDoneRequest | messages.RepairFailedRequest | messages.ReportBadChunkRequest


class MetadataReports(Protocol):
    """The metadata service's operations that chunk servers call in the background."""

    async def report_bad_chunk(self, request: messages.ReportBadChunkRequest) -> messages.Empty: ...

    async def repair_done(self, request: messages.RepairDoneRequest) -> messages.Empty: ...

    async def repair_failed(self, request: messages.RepairFailedRequest) -> messages.Empty: ...

    async def inventory_begin(self, request: messages.InventoryBeginRequest) -> messages.InventoryBeginReply: ...

    async def inventory(self, request: messages.InventoryRequest) -> messages.InventoryReply: ...


async def send(metadata: MetadataReports, report: RepairReport) -> None:
    """``report`` sent by the operation its type belongs to."""
    if isinstance(report, messages.RepairDoneRequest):
        await metadata.repair_done(report)
    elif isinstance(report, messages.RepairFailedRequest):
        await metadata.repair_failed(report)
    else:
        await metadata.report_bad_chunk(report)


def operation_name(report: RepairReport) -> str:
    """The name of the operation that sends ``report`` (for logs)."""
    if isinstance(report, messages.RepairDoneRequest):
        return messages.REPAIR_DONE.name
    if isinstance(report, messages.RepairFailedRequest):
        return messages.REPAIR_FAILED.name
    return messages.REPORT_BAD_CHUNK.name
