"""Self-healing cost: how fast a lost chunk server is rebuilt, and what a rebuild costs a
checkpoint save that runs during it.

    tectofs bench repair --out results/
    python3 -m tectofs.benchmarks.repair --size 4G --save-size 1G --repeats 3 --limits 64:2,0:8

For each repair setting (``RATE:CONCURRENCY`` = ``--repair-rate`` MiB/s and
``--repair-concurrency`` of every ``tectofs chunk``; by default the defaults of
``tectofs/limits.py`` and "unlimited": rate 0, concurrency 8) a fresh local cluster is started
(7 chunk servers, ``rs(4,2)``, 64 MiB blocks, ``--repair-after 1``) and ``--size`` bytes of
data are written. A *loss* is issue 10's "lost for good": one chunk server is killed, its
data directory wiped and an empty server started in its place, so about 6/7 of the blocks
lose one chunk.

1. **Rebuild throughput** (no client load): the time from the first rebuild the metadata
   service queues (the dead server counted out) until its ``stats`` count every block healthy
   with no rebuild queued or running (then ``fsck`` must be clean); throughput is the chunk
   bytes rebuilt (sum of the chunk servers' ``repair_bytes``) over that time, in GB/s and MB/s,
   with the CPU seconds the cluster's processes spent per GB rebuilt.
2. **Save during a rebuild**: ``--repeats`` interleaved pairs of the same DCP save
   (``checkpoint_bench``'s state dict of ``--save-size``, through ``tectofs.torch``) on the
   healthy cluster, then started as soon as a new loss has rebuilds running. Each repair
   round records whether rebuilds ran for the whole save (rebuilds running at its start,
   queued or running at its end, ``repair_bytes`` grown); a round with no rebuild running is
   an error. Ratio = median save GB/s during a rebuild / median healthy; goal >= 0.8 with the
   default limits (issue 10).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable

from tectofs.benchmarks.checkpoint_bench import _timed, make_state_dict, tensor_bytes
from tectofs.benchmarks.common import parse_size, print_table, process_cpu_s, work_dir, write_results
from tectofs.benchmarks.report import print_targets
from tectofs.benchmarks.report import target as goal

MiB = 1 << 20
SERVERS = 7
MDS_HEAL = ["--repair-after", "1", "--repair-interval", "0.5"]
POLL_S = 0.2


def _limits(spec: str) -> tuple[float, int]:
    """``"64:2"`` -> (64 MiB/s, 2 rebuilds at once); rate 0 = unlimited."""
    rate, concurrency = spec.split(":")
    return float(rate), int(concurrency)


def default_limits() -> list[str]:
    from tectofs import limits

    return [f"{limits.repair_rate_bytes_per_s / MiB:g}:{limits.repair_concurrency_per_server}", "0:8"]


def _label(spec: str) -> str:
    rate, concurrency = _limits(spec)
    rate_text = "unlimited rate" if rate <= 0 else f"{rate:g} MiB/s"
    default = " (default)" if spec == default_limits()[0] else ""
    return f"{rate_text}, {concurrency} at once{default}"


class Monitor:
    """The metadata service's view: block health, the rebuild queue, bytes rebuilt."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def counts(self) -> dict[str, int]:
        return dict(self.fs.run(self.fs.aio.metadata.stats()).counts)

    def rebuilt_bytes(self) -> int:
        """Sum of every chunk server's ``repair_bytes`` (as of its last heartbeat)."""
        return sum(s.stats.get("repair_bytes", 0) for s in self.fs.servers())

    def wait(self, what: str, done: Callable[[dict[str, int]], bool], timeout_s: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout_s
        while True:
            counts = self.counts()
            if done(counts):
                return counts
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout_s:.0f}s; MDS counts {counts}")
            time.sleep(POLL_S)

    def settled_rebuilt_bytes(self, heartbeat_s: float) -> int:
        """``rebuilt_bytes`` once every server has heartbeated since the rebuild ended."""
        time.sleep(2.5 * heartbeat_s)
        return self.rebuilt_bytes()


def _rebuilding(c: dict[str, int]) -> bool:
    return c.get("repairs_running", 0) > 0


def _healthy(c: dict[str, int]) -> bool:
    return (c.get("under_redundant", 0) == 0 and c.get("unreadable", 0) == 0
            and c.get("repairs_queued", 0) == 0 and c.get("repairs_running", 0) == 0)


def _lose_server(cluster: Any, i: int) -> float:
    """Kill chunk server ``i``, wipe its disk, start an empty one in its place; returns when."""
    killed = time.monotonic()
    cluster.kill_chunk_server(i)
    shutil.rmtree(cluster.chunk_data_dirs[i])
    cluster.restart_chunk(i)
    return killed


