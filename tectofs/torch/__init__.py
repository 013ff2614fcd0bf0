"""PyTorch integration: DCP storage over the native tectofs client.

    import torch.distributed.checkpoint as dcp
    import tectofs.torch

    # primary: explicit storage objects
    dcp.save(state_dict, storage_writer=tectofs.torch.CheckpointWriter("tectofs://10.0.0.1:7420/runs/a/step_99"))
    # or the id alone (see tectofs.torch._hook for how DCP is taught the scheme)
    dcp.save(state_dict, checkpoint_id="tectofs://10.0.0.1:7420/runs/a/step_100")
    dcp.load(state_dict, checkpoint_id=tectofs.torch.latest("tectofs://10.0.0.1:7420/runs/a"))

    writer = tectofs.torch.CheckpointWriter()          # keep it: its staging buffers are reused
    fut = dcp.async_save(state_dict, checkpoint_id="tectofs://.../step_200", storage_writer=writer)

    # the memory tier: saves land in this host's `tectofs agent`, copied to a peer, persisted behind
    writer = tectofs.torch.CheckpointWriter(tier="memory", agent="127.0.0.1:7500,10.0.0.2:7500")

Saving is atomic (ranks write into a hidden pending directory that the coordinator renames
into place), every item carries a crc32c checked at load, tensors are stored as raw bytes.
``save``/``load`` are the single-file ``torch.save``/``torch.load`` equivalents;
``dcp_to_torch_save``/``torch_save_to_dcp`` convert between the two. A tectofs failure
inside DCP is raised as :class:`CheckpointFailed`, its message starting with the cause.
"""

from __future__ import annotations

from ..checkpoint_gc import gc_pending
from ..uri import Location, close_all, filesystem, is_uri, parse
from . import _hook
from ._convert import dcp_to_torch_save, torch_save_to_dcp
from ._dcp import PENDING_GRACE_S, CheckpointWriter
from ._failures import CheckpointFailed
from ._manage import CheckpointInfo, checkpoints, latest, load, save
from ._memory import MemoryTierWriter
from ._reader import CheckpointReader
from ._staging import StagingPool

_hook.install()

__all__ = [
    "CheckpointFailed",
    "CheckpointInfo",
    "CheckpointReader",
    "CheckpointWriter",
    "Location",
    "MemoryTierWriter",
    "StagingPool",
    "checkpoints",
    "PENDING_GRACE_S",
    "close_all",
    "dcp_to_torch_save",
    "filesystem",
    "gc_pending",
    "is_uri",
    "latest",
    "load",
    "parse",
    "save",
    "torch_save_to_dcp",
]
