"""``dcp_to_torch_save`` / ``torch_save_to_dcp``: torch's ``format_utils`` conversions with
the tectofs reader and writer (torch's own hard-code ``FileSystemReader``/``FileSystemWriter``).

The single file may be a local path or a ``tectofs://`` URI (then written atomically by
:func:`tectofs.torch.save` and read by :func:`tectofs.torch.load`). Like torch's, both load
the whole state dict into this process's memory: run them on one rank.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from .. import uri as _uri
from ._dcp import CheckpointWriter
from ._reader import CheckpointReader

_NO_DIST_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


def _whole_checkpoint_planner() -> Any:
    """DCP's planner that rebuilds the whole state dict from the checkpoint's metadata
    (what torch's own converter uses), keeping the dict it fills: ``dcp.load`` loads into a
    copy of the (empty) dict it is given, which it would hand back only key by key."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

    class WholeCheckpoint(_EmptyStateDictLoadPlanner):
        loaded: dict[str, Any] = {}

        def set_up_planner(self, state_dict: Any, *args: Any, **kwargs: Any) -> None:
            super().set_up_planner(state_dict, *args, **kwargs)
            self.loaded = state_dict  # filled in place by the load

    return WholeCheckpoint()


def dcp_to_torch_save(uri: str | os.PathLike, path: str | os.PathLike) -> None:
    """Convert the DCP checkpoint at ``uri`` (``tectofs://HOST:PORT/run/step_100``, every
    item's crc32c checked) into one ``torch.save`` file at ``path`` (local or ``tectofs://``);
    the file holds the checkpoint's full state dict, unsharded."""
    planner = _whole_checkpoint_planner()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
        dcp.load({}, storage_reader=CheckpointReader(uri), planner=planner, no_dist=True)
    state_dict = planner.loaded
    if _uri.is_uri(path):
        from ._manage import save

        save(state_dict, path)
    else:
        torch.save(state_dict, path)


def torch_save_to_dcp(path: str | os.PathLike, uri: str | os.PathLike, *, overwrite: bool = False) -> None:
    """Convert the ``torch.save`` file at ``path`` (local or ``tectofs://``; loaded with
    ``weights_only=False``, as torch's own converter does: only convert files you trust)
    into a DCP checkpoint at ``uri``, committed atomically like any tectofs save
    (``overwrite`` as in :class:`CheckpointWriter`)."""
    if _uri.is_uri(path):
        from ._manage import load

        state_dict = load(path, weights_only=False)
    else:
        state_dict = torch.load(path, weights_only=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_NO_DIST_WARNING)
        dcp.save(state_dict, storage_writer=CheckpointWriter(uri, overwrite=overwrite), no_dist=True)