def _write_data(fs: Any, size_bytes: int, file_bytes: int = 512 * MiB) -> None:
    piece = memoryview(os.urandom(8 * MiB))
    fs.makedirs("/data")
    for n, start in enumerate(range(0, size_bytes, file_bytes)):
        with fs.open(f"/data/f{n}", "wb") as f:
            for _ in range(0, min(file_bytes, size_bytes - start), len(piece)):
                f.write(piece)


def _measure_rebuild(cluster: Any, monitor: Monitor, victim: int, timeout_s: float) -> dict[str, Any]:
    """One loss with nothing else running: seconds from the first rebuild queued to healthy."""
    from tectofs.fsck import check

    before = monitor.rebuilt_bytes()
    killed = _lose_server(cluster, victim)
    monitor.wait("rebuilds queued after the loss", lambda c: c.get("repairs_queued", 0) + c.get("repairs_running", 0) > 0,
                 timeout_s=60)
    pids = [p.pid for p in [*cluster.chunk_processes, cluster.meta_process] if p is not None]
    cpu_before = sum(process_cpu_s(pid) for pid in pids)
    started = time.monotonic()
    monitor.wait("every block healthy again", _healthy, timeout_s)
    seconds = time.monotonic() - started
    cpu_s = sum(process_cpu_s(pid) for pid in pids) - cpu_before
    report = monitor.fs.run(check(monitor.fs.aio, "/"))
    if report.exit_code != 0:
        raise AssertionError(f"fsck not clean after the rebuild: {report.as_dict()}")
    rebuilt = monitor.settled_rebuilt_bytes(cluster.heartbeat_interval_s) - before
    return {"seconds": seconds, "from_kill_s": started + seconds - killed, "rebuilt_bytes": rebuilt, "cluster_cpu_s": cpu_s,
            "blocks": report.as_dict().get("blocks")}


