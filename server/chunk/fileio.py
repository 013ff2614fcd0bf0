"""Whole writes and directory syncs, for chunk files and packed segments."""

from __future__ import annotations

import os
from typing import Any


def write_all(fd: int, buffers: list[Any], offset: int | None = None) -> None:
    """Write every byte of ``buffers`` in order: at the file position, or from ``offset``
    (``pwritev``). Retries short writes."""
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        n = os.writev(fd, views) if offset is None else os.pwritev(fd, views, offset)
        if offset is not None:
            offset += n
        while n and views:
            if n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


def fsync_dir(path: str) -> None:
    """Make the entries of directory ``path`` (creates, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
