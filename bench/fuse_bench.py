"""One sequential stream through the FUSE mount vs. the client library vs. a local file.

    python3 -m tectofs.benchmarks.fuse_bench --size 2G --repeats 3

Starts a local cluster (6 chunk servers, rs(4,2), 64 MiB blocks) under a temporary
directory on the same disk as the local baseline, then writes and reads the same bytes
(8 MiB calls) with: a local file (write + fsync; read after dropping the page cache), the
client library, and the mount served multi-threaded and single-threaded (write + fsync +
close, which commits; read after dropping caches — the mount also drops its own page cache
at every open). Reports medians, ratios mount/client and the mount daemon's CPU seconds
per GB. Targets: mount write >= 0.5x and read >= 0.7x of the client library.

Metadata (``--metadata-only`` runs just this part, in about a minute): one process creates
``--files`` (default 2,000) empty files in one new directory (``open(O_CREAT|O_WRONLY)`` +
``close``), then ``os.stat``s them, then lists the directory and ``os.lstat``s every name listed
(``ls -l``, ``du``: "listed stats"), then unlinks them, through the mount and in a local
directory beside the cluster (the baseline); medians of ``--repeats`` runs (at least 3),
ratios to local, CPU milliseconds per operation of the mount daemon and of the metadata
service, store operations and group commits per operation. Target: 1,500 creates/s and
1,500 unlinks/s through the mount, reported as met / not met. Stats and unlinks start once
the mount's attribute timeout has expired, so each one reaches the mount daemon.

    python3 -m tectofs.benchmarks.fuse_bench --metadata-only --files 2000 --repeats 3

Everything shares this machine's cores (FUSE daemon, client, chunk servers, metadata
service), so absolute numbers drift between runs; ratios from one run hold better.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import defaultdict
from typing import Any, Callable

from tectofs.benchmarks.common import drop_caches, fs_type, parse_size, process_cpu_s, work_dir, write_results
from tectofs.benchmarks.report import Target, print_targets, verdict
from tectofs.benchmarks.report import target as goal
from tectofs.client import connect
from tectofs.client.fuse import start_mount_process
from tectofs.server.cluster import LocalCluster

CALL_BYTES = 8 << 20           # bytes per write/readinto call
PATTERN_BYTES = 256 << 20      # random bytes repeated to make the file (content does not matter for speed)
# name -> start_mount_process options
MODES: dict[str, dict[str, Any]] = {
    "mount multi-thread": {},
    "mount single-thread": {"single_thread": True},
    "mount negative cache": {"negative_cache_s": 1.0},  # --negative-entry-cache 1 (off by default)
}
DATA_MODES_DEFAULT = ("mount multi-thread", "mount single-thread")
# mounts the metadata part measures: the default mount, and with the negative entry cache
META_MODES_DEFAULT = ("mount multi-thread", "mount negative cache")
META_FILES_DEFAULT = 2000      # empty files created, stat'ed and unlinked per metadata run
META_TARGETS = {"creates/s": 1500, "unlinks/s": 1500}  # through the mount, one process, one directory
META_TARGET_TEXT = "1,500 creates/s and 1,500 unlinks/s"
ATTR_TIMEOUT_S = 1.0           # the mounts' attribute/entry timeout (tectofs mount's default)


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




def _store_stats(fs: Any) -> dict[str, int]:
    """The metadata service's store counters: operations run and group commits made."""
    reply = fs.run(fs.aio.metadata.stats())
    return dict(reply.store)


