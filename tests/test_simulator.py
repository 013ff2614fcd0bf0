"""The simulator of production roles (``tectofs.testing``): seeded fault schedules through the
real metadata service, chunk servers and client; its invariants, each proven to fire; and
replay of a seed.

A failure names its seed and the one command that replays it with a readable trace
(``python3 -m tectofs.testing --seed S``). ``TECTOFS_SIM_BASE_SEED=B`` replays a whole slow
run, ``TECTOFS_SIM_SCHEDULES=N`` sets its size.
"""

from __future__ import annotations

import asyncio
import collections
import multiprocessing
import os
import random
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import pytest

from tectofs import checksum
from tectofs.client import blocks
from tectofs.errors import ChecksumMismatch, NoSpace
from tectofs.server.chunk.scrub import Scrubber
from tectofs.server.chunk.storage import ChunkStore
from tectofs.store import SqlStore
from tectofs.testing import SimulationFailed, run
from tectofs.testing.__main__ import main
from tectofs.testing.disk import SimDisk
from tectofs.wire import messages
from tectofs.wire.messages import HeartbeatReply
from tectofs.wire.values import LayoutSegment

# New seeds every run: CI plays 300 schedules per run (the rarest fault path asserted below is
# reached about 36 times in 300); TECTOFS_SIM_SCHEDULES=1000 or `python3 -m tectofs.testing
# --seeds A..B` plays more.
SCHEDULES = int(os.environ.get("TECTOFS_SIM_SCHEDULES", "300"))
BASE_SEED = int(os.environ.get("TECTOFS_SIM_BASE_SEED", random.randrange(1 << 32)))
WORKERS = 2


def _run_seeds(seeds: list[int]) -> tuple[list[str], dict[str, int]]:
    failures, totals = [], collections.Counter[str]()
    for seed in seeds:
        try:
            totals.update(run(seed).stats)
        except SimulationFailed as exc:
            failures.append(str(exc))
    return failures, dict(totals)


def _failures(seeds: range, tolerate: bool = True) -> list[str]:
    out = []
    for seed in seeds:
        try:
            run(seed, tolerate=tolerate)
        except SimulationFailed as exc:
            assert str(exc).startswith(f"simulation seed {seed} failed at step ")
            assert f"replay: python3 -m tectofs.testing --seed {seed}" in str(exc)
            out.append(str(exc))
    return out


def test_schedules_in_the_fast_lane() -> None:
    """A few schedules on every run (in-process; the slow lane runs hundreds)."""
    every = random.Random(BASE_SEED)
    seeds = [every.randrange(1 << 32) for _ in range(20)]
    print(f"simulator: base seed {BASE_SEED} (TECTOFS_SIM_BASE_SEED={BASE_SEED} replays this run)")
    failures, totals = _run_seeds(seeds)
    assert not failures, "\n\n".join(failures)
    assert totals.get("writes_acked", 0) > 0 and totals.get("gc_deletes", 0) > 0, totals


@pytest.mark.slow
def test_hundreds_of_schedules() -> None:
    every = random.Random(BASE_SEED)
    seeds = [every.randrange(1 << 32) for _ in range(SCHEDULES)]
    print(f"simulator: base seed {BASE_SEED} (TECTOFS_SIM_BASE_SEED={BASE_SEED} replays this run),"
          f" {len(seeds)} schedules on {WORKERS} processes")
    started = time.perf_counter()
    with ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(_run_seeds, [seeds[i::WORKERS] for i in range(WORKERS)]))
    failures = [f for fs, _ in results for f in fs]
    totals = collections.Counter[str]()
    for _, stats in results:
        totals.update(stats)
    print(f"  {time.perf_counter() - started:.1f}s; {dict(sorted(totals.items()))}")
    assert not failures, f"{len(failures)} schedules failed:\n\n" + "\n\n".join(failures[:10])
    # The schedules reach the client's fault paths and every kind of fault.
    for counter in ("client_degraded_writes", "client_spare_writes", "client_hedged_writes", "client_degraded_reads",
                    "crash_meta", "crash_chunk", "crash_client", "wipe_chunk", "flip", "flaky_disk", "unlinked",
                    "disk_eio", "disk_lies", "disk_enospc", "disk_unlinks_undone", "net_dropped", "net_delayed",
                    "meta_release_leases", "meta_renew", "meta_repair_done", "meta_report_bad_chunk",
                    "client_cache_answers", "leased_answers"):
        assert totals[counter] > 0, counter


