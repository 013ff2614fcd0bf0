"""Metadata operations per second through the client library, for this tree and a baseline
revision in the same run: what a change to the metadata path (its messages, checks, dispatch)
costs, as a same-run ratio.

    python3 -m tectofs.benchmarks.meta_ops --baseline 7fda89e --files 2000 --concurrency 32 --rounds 3

Each round runs one fresh process per tree, alternating (``common.alternate``); each starts its
own local cluster (6 chunk servers, rs(4,2)) and one client (root's credential), and with
``--concurrency`` calls in flight: creates ``--files`` empty files (an open for writing and its
close: a create), stats each (a lookup), lists their directory page by page, and removes each
(an unlink). It reports each kind's operations per second (medians over rounds) and this
tree's ratio to the baseline's. Only the public API (``open``, ``stat``, ``scandir``,
``remove``) is used, so any revision can be the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from typing import Any, Awaitable, Callable

from tectofs.benchmarks.common import alternate, baseline_tree, source_tree, write_results

HERE = os.path.dirname(os.path.realpath(__file__))

KINDS = ("create", "stat", "list", "remove")


async def _in_flight(count: int, concurrency: int, one: Callable[[int], Awaitable[Any]]) -> None:
    """``one(i)`` for every ``i`` below ``count``, at most ``concurrency`` at once."""
    next_index = iter(range(count))

    async def worker() -> None:
        for i in next_index:
            await one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def child(files: int, concurrency: int) -> dict[str, list[float]]:
    """In a process whose ``tectofs`` is the tree measured: operations per second of each kind."""
    from tectofs.client import connect
    from tectofs.server.cluster import LocalCluster

    rates: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tectofs-meta-ops-") as tmp:
        with LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)") as cluster:
            with connect(cluster.address, credentials=cluster.credential_file) as fs:
                fs.mkdir("/ops")
                aio = fs.aio

                async def create(i: int) -> None:
                    handle = await aio.open(f"/ops/f{i:07d}", "wb")
                    await handle.close()

                async def stat(i: int) -> None:
                    await aio.stat(f"/ops/f{i:07d}")

                async def remove(i: int) -> None:
                    await aio.remove(f"/ops/f{i:07d}")

                async def listing() -> None:
                    listed = await aio.scandir("/ops")
                    if len(listed) != files:
                        raise SystemExit(f"listed {len(listed)} entries of {files}")

                async def measure() -> None:
                    for kind, one in (("create", create), ("stat", stat)):
                        started = time.perf_counter()
                        await _in_flight(files, concurrency, one)
                        rates[kind] = [files / (time.perf_counter() - started)]
                    started = time.perf_counter()
                    await listing()
                    rates["list"] = [files / (time.perf_counter() - started)]  # entries listed per second
                    started = time.perf_counter()
                    await _in_flight(files, concurrency, remove)
                    rates["remove"] = [files / (time.perf_counter() - started)]

                fs.run(measure())
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", help="the git revision to compare with (a worktree is made); required")
    parser.add_argument("--files", type=int, default=2000, help="empty files per round (default 2000)")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="processes per tree, alternated (default 3)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON result goes")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.files < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--files, --concurrency and --rounds must be at least 1")
    if args.child:
        print(json.dumps(child(args.files, args.concurrency)))
        return
    if not args.baseline:
        parser.error("--baseline REVISION is required")
    with baseline_tree(args.baseline) as base_tree:
        trees = {"baseline": base_tree, "this tree": source_tree()}
        runs = alternate(trees, args.rounds, "tectofs.benchmarks.meta_ops",
                         ["--child", "--files", str(args.files), "--concurrency", str(args.concurrency)])
    medians = {name: {kind: round(statistics.median(r[kind]), 1) for kind in KINDS} for name, r in runs.items()}
    ratios = {kind: round(medians["this tree"][kind] / medians["baseline"][kind], 3) for kind in KINDS}
    result = {"benchmark": "meta_ops", "baseline": args.baseline, "files": args.files,
              "concurrency": args.concurrency, "rounds": args.rounds, "ops_per_s": medians,
              "ratio_this_tree_to_baseline": ratios, "per_run": runs}
    print(f"{'ops/s (medians)':16s} {'baseline ' + args.baseline:>18s} {'this tree':>12s} {'ratio':>8s}")
    for kind in KINDS:
        print(f"{kind:16s} {medians['baseline'][kind]:18.1f} {medians['this tree'][kind]:12.1f} {ratios[kind]:8.3f}")
    print("results:", write_results(args.out, "meta_ops", result))


if __name__ == "__main__":
    main()
