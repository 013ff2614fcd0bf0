"""What a save into a memory agent must be allowed before it begins (issue 51, part 1).

A step in an agent is the checkpoint directory its id names (``tectofs://HOST:PORT/path``),
and the agent will persist it there acting as the user who began the save (its *owner*).
Before, any ticket holder could begin a save of any step id: squat another user's next step,
seal bytes under a step id another user's reader (or ``latest()``) trusts, or pin memory with
steps that can never be persisted. Now:

* **Bound at the beginning.** The first put of a new save (a trainer's, not a replica a peer
  agent forwards: that agent checked it) is admitted only if the metadata service, asked
  acting as the owner, lets the owner write the checkpoint's directory: the nearest existing
  ancestor of its parent is a directory the owner may write and search, reached through
  directories the owner may search (``may_save``). A step id whose directory already holds a
  committed checkpoint (a ``.metadata``) is refused too: a step persisted once, then evicted
  from memory, cannot be sealed again by anyone, so a reader never finds other bytes in memory
  than those the storage tier holds. Step ids must be written canonically (``canonical``):
  a listing matches step ids by prefix, so ``/run/../other/step_9`` cannot show up under
  ``/run/``.
* **Readers** then find only steps whose owner could write the directory they name, checked
  when the save began (permissions taken away later stop the persistence, not the reads).
* **Memory** held by steps not yet persisted counts against their owner (``Shares``): as a
  chunk server's admission does, alone an owner may hold ``ALONE_FRACTION`` of
  ``--memory-bytes`` unpersisted, with ``n`` owners holding some each may hold ``1/n``; an
  owner holding none is admitted whenever the bytes fit. Steps that can never be persisted
  thus pin at most their owner's share.

The costs: one check per new save (two to a few metadata lookups, before its first byte is
written; the ranks of one save share it), and the share sum over the steps held (a few dozen)
at each put that grows a step.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Iterable, cast

from tectofs import errors
from tectofs import uri as _uri
from tectofs.checkpoint_gc import METADATA_NAME
from tectofs.shares import fair_share
from tectofs.store.access import Caller, W, X, may
from tectofs.wire.messages import ActAs

if TYPE_CHECKING:
    from tectofs.client import FileSystem

    from .store import HeldStep

ALONE_FRACTION = 0.75  # of --memory-bytes one owner may hold unpersisted while no other owner holds any


def canonical(step: str) -> _uri.Location:
    """The location ``step`` names; InvalidArgument unless ``step`` is written as its
    canonical URI (no repeated or trailing slashes)."""
    loc = _uri.parse(step)
    if loc.uri() != step:
        raise errors.InvalidArgument(f"step {step!r} is not written canonically: name it {loc.uri()!r}")
    if not loc.name:
        raise errors.InvalidArgument(f"{step}: a checkpoint cannot be the root directory")
    return loc


async def _may_save(fs: Any, loc: _uri.Location, owner: ActAs) -> None:
    """``may_save`` on the client's own loop (``fs`` is its ``AsyncFileSystem``)."""
    caller = Caller(owner.uid, owner.gid, frozenset(owner.groups))
    view = fs.acting_as(owner.uid, owner.gid, owner.groups)
    # The usual case in one round trip: the parent exists, the checkpoint does not.
    answers: list[Any] = [*await asyncio.gather(view.stat(loc.parent), view.exists(f"{loc.path}/{METADATA_NAME}"),
                                                  return_exceptions=True)]
    parent, committed = answers
    directory = loc.parent
    while isinstance(parent, errors.NotFound):
        directory = _uri.Location(None, directory).parent
        try:
            parent = await view.stat(directory)  # the service checks search permission on the way
        except errors.NotFound as exc:
            parent = exc
    for answer in (parent, committed):
        if isinstance(answer, BaseException) and not isinstance(answer, errors.NotFound):
            raise answer
    st = cast(Any, parent)
    if st.kind != "dir":
        raise errors.NotADirectory(f"{loc.uri()} cannot be saved: {directory} is not a directory")
    if not may(st, caller, W | X):
        raise errors.PermissionDenied(f"{loc.uri()} cannot be saved by uid {owner.uid}: it may not write {directory}"
                                      " (a memory agent takes only saves their saver could persist)")
    if committed is True:
        raise errors.AlreadyExists(f"checkpoint {loc.uri()} is committed already: a step is saved once (use"
                                   " another name)")


async def may_save(fs: FileSystem, loc: _uri.Location, owner: ActAs) -> None:
    """PermissionDenied (or NotADirectory) unless ``owner`` may persist a checkpoint at
    ``loc`` (module docstring), asked of the metadata service of ``fs`` (the agent's proxy
    client) acting as ``owner``; AlreadyExists if one is committed there."""
    future = asyncio.run_coroutine_threadsafe(_may_save(fs.aio, loc, owner), fs.loop)
    await asyncio.wrap_future(future)


class Shares:
    """Each owner's share of an agent's memory for steps not yet persisted (module docstring)."""

    def __init__(self, memory_bytes_max: int, alone_fraction: float = ALONE_FRACTION) -> None:
        assert memory_bytes_max > 0
        assert 0 < alone_fraction <= 1
        self.memory_bytes_max, self.alone_fraction = memory_bytes_max, alone_fraction

    @staticmethod
    def unpersisted(steps: Iterable[HeldStep]) -> dict[int, int]:
        """Bytes held not yet persisted (being received, or sealed), by owner uid."""
        held: dict[int, int] = {}
        for step in steps:
            if not step.persisted and step.nbytes:
                held[step.owner.uid] = held.get(step.owner.uid, 0) + step.nbytes
        return held

    def share_bytes(self, uid: int, held: dict[int, int]) -> float:
        """The most ``uid`` may hold unpersisted, given who else holds some (``held``)."""
        others = len(held) - (uid in held)
        return fair_share(self.memory_bytes_max, self.alone_fraction, others)

    def refusal(self, uid: int, nbytes: int, steps: Iterable[HeldStep]) -> str:
        """Why ``nbytes`` more for ``uid`` exceed its share ("" if they do not)."""
        held = self.unpersisted(steps)
        holding = held.get(uid, 0)
        share = self.share_bytes(uid, held)
        if not holding or holding + nbytes <= share:
            return ""
        return (f"uid {uid} holds {holding} bytes not yet persisted, its share of this agent is {int(share)}"
                f" ({len(held)} users hold some)")
