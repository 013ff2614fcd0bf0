"""The store's side of asynchronous creates (``tectofs.wire.claims``; who holds a claim is the
metadata service's business, ``server/meta/leases.py``): reserving inode numbers for a
claimed directory's creates, and making a batch of them in one operation."""

from __future__ import annotations

import stat as statmod
from typing import TYPE_CHECKING, Iterable

from ..errors import InvalidArgument, NotADirectory, StaleFile
from ..wire import inline_echo
from ..wire.claims import CreateManyReply, PendingCreate, PendingUnlink
from ..wire.messages import UnlinkReply
from ..wire.values import Attrs, LayoutSegment, WrittenBlock
from . import access
from .access import Caller, W, X
from .base import StoreParts
from .blockmaps import _p


class DirectoryClaims(StoreParts):
    if TYPE_CHECKING:
        reached: int

        def _resolve_dir(self, parts: list[str], caller: Caller | None = None) -> Attrs: ...

        def unlink(self, parts: list[str], ino: int = 0, only_if_empty: bool = False, *,
                   caller: Caller | None = None, reader: int = 0) -> UnlinkReply: ...

        def commit(self, ino: int, size: int, blocks: list[WrittenBlock], replace: bool, mtime: float | None = None,
                   shrunk_to: int | None = None, holes: Iterable[int] = (), writer: int | None = None,
                   atime: float | None = None, mode: int | None = None, *,
                   caller: Caller | None = None, now: float | None = None) -> LayoutSegment: ...

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
        return directory, _new_file(directory, first, mode, uid, gid, now), first

    def claimed_file(self, directory_ino: int, ino: int) -> Attrs:
        """What is known of file ``ino`` that a claim's holder will create in directory
        ``directory_ino`` before its create arrives: a regular file with the directory's
        policy, block size and write minimum (``allocate``'s ``absent_as``)."""
        directory = self._get(directory_ino)
        if directory.kind != "dir":
            raise NotADirectory(f"inode {directory_ino} is not a directory")
        return _new_file(directory, ino, statmod.S_IFREG | 0o600, 0, 0, 0.0)  # (what allocate reads: the rest unknown)

    def record_claim(self, first: int, count: int, directory: int, session: bytes) -> None:
        """Keep, durably, that ``session`` holds ``directory`` claimed with inode numbers
        ``first .. first + count - 1`` (a restarted service takes its creates back: ``claims_recorded``)."""
        self._x("INSERT INTO claims (first, count, directory, session) VALUES (?, ?, ?, ?)",
                (first, count, directory, session))

    def claims_recorded(self) -> list[tuple[int, int, int, bytes]]:
        """Every claim range kept: (first, count, directory, session)."""
        return [(int(first), int(count), int(directory), bytes(session))
                for first, count, directory, session in self._all("SELECT first, count, directory, session FROM claims")]

    def forget_claims(self, firsts: Iterable[int]) -> None:
        """The claim ranges starting at ``firsts`` ended: forget them."""
        for first in firsts:
            self._x("DELETE FROM claims WHERE first = ?", (first,))

    def parent_of(self, ino: int) -> int | None:
        """The directory regular file ``ino`` was last created or renamed into (None: no such
        file, or not a regular file)."""
        row = self._one("SELECT parent FROM inodes WHERE ino = ? AND kind = 'f'", (ino,))
        return None if row is None else int(row[0])

    def children(self, directory: int) -> list[int]:
        """The regular files the names in ``directory`` lead to (what its claim's holder may unlink)."""
        return [int(ino) for (ino,) in self._all(
            "SELECT n.ino FROM names n JOIN inodes i ON i.ino = n.ino WHERE n.parent = ? AND i.kind = 'f'", (directory,))]

    def create_many(self, parts: list[str], directory_ino: int, creates: Iterable[PendingCreate], uid: int, gid: int,
                    *, caller: Caller | None = None, unlinks: Iterable[PendingUnlink] = ()) -> CreateManyReply:
        """Make each of ``creates`` (regular files, numbered by the client from its claim's
        reserved numbers, which the service checked) in directory ``parts``, which must still be
        inode ``directory_ino``, in order, each with its first commit if it carries one
        (``commit``'s rules); the directory's attributes after, and those commits' layouts (the
        inline bytes they carried left out). ``unlinks`` go first (``unlink``'s rules; each name
        must still lead to its inode). A name that exists fails the whole operation
        (AlreadyExists), as does a caller without write permission."""
        directory = self._resolve_dir(parts, caller)
        if directory.ino != directory_ino:
            raise StaleFile(f"{_p(parts)} is no longer directory {directory_ino}")
        for unlink in unlinks:
            self.unlink([*parts, unlink.name], unlink.ino, caller=caller)
        layouts = []
        for create in creates:
            self._insert_inode(directory, [*parts, create.name], "f", statmod.S_IFREG | create.mode, uid, gid,
                               caller=caller, ino=create.ino, now=create.time)
            if create.reader:
                self.renew(create.ino, reader=create.reader)
            content = create.content
            if content is not None:
                layout = self.commit(create.ino, content.size, list(content.blocks), True, content.mtime,
                                     atime=content.atime, mode=content.mode, caller=caller, now=content.ctime)
                layouts.append(inline_echo.omit(layout, content.blocks))
        self.reached = directory.ino
        return CreateManyReply(directory=self._get(directory.ino), layouts=layouts)


def _new_file(directory: Attrs, ino: int, mode: int, uid: int, gid: int, now: float) -> Attrs:
    """The attributes of a new, empty regular file ``ino`` in ``directory``, which gives it its
    policy, block size and write minimum."""
    return Attrs(ino=ino, kind="file", mode=mode, uid=uid, gid=gid, size=0, atime=now, mtime=now, ctime=now, nlink=1,
                 policy=directory.policy, block_size=directory.block_size, parent=directory.ino,
                 write_min=directory.write_min, xattrs=0)
