"""Checkpoint housekeeping (latest, gc of pending leftovers) and single-file save/load."""

from __future__ import annotations

import io
import os
import re
import time
import uuid
from typing import Any

import torch

from . import _uri
from ._dcp import METADATA_NAME, PENDING_GRACE_S, PENDING_MARK, REPLACED_MARK, pending_name

_STEP = re.compile(r"(\d+)$")


def _step(name: str) -> int | None:
    m = _STEP.search(name)
    return int(m.group(1)) if m else None


def checkpoints(uri: str | os.PathLike) -> list[str]:
    """Visible checkpoint candidates under ``uri``, oldest first (see :func:`latest` for the
    order). Candidates are directories not starting with ``.``; completeness is not checked."""
    fs, loc = _uri.resolve(uri)
    try:
        entries = fs.scandir(loc.path)
    except FileNotFoundError:
        return []
    dirs = [(name, st) for name, st in entries if st.kind == "dir" and not name.startswith(".")]
    steps = [_step(name) for name, _ in dirs]
    if dirs and all(s is not None for s in steps):
        ordered = sorted(zip(steps, dirs), key=lambda x: (x[0], x[1][1].mtime, x[1][0]))
        names = [d[0] for _, d in ordered]
    else:
        names = [name for name, _ in sorted(dirs, key=lambda d: (d[1].mtime, d[0]))]
    return [loc.child(n).uri() for n in names]


def latest(uri: str | os.PathLike) -> str | None:
    """The newest complete checkpoint directly under ``uri`` (e.g. ``tectofs://h:p/run``),
    as a ``tectofs://`` id usable with ``dcp.load``; None if there is none.

    Newest means the largest numeric suffix when every candidate name has one
    (``step_9`` < ``step_10``), otherwise the latest mtime. A checkpoint is complete when it
    is a directory, not hidden (not starting with ``.``), holding a ``.metadata`` file;
    since the writer only ever renames finished checkpoints into view, the listing is one
    ``scandir`` and the check is usually one more call for the winner."""
    fs, _ = _uri.resolve(uri)
    for candidate in reversed(checkpoints(uri)):
        if fs.exists(_uri.parse(candidate).path + "/" + METADATA_NAME):
            return candidate
    return None


def _is_leftover(name: str) -> bool:
    return name.startswith(".") and (PENDING_MARK in name or REPLACED_MARK in name)


def gc_pending(
    uri: str | os.PathLike,
    older_than_s: float = PENDING_GRACE_S,
    *,
    recursive: bool = False,
    dry_run: bool = False,
    now: float | None = None,
) -> list[str]:
    """Delete leftovers of interrupted saves under ``uri``: hidden ``.<name>.pending-<token>``
    (and ``.<name>.replaced-<token>``) entries whose newest mtime (the entry's own or any
    direct child's) is more than ``older_than_s`` seconds old. A save that is still running
    keeps touching its pending directory; pick ``older_than_s`` well above the longest
    single file write. Returns the ids deleted (or that would be, with ``dry_run``).
    ``recursive`` also descends into visible subdirectories (not into checkpoints)."""
    fs, loc = _uri.resolve(uri)
    now = time.time() if now is None else now
    removed: list[str] = []

    def visit(path: str, top: bool) -> None:
        try:
            entries = fs.scandir(path)
        except FileNotFoundError:
            return
        if not top and any(n == METADATA_NAME for n, _ in entries):
            return  # a checkpoint: nothing of ours inside
        for name, st in entries:
            child = path.rstrip("/") + "/" + name
            if _is_leftover(name):
                newest = st.mtime
                if st.kind == "dir":
                    try:
                        newest = max([newest] + [s.mtime for _, s in fs.scandir(child)])
                    except FileNotFoundError:
                        continue
                if now - newest < older_than_s:
                    continue
                if not dry_run:
                    try:
                        if st.kind == "dir":
                            fs.rmtree(child)
                        else:
                            fs.remove(child)
                    except FileNotFoundError:
                        continue
                removed.append(loc.uri(child))
            elif recursive and st.kind == "dir" and not name.startswith("."):
                visit(child, False)

    visit(loc.path, True)
    return removed


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
