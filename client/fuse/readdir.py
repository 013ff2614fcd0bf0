"""Directory listings for the kernel, with every entry's attributes (READDIRPLUS).

The kernel reads a directory in requests of a few KiB, each from an offset: the position of
the last entry it received. ``OpenListings`` fetches the listing once per open directory
(and again at offset 0: rewinddir) and pages it from there (a directory the kernel opened by
itself, with no handle of the mount's: from a read at offset 0 to the read past its last
entry); :func:`fill` hands one request's
entries to ``pyfuse3.readdir_reply``. pyfuse3 answers every listing request as READDIRPLUS:
every entry but "." and ".." carries its attributes, which the kernel keeps as a lookup's
(``ls -l``, ``du`` or ``find -size`` ask the metadata service nothing per file while they are
fresh), and counts one lookup of it (``InodeTable.looked_up``). Pages of a listing older than
``attr_timeout_s`` go with timeouts of 0: the kernel would date them from its request, not
from the fetch. An open directory keeps its listing (names and attributes, about 0.5 KB per
entry) until it is closed.

A directory its reader may read but not search (``r--`` for them) lists names only: the
metadata service tells each entry's inode number and type and nothing else, and no handle
(``tectofs.store.access.names_only``). Those entries go to the kernel as plain directory
entries (:func:`names_only_entry`: node id 0, which the kernel takes as "no attributes for
this one"), so it makes no dentry of them: ``ls`` shows the names, and a ``stat`` or ``open``
of one is a lookup, which the service refuses (EACCES), as on a local disk.
"""

from __future__ import annotations

import ctypes
import logging
import os
import stat as statmod
import time
from collections import OrderedDict
from typing import Awaitable, Callable

import pyfuse3

from tectofs.client.core import Stat

log = logging.getLogger("tectofs.fuse")

# An entry: its name and either its Stat or, for "." and "..", its inode number.
Entry = tuple[str, Stat | int]

# Where pyfuse3's EntryAttributes keeps the node id its READDIRPLUS entry gives the kernel:
# ``fuse_entry_param.ino``, the first field after the object's header. Its ``st_ino`` setter
# writes it and the entry's ``d_ino`` alike; a names-only entry needs the inode number as
# ``d_ino`` (glibc before 2.37 skips entries whose ``d_ino`` is 0) and 0 as the node id.
_NODE_ID_OFFSET = object.__basicsize__


def _node_id_field(attributes: pyfuse3.EntryAttributes) -> ctypes.c_uint64:
    return ctypes.c_uint64.from_address(id(attributes) + _NODE_ID_OFFSET)


def _node_id_found() -> bool:
    """Whether ``_NODE_ID_OFFSET`` holds the node id in this pyfuse3 (checked once, through its
    getter: the node id is what ``st_ino`` reads back)."""
    probe = pyfuse3.EntryAttributes()
    probe.st_ino = 0x5EA2C4ED00D
    if _node_id_field(probe).value != 0x5EA2C4ED00D:
        return False
    _node_id_field(probe).value = 0
    return probe.st_ino == 0


_NODE_ID_WRITABLE = _node_id_found()
if not _NODE_ID_WRITABLE:
    log.warning("pyfuse3's entry layout is not the one expected: names-only listings go with inode number 0")


def is_names_only(stat: Stat) -> bool:
    """``stat`` is a names-only entry (``tectofs.store.access.is_names_only``: no link count)."""
    return stat.nlink == 0


def names_only_entry(stat: Stat) -> pyfuse3.EntryAttributes:
    """A plain directory entry for the kernel: ``d_ino`` and ``d_type`` of ``stat``, node id 0
    (no dentry, no lookup counted: a later ``stat`` asks the mount, which asks the service)."""
    attributes = pyfuse3.EntryAttributes()
    attributes.st_mode = statmod.S_IFMT(stat.mode)
    attributes.entry_timeout = attributes.attr_timeout = 0
    if _NODE_ID_WRITABLE:
        attributes.st_ino = stat.ino
        _node_id_field(attributes).value = 0
    return attributes


class _Listing:
    """One open directory's listing as fetched, and when (seconds, monotonic)."""

    __slots__ = ("entries", "fetched_at", "epoch", "unread")

    def __init__(self, entries: list[Entry], epoch: int, unread: bool = False) -> None:
        self.entries = entries
        self.fetched_at = time.monotonic()
        self.epoch = epoch  # the lease epoch the request that fetched it began at
        self.unread = unread  # fetched by the open: its first read from offset 0 pages it


