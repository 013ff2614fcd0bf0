"""DCP checkpoints through the tectofs plugin vs. DCP on a local disk vs. torch.save.

    python3 -m tectofs.benchmarks.checkpoint_bench --size 1G --repeats 3 --out bench/results

One run, one state dict of ``--size`` bytes shaped like mixed-precision Adam training
(bf16 weights plus fp32 master copy, exp_avg and exp_avg_sq: 2 + 4 + 4 + 4 bytes per
parameter, in a few large tensors, plus small biases and the optimizer's scalars):

  (a) ``dcp.save``/``dcp.load`` with ``tectofs.torch.CheckpointWriter/Reader`` against a local
      cluster started here (6 chunk servers, ``rs(4,2)``: survives the loss of any two);
  (b) ``dcp.save``/``dcp.load`` with ``FileSystemWriter(sync_files=True)``/``FileSystemReader``
      on a local directory of the same disk (DCP's defaults otherwise);
  (c) ``torch.save`` to a local file + fsync / ``torch.load``;
  (d) ``dcp.async_save`` with a ``CheckpointWriter`` reused across saves: the time until
      ``async_save`` returns (staging into warm buffers), measured on warm saves only,
      against the synchronous plugin save of (a);
  (e) the same with ``CheckpointWriter(async_staging=True)``, the copy beside a simulated
      training step (``STEP_S`` of matmuls): blocked = until ``async_save`` returns plus the wait
      for ``staging_completion`` after the step's compute (where its optimizer step would
      mutate the state), and that compute's time beside the copy and the upload against beside the
      upload alone (the same compute is timed right after (d)'s blocking ``async_save`` too);
  (f) incremental checkpoints of a fine-tune with 90% of its weights frozen
      (``checkpoint_incremental.py``): chunk bytes sent and time of the second save against a
      full save of the same weights;
  (g) 16 gloo ranks, 4 data-parallel replicas of 4 shards, load one checkpoint (at most
      ``SHARE_READS_BYTES_MAX``) with and without ``share_reads`` (``checkpoint_share_reads.py``):
      chunk bytes read from the chunk servers against the checkpoint's size, slowest rank's time.
  (h) the memory tier (``checkpoint_memory.py``): ``CheckpointWriter(tier="memory")`` saves with
      2 copies in memory agents; the same step restored after a trainer crash (this host's
      agent), after a node loss (a peer's agent) and from the chunk servers: time ratios.

Medians of ``--repeats`` runs; the page cache is dropped before every load (root only) so
loads come from disk (from the chunk servers' files for the plugin). At the end the plugin
loads are repeated back to back, then with two chunk servers killed (degraded reads from
parity); the degraded loads are compared with the back-to-back ones (in (a) each load follows
its own save, and such a load took up to twice the CPU of one that followed a load). Ratios
are against DCP-local from the same run: this machine is shared, absolute figures drift.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings
from typing import Any, Callable

from tectofs.benchmarks import checkpoint_incremental, checkpoint_memory, checkpoint_share_reads
from tectofs.benchmarks.common import drop_caches, parse_size, print_table, process_cpu_s, work_dir, write_results
from tectofs.benchmarks.report import print_targets
from tectofs.benchmarks.report import target as goal

MiB = 1 << 20
LAYERS = 8


def make_state_dict(size_bytes: int, seed: int = 0) -> dict[str, Any]:
    """A model + AdamW state dict of about ``size_bytes`` (14 bytes per parameter)."""
    import torch

    params = max(LAYERS * 1024, size_bytes // 14)
    cols = 4096
    rows = max(1, params // LAYERS // cols)
    gen = torch.Generator().manual_seed(seed)
    model: dict[str, Any] = {}
    state: dict[int, Any] = {}
    for i in range(LAYERS):
        master = torch.randn(rows, cols, generator=gen)
        model[f"layers.{i}.weight"] = master.to(torch.bfloat16)
        model[f"layers.{i}.bias"] = torch.randn(cols, generator=gen).to(torch.bfloat16)
        state[i] = {
            "step": torch.tensor(1000.0),
            "master": master,
            "exp_avg": torch.randn(rows, cols, generator=gen) * 1e-3,
            "exp_avg_sq": torch.rand(rows, cols, generator=gen) * 1e-6,
        }
    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, "params": list(range(LAYERS))}]
    return {"model": model, "optim": {"state": state, "param_groups": groups}, "step": 1000}


def empty_like_state(sd: Any) -> Any:
    import torch

    if isinstance(sd, torch.Tensor):
        return torch.empty_like(sd)
    if isinstance(sd, dict):
        return {k: empty_like_state(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [empty_like_state(v) for v in sd]
    return sd


def tensor_bytes(sd: Any) -> int:
    import torch

    if isinstance(sd, torch.Tensor):
        return sd.numel() * sd.element_size()
    if isinstance(sd, dict):
        return sum(tensor_bytes(v) for v in sd.values())
    if isinstance(sd, (list, tuple)):
        return sum(tensor_bytes(v) for v in sd)
    return 0


def same_state(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and set(a) == set(b) and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _timed(fn: Callable[[], Any]) -> float:
    gc.collect()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run(out_dir: str, size_bytes: int = 1 << 30, repeats: int = 3, progress: Callable[[int], Any] | None = None,
        work_dir: str | None = None, quick: bool = False, degraded: bool = True) -> dict[str, Any]:
    """Measure (a)-(d) above; returns ``{"rows": [...], "ratios": {...}, ...}`` and writes
    ``<out_dir>/checkpoint_bench.json``. ``progress(1)`` is called after every measured step."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

    import tectofs
    import tectofs.torch as tt
    from tectofs.server.cluster import LocalCluster

    # The cluster's processes run the same tree as this process (not whatever another
    # editable install or the current directory would give them).
    tree = os.path.dirname(os.path.dirname(os.path.realpath(tectofs.__file__)))
    cluster_env = {"PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)}
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    if quick and size_bytes == 1 << 30:
        size_bytes = 256 * MiB
    repeats = max(1, repeats)
    tick = progress or (lambda n: None)

    sd = make_state_dict(size_bytes)
    nbytes = tensor_bytes(sd)
    target = empty_like_state(sd)
    times: dict[str, list[float]] = {}
    checks: dict[str, bool] = {}
    stored: dict[str, int] = {}
    cpu: dict[str, list[float]] = {}  # "<what> <role>" -> CPU seconds per run
    cache_dropped = True

    def record(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)
        tick(1)

    def load_into_target(load: Callable[[], Any], name: str, meter: Callable[[Callable[[], None]], None] | None = None) -> None:
        """Zero the target, drop the page cache, time ``load`` (metered by ``meter`` if given:
        the load alone, not the zeroing or the comparison), then compare with the saved state."""
        nonlocal cache_dropped
        for t in _tensors(target):
            t.zero_()
        cache_dropped = drop_caches() and cache_dropped
        def timed() -> None:
            record(name, _timed(load))

        if meter is not None:
            meter(timed)
        else:
            timed()
        checks[name] = checks.get(name, True) and same_state(sd, target)

    with tempfile.TemporaryDirectory(prefix="tectofs-ckpt-bench-", dir=work_dir) as tmp:
        local_dir = os.path.join(tmp, "local")
        os.makedirs(local_dir)
        cluster = LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)", gc_delay_s=3600.0,
                               extra_env=cluster_env)
        with cluster:
            base = f"tectofs://{cluster.address}/bench"

            def dcp_local(i: int) -> None:  # (b)
                path = os.path.join(local_dir, f"dcp_{i}")
                record("dcp local save", _timed(lambda: dcp.save(sd, storage_writer=FileSystemWriter(path, sync_files=True))))
                load_into_target(lambda: dcp.load(target, storage_reader=FileSystemReader(path)), "dcp local load")
                shutil.rmtree(path)

            def roles() -> dict[str, float]:
                """CPU seconds so far of this process (the client), the chunk servers, the MDS."""
                chunk = [p.pid for p in cluster.chunk_processes if p is not None]
                return {"client": time.process_time(), "chunk servers": sum(process_cpu_s(p) for p in chunk),
                        "metadata service": process_cpu_s(cluster.meta_process.pid) if cluster.meta_process else 0.0}

            def metered(what: str, run: Callable[[], None]) -> None:
                before = roles()
                run()
                for role, seconds in roles().items():
                    cpu.setdefault(f"{what} {role}", []).append(seconds - before[role])

            def raw_disk(i: int) -> None:  # the disk itself: durable sequential write, then read, of as many bytes
                path = os.path.join(local_dir, f"raw_{i}")
                record("raw disk write+fsync", _timed(lambda: _raw_write(path, nbytes)))
                drop_caches()
                record("raw disk read", _timed(lambda: _raw_read(path)))
                os.unlink(path)

            def plugin(i: int) -> None:  # (a)
                uri = f"{base}/sync/step_{i}"
                metered("save", lambda: record("tectofs save", _timed(
                    lambda: dcp.save(sd, storage_writer=tt.CheckpointWriter(uri)))))
                load_into_target(lambda: dcp.load(target, storage_reader=tt.CheckpointReader(uri)), "tectofs load",
                                 meter=lambda run: metered("load", run))

            def plugin_compressed(i: int) -> None:  # (a) with CheckpointWriter(compress=True)
                uri = f"{base}/zstd/step_{i}"
                record("tectofs save, compressed",
                       _timed(lambda: dcp.save(sd, storage_writer=tt.CheckpointWriter(uri, compress=True))))
                stored["compressed"] = sum(st.size for name, st in tt.filesystem(cluster.address).scandir(tt.parse(uri).path)
                                           if name != ".metadata")
                load_into_target(lambda: dcp.load(target, storage_reader=tt.CheckpointReader(uri)),
                                 "tectofs load, compressed")

            def torch_file(i: int) -> None:  # (c)
                nonlocal cache_dropped
                file = os.path.join(local_dir, f"torch_{i}.pt")

                def torch_save() -> None:
                    with open(file, "wb") as f:
                        torch.save(sd, f)
                        f.flush()
                        os.fsync(f.fileno())
                    _fsync_dir(local_dir)

                record("torch.save local", _timed(torch_save))
                cache_dropped = drop_caches() and cache_dropped
                loaded: list[Any] = []
                record("torch.load local", _timed(lambda: loaded.append(torch.load(file, weights_only=True))))
                checks["torch.load local"] = checks.get("torch.load local", True) and same_state(sd, loaded[0])
                loaded.clear()
                os.unlink(file)

            methods = [raw_disk, dcp_local, plugin, plugin_compressed, torch_file]
            for i in range(repeats):
                # Rotate the order: what ran before (page cache, memory) weighs on each in turn.
                for method in methods[i % len(methods) :] + methods[: i % len(methods)]:
                    method(i)

            # (d) async_save through one writer: first save warms the staging buffers.
            step = _calibrated_step(STEP_S)
            writer = tt.CheckpointWriter()
            try:
                for i in range(repeats + 1):
                    fut: list[Any] = []
                    blocked = _timed(lambda: fut.append(
                        dcp.async_save(sd, checkpoint_id=f"{base}/async/step_{i}", storage_writer=writer)))
                    total_started = time.perf_counter()
                    stepped = _timed(step)
                    fut[0].result()
                    total = blocked + time.perf_counter() - total_started
                    if i == 0:
                        times.setdefault("tectofs async_save blocking (cold, 1st)", []).append(blocked)
                        continue
                    record("tectofs async_save blocking", blocked)
                    times.setdefault("training step beside the upload (staged before)", []).append(stepped)
                    times.setdefault("tectofs async_save total", []).append(total)
                    writer.wait_staging_idle(timeout=60)
            finally:
                writer.close()
            load_into_target(lambda: dcp.load(target, checkpoint_id=f"{base}/async/step_{repeats}"), "async ckpt load check")
            times.pop("async ckpt load check", None)

            # (e) async_save staging beside the next training step (CheckpointWriter(async_staging=True)):
            # blocked = until async_save returns + the wait for staging_completion once a fixed
            # "forward/backward" (matmuls, as long alone as STEP_S) is done, i.e. where the optimizer
            # step would mutate the state. Also: that compute's time with the copy beside it / alone.
            beside = tt.CheckpointWriter(async_staging=True)
            try:
                for i in range(repeats + 1):
                    times.setdefault("training step alone", []).append(_timed(step))
                    started = time.perf_counter()
                    response = dcp.async_save(sd, checkpoint_id=f"{base}/beside/step_{i}", storage_writer=beside)
                    assert isinstance(response, AsyncSaveResponse)  # (async_staging: DCP's non-blocking stager reply)
                    returned = time.perf_counter() - started
                    stepped = _timed(step)
                    waited = _timed(lambda: response.staging_completion.result(timeout=300))
                    response.upload_completion.result(timeout=600)
                    if i == 0:  # cold buffers
                        continue
                    record("tectofs async_save blocking, staging beside the step", returned + waited)
                    times.setdefault("async_save returned (staging beside)", []).append(returned)
                    times.setdefault("training step beside staging and upload", []).append(stepped)
                    beside.wait_staging_idle(timeout=60)
            finally:
                beside.close()
            load_into_target(lambda: dcp.load(target, checkpoint_id=f"{base}/beside/step_{repeats}"),
                             "async (beside) ckpt load check")
            times.pop("async (beside) ckpt load check", None)

            # (f) incremental checkpoints of a fine-tune with 90% of its weights frozen.
            incremental = checkpoint_incremental.measure(f"{base}/incremental", size_bytes, repeats, record, same_state)
            checks["incremental second save load"] = incremental["bit_exact"]

            # (g) 16 gloo ranks, 4 replicas x 4 shards, load each item once (share_reads) or per replica.
            fanout = checkpoint_share_reads.measure(cluster.address, "/bench/share_reads/step_1",
                                                    min(size_bytes, SHARE_READS_BYTES_MAX), repeats, record)
            checks["16-rank loads (share_reads or not)"] = fanout["bit_exact"]

            # (h) the memory tier: restore after a trainer crash, after a node loss, from the chunk servers.
            memory_tier = checkpoint_memory.measure(f"{base}/memory_tier", sd, target, nbytes, repeats, record,
                                                    load_into_target)
            checks["memory tier restores, each from the tier its row names"] = checkpoint_memory.read_as_named(memory_tier)

            # Durability: the plugin checkpoints, read with two chunk servers down (as many as the healthy loads).
            # Compared with the same loads, back to back, just before the kills: like for like, as a
            # load right after a save (as in (a)) took up to twice the CPU of one right after a load.
            if degraded:
                for i in range(repeats):
                    uri = f"{base}/sync/step_{i}"
                    load_into_target(lambda: dcp.load(target, storage_reader=tt.CheckpointReader(uri)),
                                     "tectofs load, back to back")
                cluster.kill_chunk_server(0)
                cluster.kill_chunk_server(3)
                for i in range(repeats):
                    uri = f"{base}/sync/step_{i}"
                    load_into_target(lambda: dcp.load(target, storage_reader=tt.CheckpointReader(uri)),
                                     "tectofs load, 2 of 6 servers down")
            tt.close_all()

    def med(name: str) -> float:
        return statistics.median(times[name])

    def gbps(name: str) -> float:
        return nbytes / med(name) / 1e9

    order = ["raw disk write+fsync", "raw disk read", "dcp local save", "dcp local load", "tectofs save", "tectofs load",
             "tectofs save, compressed",
             "tectofs load, compressed", "torch.save local",
             "torch.load local", "tectofs async_save blocking (cold, 1st)", "tectofs async_save blocking",
             "tectofs async_save total", "tectofs async_save blocking, staging beside the step",
             "async_save returned (staging beside)", "training step alone",
             "training step beside the upload (staged before)", "training step beside staging and upload",
             "tectofs save, full", "tectofs save, incremental, first (90% frozen)",
             "tectofs save, incremental, second (90% frozen)",
             "tectofs load, 16 ranks (4 replicas x 4 shards), every rank reads",
             "tectofs load, 16 ranks (4 replicas x 4 shards), share_reads", "tectofs load, back to back",
             "tectofs load, 2 of 6 servers down"]
    rows = []
    for name in sorted(times, key=lambda n: order.index(n) if n in order else len(order)):
        if name.startswith(("tectofs async_save blocking", "training step", "async_save returned")):
            rows.append({"what": name, "GB/s (median)": None, "median_s": round(med(name), 4),
                         "runs_s": [round(t, 4) for t in times[name]]})
        else:
            rows.append({"what": name, "GB/s (median)": round(gbps(name), 3), "median_s": round(med(name), 3),
                         "runs_s": [round(t, 3) for t in times[name]]})
    ratios = {
        "tectofs save / dcp local save": round(gbps("tectofs save") / gbps("dcp local save"), 3),
        "tectofs load / dcp local load": round(gbps("tectofs load") / gbps("dcp local load"), 3),
        "torch.save local / dcp local save": round(gbps("torch.save local") / gbps("dcp local save"), 3),
        "torch.load local / dcp local load": round(gbps("torch.load local") / gbps("dcp local load"), 3),
        "async_save blocking / tectofs sync save": round(med("tectofs async_save blocking") / med("tectofs save"), 4),
        "async_save blocking, staging beside the step / tectofs sync save": round(
            med("tectofs async_save blocking, staging beside the step") / med("tectofs save"), 4),
        "training step beside staging and upload / beside the upload (staged before)": round(
            med("training step beside staging and upload") / med("training step beside the upload (staged before)"), 3),
        "training step beside the upload (staged before) / alone": round(
            med("training step beside the upload (staged before)") / med("training step alone"), 3),
    }
    sent = {k: statistics.median(v) for k, v in incremental["chunk_bytes_sent"].items()}
    ratios["incremental save, 90% frozen: chunk bytes sent / full save"] = round(
        sent["incremental, second"] / sent["full"], 4)
    ratios["incremental save, 90% frozen: time / full save"] = round(
        med("tectofs save, incremental, second (90% frozen)") / med("tectofs save, full"), 3)
    for mode, runs in fanout["chunk_bytes_read"].items():
        ratios[f"16 ranks (4 replicas x 4 shards), {mode}: chunk bytes read / checkpoint size"] = round(
            statistics.median(runs) / fanout["checkpoint_bytes"], 3)
    sixteen = "tectofs load, 16 ranks (4 replicas x 4 shards)"
    ratios["16-rank load time, share_reads / every rank reads"] = round(
        med(f"{sixteen}, share_reads") / med(f"{sixteen}, every rank reads"), 3)
    ratios.update(checkpoint_memory.ratios(med))
    ratios["memory tier save (2 copies) / tectofs save"] = round(med(checkpoint_memory.SAVE_ROW) / med("tectofs save"), 3)
    ratios["tectofs compressed save / dcp local save"] = round(gbps("tectofs save, compressed") / gbps("dcp local save"), 3)
    ratios["tectofs compressed load / dcp local load"] = round(gbps("tectofs load, compressed") / gbps("dcp local load"), 3)
    # rs(4,2): 6 chunks of a quarter block each reach a disk per block saved; a load reads the 4 data chunks.
    width, needed = 6, 4
    ratios["tectofs save disk efficiency (chunk bytes written/s / raw disk write)"] = round(
        gbps("tectofs save") * width / needed / gbps("raw disk write+fsync"), 3)
    ratios["tectofs load disk efficiency (bytes read/s / raw disk read)"] = round(
        gbps("tectofs load") / gbps("raw disk read"), 3)
    cpu_per_gb = {key: round(statistics.median(runs) / (nbytes / 1e9), 2) for key, runs in sorted(cpu.items())}
    compression = compression_by_dtype(sd)
    compression["whole checkpoint (stored / tensor bytes)"] = {"ratio": round(stored["compressed"] / nbytes, 4)}
    degraded = "tectofs load, 2 of 6 servers down" in times
    if degraded:
        ratios["tectofs degraded load / dcp local load"] = round(
            gbps("tectofs load, 2 of 6 servers down") / gbps("dcp local load"), 3)
        ratios["tectofs degraded load / tectofs load back to back"] = round(
            gbps("tectofs load, 2 of 6 servers down") / gbps("tectofs load, back to back"), 3)
        ratios["tectofs load back to back / dcp local load"] = round(
            gbps("tectofs load, back to back") / gbps("dcp local load"), 3)
    targets = [
        goal("tectofs save / dcp local save", ratios["tectofs save / dcp local save"], at_least=1.0),
        goal("tectofs load / dcp local load", ratios["tectofs load / dcp local load"], at_least=1.0),
        goal("async_save blocking, staging beside the step / tectofs sync save",
             ratios["async_save blocking, staging beside the step / tectofs sync save"], at_most=0.03),
        goal("incremental save, 90% frozen: chunk bytes sent / full save",
             ratios["incremental save, 90% frozen: chunk bytes sent / full save"], at_most=0.12),
        goal("16 ranks (4 replicas x 4 shards), share_reads: chunk bytes read / checkpoint size",
             ratios["16 ranks (4 replicas x 4 shards), share_reads: chunk bytes read / checkpoint size"], at_most=1.1),
        goal("tectofs compressed save / dcp local save", ratios["tectofs compressed save / dcp local save"],
             at_least=0.8),
        *[goal(name, value, at_least=checkpoint_memory.RATIO_TARGETS[name])
          for name, value in checkpoint_memory.ratios(med).items()],
        goal("bf16 weights compression ratio", compression["bf16 weights"]["ratio"], at_most=0.67),
        goal("tectofs save disk efficiency", ratios["tectofs save disk efficiency (chunk bytes written/s / raw disk write)"],
             at_least=0.9),
        goal("tectofs load disk efficiency", ratios["tectofs load disk efficiency (bytes read/s / raw disk read)"],
             at_least=0.9),
    ]
    if degraded:
        back_to_back = "tectofs degraded load / tectofs load back to back"
        targets.append(goal(back_to_back, ratios[back_to_back],
                            at_least=0.9))
    result = {
        "benchmark": "checkpoint",
        "size_bytes": nbytes,
        "repeats": repeats,
        "state_dict": f"{LAYERS} layers: bf16 weights + fp32 master/exp_avg/exp_avg_sq "
                      f"({sum(1 for _ in _tensors(sd))} tensors, {nbytes / MiB:.0f} MiB)",
        "cluster": "local: 1 MDS + 6 chunk servers, rs(4,2), 64 MiB blocks, fsync per chunk",
        "tectofs_tree": tree,
        "page_cache_dropped_before_loads": cache_dropped,
        "bit_exact": checks,
        "rows": rows,
        "ratios": ratios,
        "compression": compression,
        "cpu_seconds_per_GB": cpu_per_gb,
        "targets": targets,
        "targets_met": {t["name"]: t["met"] for t in targets},
    }
    write_results(out_dir, "checkpoint_bench", result)
    return result


