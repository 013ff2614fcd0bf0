"""Directory listings for the kernel, with every entry's attributes (READDIRPLUS).

The kernel reads a directory in requests of a few KiB, each from an offset: the position of
the last entry it received. ``OpenListings`` fetches the listing once per open directory
(and again at offset 0: rewinddir) and pages it from there; ``fill`` writes one request's
entries into libfuse's buffer. For a READDIRPLUS request every entry but "." and ".." carries
its attributes (while the listing is younger than ``attr_timeout_s``), which the kernel keeps
as a lookup's: ``ls -l``, ``du`` or ``find -size`` of the directory then ask the metadata
service nothing per file while they are fresh. An open directory keeps its listing (names
and attributes, about 0.5 KB per entry) until it is closed.

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
import time
from typing import Any, Callable

import mfusepy

from tectofs.client.core import Stat

READDIR_PLUS = 1         # FUSE_READDIR_PLUS: the kernel asks for attributes with the names
FILL_DIR_PLUS = 1 << 1   # FUSE_FILL_DIR_PLUS: this entry's attributes are complete

# An entry: its name and either its Stat or, for "." and "..", inode number and type only.
Entry = tuple[str, Stat | dict[str, int]]


class _Listing:
    """One open directory's listing as fetched, and when (seconds, monotonic)."""

    __slots__ = ("entries", "fetched_at")

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.fetched_at = time.monotonic()


class OpenListings:
    """The listing of each open directory handle: fetched at offset 0, or at the first
    request of a handle that was never read from offset 0 (a seek before reading), and paged
    from there until the handle is released. Pages whose listing is older than
    ``attributes_fresh_s`` go without attributes: the kernel would date them from its
    request, not from the fetch."""

    def __init__(self, attributes_fresh_s: float) -> None:
        self.attributes_fresh_s = attributes_fresh_s
        self._lock = threading.Lock()
        self._listings: dict[int, _Listing | None] = {}

    def opened(self, fh: int) -> None:
        with self._lock:
            self._listings[fh] = None

    def released(self, fh: int) -> None:
        with self._lock:
            self._listings.pop(fh, None)

    def page(self, fh: int, offset: int, fetch: Callable[[], list[Entry]]) -> tuple[list[Entry], bool]:
        """Handle ``fh``'s entries (from position ``offset`` on: ``entries[offset:]``, not
        copied), and whether their attributes are still fresh. ``fetch`` gives the listing
        when there is none to page from; a handle this mount did not open fetches every time."""
        with self._lock:
            known = self._listings.get(fh)
            tracked = fh in self._listings
        if offset == 0 or known is None:
            known = _Listing(fetch())
            if tracked:
                with self._lock:
                    if fh in self._listings:
                        self._listings[fh] = known
        return known.entries, time.monotonic() - known.fetched_at < self.attributes_fresh_s


def fill(filler: Any, buf: Any, entries: list[Entry], offset: int, plus: bool,
         attributes_of: Callable[[str, Stat | dict[str, int]], dict[str, Any]], encoding: str, errors: str) -> None:
    """Hand ``entries[offset:]`` to libfuse's ``filler`` until the kernel's buffer is full,
    each with its position (index + 1) as the offset the kernel resumes from, and with
    ``plus`` its full attributes (``attributes_of``; "." and ".." never)."""
    st = mfusepy.c_stat()
    for index in range(offset, len(entries)):
        name, entry = entries[index]
        ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
        mfusepy.set_st_attrs(st, attributes_of(name, entry), use_ns=True)
        flags = FILL_DIR_PLUS if plus and not isinstance(entry, dict) else 0
        if filler(buf, name.encode(encoding, errors), st, index + 1, flags) != 0:
            return  # the buffer is full: the kernel asks again from the last position it got
