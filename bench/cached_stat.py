"""Cached ``stat`` per second from one process: ``os.stat`` of one file, ``--stats`` times,
through a mount holding metadata leases, a ``--no-leases`` mount and a local directory, in the
same run (medians of ``--rounds``), and the leased mount's rate relative to the local disk's.

    python3 -m tectofs.benchmarks.cached_stat --stats 50000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from tectofs.benchmarks.common import print_table, write_results

HERE = os.path.dirname(os.path.realpath(__file__))


def _rate(path: str, stats: int) -> float:
    os.stat(path)  # the first one asks; the rest are what is measured
    started = time.perf_counter()
    for _ in range(stats):
        os.stat(path)
    return stats / (time.perf_counter() - started)


def run(stats: int, rounds: int) -> dict[str, Any]:
    from tectofs.client.fuse import start_mount_process
    from tectofs.server.cluster import LocalCluster

    with tempfile.TemporaryDirectory(prefix="tectofs-cached-stat-") as root:
        cluster = LocalCluster(os.path.join(root, "cluster"))
        address = cluster.start()
        mounts = []
        try:
            paths = {}
            for name, leases in (("leased mount", True), ("no-leases mount", False)):
                mount = start_mount_process(address, os.path.join(root, name.replace(" ", "-")), leases=leases,
                                            credentials=cluster.credential_file)
                mounts.append(mount)
                paths[name] = os.path.join(mount.mountpoint, "f")
            local = os.path.join(root, "local")
            os.makedirs(local)
            paths["local"] = os.path.join(local, "f")
            for path in paths.values():
                with open(path, "wb") as f:
                    f.write(b"x")
            samples: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(rounds):
                for name, path in paths.items():
                    samples[name].append(_rate(path, stats))
        finally:
            for mount in mounts:
                mount.stop()
            cluster.stop()
    medians = {name: statistics.median(v) for name, v in samples.items()}
    return {"benchmark": "cached_stat", "stats": stats, "rounds": rounds, "samples": samples,
            "rows": [{"where": name, "stats/s": f"{rate:,.0f}"} for name, rate in medians.items()],
            "ratios": {"leased mount / local": round(medians["leased mount"] / medians["local"], 3)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stats", type=int, default=50_000, help="stats per round and place (default 50,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, medians reported (default 3)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON result goes")
    args = parser.parse_args()
    result = run(args.stats, args.rounds)
    print_table(result)
    print("wrote", write_results(args.out, "cached_stat", result))


if __name__ == "__main__":
    main()
