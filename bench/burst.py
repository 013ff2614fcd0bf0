"""Checkpoint burst: N ranks save a shard each at the same moment, commit one checkpoint
together, then all load it back and verify it.

    python3 -m tectofs.benchmarks.burst --ranks 1024 --shard 1M --processes 4 --dir-block-size 1M

What one run does, on a local cluster of its own (or ``--meta HOST:PORT``):

1. **Baseline**: one client writes (then reads) ``--baseline`` bytes as one large file. The
   burst's aggregate throughput is reported as a ratio against it, from the same run.
2. **Setup**: ``--processes`` worker processes each run one asyncio loop with ``ranks /
   processes`` simulated ranks; every rank has its own client (``AsyncFileSystem``: its own
   connections; buffer pool and codec threads are per process, as the client shares them).
3. **Save** (barrier): the coordinator creates ``/burst/.pending-<id>`` and gives every worker
   the same start time; at that moment every rank writes ``rank-<r>.bin`` there and closes
   it (close = upload the data, then commit the block list in one metadata call).
4. **Commit**: the coordinator writes ``.metadata`` (every rank's SHA-256) and renames the
   pending directory to ``/burst/step-<id>`` (one atomic metadata transaction).
5. **Load** (barrier): every rank reads its own digest from ``.metadata`` and its shard, and
   checks both against what it wrote.
6. **Next save** (barrier): every rank saves a second checkpoint, its connections to the
   chunk servers already open, as a job's later checkpoints are (the first save also opens
   them: 6 per rank here); committed like the first. ``--no-next-save`` skips it.
7. **Metadata storm** (barrier): every rank creates and closes ``--metadata-files`` empty
   files: what the MDS sustains without data.

Reported: per-rank and aggregate GB/s, p50/p99/max of save, close (commit) and load
latency, the slowest rank, metadata operations per second (MDS ``stats`` delta over each
phase), MDS and chunk-server CPU seconds per phase, the MDS's view of chunk-server liveness
and its response time during each phase, host-wide TCP listen overflows, chunk-server BUSY
answers, worker memory, errors (must be zero) and whether every server survived.

Nothing waits without a deadline: a phase that overruns ``--phase-timeout`` ends the run
with an error naming the phase and the ranks missing; a run that cannot fit in memory is
refused up front. On 2 cores, all ranks of a worker share its event loop and codec threads,
so client-side latencies include that queueing; ratios against the baseline hold better
than absolute figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import random
import selectors
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator

from tectofs import children
from tectofs.benchmarks import burst_report
from tectofs.benchmarks.burst_report import print_summary
from tectofs.benchmarks.burst_worker import METADATA_HEADER_BYTES, BurstError, MiB, _describe
from tectofs.benchmarks.common import parse_size, process_cpu_s, work_dir, write_results
from tectofs.benchmarks.report import print_targets

PROGRESS_STEPS = 6  # baseline, setup, save, commit, load, metadata storm


# =========================================================================== coordinator side


class _WorkerProcess:
    def __init__(self, index: int, config: dict[str, Any], log_path: str) -> None:
        self.index = index
        self.ranks = list(config["ranks"])
        self.log_path = log_path
        with open(log_path, "ab") as log:
            # -P and cli_env(): the worker imports the same tectofs as this process
            self.process = subprocess.Popen(
                [sys.executable, "-P", "-m", "tectofs.benchmarks.burst_worker", json.dumps(config)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                env=children.cli_env(),
            )
        os.set_blocking(self.process.stdout.fileno(), False)  # type: ignore[union-attr]
        self.pending = b""

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(command) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise BurstError(f"worker {self.index} exited ({self.tail_of_log()})") from None

    def tail_of_log(self, lines: int = 5) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                tail = f.read().strip().splitlines()[-lines:]
        except OSError:
            tail = []
        return f"exit code {self.process.poll()}; log {self.log_path}: " + (" | ".join(tail) or "empty")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Ask to exit, then kill this worker's own process group if it does not."""
        try:
            if self.process.poll() is None:
                self.send({"op": "exit"})
                self.process.stdin.close()  # type: ignore[union-attr]
        except (BurstError, OSError):
            pass
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def _collect(workers: list[_WorkerProcess], event: str, timeout_s: float) -> dict[int, dict[str, Any]]:
    """One ``event`` reply per worker, or BurstError naming who is missing at the deadline."""
    deadline = time.monotonic() + timeout_s
    replies: dict[int, dict[str, Any]] = {}
    with selectors.DefaultSelector() as selector:
        for w in workers:
            selector.register(w.process.stdout, selectors.EVENT_READ, w)  # type: ignore[arg-type]
        while len(replies) < len(workers):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [w for w in workers if w.index not in replies]
                ranks = sum(len(w.ranks) for w in missing)
                raise BurstError(
                    f"{event}: {len(missing)} worker(s) holding {ranks} ranks did not answer within {timeout_s:.0f}s "
                    f"(workers {[w.index for w in missing][:10]}; see {missing[0].log_path})"
                )
            for key, _ in selector.select(min(left, 1.0)):
                w = key.data
                chunk = os.read(w.process.stdout.fileno(), 1 << 20)  # type: ignore[union-attr]
                if not chunk:
                    selector.unregister(key.fileobj)
                    if w.index not in replies:
                        w.process.wait(timeout=10)
                        raise BurstError(f"{event}: worker {w.index} exited before answering ({w.tail_of_log()})")
                    continue
                w.pending += chunk
                while b"\n" in w.pending and w.index not in replies:
                    line, w.pending = w.pending.split(b"\n", 1)
                    try:
                        message = json.loads(line)
                    except ValueError:  # something else wrote to the worker's stdout
                        continue
                    if message.get("event") == event:
                        replies[w.index] = message
    return replies


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(round(q * (len(ordered) - 1)))))]

    return {"p50": at(0.50), "p99": at(0.99), "max": ordered[-1]}


