"""Directories whose every name the mount knows, so that looking up a name that is not there
is answered at once instead of by a metadata call (``tectofs mount --negative-entry-cache``,
off by default).

Creating a file costs the kernel two requests that reach the metadata service: a lookup of
the new name (which fails) and the create. When the mount knows the directory's complete
listing, the lookup is answered here. A listing becomes known when the mount makes the
directory itself (empty); it stays known while the mount's own creates and unlinks are the
only changes to it, which their replies prove: each carries the directory's ctime before the
call and its attributes after (NFSv3's ``wcc_data``), and a ctime before that is not the one
recorded after the mount's previous change means someone else changed the directory: the
listing is dropped. Any other request of this mount that may change a directory (rename,
mkdir, link, symlink, mknod, rmdir, setattr...) drops every listing when it starts and when
it ends.

Between two of its own changes the mount cannot see another client's: a name another client
creates may be answered "no such file" for up to ``timeout_s`` after the mount's last change
there (as NFS's negative dentries; JuiceFS's ``--negative-entry-cache``, also off by default).
A listing not refreshed within ``timeout_s`` is dropped. With a timeout of 0 (the default, and
a mount whose metadata service alone checks permissions) nothing is kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Hashable


@dataclass
class _Listing:
    names: set[str] = field(default_factory=set)
    ctime: float = 0.0  # the directory's ctime after the mount's last change to it
    expiry: float = 0.0


class KnownListings:
    """Complete listings of directories, keyed by directory (the mount: its inode number),
    each valid until proven stale. One event loop uses it."""

    def __init__(self, timeout_s: float, max_directories: int = 256, max_names: int = 100_000) -> None:
        self.timeout_s = timeout_s
        self.max_directories = max_directories
        self.max_names = max_names  # a listing that grows past this is dropped (memory stays bounded)
        self._listings: dict[Hashable, _Listing] = {}

    def made(self, path: Hashable, ctime: float) -> None:
        """The mount made directory ``path``: it is empty, as of ``ctime``."""
        if self.timeout_s <= 0:
            return
        if len(self._listings) >= self.max_directories:
            self._listings.pop(next(iter(self._listings)))
        self._listings[path] = _Listing(set(), ctime, time.monotonic() + self.timeout_s)

    def absent(self, directory: Hashable, name: str) -> bool:
        """Whether ``name`` is known not to be in ``directory`` (a lookup may say ENOENT)."""
        listing = self._listings.get(directory)
        if listing is None:
            return False
        if time.monotonic() > listing.expiry:
            del self._listings[directory]
            return False
        return name not in listing.names

    def changed(self, directory: Hashable, name: str, present: bool, ctime_before: float | None,
                ctime_after: float | None) -> None:
        """The mount's create (``present``: made, or found there) or unlink of ``name`` in
        ``directory`` answered with the directory's ctime before and after: the listing
        follows, or is dropped if anything else changed the directory meanwhile (or the reply
        does not say)."""
        listing = self._listings.get(directory)
        if listing is None:
            return
        if ctime_before is None or ctime_after is None or ctime_before != listing.ctime:
            del self._listings[directory]
            return
        if present:
            listing.names.add(name)
        else:
            listing.names.discard(name)
        if len(listing.names) > self.max_names:
            del self._listings[directory]
            return
        listing.ctime = ctime_after
        listing.expiry = time.monotonic() + self.timeout_s

    def forget(self, directory: Hashable) -> None:
        """A change to ``directory`` the listing cannot follow (a failed create or unlink)."""
        self._listings.pop(directory, None)

    def forget_all(self) -> None:
        """A change the listings cannot follow (rename, mkdir, link...): drop them all."""
        self._listings.clear()
