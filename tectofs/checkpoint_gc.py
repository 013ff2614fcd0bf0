"""Names of checkpoint directories' hidden entries, and the collection of what interrupted
saves leave behind (``tectofs gc``, ``tectofs.torch.gc_pending``); the directory attribute
that turns the plugin's compression on. No torch here: ``tectofs gc`` and ``tectofs
set-policy`` must not pay for importing it.

A save writes into a hidden pending directory ``.<name>.pending-<token>`` and renames it into
place; a replaced checkpoint is moved aside as ``.<name>.replaced-<token>`` before it is
deleted. A crash leaves either behind; ``gc_pending`` removes them once untouched for
``PENDING_GRACE_S``.
"""

from __future__ import annotations

import os
import time

from . import uri as _uri

METADATA_NAME = ".metadata"
PENDING_MARK = ".pending-"
REPLACED_MARK = ".replaced-"
# How long a pending directory must sit untouched before automatic and manual clean-up
# (the writer after each commit, gc_pending, `tectofs gc`) may delete it: far above any
# single file's write, since a running save touches its directory only as files complete.
# A failed save deletes its own at once; only crashed saves wait for this.
PENDING_GRACE_S = 24 * 3600.0
# On a directory: the PyTorch plugin's default for checkpoints below it ("zstd" or "off").
COMPRESS_XATTR = "user.tectofs.compress"


def pending_name(name: str, token: str) -> str:
    return f".{name}{PENDING_MARK}{token}"


def is_leftover(name: str) -> bool:
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
            if is_leftover(name):
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
