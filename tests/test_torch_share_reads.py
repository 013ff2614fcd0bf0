"""Every stored item read once per load (``CheckpointReader(share_reads=True)``): gloo ranks
on CPU, data-parallel replicas of the same shards (a 2-D device mesh: replicate x shard), load
a checkpoint bit-exact while the bytes read from the chunk servers stay at the checkpoint's
size instead of growing with the replicas; the items one rank reads for the others are
balanced across the replicas."""

from __future__ import annotations

import json
import os
import warnings
from datetime import timedelta
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs import metrics  # noqa: E402
from tectofs.torch import _share  # noqa: E402
from tests.rendezvous import leave, rendezvous  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

ROWS, COLS = 512, 1024  # per shard and tensor: 2 MiB of fp32
TENSORS = 3


def _state(replicas: int, shards: int, rank: int, fill: float | None = None) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    mesh = init_device_mesh("cpu", (replicas, shards), mesh_dim_names=("replicate", "shard"))
    shard = rank % shards
    out = {}
    for t in range(TENSORS):
        gen = torch.Generator().manual_seed(1000 * t + shard)
        local = torch.randn(ROWS, COLS, generator=gen) if fill is None else torch.full((ROWS, COLS), fill)
        out[f"w{t}"] = DTensor.from_local(local, mesh, [Replicate(), Shard(0)], run_check=False)
    return {"model": out}


def _get_bytes() -> float:
    return metrics.client_registry().get_sample_value("tectofs_client_chunk_bytes_total", {"op": "get_chunk"}) or 0.0


def _worker(rank: int, replicas: int, shards: int, rendezvous: str, run: str, out: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.simplefilter("ignore")
    world = replicas * shards
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))
    try:
        dcp.save(_state(replicas, shards, rank), checkpoint_id=f"{run}/step_1")
        results = {}
        for share in (False, True):
            state = _state(replicas, shards, rank, fill=-1.0)
            before = _get_bytes()
            reader = tt.CheckpointReader(f"{run}/step_1", share_metadata=share, share_reads=share)
            dcp.load(state, storage_reader=reader)
            expected = _state(replicas, shards, rank)
            for name, tensor in state["model"].items():
                assert torch.equal(tensor.to_local(), expected["model"][name].to_local()), (rank, share, name)
            counts = torch.tensor([_get_bytes() - before, float(reader.received_bytes)], dtype=torch.float64)
            dist.all_reduce(counts)
            results[str(share)] = counts.tolist()
        if rank == 0:
            with open(out, "w") as f:
                json.dump(results, f)
    finally:
        dist.destroy_process_group()
    leave()


def _failing_worker(rank: int, replicas: int, shards: int, rendezvous: str, run: str, out: str) -> None:
    """Rank 0 cannot read anything: every rank's load fails (none waits for rank 0's items)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=replicas * shards,
                            timeout=timedelta(seconds=60))

    class Broken(tt.CheckpointReader):
        def _run_task(self, *args: Any, **kwargs: Any) -> Any:
            if rank == 0:
                raise OSError("simulated: chunk servers unreachable from rank 0")
            return super()._run_task(*args, **kwargs)

    try:
        state = _state(replicas, shards, rank, fill=-1.0)
        try:
            dcp.load(state, storage_reader=Broken(f"{run}/step_1", share_reads=True))
            outcome = "loaded"
        except BaseException as exc:  # DCP's CheckpointException is a BaseException
            outcome = "failed: " + str(exc).splitlines()[0]
        with open(f"{out}.{rank}", "w") as f:
            f.write(outcome)
    finally:
        dist.destroy_process_group()
    leave()


@pytest.mark.slow
def test_replicas_read_each_item_once(cluster: Any, tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    replicas, shards = 2, 2
    run = f"tectofs://{cluster.address}/torch-tests/share-reads-{os.getpid()}"
    out = str(tmp_path / "counts.json")
    mp.spawn(_worker, args=(replicas, shards, rendezvous(tmp_path), run, out), nprocs=replicas * shards, join=True)
    with open(out) as f:
        counts = json.load(f)
    fs = cluster.fs
    size = sum(st.size for _, st in fs.scandir(tt.parse(f"{run}/step_1").path))
    alone, shared = counts["False"], counts["True"]
    print(f"bytes read from chunk servers / checkpoint size: every rank reading {alone[0] / size:.3f},"
          f" shared {shared[0] / size:.3f} (received over gloo: {shared[1] / size:.3f})")
    assert alone[0] >= 0.95 * replicas * size  # each replica read all of it
    assert shared[0] <= 1.1 * size
    assert shared[1] >= (replicas - 1) * TENSORS * shards * ROWS * COLS * 4  # the others got theirs sent


def test_each_shared_item_is_read_by_one_rank_balanced_across_replicas() -> None:
    items = [MetadataIndex(f"w{i}", (0,)) for i in range(8)]
    # 4 ranks: replicas {0, 2} and {1, 3} of two shards; shard 0 has items 0-3, shard 1 items 4-7.
    needs = [{i: 100 for i in items[:4]}, {i: 100 for i in items[4:]}, {i: 100 for i in items[:4]},
             {i: 100 for i in items[4:]}]
    needs[0][MetadataIndex("alone")] = 50  # read by rank 0 only: not shared
    shares = _share.assign_readers(needs)
    readers = {item: rank for rank, share in enumerate(shares) for item in share.send}
    assert set(readers) == set(items)
    assert sorted(readers[i] for i in items[:4]) == [0, 0, 2, 2]  # split between the replicas, by bytes
    assert sorted(readers[i] for i in items[4:]) == [1, 1, 3, 3]
    for rank, share in enumerate(shares):
        assert set(share.send) | set(share.receive) == {i for i in needs[rank] if i in items}
        for item, source in share.receive.items():
            assert rank in shares[source].send[item]
        assert all(shares[0].tags.get(i, t) == t for i, t in share.tags.items())  # one numbering
    assert MetadataIndex("alone") not in shares[0].tags


@pytest.mark.slow
def test_a_rank_that_cannot_read_fails_the_load_everywhere_without_a_hang(cluster: Any, tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    replicas, shards = 2, 2
    run = f"tectofs://{cluster.address}/torch-tests/share-reads-fail-{os.getpid()}"
    out = str(tmp_path / "outcome")
    mp.spawn(_worker, args=(replicas, shards, rendezvous(tmp_path), run, str(tmp_path / "counts.json")),
             nprocs=replicas * shards, join=True)  # (saves the checkpoint)
    mp.spawn(_failing_worker, args=(replicas, shards, rendezvous(tmp_path), run, out), nprocs=replicas * shards, join=True)
    outcomes = [open(f"{out}.{rank}").read() for rank in range(replicas * shards)]
    print(outcomes)
    assert all(o.startswith("failed") for o in outcomes), outcomes
    assert "rank 0" in outcomes[0] and "unreachable" in outcomes[0]
