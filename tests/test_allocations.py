"""What an open handle keeps asking the metadata service for. Placements asked ahead
(``client/allocations.py``): a handle that buffers a partial block past the inline size asks
for its placement in the background, so its close waits for no allocation; a small file asks
for none; an ask that failed is asked again where the caller sees the error; a placement asked
ahead and never used leaves the file as written. Lease renewals (``client/handle_leases.py``):
one each period while open, none for a handle closed sooner."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from tectofs import limits
from tectofs.client.allocations import Allocations
from tectofs.errors import NoSpace
from tectofs.wire import messages
from tests.test_inline_files import _calls_during, _meta_calls

KiB = 1 << 10


def _wait_for_allocations(cluster: Any, before: float, timeout_s: float = 10.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = _meta_calls(cluster).get("allocate", 0.0)
        if now > before:
            return now
        time.sleep(0.02)
    raise AssertionError(f"no allocate call within {timeout_s} s")


def test_a_partial_block_past_the_inline_size_is_placed_before_close(make_cluster: Any) -> None:
    c = make_cluster(servers=6, metrics=True)
    fs = c.fs
    fs.write_bytes("/warm", b"x")  # the client learns the inline size
    data = os.urandom(limits.inline_bytes_default + 40 * KiB)
    before = _meta_calls(c).get("allocate", 0.0)
    f = fs.open("/records", "wb", buffering=0)  # each write reaches the handle, as through the mount
    for at in range(0, len(data), 10 * KiB):  # as tar writes: 10 KiB records
        f.write(data[at:at + 10 * KiB])
    _wait_for_allocations(c, before)  # asked while the file is still open, nothing committed
    assert _calls_during(c, f.close) == {"commit": 1}  # the close waits for no allocation
    assert fs.read_bytes("/records") == data


def test_a_small_file_asks_for_no_placement(make_cluster: Any) -> None:
    c = make_cluster(servers=6, metrics=True)
    fs = c.fs
    fs.write_bytes("/warm", b"x")
    data = os.urandom(limits.inline_bytes_default - 1)

    def write() -> None:
        with fs.open("/small", "wb", buffering=0) as f:
            for at in range(0, len(data), 10 * KiB):
                f.write(data[at:at + 10 * KiB])

    calls = _calls_during(c, write)
    assert "allocate" not in calls, calls
    assert fs.read_bytes("/small") == data


def test_a_placement_asked_ahead_and_not_used_leaves_the_file_as_written(make_cluster: Any) -> None:
    """The file grows past the inline size (a placement is asked), then is cut back under it
    before close: it is committed inline, and the unused placement changes nothing."""
    c = make_cluster(servers=6, metrics=True)
    fs = c.fs
    fs.write_bytes("/warm", b"x")
    data = os.urandom(limits.inline_bytes_default + 10 * KiB)
    before = _meta_calls(c).get("allocate", 0.0)
    with fs.open("/shrunk", "wb", buffering=0) as f:
        f.write(data)
        _wait_for_allocations(c, before)
        f.truncate(1000)
    assert fs.read_bytes("/shrunk") == data[:1000]


class _Metadata:
    """A metadata client double: ``allocate`` fails with each error in ``failures`` first."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures, self.asked = failures, 0

    async def allocate(self, request: messages.AllocateRequest) -> messages.AllocateReply:
        self.asked += 1
        await asyncio.sleep(0)
        if self.failures:
            raise self.failures.pop(0)
        blocks = [messages.Allocation(block_id=self.asked * 100 + i, servers=[], policy="rs(4,2)") for i in range(request.count)]
        return messages.AllocateReply(blocks=blocks, lease_s=30.0)


def _allocations(metadata: _Metadata, leases: list[float]) -> Allocations:
    return Allocations(metadata,  # type: ignore[arg-type]
                       lambda count: messages.AllocateRequest(ino=1, handle=b"", count=count, writer=7), leases.append)


def test_an_ask_ahead_that_failed_is_asked_again_by_take_and_batches_double() -> None:
    async def run() -> None:
        metadata, leases = _Metadata([NoSpace("no servers for a moment")]), list[float]()
        allocations = _allocations(metadata, leases)
        allocations.ask_ahead()
        allocations.ask_ahead()  # one ask on its way is enough
        await asyncio.sleep(0.01)
        assert metadata.asked == 1
        first = await allocations.take()  # the failed ask is asked again here, and succeeds
        assert metadata.asked == 2 and first.block_id == 200 and leases == [30.0]
        allocations.ask_ahead()  # the next batch is twice as large
        second, third = await allocations.take(), await allocations.take()
        assert (second.block_id, third.block_id) == (300, 301) and metadata.asked == 3

    asyncio.run(run())


def test_take_raises_what_the_service_keeps_answering(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "heartbeat_interval_s", 0.001)

    async def run() -> None:
        failures: list[Exception] = [NoSpace("no servers") for _ in range(limits.placement_attempts_max + 1)]
        allocations = _allocations(_Metadata(failures), [])
        allocations.ask_ahead()
        with pytest.raises(NoSpace):
            await allocations.take()

    asyncio.run(run())


class _Renewals:
    """A metadata client double that records renewals."""

    def __init__(self) -> None:
        self.renewed: list[messages.RenewRequest] = []

    async def renew(self, request: messages.RenewRequest) -> messages.Empty:
        self.renewed.append(request)
        return messages.Empty()


def test_a_handle_renews_its_leases_each_period_and_a_short_lived_one_never(monkeypatch: pytest.MonkeyPatch) -> None:
    """``HandleLeases``: the first renewal a period after the grant (a timer until then, no
    task), then one each period until ``stop``; a handle closed sooner sends none and leaves
    nothing scheduled; a handle with nothing to renew schedules nothing."""
    from tectofs.client.handle_leases import HandleLeases

    monkeypatch.setattr(limits, "reader_lease_s", 0.4)  # renewed every 0.1 s

    async def run() -> None:
        metadata = _Renewals()
        brief = HandleLeases(metadata, "/brief", 1, b"h", 7)  # type: ignore[arg-type]
        brief.hold_reader(11)
        assert brief.stop()[0] == 11
        idle = HandleLeases(metadata, "/idle", 2, b"h", 7)  # type: ignore[arg-type]
        idle.hold_reader(0)  # no lease: nothing to renew
        kept = HandleLeases(metadata, "/kept", 3, b"h", 7)  # type: ignore[arg-type]
        kept.hold_reader(12)
        await asyncio.sleep(0.05)
        assert metadata.renewed == []  # not before its period
        await asyncio.sleep(0.3)
        renewals = len(metadata.renewed)
        assert 1 <= renewals <= 5 and {r.ino for r in metadata.renewed} == {3}  # about 3 (a loaded machine is late)
        assert all(r.reader == 12 and r.writer == 0 for r in metadata.renewed)
        kept.stop()
        await asyncio.sleep(0.25)
        assert len(metadata.renewed) == renewals  # none after stop
        assert [t for t in asyncio.all_tasks() if t is not asyncio.current_task()] == []

    asyncio.run(run())
