"""Simulated histories (issue 52): leasing library clients on a small shared tree, driven through
the real metadata service, chunk servers and client code in the deterministic simulator
(``tectofs.testing.sim_histories``) under faults, each history checked by the history checker.

A failure prints the checker's minimal core and the command replaying its seed
(``python3 -m tectofs.testing.sim_histories --seed S``); ``--histories N --start S`` checks
more by hand. ``TECTOFS_SIM_HISTORIES=N`` sets how many the slow test checks.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from tectofs.store import SqlStore
from tectofs.testing import sim_histories
from tectofs.testing.sim_histories import FAULTS, HistoryStuck, HistoryViolation, main, run_histories, run_history
from tectofs.testing.sim_workload import KIND_WEIGHTS, Workload
from tectofs.wire.messages import UnlinkReply

HISTORIES = int(os.environ.get("TECTOFS_SIM_HISTORIES", "1000"))


@pytest.mark.slow
def test_a_thousand_simulated_histories_under_faults_are_explained() -> None:
    """Seeds 0..HISTORIES-1 (fixed: a failure here is a new finding, replayable by its seed)."""
    started = time.perf_counter()
    failures, totals = run_histories(range(HISTORIES))
    took = time.perf_counter() - started
    print(f"{HISTORIES} simulated histories in {took:.1f} s ({HISTORIES / took:.1f}/s); {dict(sorted(totals.items()))}")
    assert not failures, f"{len(failures)} of {HISTORIES} histories failed:\n\n" + "\n\n".join(failures[:5])
    assert totals["histories_ok"] == HISTORIES
    assert totals["undecided"] == 0, totals
    for fault in FAULTS:  # each kind of fault strikes, and pauses outlast a lease
        assert totals[f"fault_{fault}"] > 0, fault
    assert totals["paused"] > 0 and totals["net_held"] > 0, totals
    for kind in KIND_WEIGHTS:  # every kind of call is made, and answered both ways
        assert totals[f"kind_{kind}"] > 0, kind
    assert totals["answered_ok"] > 0 and totals["answered_ENOENT"] > 0 and totals["unknown"] > 0, totals


def test_a_history_replays_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    def played(seed: int) -> tuple[list[str], list[tuple[Any, ...]]]:
        sim = run_history(seed)
        return sim.cluster.trace.lines, [(op.client, op.describe(), op.outcome(), op.invoke, op.complete)
                                         for op in sim.history.operations]

    first = played(7)
    assert played(7) == first
    assert len(first[1]) > 10
    assert main(["--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "seed 7: explained" in out and first[0][-1] in out


def test_a_lost_unlink_is_a_violation_with_its_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A service that answers unlink but keeps the name: the checker's core and replay line."""
    unlink = SqlStore.unlink

    def keeping(self: SqlStore, parts: list[str], *args: Any, **kwargs: Any) -> UnlinkReply:
        if not parts:
            return unlink(self, parts, *args, **kwargs)
        parent, attrs = self._walk(parts, kwargs.get("caller"))
        if attrs.kind == "dir":
            return unlink(self, parts, *args, **kwargs)  # its EISDIR
        return UnlinkReply(directory=parent, directory_ctime_before=parent.ctime)

    monkeypatch.setattr(SqlStore, "unlink", keeping)
    for seed in range(40):
        try:
            run_history(seed, kinds={"unlink": 4, "stat": 4, "read": 2, "create": 2})
        except HistoryViolation as exc:
            assert "cannot be ordered" in str(exc) and "unlink(" in str(exc), exc
            assert f"replay: python3 -m tectofs.testing.sim_histories --seed {seed}" in str(exc)
            return
    pytest.fail("40 histories with a service that keeps unlinked names: no violation found")


def test_a_task_that_spins_in_virtual_time_is_stuck_not_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    """A livelock (no virtual time passes) ends the history within its step bound."""
    async def spinning(self: Workload, count: int, kinds: dict[str, int]) -> None:
        while True:
            await asyncio.sleep(0)

    monkeypatch.setattr(Workload, "run", spinning)
    monkeypatch.setattr(sim_histories, "STALL_STEPS", 5_000)
    started = time.perf_counter()
    with pytest.raises(HistoryStuck, match="without virtual time passing") as caught:
        run_history(3)
    assert "spinning" in str(caught.value) and "--seed 3" in str(caught.value)
    assert time.perf_counter() - started < 20
