"""Let ``dcp.save/load(checkpoint_id="tectofs://...")`` pick the tectofs writer/reader.

DCP chooses a storage class from a fixed list (``FileSystemWriter``, ``FsspecWriter``) in
``torch.distributed.checkpoint._storage_utils._storage_setup``; there is no registry. We
wrap that function where ``state_dict_saver`` and ``state_dict_loader`` imported it: a
``tectofs://`` id without an explicit storage object gets a :class:`CheckpointWriter` /
:class:`CheckpointReader`; everything else goes to the original function unchanged.
Installed once, on ``import tectofs.torch``.
"""

from __future__ import annotations

from typing import Any

_MARK = "_tectofs_wrapped"


def install() -> bool:
    """Install the checkpoint-id hook (idempotent). False if this torch has no such hook point."""
    try:
        from torch.distributed.checkpoint import _storage_utils, state_dict_loader, state_dict_saver
    except Exception:
        return False
    original = getattr(_storage_utils, "_storage_setup", None)
    if original is None:
        return False
    original = getattr(original, "__wrapped__", original)

    def _storage_setup(storage: Any, checkpoint_id: Any, reader: bool = False) -> Any:
        if not storage and isinstance(checkpoint_id, str) and checkpoint_id.startswith("tectofs://"):
            from ._dcp import CheckpointWriter
            from ._reader import CheckpointReader

            return CheckpointReader(checkpoint_id) if reader else CheckpointWriter(checkpoint_id)
        return original(storage, checkpoint_id, reader=reader)

    _storage_setup.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(_storage_setup, _MARK, True)
    for module in (_storage_utils, state_dict_saver, state_dict_loader):
        current = getattr(module, "_storage_setup", None)
        if current is not None and not getattr(current, _MARK, False):
            module._storage_setup = _storage_setup
    return True
