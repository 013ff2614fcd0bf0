"""Read once, share with every rank: a file every rank of a load needs (the checkpoint's
``.metadata``) is read from storage by the group's first rank and broadcast to the others over
``torch.distributed``, instead of every rank reading the same bytes from the same chunk
servers at the same moment (1,024 ranks: 1,024 reads of one file; with this, one read and a
broadcast over the training network, which DCP's collectives already use).

It is a collective: every rank of the group must call :func:`read_once` at the same point
(``dcp.load`` calls ``read_metadata`` on every rank of its process group). A failure to read
on the first rank reaches every rank as the same error class, labelled with where it
happened, so no rank waits for bytes that will not come.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable

from .. import errors
from ._failures import _WHERE, where


def group_of(share: Any) -> Any:
    """The process group ``share`` names (``True``: the default group; a ``ProcessGroup``:
    that one), or None when sharing is off: ``share`` false or None, ``torch.distributed``
    not initialized, a group of one rank (reading directly is as fast), or a group this
    process is not in. InvalidArgument for anything else."""
    if share is None or share is False:
        return None
    import torch.distributed as dist

    if not dist.is_available():
        return None
    if share is not True and not isinstance(share, dist.ProcessGroup):
        raise errors.InvalidArgument(f"share_metadata={share!r}: use True, False or a torch.distributed ProcessGroup")
    if not dist.is_initialized():
        return None
    group = dist.group.WORLD if share is True else share
    return group if dist.get_rank(group) >= 0 and dist.get_world_size(group) > 1 else None


def read_once(group: Any, read: Callable[[], bytes]) -> bytes:
    """``read()`` on rank 0 of ``group`` (a ``ProcessGroup``), its bytes on every rank.

    Every rank of ``group`` must call this; each takes part in exactly one broadcast, whatever
    happens on rank 0. If ``read`` raises there (anything, KeyboardInterrupt included), rank 0
    re-raises it and every other rank raises the same tectofs error class with the same
    message and label (``rank 0: read file ...``); an error that is not a tectofs error
    arrives as :class:`tectofs.errors.TectofsError` naming its class."""
    import torch.distributed as dist

    payload: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank(group) == 0:
        try:
            payload[0] = ("ok", read())
        except BaseException as exc:
            failure = exc
            payload[0] = _error_payload(exc)
    # src is a global rank: group_src= needs torch >= 2.6, and pyproject allows 2.4.
    dist.broadcast_object_list(payload, src=dist.get_global_rank(group, 0), group=group)
    if failure is not None:
        raise failure
    outcome = payload[0]
    if outcome[0] == "ok":
        return outcome[1]  # type: ignore[no-any-return]
    _, code, message, label = outcome
    received = errors.from_wire(code, message)
    with contextlib.suppress(Exception):
        setattr(received, _WHERE, f"{label} (read for every rank of the group)" if label else None)
    raise received


def _error_payload(exc: BaseException) -> tuple[str, str, str, str | None]:
    """What the other ranks are told of rank 0's failure: only strings, so it always pickles."""
    try:
        code, message = errors.to_wire(exc)
        return "error", code, message, where(exc)
    except Exception:
        return "error", errors.TectofsError.code, type(exc).__name__, None
