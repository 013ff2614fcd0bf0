"""StagingPool's copy: large tensors in slices on two threads, the rest with copy_; the staged
copy is bit-exact and independent of the sources, and a copy that fails leaves no thread
writing into the pool's buffers."""

from __future__ import annotations

import threading
import time

import pytest

torch = pytest.importorskip("torch")

import numpy as np  # noqa: E402

from tectofs.torch import _staging  # noqa: E402
from tectofs.torch._staging import StagingPool  # noqa: E402

pytestmark = pytest.mark.torch


def _state_dict() -> dict:
    g = torch.Generator().manual_seed(1)
    return {
        "bf16": torch.randn(3, 3 << 20, generator=g).to(torch.bfloat16),  # 18 MiB: slices
        "fp32": torch.randn((37 << 20) // 4 + 3, generator=g),  # not a multiple of a slice
        "transposed": torch.randn(1024, 2048, generator=g).t(),  # large, not contiguous: copy_
        "offset": torch.randn(5 << 20, generator=g)[7:],  # a view that starts inside its storage
        "small": torch.arange(10),
        "nested": {"ints": torch.randint(0, 1 << 40, (2 << 20,), generator=g), "step": 3},
    }


def _flat(sd: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def test_staged_copy_is_bit_exact_and_independent_of_the_sources():
    sd = _state_dict()
    expected = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in _flat(sd).items()}
    pool = StagingPool()
    for _ in range(2):  # fresh buffers, then reused ones
        staged, lease = pool.stage(sd)
        for v in _flat(sd).values():
            if isinstance(v, torch.Tensor):
                v.add_(1)  # training goes on
        for key, value in _flat(staged).items():
            if isinstance(value, torch.Tensor):
                assert value.dtype == expected[key].dtype and value.shape == expected[key].shape
                assert torch.equal(value, expected[key]), key  # (no NaNs: equal values are equal bits)
            else:
                assert value == expected[key]
        pool.release(lease)
        sd = _state_dict()
    pool.close()


def test_a_failed_copy_releases_its_lease_only_after_the_helper_stopped(monkeypatch):
    """The staging thread's slice fails while the helper is still copying one: stage() raises
    only once the helper's copy is over (it must not write into buffers a later save gets)."""
    real = np.copyto
    helper_done = threading.Event()

    def copy(dst, src):
        if threading.current_thread().name.startswith("tectofs-stage"):
            time.sleep(0.3)  # the helper's slice is slow
            real(dst, src)
            helper_done.set()
        else:
            time.sleep(0.05)  # let the helper take a slice first
            raise MemoryError("copy failed (test)")

    monkeypatch.setattr(_staging.np, "copyto", copy)
    pool = StagingPool()
    sd = {"a": torch.randn(64 << 20 >> 2), "b": torch.randn(64 << 20 >> 2)}  # 4 slices
    with pytest.raises(MemoryError):
        pool.stage(sd)
    assert helper_done.is_set(), "stage() raised while the helper was still copying"
    monkeypatch.undo()
    staged, lease = pool.stage(sd, timeout=5)  # the lease of the failed copy was released
    assert torch.equal(staged["a"], sd["a"]) and torch.equal(staged["b"], sd["b"])
    pool.release(lease)
    pool.close()
