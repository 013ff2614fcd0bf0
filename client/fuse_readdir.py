"""Directory listings for the kernel, with every entry's attributes (READDIRPLUS).

The kernel reads a directory in requests of a few KiB, each from an offset: the position of
the last entry it received. ``OpenListings`` fetches the listing once per open directory
(and again at offset 0: rewinddir) and pages it from there; ``fill`` writes one request's
entries into libfuse's buffer. For a READDIRPLUS request every entry but "." and ".." carries
its attributes, which the kernel keeps as a lookup's (``attr_timeout_s``): ``ls -l``, ``du``
or ``find -size`` of the directory ask the metadata service nothing per file while they are
fresh.

Why not mfusepy's readdir: it passes type and inode number only, and libfuse 3.14 drops the
attributes of a listing given whole at offset 0 (it sends inode 0, "ignore these"), so the
kernel would look every name up again. With offsets, libfuse counts a lookup for each entry
with attributes before knowing whether it fits the buffer; the kernel never sees the one
that does not fit and so never forgets it: libfuse keeps that name's node until unmount (one
per request at most, and one per name however often it is listed).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable

import mfusepy

from .core import Stat

READDIR_PLUS = 1         # FUSE_READDIR_PLUS: the kernel asks for attributes with the names
FILL_DIR_PLUS = 1 << 1   # FUSE_FILL_DIR_PLUS: this entry's attributes are complete

# An entry: its name and either its Stat or, for "." and "..", inode number and type only.
Entry = tuple[str, Stat | dict[str, int]]


class OpenListings:
    """The listing of each open directory handle, as fetched at its offset 0."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listings: dict[int, list[Entry]] = {}

    def opened(self, fh: int) -> None:
        with self._lock:
            self._listings[fh] = []

    def released(self, fh: int) -> None:
        with self._lock:
            self._listings.pop(fh, None)

    def entries_from(self, fh: int, offset: int, fetch: Callable[[], list[Entry]]) -> list[Entry]:
        """Handle ``fh``'s entries from position ``offset`` on. Offset 0 (opendir, rewinddir)
        fetches the listing with ``fetch`` and keeps it for the handle's later offsets; a
        handle not known here (not opened through this mount's opendir) fetches every time."""
        if offset == 0:
            entries = fetch()
            with self._lock:
                if fh in self._listings:
                    self._listings[fh] = entries
            return entries
        with self._lock:
            known = self._listings.get(fh)
        return (known if known is not None else fetch())[offset:]


def fill(filler: Any, buf: Any, entries: list[Entry], first_position: int, plus: bool,
         attributes_of: Callable[[str, Stat | dict[str, int]], dict[str, Any]], encoding: str, errors: str) -> None:
    """Hand ``entries`` to libfuse's ``filler`` until the kernel's buffer is full, each with its
    position (``first_position`` for the first) as the offset the kernel resumes from, and
    with ``plus`` its full attributes (``attributes_of``; "." and ".." never)."""
    st = mfusepy.c_stat()
    for position, (name, entry) in enumerate(entries, start=first_position):
        ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
        mfusepy.set_st_attrs(st, attributes_of(name, entry), use_ns=True)
        flags = FILL_DIR_PLUS if plus and not isinstance(entry, dict) else 0
        if filler(buf, name.encode(encoding, errors), st, position, flags) != 0:
            return  # the buffer is full: the kernel asks again from the last position it got
