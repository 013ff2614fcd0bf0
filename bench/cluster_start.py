"""What starting a local cluster costs in CPU: its metadata service and chunk servers, each a
Python process, read from /proc once ``LocalCluster.start()`` returns (every server is then
registered and serving). The test suite starts about 200 such clusters per run, so this is a
large share of its CPU time. Medians of ``--repeats`` starts.

    python3 -m tectofs.benchmarks.cluster_start --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from tectofs.benchmarks.common import process_cpu_s, write_results


def one_start(servers: int) -> tuple[float, float]:
    """(seconds until ``start()`` returned, CPU seconds of the cluster's processes by then)."""
    from tectofs.server.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="tectofs-cluster-start-") as root:
        cluster = LocalCluster(os.path.join(root, "cluster"), servers=servers)
        started = time.perf_counter()
        cluster.start()
        try:
            wall = time.perf_counter() - started
            processes = [cluster.meta_process, *cluster.chunk_processes]
            return wall, sum(process_cpu_s(p.pid) for p in processes if p is not None)
        finally:
            cluster.stop()


def run(repeats: int, servers: int) -> dict[str, Any]:
    starts = [one_start(servers) for _ in range(repeats)]
    return {"benchmark": "cluster_start", "servers": servers, "repeats": repeats,
            "wall_s_median": round(statistics.median(w for w, _ in starts), 3),
            "cpu_s_median": round(statistics.median(c for _, c in starts), 3),
            "cpu_s_runs": [round(c, 3) for _, c in starts]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="cluster starts (default 5)")
    parser.add_argument("--servers", type=int, default=6, help="chunk servers per cluster (default 6)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    result = run(args.repeats, args.servers)
    write_results(args.out, "cluster_start", result)
    print(f"local cluster of 1 metadata service + {args.servers} chunk servers: start {result['wall_s_median']} s,"
          f" {result['cpu_s_median']} CPU-s in its processes (median of {args.repeats}; runs {result['cpu_s_runs']})")


if __name__ == "__main__":
    main()
