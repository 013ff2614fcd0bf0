"""Staging beside the training step (``CheckpointWriter(async_staging=True)``,
``StagingPool.stage_beside``): the caller is blocked only for a snapshot of the structure,
an optimizer step waits for the copy before it mutates the parameters, a tensor changed in
place before its copy fails the staging instead of saving a torn state, and through
``dcp.async_save`` the checkpoint is the state at the call, bit-exact."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs.errors import CheckpointError  # noqa: E402
from tectofs.torch._staging import StagingPool  # noqa: E402
from tests.test_torch_plugin import _assert_same  # noqa: E402
from tests.torch_states import snapshot, tensors  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _model_and_optimizer() -> tuple[Any, Any]:
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _train_step(model: Any, optimizer: Any) -> None:
    model(torch.randn(8, 256)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_optimizer_step_waits_for_the_staging_and_the_copy_is_the_state_at_the_call() -> None:
    model, optimizer = _model_and_optimizer()
    _train_step(model, optimizer)
    pool = StagingPool()
    blocker, blocker_lease = pool.stage({"x": torch.zeros(4)})  # holds the buffers: the next staging waits
    sd = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 1}
    expected = snapshot(sd)
    started = time.perf_counter()
    staging = pool.stage_beside(sd, timeout=30)
    returned_s = time.perf_counter() - started
    assert not staging.done()
    stepped = threading.Event()

    def step() -> None:
        _train_step(model, optimizer)
        stepped.set()

    stepper = threading.Thread(target=step, daemon=True)
    stepper.start()
    assert not stepped.wait(0.5), "the optimizer stepped while its parameters were being staged"
    pool.release(blocker_lease)
    assert stepped.wait(30)
    stepper.join(timeout=30)
    staged, lease = staging.result(timeout=30)
    _assert_same(expected, staged)
    assert not torch.equal(expected["model"]["0.weight"], model.state_dict()["0.weight"])  # the step did happen
    print(f"stage_beside returned after {returned_s * 1000:.2f} ms")
    pool.release(lease)
    pool.close()
    del blocker


def test_a_tensor_changed_in_place_before_its_copy_fails_the_staging() -> None:
    pool = StagingPool()
    _, blocker_lease = pool.stage({"x": torch.zeros(4)})
    sd = {"w": torch.ones(1000), "b": torch.ones(10)}
    staging = pool.stage_beside(sd, timeout=30)
    sd["w"].add_(1.0)  # not an optimizer step, and nobody waited for staging_completion
    pool.release(blocker_lease)
    with pytest.raises(CheckpointError, match="modified in place while async_save was staging"):
        staging.result(timeout=30)
    assert pool.wait_idle(timeout=5)  # the failed staging gave its buffers back
    # Unchanged tensors stage fine afterwards.
    staged, lease = pool.stage_beside(sd, timeout=30).result(timeout=30)
    _assert_same(sd, dict(staged))
    pool.release(lease)
    pool.close()


def test_a_failed_wait_for_the_buffers_fails_the_staging_not_the_caller() -> None:
    pool = StagingPool()
    _, blocker_lease = pool.stage({"x": torch.zeros(4)})
    staging = pool.stage_beside({"w": torch.ones(8)}, timeout=0.2)
    with pytest.raises(TimeoutError, match="staging buffers busy"):
        staging.result(timeout=30)
    pool.release(blocker_lease)
    pool.close()


@pytest.mark.slow
def test_async_save_beside_training_steps_saves_the_state_at_each_call(cluster: Any) -> None:
    run = f"tectofs://{cluster.address}/torch-tests/beside-{os.getpid()}"
    model, optimizer = _model_and_optimizer()
    _train_step(model, optimizer)
    writer = tt.CheckpointWriter(async_staging=True)
    expected = {}
    responses = []
    try:
        for step in range(3):
            sd = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": step}
            expected[step] = snapshot(sd)
            response = dcp.async_save(sd, checkpoint_id=f"{run}/step_{step}", storage_writer=writer)
            assert isinstance(response, AsyncSaveResponse)
            responses.append(response)
            _train_step(model, optimizer)  # at once: the optimizer waits for the copy by itself
            response.staging_completion.result(timeout=60)
        for response in responses:
            response.upload_completion.result(timeout=120)
    finally:
        writer.close()
    assert tt.latest(run) == f"{run}/step_2"
    for step, state in expected.items():
        out = snapshot(state)
        for t in tensors(out):
            t.zero_()
        out["step"] = -1
        dcp.load(out, checkpoint_id=f"{run}/step_{step}")
        _assert_same(state, out, f"step {step}")

