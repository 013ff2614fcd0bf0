"""Which directory listings the kernel keeps, and when it must drop one.

With metadata leases, the kernel keeps the listings it reads: where it opens directories by
itself (``kernel_opendir.py``, the default), every one; else those whose OPENDIR's reply asks it
to (``opendir_reply.install``). A second ``ls`` or ``os.scandir`` of a directory then reaches the
mount not at all (or only for OPENDIR, and RELEASEDIR, which nobody waits for). The kernel serves
a kept listing until one of these drops it, so it never serves one older than a change whose
call returned:

- *this mount's own change* in the directory: the kernel counts them (its ``i_version``) and
  reads the listing again after one;
- *an OPENDIR answered without a lease held* (where the mount opens directories): its reply
  does not ask to keep, and an open that does not has the kernel drop its copy
  (``fuse_dir_open``);
- *a recall of the listing* by another client's change (or the loss of the leases: every
  listing): :meth:`KernelListings.recalled` says which directories go, and the mount drops
  them before it acknowledges the recall (``KernelCache.recalled``);
- *the end of the lease* with no renewal (a hung or cut-off metadata service, which sends no
  recall): every listing (``KernelCache._watch_lease_end``);
- *a reply that no lease covers* (the listing was fetched before a recall or a lost lease that
  came since, or with no lease): the mount drops what it added, right after the reply
  (``KernelCache.listing_replied``); a reply a lease covers tracks its directory as kept (again,
  if a recall came between its OPENDIR and it).

To drop a directory's listing (:func:`drop`), the mount first invalidates a name no directory
can hold there, which waits for the directory's lock: a ``getdents`` adds a reply's entries to
the kernel's copy under that lock after the mount has replied, so the one in progress ends
first; then it invalidates the directory's pages, which hold the copy.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

import pyfuse3

from tectofs.wire.leases import Recall

kept_listings_max = 65_536  # directories whose kept listing is tracked (past it, the oldest is dropped)

_NO_SUCH_NAME = b"/"  # no directory holds it: invalidating it only waits for the directory's lock


class KernelListings:
    """The directories whose listing this mount let the kernel keep, oldest first."""

    def __init__(self, enabled: bool) -> None:
        """``enabled``: the mount holds leases and the kernel keeps names (see the module docstring)."""
        self.enabled = enabled
        self._kept: OrderedDict[int, None] = OrderedDict()

    def opened(self, inode: int, leased: bool) -> tuple[bool, list[int]]:
        """An OPENDIR of ``inode`` is being answered, with a lease held or not (``leased``):
        whether its reply asks the kernel to keep the listing, and the directories the kernel
        must now drop (tracked no more: past ``kept_listings_max``)."""
        if not (self.enabled and leased):
            self._kept.pop(inode, None)  # the open does not keep: the kernel drops its copy
            return False, []
        return True, self.kept(inode)

    def kept(self, inode: int) -> list[int]:
        """The kernel may keep ``inode``'s listing (an open asked to, or a page of it leased went
        to the kernel): a recall of it drops it. Returns the directories the kernel must now
        drop (tracked no more: past ``kept_listings_max``)."""
        self._kept[inode] = None
        self._kept.move_to_end(inode)
        evicted = []
        while len(self._kept) > kept_listings_max:
            evicted.append(self._kept.popitem(last=False)[0])
        return evicted

    def recalled(self, recall: Recall | None) -> list[int]:
        """The directories whose kept listing ``recall`` ends (None: the leases were lost: all)."""
        if recall is None:
            gone = list(self._kept)
            self._kept.clear()
            return gone
        gone = [d for d in recall.listings if d in self._kept]
        for directory in gone:
            del self._kept[directory]
        return gone

    def tracking(self) -> bool:
        """Whether any directory is tracked as one whose listing the kernel may keep."""
        return bool(self._kept)

    def may_hold(self, inode: int) -> bool:
        """Whether ``inode``'s listing is tracked as one the kernel may keep."""
        return inode in self._kept


def drop(directories: Iterable[int]) -> None:
    """Have the kernel drop its listings of ``directories`` (from the notification thread: see
    the module docstring; a directory it does not hold is fine)."""
    for directory in directories:
        try:
            pyfuse3.invalidate_entry(directory, _NO_SUCH_NAME)
        except Exception:  # ENOENT, as expected once the lock was had; after unmount: nothing to drop
            pass
        try:
            pyfuse3.invalidate_inode(directory, attr_only=False)
        except Exception:  # ENOENT: the kernel holds no such inode
            pass
