"""PyTorch Lightning ``CheckpointIO`` that saves and loads ``tectofs://`` checkpoints.

    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from tectofs.lightning import TectofsCheckpointIO

    trainer = L.Trainer(
        plugins=[TectofsCheckpointIO()],
        callbacks=[ModelCheckpoint(dirpath="tectofs://10.0.0.1:7420/runs/a")],
    )
    trainer.fit(model)                                   # epoch=0-step=100.ckpt, ... on tectofs
    trainer.fit(model, ckpt_path="tectofs://10.0.0.1:7420/runs/a/last.ckpt")

Each checkpoint is one ``torch.save`` file, written by :func:`tectofs.torch.save`: streamed
to a hidden pending sibling and renamed into place, so a reader (or a resumed job) sees the
previous file or the complete new one. Lightning's own file handling around it (``exists``,
``makedirs``, listing old checkpoints) goes through fsspec, for which tectofs registers
``tectofs://``. Paths that are not ``tectofs://`` are handed to Lightning's
``TorchCheckpointIO`` unchanged, so one plugin serves a job that mixes both.

This is for strategies whose checkpoint is one file (single device, DDP). Sharded ones
(FSDP, ModelParallel) save through DCP: give them ``tectofs.torch.CheckpointWriter``.
"""

from __future__ import annotations

import os
from typing import Any

try:  # the unified "lightning" package, else the standalone "pytorch_lightning"'s fabric
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
except ImportError:  # pragma: no cover - depends on which package is installed
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO  # type: ignore[assignment]  # same class
    from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO  # type: ignore[assignment]

from . import uri as _uri
from .torch import load as _load
from .torch import save as _save


class TectofsCheckpointIO(CheckpointIO):
    """Save, load and remove Lightning checkpoints at ``tectofs://HOST:PORT/path`` (one
    atomic file each); any other path goes to Lightning's ``TorchCheckpointIO``."""

    def __init__(self) -> None:
        self._local = TorchCheckpointIO()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` to ``path`` atomically (creating parent directories)."""
        if not _uri.is_uri(os.fspath(path)):
            return self._local.save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(
                f"TectofsCheckpointIO.save_checkpoint takes no storage_options (got {storage_options!r})"
            )
        _save(checkpoint, os.fspath(path))

    def load_checkpoint(self, path: Any, map_location: Any | None = None, weights_only: bool | None = None) -> dict[str, Any]:
        """Read the checkpoint file at ``path`` (``torch.load`` with the same options)."""
        if not _uri.is_uri(os.fspath(path)):
            return self._local.load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        kwargs: dict[str, Any] = {"map_location": map_location or (lambda storage, loc: storage)}
        if weights_only is not None:
            kwargs["weights_only"] = weights_only
        return _load(os.fspath(path), **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint file at ``path`` (no error if it is already gone)."""
        if not _uri.is_uri(os.fspath(path)):
            return self._local.remove_checkpoint(path)
        fs, loc = _uri.resolve(os.fspath(path))
        try:
            fs.remove(loc.path)
        except FileNotFoundError:
            pass