STEP_S = 0.5  # the simulated training step's compute, alone
SHARE_READS_BYTES_MAX = 256 * MiB  # (g)'s checkpoint: 16 ranks hold it twice each (state and load target)


def _calibrated_step(seconds: float) -> Callable[[], None]:
    """A fixed amount of compute (1024x1024 fp32 matmuls) that takes about ``seconds`` alone
    now: the same work every time, so a copy beside it shows as a longer step."""
    import torch

    a = torch.randn(1024, 1024)
    for _ in range(4):  # torch's thread pool and first-call costs, not counted
        a @ a
    # The fastest of several batches: one matmul's time alone, robust to a busy moment (the
    # cluster flushing a save just before would otherwise make the step several times shorter).
    batches: list[float] = []
    deadline = time.perf_counter() + seconds / 2
    while len(batches) < 3 or (time.perf_counter() < deadline and len(batches) < 50):
        started = time.perf_counter()
        for _ in range(4):
            a @ a
        batches.append((time.perf_counter() - started) / 4)
    count = max(1, round(seconds / min(batches)))

    def step() -> None:
        for _ in range(count):
            a @ a

    return step


def _raw_write(path: str, nbytes: int) -> None:
    block = os.urandom(8 * MiB)
    with open(path, "wb") as f:
        for offset in range(0, nbytes, len(block)):
            f.write(block[: min(len(block), nbytes - offset)])
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(os.path.dirname(path))


