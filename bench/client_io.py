"""Large-file write and read through the client library vs. a local file with fsync.

    python3 -m tectofs.benchmarks.client_io --size 1G --repeats 3

Starts a local cluster (6 chunk servers, rs(4,2), 64 MiB blocks) under a temporary
directory on the same disk as the baseline, writes and reads the same bytes both ways, and
reports medians and ratios from the same run (this machine is shared: absolute numbers
drift, ratios hold better).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from tectofs.benchmarks.common import drop_caches, parse_size, print_table, work_dir, write_results
from tectofs.client import connect
from tectofs.server.cluster import LocalCluster

CHUNK = 8 << 20


def _local_write(path: str, data: memoryview) -> float:
    started = time.perf_counter()
    with open(path, "wb") as f:
        for i in range(0, len(data), CHUNK):
            f.write(data[i : i + CHUNK])
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - started


def _local_read(path: str, size: int) -> float:
    drop_caches()
    buffer = bytearray(CHUNK)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass
    return time.perf_counter() - started


def _client_write(fs: Any, path: str, data: memoryview) -> float:
    started = time.perf_counter()
    with fs.open(path, "wb") as f:
        for i in range(0, len(data), CHUNK):
            f.write(data[i : i + CHUNK])
    return time.perf_counter() - started


def _client_read(fs: Any, path: str, size: int) -> float:
    drop_caches()
    buffer = bytearray(CHUNK)
    started = time.perf_counter()
    with fs.open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass
    return time.perf_counter() - started


def run(out_dir: str, size_bytes: int, repeats: int = 3, work_dir: str | None = None,
        progress: Any = None) -> dict[str, Any]:
    """Measure and return ``{"rows": [...], "ratios": {...}}``; writes ``client_io.json``."""
    data = memoryview(os.urandom(size_bytes))
    times: dict[str, list[float]] = {"local write+fsync": [], "local read": [], "client write": [], "client read": []}
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        with LocalCluster(os.path.join(tmp, "cluster"), log_to_files=True) as cluster, connect(cluster.address) as fs:
            local = os.path.join(tmp, "local.bin")
            for i in range(repeats):
                times["local write+fsync"].append(_local_write(local, data))
                times["local read"].append(_local_read(local, size_bytes))
                times["client write"].append(_client_write(fs, f"/bench-{i}.bin", data))
                times["client read"].append(_client_read(fs, f"/bench-{i}.bin", size_bytes))
                fs.remove(f"/bench-{i}.bin")
                os.unlink(local)
                if progress is not None:
                    progress(1)
    gbps = {name: size_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
    ratios = {
        "client write / local write+fsync": gbps["client write"] / gbps["local write+fsync"],
        "client read / local read": gbps["client read"] / gbps["local read"],
    }
    rows = [{"what": name, "GB/s (median)": round(v, 3), "runs_s": [round(t, 3) for t in times[name]]}
            for name, v in gbps.items()]
    result = {"benchmark": "client_io", "size_bytes": size_bytes, "repeats": repeats, "rows": rows,
              "ratios": {k: round(v, 3) for k, v in ratios.items()},
              "note": "client writes store 1.5x the bytes (rs(4,2)) and survive any 2 of 6 servers lost"}
    write_results(out_dir, "client_io", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure, the median is reported (default 3)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--work-dir", default=None,
                        help="where the cluster and local file go, created if missing (default: $TMPDIR)")
    args = parser.parse_args()
    result = run(args.out, args.size, args.repeats, work_dir=work_dir(args.work_dir))
    print_table(result)
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
