"""Checkpoint housekeeping (latest; gc of pending leftovers is ``tectofs.checkpoint_gc``) and
single-file save/load."""

from __future__ import annotations

import io
import os
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, overload

import torch

from .. import uri as _uri
from ..agent.client import agents
from ..checkpoint_gc import METADATA_NAME, pending_name

if TYPE_CHECKING:
    from ..client import Stat

_STEP = re.compile(r"(\d+)$")


def _step(name: str) -> int | None:
    m = _STEP.search(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint and the tiers holding it: ``"memory"`` (a sealed copy in this host's
    memory agent), ``"peer"`` (in another agent), ``"storage"`` (committed to the cluster)."""

    uri: str
    tiers: frozenset[str]


@overload
def checkpoints(uri: str | os.PathLike, *, tiers: Literal[False] = False, agent: str | None = None) -> list[str]: ...
@overload
def checkpoints(uri: str | os.PathLike, *, tiers: Literal[True], agent: str | None = None) -> list[CheckpointInfo]: ...
def checkpoints(uri: str | os.PathLike, *, tiers: bool = False, agent: str | None = None) -> list[str] | list[CheckpointInfo]:
    """Visible checkpoint candidates under ``uri``, oldest first (see :func:`latest` for the
    order). Candidates are directories not starting with ``.``; completeness is not checked.
    ``tiers=True``: :class:`CheckpointInfo` of each instead, the steps sealed in the memory
    agents (``agent``, default ``$TECTOFS_AGENT``: this host's first, then peers) included."""
    if tiers:
        return _tiered(uri, agents(agent))
    fs, loc = _uri.resolve(uri)
    try:
        entries = fs.scandir(loc.path)
    except FileNotFoundError:
        return []
    return [loc.child(n).uri() for n in ordered_names(entries)]


def _tiered(uri: str | os.PathLike, agent_list: list[str]) -> list[CheckpointInfo]:
    """Every checkpoint under ``uri`` in storage or in the agents, with the tiers holding it."""
    from ..agent.client import lookup_client

    held: dict[str, set[str]] = {}
    for candidate in checkpoints(uri):
        held.setdefault(candidate, set()).add("storage")
    prefix = _uri.parse(uri).uri().rstrip("/") + "/"
    client = lookup_client(prefix)
    candidates = list(agent_list) if client is not None else []
    for position, agent in enumerate(candidates):
        assert client is not None
        listing = client.listing(agent, prefix)
        if listing is None:
            continue
        if position == 0:
            candidates.extend(p for p in listing.peers if p not in candidates)
        for step in listing.steps:
            if "/" not in step.step[len(prefix):]:
                held.setdefault(step.step, set()).add("memory" if position == 0 else "peer")
    names = list(held)
    numbers = [_step(name.rsplit("/", 1)[-1]) for name in names]
    if all(n is not None for n in numbers):  # else: storage's order (by mtime), then the memory-only steps
        names = [name for _, name in sorted(zip(numbers, names), key=lambda x: (x[0], x[1]))]
    return [CheckpointInfo(name, frozenset(held[name])) for name in names]


def ordered_names(entries: list[tuple[str, Stat]]) -> list[str]:
    """The candidate checkpoints of a directory listing (``scandir``), oldest first: the
    visible directories, by step number when every name has one, else by mtime."""
    dirs = [(name, st) for name, st in entries if st.kind == "dir" and not name.startswith(".")]
    steps = [_step(name) for name, _ in dirs]
    if dirs and all(s is not None for s in steps):
        ordered = sorted(zip(steps, dirs), key=lambda x: (x[0], x[1][1].mtime, x[1][0]))
        return [d[0] for _, d in ordered]
    return [name for name, _ in sorted(dirs, key=lambda d: (d[1].mtime, d[0]))]


@overload
def latest(uri: str | os.PathLike, *, tiers: Literal[False] = False, agent: str | None = None) -> str | None: ...
@overload
def latest(uri: str | os.PathLike, *, tiers: Literal[True], agent: str | None = None) -> CheckpointInfo | None: ...
def latest(uri: str | os.PathLike, *, tiers: bool = False, agent: str | None = None) -> str | CheckpointInfo | None:
    """The newest complete checkpoint directly under ``uri`` (e.g. ``tectofs://h:p/run``),
    as a ``tectofs://`` id usable with ``dcp.load``; None if there is none.

    Newest means the largest numeric suffix when every candidate name has one
    (``step_9`` < ``step_10``), otherwise the latest mtime. A checkpoint is complete when it
    is a directory, not hidden (not starting with ``.``), holding a ``.metadata`` file;
    since the writer only ever renames finished checkpoints into view, the listing is one
    ``scandir`` and the check is usually one more call for the winner.

    With memory agents (``agent``, default ``$TECTOFS_AGENT``) a step sealed in one of them
    counts too (it is complete: a load finds it); ``tiers=True`` returns its
    :class:`CheckpointInfo` (which tiers hold it) instead of its id."""
    agent_list = agents(agent)
    if not agent_list and not tiers:
        fs, _ = _uri.resolve(uri)
        for candidate in reversed(checkpoints(uri)):
            if fs.exists(_uri.parse(candidate).path + "/" + METADATA_NAME):
                return candidate
        return None
    fs, _ = _uri.resolve(uri)
    for info in reversed(_tiered(uri, agent_list)):
        if info.tiers - {"storage"} or fs.exists(_uri.parse(info.uri).path + "/" + METADATA_NAME):
            return info if tiers else info.uri
    return None


def save(obj: Any, uri: str | os.PathLike, **kwargs: Any) -> None:
    """``torch.save(obj, ...)`` to a single tectofs file, atomically: the bytes are streamed
    to a hidden ``.<name>.pending-<token>`` sibling and renamed over ``uri`` when complete,
    so readers see the old file or the new one, never a partial one."""
    fs, loc = _uri.resolve(uri)
    if not loc.name:
        raise IsADirectoryError(f"cannot save to the root directory: {uri}")
    fs.mkdir(loc.parent, parents=True, exist_ok=True)
    tmp = loc.parent.rstrip("/") + "/" + pending_name(loc.name, uuid.uuid4().hex[:16])
    try:
        with fs.open(tmp, "wb") as f:
            torch.save(obj, f, **kwargs)
        fs.rename(tmp, loc.path)
    except BaseException:
        try:
            fs.remove(tmp)
        except Exception:
            pass
        raise


def load(uri: str | os.PathLike, **kwargs: Any) -> Any:
    """``torch.load`` of a single tectofs file (read whole, in parallel, then decoded);
    keyword arguments go to ``torch.load`` (``map_location``, ``weights_only``...)."""
    fs, loc = _uri.resolve(uri)
    blob = fs.read_bytes(loc.path)
    return torch.load(io.BytesIO(blob), **kwargs)
