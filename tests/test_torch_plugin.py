"""The PyTorch plugin (tectofs.torch) against a real local cluster.

Multi-rank tests run gloo process groups in spawned processes on 127.0.0.1; each rank
connects to the cluster by address through the plugin's own connection cache.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import time
import warnings
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs.errors import ChecksumMismatch, InvalidArgument, InvalidPath  # noqa: E402
from tests.rendezvous import leave, rendezvous  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

_counter = [0]


def _run_dir(cluster: Any, label: str) -> str:
    """A fresh run directory URI per test."""
    _counter[0] += 1
    return f"tectofs://{cluster.address}/torch-tests/{label}-{os.getpid()}-{_counter[0]}"


def _model_and_optimizer(seed: int) -> tuple[Any, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b.view(torch.uint8) if b.dtype == torch.bool else b), where
    elif isinstance(a, dict):
        assert set(a) == set(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# -- URIs ---------------------------------------------------------------------------------


def test_uri_parsing() -> None:
    loc = tt.parse("tectofs://10.0.0.1:7000/runs/a/step_100")
    assert (loc.address, loc.path, loc.name, loc.parent) == ("10.0.0.1:7000", "/runs/a/step_100", "step_100", "/runs/a")
    assert tt.parse("tectofs:///x").address is None
    assert tt.CheckpointWriter.validate_checkpoint_id("tectofs://h:1/x")
    assert tt.CheckpointReader.validate_checkpoint_id("tectofs://h:1/x")
    for bad in ("/local/path", "s3://b/k", "tectofs://h/x", "tectofs://h:1/a/../b", "tectofs://h:99999/x"):
        assert not tt.CheckpointWriter.validate_checkpoint_id(bad), bad
    with pytest.raises((InvalidArgument, InvalidPath)):
        tt.parse("tectofs://h:1/a/../b")


# -- single process -----------------------------------------------------------------------


def test_save_load_roundtrip_bit_exact(cluster: Any) -> None:
    run = _run_dir(cluster, "roundtrip")
    model, opt = _model_and_optimizer(0)
    extras = {
        "bf16": torch.randn(7, 5).to(torch.bfloat16),
        "strided": torch.arange(60, dtype=torch.float64).reshape(6, 10)[:, ::3],
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "mask": torch.rand(33) > 0.5,
        "i64": torch.randint(-(2**40), 2**40, (17,)),
        "step": 42,
        "name": "run-a",
        "cfg": {"lr": 1e-3, "betas": [0.9, 0.95]},
    }
    sd = {"model": model.state_dict(), "optim": opt.state_dict(), "extras": extras}
    ckpt = f"{run}/step_1"
    dcp.save(sd, checkpoint_id=ckpt)  # picked by checkpoint id: no storage_writer given

    loc = tt.parse(ckpt)
    fs = cluster.fs
    names = fs.listdir(loc.path)
    assert ".metadata" in names
    assert all(n == ".metadata" or (n.startswith("__0_") and n.endswith(".distcp")) for n in names), names
    assert 1 <= len(names) - 1 <= 4  # many items packed into a few files
    assert fs.listdir(loc.parent) == ["step_1"]  # no pending leftovers

    meta = pickle.loads(fs.read_bytes(f"{loc.path}/.metadata"))
    fmts = {idx.fqn: info.fmt for idx, info in meta.storage_data.items()}
    assert fmts["model.0.weight"] == "raw" and fmts["extras.bf16"] == "raw"  # no pickle round-trip
    assert all(isinstance(info.crc32c, int) for info in meta.storage_data.values())

    model2, opt2 = _model_and_optimizer(1)
    target = {
        "model": model2.state_dict(),
        "optim": opt2.state_dict(),
        "extras": {
            "bf16": torch.zeros(7, 5, dtype=torch.bfloat16),
            "strided": torch.zeros(6, 4, dtype=torch.float64),
            "scalar": torch.tensor(0.0),
            "empty": torch.ones(0, 4),
            "mask": torch.zeros(33, dtype=torch.bool),
            "i64": torch.zeros(17, dtype=torch.int64),
            "step": 0,
            "name": "",
            "cfg": {"lr": 0.0, "betas": [0.0, 0.0]},  # DCP loads the keys the target has
        },
    }
    dcp.load(target, checkpoint_id=ckpt)
    _assert_same(sd, target)
    # Again with tiny reads: big items fetched in pieces straight into their tensors.
    for t in [*target["model"].values(), *target["extras"].values()]:
        if isinstance(t, torch.Tensor):
            t.zero_()
    dcp.load(target, storage_reader=tt.CheckpointReader(ckpt, max_read_bytes=1000, inflight_bytes=3000))
    _assert_same(sd, target)
    model2.load_state_dict(target["model"])
    opt2.load_state_dict(target["optim"])
    x = torch.randn(4, 32)
    assert torch.equal(model(x), model2(x))

    assert tt.latest(run) == ckpt


def test_overwrite_rule_and_latest_order(cluster: Any) -> None:
    run = _run_dir(cluster, "overwrite")
    sd = {"w": torch.arange(10.0)}
    for step in (9, 10, 2):
        dcp.save({"w": sd["w"] + step}, checkpoint_id=f"{run}/step_{step}")
    assert tt.latest(run) == f"{run}/step_10"  # numeric suffix, not name or mtime order
    assert tt.checkpoints(run) == [f"{run}/step_2", f"{run}/step_9", f"{run}/step_10"]

    # An existing checkpoint is never silently replaced ...
    with pytest.raises(CheckpointException, match="already exists"):
        dcp.save(sd, checkpoint_id=f"{run}/step_10")
    out = {"w": torch.zeros(10)}
    dcp.load(out, checkpoint_id=f"{run}/step_10")
    assert torch.equal(out["w"], sd["w"] + 10)
    # ... unless asked, and an empty directory is simply taken over.
    dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/step_10", overwrite=True))
    dcp.load(out, checkpoint_id=f"{run}/step_10")
    assert torch.equal(out["w"], sd["w"])
    cluster.fs.mkdir(tt.parse(f"{run}/step_11").path)
    dcp.save(sd, checkpoint_id=f"{run}/step_11")
    assert tt.latest(run) == f"{run}/step_11"
    assert not [n for n in cluster.fs.listdir(tt.parse(run).path) if n.startswith(".")]

    # An incomplete directory (no .metadata) is never "latest".
    cluster.fs.mkdir(tt.parse(f"{run}/step_99").path)
    assert tt.latest(run) == f"{run}/step_11"
    with pytest.raises(CheckpointException, match="no complete checkpoint"):
        dcp.load(out, checkpoint_id=f"{run}/step_99")


def test_checksum_mismatch_names_the_item(cluster: Any) -> None:
    run = _run_dir(cluster, "corrupt")
    model, _ = _model_and_optimizer(0)
    ckpt = f"{run}/step_1"
    dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)

    loc = tt.parse(ckpt)
    meta = pickle.loads(cluster.fs.read_bytes(f"{loc.path}/.metadata"))
    (index, info), = [(i, s) for i, s in meta.storage_data.items() if i.fqn == "model.2.weight"]
    path = f"{loc.path}/{info.relative_path}"
    blob = bytearray(cluster.fs.read_bytes(path))
    blob[info.offset + info.length // 2] ^= 0x5A  # a valid write of wrong bytes: only our crc can tell
    cluster.fs.write_bytes(path, blob)

    target = {"model": _model_and_optimizer(1)[0].state_dict()}
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load(target, checkpoint_id=ckpt)
    (exc, _), = excinfo.value.failures.values()
    assert isinstance(exc, ChecksumMismatch)
    assert "model.2.weight" in str(exc) and "crc32c" in str(exc) and info.relative_path in str(exc)


def test_corrupted_chunk_is_repaired_from_parity_on_load(cluster: Any) -> None:
    run = _run_dir(cluster, "repair")
    torch.manual_seed(5)
    sd = {"w": torch.randn(700, 1024), "b": torch.randn(100).to(torch.bfloat16), "step": 3}  # w spans 3 blocks
    ckpt = f"{run}/step_1"
    dcp.save(sd, storage_writer=tt.CheckpointWriter(ckpt, thread_count=1))
    path = tt.parse(ckpt).path
    (data_file,) = [n for n in cluster.fs.listdir(path) if n.endswith(".distcp")]
    victim = f"{path}/{data_file}"
    # damaged bits on a chunk server's disk, in data chunk 0 of the first block (loads read
    # data chunks first, so this one is always read)
    original = cluster.flip_chunk_byte(victim, 0, 0, 4096)

    out = {"w": torch.zeros(700, 1024), "b": torch.zeros(100, dtype=torch.bfloat16), "step": 0}
    dcp.load(out, checkpoint_id=ckpt)  # served from parity, bit-exact
    _assert_same(sd, out)

    cluster.wait_chunk_byte(victim, 0, 0, 4096, original)  # ... and the bad chunk is rewritten in the background
    out["w"].zero_()
    dcp.load(out, checkpoint_id=ckpt)
    _assert_same(sd, out)


def test_load_across_blocks_in_small_windows(cluster: Any) -> None:
    """Items straddling block boundaries at odd offsets, many small neighbours (coalesced),
    windows smaller than a block, one read in flight at a time: all bit-exact."""
    run = _run_dir(cluster, "windows")
    torch.manual_seed(7)
    sd = {"big": torch.randn(700_001), "half": torch.randn(333, 777).to(torch.float16),
          "empty": torch.zeros(0), **{f"s{i}": torch.randn(i + 1) for i in range(40)}}
    ckpt = f"{run}/step_1"
    dcp.save(sd, storage_writer=tt.CheckpointWriter(ckpt, thread_count=1))
    for reader in (tt.CheckpointReader(ckpt), tt.CheckpointReader(ckpt, thread_count=1, inflight_bytes=1),
                   tt.CheckpointReader(ckpt, max_read_bytes=300_000, coalesce_gap_bytes=0)):
        out = {k: torch.full_like(v, -1) for k, v in sd.items()}
        dcp.load(out, storage_reader=reader)
        _assert_same(sd, out)


def test_commit_removes_stale_leftovers(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run_dir(cluster, "autogc")
    fs = cluster.fs
    run_path = tt.parse(run).path
    fs.mkdir(run_path, parents=True, exist_ok=True)
    long_ago = time.time() - 3 * 24 * 3600
    stale_dir = f"{run_path}/.step_1.pending-0123456789abcdef"  # a save killed 3 days ago
    fs.mkdir(stale_dir)
    fs.write_bytes(f"{stale_dir}/__0_0.distcp", b"x" * 1000)
    fs.utime(f"{stale_dir}/__0_0.distcp", (long_ago, long_ago))
    fs.utime(stale_dir, (long_ago, long_ago))
    stale_file = f"{run_path}/.model.pt.pending-aaaaaaaaaaaaaaaa"  # an interrupted tt.save
    fs.write_bytes(stale_file, b"y")
    fs.utime(stale_file, (long_ago, long_ago))
    fresh_dir = f"{run_path}/.step_2.pending-fedcba9876543210"  # maybe still being written
    fs.mkdir(fresh_dir)
    sd = {"w": torch.arange(10.0)}

    dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/step_3", pending_grace_s=None))  # off
    assert len(fs.listdir(run_path)) == 4
    dcp.save(sd, checkpoint_id=f"{run}/step_4")  # default grace: 24 h
    assert sorted(fs.listdir(run_path)) == [".step_2.pending-fedcba9876543210", "step_3", "step_4"]

    # Cleaning up is best effort: its failure never fails a save.
    def broken(*args: Any, **kwargs: Any) -> list[str]:
        raise ConnectionError("metadata service went away")

    monkeypatch.setattr(tt._dcp, "gc_pending", broken)  # the name the writer calls
    with pytest.warns(UserWarning, match="could not clean up"):
        dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/step_5", pending_grace_s=0))
    assert tt.latest(run) == f"{run}/step_5"
    monkeypatch.undo()
    dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/step_6", pending_grace_s=0))
    assert sorted(fs.listdir(run_path)) == ["step_3", "step_4", "step_5", "step_6"]


def test_torch_save_load_single_file(cluster: Any) -> None:
    run = _run_dir(cluster, "single")
    model, opt = _model_and_optimizer(3)
    obj = {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 7}
    tt.save(obj, f"{run}/model.pt")
    tt.save({"epoch": 8}, f"{run}/model.pt")  # atomic replace of the old file
    tt.save(obj, f"{run}/model.pt")
    assert cluster.fs.listdir(tt.parse(run).path) == ["model.pt"]
    _assert_same(obj, tt.load(f"{run}/model.pt"))


# -- async --------------------------------------------------------------------------------


def test_async_save_reuses_bounded_staging(cluster: Any) -> None:
    run = _run_dir(cluster, "async")
    writer = tt.CheckpointWriter(thread_count=2)
    torch.manual_seed(0)
    sd = {"w": torch.randn(512, 256), "b": torch.randn(256), "step": 1}
    expected1 = {"w": sd["w"].clone(), "b": sd["b"].clone(), "step": 1}

    t0 = time.monotonic()
    f1 = dcp.async_save(sd, checkpoint_id=f"{run}/step_1", storage_writer=writer)
    staged_s = time.monotonic() - t0
    sd["w"].add_(1.0)  # training goes on: must not leak into checkpoint 1
    sd["step"] = 2
    f2 = dcp.async_save(sd, checkpoint_id=f"{run}/step_2", storage_writer=writer)
    assert isinstance(f1, Future) and isinstance(f2, Future)  # (an AsyncSaveResponse comes of a future-staging stager)
    assert f1.done()  # the second save waited for the first: one staged checkpoint in flight
    f2.result(timeout=60)
    f1.result()
    pool = writer._staging_pool()
    nbytes = (512 * 256 + 256) * 4
    assert pool.reused_bytes == nbytes and pool.allocated_bytes == nbytes
    assert pool.held_bytes <= nbytes
    print(f"async_save blocked {staged_s * 1000:.1f} ms")

    out = {"w": torch.zeros(512, 256), "b": torch.zeros(256), "step": 0}
    dcp.load(out, checkpoint_id=f"{run}/step_1")
    _assert_same(expected1, out)
    dcp.load(out, checkpoint_id=f"{run}/step_2")
    _assert_same(sd, out)

    # A failed upload surfaces through the returned future (and frees the buffers).
    f3 = dcp.async_save(sd, checkpoint_id=f"{run}/step_2", storage_writer=writer)
    assert isinstance(f3, Future)
    with pytest.raises(CheckpointException, match="already exists"):
        f3.result(timeout=60)
    assert writer.wait_staging_idle(timeout=10)
    f4 = dcp.async_save(sd, checkpoint_id=f"{run}/step_3", storage_writer=writer)
    assert isinstance(f4, Future)
    f4.result(timeout=60)
    assert tt.latest(run) == f"{run}/step_3"
    writer.close()

    # Budget: a state dict bigger than the staging cap is refused, not half-staged.
    small = tt.CheckpointWriter(staging_max_bytes=1024)
    with pytest.raises(ValueError, match="staging"):
        dcp.async_save(sd, checkpoint_id=f"{run}/step_4", storage_writer=small)


# -- multi-process ------------------------------------------------------------------------

N_ROWS = 24  # divisible by 4 and by 2


def _full_tensor() -> Any:
    return torch.arange(N_ROWS * 5, dtype=torch.float32).reshape(N_ROWS, 5) / 7


def _init_pg(rank: int, world: int, rendezvous: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.simplefilter("ignore")
    dist.init_process_group(
        "gloo", init_method=rendezvous, rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )


def _sharded_state(world: int, rank: int, fill: Any = None) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    rows = N_ROWS // world
    local = _full_tensor()[rank * rows : (rank + 1) * rows].clone() if fill is None else torch.full((rows, 5), fill)
    torch.manual_seed(123)
    replicated = torch.randn(9, 3) if fill is None else torch.zeros(9, 3)
    return {
        "model": {"sharded": DTensor.from_local(local, mesh, [Shard(0)], run_check=False), "replicated": replicated},
        "meta": {"world": world if fill is None else -1},
    }


def _save_worker(rank: int, world: int, rendezvous: str, run: str) -> None:
    _init_pg(rank, world, rendezvous)
    try:
        state = _sharded_state(world, rank)
        dcp.save(state, checkpoint_id=f"{run}/step_5")
        # async: DTensors staged into the writer's buffers, uploaded behind the caller
        writer = tt.CheckpointWriter()
        future = dcp.async_save(state, checkpoint_id=f"{run}/step_6", storage_writer=writer)
        assert isinstance(future, Future)
        state["model"]["sharded"].to_local().mul_(0)  # after staging: must not reach step_6
        future.result(timeout=60)
        writer.close()
    finally:
        dist.destroy_process_group()
    leave()


def _load_worker(rank: int, world: int, rendezvous: str, run: str) -> None:
    _init_pg(rank, world, rendezvous)
    try:
        for step in (5, 6):
            state = _sharded_state(world, rank, fill=-1.0)
            dcp.load(state, checkpoint_id=f"{run}/step_{step}")
            rows = N_ROWS // world
            assert torch.equal(state["model"]["sharded"].to_local(), _full_tensor()[rank * rows : (rank + 1) * rows])
            torch.manual_seed(123)
            assert torch.equal(state["model"]["replicated"], torch.randn(9, 3))
            assert state["meta"]["world"] == 4
    finally:
        dist.destroy_process_group()
    leave()


def test_four_ranks_save_two_ranks_load(cluster: Any, tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    run = _run_dir(cluster, "reshard")
    mp.spawn(_save_worker, args=(4, rendezvous(tmp_path), run), nprocs=4, join=True)
    files = cluster.fs.listdir(tt.parse(f"{run}/step_5").path)
    assert {f.split("_")[2] for f in files if f.endswith(".distcp")} == {"0", "1", "2", "3"}, files  # all ranks wrote
    assert tt.latest(run) == f"{run}/step_6"
    assert cluster.fs.listdir(tt.parse(run).path) == ["step_5", "step_6"]
    mp.spawn(_load_worker, args=(2, rendezvous(tmp_path), run), nprocs=2, join=True)


class _DyingWriter(tt.CheckpointWriter):
    """Kills its process at a chosen point of the save (fault injection)."""

    def __init__(self, *args: Any, die_rank: int, die_at: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.die_rank, self.die_at = die_rank, die_at

    def _write_file(self, fs: Any, pending: str, name: str, items: Any, planner: Any) -> Any:
        out = super()._write_file(fs, pending, name, items, planner)
        if self.die_at == "write" and self.rank == self.die_rank:
            os._exit(17)  # after at least one of its files is stored
        return out

    def _commit(self, fs: Any, pending: str, loc: Any, token: str) -> None:
        if self.die_at == "commit" and self.rank == self.die_rank:
            os._exit(17)  # .metadata written, rename not done
        super()._commit(fs, pending, loc, token)


def _dying_save_worker(rank: int, world: int, rendezvous: str, ckpt: str, die_rank: int, die_at: str) -> None:
    if world > 1:
        _init_pg(rank, world, rendezvous)
    warnings.simplefilter("ignore")
    state = {"w": torch.full((64, 64), float(rank)), f"r{rank}": torch.arange(1000.0) + rank}
    writer = _DyingWriter(ckpt, die_rank=die_rank, die_at=die_at, thread_count=2)
    try:
        dcp.save(state, storage_writer=writer)
    except BaseException:
        os._exit(3)  # the survivors see the failure
    os._exit(0)


def _run_ranks(target: Any, world: int, args: tuple, timeout_s: float = 90.0) -> list[int | None]:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(rank, world, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


@pytest.mark.parametrize("world,die_rank,die_at", [(2, 1, "write"), (1, 0, "commit")])
def test_killed_save_leaves_previous_checkpoint(cluster: Any, tmp_path: Any, world: int, die_rank: int, die_at: str) -> None:
    run = _run_dir(cluster, f"crash-{die_at}")
    good = {"w": torch.ones(64, 64), "r0": torch.arange(1000.0)}
    dcp.save(good, checkpoint_id=f"{run}/step_1")

    codes = _run_ranks(_dying_save_worker, world, (rendezvous(tmp_path), f"{run}/step_2", die_rank, die_at))
    assert codes[die_rank] == 17, codes
    assert all(c in (3, 17) for c in codes), codes  # nobody believes the save succeeded

    fs = cluster.fs
    run_path = tt.parse(run).path
    assert not fs.exists(f"{run_path}/step_2")
    assert tt.latest(run) == f"{run}/step_1"
    leftovers = [n for n in fs.listdir(run_path) if n.startswith(".step_2.pending-")]
    assert len(leftovers) == 1, fs.listdir(run_path)
    if die_at == "commit":
        assert ".metadata" in fs.listdir(f"{run_path}/{leftovers[0]}")

    out = {"w": torch.zeros(64, 64), "r0": torch.zeros(1000)}
    dcp.load(out, checkpoint_id=tt.latest(run))
    _assert_same(good, out)

    assert tt.gc_pending(run, older_than_s=3600) == []  # fresh: maybe still being written
    assert tt.gc_pending(run, older_than_s=0) == [f"{run}/{leftovers[0]}"]
    assert fs.listdir(run_path) == ["step_1"]
