"""Database dialects: how to connect and how each database spells the few things that differ."""

from __future__ import annotations

import sqlite3
from typing import Any

from .. import private_files
from ..errors import InvalidArgument


class Dialect:
    """What the SQL engine needs to know about one database."""

    name = "abstract"
    placeholder = "?"
    begin_statement = "BEGIN"

    def connect(self) -> Any:
        raise NotImplementedError

    def is_retryable(self, exc: BaseException) -> bool:
        """True for errors that mean "the transaction may succeed if run again"."""
        return False

    def sql(self, text: str) -> str:
        """Rewrite the engine's ``?`` placeholders into this dialect's."""
        return text if self.placeholder == "?" else text.replace("?", self.placeholder)


class SqliteDialect(Dialect):
    """SQLite in WAL mode with ``synchronous=NORMAL``: a commit is durable against process
    crashes at once and against power loss at the next checkpoint, at ~16k commits/s here
    (the group commit in :mod:`tectofs.store.runner` multiplies that)."""

    name = "sqlite"

    def __init__(self, path: str) -> None:
        self.path = path

    def connect(self) -> sqlite3.Connection:
        """A connection to the store; the store's files (the database, its WAL and shared-memory
        index, which SQLite creates with the database's permissions) are its owner's alone
        (``tectofs.private_files``)."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        for path in (self.path, f"{self.path}-wal", f"{self.path}-shm"):
            private_files.owner_only(path, private_files.FILE_MODE)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # Debian's SQLite zeroes every page a delete frees (SECURE_DELETE): an unlinked small
        # file's inline bytes were written again as zeros. FAST zeroes deleted content only in
        # pages the change writes anyway; freed pages keep their bytes until reused, as a
        # chunk server's filesystem keeps a deleted chunk's. Half the store's CPU per unlink.
        conn.execute("PRAGMA secure_delete=FAST")
        conn.execute("PRAGMA foreign_keys=OFF")
        conn.execute("PRAGMA cache_size=-65536")
        return conn

    def is_retryable(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)


class PostgresDialect(Dialect):
    """PostgreSQL through psycopg 3, for metadata services spread over several hosts.

    Transactions are SERIALIZABLE: several metadata services may serve one store, and a
    conflict between them aborts one transaction (SQLSTATE 40001), which the store runner
    runs again."""

    name = "postgresql"
    placeholder = "%s"
    begin_statement = "BEGIN ISOLATION LEVEL SERIALIZABLE"

    def __init__(self, url: str) -> None:
        self.url = url

    def connect(self) -> Any:
        try:
            import psycopg  # type: ignore[import-not-found]
        except ImportError:
            raise InvalidArgument("the PostgreSQL store needs psycopg: pip install 'psycopg[binary]'") from None
        return psycopg.connect(self.url, autocommit=True)

    def is_retryable(self, exc: BaseException) -> bool:
        return getattr(exc, "sqlstate", None) in ("40001", "40P01")


def dialect_for(url: str) -> Dialect:
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresDialect(url)
    if url.startswith("sqlite:///"):
        return SqliteDialect(url[len("sqlite:///") - 1 :])
    if "://" in url:
        raise InvalidArgument(f"unknown metadata store URL {url!r}: use a file path or postgresql://...")
    return SqliteDialect(url)
