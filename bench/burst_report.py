"""Figures, medians and targets of checkpoint bursts (``bench/burst.py``): one run's key
figures, and the median of several runs with the issue's targets shown as met or not met.

The targets (issue 15; ``tectofs bench burst``):

- the burst's save, aggregate over all ranks, >= 0.7x one large writer of the same run;
- the save's p99 latency <= 2x its median (no rank left far behind);
- the burst's load >= 0.5x one large reader of the same run;
- the metadata storm >= 20,000 metadata operations per second.
"""

from __future__ import annotations

import statistics
from typing import Any

from tectofs.benchmarks.common import print_table
from tectofs.benchmarks.report import Target, print_targets, target

SAVE_RATIO = "save / single writer"
LOAD_RATIO = "load / single reader"
NEXT_SAVE_RATIO = "next save / single writer"
SAVE_TAIL = "save p99 / p50"
STORM_RATE = "metadata storm MDS ops/s"

# name: (at_least, at_most, unit)
TARGETS: dict[str, tuple[float | None, float | None, str]] = {
    SAVE_RATIO: (0.7, None, "x"),
    SAVE_TAIL: (None, 2.0, "x"),
    LOAD_RATIO: (0.5, None, "x"),
    STORM_RATE: (20_000, None, "/s"),
}