def _mds_stats(fs: Any) -> dict[str, Any]:
    from tectofs.wire import messages

    reply = fs.run(fs.aio.metadata.stats())
    return dict(messages.to_plain(reply))


def _chunk_stats(fs: Any) -> dict[str, dict[str, int]]:
    from tectofs.wire import messages

    out: dict[str, dict[str, int]] = {}
    for server in fs.servers():
        if not server.live or not server.address:
            continue
        try:
            reply, _ = fs.run(fs.aio.rpc.call(server.address, messages.CHUNK_STAT, messages.Empty(), timeout_s=10))
            out[server.address] = dict(reply.stats)
        except Exception as exc:  # a dead server is reported by the survival check
            out[server.address] = {"error": _describe(exc)}  # type: ignore[dict-item]
    return out




class _CpuMeter:
    """CPU seconds spent by the cluster's own processes (MDS, chunk servers) over a phase;
    empty when the cluster is not ours (``--meta``)."""

    def __init__(self, cluster: Any) -> None:
        self.pids: dict[str, list[int]] = {"mds": [], "chunk_servers": []}
        if cluster is not None:
            self.pids["mds"] = [cluster.meta_process.pid]
            self.pids["chunk_servers"] = [p.pid for p in cluster.chunk_processes if p is not None]
        self.started: dict[str, float] = {}

    def _now(self) -> dict[str, float]:
        return {role: sum(process_cpu_s(pid) for pid in pids) for role, pids in self.pids.items()}

    def start(self) -> None:
        self.started = self._now()

    def stop(self) -> dict[str, float]:
        now = self._now()
        return {role: round(now[role] - self.started.get(role, 0.0), 3) for role in now} if self.pids["mds"] else {}


_TCP_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPSynRetrans", "TCPTimeouts")


