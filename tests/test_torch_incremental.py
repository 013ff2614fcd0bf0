"""Incremental checkpoints (``CheckpointWriter(incremental=True)``) against a real cluster: a
fine-tune with 90% of its parameters frozen sends a fraction of a full save's bytes to the
chunk servers, loads bit-exact, and keeps what it shares with the previous checkpoint alive
when that one is deleted and collected; a crash between the references and the commit leaves
the previous checkpoint whole; a previous checkpoint deleted during the save costs bytes, not
the save."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs import metrics  # noqa: E402
from tectofs.torch import _incremental  # noqa: E402
from tectofs.torch._dcp import CheckpointWriter  # noqa: E402
from tectofs.wire import messages  # noqa: E402
from tests.torch_states import named, snapshot, tensors  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

LAYERS = 10
WIDTH = 512  # a 512x512 fp32 weight is 1 MiB: a block of the test cluster each


def _fine_tune() -> tuple[Any, Any]:
    """10 layers, the first 9 frozen (90% of the parameters), AdamW on the last."""
    torch.manual_seed(5)
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
    for layer in list(model)[:-1]:
        layer.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, optimizer


def _train(model: Any, optimizer: Any, steps: int) -> None:
    for _ in range(steps):
        model(torch.randn(4, WIDTH)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def _saved_then_trained(run: str) -> tuple[Any, Any, float, dict[str, Any], dict[str, Any]]:
    """A fine-tune trained a step, saved as ``run/step_1`` (incrementally: in full, the first),
    trained one more step: the model, its optimizer, the chunk bytes of that save, and the
    weights saved and the weights now."""
    model, optimizer = _fine_tune()
    _train(model, optimizer, 1)
    saved = snapshot(model.state_dict())
    full, _ = _saved({"model": model.state_dict()}, f"{run}/step_1")
    _train(model, optimizer, 1)
    return model, optimizer, full, saved, snapshot(model.state_dict())


def _put_bytes() -> float:
    return metrics.client_registry().get_sample_value("tectofs_client_chunk_bytes_total", {"op": "put_chunk"}) or 0.0


def _saved(state: dict[str, Any], uri: str, **options: Any) -> tuple[float, CheckpointWriter]:
    writer = tt.CheckpointWriter(incremental=True, **options)
    before = _put_bytes()
    dcp.save(state, checkpoint_id=uri, storage_writer=writer)
    return _put_bytes() - before, writer


def _assert_loads(uri: str, expected: dict[str, Any]) -> None:
    out = snapshot(expected)
    for t in tensors(out):
        t.fill_(-7)
    dcp.load(out, checkpoint_id=uri)
    for (name, a), (_, b) in zip(named(expected), named(out)):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{uri}: {name} differs"


def _wait_collected(cluster: Any, before: int, timeout_s: float = 30.0) -> int:
    """Wait until the chunk servers deleted chunks (fewer than ``before``) and the count held
    still for a few heartbeats; returns it."""
    deadline = time.monotonic() + timeout_s
    last, still_since = cluster.chunk_count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.3)
        now = cluster.chunk_count()
        if now != last:
            last, still_since = now, time.monotonic()
        elif now < before and time.monotonic() - still_since > 2.0:
            return now
    pytest.fail(f"chunks were not collected within {timeout_s:g} s ({last} of {before} left)")


@pytest.mark.slow
def test_frozen_fine_tune_writes_what_changed_and_keeps_what_it_shares(cluster: Any) -> None:
    run = f"tectofs://{cluster.address}/torch-tests/incremental-{os.getpid()}"
    model, optimizer = _fine_tune()
    _train(model, optimizer, 1)
    weights1 = snapshot(model.state_dict())
    full, first = _saved({"model": model.state_dict()}, f"{run}/model/step_1")
    assert first.referenced_bytes == 0  # nothing before it
    _train(model, optimizer, 2)
    weights2 = snapshot(model.state_dict())
    second, writer = _saved({"model": model.state_dict()}, f"{run}/model/step_2")
    frozen = (LAYERS - 1) * WIDTH * WIDTH * 4
    assert writer.referenced_bytes == frozen  # every frozen weight, no more (the biases are packed, small)
    print(f"model only: second save sent {second / full:.3f} of the first's chunk bytes ({second:.0f} / {full:.0f})")
    assert second <= 0.12 * full

    # Model and optimizer: the trainable layer's weights and Adam moments change, the rest is shared.
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    full_both, _ = _saved(state, f"{run}/both/step_1")
    expected1 = snapshot(state)
    _train(model, optimizer, 1)
    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    expected2 = snapshot(state)
    second_both, writer = _saved(state, f"{run}/both/step_2")
    assert writer.referenced_bytes == frozen
    changed = sum(t.numel() * t.element_size() for _, t in named(expected2)) - frozen
    print(f"model + AdamW: second save sent {second_both / full_both:.3f} of the first's chunk bytes;"
          f" {changed / (changed + frozen):.3f} of the tensor bytes changed")
    assert second_both <= full_both * (changed / (changed + frozen)) * 1.1

    _assert_loads(f"{run}/model/step_1", {"model": weights1})
    _assert_loads(f"{run}/model/step_2", {"model": weights2})
    _assert_loads(f"{run}/both/step_2", expected2)

    # Deleting the first checkpoints frees only what nothing else uses.
    fs = cluster.fs
    shared = fs.shared_blocks(tt.parse(f"{run}/both/step_2").path, ["__0_0.distcp"])
    assert sum(n for _, _, n in shared) == frozen
    before = cluster.chunk_count()
    fs.rmtree(tt.parse(f"{run}/model/step_1").path)
    fs.rmtree(tt.parse(f"{run}/both/step_1").path)
    _wait_collected(cluster, before)
    _assert_loads(f"{run}/model/step_2", {"model": weights2})
    _assert_loads(f"{run}/both/step_2", expected2)
    assert fs.shared_blocks(tt.parse(f"{run}/both/step_2").path, ["__0_0.distcp"]) == []  # its blocks alone now
    del expected1


@pytest.mark.slow
def test_a_shared_block_is_repaired_like_any_block(cluster: Any) -> None:
    """A corrupt chunk of a block two checkpoints share: both load bit-exact (from parity) and
    the chunk is rebuilt once, for both."""
    run = f"tectofs://{cluster.address}/torch-tests/incremental-repair-{os.getpid()}"
    model, _, _, weights1, weights2 = _saved_then_trained(run)
    _, writer = _saved({"model": model.state_dict()}, f"{run}/step_2")
    assert writer.referenced_bytes
    first, second = (f"{tt.parse(f'{run}/step_{i}').path}/__0_0.distcp" for i in (1, 2))
    shared = cluster.fs.shared_blocks(tt.parse(f"{run}/step_2").path, ["__0_0.distcp"])
    blocks = cluster.fs.run(cluster.fs.aio.metadata.layout(messages.LayoutRequest(path=second))).blocks
    victim = min(i for i, block in enumerate(blocks) if block.block_id in {b for _, b, _ in shared})
    original = cluster.flip_chunk_byte(second, victim, 0, 100)
    _assert_loads(f"{run}/step_2", {"model": weights2})  # from parity
    _assert_loads(f"{run}/step_1", {"model": weights1})
    cluster.wait_chunk_byte(second, victim, 0, 100, original)  # rebuilt in the background ...
    cluster.wait_chunk_byte(first, victim, 0, 100, original)  # ... the one chunk both files use
    _assert_loads(f"{run}/step_2", {"model": weights2})


@pytest.mark.slow
def test_a_crash_between_references_and_commit_leaves_the_previous_checkpoint_whole(
        cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = f"tectofs://{cluster.address}/torch-tests/incremental-crash-{os.getpid()}"
    model, _, _, expected, _ = _saved_then_trained(run)

    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("simulated crash before the commit")

    monkeypatch.setattr(CheckpointWriter, "_commit", crash)
    monkeypatch.setattr(CheckpointWriter, "abandon", lambda self: False)  # a crash cleans nothing up
    with pytest.raises(tt.CheckpointFailed, match="simulated crash"):
        _saved({"model": model.state_dict()}, f"{run}/step_2")
    monkeypatch.undo()
    assert tt.latest(run) == f"{run}/step_1"
    fs = cluster.fs
    (pending,) = [n for n in fs.listdir(tt.parse(run).path) if ".pending-" in n]
    assert fs.shared_blocks(f"{tt.parse(run).path}/{pending}", ["__0_0.distcp"])  # the references were taken
    before = cluster.chunk_count()
    assert tt.gc_pending(run, older_than_s=0)
    _wait_collected(cluster, before)
    _assert_loads(f"{run}/step_1", {"model": expected})


@pytest.mark.slow
def test_a_previous_checkpoint_deleted_during_the_save_is_written_instead(
        cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    run = f"tectofs://{cluster.address}/torch-tests/incremental-gone-{os.getpid()}"
    model, _, full, _, expected = _saved_then_trained(run)
    apply = _incremental.References.apply

    def previous_deleted_first(self: Any, size: int) -> int:
        cluster.fs.rmtree(tt.parse(f"{run}/step_1").path)
        return apply(self, size)

    monkeypatch.setattr(_incremental.References, "apply", previous_deleted_first)
    second, writer = _saved({"model": model.state_dict()}, f"{run}/step_2")
    assert writer.referenced_bytes == 0
    assert second >= 0.95 * full  # all of it written after all
    _assert_loads(f"{run}/step_2", {"model": expected})


def test_an_incremental_writer_takes_no_compression() -> None:
    with pytest.raises(ValueError, match="raw"):
        tt.CheckpointWriter(incremental=True, compress=True)


@pytest.mark.slow
def test_incremental_async_saves_staged_beside_the_steps(cluster: Any) -> None:
    """incremental=True with async_staging=True: the pieces are hashed from the staged copy."""
    run = f"tectofs://{cluster.address}/torch-tests/incremental-async-{os.getpid()}"
    model, optimizer = _fine_tune()
    writer = tt.CheckpointWriter(incremental=True, async_staging=True)
    expected = {}
    try:
        for step in (1, 2):
            _train(model, optimizer, 1)
            expected[step] = snapshot(model.state_dict())
            response = dcp.async_save({"model": model.state_dict()}, checkpoint_id=f"{run}/step_{step}",
                                      storage_writer=writer)
            assert isinstance(response, AsyncSaveResponse)
            _train(model, optimizer, 1)  # beside the staging: the optimizer waits for the copy
            response.upload_completion.result(timeout=120)
    finally:
        writer.close()
    assert writer.referenced_bytes == (LAYERS - 1) * WIDTH * WIDTH * 4
    for step in (1, 2):
        _assert_loads(f"{run}/step_{step}", {"model": expected[step]})