class OpenListings:
    """The listing of each open directory handle: fetched at offset 0, or at the first
    request of a handle that was never read from offset 0 (a seek before reading), and paged
    from there until the handle is released."""

    def __init__(self, attributes_fresh_s: float, kernel_opened_max: int = 64,
                 kernel_opened_entries_max: int = 200_000) -> None:
        """``kernel_opened_max``, ``kernel_opened_entries_max``: listings of kernel-opened
        directories kept at once, and their entries in all (past either, the listings read least
        recently go, never the one being read: a reader that stopped halfway never says so)."""
        self.attributes_fresh_s = attributes_fresh_s
        self.kernel_opened_max = kernel_opened_max
        self.kernel_opened_entries_max = kernel_opened_entries_max
        self._listings: dict[int, _Listing | None] = {}
        self._kernel_opened: OrderedDict[int, None] = OrderedDict()

    def opened(self, fh: int, listing: list[Entry] | None = None, epoch: int = -1) -> None:
        """Directory handle ``fh`` was opened; ``listing``: fetched by the open itself (where
        only the metadata service checks permissions, the open must: a read of the listing
        as the opener does) at lease ``epoch``, paged by the handle's first read from offset 0."""
        self._listings[fh] = None if listing is None else _Listing(listing, epoch, unread=True)

    def released(self, fh: int) -> None:
        """Handle ``fh`` was released, or a kernel-opened directory's listing was read to its end."""
        self._listings.pop(fh, None)
        self._kernel_opened.pop(fh, None)

    def kernel_opened(self, fh: int) -> None:
        """``fh`` stands for a directory the kernel opened by itself (no OPENDIR nor RELEASEDIR):
        its listing is kept from its first read on, as a handle's, until a read past its end
        (:meth:`page`)."""
        if fh not in self._listings:
            self._listings[fh] = None
        self._kernel_opened[fh] = None
        self._kernel_opened.move_to_end(fh)
        while len(self._kernel_opened) > self.kernel_opened_max:
            self.released(next(iter(self._kernel_opened)))

    def _bound_kernel_opened(self, reading: int) -> None:
        """Let the listings of kernel-opened directories read least recently go, other than
        ``reading``'s, while those kept hold more than ``kernel_opened_entries_max`` entries."""
        kept = [(fh, self._listings.get(fh)) for fh in self._kernel_opened]
        total = sum(len(listing.entries) for _, listing in kept if listing is not None)
        for fh, listing in kept:
            if total <= self.kernel_opened_entries_max:
                return
            if fh != reading and listing is not None:
                total -= len(listing.entries)
                self.released(fh)

    async def page(self, fh: int, offset: int, fetch: Callable[[], Awaitable[list[Entry]]],
                   epoch: int = -1) -> tuple[list[Entry], bool, int]:
        """Handle ``fh``'s entries (from position ``offset`` on: ``entries[offset:]``, not
        copied), whether their attributes are still fresh, and the lease epoch they were
        fetched at. ``fetch`` gives the listing when there is none to page from (this request
        began at lease ``epoch``); a handle this mount did not open fetches every time. A
        kernel-opened directory's read past its last entry (the kernel's look for the end) is
        answered from its listing, which then goes."""
        known = self._listings.get(fh)
        if known is not None and known.unread:
            known.unread = False
        elif offset == 0 or known is None:
            known = _Listing(await fetch(), epoch)
            if fh in self._listings:
                self._listings[fh] = known
                self._bound_kernel_opened(fh)
        if offset >= len(known.entries) and fh in self._kernel_opened:
            self.released(fh)
        return known.entries, time.monotonic() - known.fetched_at < self.attributes_fresh_s, known.epoch


def fill(token: pyfuse3.ReaddirToken, entries: list[Entry], offset: int,
         attributes_of: Callable[[Stat, bool], pyfuse3.EntryAttributes], directory_of: Callable[[int], pyfuse3.EntryAttributes],
         fresh: bool, delivered: Callable[[str, Stat], None]) -> None:
    """Hand ``entries[offset:]`` to the kernel until its buffer is full, each with its
    position (index + 1) as the offset the kernel resumes from and its attributes
    (``attributes_of(stat, fresh)``; "." and ".." ``directory_of(ino)``; a names-only entry
    :func:`names_only_entry`); ``delivered`` is told of every entry the kernel took with its
    attributes (one lookup each; "." and "..", names-only entries none)."""
    for index in range(offset, len(entries)):
        name, entry = entries[index]
        raw = os.fsencode(name)
        if isinstance(entry, int):
            if not pyfuse3.readdir_reply(token, raw, directory_of(entry), index + 1):
                return
            continue
        if not entry.nlink:  # names only (is_names_only)
            if not pyfuse3.readdir_reply(token, raw, names_only_entry(entry), index + 1):
                return
            continue
        if not pyfuse3.readdir_reply(token, raw, attributes_of(entry, fresh), index + 1):
            return  # the buffer is full: the kernel asks again from the last position it got
        delivered(name, entry)
