"""Compressed checkpoints through the PyTorch plugin (``CheckpointWriter(compress=...)`` and the
directory default ``tectofs set-policy DIR --compress zstd``): every tensor comes back bit-exact,
compressible items take fewer bytes, and loads need no option."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs.errors import ChecksumMismatch  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    return {
        "w_bf16": (torch.randn(512, 1024, generator=g) * 0.02).to(torch.bfloat16),
        "w_fp16": (torch.randn(300, 70, generator=g) * 0.02).to(torch.float16),
        "adam_sq": (torch.randn(100_000, generator=g) * 1e-4) ** 2,
        "strided": torch.arange(6000, dtype=torch.float64).reshape(60, 100)[:, ::7],
        "specials": torch.tensor([float("nan"), float("inf"), -0.0, 1e-40, 3.0]).to(torch.bfloat16),
        "noise": torch.randint(0, 256, (70_000,), dtype=torch.uint8, generator=g),  # incompressible: raw
        "steps": torch.arange(5000),
        "mask": torch.rand(999, generator=g) > 0.5,
        "empty": torch.zeros(0, 3),
        "scalar": torch.tensor(2.5),
        "epoch": 3,
    }


def _blank(sd: dict[str, Any]) -> dict[str, Any]:
    return {k: (torch.zeros_like(v.contiguous()) if isinstance(v, torch.Tensor) else 0) for k, v in sd.items()}


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert v.dtype == b[k].dtype and v.shape == b[k].shape, k
            assert torch.equal(v.reshape(-1).contiguous().view(torch.uint8), b[k].reshape(-1).contiguous().view(torch.uint8)), k
        else:
            assert v == b[k], k


def _stored(cluster: Any, ckpt: str) -> tuple[dict[str, str], int]:
    """Each item's format and the bytes of the checkpoint's data files."""
    loc = tt.parse(ckpt)
    meta = pickle.loads(cluster.fs.read_bytes(f"{loc.path}/.metadata"))
    fmts = {idx.fqn: info.fmt for idx, info in meta.storage_data.items()}
    size = sum(st.size for name, st in cluster.fs.scandir(loc.path) if name != ".metadata")
    return fmts, size


def test_compressed_checkpoint_round_trips_bit_exact_and_is_smaller(cluster: Any) -> None:
    run = f"tectofs://{cluster.address}/compress-{os.getpid()}"
    sd = _state()
    dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/plain", compress=False))
    dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/packed", compress=True))
    plain_fmts, plain = _stored(cluster, f"{run}/plain")
    fmts, packed = _stored(cluster, f"{run}/packed")
    assert set(plain_fmts.values()) <= {"raw", "bytes"}
    assert fmts["w_bf16"] == fmts["adam_sq"] == fmts["steps"] == "zraw"
    assert fmts["noise"] == "raw" and fmts["empty"] == "raw"  # not worth it / nothing to compress
    bf16_bytes = sd["w_bf16"].nbytes
    assert packed < plain - bf16_bytes * 0.3, (packed, plain)  # bf16 weights alone save a third

    for ckpt, reader in ((f"{run}/packed", None), (f"{run}/packed", tt.CheckpointReader(f"{run}/packed", max_read_bytes=4096))):
        target = _blank(sd)
        dcp.load(target, checkpoint_id=ckpt, storage_reader=reader)
        _same(sd, target)
    # into tensors that are not contiguous: decoded, then copied in
    target = _blank(sd)
    target["w_bf16"] = torch.zeros(1024, 512, dtype=torch.bfloat16).t()
    dcp.load(target, checkpoint_id=f"{run}/packed")
    _same(sd, target)


def test_directory_default_and_the_writer_overrides_it(cluster: Any) -> None:
    base = f"/compress-default-{os.getpid()}"
    cluster.fs.mkdir(base)
    cli = subprocess.run([sys.executable, "-m", "tectofs.cli", "set-policy", "--meta", cluster.address, base,
                          "--compress", "zstd"], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    sd = {"w": (torch.randn(256, 256) * 0.02).to(torch.bfloat16)}
    run = f"tectofs://{cluster.address}{base}/run"  # below the directory: inherited
    dcp.save(sd, checkpoint_id=f"{run}/step_1")
    dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/step_2", compress=False))
    assert _stored(cluster, f"{run}/step_1")[0]["w"] == "zraw"
    assert _stored(cluster, f"{run}/step_2")[0]["w"] == "raw"
    cluster.fs.setxattr(base, "user.tectofs.compress", b"off")
    dcp.save(sd, checkpoint_id=f"{run}/step_3")
    assert _stored(cluster, f"{run}/step_3")[0]["w"] == "raw"
    target = {"w": torch.zeros(256, 256, dtype=torch.bfloat16)}
    dcp.load(target, checkpoint_id=tt.latest(run))
    assert torch.equal(target["w"].view(torch.uint8), sd["w"].view(torch.uint8))


def test_a_damaged_compressed_item_is_named_not_loaded(cluster: Any) -> None:
    ckpt = f"tectofs://{cluster.address}/compress-damaged-{os.getpid()}/step_1"
    sd = {"w": (torch.randn(128, 128) * 0.02).to(torch.bfloat16)}
    dcp.save(sd, storage_writer=tt.CheckpointWriter(ckpt, compress=True))
    loc = tt.parse(ckpt)
    meta = pickle.loads(cluster.fs.read_bytes(f"{loc.path}/.metadata"))
    ((index, info),) = meta.storage_data.items()
    assert info.fmt == "zraw"
    path = f"{loc.path}/{info.relative_path}"
    blob = bytearray(cluster.fs.read_bytes(path))
    blob[info.offset + info.length // 2] ^= 0x5A
    cluster.fs.write_bytes(path, blob)
    with pytest.raises(CheckpointException) as excinfo:
        dcp.load({"w": torch.zeros(128, 128, dtype=torch.bfloat16)}, checkpoint_id=ckpt)
    ((exc, _),) = excinfo.value.failures.values()
    assert isinstance(exc, ChecksumMismatch) and "w" in str(exc)


def test_items_are_compressed_in_parallel_ahead_of_the_upload(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one writer thread, several items are compressed at once (on the codec pool), and
    they are stored in their order all the same."""
    import threading
    import time

    from tectofs import tensor_codec

    real, lock, running, most = tensor_codec.encode, threading.Lock(), [0], [0]

    def slow_encode(*args: Any, **kwargs: Any) -> Any:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        try:
            return real(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(tensor_codec, "encode", slow_encode)
    g = torch.Generator().manual_seed(11)
    sd = {f"w{i}": torch.randn(50_000, generator=g).to(torch.bfloat16) for i in range(8)}
    ckpt = f"tectofs://{cluster.address}/compress-parallel-{os.getpid()}/step_1"
    dcp.save(sd, storage_writer=tt.CheckpointWriter(ckpt, thread_count=1, compress=True))
    assert most[0] >= min(2, os.cpu_count() or 1)
    fmts, _ = _stored(cluster, ckpt)
    assert set(fmts.values()) == {"zraw"}
    out = _blank(sd)
    dcp.load(out, storage_reader=tt.CheckpointReader(ckpt))
    _same(sd, out)


def test_a_failed_compression_fails_the_save_and_publishes_nothing(cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tectofs import tensor_codec

    real = tensor_codec.encode

    def failing(data: Any, dtype: str, *args: Any, **kwargs: Any) -> Any:
        if memoryview(data).nbytes == 2 * 40_000:  # the fourth tensor
            raise MemoryError("no memory for the frame")
        return real(data, dtype, *args, **kwargs)

    monkeypatch.setattr(tensor_codec, "encode", failing)
    sd = {f"w{i}": torch.randn(10_000 * (i + 1)).to(torch.bfloat16) for i in range(6)}
    run = f"tectofs://{cluster.address}/compress-failing-{os.getpid()}"
    with pytest.raises(CheckpointException):
        dcp.save(sd, storage_writer=tt.CheckpointWriter(f"{run}/step_1", thread_count=1, compress=True))
    assert tt.latest(run) is None
