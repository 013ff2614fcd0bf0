"""The SQL engine: every metadata operation, written once.

Calling contract: every public method runs inside a transaction opened by the caller
(:class:`~tectofs.store.runner.StoreRunner` wraps each operation in a savepoint and many
operations in one commit). Methods raise :mod:`tectofs.errors` classes for user errors; the
savepoint of a failed operation is rolled back without touching the others in its batch.

Permissions: the operations a client reaches take a keyword ``caller``, the client's
:class:`~tectofs.store.access.Caller`; ``None`` (internal callers, tools, tests) is never
checked. With a caller, POSIX rules apply (``access.py``): search permission on every
directory a path walks, write and search on a directory to add or remove a name in it
(sticky directories: only the entry's or the directory's owner), new inodes owned by the
caller (setgid directories give their group), read or write permission on a file's data.

Types: every public method takes and returns declared types, the wire's own where one fits
(``tectofs.wire.values``/``messages``: ``Attrs``, ``CreateReply``, ``UnlinkReply``, ``ReaddirReply``,
``LayoutSegment``, ``Allocation``, ``WrittenBlock``, ``ServerInfo``, ...), else a small store-level
Struct (``users.StoredUser``). Values are msgspec Structs built from SQL rows, never re-validated:
the store's rows satisfy the wire's bounds by construction. What the store answers lacks only what
the metadata service adds per caller: file handles (``Attrs.handle``) and capabilities
(``Block.cap``, ``Allocation.cap``).

Names: a file may have several (hard links, ``link``); ``nlink`` counts them. A file whose
last name goes while a handle holds it open (a lease) lives on with ``nlink`` 0 until the
last is released (``release``) or lapses (``collect_orphans``).
"""

from __future__ import annotations

import random
import stat as statmod
import time
from typing import Any, Callable, Iterable

import msgspec

from .. import limits
from ..capacity import raw_capacity
from ..errors import (
    AlreadyExists,
    DirectoryNotEmpty,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
    NotPermitted,
    StaleFile,
    TooManyLinks,
)
from ..paths import check_name
from ..policy import DEFAULT_POLICY
from ..policy import parse as parse_policy
from ..wire.leases import ENTRY, LeaseKey
from ..wire.messages import AttrsReply, CreateReply, ReaddirReply, StatfsReply, UnlinkReply, XattrEntry
from ..wire.values import Attrs, DirEntry, InlineData, Kind, WrittenBlock
from . import access
from .access import Caller, R, W, X
from .blockmaps import BlockMaps, _p
from .claims import DirectoryClaims
from .dialect import Dialect
from .health import HEALTH_COLUMNS, HEALTH_SCHEMA, BlockHealth
from .lease_keys import changed_by
from .registry import ServersAndLeases
from .schema import ADDED_COLUMNS, SCHEMA, WIDENED_COLUMNS_POSTGRESQL
from .sharing import SHARING_SCHEMA, SharedBlocks
from .users import Users
from .xattrs import SCHEMA as XATTR_SCHEMA
from .xattrs import ExtendedAttributes

ROOT_INO = 1
_KINDS: dict[str, Kind] = {"f": "file", "d": "dir", "l": "symlink", "p": "fifo", "s": "socket", "c": "char", "b": "block"}
# Special files: kind code by file type bits (stored as metadata only; the kernel serves them).
_SPECIAL = {statmod.S_IFIFO: "p", statmod.S_IFSOCK: "s", statmod.S_IFCHR: "c", statmod.S_IFBLK: "b"}
# Upper bounds of encoded sizes (msgpack, field names included), for bounded replies:
# an entry's attributes without its name and symlink target (blocks and chunks: blockmaps.py).
_ENTRY_BYTES_MAX = 320
_ATTR_COLUMNS = (
    "ino, kind, mode, uid, gid, size, atime, mtime, ctime, nlink, policy, block_size, target, parent, stored, write_min,"
    " rdev, xattrs"
)
_JOINED_ATTR_COLUMNS = ", ".join("i." + c.strip() for c in _ATTR_COLUMNS.split(","))  # of inodes joined as i

def _attrs(row: Iterable[Any]) -> Attrs:
    (ino, kind, mode, uid, gid, size, atime, mtime, ctime, nlink, policy, block_size, target, parent, stored, write_min,
     rdev, xattrs) = row
    return Attrs(
        ino=ino, kind=_KINDS[kind], mode=mode, uid=uid, gid=gid, size=size, atime=atime, mtime=mtime, ctime=ctime,
        nlink=nlink, policy=policy, block_size=block_size, target=target, parent=parent, stored=stored,
        write_min=write_min, rdev=rdev, xattrs=xattrs,
    )


def _as_dir(attrs: Attrs, parts: list[str]) -> Attrs:
    if attrs.kind != "dir":
        raise NotADirectory(f"{_p(parts)} is not a directory")
    return attrs


