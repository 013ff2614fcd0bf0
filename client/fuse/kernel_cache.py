"""What the kernel may cache, and for how long: the mount's one kernel cache policy.

Every reply that carries attributes goes through :meth:`KernelCache.timeouts` (the entry's
``st_ino`` says which inode), which decides its ``entry_timeout`` (how long the kernel may reuse the name without a lookup) and
``attr_timeout`` (how long it may reuse the attributes without a getattr).

With metadata leases (the default: ``client/lease_session.py``), both are what is left of the
lease, and a lookup that finds nothing is kept as a negative entry as long
(:meth:`KernelCache.absent`): what another client changes is recalled, and the recall drops it
from the kernel (:meth:`KernelCache.recalled`) before that change returns. A reply whose request
crossed a recall (the session's ``epoch`` moved since the request began:
:meth:`KernelCache.begin_request`) gets no time at all: it may predate the change. The entry
timeout stays 0 when the metadata service alone checks permissions (a path walk through a
cached name asks nobody).

The kernel keeps directory listings too while leases are held (:attr:`KernelCache.listings`,
``kernel_listings.py``): what drops them is said there.

Without leases (``tectofs mount --no-leases``, or while they are lost): both timeouts are
``attr_timeout_s`` (``--attr-timeout``, default 1 s) and absent names are not kept: a name
created on another mount is visible within that time.

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

import asyncio
import concurrent.futures
import contextvars
import logging
from collections import OrderedDict
from typing import Iterable

import pyfuse3

from tectofs.client.fuse import kernel_listings
from tectofs.client.fuse.kernel_listings import KernelListings
from tectofs.client.lease_session import LeaseSession
from tectofs.wire.leases import Recall

log = logging.getLogger("tectofs.fuse")

reported_attrs_max = 65_536  # inodes whose last reported (size, mtime) is remembered
negative_entries_max = 100_000  # absent names the kernel was told to keep (past it, no more are kept)
recall_kernel_wait_s = 0.1  # a recall waits this long for the kernel to drop what it names (see recalled)

# The lease epoch the request being served began at (set by every handler: state.handler).
_request_epoch: contextvars.ContextVar[int] = contextvars.ContextVar("tectofs_fuse_request_epoch", default=-1)


class KernelCache:
    """The kernel cache policy of one mount (see the module docstring)."""

    def __init__(self, attr_timeout_s: float, entry_timeout_s: float | None = None,
                 leases: LeaseSession | None = None) -> None:
        """``entry_timeout_s`` (default ``attr_timeout_s``): 0 when the metadata service alone
        checks permissions. ``leases``: the client's lease session (None: no leases)."""
        assert attr_timeout_s >= 0
        self.attr_timeout_s = attr_timeout_s
        self.entry_timeout_s = attr_timeout_s if entry_timeout_s is None else entry_timeout_s
        assert self.entry_timeout_s >= 0
        self.leases = leases
        self._reported: OrderedDict[int, tuple[int, float]] = OrderedDict()
        self._invalidations = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tectofs-recall")
        self._negative: dict[int, set[str]] = {}  # directory inode -> absent names the kernel keeps
        self._negative_count = 0
        self.listings = KernelListings(enabled=leases is not None and self.entry_timeout_s > 0)
        self._lease_end_watch: asyncio.TimerHandle | None = None

    def begin_request(self) -> None:
        """A request starts: note the lease epoch its replies are judged by."""
        if self.leases is not None:
            _request_epoch.set(self.leases.epoch)

    def request_epoch(self) -> int:
        """The lease epoch the request being served began at (for :meth:`listing_replied`)."""
        return _request_epoch.get()

    def leased_s(self) -> float:
        """For how long the kernel may keep what the request being served learned: the rest of
        the lease, or 0 (no lease, or a recall crossed the request)."""
        leases = self.leases
        if leases is None or not leases.still(_request_epoch.get()):
            return 0.0
        return leases.remaining()

    def timeouts(self, entry: pyfuse3.EntryAttributes, fresh: bool = True) -> pyfuse3.EntryAttributes:
        """``entry`` with the timeouts the kernel may cache it for; ``fresh=False``: attributes
        fetched a while ago (a listing paged later): the kernel must ask again before using them."""
        if not fresh:
            entry.attr_timeout = entry.entry_timeout = 0
            return entry
        if self.leases is not None:
            leased = self.leased_s()
            entry.attr_timeout = leased
            entry.entry_timeout = leased if self.entry_timeout_s > 0 else 0
            return entry
        entry.attr_timeout = self.attr_timeout_s
        entry.entry_timeout = self.entry_timeout_s
        return entry

    def absent(self, parent_inode: int, name: str) -> pyfuse3.EntryAttributes | None:
        """The reply to a lookup of ``name`` in ``parent_inode`` that found nothing: while a
        lease covers it, an entry with ``st_ino`` 0 that the kernel keeps as a negative entry for
        the rest of the lease; else None, an ENOENT error, which the kernel does not keep."""
        leased = self.leased_s() if self.caches_names else 0.0
        if leased <= 0 or self._negative_count >= negative_entries_max:
            return None
        names = self._negative.setdefault(parent_inode, set())
        if name not in names:
            names.add(name)
            self._negative_count += 1
        entry = pyfuse3.EntryAttributes()
        entry.st_ino = 0
        entry.entry_timeout = leased
        return entry

    def keep_listing(self, inode: int) -> bool:
        """An OPENDIR of ``inode`` is being answered: whether the kernel may keep the listing it
        reads through it (while a lease is held; an open that may not has the kernel drop what
        it kept: ``kernel_listings.py``). Called before the request's handler, not blocking."""
        kept, evicted = self.listings.opened(inode, self.leases is not None and self.leases.remaining() > 0)
        self._drop_listings(evicted)
        return kept

    def listing_replied(self, inode: int, epoch: int) -> None:
        """A page of ``inode``'s listing, fetched by a request begun at lease ``epoch``, is being
        replied, and the kernel may keep it (its handle may have been opened to keep). If a lease
        still covers it, the directory is tracked as kept (again: a recall or a lost lease since
        its OPENDIR may have untracked it), so the next recall of it drops it; if not, the kernel
        drops what it keeps of it once the reply went out."""
        if not self.listings.enabled:
            return
        if self.leases is not None and self.leases.still(epoch):
            self._drop_listings(self.listings.kept(inode))
            self._watch_lease_end()
        else:
            asyncio.get_running_loop().call_soon(self._drop_listings, [inode])

    def _watch_lease_end(self) -> None:
        """Drop every kept listing when the lease runs out unrenewed (a hung or cut-off metadata
        service sends no recall, and the loss of the leases is noticed only when a keepalive
        fails): no other request would drop them where the kernel opens directories by itself."""
        leases = self.leases
        if self._lease_end_watch is not None or leases is None:
            return
        loop = asyncio.get_running_loop()

        def check() -> None:
            self._lease_end_watch = None
            if not self.listings.tracking():
                return
            left = leases.remaining()
            if left > 0:
                self._lease_end_watch = loop.call_later(left, check)
            else:
                self._drop_listings(self.listings.recalled(None))

        self._lease_end_watch = loop.call_later(leases.remaining(), check)

    def _drop_listings(self, directories: list[int]) -> None:
        """Have the kernel drop its listings of ``directories``, on the notification thread."""
        if directories:
            self._invalidations.submit(kernel_listings.drop, directories)

    @property
    def caches_names(self) -> bool:
        """Whether the kernel keeps names at all (else every path walk asks the mount)."""
        return self.entry_timeout_s > 0

    async def recalled(self, recall: Recall | None, known: Iterable[tuple[int, str]], inodes: Iterable[int]) -> None:
        """Have the kernel drop what ``recall`` names (None: everything): names, absent names it
        was told to keep, and for a recalled listing every name of that directory it may hold
        (``known``: the names of inodes it holds, as (parent inode, name)) and the listing
        itself if it kept it; the attributes of recalled inodes (``inodes``: all of them, for None). Waits until the kernel did, or
        ``recall_kernel_wait_s``: dropping a name needs its directory's lock, which a request of
        this mount may hold while it waits on another mount's recall (two mounts creating in
        one directory): past the wait, the recall is acknowledged and the kernel drops the name
        once that request ends."""
        if recall is None:
            entries = [*known, *((d, n) for d, names in self._negative.items() for n in names)]
            inos = list(inodes)
            self._negative.clear()
            self._negative_count = 0
        else:
            listed = set(recall.listings)
            entries = [(e.parent, e.name) for e in recall.entries]
            entries += [(d, n) for d, n in known if d in listed]
            for parent, name in entries:
                self._forget_negative(parent, name)
            for directory in listed:
                names = self._negative.pop(directory, set())
                self._negative_count -= len(names)
                entries += [(directory, n) for n in names]
            inos = [*recall.inos, *recall.listings]
        directories = self.listings.recalled(recall)
        if not entries and not inos and not directories:
            return
        done = asyncio.get_running_loop().run_in_executor(self._invalidations, _invalidate, entries, inos, directories)
        try:
            await asyncio.wait_for(asyncio.shield(done), recall_kernel_wait_s)
        except asyncio.TimeoutError:
            log.debug("the kernel had not dropped %d names and %d inodes after %g s; acknowledging the recall",
                      len(entries), len(inos), recall_kernel_wait_s)

    def _forget_negative(self, parent: int, name: str) -> None:
        names = self._negative.get(parent)
        if names is not None and name in names:
            names.discard(name)
            self._negative_count -= 1

    def became_present(self, parent: int, name: str) -> None:
        """This mount made ``name`` in ``parent`` (the kernel replaced its absent entry)."""
        self._forget_negative(parent, name)

    def close(self) -> None:
        if self._lease_end_watch is not None:
            self._lease_end_watch.cancel()
        self._invalidations.shutdown(wait=False, cancel_futures=True)

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


def _invalidate(entries: list[tuple[int, str]], inodes: list[int], directories: list[int]) -> None:
    """On the recall thread: the kernel drops ``entries``, the attributes of ``inodes`` and
    the listings of ``directories`` (which it may not hold: ENOENT is fine)."""
    for parent, name in entries:
        try:
            pyfuse3.invalidate_entry(parent, name.encode("utf-8", "surrogateescape"))
        except Exception:  # ENOENT: not held; after unmount: nothing to drop
            pass
    for inode in inodes:
        try:
            pyfuse3.invalidate_inode(inode, attr_only=True)
        except Exception:
            pass
    kernel_listings.drop(directories)
