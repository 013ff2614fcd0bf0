"""How the kernel's requests reach :class:`~tectofs.client.fuse.operations.TectofsOperations`:
``mfusepy.FUSE`` (libfuse 3's high-level path API) with the changes the mount needs."""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
from typing import Any

import mfusepy

from tectofs.client.fuse.operations import TectofsOperations
from tectofs.client.fuse.readdir import READDIR_PLUS, fill

log = logging.getLogger("tectofs.fuse")


class TectofsFuse(mfusepy.FUSE):
    """``mfusepy.FUSE`` with five changes: listings are paged with every entry's attributes
    (``readdir_fuse_3``, ``readdir``), ``rename`` receives the kernel's flags
    (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``; mfusepy drops them), ``truncate`` receives
    the file handle of an ``ftruncate`` (mfusepy drops it), ``read`` fills the kernel's buffer
    in place and ``write`` hands the kernel's buffer to the client without a copy (the client
    copies it into its block buffer before the call returns)."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        return self.operations.rename(
            old.decode(self.encoding, self.errors), new.decode(self.encoding, self.errors), flags
        )

    def truncate_fuse_3(self, path: bytes | None, length: int, fip: Any) -> int:
        return self.operations.truncate(
            None if path is None else path.decode(self.encoding, self.errors), length, fip.contents.fh if fip else None
        )

    def readdir_fuse_3(self, path: bytes | None, buf: Any, filler: Any, offset: int, fip: Any, flags: int) -> int:
        """A listing paged from ``offset``, with attributes for READDIRPLUS (``readdir``)."""
        where = "/" if path is None else path.decode(self.encoding, self.errors)
        operations: TectofsOperations = self.operations
        entries, fresh = operations.listing_page(where, fip.contents.fh, offset)  # errors: -errno (mfusepy)
        try:
            fill(filler, buf, entries, offset, fresh and bool(flags & READDIR_PLUS),
                 functools.partial(operations.entry_attributes, where), self.encoding, self.errors)
        except Exception:
            log.exception("FUSE readdir of %s failed unexpectedly", where)
            raise mfusepy.FuseOSError(errno.EIO) from None
        return 0

    def read(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        target = (ctypes.c_ubyte * size).from_address(ctypes.addressof(buf.contents))
        return self.operations.readinto(
            None if path is None else path.decode(self.encoding, self.errors), target, offset, fip.contents.fh
        )

    def write(self, path: bytes | None, buf: Any, size: int, offset: int, fip: Any) -> int:
        data = (ctypes.c_ubyte * size).from_address(ctypes.addressof(buf.contents))
        return self.operations.write(
            None if path is None else path.decode(self.encoding, self.errors), data, offset, fip.contents.fh
        )
