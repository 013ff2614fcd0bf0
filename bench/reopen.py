"""Opening a file again through the mount: ``open`` + ``read`` of 4 KiB + ``close`` in a loop,
of files kept in chunks and of small files kept inline, beside a local directory, in the same
run (medians of ``--rounds``), with the ``layout`` calls each open made.

    python3 -m tectofs.benchmarks.reopen --files 8 --seconds 2 --rounds 3

Starts a local cluster (6 chunk servers, rs(4,2), metrics on) and a mount holding metadata
leases, writes ``--files`` files of 300 KB (kept in chunks) and as many of 4 KiB (inline)
through it, reads each once, then loops over each group for ``--seconds``. An open of a small
file is answered from the mount's cache (its bytes came with its layout); an open of a file
kept in chunks takes the reader's lease its last reader parked (``MetadataCache.park_reader``)
instead of a ``layout`` call. To compare two revisions, run it from each checkout:
``python3 -m`` from a checkout's root imports that checkout's tectofs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

from tectofs.benchmarks.common import print_table, write_results

GROUPS = {"300 KB (chunks on tectofs)": 300_000, "4 KiB (inline on tectofs)": 4096}


def _layout_calls(url: str) -> float:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "tectofs_meta_requests_total" and sample.labels.get("op") == "layout")


def _cycle_us(paths: list[str], seconds: float) -> tuple[float, int]:
    """Microseconds per open + read 4 KiB + close, cycling over ``paths`` for ``seconds``;
    and how many cycles ran."""
    cycles, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.read(fd, 4096)
            os.close(fd)
            cycles += 1
    return (time.perf_counter() - started) / cycles * 1e6, cycles


def run(files: int, seconds: float, rounds: int) -> dict[str, Any]:
    from tectofs.client.fuse import start_mount_process
    from tectofs.server.cluster import LocalCluster

    samples: dict[str, list[float]] = {}
    calls_per_open: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tectofs-reopen-") as root:
        with LocalCluster(os.path.join(root, "cluster"), servers=6, policy="rs(4,2)", metrics=True) as cluster:
            mount = start_mount_process(cluster.address, os.path.join(root, "mnt"),
                                        log_path=os.path.join(root, "mount.log"), credentials=cluster.credential_file)
            try:
                places = {"mount": mount.mountpoint, "local": os.path.join(root, "local")}
                os.makedirs(places["local"])
                groups: dict[tuple[str, str], list[str]] = {}
                for place, top in places.items():
                    for g, (group, size) in enumerate(GROUPS.items()):
                        paths = [os.path.join(top, f"g{g}-f{i}") for i in range(files)]
                        for path in paths:
                            with open(path, "wb") as f:
                                f.write(os.urandom(size))
                        for path in paths:  # the first read: what later opens find kept
                            with open(path, "rb") as f:
                                f.read()
                        groups[(place, group)] = paths
                for _ in range(rounds):
                    for (place, group), paths in groups.items():
                        before = _layout_calls(cluster.metrics_urls["meta"]) if place == "mount" else 0.0
                        us, cycles = _cycle_us(paths, seconds)
                        samples.setdefault(f"{place}: {group}", []).append(us)
                        if place == "mount":
                            after = _layout_calls(cluster.metrics_urls["meta"])
                            calls_per_open.setdefault(group, []).append((after - before) / cycles)
            finally:
                mount.stop()
    medians = {name: statistics.median(v) for name, v in samples.items()}
    rows = [{"open + read 4 KiB + close": name, "us (median)": round(us, 1),
             "runs us": [round(v, 1) for v in samples[name]],
             "layout calls per open": (round(statistics.median(calls_per_open[name.split(": ", 1)[1]]), 3)
                                       if name.startswith("mount") else "")}
            for name, us in medians.items()]
    chunks, inline = (f"mount: {group}" for group in GROUPS)
    return {"benchmark": "reopen", "files": files, "seconds": seconds, "rounds": rounds, "rows": rows,
            "ratios": {"300 KB / 4 KiB, through the mount": round(medians[chunks] / medians[inline], 2)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=8, help="files of each kind (default 8)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per group and round (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, medians reported (default 3)")
    parser.add_argument("--out", default="bench/results", help="directory for reopen.json")
    args = parser.parse_args(argv)
    result = run(args.files, args.seconds, args.rounds)
    print_table(result)
    print("wrote", write_results(args.out, "reopen", result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