def _raw_read(path: str) -> None:
    buffer = bytearray(8 * MiB)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def compression_by_dtype(sd: Any) -> dict[str, dict[str, float]]:
    """``tectofs.tensor_codec`` on each kind of tensor of the benchmark's state dict: stored /
    raw bytes, and encode and decode speed on one core (MB/s = 10^6 bytes/s)."""
    import torch

    from tectofs import tensor_codec

    groups: dict[str, list[Any]] = {}
    for name, t in _named(sd):
        kind = ("bf16 weights" if "weight" in name else "bf16 biases" if "bias" in name else
                "fp32 " + name.rsplit(".", 1)[-1] if t.dtype.is_floating_point else str(t.dtype))
        groups.setdefault(kind, []).append(t)
    out = {}
    for kind, tensors in groups.items():
        raw = stored = 0
        encode_s = decode_s = 0.0
        for t in tensors:
            view = t.contiguous().reshape(-1).view(torch.uint8).numpy()
            started = time.perf_counter()
            encoded = tensor_codec.encode(view, str(t.dtype))
            encode_s += time.perf_counter() - started
            raw += view.nbytes
            if encoded is None:
                stored += view.nbytes
                continue
            stored += len(encoded.frame)
            started = time.perf_counter()
            tensor_codec.decode(encoded.frame)
            decode_s += time.perf_counter() - started
        out[kind] = {"ratio": round(stored / raw, 4) if raw else 1.0,
                     "encode_MB_s": round(raw / encode_s / 1e6) if encode_s else 0,
                     "decode_MB_s": round(raw / decode_s / 1e6) if decode_s else 0}
    return out