class SqlStore(BlockMaps, SharedBlocks, ServersAndLeases, BlockHealth, Users, ExtendedAttributes, DirectoryClaims):
    """All metadata operations over one DB-API connection. Not thread-safe: one thread
    (the runner's) owns it."""

    server_dead_after_s = limits.server_dead_after_s  # the service sets its configured value
    inline_max = limits.inline_bytes_default  # files up to this size are committed inline (the service sets it)

    def __init__(
        self,
        dialect: Dialect,
        default_policy: str = DEFAULT_POLICY,
        default_block_size: int = limits.block_size_default_bytes,
        gc_delay_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        # Time and chance come in from outside, so a simulation can drive them (tests/simulation.py).
        self.clock = clock
        self.rng = rng or random.Random()
        self.dialect = dialect
        self.conn = dialect.connect()
        self.gc_delay_s = gc_delay_s
        # server id -> wall time a heartbeat *arrived* at the service, filled in by the service
        # before the heartbeat waits in the store's queue: a busy MDS must not age every
        # server at once and declare the whole cluster dead.
        self.heartbeats_seen: dict[int, float] = {}
        # What the operation being run read and changed, for the service's leases
        # (``server/meta/leases.py``): the names its path walks looked up, present or absent
        # (``walked``), the inode they reached last (``reached``), and the lease keys its
        # statements invalidated (``modified``, ``lease_keys.changed_by``). Kept only while the
        # service sets them (to empty collections, around one operation); None: not kept.
        self.walked: list[LeaseKey] | None = None
        self.through: set[LeaseKey] | None = None  # of ``walked``: names found to be directories
        self.reached = 0
        self.modified: set[LeaseKey] | None = None
        parse_policy(default_policy)
        self._check_block_size(default_block_size)
        self._init_schema(default_policy, default_block_size)

    # ------------------------------------------------------------------ plumbing

    def _x(self, sql: str, params: Iterable[Any] = ()) -> Any:
        params = tuple(params)
        if self.modified is not None:
            self.modified.update(changed_by(sql, params))
        return self.conn.execute(self.dialect.sql(sql), params)

    def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        return self._x(sql, params).fetchone()

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        return self._x(sql, params).fetchall()

    # Transactions: the runner (or a test, a tool) opens one around each batch of operations,
    # and a savepoint around each operation in it; the operations never do.

    def tx_begin(self) -> None:
        """Open a transaction (SERIALIZABLE on PostgreSQL: ``dialect.begin_statement``)."""
        self._x(self.dialect.begin_statement)

    def tx_commit(self) -> None:
        self._x("COMMIT")

    def tx_rollback(self) -> None:
        self._x("ROLLBACK")

    def tx_savepoint(self, name: str) -> None:
        self._x(f"SAVEPOINT {name}")

    def tx_release(self, name: str) -> None:
        self._x(f"RELEASE SAVEPOINT {name}")

    def tx_rollback_to(self, name: str) -> None:
        self._x(f"ROLLBACK TO SAVEPOINT {name}")

    def _init_schema(self, default_policy: str, default_block_size: int) -> None:
        self.tx_begin()
        for statement in SCHEMA + HEALTH_SCHEMA + XATTR_SCHEMA + SHARING_SCHEMA:
            self._x(statement)
        for table, column, declaration, fill in ADDED_COLUMNS + HEALTH_COLUMNS:
            present = [d[0] for d in self._x(f"SELECT * FROM {table} LIMIT 0").description]
            if column not in present:  # a store made by an older release
                self._x(f"ALTER TABLE {table} ADD COLUMN {declaration}")
                if fill:
                    self._x(fill)
        if self.dialect.name == "postgresql":
            for table, column, kind in WIDENED_COLUMNS_POSTGRESQL:
                row = self._one("SELECT data_type FROM information_schema.columns WHERE table_name = ?"
                                " AND column_name = ?", (table, column))
                if row is not None and row[0] != kind.lower():
                    self._x(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {kind}")
        if self._one("SELECT 1 FROM inodes WHERE ino = ?", (ROOT_INO,)) is None:
            now = self.clock()
            self._x(
                "INSERT INTO inodes (ino, kind, mode, uid, gid, size, atime, mtime, ctime, nlink, policy,"
                " block_size, target, parent) VALUES (?, 'd', ?, 0, 0, 0, ?, ?, ?, 2, ?, ?, NULL, ?)",
                (ROOT_INO, statmod.S_IFDIR | 0o755, now, now, now, default_policy, default_block_size, ROOT_INO),
            )
        for name, value in (("ino", ROOT_INO), ("block_id", 0), ("inventory", 0)):
            self._x("INSERT INTO counters (name, value) VALUES (?, ?) ON CONFLICT DO NOTHING", (name, value))
        self.tx_commit()

    def _next(self, counter: str, count: int = 1) -> int:
        """Reserve ``count`` consecutive ids; returns the first."""
        (value,) = self._one("UPDATE counters SET value = value + ? WHERE name = ? RETURNING value", (count, counter))
        return int(value) - count + 1

    def counter(self, name: str) -> int:
        """The value of counter ``name`` (0 if it was never counted)."""
        row = self._one("SELECT value FROM counters WHERE name = ?", (name,))
        return 0 if row is None else int(row[0])

    def bump_counter(self, name: str) -> None:
        """Count one more of ``name``."""
        self._x("INSERT INTO counters (name, value) VALUES (?, 1)"
                " ON CONFLICT (name) DO UPDATE SET value = counters.value + 1", (name,))

    def _checked_policy(self, policy: str | None) -> str | None:
        """``policy`` normalized; refused, with the numbers, if it is wider than the cluster
        (once any chunk server registered: a new cluster may set policies first)."""
        if policy is None:
            return None
        parsed = parse_policy(policy)
        (registered,) = self._one("SELECT COUNT(*) FROM servers")
        if 0 < registered < parsed.width:
            raise InvalidArgument(
                f"{parsed} needs {parsed.width} chunk servers; this cluster has {registered} registered"
            )
        return str(parsed)

    @staticmethod
    def _check_block_size(block_size: int) -> None:
        if not limits.block_size_min_bytes <= block_size <= limits.block_size_max_bytes:
            raise InvalidArgument(
                f"block size {block_size} outside [{limits.block_size_min_bytes}, {limits.block_size_max_bytes}]"
            )

    # ------------------------------------------------------------------ resolution

    def _get(self, ino: int) -> Attrs:
        row = self._one(f"SELECT {_ATTR_COLUMNS} FROM inodes WHERE ino = ?", (ino,))
        if row is None:
            raise StaleFile(f"inode {ino} no longer exists")
        return _attrs(row)

    def _child(self, parent: int, name: str) -> int | None:
        row = self._one("SELECT ino FROM names WHERE parent = ? AND name = ?", (parent, name))
        return None if row is None else int(row[0])

    def _child_attrs(self, parent: int, name: str) -> Attrs | None:
        """The attributes of entry ``name`` of directory ``parent``: one statement, not two."""
        row = self._one(f"SELECT {_JOINED_ATTR_COLUMNS} FROM names n JOIN inodes i ON i.ino = n.ino"
                        " WHERE n.parent = ? AND n.name = ?", (parent, name))
        return None if row is None else _attrs(row)

    def _walk(self, parts: list[str], caller: Caller | None = None) -> tuple[Attrs, Attrs]:
        """The attributes of the directory holding the last name of ``parts`` and of that
        name (the root twice for ``[]``); with a caller, who needs search permission on every
        directory walked."""
        parent = attrs = self._get(ROOT_INO)
        self.reached = ROOT_INO
        walked = ""
        for depth, name in enumerate(parts, 1):
            if attrs.kind != "dir":
                raise NotADirectory(f"{walked or '/'} is not a directory")
            access.require(attrs, caller, X, path=_p(parts), on=walked or "/")
            walked += "/" + name
            parent, attrs = attrs, self._entry(attrs, parts[:depth])
        return parent, attrs

    def _entry(self, parent: Attrs, parts: list[str]) -> Attrs:
        """``_walk``'s last step: the last name of ``parts`` in ``parent`` (``_parent_dir``'s)."""
        child = self._child_attrs(parent.ino, parts[-1])
        if self.walked is not None:
            self.walked.append((ENTRY, parent.ino, parts[-1]))
        if child is None:
            raise NotFound(f"{_p(parts)}: no such file or directory")
        if self.through is not None and child.kind == "dir":
            self.through.add((ENTRY, parent.ino, parts[-1]))
        self.reached = child.ino
        return child

    def _resolve(self, parts: list[str], caller: Caller | None = None) -> Attrs:
        return self._walk(parts, caller)[1]

    def _resolve_dir(self, parts: list[str], caller: Caller | None = None) -> Attrs:
        return _as_dir(self._resolve(parts, caller), parts)

    def _parent_dir(self, parts: list[str], caller: Caller | None = None) -> Attrs:
        """The directory that holds (or is to hold) the last name of ``parts``, which the caller
        needs search permission on to look that name up."""
        parent = self._resolve_dir(parts[:-1], caller)
        access.require(parent, caller, X, path=_p(parts), on=_p(parts[:-1]))
        return parent

    # ------------------------------------------------------------------ namespace

    def lookup(self, parts: list[str], *, caller: Caller | None = None) -> Attrs:
        """The attributes at path ``parts`` (``[]``: the root); NotFound, NotADirectory on the
        way; a caller needs search permission on every directory walked."""
        return self._resolve(parts, caller)

    def getattr_ino(self, ino: int, *, caller: Caller | None = None) -> Attrs:
        """No permission bits are checked here: the metadata service answers a user's call
        only with the file handle that a checked lookup issued it (``tectofs.wire.auth``)."""
        self.reached = ino
        return self._get(ino)

    def _insert_inode(
        self, parent: Attrs, parts: list[str], kind: str, mode: int, uid: int, gid: int,
        policy: str | None = None, block_size: int | None = None, target: str | None = None,
        write_min: int | None = None, caller: Caller | None = None, rdev: int = 0,
        ino: int | None = None, now: float | None = None,
    ) -> Attrs:
        """A new inode ``parts`` below ``parent``; what is not given is inherited (a new policy
        without its own ``write_min`` gets the policy's default). A caller needs write and
        search permission on ``parent`` and owns the new inode (``access.new_owner``).
        ``ino``, ``now``: its number (reserved by a claim) and time, else the next and now."""
        name = parts[-1]
        check_name(name)
        if write_min is None:
            write_min = 0 if policy else parent.write_min
        if self._child(parent.ino, name) is not None:
            raise AlreadyExists(f"{name!r} already exists")
        access.require(parent, caller, W | X, path=_p(parts), on=_p(parts[:-1]))
        mode, uid, gid = access.new_owner(parent, caller, mode, uid, gid)
        ino = self._next("ino") if ino is None else ino
        now = self.clock() if now is None else now
        row = (ino, kind, mode, uid, gid, len(target.encode()) if target else 0, now, now, now, 2 if kind == "d" else 1,
               policy or parent.policy, block_size or parent.block_size, target, parent.ino, 0, write_min, rdev, 0)
        self._x(f"INSERT INTO inodes ({_ATTR_COLUMNS}) VALUES ({', '.join('?' * len(row))})", row)
        self._x("INSERT INTO names (parent, name, ino) VALUES (?, ?, ?)", (parent.ino, name, ino))
        self._touch(parent.ino, now, nlink_delta=1 if kind == "d" else 0)
        return _attrs(row)  # what the row now holds, without reading it back

    def _touch(self, ino: int, now: float, nlink_delta: int = 0) -> None:
        self._x("UPDATE inodes SET mtime = ?, ctime = ?, nlink = nlink + ? WHERE ino = ?", (now, now, nlink_delta, ino))

    def mkdir(
        self, parts: list[str], mode: int = 0o755, uid: int = 0, gid: int = 0,
        policy: str | None = None, block_size: int | None = None, exist_ok: bool = False,
        *, caller: Caller | None = None,
    ) -> Attrs:
        """A new directory's attributes (``mode`` its permission bits; ``policy`` and
        ``block_size`` what files below it get, else inherited). With ``exist_ok``, an existing
        directory's, unless it has another policy or block size than asked (AlreadyExists)."""
        return self.make_directory(parts, mode, uid, gid, policy, block_size, exist_ok, caller=caller).attrs

    def make_directory(
        self, parts: list[str], mode: int = 0o755, uid: int = 0, gid: int = 0,
        policy: str | None = None, block_size: int | None = None, exist_ok: bool = False,
        *, caller: Caller | None = None,
    ) -> AttrsReply:
        """``mkdir``, answered with its parent's attributes after and its ctime before, when it
        made the directory (``AttrsReply.directory``: the mount answers the kernel's next
        question about the parent without a call)."""
        if not parts:
            if exist_ok:
                return AttrsReply(attrs=self._get(ROOT_INO))
            raise AlreadyExists("/ already exists")
        policy = self._checked_policy(policy)
        if block_size is not None:
            self._check_block_size(block_size)
        parent = self._parent_dir(parts, caller)
        existing = self._child(parent.ino, parts[-1])
        if existing is not None and exist_ok:
            attrs = self._get(existing)
            if attrs.kind != "dir":
                raise NotADirectory(f"/{'/'.join(parts)} exists and is not a directory")
            for key, has, wanted in (("policy", attrs.policy, policy), ("block_size", attrs.block_size, block_size)):
                if wanted is not None and has != wanted:  # never ignored silently
                    raise AlreadyExists(
                        f"/{'/'.join(parts)} exists with {key} {has}, not {wanted}: change it explicitly"
                        " (tectofs set-policy)"
                    )
            return AttrsReply(attrs=attrs)
        attrs = self._insert_inode(
            parent, parts, "d", statmod.S_IFDIR | (mode & 0o7777), uid, gid, policy, block_size, caller=caller
        )
        return AttrsReply(attrs=attrs, directory=self._get(parent.ino), directory_ctime_before=parent.ctime)

    def create(
        self, parts: list[str], mode: int = 0o644, uid: int = 0, gid: int = 0, exclusive: bool = False,
        *, caller: Caller | None = None,
    ) -> Attrs:
        """Create an empty file, or return the existing one (unless ``exclusive``)."""
        return self._create_file(parts, mode, uid, gid, exclusive, caller)[0]

    def create_file(
        self, parts: list[str], mode: int = 0o644, uid: int = 0, gid: int = 0, exclusive: bool = False,
        reader: int = 0, content: InlineData | None = None, mtime: float | None = None,
        xattrs: Iterable[XattrEntry] = (), *, caller: Caller | None = None,
    ) -> CreateReply:
        """``create``, also saying whether the file is new (a writer that fails removes it),
        the attributes of its directory after the call and its ctime before (NFSv3's
        ``wcc_data``: a mount answers the kernel's next questions about the directory with
        them, and knows whether anyone else changed it meanwhile); with ``reader``, the opening handle takes
        its lease. Opening an existing file needs only the path's search permissions: read
        and write permission are checked when the handle asks for the layout or writes.

        ``content``: the file's whole new content, committed inline in this same operation
        (``commit``'s rules: a writer's permission, the crc32c checked), with ``mtime`` and
        ``xattrs`` (``setxattr``'s rules); content larger than the file may keep inline is not
        stored, and the reply says so (``content_stored``)."""
        attrs, created, directory = self._create_file(parts, mode, uid, gid, exclusive, caller)
        # the directory after: as read, or as _touch just changed it (a new file adds no link)
        after = msgspec.structs.replace(directory, mtime=attrs.ctime, ctime=attrs.ctime) if created else directory
        if reader:
            self.renew(attrs.ino, reader=reader)
        stored = content is not None and len(content.data) <= self._inline_max(attrs)
        if stored:
            assert content is not None
            size = len(content.data)
            block = WrittenBlock(idx=0, block_id=0, length=size, chunks=[], inline=content)
            self.commit(attrs.ino, size, [block] if size else [], replace=True, mtime=mtime, caller=caller)
            for entry in xattrs:
                self.setxattr(parts, entry.name, entry.value, caller=caller)
            attrs = self._get(attrs.ino)
        return CreateReply(attrs=attrs, created=created, directory=after, directory_ctime_before=directory.ctime,
                           inline_max=self._inline_max(attrs), content_stored=stored)

    def _create_file(
        self, parts: list[str], mode: int, uid: int, gid: int, exclusive: bool, caller: Caller | None
    ) -> tuple[Attrs, bool, Attrs]:
        """The file's attributes, whether this call made it, and its directory's attributes before."""
        if not parts:
            raise IsADirectory("/ is a directory")
        parent = self._parent_dir(parts, caller)
        attrs = self._child_attrs(parent.ino, parts[-1])
        if attrs is not None:
            if exclusive:
                raise AlreadyExists(f"/{'/'.join(parts)} already exists")
            if attrs.kind == "dir":
                raise IsADirectory(f"/{'/'.join(parts)} is a directory")
            return attrs, False, parent
        return self._insert_inode(
            parent, parts, "f", statmod.S_IFREG | (mode & 0o7777), uid, gid, caller=caller
        ), True, parent

    def symlink(
        self, parts: list[str], target: str, uid: int = 0, gid: int = 0, *, caller: Caller | None = None
    ) -> Attrs:
        """A new symbolic link to ``target`` (at most ``limits.symlink_target_max_bytes``)."""
        if not parts:
            raise AlreadyExists("/ already exists")
        if not target or "\x00" in target or len(target.encode()) > limits.symlink_target_max_bytes:
            raise InvalidPath(f"invalid symlink target {target[:60]!r}")
        parent = self._parent_dir(parts, caller)
        return self._insert_inode(
            parent, parts, "l", statmod.S_IFLNK | 0o777, uid, gid, target=target, caller=caller
        )

    def mknod(
        self, parts: list[str], mode: int, rdev: int = 0, uid: int = 0, gid: int = 0, *, caller: Caller | None = None
    ) -> Attrs:
        """A special file: a FIFO, socket, character or block device node (``mode`` carries
        its type bits; ``rdev`` a device's number). Only metadata: the kernel serves them. As
        on Linux, only root makes device nodes."""
        kind = _SPECIAL.get(statmod.S_IFMT(mode))
        if kind is None:
            raise InvalidArgument(f"mknod makes FIFOs, sockets and device nodes, not mode {oct(mode)}")
        if not parts:
            raise AlreadyExists("/ already exists")
        if kind in "cb" and caller is not None and not caller.is_root:
            raise NotPermitted(f"{_p(parts)}: only root makes device nodes")
        parent = self._parent_dir(parts, caller)
        return self._insert_inode(parent, parts, kind, statmod.S_IFMT(mode) | (mode & 0o7777), uid, gid,
                                  caller=caller, rdev=rdev if kind in "cb" else 0)

    def readdir(
        self, parts: list[str], after: str = "", limit: int = limits.readdir_page_entries_max,
        *, caller: Caller | None = None,
    ) -> ReaddirReply:
        """One page of a directory: up to ``limit`` entries whose names sort after ``after``,
        fewer if their names and symlink targets would outgrow ``limits.reply_header_budget_bytes``;
        and the cursor for the next page (None after the last). A caller needs read permission;
        without search permission too, it gets each entry's name, inode number and type only
        (``access.names_only``), as ``getdents(2)`` gives: what else a lookup there would refuse."""
        directory = self._resolve_dir(parts, caller)
        access.require(directory, caller, R, path=_p(parts))
        searchable = access.may(directory, caller, X)
        if not after:
            self._accessed(directory)
        rows = self._all(
            f"SELECT n.name, {_JOINED_ATTR_COLUMNS}"
            " FROM names n JOIN inodes i ON i.ino = n.ino WHERE n.parent = ? AND n.name > ? ORDER BY n.name LIMIT ?",
            (directory.ino, after, limit + 1),
        )
        entries: list[DirEntry] = []
        budget = limits.reply_header_budget_bytes
        for row in rows[:limit]:
            attrs = _attrs(row[1:]) if searchable else access.names_only(_attrs(row[1:]))
            budget -= _ENTRY_BYTES_MAX + len(row[0].encode()) + len((attrs.target or "").encode())
            if budget < 0:
                break
            entries.append(DirEntry(name=row[0], attrs=attrs))
        more = len(entries) < len(rows)
        return ReaddirReply(entries=entries, next=entries[-1].name if more and entries else None)

    def setattr(
        self, parts: list[str] | None, mode: int | None = None, uid: int | None = None, gid: int | None = None,
        atime: float | None = None, mtime: float | None = None, *, caller: Caller | None = None, ino: int = 0,
    ) -> Attrs:
        """chmod, chown, utimes of the inode at ``parts``, or (``parts`` None) of inode ``ino``,
        whose handle the service checked (no path is walked: a file unlinked while open); a
        caller under the rules of ``access.checked_setattr``."""
        if parts is None:
            self.reached = ino
            attrs, where = self._get(ino), f"inode {ino}"
        else:
            attrs, where = self._resolve(parts, caller), _p(parts)
        now = self.clock()
        if mode is not None:
            mode = (attrs.mode & ~0o7777) | (mode & 0o7777)
        mode = access.checked_setattr(
            attrs, caller, where, mode, uid, gid, times=atime is not None or mtime is not None
        )
        self._x(
            "UPDATE inodes SET mode = COALESCE(?, mode), uid = COALESCE(?, uid), gid = COALESCE(?, gid),"
            " atime = COALESCE(?, atime), mtime = COALESCE(?, mtime), ctime = ? WHERE ino = ?",
            (mode, uid, gid, atime, mtime, now, attrs.ino),
        )
        return self._get(attrs.ino)

    def set_policy(
        self, parts: list[str], policy: str | None, block_size: int | None, write_min: int | None = None,
        *, caller: Caller | None = None,
    ) -> Attrs:
        """Change the policy, block size or write minimum (chunks a block needs to be accepted
        when servers are missing) that new files below this directory inherit. A new policy
        without a ``write_min`` gets the policy's default one. Only the directory's owner or root."""
        directory = self._resolve_dir(parts, caller)
        access.require_owner(directory, caller, _p(parts), "set its policy")
        policy = self._checked_policy(policy)
        if block_size is not None:
            self._check_block_size(block_size)
        effective = parse_policy(policy or directory.policy)
        if write_min is not None and not effective.needed <= write_min <= effective.width:
            raise InvalidArgument(
                f"write minimum {write_min} for {effective}: it must be between {effective.needed} (what a read"
                f" needs) and {effective.width}"
            )
        self._x(
            "UPDATE inodes SET policy = COALESCE(?, policy), block_size = COALESCE(?, block_size), write_min = ?"
            " WHERE ino = ?",
            (policy, block_size, write_min if write_min is not None else (0 if policy else directory.write_min),
             directory.ino),
        )
        return self._get(directory.ino)

    def _drop_blocks(self, ino: int, from_idx: int = 0, only_idx: int | None = None) -> None:
        """Forget blocks ``idx >= from_idx`` (or just ``only_idx``) of file ``ino``; the chunks
        of those no other file uses (``sharing.py``: a block's references are its ``blocks``
        rows) are queued for deletion after the GC delay (readers holding an older layout may
        still be reading them)."""
        def rows(alias: str) -> str:
            return f"{alias}ino = ? AND {alias}idx {'=' if only_idx is not None else '>='} ?"

        where = rows("")
        params = (ino, from_idx if only_idx is None else only_idx)
        # The dropped blocks that no row outside the dropped ones refers to.
        last = (f"SELECT d.block_id FROM blocks d WHERE {rows('d.')} AND NOT EXISTS"
                f" (SELECT 1 FROM blocks o WHERE o.block_id = d.block_id AND NOT ({rows('o.')}))")
        self._x(
            "INSERT INTO gc_queue (server_id, block_id, due, ino) SELECT c.server_id, c.block_id, ?, ? FROM chunks c"
            f" WHERE c.block_id IN ({last}) ON CONFLICT DO NOTHING",
            (self.clock() + self.gc_delay_s, ino, *params, *params),
        )
        self._x(f"DELETE FROM repairs WHERE block_id IN ({last})", params + params)
        self._x(f"DELETE FROM chunks WHERE block_id IN ({last})", params + params)
        self._x(f"DELETE FROM blocks WHERE {where}", params)
        self._x(f"DELETE FROM inline_blocks WHERE {where}", params)

    def _remove_inode(self, attrs: Attrs) -> None:
        self._drop_blocks(attrs.ino)
        self._x("DELETE FROM staged WHERE ino = ?", (attrs.ino,))
        self._x("DELETE FROM allocations WHERE ino = ?", (attrs.ino,))
        self._x("DELETE FROM xattrs WHERE ino = ?", (attrs.ino,))
        self._x("DELETE FROM inodes WHERE ino = ?", (attrs.ino,))

    def unlink(
        self, parts: list[str], ino: int = 0, only_if_empty: bool = False, *, caller: Caller | None = None,
        reader: int = 0,
    ) -> UnlinkReply:
        """Remove a name (and its file); returns the directory's attributes after the call and
        its ctime before (``wcc_data``, as ``create_file``).
        With ``ino``, only if the name still leads to that inode; with ``only_if_empty``, only
        if the file has no data yet and no handle but ``reader``'s holds it (how a writer that
        failed takes back the file it created, without touching anyone else's: another writer
        that opened it meanwhile may commit yet)."""
        if not parts:
            raise IsADirectory("/ is a directory")
        parent, attrs = self._walk(parts, caller)
        if attrs.kind == "dir":
            raise IsADirectory(f"/{'/'.join(parts)} is a directory (use rmdir)")
        access.require_removable(parent, attrs, caller, _p(parts), _p(parts[:-1]))
        if (ino and attrs.ino != ino) or (only_if_empty and (attrs.size or self._one(
                "SELECT 1 FROM blocks WHERE ino = ? UNION ALL SELECT 1 FROM inline_blocks WHERE ino = ?"
                " UNION ALL SELECT 1 FROM read_leases WHERE ino = ? AND reader <> ? AND expires > ? LIMIT 1",
                (attrs.ino, attrs.ino, attrs.ino, reader, self.clock())))):
            return UnlinkReply(directory=parent, directory_ctime_before=parent.ctime)
        now = self.clock()
        self._x("DELETE FROM names WHERE parent = ? AND name = ?", (parent.ino, parts[-1]))
        self._touch(parent.ino, now)
        self._drop_link(attrs, now)
        return UnlinkReply(directory=self._get(parent.ino), directory_ctime_before=parent.ctime)

    def unlink_many(self, directory: list[str], names: list[str], *, caller: Caller | None = None) -> UnlinkReply:
        """``unlink`` of each of ``names`` in ``directory``, in one operation (``rm -r`` of a
        directory of many files costs a call per page of names, not per name): the first
        failure is raised and, the operation being one transaction, none of them is removed.
        Returns the directory's attributes after and its ctime before (as ``unlink``)."""
        if len(names) > limits.unlink_batch_max:
            raise InvalidArgument(f"{len(names)} names: at most {limits.unlink_batch_max} per unlink_many")
        before = None
        for name in names:
            check_name(name)  # one component: no "/", ".", ".." or NUL
            reply = self.unlink([*directory, name], caller=caller)
            before = reply.directory_ctime_before if before is None else before
        return UnlinkReply(directory=self._resolve(directory, caller) if directory else self._get(ROOT_INO),
                           directory_ctime_before=before)

    def link(self, src: list[str], dst: list[str], *, caller: Caller | None = None) -> Attrs:
        """A second name ``dst`` for the file ``src`` (``link(2)``): any kind but a directory.
        A caller needs write and search permission on ``dst``'s directory, and the file must be
        one it may link (``access.require_linkable``: Linux's ``protected_hardlinks``)."""
        attrs = self._resolve(src, caller)
        # Linux's order: ENOENT, ENOTDIR, EEXIST of both paths before EPERM, EACCES (issue 52).
        if not dst:
            raise AlreadyExists("/ already exists")
        parent = self._parent_dir(dst, caller)
        check_name(dst[-1])
        if self._child(parent.ino, dst[-1]) is not None:
            raise AlreadyExists(f"{_p(dst)} already exists")
        access.require_linkable(attrs, caller, _p(src))
        access.require(parent, caller, W | X, path=_p(dst), on=_p(dst[:-1]))
        if attrs.kind == "dir":
            raise NotPermitted(f"{_p(src)} is a directory: directories have no hard links")
        if attrs.nlink >= limits.link_count_max:
            raise TooManyLinks(f"{_p(src)} has {attrs.nlink} names already (at most {limits.link_count_max})")
        now = self.clock()
        self._x("INSERT INTO names (parent, name, ino) VALUES (?, ?, ?)", (parent.ino, dst[-1], attrs.ino))
        self._x("UPDATE inodes SET nlink = nlink + 1, ctime = ? WHERE ino = ?", (now, attrs.ino))
        self._touch(parent.ino, now)
        return self._get(attrs.ino)

    def _drop_link(self, attrs: Attrs, now: float) -> None:
        """One name of the non-directory ``attrs`` is gone. Its last: the inode goes too,
        unless a handle still has it open (a lease: ``_held``); it then lives on with no name
        (nlink 0) until the last one is released or expires (``collect_orphans``)."""
        if attrs.nlink > 1 or self._held(attrs.ino, now):
            self._x("UPDATE inodes SET nlink = nlink - 1, ctime = ? WHERE ino = ? AND nlink > 0", (now, attrs.ino))
        else:
            self._remove_inode(attrs)

    def _held(self, ino: int, now: float) -> bool:
        """Whether an open handle holds ``ino`` (a live lease: every handle takes one at open).
        A writer's allocations do not count: a closed writer leaves unused ones behind."""
        return self._one("SELECT 1 FROM read_leases WHERE ino = ? AND expires > ?", (ino, now)) is not None

    def release(self, ino: int, reader: int, *, caller: Caller | None = None) -> None:
        """A handle closed: its lease ends, and a file it held after its last name went is removed."""
        self._x("DELETE FROM read_leases WHERE ino = ? AND reader = ?", (ino, reader))
        row = self._one(f"SELECT {_ATTR_COLUMNS} FROM inodes WHERE ino = ? AND nlink = 0 AND kind != 'd'", (ino,))
        if row is not None and not self._held(ino, self.clock()):
            self._remove_inode(_attrs(row))

    def release_leases(self, leases: list[tuple[int, int]], *, caller: Caller | None = None) -> None:
        """``release`` for each ``(ino, reader)``: handles closed in a batch."""
        for ino, reader in leases:
            self.release(ino, reader)

    def collect_orphans(self) -> int:
        """Remove the files that have no name left and that no handle holds any more
        (their holders crashed or their leases lapsed); returns how many."""
        now = self.clock()
        rows = self._all(f"SELECT {_ATTR_COLUMNS} FROM inodes WHERE nlink = 0 AND kind != 'd'")
        removed = 0
        for row in rows:
            attrs = _attrs(row)
            if not self._held(attrs.ino, now):
                self._remove_inode(attrs)
                removed += 1
        return removed

    def rmdir(self, parts: list[str], *, caller: Caller | None = None) -> UnlinkReply:
        """Remove an empty directory (DirectoryNotEmpty otherwise; never the root); answers its
        parent's attributes after and its ctime before, as ``unlink``."""
        if not parts:
            raise InvalidPath("cannot remove the root directory")
        parent, attrs = self._walk(parts, caller)
        access.require_removable(parent, _as_dir(attrs, parts), caller, _p(parts), _p(parts[:-1]))
        if self._one("SELECT 1 FROM names WHERE parent = ? LIMIT 1", (attrs.ino,)) is not None:
            raise DirectoryNotEmpty(f"/{'/'.join(parts)} is not empty")
        self._x("DELETE FROM names WHERE parent = ? AND name = ?", (attrs.parent, parts[-1]))
        self._touch(attrs.parent, self.clock(), nlink_delta=-1)
        self._remove_inode(attrs)
        return UnlinkReply(directory=self._get(parent.ino), directory_ctime_before=parent.ctime)

    def _check_not_into_itself(self, moving: Attrs, new_parent: Attrs, src: list[str]) -> None:
        if moving.kind != "dir":
            return
        ancestor = new_parent
        while True:
            if ancestor.ino == moving.ino:
                raise InvalidArgument(f"cannot move /{'/'.join(src)} into its own subtree")
            if ancestor.ino == ROOT_INO:
                return
            ancestor = self._get(ancestor.parent)

    def exchange(self, a: list[str], b: list[str], *, caller: Caller | None = None) -> None:
        """Atomically swap two existing entries (``renameat2(RENAME_EXCHANGE)``): the way to
        replace a non-empty directory (a checkpoint) without a moment where neither exists.
        A caller may move each entry out of its directory into the other's (``access.require_move``)."""
        if not a or not b:
            raise InvalidPath("cannot exchange the root directory")
        first_dir, second_dir = self._parent_dir(a, caller), self._parent_dir(b, caller)  # as rename: Linux's order
        first, second = self._entry(first_dir, a), self._entry(second_dir, b)
        if first.ino == second.ino:
            return
        access.require_move(first_dir, first, second_dir, caller, _p(a), _p(a[:-1]))
        access.require_move(second_dir, second, first_dir, caller, _p(b), _p(b[:-1]))
        self._check_not_into_itself(first, second_dir, a)
        self._check_not_into_itself(second, first_dir, b)
        now = self.clock()
        self._x("UPDATE names SET ino = ? WHERE parent = ? AND name = ?", (second.ino, first_dir.ino, a[-1]))
        self._x("UPDATE names SET ino = ? WHERE parent = ? AND name = ?", (first.ino, second_dir.ino, b[-1]))
        self._x("UPDATE inodes SET parent = ?, ctime = ? WHERE ino = ?", (second_dir.ino, now, first.ino))
        self._x("UPDATE inodes SET parent = ?, ctime = ? WHERE ino = ?", (first_dir.ino, now, second.ino))
        delta = (1 if first.kind == "dir" else 0) - (1 if second.kind == "dir" else 0)
        self._touch(first_dir.ino, now, nlink_delta=-delta if first_dir.ino != second_dir.ino else 0)
        if first_dir.ino != second_dir.ino:
            self._touch(second_dir.ino, now, nlink_delta=delta)

    def rename(
        self, src: list[str], dst: list[str], noreplace: bool = False, *, caller: Caller | None = None
    ) -> Attrs:
        """Atomically move ``src`` to ``dst``, replacing a file or an empty directory there.
        A caller may move ``src`` out of its directory (``access.require_move``) and add to or
        replace in ``dst``'s directory."""
        if not src or not dst:
            raise InvalidPath("cannot rename the root directory")
        # Linux's order: both directories before ``src``'s name; ``dst`` holding ``src``: ENOTEMPTY.
        src_parent = self._parent_dir(src, caller)
        dst_parent = self._parent_dir(dst, caller)
        check_name(dst[-1])
        moving = self._entry(src_parent, src)
        replaced_ino = self._child(dst_parent.ino, dst[-1])
        if replaced_ino is not None and noreplace:
            raise AlreadyExists(f"/{'/'.join(dst)} already exists")
        if src == dst:
            return moving
        self._check_not_into_itself(moving, dst_parent, src)
        if src[:len(dst)] == dst:
            raise DirectoryNotEmpty(f"{_p(dst)} is not empty: it holds {_p(src)}")
        replaced = None if replaced_ino is None else self._get(replaced_ino)
        if replaced is not None and replaced.ino == moving.ino:
            return moving
        access.require_move(src_parent, moving, dst_parent, caller, _p(src), _p(src[:-1]))
        if replaced is None:
            access.require(dst_parent, caller, W | X, path=_p(dst), on=_p(dst[:-1]))
        else:
            access.require_removable(dst_parent, replaced, caller, _p(dst), _p(dst[:-1]))
        now = self.clock()
        if replaced is not None:
            if moving.kind == "dir" and replaced.kind != "dir":
                raise NotADirectory(f"/{'/'.join(dst)} is not a directory")
            if moving.kind != "dir" and replaced.kind == "dir":
                raise IsADirectory(f"/{'/'.join(dst)} is a directory")
            if replaced.kind == "dir":
                if self._one("SELECT 1 FROM names WHERE parent = ? LIMIT 1", (replaced.ino,)) is not None:
                    raise DirectoryNotEmpty(f"/{'/'.join(dst)} is not empty")
                self._touch(dst_parent.ino, now, nlink_delta=-1)
            self._x("DELETE FROM names WHERE parent = ? AND name = ?", (dst_parent.ino, dst[-1]))
            if replaced.kind == "dir":
                self._remove_inode(replaced)
            else:
                self._drop_link(replaced, now)
        self._x("DELETE FROM names WHERE parent = ? AND name = ?", (src_parent.ino, src[-1]))
        self._x("INSERT INTO names (parent, name, ino) VALUES (?, ?, ?)", (dst_parent.ino, dst[-1], moving.ino))
        self._x("UPDATE inodes SET parent = ?, ctime = ? WHERE ino = ?", (dst_parent.ino, now, moving.ino))
        is_dir = 1 if moving.kind == "dir" else 0
        self._touch(src_parent.ino, now, nlink_delta=-is_dir)
        self._touch(dst_parent.ino, now, nlink_delta=is_dir)
        return self._get(moving.ino)

    def statfs(self, *, caller: Caller | None = None) -> StatfsReply:
        """Inodes, raw capacity and use of the live chunk servers, and what files can store in
        them under the root directory's policy (see ``messages.StatfsReply``)."""
        files, = self._one("SELECT COUNT(*) FROM inodes")
        live = self.live_servers()
        capacity, used = raw_capacity(live)  # each file system's free space once
        policy = parse_policy(self._get(ROOT_INO).policy)
        return StatfsReply(files=files, capacity=capacity, used=used, name_max=limits.name_length_max_bytes,
                           usable=capacity * policy.needed // policy.width,
                           usable_free=max(0, capacity - used) * policy.needed // policy.width, policy=str(policy))

    def close(self) -> None:
        """Close the connection; an open transaction is rolled back by the database."""
        self.conn.close()