def _measure_config(spec: str, out_dir: str, tmp: str, size_bytes: int, sd: Any, rounds: int, timeout_s: float,
                    tick: Callable[[int], Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt
    from tectofs.client import connect
    from tectofs.server.cluster import LocalCluster

    rate, concurrency = _limits(spec)
    root = os.path.join(tmp, f"cluster-{rate:g}-{concurrency}")
    cluster = LocalCluster(root, servers=SERVERS, policy="rs(4,2)", gc_delay_s=3600.0, meta_args=MDS_HEAL,
                           chunk_args=["--repair-rate", f"{rate:g}", "--repair-concurrency", str(concurrency)])
    saves: dict[str, list[float]] = {"healthy": [], "rebuilding": []}
    windows: list[dict[str, Any]] = []
    errors: list[str] = []
    try:
        with cluster, connect(cluster.address) as fs:
            monitor = Monitor(fs)
            _write_data(fs, size_bytes)
            rebuild = _measure_rebuild(cluster, monitor, victim=0, timeout_s=timeout_s)
            tick(1)

            def save(i: int) -> float:
                uri = f"tectofs://{cluster.address}/ckpt/step_{i}"
                seconds = _timed(lambda: dcp.save(sd, storage_writer=tt.CheckpointWriter(uri)))
                fs.rmtree(f"/ckpt/step_{i}")  # not rebuilt later: every loss has the same data to rebuild
                return seconds

            for r in range(rounds):
                try:
                    saves["healthy"].append(save(2 * r))
                except Exception as exc:  # a failed save is a finding: record it, keep the logs, go on
                    errors.append(f"round {r}, healthy save failed: {type(exc).__name__}: {str(exc)[-300:]}")
                tick(1)
                _lose_server(cluster, 1 + r % (SERVERS - 1))
                start = monitor.wait("rebuilds running after the loss", _rebuilding, timeout_s=60)
                bytes_before = monitor.rebuilt_bytes()
                try:
                    saves["rebuilding"].append(save(2 * r + 1))
                except Exception as exc:
                    errors.append(f"round {r}, save during rebuild failed: {type(exc).__name__}: {str(exc)[-300:]}")
                end = monitor.counts()
                grown = monitor.rebuilt_bytes() - bytes_before
                windows.append({"running_at_start": start["repairs_running"], "running_at_end": end["repairs_running"],
                                "queued_at_end": end["repairs_queued"], "rebuilt_MiB_during_save": round(grown / MiB),
                                "whole_save": end["repairs_running"] + end["repairs_queued"] > 0 and grown > 0})
                monitor.wait("every block healthy again", _healthy, timeout_s)
                tick(1)
    finally:
        tt.close_all()
        if errors:
            shutil.copytree(os.path.join(root, "logs"), os.path.join(out_dir, f"repair-logs-{rate:g}-{concurrency}"),
                            dirs_exist_ok=True)
    return {"limits": spec, "label": _label(spec), "rebuild": rebuild, "saves": saves, "windows": windows,
            "errors": errors}


def run(out_dir: str, size_bytes: int = 4 << 30, save_bytes: int = 1 << 30, repeats: int = 3,
        limits: list[str] | None = None, quick: bool = False, work_dir: str | None = None,
        progress: Callable[[int], Any] | None = None, timeout_s: float = 900.0) -> dict[str, Any]:
    """Measure 1. and 2. above for each of ``limits``; returns ``{"rows", "ratios", ...}`` and
    writes ``<out_dir>/repair.json``."""
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if quick:
        size_bytes, save_bytes = min(size_bytes, 1 << 30), min(save_bytes, 256 * MiB)
    specs = limits or default_limits()
    sd = make_state_dict(save_bytes)
    nbytes = tensor_bytes(sd)
    tick = progress or (lambda n: None)
    with tempfile.TemporaryDirectory(prefix="tectofs-repair-bench-", dir=work_dir) as tmp:
        results = [_measure_config(spec, out_dir, tmp, size_bytes, sd, max(1, repeats), timeout_s, tick) for spec in specs]

    rows, ratios, errors = [], {}, []
    for res in results:
        rb = res["rebuild"]
        rows.append({"what": f"rebuild, {res['label']}", "GB/s": round(rb["rebuilt_bytes"] / rb["seconds"] / 1e9, 3),
                     "MB/s": round(rb["rebuilt_bytes"] / rb["seconds"] / 1e6, 1), "median_s": round(rb["seconds"], 1),
                     "runs_s": [round(rb["seconds"], 1)],
                     "note": f"{rb['rebuilt_bytes'] / MiB:.0f} MiB rebuilt; {rb['from_kill_s']:.1f}s from the kill; "
                             f"cluster CPU {rb['cluster_cpu_s'] / max(1, rb['rebuilt_bytes']) * 1e9:.1f} s per GB"})
        errors += [f"{res['label']}: {e}" for e in res["errors"]]
        if not (res["saves"]["healthy"] and res["saves"]["rebuilding"]):
            continue
        gbps = {}
        for phase, times in res["saves"].items():
            gbps[phase] = nbytes / statistics.median(times) / 1e9
            rows.append({"what": f"save {'healthy' if phase == 'healthy' else 'during rebuild'}, {res['label']}",
                         "GB/s": round(gbps[phase], 3), "MB/s": round(gbps[phase] * 1e3, 1),
                         "median_s": round(statistics.median(times), 2), "runs_s": [round(t, 2) for t in times],
                         "note": "" if phase == "healthy" else
                         "rebuilt MiB during each save: " + " ".join(str(w["rebuilt_MiB_during_save"])
                                                                     for w in res["windows"])})
        ratios[f"save during rebuild / healthy, {res['label']}"] = round(gbps["rebuilding"] / gbps["healthy"], 3)
        errors += [f"{res['label']}, round {i}: no rebuild ran during the save: {w}"
                   for i, w in enumerate(res["windows"]) if not w["running_at_start"]]
    default = results[0]["label"]
    targets = [goal(f"save during rebuild / healthy, {default}",
                    ratios.get(f"save during rebuild / healthy, {default}"), at_least=0.8)] if "(default)" in default else []
    result = {
        "benchmark": "repair",
        "data_bytes": size_bytes,
        "save_bytes": nbytes,
        "rounds": repeats,
        "cluster": f"local: 1 MDS + {SERVERS} chunk servers, rs(4,2), 64 MiB blocks; MDS {' '.join(MDS_HEAL)}",
        "rows": rows,
        "ratios": ratios,
        "targets": targets,
        "targets_met": {t["name"]: t["met"] for t in targets},
        "details": results,
        "errors": errors,
        "error_count": len(errors),
    }
    write_results(out_dir, "repair", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("4G"), help="data written first (default 4G)")
    parser.add_argument("--save-size", type=parse_size, default=parse_size("1G"), help="state dict bytes (default 1G)")
    parser.add_argument("--repeats", type=int, default=3, help="save pairs (healthy, during rebuild) per setting")
    parser.add_argument("--limits", default=None,
                        help="comma-separated RATE_MIBS:CONCURRENCY settings (default: the defaults, then 0:8)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--work-dir", default=None, help="where the cluster goes, created if missing (default: $TMPDIR)")
    args = parser.parse_args()
    result = run(args.out, args.size, args.save_size, args.repeats, args.limits.split(",") if args.limits else None,
                 quick=args.quick, work_dir=work_dir(args.work_dir), progress=lambda n: print(".", end="", flush=True))
    print()
    print_table(result)
    print(json.dumps({"errors": result["errors"]}, indent=2))
    print_targets(result)


if __name__ == "__main__":
    main()
