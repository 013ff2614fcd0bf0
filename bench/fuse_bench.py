"""One sequential stream through the FUSE mount vs. the client library vs. a local file.

    python bench/fuse_bench.py --size 2G --repeats 3

Starts a local cluster (6 chunk servers, rs(4,2), 64 MiB blocks) under a temporary
directory on the same disk as the local baseline, then writes and reads the same bytes
(8 MiB calls) with: a local file (write + fsync; read after dropping the page cache), the
client library, and the mount served multi-threaded and single-threaded (write + fsync +
close, which commits; read after dropping caches — the mount also drops its own page cache
at every open). Reports medians, ratios mount/client and the mount daemon's CPU seconds
per GB. Targets: mount write >= 0.5x and read >= 0.7x of the client library.

Everything shares this machine's cores (FUSE daemon, client, chunk servers, metadata
service), so absolute numbers drift between runs; ratios from one run hold better.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import drop_caches, parse_size, print_table, process_cpu_s, write_results  # noqa: E402

from tectofs.client import connect  # noqa: E402
from tectofs.client.fuse import start_mount_process  # noqa: E402
from tectofs.server.cluster import LocalCluster  # noqa: E402

CALL_BYTES = 8 << 20           # bytes per write/readinto call
PATTERN_BYTES = 256 << 20      # random bytes repeated to make the file (content does not matter for speed)
MODES = {"mount multi-thread": False, "mount single-thread": True}  # name -> single_thread


def _pieces(pattern: memoryview, size: int) -> Any:
    done = 0
    while done < size:
        n = min(CALL_BYTES, size - done)
        start = done % len(pattern)
        n = min(n, len(pattern) - start)
        yield pattern[start : start + n]
        done += n


def _write_file(path: str, pattern: memoryview, size: int) -> float:
    """Local disk or mount: write, fsync, close."""
    started = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for piece in _pieces(pattern, size):
            os.write(fd, piece)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - started


def _read_file(path: str, size: int) -> float:
    drop_caches()
    buffer = bytearray(CALL_BYTES)
    total = 0
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            total += n
    elapsed = time.perf_counter() - started
    assert total == size, f"read {total} bytes of {size} from {path}"
    return elapsed


def _client_write(fs: Any, path: str, pattern: memoryview, size: int) -> float:
    started = time.perf_counter()
    with fs.open(path, "wb", buffering=0) as f:
        for piece in _pieces(pattern, size):
            f.write(piece)
    return time.perf_counter() - started


def _client_read(fs: Any, path: str, size: int) -> float:
    drop_caches()
    buffer = bytearray(CALL_BYTES)
    total = 0
    started = time.perf_counter()
    with fs.open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            total += n
    elapsed = time.perf_counter() - started
    assert total == size, f"read {total} bytes of {size} from tectofs:{path}"
    return elapsed




def run(out_dir: str, size_bytes: int = 2 << 30, repeats: int = 3, work_dir: str | None = None,
        modes: tuple[str, ...] = tuple(MODES), progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Measure and return ``{"rows": [...], "ratios": {...}, ...}``; writes ``fuse_bench.json``."""
    assert size_bytes > 0
    assert repeats > 0
    assert all(m in MODES for m in modes)
    pattern = memoryview(os.urandom(min(size_bytes, PATTERN_BYTES)))
    names = ["local write+fsync", "local read", "client write", "client read"]
    names += [f"{mode} {op}" for mode in modes for op in ("write", "read")]
    times: dict[str, list[float]] = {name: [] for name in names}
    daemon_cpu: dict[str, list[float]] = {f"{mode} {op}": [] for mode in modes for op in ("write", "read")}
    caches_dropped = drop_caches()
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        with LocalCluster(os.path.join(tmp, "cluster")) as cluster, connect(cluster.address) as fs:
            mounts = {}
            try:
                for mode in modes:
                    mountpoint = os.path.join(tmp, mode.replace(" ", "-"))
                    log_path = os.path.join(out_dir, f"fuse_bench-{mode.replace(' ', '-')}.log")
                    mounts[mode] = start_mount_process(cluster.address, mountpoint, single_thread=MODES[mode],
                                                       log_path=log_path)
                local = os.path.join(tmp, "local.bin")
                for i in range(repeats):
                    times["local write+fsync"].append(_write_file(local, pattern, size_bytes))
                    times["local read"].append(_read_file(local, size_bytes))
                    os.unlink(local)
                    times["client write"].append(_client_write(fs, f"/client-{i}.bin", pattern, size_bytes))
                    times["client read"].append(_client_read(fs, f"/client-{i}.bin", size_bytes))
                    fs.remove(f"/client-{i}.bin")
                    for mode, mounted in mounts.items():
                        # every mount shows the same namespace: one name per mode and run
                        path = os.path.join(mounted.mountpoint, f"{mode.replace(' ', '-')}-{i}.bin")
                        for op, measure in (("write", lambda: _write_file(path, pattern, size_bytes)),
                                            ("read", lambda: _read_file(path, size_bytes))):
                            cpu = process_cpu_s(mounted.pid)
                            times[f"{mode} {op}"].append(measure())
                            daemon_cpu[f"{mode} {op}"].append(process_cpu_s(mounted.pid) - cpu)
                        os.unlink(path)
                    if progress is not None:
                        progress(1)
            finally:
                for mounted in mounts.values():
                    mounted.stop()
    gbps = {name: size_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
    ratios = {
        "client write / local write+fsync": gbps["client write"] / gbps["local write+fsync"],
        "client read / local read": gbps["client read"] / gbps["local read"],
    }
    for mode in modes:
        ratios[f"{mode} write / client write (target >= 0.5)"] = gbps[f"{mode} write"] / gbps["client write"]
        ratios[f"{mode} read / client read (target >= 0.7)"] = gbps[f"{mode} read"] / gbps["client read"]
    rows = []
    for name, value in gbps.items():
        row: dict[str, Any] = {"what": name, "GB/s (median)": round(value, 3),
                               "runs_s": [round(t, 2) for t in times[name]]}
        cpu = daemon_cpu.get(name)
        row["daemon CPU s/GB"] = round(statistics.median(cpu) / (size_bytes / 1e9), 2) if cpu else "-"
        rows.append(row)
    result = {
        "benchmark": "fuse_bench", "size_bytes": size_bytes, "repeats": repeats, "call_bytes": CALL_BYTES,
        "rows": rows, "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "caches_dropped": caches_dropped, "cpus": os.cpu_count(),
        "note": "one sequential stream; cluster: 6 chunk servers, rs(4,2), 64 MiB blocks, same host"
                + ("" if caches_dropped else "; page cache NOT dropped (needs root): local reads may be cached"),
    }
    write_results(out_dir, "fuse_bench", result)
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("2G"), help="file size (default 2G)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--out", default="bench/results", help="directory for fuse_bench.json")
    parser.add_argument("--work-dir", help="where the cluster and local file live (default: system temp dir)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                        help="FUSE serving modes to measure")
    args = parser.parse_args(argv)
    result = run(args.out, args.size, args.repeats, args.work_dir, tuple(args.modes))
    print_table(result)
    print(json.dumps({"caches_dropped": result["caches_dropped"], "note": result["note"]}, indent=2))


if __name__ == "__main__":
    main()
