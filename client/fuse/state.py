"""What every request handler of the mount shares (:class:`MountState`), and how a handler's
failures reach the kernel (:func:`handler`).

Handlers are coroutines on the one event loop pyfuse3 reads ``/dev/fuse`` on, and call the
async client (:class:`AsyncFileSystem`, :class:`AsyncFile`) directly: no thread and no hand-off
per request. Every tectofs error leaves as its one ``errno``; anything unexpected is logged
and answered EIO (pyfuse3 allows a handler no exception but ``FUSEError``).
"""

from __future__ import annotations

import errno
import functools
import logging
from typing import Any, Awaitable, Callable, TypeVar

import msgspec
import pyfuse3

from tectofs.client.core import AsyncFileSystem, Stat
from tectofs.client.fuse.attributes import entry_attributes
from tectofs.client.fuse.fresh import FreshAttributes
from tectofs.client.fuse.handles import OpenFile, OpenFiles
from tectofs.client.fuse.inodes import InodeTable
from tectofs.client.fuse.kernel_cache import KernelCache
from tectofs.client.fuse.listings import KnownListings
from tectofs.client.fuse.page_cache import PageCacheVersions
from tectofs.client.fuse.readdir import OpenListings
from tectofs.client.fuse.users import Caller, Callers, Identity, on_view
from tectofs.errors import NotFound, PermissionDenied, StaleFile, TectofsError
from tectofs.wire import messages
from tectofs.wire.leases import Recall

log = logging.getLogger("tectofs.fuse")

T = TypeVar("T")
H = TypeVar("H", bound=Callable[..., Awaitable[Any]])


