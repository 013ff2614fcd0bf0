"""What the kernel may cache, and for how long: the mount's one kernel cache policy.

Every reply that carries attributes goes through :meth:`KernelCache.timeouts` (the entry's
``st_ino`` says which inode), which decides its ``entry_timeout`` (how long the kernel may reuse the name without a lookup) and
``attr_timeout`` (how long it may reuse the attributes without a getattr). Today's policy:
both ``attr_timeout_s`` (``tectofs mount --attr-timeout``, default 1 s), the entry timeout 0
when the metadata service alone checks permissions (a path walk through a cached name asks
nobody), and no negative caching (a lookup that finds nothing is an error reply, which the
kernel does not keep, :meth:`KernelCache.absent`: a name created on another mount is visible
at once).

:meth:`invalidate_entry` and :meth:`invalidate_inode` tell the kernel to drop a name or an
inode's attributes before their timeouts: the hooks lease recalls will drive (a lease held
lets the timeouts grow). Both are safe to call from a request handler: the entry is dropped
from pyfuse3's notification thread (the kernel may hold the directory's lock while the
handler runs), the attributes at once (the kernel takes no lock for that).

Close-to-open: :meth:`reported` records the size and mtime each inode's attributes last went
to the kernel with; :meth:`changed_since_reported` tells an open that another client's commit
made them stale (the open then invalidates them, so reads see the new size).
"""

from __future__ import annotations

import logging
from collections import OrderedDict

import pyfuse3

log = logging.getLogger("tectofs.fuse")

reported_attrs_max = 65_536  # inodes whose last reported (size, mtime) is remembered


class KernelCache:
    """The kernel cache policy of one mount (see the module docstring)."""

    def __init__(self, attr_timeout_s: float, entry_timeout_s: float | None = None) -> None:
        """``entry_timeout_s`` (default ``attr_timeout_s``): 0 when the metadata service alone
        checks permissions."""
        assert attr_timeout_s >= 0
        self.attr_timeout_s = attr_timeout_s
        self.entry_timeout_s = attr_timeout_s if entry_timeout_s is None else entry_timeout_s
        assert self.entry_timeout_s >= 0
        self._reported: OrderedDict[int, tuple[int, float]] = OrderedDict()

    def timeouts(self, entry: pyfuse3.EntryAttributes, fresh: bool = True) -> pyfuse3.EntryAttributes:
        """``entry`` with the timeouts the kernel may cache it for; ``fresh=False``: attributes
        fetched a while ago (a listing paged later): the kernel must ask again before using them."""
        entry.attr_timeout = self.attr_timeout_s if fresh else 0
        entry.entry_timeout = self.entry_timeout_s if fresh else 0
        return entry

    def absent(self, parent_inode: int, name: str) -> pyfuse3.EntryAttributes | None:
        """The reply to a lookup of ``name`` in ``parent_inode`` that found nothing: None, an
        ENOENT error, which the kernel does not keep (today's policy: no negative caching); a
        policy that knows the name stays absent (a directory lease held) returns an entry with
        ``st_ino`` 0 and an ``entry_timeout``, which the kernel keeps as a negative entry."""
        return None

    @property
    def caches_names(self) -> bool:
        """Whether the kernel keeps names at all (else every path walk asks the mount)."""
        return self.entry_timeout_s > 0

    def invalidate_entry(self, parent_inode: int, name: str) -> None:
        """Have the kernel forget ``name`` in ``parent_inode`` (it looks the name up again)."""
        try:
            pyfuse3.invalidate_entry_async(parent_inode, name.encode("utf-8", "surrogateescape"), ignore_enoent=True)
        except Exception as exc:  # best effort: the entry expires after entry_timeout_s anyway
            log.debug("could not invalidate entry %r of inode %d: %s", name, parent_inode, exc)

    def invalidate_inode(self, inode: int) -> None:
        """Have the kernel forget ``inode``'s attributes (its next stat or read asks again)."""
        try:
            pyfuse3.invalidate_inode(inode, attr_only=True)
        except OSError as exc:  # ENOENT: the kernel does not hold the inode; else best effort
            log.debug("could not invalidate the attributes of inode %d: %s", inode, exc)

    def reported(self, inode: int, size: int, mtime: float) -> None:
        """``inode``'s attributes went to the kernel with this committed size and mtime."""
        self._reported[inode] = (size, mtime)
        self._reported.move_to_end(inode)
        while len(self._reported) > reported_attrs_max:
            self._reported.popitem(last=False)

    def changed_since_reported(self, inode: int, size: int, mtime: float) -> bool:
        """Whether ``inode`` committed with ``size`` and ``mtime`` differs from what the kernel
        was last told (False if it was told nothing this mount remembers)."""
        reported = self._reported.get(inode)
        return reported is not None and reported != (size, mtime)