def figures(result: dict[str, Any]) -> dict[str, float]:
    """One run's key figures (those its phases measured): ratios against the same run's single
    writer and reader, wall times, the save's tail, the storm's rate, and the cluster's CPU
    seconds per GB saved and loaded (MDS and chunk servers; empty with ``--meta``)."""
    phases, ratios = result.get("phases", {}), result.get("ratios", {})
    gb = result["ranks"] * result["shard_bytes"] / 1e9
    out: dict[str, float] = {}
    for name, key in ((SAVE_RATIO, "burst save / single writer"), (LOAD_RATIO, "burst load / single reader"),
                      (NEXT_SAVE_RATIO, "burst next save / single writer")):
        if key in ratios:
            out[name] = ratios[key]
    for phase_name in ("save", "load", "next_save"):
        phase = phases.get(phase_name)
        if not phase or not phase.get("ranks_ok"):
            continue
        label = phase_name.replace("_", " ")
        out[f"{label} wall s"] = phase["wall_s"]
        out[f"{label} p50 s"] = phase["latency_s"]["p50"]
        out[f"{label} p99 s"] = phase["latency_s"]["p99"]
        for role, seconds in (phase.get("cpu_s") or {}).items():
            out[f"{label}: {role.replace('_', ' ')} CPU s per GB"] = seconds / gb
    save = phases.get("save")
    if save and save.get("ranks_ok") and save["latency_s"]["p50"] > 0:
        out[SAVE_TAIL] = save["latency_s"]["p99"] / save["latency_s"]["p50"]
    storm = phases.get("metadata")
    if storm and storm.get("ranks_ok"):
        out[STORM_RATE] = storm["mds_ops_per_s"]
        out["metadata storm files/s"] = storm["files"] / storm["wall_s"] if storm["wall_s"] > 0 else 0.0
        cpu = (storm.get("cpu_s") or {}).get("mds")
        if cpu is not None and storm["mds_operations"]:
            out["metadata storm MDS CPU us per op"] = 1e6 * cpu / storm["mds_operations"]
    return out


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the runs that measured it."""
    keys = dict.fromkeys(k for s in samples for k in s)
    return {k: statistics.median(s[k] for s in samples if k in s) for k in keys}


def targets(median: dict[str, float]) -> list[Target]:
    """The targets, judged on the medians (a figure no run measured is not met)."""
    return [target(f"burst {name}", median.get(name), at_least=low, at_most=high, unit=unit)
            for name, (low, high, unit) in TARGETS.items()]


def combine(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of the same burst as one result: the run with the median save ratio, with
    ``repeats``, every run's figures (``samples``), their ``medians``, the ``ratios`` and
    ``targets`` taken from the medians, and every run's errors (prefixed with its number).
    Runs that failed count in ``repeats`` and ``errors`` but not in the medians."""
    assert results
    good = [r for r in results if not r.get("error_count")]
    samples = [figures(r) for r in good]
    median = medians(samples)
    by_save = sorted(good, key=lambda r: figures(r).get(SAVE_RATIO, 0.0))
    combined = dict(by_save[len(by_save) // 2] if by_save else results[-1])
    combined["repeats"] = len(results)
    combined["runs_ok"] = len(good)
    combined["samples"] = samples
    combined["medians"] = median
    combined["ratios"] = {f"burst {k} (median of {len(good)})": round(v, 3)
                          for k, v in median.items() if k in (SAVE_RATIO, LOAD_RATIO, NEXT_SAVE_RATIO, SAVE_TAIL)}
    combined["targets"] = targets(median)
    combined["errors"] = [f"run {i + 1}: {e}" for i, r in enumerate(results) for e in r.get("errors", [])]
    combined["error_count"] = len(combined["errors"])
    combined["servers_alive"] = {"ok": all(r.get("servers_alive", {}).get("ok") for r in results),
                                 "runs": [r.get("servers_alive") for r in results]}
    return combined


def print_medians(result: dict[str, Any]) -> None:
    """Every figure's median and range over the runs."""
    samples, median = result.get("samples") or [], result.get("medians") or {}
    if not samples:
        return
    print(f"medians of {len(samples)} runs (min .. max):")
    width = max(len(k) for k in median)
    for key, value in median.items():
        values = [s[key] for s in samples if key in s]
        print(f"  {key.ljust(width)}  {value:10.4g}   ({min(values):.4g} .. {max(values):.4g})")


def print_summary(result: dict[str, Any]) -> None:
    """The run's table (with repeats: the run with the median save ratio), each phase's details,
    the chunk servers' counters, the medians over the runs and the errors."""
    if result["rows"]:
        print_table(result)
    for name in ("save", "load", "next_save", "metadata"):
        phase = result["phases"].get(name)
        if not phase:
            continue
        slow = phase.get("slowest_rank") or {}
        print(f"{name}: wall {phase['wall_s']:.2f}s, per-rank MB/s p50 {phase['per_rank_GBps']['p50'] * 1e3:.2f} "
              f"min {phase['per_rank_GBps']['min'] * 1e3:.2f}, slowest rank {slow.get('rank')} "
              f"({slow.get('seconds', float('nan')):.2f}s), start lag p99 {phase['start_lag_s']['p99']:.3f}s, "
              f"MDS {phase['mds_operations']} ops in {phase['mds_transactions']} transactions, "
              f"worker max RSS {phase['worker_max_rss_bytes'] / 2**30:.2f} GiB, server CPU s {phase.get('cpu_s')}, "
              f"MDS view of chunk servers {phase.get('liveness')}")
    chunk = result.get("chunk_servers")
    if chunk:
        print(f"chunk servers: {chunk['total_puts']} puts, {chunk['total_gets']} gets, "
              f"{chunk['total_busy']} BUSY, {chunk['total_checksum_errors']} checksum errors, "
              f"{chunk['total_deleted']} chunks deleted by GC orders")
    print(f"servers alive: {result['servers_alive']}")
    print_medians(result)
    print(f"errors: {result['error_count']}")
    for error in result["errors"][:10]:
        print(f"  {error}")


def main(argv: list[str]) -> int:
    """``burst_report.py RESULT.json``: print a saved burst result (``bench/burst.py --out``)
    again: its table, medians and targets."""
    import json

    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python3 -m tectofs.benchmarks.burst_report RESULT.json\n\nPrint a saved burst result "
              "(bench/burst.py, tectofs bench burst) again: the median run's table, every figure's median and range, "
              "the targets.")
        return 0 if argv in (["-h"], ["--help"]) else 2
    with open(argv[0]) as f:
        result = json.load(f)
    print_summary(result)
    print_targets(result)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
