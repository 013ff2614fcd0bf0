"""The incremental-checkpoint rows of ``tectofs bench checkpoint`` (``checkpoint_bench.py``).

A fine-tune with 90% of its parameters frozen: ``LAYERS`` fp32 weights of equal size, the last
one trained. Each round saves the weights in full (``CheckpointWriter()``), then twice with
``CheckpointWriter(incremental=True)``: the first incremental save (nothing to share yet, into
a fresh directory) and, after the trained weight changed, the second. Measured per save: the
wall time and the chunk bytes this process sent to the chunk servers (parity included, from
the client's ``tectofs_client_chunk_bytes_total``); the second save is compared with the full
one of the same round. Each second save is loaded back and compared bit for bit.
"""

from __future__ import annotations

import time
from typing import Any, Callable

LAYERS = 10


def frozen_fine_tune(size_bytes: int) -> dict[str, Any]:
    """``LAYERS`` fp32 weights, ``size_bytes`` in all."""
    import torch

    gen = torch.Generator().manual_seed(3)
    rows = max(1, size_bytes // LAYERS // 4 // 1024)
    return {f"layers.{i}.weight": torch.randn(rows, 1024, generator=gen) for i in range(LAYERS)}


def _put_bytes() -> float:
    from tectofs import metrics

    return metrics.client_registry().get_sample_value("tectofs_client_chunk_bytes_total", {"op": "put_chunk"}) or 0.0


def measure(base: str, size_bytes: int, repeats: int, record: Callable[[str, float], None],
            same_state: Callable[[Any, Any], bool]) -> dict[str, Any]:
    """Run the rounds against the cluster at ``base`` (a ``tectofs://`` directory); ``record``
    gets each timed row. Returns the per-round chunk bytes and whether every load was exact."""
    import torch
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt

    weights = frozen_fine_tune(size_bytes)
    trained = f"layers.{LAYERS - 1}.weight"
    sent: dict[str, list[float]] = {"full": [], "incremental, first": [], "incremental, second": []}
    exact = True

    def save(name: str, uri: str, writer: Any) -> None:
        before = _put_bytes()
        started = time.perf_counter()
        dcp.save(weights, checkpoint_id=uri, storage_writer=writer)
        record(f"tectofs save, {name}" if name == "full" else f"tectofs save, {name} (90% frozen)",
               time.perf_counter() - started)
        sent[name].append(_put_bytes() - before)

    for i in range(repeats):
        save("full", f"{base}/full/step_{i}", tt.CheckpointWriter())
        save("incremental, first", f"{base}/run_{i}/step_1", tt.CheckpointWriter(incremental=True))
        with torch.no_grad():
            weights[trained].add_(1e-3)  # the step trains the unfrozen tenth
        save("incremental, second", f"{base}/run_{i}/step_2", tt.CheckpointWriter(incremental=True))
        out = {k: torch.empty_like(v) for k, v in weights.items()}
        dcp.load(out, checkpoint_id=f"{base}/run_{i}/step_2")
        exact = exact and same_state(weights, out)
    return {"chunk_bytes_sent": sent, "bit_exact": exact}
