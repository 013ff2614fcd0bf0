"""The store's side of asynchronous creates (``tectofs.wire.claims``; who holds a claim is the
metadata service's business, ``server/meta/leases.py``): reserving inode numbers for a
claimed directory's creates, and making a batch of them in one operation."""

from __future__ import annotations

import stat as statmod
from typing import TYPE_CHECKING, Iterable

from ..errors import InvalidArgument, StaleFile
from ..wire.claims import PendingCreate
from ..wire.values import Attrs
from . import access
from .access import Caller, W, X
from .base import StoreParts
from .blockmaps import _p


class DirectoryClaims(StoreParts):
    if TYPE_CHECKING:
        reached: int

        def _resolve_dir(self, parts: list[str], caller: Caller | None = None) -> Attrs: ...

        def _insert_inode(self, parent: Attrs, parts: list[str], kind: str, mode: int, uid: int, gid: int,
                          policy: str | None = None, block_size: int | None = None, target: str | None = None,
                          write_min: int | None = None, caller: Caller | None = None, rdev: int = 0,
                          ino: int | None = None, now: float | None = None) -> Attrs: ...

    def claim_directory(self, parts: list[str], count: int, uid: int, gid: int, *,
                        caller: Caller | None = None) -> tuple[Attrs, Attrs, int]:
        """Directory ``parts`` (the caller needs write and search permission on it: what a
        create there needs), the attributes a regular file the caller creates there gets (its
        ``ino`` the first number reserved; ``access.new_owner``'s owner and group), and the first
        of ``count`` inode numbers reserved for those files. A setgid directory is refused
        (InvalidArgument): the rules of the bits its new files get are the service's to apply."""
        directory = self._resolve_dir(parts, caller)
        access.require(directory, caller, W | X, path=_p(parts), on=_p(parts))
        if directory.mode & statmod.S_ISGID:
            raise InvalidArgument(f"{_p(parts)} is a setgid directory: its creates are not delegated")
        mode, uid, gid = access.new_owner(directory, caller, statmod.S_IFREG | 0o644, uid, gid)
        first = self._next("ino", count)
        now = self.clock()
        template = Attrs(ino=first, kind="file", mode=mode, uid=uid, gid=gid, size=0, atime=now, mtime=now, ctime=now,
                         nlink=1, policy=directory.policy, block_size=directory.block_size, parent=directory.ino,
                         write_min=directory.write_min, xattrs=0)
        return directory, template, first

    def create_many(self, parts: list[str], directory_ino: int, creates: Iterable[PendingCreate], uid: int, gid: int,
                    *, caller: Caller | None = None) -> Attrs:
        """Make each of ``creates`` (empty regular files, numbered by the client from its claim's
        reserved numbers, which the service checked) in directory ``parts``, which must still be
        inode ``directory_ino``, in order; the directory's attributes after. A name that exists
        fails the whole operation (AlreadyExists), as does a caller without write permission."""
        directory = self._resolve_dir(parts, caller)
        if directory.ino != directory_ino:
            raise StaleFile(f"{_p(parts)} is no longer directory {directory_ino}")
        for create in creates:
            self._insert_inode(directory, [*parts, create.name], "f", statmod.S_IFREG | create.mode, uid, gid,
                               caller=caller, ino=create.ino, now=create.time)
            if create.reader:
                self.renew(create.ino, reader=create.reader)
        self.reached = directory.ino
        return self._get(directory.ino)