def _tcp_counters() -> dict[str, int]:
    """Host-wide TCP counters (``/proc/net/netstat``): listen-queue overflows and SYN
    retransmissions show connection storms that a server's accept backlog did not absorb."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for names, values in zip(lines[::2], lines[1::2]):
        for name, value in zip(names.split()[1:], values.split()[1:]):
            if name in _TCP_COUNTERS:
                out[name] = int(value)
    return out


class _LivenessMonitor:
    """Samples the MDS's view of the chunk servers every ``interval_s`` during a phase: the
    fewest servers it considered live, the oldest heartbeat it held, and how long the
    ``servers`` call itself took (the MDS's responsiveness under the burst)."""

    def __init__(self, fs: Any, interval_s: float = 0.5) -> None:
        self.fs = fs
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[tuple[float, int, float, float, float]] = []
        self.tcp_before: dict[str, int] = {}
        # (time, live servers, oldest heartbeat age s, MDS `servers` call s, slowest chunk-server ping s)

    def _ping(self, address: str) -> float:
        from tectofs.wire import messages

        started = time.perf_counter()
        try:
            self.fs.run(asyncio.wait_for(self.fs.aio.rpc.call(address, messages.PING, messages.Empty(), timeout_s=30), 35))
        except Exception:
            pass
        return time.perf_counter() - started

    def _main(self) -> None:
        while not self._stop.wait(self.interval_s):
            started = time.perf_counter()
            try:
                servers = self.fs.servers()
            except Exception:
                continue
            call_s = time.perf_counter() - started
            now = time.time()
            ages = [now - s.last_heartbeat for s in servers]
            pings = [self._ping(s.address) for s in servers if s.address]
            self.samples.append((now, sum(1 for s in servers if s.live), max(ages, default=0.0), call_s,
                                 max(pings, default=0.0)))

    def start(self) -> None:
        self.samples = []
        self.tcp_before = _tcp_counters()
        self._stop.clear()
        self._thread = threading.Thread(target=self._main, name="burst-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if not self.samples:
            return {}
        tcp = _tcp_counters()
        return {
            "tcp_host_wide": {k: tcp[k] - self.tcp_before.get(k, 0) for k in tcp},
            "samples": len(self.samples),
            "min_live_chunk_servers": min(s[1] for s in self.samples),
            "max_heartbeat_age_s": round(max(s[2] for s in self.samples), 2),
            "servers_call_s": {k: round(v, 3) for k, v in _percentiles([s[3] for s in self.samples]).items()},
            "chunk_ping_s": {k: round(v, 3) for k, v in _percentiles([s[4] for s in self.samples]).items()},
        }


def _baseline(fs: Any, size_bytes: int, cpu: _CpuMeter) -> dict[str, Any]:
    """One client, one large file (the cluster's block size): write then read ``size_bytes``.
    GB/s each, and the servers' CPU seconds for each (large-chunk cost per GB). The reader
    checks a SHA-256 of what it reads, as every rank of the burst does."""
    from tectofs.wire import messages

    piece = 8 * MiB
    data = memoryview(os.urandom(min(size_bytes, piece)))
    expected = hashlib.sha256()
    for offset in range(0, size_bytes, len(data)):
        expected.update(data[: min(len(data), size_bytes - offset)])
    cpu.start()
    started = time.perf_counter()
    with fs.open("/burst-baseline.bin", "wb") as f:
        written = 0
        while written < size_bytes:
            n = min(len(data), size_bytes - written)
            f.write(data[:n])
            written += n
    write_s = time.perf_counter() - started
    write_cpu = cpu.stop()
    blocks = len(fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path="/burst-baseline.bin"))).blocks)
    buffer = bytearray(piece)
    cpu.start()
    started = time.perf_counter()
    digest = hashlib.sha256()
    with fs.open("/burst-baseline.bin", "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(memoryview(buffer)[:n])
    read_s = time.perf_counter() - started
    read_cpu = cpu.stop()
    if digest.digest() != expected.digest():
        raise BurstError("the baseline file read back differs from what was written")
    fs.remove("/burst-baseline.bin")
    return {"bytes": size_bytes, "blocks": blocks, "write_s": write_s, "read_s": read_s,
            "write_GBps": size_bytes / write_s / 1e9, "read_GBps": size_bytes / read_s / 1e9,
            "write_cpu_s": write_cpu, "read_cpu_s": read_cpu}


def _phase_summary(name: str, replies: dict[int, dict[str, Any]], start_at: float, shard_bytes: int,
                   mds_before: dict[str, Any], mds_after: dict[str, Any]) -> dict[str, Any]:
    rows = [row for reply in replies.values() for row in reply.get("rows", [])]
    fatal = [f"worker {i}: {r['fatal']}" for i, r in replies.items() if r.get("fatal")]
    ok = [r for r in rows if r[5] is None]
    errors = [f"rank {r[0]}: {r[5]}" for r in rows if r[5] is not None]
    ends = [r[2] for r in ok]
    wall_s = (max(ends) - start_at) if ends else float("nan")
    total_s = [r[2] - start_at for r in ok]  # latency from the barrier, as the job sees it
    slowest = max(ok, key=lambda r: r[2]) if ok else None
    ops = mds_after["store"]["operations"] - mds_before["store"]["operations"]
    commits = mds_after["store"]["commits"] - mds_before["store"]["commits"]
    per_rank_gbps = [shard_bytes / max(r[2] - r[1], 1e-9) / 1e9 for r in ok]
    summary: dict[str, Any] = {
        "phase": name,
        "ranks_ok": len(ok),
        "ranks": len(rows),
        "wall_s": wall_s,
        "aggregate_GBps": len(ok) * shard_bytes / wall_s / 1e9 if ok else 0.0,
        "per_rank_GBps": {"p50": statistics.median(per_rank_gbps) if ok else float("nan"),
                          "min": min(per_rank_gbps) if ok else float("nan")},
        "latency_s": _percentiles(total_s),
        "start_lag_s": _percentiles([r[1] - start_at for r in ok]),
        "slowest_rank": {"rank": slowest[0], "seconds": slowest[2] - start_at,
                         **{k: v for k, v in slowest[3].items() if k != "digest"}, "rpc_s": slowest[4]} if slowest else None,
        "mds_operations": ops,
        "mds_transactions": commits,
        "mds_ops_per_s": ops / wall_s if ok and wall_s > 0 else 0.0,
        "mds_largest_batch": mds_after["store"]["largest_batch"],
        "errors": fatal + errors,
        "error_count": len(fatal) + len(errors),
        "worker_max_rss_bytes": max((r.get("max_rss_bytes", 0) for r in replies.values()), default=0),
    }
    for key in ("open_s", "write_s", "close_s", "metadata_s", "read_s"):
        values = [r[3][key] for r in ok if key in r[3]]
        if values:
            summary[f"{key[:-2]}_latency_s"] = _percentiles(values)
    for op in ("create", "allocate", "commit", "layout"):
        values = [r[4][op] for r in ok if op in r[4]]
        if values:
            summary[f"rpc_{op}_s"] = _percentiles(values)
    summary["spare_writes"] = sum(r[3].get("spare_writes", 0) for r in ok)
    summary["hedged_writes"] = sum(r[3].get("hedged_writes", 0) for r in ok)
    summary["_digests"] = {r[0]: r[3]["digest"] for r in ok if "digest" in r[3]}
    return summary


def _check_memory(ranks: int, processes: int, shard_bytes: int, block_size: int, memory_limit_bytes: int | None) -> None:
    """Refuse up front a run that cannot fit in memory, with the reason and the way out.

    Per rank, measured here (1024 ranks x 1 MiB, 512 x 256 KiB): a whole block buffer while
    its file is open for writing (even for a shard much smaller than a block), then about
    four shards' worth of chunk, block and read buffers kept in its client's buffer pool,
    and ~0.5 MiB of connections and state; each worker process adds ~100 MiB."""
    per_rank = block_size + 4 * shard_bytes + MiB // 2
    need = ranks * per_rank + processes * (shard_bytes + 100 * MiB)
    available = memory_limit_bytes
    if available is None:
        try:
            with open("/proc/meminfo") as f:
                info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
            available = int(info["MemAvailable"] * 0.8)
        except (OSError, KeyError, ValueError):
            return
    if need > available:
        raise BurstError(
            f"{ranks} ranks would need ~{need / 2**30:.1f} GiB of client memory but ~{available / 2**30:.1f} GiB is "
            f"available: each rank's client holds ~{per_rank / MiB:.1f} MiB (a whole {block_size / MiB:g} MiB block "
            f"buffer while its file is open for writing, even for a {shard_bytes / MiB:g} MiB shard, plus chunk and "
            f"read buffers kept in its pool). Use --block-size (cluster) or --dir-block-size (the /burst directory) "
            f"close to the shard size, smaller shards, fewer ranks, or --no-memory-check"
        )


def run(
    out_dir: str,
    ranks: int = 1024,
    shard_bytes: int = 1 * MiB,
    processes: int = 4,
    *,
    block_size: int = 64 * MiB,
    dir_block_size: int | None = None,
    servers: int = 6,
    policy: str = "rs(4,2)",
    baseline_bytes: int = 256 * MiB,
    meta_address: str | None = None,
    work_dir: str | None = None,
    phase_timeout_s: float = 300.0,
    setup_timeout_s: float | None = None,
    seed: int | None = None,
    memory_limit_bytes: int | None = None,
    memory_check: bool = True,
    metadata_files_per_rank: int = 2,
    gc_delay_s: float = 30.0,
    pack_max_bytes: int | None = None,
    next_save: bool = True,
    delete_previous_bytes: int = 0,
    keep_work_dir: bool = False,
    progress: Callable[[int], None] | None = None,
    name: str = "burst",
) -> dict[str, Any]:
    """Run one burst and return its results (also written to ``<out_dir>/<name>.json``).

    Starts its own cluster (``servers`` chunk servers, ``policy``, ``block_size``) unless
    ``meta_address`` is given. ``dir_block_size`` sets the block size of ``/burst`` only.
    Never blocks past its deadlines: a phase that overruns ``phase_timeout_s`` ends the run
    with ``errors`` saying which phase and how many ranks. ``progress(n)`` is called as
    phases finish (``PROGRESS_STEPS`` in all). After the load, a metadata storm has every rank
    create and close ``metadata_files_per_rank`` empty files (0 skips it): metadata only, to
    measure what the MDS sustains. ``delete_previous_bytes`` > 0 writes a "previous
    checkpoint" of that size before the burst and deletes it at the barrier, as a retention
    policy would: its chunks' deletion orders reach the chunk servers ``gc_delay_s`` later,
    during the save if that is shorter than the save. ``keep_work_dir`` keeps the cluster's
    logs and data. ``pack_max_bytes``: the chunk servers pack chunks up to this size into
    segment files (``tectofs chunk --pack-max``; 0: a file per chunk; None: the chunk server's
    default, ``limits.chunk_pack_max_bytes_default``). ``next_save``: after
    the load, every rank saves a second checkpoint with its chunk-server connections already
    open (the first save also pays for opening them), reported as ``next_save``."""
    assert ranks >= 1
    assert 1 <= processes <= ranks
    assert shard_bytes >= 1
    seed = random.randrange(1 << 31) if seed is None else seed
    setup_timeout_s = setup_timeout_s if setup_timeout_s is not None else 60.0 + 0.05 * ranks
    tick = progress or (lambda n: None)
    from tectofs import limits
    from tectofs.client import connect
    from tectofs.server.cluster import LocalCluster

    result: dict[str, Any] = {
        "benchmark": "burst", "ranks": ranks, "shard_bytes": shard_bytes, "processes": processes,
        "block_size": block_size, "dir_block_size": dir_block_size, "servers": servers, "policy": policy,
        "pack_max_bytes": limits.chunk_pack_max_bytes_default if pack_max_bytes is None else pack_max_bytes,
        "seed": seed, "errors": [], "phases": {},
    }
    errors: list[str] = result["errors"]
    if memory_check:
        try:
            _check_memory(ranks, processes, shard_bytes, dir_block_size or block_size, memory_limit_bytes)
        except BurstError as exc:
            return _finish(out_dir, name, {**result, "errors": [str(exc)], "servers_alive": {"ok": True}})
    with _work_directory(work_dir, keep_work_dir) as tmp:
        result["work_dir"] = tmp if keep_work_dir else None
        cluster = None
        if meta_address is None:
            cluster = LocalCluster(os.path.join(tmp, "cluster"), servers=servers, policy=policy, block_size=block_size,
                                   gc_delay_s=gc_delay_s, log_to_files=True,
                                   chunk_args=None if pack_max_bytes is None else ["--pack-max", str(pack_max_bytes)])
            cluster.start()
            meta_address = cluster.address
        workers: list[_WorkerProcess] = []
        cpu = _CpuMeter(cluster)
        fs = connect(meta_address)
        monitor = _LivenessMonitor(fs)
        chunk_before: dict[str, dict[str, int]] | None = None
        try:
            result["baseline"] = _baseline(fs, baseline_bytes, cpu)
            tick(1)
            fs.mkdir("/burst", block_size=dir_block_size, exist_ok=True)
            step = f"{int(time.time())}-{seed}"
            pending, final = f"/burst/.pending-{step}", f"/burst/step-{step}"
            fs.mkdir(pending)
            if delete_previous_bytes:
                with fs.open("/burst/previous.bin", "wb") as f:
                    f.write(os.urandom(min(delete_previous_bytes, 8 * MiB)) * max(1, delete_previous_bytes // (8 * MiB)))
            chunk_before = _chunk_stats(fs)

            # Setup: workers start, every rank connects.
            started = time.perf_counter()
            per_worker = [list(range(ranks))[i::processes] for i in range(processes)]
            for i, own in enumerate(per_worker):
                config = {"worker": i, "ranks": own, "address": meta_address, "shard_bytes": shard_bytes,
                          "seed": seed, "setup_timeout_s": setup_timeout_s}
                workers.append(_WorkerProcess(i, config, os.path.join(tmp, f"worker-{i}.log")))
            ready = _collect(workers, "ready", setup_timeout_s + 30)
            setup_errors = [e for r in ready.values() for e in r["errors"]]
            result["setup_s"] = time.perf_counter() - started
            if setup_errors:
                raise BurstError(f"setup: {sum(r['error_count'] for r in ready.values())} ranks failed to connect; "
                                 f"first: {setup_errors[0]}")
            tick(1)

            def begin_phase(op: str, **fields: Any) -> tuple[dict[str, Any], float]:
                """Start meters, then tell every worker to start ``op`` at the same moment."""
                before = _mds_stats(fs)
                cpu.start()
                monitor.start()
                at = time.time() + 0.5 + 0.0005 * ranks
                for w in workers:
                    w.send({"op": op, "start_at": at, "timeout_s": phase_timeout_s, **fields})
                return before, at

            def end_phase(op: str, key: str, mds_before: dict[str, Any], start_at: float,
                          shard: int) -> tuple[dict[str, Any], dict[int, Any], dict[int, str]]:
                """Collect every worker's reply to ``op``; record the phase as ``key`` with its
                CPU seconds and liveness view. Returns it, the replies and the ranks' digests."""
                replies = _collect(workers, op, phase_timeout_s + 60 + (start_at - time.time()))
                phase = _phase_summary(op, replies, start_at, shard, mds_before, _mds_stats(fs))
                phase["cpu_s"] = cpu.stop()
                phase["liveness"] = monitor.stop()
                digests = phase.pop("_digests")
                result["phases"][key] = phase
                errors.extend(phase["errors"][:50])
                return phase, replies, digests

            # Save: every rank at the same moment.
            mds_before, start_at = begin_phase("save", dir=pending)
            if delete_previous_bytes:
                time.sleep(max(0.0, start_at - time.time()))
                fs.remove("/burst/previous.bin")
            save, _, digests = end_phase("save", "save", mds_before, start_at, shard_bytes)
            tick(1)
            if save["error_count"]:
                raise BurstError(f"save: {save['error_count']} ranks failed; checkpoint not committed "
                                 f"(first: {save['errors'][0]})")

            # Commit: the coordinator records every digest and renames the directory into place.
            mds_before = _mds_stats(fs)
            metadata_s, commit_s = _commit(fs, pending, final, step, ranks, shard_bytes, digests)
            mds_after = _mds_stats(fs)
            result["phases"]["commit"] = {
                "phase": "commit", "metadata_write_s": metadata_s, "rename_s": commit_s - metadata_s,
                "wall_s": commit_s, "mds_operations": mds_after["store"]["operations"] - mds_before["store"]["operations"],
                "checkpoint_s": save["wall_s"] + commit_s,
            }
            tick(1)

            # Load: every rank at the same moment, then verify.
            mds_before, start_at = begin_phase("load", dir=final)
            load, replies, _ = end_phase("load", "load", mds_before, start_at, shard_bytes)
            load["verified"] = sum(1 for reply in replies.values() for row in reply.get("rows", [])
                                   if row[5] is None and row[3].get("verified"))
            tick(1)

            # The next checkpoint: every rank saves again, its connections to the chunk servers
            # open, as a job's later checkpoints are (within limits.connection_idle_timeout_s).
            if next_save:
                fs.mkdir(f"{pending}-next")
                mds_before, start_at = begin_phase("save", dir=f"{pending}-next")
                again, _, digests = end_phase("save", "next_save", mds_before, start_at, shard_bytes)
                if not again["error_count"]:
                    _commit(fs, f"{pending}-next", f"{final}-next", step, ranks, shard_bytes, digests)

            # Metadata storm: every rank creates and closes empty files, no data.
            if metadata_files_per_rank > 0:
                storm_dir = f"/burst/metadata-{step}"
                fs.mkdir(storm_dir)
                mds_before, start_at = begin_phase("metadata", dir=storm_dir, files_per_rank=metadata_files_per_rank)
                storm, _, _ = end_phase("metadata", "metadata", mds_before, start_at, 0)
                storm["files"] = storm["ranks_ok"] * metadata_files_per_rank
            tick(1)
        except BurstError as exc:
            errors.append(str(exc))
        finally:
            monitor.stop()
            if chunk_before is not None:
                try:
                    result["chunk_servers"] = _chunk_delta(chunk_before, _chunk_stats(fs))
                except Exception as exc:
                    errors.append(f"chunk-server stats: {_describe(exc)}")
            for w in workers:
                w.stop()
            result["servers_alive"] = _survivors(fs, cluster)
            fs.close()
            if cluster is not None:
                cluster.stop()
    if not result["servers_alive"]["ok"]:
        errors.append(f"servers did not survive: {result['servers_alive']}")
    return _finish(out_dir, name, result)


def run_repeated(out_dir: str, repeats: int, *args: Any, seed: int | None = None, **kwargs: Any) -> dict[str, Any]:
    """``run`` ``repeats`` times (each run its own cluster; ``seed``, if given, plus the run's
    index), combined by ``burst_report.combine``: the median run with every run's figures,
    the medians and the targets. Each run is written as ``burst-run<i>.json``, the whole as
    ``burst.json``. A run refused before it started (not enough memory) is not repeated."""
    assert repeats >= 1
    results: list[dict[str, Any]] = []
    for i in range(repeats):
        results.append(run(out_dir, *args, seed=None if seed is None else seed + i, name=f"burst-run{i + 1}", **kwargs))
        if results[-1]["error_count"] and not results[-1]["phases"]:
            break
    combined = burst_report.combine(results)
    write_results(out_dir, "burst", combined)
    return combined


def _commit(fs: Any, pending: str, final: str, step: str, ranks: int, shard_bytes: int,
            digests: dict[int, str]) -> tuple[float, float]:
    """Write ``.metadata`` (every rank's digest) and rename ``pending`` to ``final``; returns
    the seconds until the metadata was written and until the rename."""
    started = time.perf_counter()
    header = json.dumps({"format": "tectofs-burst-1", "ranks": ranks, "shard_bytes": shard_bytes,
                         "step": step}).encode()
    assert len(header) < METADATA_HEADER_BYTES
    metadata = bytearray(header.ljust(METADATA_HEADER_BYTES, b" "))
    for rank in range(ranks):
        metadata += bytes.fromhex(digests[rank])
    fs.write_bytes(f"{pending}/.metadata", metadata)
    metadata_s = time.perf_counter() - started
    fs.rename(pending, final)
    return metadata_s, time.perf_counter() - started


@contextlib.contextmanager
def _work_directory(parent: str | None, keep: bool) -> Iterator[str]:
    if keep:
        yield tempfile.mkdtemp(dir=parent, prefix="tectofs-burst-")
    else:
        with tempfile.TemporaryDirectory(dir=parent, prefix="tectofs-burst-") as tmp:
            yield tmp


def _finish(out_dir: str, name: str, result: dict[str, Any]) -> dict[str, Any]:
    result["error_count"] = len(result["errors"])
    result["rows"] = _rows(result)
    result["ratios"] = _ratios(result)
    write_results(out_dir, name, result)
    return result


def _chunk_delta(before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]) -> dict[str, Any]:
    keys = ("puts", "gets", "busy", "checksum_errors", "deleted")
    per_server = {a: {k: int(s.get(k, 0)) - int(before.get(a, {}).get(k, 0)) for k in keys}
                  for a, s in after.items() if "error" not in s}
    return {"per_server": per_server, **{f"total_{k}": sum(s[k] for s in per_server.values()) for k in keys}}


def _survivors(fs: Any, cluster: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ok": True}
    if cluster is not None:
        dead = []
        if cluster.meta_process is None or cluster.meta_process.poll() is not None:
            dead.append("metadata service")
        dead += [f"chunk server {i}" for i, p in enumerate(cluster.chunk_processes) if p is None or p.poll() is not None]
        out["exited"] = dead
        out["ok"] = not dead
    try:
        live = [s for s in fs.servers() if s.live]
        out["live_chunk_servers"] = len(live)
        if cluster is not None and len(live) < cluster.server_count:
            out["ok"] = False
    except Exception as exc:
        out["ok"] = False
        out["metadata_service"] = _describe(exc)
    return out


def _row(what: str, phase: dict[str, Any] | None, latency_key: str = "latency_s", gbps: float | None = None) -> dict[str, Any]:
    lat = (phase or {}).get(latency_key) or {}

    def fmt(value: Any) -> Any:
        return "-" if value is None or value != value else round(value, 3)

    return {
        "what": what,
        "ranks ok": f"{phase['ranks_ok']}/{phase['ranks']}" if phase and "ranks" in phase else "-",
        "GB/s": fmt(gbps if gbps is not None else (phase or {}).get("aggregate_GBps")),
        "p50 s": fmt(lat.get("p50")), "p99 s": fmt(lat.get("p99")), "max s": fmt(lat.get("max")),
        "MDS ops/s": fmt((phase or {}).get("mds_ops_per_s")) if phase and "mds_ops_per_s" in phase else "-",
        "slowest rank": (phase or {}).get("slowest_rank", {}).get("rank", "-") if phase and phase.get("slowest_rank") else "-",
    }


def _rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    base = result.get("baseline")
    if base:
        rows.append(_row(f"baseline: 1 client writes {base['bytes'] >> 20} MiB", None, gbps=base["write_GBps"]))
        rows.append(_row(f"baseline: 1 client reads + SHA-256 {base['bytes'] >> 20} MiB", None, gbps=base["read_GBps"]))
    phases = result["phases"]
    n, shard = result["ranks"], result["shard_bytes"]
    if "save" in phases:
        save = phases["save"]
        rows.append(_row(f"save: {n} ranks x {shard / MiB:g} MiB (barrier -> closed)", save))
        rows.append(_row("  close (upload + metadata commit)", save, "close_latency_s", gbps=float("nan")))
        rows.append(_row("  commit RPC alone", save, "rpc_commit_s", gbps=float("nan")))
    if "commit" in phases:
        commit = phases["commit"]
        rows.append({**_row("checkpoint commit (.metadata + rename)", None, gbps=float("nan")),
                     "p50 s": round(commit["wall_s"], 3)})
    if "load" in phases:
        rows.append(_row(f"load + verify: {n} ranks", phases["load"]))
    if "next_save" in phases:
        rows.append(_row("next save, connections open (a job's later checkpoints)", phases["next_save"]))
    if "metadata" in phases:
        storm = phases["metadata"]
        rows.append(_row(f"metadata storm: {storm['files']} empty files", storm, gbps=float("nan")))
    return rows


def _ratios(result: dict[str, Any]) -> dict[str, float]:
    base = result.get("baseline")
    phases = result["phases"]
    out: dict[str, float] = {}
    if base and "save" in phases and phases["save"]["ranks_ok"]:
        out["burst save / single writer"] = round(phases["save"]["aggregate_GBps"] / base["write_GBps"], 3)
    if base and "load" in phases and phases["load"]["ranks_ok"]:
        out["burst load / single reader"] = round(phases["load"]["aggregate_GBps"] / base["read_GBps"], 3)
    if base and "next_save" in phases and phases["next_save"]["ranks_ok"]:
        out["burst next save / single writer"] = round(phases["next_save"]["aggregate_GBps"] / base["write_GBps"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--shard", type=parse_size, default=1 * MiB, help="bytes each rank saves (default 1M)")
    parser.add_argument("--processes", type=int, default=4, help="worker processes the ranks are spread over")
    parser.add_argument("--block-size", type=parse_size, default=64 * MiB, help="cluster block size (default 64M)")
    parser.add_argument("--dir-block-size", type=parse_size, default=None,
                        help="block size of the /burst directory only (default: the cluster's)")
    parser.add_argument("--servers", type=int, default=6)
    parser.add_argument("--policy", default="rs(4,2)")
    parser.add_argument("--baseline", type=parse_size, default=256 * MiB, help="bytes the single large writer writes")
    parser.add_argument("--meta", default=None, help="use this running cluster instead of starting one")
    parser.add_argument("--phase-timeout", type=float, default=300.0, help="seconds each phase may take")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-memory-check", action="store_true", help="skip the up-front client memory estimate")
    parser.add_argument("--metadata-files", type=int, default=2,
                        help="empty files each rank creates in the metadata storm (0: skip it)")
    parser.add_argument("--gc-delay", type=float, default=30.0,
                        help="seconds before the MDS orders unused chunks deleted (LocalCluster's default: 30)")
    parser.add_argument("--pack-max", type=parse_size, default=None,
                        help="chunk servers pack chunks up to this size into segment files (tectofs chunk --pack-max;"
                        " 0: a file per chunk; default: the chunk server's own)")
    parser.add_argument("--no-next-save", action="store_true",
                        help="skip the second save (with connections open) after the load")
    parser.add_argument("--delete-previous", type=parse_size, default=0,
                        help="write a previous checkpoint of this size and delete it at the barrier (GC during the save)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (cluster logs, worker logs)")
    parser.add_argument("--work-dir", default=None,
                        help="where the cluster and worker logs go, created if missing (default: $TMPDIR)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs, each on a cluster of its own; figures and targets are their medians (default 3)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    result = run_repeated(args.out, args.repeats, args.ranks, args.shard, args.processes, block_size=args.block_size,
                 dir_block_size=args.dir_block_size, servers=args.servers, policy=args.policy,
                 baseline_bytes=args.baseline, meta_address=args.meta, phase_timeout_s=args.phase_timeout,
                 seed=args.seed,
                 memory_check=not args.no_memory_check, metadata_files_per_rank=args.metadata_files,
                 gc_delay_s=args.gc_delay, pack_max_bytes=args.pack_max, next_save=not args.no_next_save,
                 delete_previous_bytes=args.delete_previous,
                 keep_work_dir=args.keep,
                 work_dir=work_dir(args.work_dir))
    print_summary(result)
    print_targets(result)
    return 1 if result["error_count"] else 0


if __name__ == "__main__":
    sys.exit(main())
