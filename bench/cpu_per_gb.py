"""CPU seconds per GB of a checkpoint saved and loaded through the plugin, per process role
(client, chunk servers, metadata service), for this tree and a baseline revision in the same
run: issue 15's "cut the total by at least 40%" as a same-run ratio. The wall seconds per GB of
the same calls are reported beside them ("wall save", "wall load"), with their ratios: a change
that must not slow checkpoints shows it here.

    python3 -m tectofs.benchmarks.cpu_per_gb --baseline 90af9df --size 1G --rounds 3 --runs 3 [--tcp-arm]

The baseline revision is checked out into a temporary git worktree. Each round runs one fresh
process per tree, alternating (baseline first in odd rounds, this tree first in even ones);
each process starts its own local cluster (6 chunk servers, rs(4,2)), saves and loads once to
warm up, then meters ``--runs`` saves (``dcp.save`` with ``CheckpointWriter``) and loads
(``dcp.load`` with ``CheckpointReader``, page cache dropped before each, as root). Only the
plugin calls are metered: not zeroing the target, dropping caches or comparing tensors (which
``checkpoint_bench.py`` counts in its per-role figures). Medians over every run of a tree.

A local cluster's client reaches its servers by local (Unix) sockets (``tectofs/wire/local_sockets.py``).
``--tcp-arm`` adds a third arm, this tree with them off (``TECTOFS_LOCAL_SOCKETS=0``): every
connection over TCP loopback, the nearest this machine has to servers on other hosts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from tectofs.benchmarks.common import (
    alternate,
    baseline_tree,
    drop_caches,
    parse_size,
    process_cpu_s,
    source_tree,
    write_results,
)
from tectofs.benchmarks.report import print_targets, target

HERE = os.path.dirname(os.path.realpath(__file__))

ROLES = ("client", "chunk servers", "metadata service")


def child(size: int, runs: int) -> dict[str, Any]:
    """In a process whose ``tectofs`` is the tree measured: per-run CPU seconds per GB."""
    import warnings

    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt
    from tectofs.benchmarks.checkpoint_bench import empty_like_state, make_state_dict, same_state, tensor_bytes
    from tectofs.server.cluster import LocalCluster

    warnings.simplefilter("ignore")  # DCP: "torch.distributed is ... uninitialized"
    sd = make_state_dict(size)
    target = empty_like_state(sd)
    gb = tensor_bytes(sd) / 1e9
    per_run: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tectofs-cpu-per-gb-") as tmp:
        with LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)", gc_delay_s=3600.0) as cluster:
            base = f"tectofs://{cluster.address}/cpu"

            meta = cluster.meta_process
            assert meta is not None  # started with the cluster

            def roles() -> dict[str, float]:
                chunk = [p.pid for p in cluster.chunk_processes if p is not None]
                return {"client": time.process_time(), "chunk servers": sum(process_cpu_s(p) for p in chunk),
                        "metadata service": process_cpu_s(meta.pid)}

            def metered(way: str, call: Any) -> None:
                before, started = roles(), time.perf_counter()
                call()
                per_run.setdefault(f"wall {way}", []).append((time.perf_counter() - started) / gb)
                for role, seconds in roles().items():
                    per_run.setdefault(f"{way} {role}", []).append((seconds - before[role]) / gb)

            for i in range(runs + 1):
                uri = f"{base}/step_{i}"
                save = lambda: dcp.save(sd, storage_writer=tt.CheckpointWriter(uri))  # noqa: E731
                load = lambda: dcp.load(target, storage_reader=tt.CheckpointReader(uri))  # noqa: E731
                if i == 0:  # warm-up: pools, connections, staging
                    save()
                    load()
                    continue
                metered("save", save)
                drop_caches()
                metered("load", load)
                if not same_state(sd, target):
                    raise SystemExit(f"run {i}: the loaded state differs from the saved one")
            tt.close_all()
    return per_run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="90af9df",
                        help="git revision to compare with (default 90af9df, where issue 15's CPU figures were first measured)")
    parser.add_argument("--size", default="1G", help="state dict bytes (default 1G)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree, alternated (default 3)")
    parser.add_argument("--runs", type=int, default=3, help="metered saves and loads per process (default 3)")
    parser.add_argument("--tcp-arm", action="store_true",
                        help="also run this tree with local sockets off (TECTOFS_LOCAL_SOCKETS=0: every connection"
                             " TCP, as between hosts), as a third arm 'this tree, TCP'")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON result goes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = parse_size(args.size)
    if args.child:
        print(json.dumps(child(size, args.runs)))
        return
    with baseline_tree(args.baseline) as base_tree:
        trees = {"baseline": base_tree, "this tree": source_tree()}
        if args.tcp_arm:
            trees["this tree, TCP"] = source_tree()
        # TECTOFS_LOCAL_SOCKETS=0: the servers offer no local socket (tectofs/wire/local_sockets.py)
        runs = alternate(trees, args.rounds, "tectofs.benchmarks.cpu_per_gb",
                         ["--child", "--size", str(size), "--runs", str(args.runs)],
                         env={"this tree, TCP": {"TECTOFS_LOCAL_SOCKETS": "0"}})
    medians = {name: {key: round(statistics.median(v), 3) for key, v in sorted(r.items())} for name, r in runs.items()}
    totals = {name: {way: round(sum(m[f"{way} {role}"] for role in ROLES), 3) for way in ("save", "load")}
              for name, m in medians.items()}
    ratios = {f"{way} CPU per GB, {name} / baseline": round(totals[name][way] / totals["baseline"][way], 3)
              for name in trees if name != "baseline" for way in ("save", "load")}
    # Wall seconds per GB of the same metered calls: speed, beside the CPU it cost (noisier).
    wall_ratios = {f"{way} wall s per GB, {name} / baseline":
                   round(medians[name][f"wall {way}"] / medians["baseline"][f"wall {way}"], 3)
                   for name in trees if name != "baseline" for way in ("save", "load")}
    result = {
        "benchmark": "cpu_per_gb", "baseline": args.baseline, "size_bytes": size, "rounds": args.rounds,
        "runs_per_process": args.runs, "cpu_seconds_per_GB": medians, "totals": totals, "ratios": ratios,
        "wall_ratios": wall_ratios, "per_run": runs,
        # The target is the default configuration's (a local cluster: local sockets on); the TCP
        # arm, when run, is reported beside it.
        "targets": [target(name, value, at_most=0.6) for name, value in ratios.items() if "TCP" not in name],
    }
    others = [name for name in trees if name != "baseline"]
    print(f"{'CPU s per GB (medians)':34s} {'baseline ' + args.baseline:>18s}" + "".join(f" {n:>15s}" for n in others))
    for key in medians["baseline"]:
        print(f"{key:34s} {medians['baseline'][key]:18.3f}"
              + "".join(f" {medians[n].get(key, float('nan')):15.3f}" for n in others))
    for way in ("save", "load"):
        print(f"{way + ' total':34s} {totals['baseline'][way]:18.3f}" + "".join(f" {totals[n][way]:15.3f}" for n in others))
    for name, value in ratios.items():
        if "TCP" in name:
            print(f"{name}: {value}")
    for name, value in wall_ratios.items():
        print(f"{name}: {value}")
    print_targets(result)
    print("results:", write_results(args.out, "cpu_per_gb", result))


if __name__ == "__main__":
    main()
