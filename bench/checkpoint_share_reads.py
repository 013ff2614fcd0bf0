"""The "every byte read once" rows of ``tectofs bench checkpoint`` (``checkpoint_bench.py``).

``REPLICAS`` x ``SHARDS`` gloo ranks on this machine (16: 4 data-parallel replicas of 4
shards, a 2-D device mesh ``(replicate, shard)``) save one checkpoint of DTensors (each shard
saved once), then load it, alternately with ``CheckpointReader()`` (every rank reads its
shard's items: each item ``REPLICAS`` times) and with ``CheckpointReader(share_metadata=True,
share_reads=True)`` (each item read by one rank, sent to the others over gloo). Per load: the
slowest rank's time, and the chunk bytes the ranks received from the chunk servers (summed
over the ranks, from each one's ``tectofs_client_chunk_bytes_total``) against the
checkpoint's size (its files' bytes). Every load is compared bit for bit on every rank.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any, Callable

REPLICAS, SHARDS = 4, 4
TENSORS = 4
MODES = (("every rank reads", False), ("share_reads", True))


def _state(rank: int, rows: int, fill: float | None = None) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (REPLICAS, SHARDS), mesh_dim_names=("replicate", "shard"))
    shard = rank % SHARDS
    out = {}
    for t in range(TENSORS):
        gen = torch.Generator().manual_seed(1000 * t + shard)
        local = torch.randn(rows, 1024, generator=gen) if fill is None else torch.full((rows, 1024), fill)
        out[f"layers.{t}.weight"] = DTensor.from_local(local, mesh, [Replicate(), Shard(0)], run_check=False)
    return out


def _rank_main(rank: int, port: int, uri: str, rows: int, repeats: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt
    from tectofs import metrics

    def got_bytes() -> float:
        return metrics.client_registry().get_sample_value("tectofs_client_chunk_bytes_total",
                                                         {"op": "get_chunk"}) or 0.0

    warnings.simplefilter("ignore")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=REPLICAS * SHARDS,
                            timeout=timedelta(seconds=600))
    try:
        expected = _state(rank, rows)
        dcp.save(expected, checkpoint_id=uri)
        samples = []
        for i in range(repeats):
            for name, share in MODES:
                state = _state(rank, rows, fill=-1.0)
                dist.barrier()
                before, started = got_bytes(), time.perf_counter()
                dcp.load(state, storage_reader=tt.CheckpointReader(uri, share_metadata=share, share_reads=share))
                elapsed = time.perf_counter() - started
                wrong = sum(not torch.equal(state[k].to_local(), expected[k].to_local()) for k in expected)
                figures = torch.tensor([elapsed, got_bytes() - before, float(wrong)], dtype=torch.float64)
                dist.all_reduce(figures[:1], op=dist.ReduceOp.MAX)
                dist.all_reduce(figures[1:], op=dist.ReduceOp.SUM)
                samples.append({"mode": name, "run": i, "slowest rank s": float(figures[0]),
                                "chunk bytes read": float(figures[1]), "ranks not bit-exact": int(figures[2])})
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(samples, f)
    finally:
        dist.destroy_process_group()


def measure(address: str, path: str, size_bytes: int, repeats: int,
            record: Callable[[str, float], None]) -> dict[str, Any]:
    """Run the ranks against the cluster at ``address``, the checkpoint at ``path`` (about
    ``size_bytes``); ``record`` gets each load's slowest-rank time. Returns per mode the chunk
    bytes read per load, the checkpoint's size and whether every load was bit-exact."""
    import torch.multiprocessing as mp

    import tectofs.torch as tt

    rows = max(1, size_bytes // SHARDS // TENSORS // 4096)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="tectofs-share-reads-") as tmp:
        out_path = os.path.join(tmp, "samples.json")
        mp.spawn(_rank_main, args=(port, f"tectofs://{address}{path}", rows, repeats, out_path),
                 nprocs=REPLICAS * SHARDS, join=True)
        with open(out_path) as f:
            samples = json.load(f)
    size = sum(st.size for _, st in tt.filesystem(address).scandir(path))
    read: dict[str, list[float]] = {}
    for sample in samples:
        record(f"tectofs load, {REPLICAS * SHARDS} ranks ({REPLICAS} replicas x {SHARDS} shards), {sample['mode']}",
               sample["slowest rank s"])
        read.setdefault(sample["mode"], []).append(sample["chunk bytes read"])
    return {"chunk_bytes_read": read, "checkpoint_bytes": size,
            "bit_exact": all(s["ranks not bit-exact"] == 0 for s in samples)}