def _named(sd: Any, prefix: str = "") -> Any:
    import torch

    if isinstance(sd, torch.Tensor):
        yield prefix, sd
    elif isinstance(sd, dict):
        for k, v in sd.items():
            yield from _named(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(sd, (list, tuple)):
        for i, v in enumerate(sd):
            yield from _named(v, f"{prefix}.{i}")


def _tensors(sd: Any) -> Any:
    import torch

    if isinstance(sd, torch.Tensor):
        yield sd
    elif isinstance(sd, dict):
        for v in sd.values():
            yield from _tensors(v)
    elif isinstance(sd, (list, tuple)):
        for v in sd:
            yield from _tensors(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"), help="state dict bytes (default 1G)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure, the median is reported (default 3)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--work-dir", default=None,
                        help="where the cluster and local files go, created if missing (default: $TMPDIR)")
    parser.add_argument("--no-degraded", action="store_true", help="skip the load with two servers killed")
    args = parser.parse_args()
    result = run(args.out, args.size, args.repeats, work_dir=work_dir(args.work_dir), degraded=not args.no_degraded)
    print_table(result)
    print("CPU seconds per GB saved/loaded (client = this process; against a baseline revision:"
          " bench/cpu_per_gb.py):")
    for key, value in result["cpu_seconds_per_GB"].items():
        print(f"  {key:<42} {value}")
    print("compression (tectofs.tensor_codec, one core):")
    for kind, c in result["compression"].items():
        speed = f"  encode {c['encode_MB_s']} MB/s, decode {c['decode_MB_s']} MB/s" if "encode_MB_s" in c else ""
        print(f"  {kind:<42} {c['ratio']:.3f} of the raw bytes{speed}")
    print(json.dumps({"bit_exact": result["bit_exact"]}, indent=2))
    print_targets(result)


if __name__ == "__main__":
    main()