def test_a_seed_replays_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("TECTOFS_SIM_SEED", random.randrange(1 << 32)))
    print(f"simulator: seed {seed} (python3 -m tectofs.testing --seed {seed} replays it)")
    first = run(seed).cluster.trace.lines
    assert run(seed).cluster.trace.lines == first  # the last line is a digest of the final placements
    assert main(["--seed", str(seed)]) == 0
    assert first[-1] in capsys.readouterr().out


# ---------------------------------------------------------------------- each invariant fires


def test_a_lying_writer_is_caught_as_bytes_no_write_wrote(monkeypatch: pytest.MonkeyPatch) -> None:
    """(a): a client that flips a bit before checksumming stores wrong bytes no checksum catches."""
    encode = blocks._encode_and_checksum

    def lying(policy: Any, data: Any, allocate: Any) -> Any:
        if isinstance(data, memoryview) and len(data) > 1:
            data = memoryview(bytearray(data))
            data[len(data) // 2] ^= 1
        return encode(policy, data, allocate)

    monkeypatch.setattr(blocks, "_encode_and_checksum", lying)
    failures = _failures(range(3))
    assert failures and all(": (a) " in f for f in failures), failures


def test_redundancy_never_restored_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """(b): a service that never schedules a rebuild."""
    monkeypatch.setattr(SqlStore, "schedule_repairs", lambda self, *args, **kwargs: 0)
    failures = _failures(range(6))
    assert any(": (b) not healed" in f for f in failures), failures


def test_a_gc_order_for_a_placed_chunk_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """(c): heartbeats that also order a placed chunk deleted."""
    heartbeat = SqlStore.heartbeat_with_orders

    def deleting_a_placed_chunk(self: SqlStore, server_id: int, *args: Any, **kwargs: Any) -> HeartbeatReply:
        reply = heartbeat(self, server_id, *args, **kwargs)
        placed = self._one("SELECT block_id FROM chunks WHERE server_id = ?", (server_id,))
        return HeartbeatReply(delete=[*reply.delete, *([int(placed[0])] if placed else [])], repairs=reply.repairs)

    monkeypatch.setattr(SqlStore, "heartbeat_with_orders", deleting_a_placed_chunk)
    failures = _failures(range(3))
    assert failures and all(": (c) a GC order deletes chunk " in f for f in failures), failures


def test_two_chunks_of_a_block_on_one_server_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """(d): a commit that records position 1 on position 0's server."""
    commit = SqlStore.commit

    def misplacing(self: SqlStore, ino: int, *args: Any, **kwargs: Any) -> LayoutSegment:
        layout = commit(self, ino, *args, **kwargs)
        for block in layout.blocks:
            first = self._one("SELECT server_id FROM chunks WHERE block_id = ? AND position = 0", (block.block_id,))
            if first is not None:
                self._x("UPDATE chunks SET server_id = ? WHERE block_id = ? AND position = 1",
                        (first[0], block.block_id))
        return layout

    monkeypatch.setattr(SqlStore, "commit", misplacing)
    failures = _failures(range(3))
    assert failures and all(": (d) block " in f for f in failures), failures


def test_an_acknowledged_commit_that_is_not_durable_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """(e): a commit acknowledged, then undone (as a store that acknowledged before its log
    was durable loses it in a crash)."""
    commit = SqlStore.commit

    def forgetting(self: SqlStore, ino: int, *args: Any, **kwargs: Any) -> Any:
        self._x("SAVEPOINT forget")
        layout = commit(self, ino, *args, **kwargs)
        self._x("ROLLBACK TO forget")
        self._x("RELEASE forget")
        return layout

    monkeypatch.setattr(SqlStore, "commit", forgetting)
    failures = _failures(range(3))
    assert failures and all(": (e) " in f or ": (a) " in f or ": (f) " in f for f in failures), failures
    assert any(": (e) " in f or ": (f) " in f for f in failures), failures  # (f): the leased cache saw it first


def test_faults_beyond_what_a_policy_survives_are_caught() -> None:
    """Without the fault budget, schedules lose data, and the checks say so."""
    failures = _failures(range(12), tolerate=False)
    assert any(": (a) " in f or ": (b) " in f or ": (e) " in f for f in failures), failures


# ---------------------------------------------------------------------- the chunk-disk seam


def test_a_sim_disk_loses_only_what_was_not_durable(tmp_path: Any) -> None:
    """Power loss: an acknowledged chunk stays; a GC delete not yet durable is undone; a
    chunk written without sync is gone (its rename undone, its .tmp removed at start)."""
    disk = SimDisk(random.Random(1))
    data = memoryview(random.Random(2).randbytes(20_000))
    pieces, whole = checksum.piece_and_whole_crcs(data)
    durable = ChunkStore(str(tmp_path), sync="each", disk=disk)
    durable.write(1, 0, data, pieces, whole)
    durable.write(2, 0, data, pieces, whole)
    assert durable.delete(2)  # a GC delete: no directory sync
    ChunkStore(str(tmp_path), sync="none", disk=disk).write(3, 0, data, pieces, whole)
    disk.crash()
    after = ChunkStore(str(tmp_path), sync="each", disk=disk)
    assert sorted(after.block_ids()) == [1, 2]
    assert after.verify(1).whole_crc == whole and after.verify(2).whole_crc == whole
    assert disk.stats["unlinks_undone"] == 1 and disk.stats["renames_undone"] == 1


def test_a_sim_disk_fails_and_lies_as_told(tmp_path: Any) -> None:
    disk = SimDisk(random.Random(3))
    store = ChunkStore(str(tmp_path), sync="each", disk=disk)
    data = memoryview(random.Random(4).randbytes(20_000))
    pieces, whole = checksum.piece_and_whole_crcs(data)
    store.write(1, 0, data, pieces, whole)
    disk.full = True
    with pytest.raises(NoSpace):
        store.write(2, 0, data, pieces, whole)
    disk.heal()
    disk.lie_p = 1.0
    with pytest.raises(ChecksumMismatch):  # the piece checksums catch every lie
        store.read(1)
    disk.heal()
    disk.eio_p = 1.0
    with pytest.raises(OSError):
        store.read(1)


def test_a_disk_read_error_is_reported_and_the_scrub_goes_on(tmp_path: Any) -> None:
    """Found by seed 166: an EIO while scrubbing ended the scrubber for good, so a bit flipped
    later on that server was never found and the block never healed."""
    disk = SimDisk(random.Random(5))
    store = ChunkStore(str(tmp_path), sync="each", disk=disk)
    data = memoryview(random.Random(6).randbytes(20_000))
    pieces, whole = checksum.piece_and_whole_crcs(data)
    store.write(1, 0, data, pieces, whole)
    reports: list[messages.ReportBadChunkRequest] = []

    class Metadata:
        async def report_bad_chunk(self, request: messages.ReportBadChunkRequest) -> messages.Empty:
            reports.append(request)
            return messages.Empty()

    async def inline(fn: Any, *args: Any) -> Any:
        return fn(*args)

    scrubber = Scrubber(store, Metadata(), inline, 1 << 30, lambda: 7)  # type: ignore[arg-type]
    disk.eio_p = 1.0
    assert asyncio.run(scrubber.check(1)) is False
    assert [(r.block_id, r.server_id, r.kind) for r in reports] == [(1, 7, "corrupt")]
    disk.heal()
    assert asyncio.run(scrubber.check(1)) is True


def test_an_empty_file_is_right_only_where_a_create_could_have_left_it() -> None:
    """The model behind (e) and (f): an empty answer is the first write's empty file until a
    write is acknowledged; after an unlink that failed (it may have removed the file), a later
    write's create may leave a new empty file, until a write begun after that one returned is
    acknowledged."""
    from tectofs.testing.schedule import FileModel, Version
    model = FileModel([Version(b"x", started_s=1.0, acked_s=2.0, ended_s=2.0)])
    assert model.check(b"", read_started_s=1.5) is None
    assert (model.check(b"", read_started_s=3.0) or "").startswith("(e)")
    model.maybe_unlinked_s = 4.0
    recreating = Version(b"yy", started_s=5.0)
    model.versions.append(recreating)
    assert model.check(b"", read_started_s=6.0) is None  # its create may have landed, its commit not yet
    recreating.ended_s = 7.0  # it failed
    assert model.check(b"", read_started_s=8.0) is None
    model.versions.append(Version(b"zzz", started_s=9.0, acked_s=10.0, ended_s=10.0))
    assert model.check(b"", read_started_s=11.0) is not None
    assert model.check(b"zzz", read_started_s=11.0) is None
