"""Extended attributes: small named values on an inode (``user.*``, ``trusted.*``,
``security.*``), so ``cp -a``, ``rsync -aX`` and ``tar --xattrs`` keep them. A mixin of
``SqlStore`` (see ``engine.py`` for the transaction contract); the inode's removal
(``engine._remove_inode``) removes its attributes.

Rules, as Linux applies them to a local filesystem without security modules:

- ``user.*``: reading and listing need read permission on the inode, setting and removing
  write permission; only regular files and directories carry them (others: EPERM).
- ``trusted.*``: root only, and hidden from others' listings.
- ``security.*``: anyone who may look the inode up reads them; only root or the owner sets
  or removes them.
- ``system.*`` (POSIX ACLs) and any other namespace: not supported (``tectofs.xattr_names``).

Bounds: a name of at most ``limits.xattr_name_max_bytes`` (ERANGE beyond, as Linux), a value of
at most ``limits.xattr_value_max_bytes`` (E2BIG), and all names of one inode together (NUL
separated) at most ``limits.xattr_names_max_bytes`` (ENOSPC), so a listing always fits a reply.
Values are stored as hex text: the SQL subset SQLite and PostgreSQL share has no common binary type.
"""

from __future__ import annotations

from .. import limits
from ..errors import (
    AlreadyExists,
    AttributeTooLarge,
    NoAttribute,
    NoSpace,
    NotPermitted,
)
from ..wire.values import Attrs
from ..xattr_names import NOT_KEPT, namespace_of
from . import access
from .access import Caller, R, W
from .base import StoreParts

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS xattrs (
        ino BIGINT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (ino, name))""",
]
FLAG_CREATE, FLAG_REPLACE = 1, 2  # XATTR_CREATE, XATTR_REPLACE of setxattr(2)


def _p(parts: list[str]) -> str:
    return "/" + "/".join(parts)


class ExtendedAttributes(StoreParts):
    def _xattr_target(self, parts: list[str], name: str, caller: Caller | None, writing: bool) -> Attrs:
        """The inode at ``parts`` once ``caller`` may read (or, ``writing``, change) ``name`` on it."""
        namespace = namespace_of(name)
        attrs = self._resolve(parts, caller)
        path = _p(parts)
        if namespace == "trusted.":
            if caller is not None and not caller.is_root:
                raise NotPermitted(f"{path}: only root reads and sets trusted.* attributes")
        elif namespace == "security.":
            if writing:
                access.require_owner(attrs, caller, path, "set its security.* attributes")
        else:
            if attrs.kind not in ("file", "dir"):
                raise NotPermitted(f"{path}: user.* attributes go on regular files and directories only")
            access.require(attrs, caller, W if writing else R, path=path)
        return attrs

    def getxattr(self, parts: list[str], name: str, *, caller: Caller | None = None) -> bytes:
        """The value of attribute ``name`` of the inode at ``parts``; NoAttribute if it has none."""
        attrs = self._xattr_target(parts, name, caller, writing=False)
        row = self._one("SELECT value FROM xattrs WHERE ino = ? AND name = ?", (attrs.ino, name))
        if row is None:
            raise NoAttribute(f"{_p(parts)} has no attribute {name!r}")
        return bytes.fromhex(row[0])

    def listxattr(self, parts: list[str], *, caller: Caller | None = None) -> list[str]:
        """The names a caller may see: all but ``trusted.*`` for others than root. Listing needs
        only the lookup (as on Linux)."""
        attrs = self._resolve(parts, caller)
        names = [row[0] for row in self._all("SELECT name FROM xattrs WHERE ino = ? ORDER BY name", (attrs.ino,))
                 if row[0] not in NOT_KEPT]  # (kept by a release before NOT_KEPT: no longer readable)
        if caller is not None and not caller.is_root:
            names = [n for n in names if not n.startswith("trusted.")]
        return names

    def setxattr(
        self, parts: list[str], name: str, value: bytes, flags: int = 0, *, caller: Caller | None = None
    ) -> None:
        """Set ``name`` to ``value``; ``flags``: ``FLAG_CREATE`` (fail if it exists),
        ``FLAG_REPLACE`` (fail if it does not)."""
        if len(value) > limits.xattr_value_max_bytes:
            raise AttributeTooLarge(f"extended attribute value of {len(value)} bytes: at most"
                                    f" {limits.xattr_value_max_bytes}")
        attrs = self._xattr_target(parts, name, caller, writing=True)
        ino = attrs.ino
        exists = self._one("SELECT 1 FROM xattrs WHERE ino = ? AND name = ?", (ino, name)) is not None
        if exists and flags & FLAG_CREATE:
            raise AlreadyExists(f"{_p(parts)} has an attribute {name!r} already")
        if not exists and flags & FLAG_REPLACE:
            raise NoAttribute(f"{_p(parts)} has no attribute {name!r} to replace")
        if not exists:
            used = sum(len(n.encode()) + 1 for (n,) in self._all("SELECT name FROM xattrs WHERE ino = ?", (ino,)))
            if used + len(name.encode()) + 1 > limits.xattr_names_max_bytes:
                raise NoSpace(f"{_p(parts)}: its attribute names would outgrow {limits.xattr_names_max_bytes} bytes")
        self._x(
            "INSERT INTO xattrs (ino, name, value) VALUES (?, ?, ?)"
            " ON CONFLICT (ino, name) DO UPDATE SET value = excluded.value",
            (ino, name, value.hex()),
        )
        self._x("UPDATE inodes SET ctime = ?, xattrs = xattrs + ? WHERE ino = ?", (self.clock(), 0 if exists else 1, ino))

    def removexattr(self, parts: list[str], name: str, *, caller: Caller | None = None) -> None:
        """Remove attribute ``name``; NoAttribute if there is none."""
        attrs = self._xattr_target(parts, name, caller, writing=True)
        if not self._x("DELETE FROM xattrs WHERE ino = ? AND name = ?", (attrs.ino, name)).rowcount:
            raise NoAttribute(f"{_p(parts)} has no attribute {name!r}")
        self._x("UPDATE inodes SET ctime = ?, xattrs = xattrs - 1 WHERE ino = ?", (self.clock(), attrs.ino))
