"""What a store statement changes, as the lease keys it invalidates (``server/meta/leases.py``).

Every statement that changes a name or an inode's attributes has one of the shapes below,
with its parameters where they say (``tests/test_leases.py`` checks the store's statements
against them): the service recalls what a change invalidates from every client holding it.
"""

from __future__ import annotations

from typing import Sequence

from tectofs.wire.leases import ATTRS, ENTRY, LISTING, LeaseKey

INODE_UPDATE = "UPDATE inodes SET"  # ... WHERE ino = ?: the inode is the last parameter
ATIME_UPDATE = "UPDATE inodes SET atime = ? WHERE"  # a read's access time: no lease covers it
NAME_INSERT = "INSERT INTO names (parent, name, ino)"  # parameters: parent, name, ino
NAME_DELETE = "DELETE FROM names WHERE parent = ? AND name = ?"  # parameters: parent, name
NAME_REPOINT = "UPDATE names SET ino = ? WHERE parent = ? AND name = ?"  # parameters: ino, parent, name


def changed_by(sql: str, params: Sequence[object]) -> list[LeaseKey]:
    """The lease keys statement ``sql`` with ``params`` invalidates (none for any other statement)."""
    if sql.startswith(INODE_UPDATE):
        return [] if sql.startswith(ATIME_UPDATE) else [(ATTRS, params[-1])]
    if sql.startswith(NAME_INSERT) or sql.startswith(NAME_DELETE):
        return [(ENTRY, params[0], params[1]), (LISTING, params[0])]
    if sql.startswith(NAME_REPOINT):
        return [(ENTRY, params[1], params[2]), (LISTING, params[1])]
    return []
