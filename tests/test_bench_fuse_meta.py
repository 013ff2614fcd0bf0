"""``tectofs bench fuse --metadata-only``: creates/s, stats/s, listed stats/s and unlinks/s through a real mount
beside a local directory, the 1,500/s target as met / not met, in the table and the JSON."""

from __future__ import annotations

import json
import os
import re

import pytest

from tectofs.benchmarks import fuse_bench
from tectofs.benchmarks.run import main
from tests.test_fuse import _fuse_unavailable


def test_target_verdict_follows_the_medians():
    """Medians of the runs decide; both creates and unlinks must reach 1,500/s."""
    files = 3000
    times = {
        "local creates/s": [0.1, 0.2, 0.3], "local stats/s": [0.01] * 3, "local listed stats/s": [0.01] * 3,
        "local unlinks/s": [0.05] * 3,
        # medians: creates 3000/1.5 = 2000/s (met), unlinks 3000/2.5 = 1200/s (not met)
        "mount multi-thread creates/s": [1.0, 1.5, 9.0], "mount multi-thread stats/s": [1.0] * 3,
        "mount multi-thread listed stats/s": [0.5] * 3,
        "mount multi-thread unlinks/s": [2.5, 2.0, 3.0],
    }
    meta = fuse_bench._metadata_results(files, 3, ("mount multi-thread",), times, {}, {})
    rows = {row["what"]: row for row in meta["rows"]}
    assert rows["mount multi-thread creates/s"]["ops/s (median)"] == 2000
    assert rows["mount multi-thread unlinks/s"]["ops/s (median)"] == 1200
    assert rows["mount multi-thread creates/s"]["target"].endswith(": met")
    assert rows["mount multi-thread unlinks/s"]["target"].endswith(": NOT met")
    assert rows["local creates/s"]["ops/s (median)"] == 15000
    assert rows["mount multi-thread creates/s"]["vs local"] == round(2000 / 15000, 4)
    assert meta["target"]["met"] is False
    assert meta["target"]["by_mode"]["mount multi-thread"] == {"met": False, "creates/s": 2000, "unlinks/s": 1200}
    times["mount multi-thread unlinks/s"] = [1.0, 2.0, 1.5]  # 2000/s
    assert fuse_bench._metadata_results(files, 3, ("mount multi-thread",), times, {}, {})["target"]["met"] is True


@pytest.mark.fuse
@pytest.mark.timeout(120)
@pytest.mark.skipif(_fuse_unavailable() is not None, reason=_fuse_unavailable() or "")
@pytest.mark.slow  # starts processes
def test_metadata_only_run_reports_rates_and_target(tmp_path, capsys):
    out = tmp_path / "results"
    work = tmp_path / "work"
    work.mkdir()
    code = main(["fuse", "--metadata-only", "--files", "40", "--repeats", "3", "--out", str(out),
                 "--work-dir", str(work)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    with open(out / "fuse_bench.json") as f:
        result = json.load(f)
    assert result["rows"] == []  # no data streams in a metadata-only run
    meta = result["metadata"]
    assert meta["files"] == 40 and meta["repeats"] == 3
    rows = {row["what"]: row for row in meta["rows"]}
    for where in ("local", "mount multi-thread"):
        for op in ("creates/s", "stats/s", "listed stats/s", "unlinks/s"):
            row = rows[f"{where} {op}"]
            assert row["ops/s (median)"] > 0
            assert len(row["runs ops/s"]) == 3 and all(rate > 0 for rate in row["runs ops/s"])
    for op in ("creates/s", "unlinks/s"):
        row = rows[f"mount multi-thread {op}"]
        assert row["target"] == f">= 1,500: {'met' if row['ops/s (median)'] >= 1500 else 'NOT met'}"
        assert row["vs local"] > 0
        # every create and unlink reaches the metadata service: each its own operation, or (in a
        # directory the mount claimed: client/claims.py) batched, many to one operation
        assert row["store ops/op"] > 0
    verdict = meta["target"]["by_mode"]["mount multi-thread"]
    assert verdict["met"] == (verdict["creates/s"] >= 1500 and verdict["unlinks/s"] >= 1500)
    key = "mount multi-thread metadata target (1,500 creates/s and 1,500 unlinks/s)"
    assert result["ratios"][key] == ("met" if verdict["met"] else "NOT met")
    for op in ("creates/s", "unlinks/s"):  # the targets table
        assert re.search(rf"^mount multi-thread {op} +[0-9.e+]+ +>= 1500/s +(met|NOT met) *$", printed, re.M), printed
    assert "mount multi-thread creates/s" in printed
    with open("/proc/self/mounts") as f:
        assert str(work) not in f.read()  # the mount is gone
    assert os.listdir(work) == []  # and so is the cluster