def _create_files(names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
    return time.perf_counter() - started


def _stat_files(names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        os.stat(name)
    return time.perf_counter() - started


def _unlink_files(names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        os.unlink(name)
    return time.perf_counter() - started


def _list_and_stat_files(names: list[str]) -> float:
    """``ls -l``'s and ``du``'s way: list the directory, then stat every name listed."""
    started = time.perf_counter()
    directory = os.path.dirname(names[0])
    for name in os.listdir(directory):
        os.lstat(os.path.join(directory, name))
    return time.perf_counter() - started


META_OPS = {"creates/s": _create_files, "stats/s": _stat_files, "listed stats/s": _list_and_stat_files,
            "unlinks/s": _unlink_files}  # in this order


def _metadata_round(where: str, directory: str, files: int, settle_s: float, times: dict[str, list[float]],
                    cpu: dict[str, list[float]], pids: list[int | None], store: dict[str, list[float]],
                    fs: Any) -> None:
    """Create, stat and unlink ``files`` empty files in a new ``directory``; records seconds,
    CPU seconds of ``pids`` (mount daemon, metadata service) and store operations/commits.
    Before stats and unlinks, waits ``settle_s`` (the mount's attribute timeout) so that the
    kernel asks the mount rather than answering from its cache, as for files made long ago."""
    os.mkdir(directory)
    names = [os.path.join(directory, f"f{n:06d}") for n in range(files)]
    try:
        for op, measure in META_OPS.items():
            if op != "creates/s" and settle_s:
                time.sleep(settle_s)
            before = [process_cpu_s(pid) if pid else 0.0 for pid in pids]
            counters = _store_stats(fs) if fs is not None else None
            times[f"{where} {op}"].append(measure(names))
            for i, pid in enumerate(pids):
                if pid:
                    cpu[f"{where} {op} {i}"].append(process_cpu_s(pid) - before[i])
            if counters is not None:
                after = _store_stats(fs)
                for key in ("operations", "commits"):
                    store[f"{where} {op} {key}"].append(after.get(key, 0) - counters.get(key, 0))
            if op == "creates/s":
                listed = len(os.listdir(directory))
                assert listed == files, f"{where}: {listed} of {files} files created in {directory}"
        assert not os.listdir(directory), f"{where}: files left in {directory} after the unlinks"
    finally:
        for name in os.listdir(directory):  # after a failure: leave nothing behind
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)


def _metadata_results(files: int, repeats: int, meta_modes: tuple[str, ...], times: dict[str, list[float]],
                      cpu: dict[str, list[float]], store: dict[str, list[float]]) -> dict[str, Any]:
    rates = {name: statistics.median(files / t for t in runs) for name, runs in times.items()}
    rows = []
    ratios: dict[str, Any] = {}
    verdicts = {}
    for where in ("local", *meta_modes):
        for op in META_OPS:
            name = f"{where} {op}"
            local = rates[f"local {op}"]
            target = META_TARGETS.get(op)
            row: dict[str, Any] = {
                "what": name, "ops/s (median)": round(rates[name]), "runs ops/s": [round(files / t) for t in times[name]],
                "vs local": round(rates[name] / local, 4),
                "target": "-" if where == "local" or target is None else
                          f">= {target:,}: {'met' if rates[name] >= target else 'NOT met'}",
            }
            for i, label in enumerate(("daemon CPU ms/op", "MDS CPU ms/op")):
                runs = cpu.get(f"{name} {i}")
                row[label] = round(statistics.median(runs) * 1000 / files, 3) if runs else "-"
            for key, label in (("operations", "store ops/op"), ("commits", "commits/op")):
                runs = store.get(f"{name} {key}")
                row[label] = round(statistics.median(runs) / files, 2) if runs else "-"
            rows.append(row)
            if where != "local":
                ratios[f"{where} {op} / local"] = round(rates[name] / local, 4)
        if where != "local":
            met = all(rates[f"{where} {op}"] >= target for op, target in META_TARGETS.items())
            verdicts[where] = {"met": met, **{op: round(rates[f"{where} {op}"]) for op in META_TARGETS}}
            ratios[f"{where} metadata target ({META_TARGET_TEXT})"] = verdict(met)
    targets = [goal(f"{where} {op}", rates[f"{where} {op}"], at_least=bound, unit="/s")
               for where in meta_modes for op, bound in META_TARGETS.items()]
    return {
        "files": files, "repeats": repeats, "rows": rows, "ratios": ratios, "targets": targets,
        "target": {"text": META_TARGET_TEXT, **META_TARGETS, "by_mode": verdicts,
                   "met": all(v["met"] for v in verdicts.values())},
    }


def run(out_dir: str, size_bytes: int = 2 << 30, repeats: int = 3, work_dir: str | None = None,
        modes: tuple[str, ...] = DATA_MODES_DEFAULT, progress: Callable[[int], None] | None = None,
        files: int = META_FILES_DEFAULT, meta_repeats: int | None = None, data: bool = True,
        metadata: bool = True, meta_modes: tuple[str, ...] = META_MODES_DEFAULT) -> dict[str, Any]:
    """Measure and return ``{"rows": [...], "ratios": {...}, "metadata": {...}, ...}``; writes
    ``fuse_bench.json``. ``data``: the streaming part (``size_bytes``, ``repeats``, ``modes``);
    ``metadata``: creates, stats and unlinks of ``files`` empty files per run, ``meta_repeats``
    runs (default: ``repeats``, at least 3), through the mounts ``meta_modes`` and in a local
    directory next to the cluster."""
    assert data or metadata
    assert size_bytes > 0
    assert repeats > 0 and files > 0
    assert all(m in MODES for m in (*modes, *meta_modes))
    meta_repeats = meta_repeats or max(3, repeats)
    pattern = memoryview(os.urandom(min(size_bytes, PATTERN_BYTES))) if data else memoryview(b"")
    names = ["local write+fsync", "local read", "client write", "client read"]
    names += [f"{mode} {op}" for mode in modes for op in ("write", "read")]
    times: dict[str, list[float]] = {name: [] for name in names}
    daemon_cpu: dict[str, list[float]] = {f"{mode} {op}": [] for mode in modes for op in ("write", "read")}
    meta_times: dict[str, list[float]] = defaultdict(list)
    meta_cpu: dict[str, list[float]] = defaultdict(list)
    meta_store: dict[str, list[float]] = defaultdict(list)
    caches_dropped = drop_caches() if data else False
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        local_fs = fs_type(tmp)
        with LocalCluster(os.path.join(tmp, "cluster")) as cluster, connect(cluster.address) as fs:
            mounts = {}
            try:
                for mode in dict.fromkeys((*(modes if data else ()), *(meta_modes if metadata else ()))):
                    mountpoint = os.path.join(tmp, mode.replace(" ", "-"))
                    log_path = os.path.join(out_dir, f"fuse_bench-{mode.replace(' ', '-')}.log")
                    mounts[mode] = start_mount_process(cluster.address, mountpoint, log_path=log_path,
                                                       attr_timeout_s=ATTR_TIMEOUT_S, **MODES[mode])
                local = os.path.join(tmp, "local.bin")
                for i in range(repeats if data else 0):
                    times["local write+fsync"].append(_write_file(local, pattern, size_bytes))
                    times["local read"].append(_read_file(local, size_bytes))
                    os.unlink(local)
                    times["client write"].append(_client_write(fs, f"/client-{i}.bin", pattern, size_bytes))
                    times["client read"].append(_client_read(fs, f"/client-{i}.bin", size_bytes))
                    fs.remove(f"/client-{i}.bin")
                    for mode in modes:
                        mounted = mounts[mode]
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
                meta_pid = cluster.meta_process.pid if cluster.meta_process is not None else None
                for i in range(meta_repeats if metadata else 0):
                    _metadata_round("local", os.path.join(tmp, f"local-meta-{i}"), files, 0.0,
                                    meta_times, meta_cpu, [None, None], meta_store, None)
                    for mode in meta_modes:
                        mounted = mounts[mode]
                        _metadata_round(mode, os.path.join(mounted.mountpoint, f"meta-{mode.replace(' ', '-')}-{i}"),
                                        files, ATTR_TIMEOUT_S + 0.1, meta_times, meta_cpu, [mounted.pid, meta_pid],
                                        meta_store, fs)
                    if progress is not None:
                        progress(1)
            finally:
                for mounted in mounts.values():
                    mounted.stop()
    rows = []
    ratios: dict[str, Any] = {}
    targets: list[Target] = []
    if data:
        gbps = {name: size_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
        ratios["client write / local write+fsync"] = gbps["client write"] / gbps["local write+fsync"]
        ratios["client read / local read"] = gbps["client read"] / gbps["local read"]
        for mode in modes:
            ratios[f"{mode} write / client write (target >= 0.5)"] = gbps[f"{mode} write"] / gbps["client write"]
            ratios[f"{mode} read / client read (target >= 0.7)"] = gbps[f"{mode} read"] / gbps["client read"]
        ratios = {k: round(v, 3) for k, v in ratios.items()}
        for mode in modes:
            targets.append(goal(f"{mode} write / client write", ratios[f"{mode} write / client write (target >= 0.5)"],
                                  at_least=0.5))
            targets.append(goal(f"{mode} read / client read", ratios[f"{mode} read / client read (target >= 0.7)"],
                                  at_least=0.7))
        for name, value in gbps.items():
            row: dict[str, Any] = {"what": name, "GB/s (median)": round(value, 3),
                                   "runs_s": [round(t, 2) for t in times[name]]}
            cpu_runs = daemon_cpu.get(name)
            row["daemon CPU s/GB"] = round(statistics.median(cpu_runs) / (size_bytes / 1e9), 2) if cpu_runs else "-"
            rows.append(row)
    result: dict[str, Any] = {
        "benchmark": "fuse_bench", "size_bytes": size_bytes if data else 0, "repeats": repeats if data else 0,
        "call_bytes": CALL_BYTES, "rows": rows, "ratios": ratios, "targets": targets,
        "caches_dropped": caches_dropped, "cpus": os.cpu_count(),
        "note": "one sequential stream; cluster: 6 chunk servers, rs(4,2), 64 MiB blocks, same host"
                + ("" if caches_dropped or not data else "; page cache NOT dropped (needs root): local reads may be cached"),
    }
    if metadata:
        meta = _metadata_results(files, meta_repeats, tuple(meta_modes), meta_times, meta_cpu, meta_store)
        meta["local_dir_fs"] = local_fs
        meta["attr_timeout_s"] = ATTR_TIMEOUT_S
        meta["note"] = (f"one process, one directory, {files} empty files per run: create = open(O_CREAT|O_WRONLY) "
                        f"+ close, then os.stat, then os.unlink of each; before stats and unlinks the mount's "
                        f"{ATTR_TIMEOUT_S:g} s attribute/entry timeout is let expire, so every call reaches the "
                        f"mount (as for files made long ago); local directory on {local_fs}, no fsync")
        result["metadata"] = meta
        result["ratios"].update(meta["ratios"])
        targets.extend(meta["targets"])
    write_results(out_dir, "fuse_bench", result)
    return result


def print_summary(result: dict[str, Any]) -> None:
    """The streaming table (if measured), the metadata table and the ratios and targets."""
    tables = [result.get("rows") or [], (result.get("metadata") or {}).get("rows") or []]
    for rows in tables:
        if not rows:
            continue
        keys = list(rows[0])
        cells = [[" ".join(map(str, r[k])) if isinstance(r[k], list) else str(r[k]) for k in keys] for r in rows]
        widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
        for c in cells:
            print("  ".join(v.ljust(w) for v, w in zip(c, widths)))
        print()
    for name, value in (result.get("ratios") or {}).items():
        print(f"{name}: {value}")
    meta = result.get("metadata")
    if meta:
        print(meta["note"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("2G"), help="file size (default 2G)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--out", default="bench/results", help="directory for fuse_bench.json")
    parser.add_argument("--work-dir", help="where the cluster and local file live, created if missing "
                                           "(default: system temp dir)")
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(DATA_MODES_DEFAULT),
                        help="FUSE serving modes the data part measures (default: multi- and single-thread)")
    parser.add_argument("--files", type=int, default=META_FILES_DEFAULT,
                        help=f"metadata: empty files per run (default {META_FILES_DEFAULT})")
    parser.add_argument("--meta-modes", nargs="+", choices=list(MODES), default=list(META_MODES_DEFAULT),
                        help="mounts the metadata part measures (default: multi-thread, and multi-thread with"
                        " --negative-entry-cache 1)")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--metadata-only", action="store_true", help="only creates/stats/unlinks, no data streams")
    part.add_argument("--data-only", action="store_true", help="only the data streams")
    args = parser.parse_args(argv)
    result = run(args.out, args.size, args.repeats, work_dir(args.work_dir), tuple(args.modes), files=args.files,
                 meta_repeats=args.repeats, data=not args.metadata_only, metadata=not args.data_only,
                 meta_modes=tuple(args.meta_modes))
    print_summary(result)
    print(json.dumps({"caches_dropped": result["caches_dropped"], "note": result["note"]}, indent=2))
    print_targets(result)


if __name__ == "__main__":
    main()
