"""The metadata store: one interface, one SQL engine, thin dialects.

Modelled on JuiceFS (``pkg/meta/interface.go`` + ``sql.go`` + ``sql_sqlite.go``):
:class:`~tectofs.store.engine.SqlStore` implements every namespace and block-map operation
once over a DB-API connection, and a :class:`~tectofs.store.dialect.Dialect` only says how to
connect, how to spell placeholders, and which errors mean "retry". SQLite is the default;
a PostgreSQL dialect plugs in the same way.

Tables mirror Tectonic's layers: ``names`` (parent, name -> inode), ``inodes`` (attributes),
``blocks`` (file -> blocks) and ``chunks`` (block -> chunk servers).

:func:`open_store` picks the dialect from a URL: a plain path or ``sqlite:///path`` for
SQLite, ``postgresql://...`` for PostgreSQL.
"""

from __future__ import annotations

from .engine import SqlStore
from .runner import StoreRunner


def open_store(url: str) -> SqlStore:
    from .dialect import dialect_for

    return SqlStore(dialect_for(url))


__all__ = ["SqlStore", "StoreRunner", "open_store"]
