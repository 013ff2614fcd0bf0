"""Read-only handles a leasing client opened from its cache, without a call and so without the
reader's lease an ``open`` takes (``MetadataCache.layout``: a small file's bytes, inline in a
layout read before, under a lease still held).

A reader's lease keeps a file alive, with no name, while a handle has it open. These handles
hold the file's bytes already; what they would lose to an unlink is the inode itself (``fstat``
of the descriptor). So before this client's own change that may remove a file's last name (an
unlink, a rename over it), each such handle on it takes its lease first, as an ``open`` would
have: the file then lives on until the handle closes. A change by another client removes the
file without waiting for them (its recall reaches this client after the change): their reads
go on, their ``fstat`` reports the file gone.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING

from tectofs.errors import TectofsError
from tectofs.wire import messages

if TYPE_CHECKING:
    from tectofs.client.files import AsyncFile


_PRUNE_AT = 256


class CachedOpens:
    def __init__(self) -> None:
        self._open: dict[int, weakref.WeakSet[AsyncFile]] = {}

    def any(self) -> bool:
        """Whether any may still be open."""
        return bool(self._open)

    def add(self, handle: "AsyncFile") -> None:
        if len(self._open) >= _PRUNE_AT:  # forget the inodes whose handles all closed
            self._open = {ino: open_ for ino, open_ in self._open.items() if any(not h.closed for h in open_)}
        self._open.setdefault(handle.ino, weakref.WeakSet()).add(handle)

    async def take_leases(self, inos: "set[int] | None") -> None:
        """Give every open handle on ``inos`` (None: on any inode) a reader's lease (one that
        cannot, say because its file's permissions changed since, goes on without)."""
        for ino in list(self._open) if inos is None else [i for i in inos if i in self._open]:
            for handle in [h for h in self._open.pop(ino, ()) if not h.closed]:
                reader = int.from_bytes(os.urandom(8), "big") >> 1 or 1
                try:
                    await handle.context.metadata.renew(messages.RenewRequest(
                        ino=ino, handle=handle.handle, writer=0, reader=reader))
                except TectofsError:
                    continue
                handle.hold_read_lease(reader)