class MountState:
    """The client, the inode table, open files and directories, the kernel cache policy and
    what the mount remembers between requests (``FreshAttributes``, ``KnownListings``)."""

    def __init__(self, fs: AsyncFileSystem, mountpoint: str, cache: KernelCache, callers: Callers | None = None,
                 negative_cache_s: float = 0.0) -> None:
        self.fs = fs
        self.mountpoint = mountpoint
        self.cache = cache
        self.callers = callers or Callers()
        self.inodes = InodeTable()
        self.files = OpenFiles()
        self.page_cache = PageCacheVersions()  # which version of a file the kernel's pages hold
        self.open_listings = OpenListings(attributes_fresh_s=cache.attr_timeout_s)
        self.fresh = FreshAttributes(cache.attr_timeout_s)
        # With leases, absent names are answered by the client's cache, coherently: the
        # mount's own guess (KnownListings, --negative-entry-cache) is for mounts without.
        self.listings = KnownListings(negative_cache_s if cache.caches_names and cache.leases is None else 0.0)
        if cache.leases is not None:
            cache.leases.listeners.append(self.recalled)

    def stop_recalls(self) -> None:
        """At unmount: recalls need the kernel no more."""
        if self.cache.leases is not None and self.recalled in self.cache.leases.listeners:
            self.cache.leases.listeners.remove(self.recalled)
        self.cache.close()

    async def recalled(self, recall: Recall | None) -> None:
        """Another client changed what this mount's leases covered (None: the leases were lost):
        the mount's own memories go, then the kernel's (``KernelCache.recalled``); the recall is
        acknowledged once this returns."""
        self.fresh.forget_all()
        if recall is not None and recall.claims:
            recall = self._claim_ended(recall)
        for ino in [None] if recall is None else recall.inos:  # (a chmod elsewhere may have given set-id bits)
            self.files.privileges_granted(ino)
        if recall is None or recall.entries or recall.listings:
            self.listings.forget_all()
        # Names changed elsewhere may lead elsewhere now: checked before a request acts by them.
        self.inodes.doubt(None if recall is None else [(e.parent, e.name) for e in recall.entries])
        await self.cache.recalled(recall, self.inodes.known_names(), self.inodes.known_inodes())

    def _claim_ended(self, recall: Recall) -> Recall:
        """``recall`` of this mount's claims, widened to what the kernel holds of the claimed
        directories only by those claims (no lease: the service grants nothing for a claim's
        creates and unlinks), as if another client had changed it all: the directory's listing
        (``KernelCache.recalled`` then drops every name there the kernel may hold, present or
        absent, and the listing it may keep), its attributes and those of the inodes named
        there. Those names are doubted (``InodeTable.doubt``)."""
        named = self.inodes.named_in(set(recall.claims))
        self.inodes.doubt([key for key, _ in named])
        return msgspec.structs.replace(recall, listings=[*recall.listings, *recall.claims],
                                       inos=[*recall.inos, *recall.claims, *{ino for _, ino in named}])

    def identity(self, ctx: Caller) -> Identity | None:
        return self.callers.identity(ctx)

    @staticmethod
    def uid_of(identity: Identity | None) -> int | None:
        return None if identity is None else identity[0]

    async def as_caller(self, identity: Identity | None, call: Callable[[AsyncFileSystem], Awaitable[T]]) -> T:
        """``call(fs)`` with ``fs`` the client as the process that made the kernel request
        (``Callers``): what it creates is theirs, and the metadata service checks their
        permissions."""
        return await on_view(self.fs, identity, call)

    def path(self, ino: int) -> str:
        return self.inodes.path(ino)

    def named(self, parent: int, name: str, ino: int, count: int = 1) -> None:
        """The kernel now holds ``name`` in ``parent`` as ``ino`` (a lookup, a listing's entry,
        or this mount's create): the inode table counts it, and it is no absent name."""
        self.inodes.looked_up(parent, name, ino, count)
        self.cache.became_present(parent, name)

    def child(self, parent: int, name: bytes) -> tuple[str, str]:
        """(name as text, its tectofs path) of ``name`` in directory ``parent``."""
        text = name.decode("utf-8", "surrogateescape")
        return text, self.inodes.child_path(parent, text)

    async def checked_path(self, ino: int, identity: Identity | None) -> str:
        """``ino``'s path, checked to lead to it when another client changed a name on it since
        the kernel got it (``InodeTable.doubt``), else the first of its other names that does;
        StaleFile (ESTALE: the kernel walks the path again) if none does. A path with no doubted
        name is answered as it is: the service recalls a name before it changes."""
        path, doubtful = self.inodes.path_doubtful(ino)
        if not doubtful:
            return path
        refused: PermissionDenied | None = None
        for candidate in self.inodes.paths(ino):
            try:
                found = await self.as_caller(identity, lambda fs: fs.stat(candidate[1]))
            except PermissionDenied as exc:  # (the caller may not walk it: said so if no other name serves)
                refused = refused or exc
                continue
            except TectofsError:
                continue
            if found.ino == ino:
                self.inodes.confirmed(ino, candidate)
                return candidate[1]
        raise refused or StaleFile(f"inode {ino}: no name this mount knows leads to it any more")

    async def checked_child(self, parent: int, name: bytes, identity: Identity | None) -> tuple[str, str]:
        """``child``, the directory's path checked as by :meth:`checked_path`."""
        text = name.decode("utf-8", "surrogateescape")
        base = await self.checked_path(parent, identity)
        return text, base + text if base == "/" else base + "/" + text

    def entry(self, st: Stat, fresh: bool = True) -> pyfuse3.EntryAttributes:
        """The kernel's view of ``st`` with this mount's uncommitted changes and the cache
        policy's timeouts; remembered for close-to-open (``KernelCache.reported``)."""
        uncommitted = self.files.uncommitted(st.ino)
        self.cache.reported(st.ino, uncommitted.size if uncommitted else st.size, st.mtime)
        return self.cache.timeouts(entry_attributes(st, uncommitted), fresh)

    def creating_writer(self, ino: int, identity: Identity | None) -> OpenFile | None:
        """The descriptor of this mount that created ``ino`` and writes it, if it is its only
        writer here and this request's caller opened it."""
        return self.files.creating_writer(ino, self.uid_of(identity))

    async def stat_inode(self, ino: int, identity: Identity | None) -> Stat:
        """``ino``'s attributes from the metadata service: by its path, as the caller; when
        the caller may no longer walk the path, or the path leads elsewhere or nowhere (an
        unlinked open file), by inode number through a descriptor open on it (as fstat does
        on Linux; the service takes a handle only from the uid it was issued to)."""
        try:
            path = await self.checked_path(ino, identity)
            st = await self.as_caller(identity, lambda fs: fs.stat(path))
            if st.ino == ino:
                return st
            refusal: TectofsError = StaleFile(f"{path} is no longer inode {ino}")
        except (PermissionDenied, StaleFile, NotFound) as exc:
            refusal = exc
        for handle in self.files.of(ino):
            file = handle.file
            try:
                reply = await file.context.metadata.getattr(messages.InoRequest(ino=file.ino, handle=file.handle))
                return Stat.from_attrs(reply.attrs)
            except PermissionDenied:
                continue
        raise refusal


# Handlers that change no directory's attributes, or tell FreshAttributes (and the known
# listings) themselves; every other handler moves its epoch and drops the known listings.
_LEAVE_DIRECTORIES = frozenset({
    "lookup", "forget", "getattr", "setattr", "read", "write", "flush", "fsync", "release", "readlink", "statfs",
    "getxattr", "listxattr", "access", "open", "opendir", "readdir", "releasedir", "fsyncdir", "create", "unlink",
    "mkdir", "rmdir",
})


def handler(method: H) -> H:
    """A request handler of :class:`MountState`'s subclasses: tectofs errors become
    ``FUSEError(errno)``; anything unexpected is logged and becomes EIO. A handler that may
    change a directory is a change for ``FreshAttributes`` and drops the ``KnownListings``
    when it starts and ends."""
    changes = method.__name__ not in _LEAVE_DIRECTORIES

    @functools.wraps(method)
    async def wrapper(self: MountState, *args: Any) -> Any:
        if changes:
            self.listings.forget_all()
        self.cache.begin_request()
        started = self.fresh.begin_change() if changes else 0
        try:
            return await method(self, *args)
        except pyfuse3.FUSEError:
            raise
        except TectofsError as exc:
            log.debug("%s%r: %s", method.__name__, args[:2], exc)
            raise pyfuse3.FUSEError(exc.errno) from None
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        except Exception:
            log.exception("FUSE %s%r failed unexpectedly", method.__name__, args[:2])
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if changes:
                self.fresh.end_change(started)
                self.listings.forget_all()

    return wrapper  # type: ignore[return-value]
