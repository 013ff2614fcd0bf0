"""State dicts in the torch plugin's tests: copies, walks and comparisons of nested dicts and
lists of tensors (``_assert_same`` is ``tests.test_torch_plugin``'s)."""

from __future__ import annotations

from typing import Any, Iterator

import torch


def snapshot(sd: Any) -> Any:
    """A deep copy of the tensors of ``sd`` (dicts and lists copied, other values shared)."""
    if isinstance(sd, torch.Tensor):
        return sd.clone()
    if isinstance(sd, dict):
        return {k: snapshot(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [snapshot(v) for v in sd]
    return sd


def named(sd: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """``(dotted name, tensor)`` of every tensor of ``sd``, in key order."""
    if isinstance(sd, torch.Tensor):
        yield prefix, sd
    elif isinstance(sd, dict):
        for k, v in sorted(sd.items(), key=lambda kv: str(kv[0])):
            yield from named(v, f"{prefix}.{k}")
    elif isinstance(sd, list):
        for i, v in enumerate(sd):
            yield from named(v, f"{prefix}.{i}")


def tensors(sd: Any) -> Iterator[torch.Tensor]:
    return (t for _, t in named(sd))
