"""Exactly-once non-idempotent calls: each one's result, recorded with the change it made.

A client retries a non-idempotent call (create, rename, commit, ...) after a lost connection
or a failover to another metadata service with the same call id (``tectofs.wire.server``). The
metadata service keys each store operation such a call runs by ``"<call id hex>:<step>"``
(``tectofs.wire.server.Call.next_key``) and hands the key to the store runner
(``StoreRunner.call(..., request_key=...)``), which, inside the operation's own savepoint,
first looks the key up here: a recorded result is returned as it was (the operation is not run again);
otherwise the operation runs and its result is inserted in the same savepoint, so the change
and its record commit together or not at all. Failed operations change nothing and are not
recorded: a retry runs them again.

Two metadata services running one call at once (a retry racing the original) both insert
the key; PostgreSQL (SERIALIZABLE) aborts one transaction, which the runner runs again and
which then finds the record. SQLite has one writer.

Records are kept ``limits.request_dedupe_retention_s`` (longer than a client retries one
call: ``rpc_retries_max`` + 1 timeouts and backoffs), then pruned.

Results are stored as msgpack (msgspec). msgpack has one array type, so tuples are wrapped
in an extension type and come back as tuples: ``create_file`` answers ``(attrs, created)``
and a replay answers exactly that, not a list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from .engine import SqlStore

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS requests (
        request_key TEXT PRIMARY KEY, reply BYTEA NOT NULL, created DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS requests_created ON requests (created)",
]

_TUPLE = 1  # msgpack extension type code of a tuple
ABSENT = object()  # what ``lookup`` returns for a key never recorded


def _wrap(value: Any) -> Any:
    if isinstance(value, tuple):
        return msgspec.msgpack.Ext(_TUPLE, _ENCODER.encode([_wrap(v) for v in value]))
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, dict):
        return {k: _wrap(v) for k, v in value.items()}
    return value


def _ext(code: int, data: memoryview) -> Any:
    if code != _TUPLE:
        raise ValueError(f"unknown msgpack extension {code} in a recorded reply")
    return tuple(_DECODER.decode(data))


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(ext_hook=_ext)


def encode(result: Any) -> bytes:
    """``result`` (plain data: None, bools, numbers, str, bytes, lists, tuples, dicts) as bytes."""
    return _ENCODER.encode(_wrap(result))


def decode(data: bytes) -> Any:
    """What :func:`encode` was given, tuples as tuples."""
    return _DECODER.decode(data)


def create_schema(store: "SqlStore") -> None:
    """Create the table if missing (in its own transaction)."""
    store.tx_begin()
    for statement in SCHEMA:
        store._x(statement)
    store.tx_commit()


def lookup(store: "SqlStore", key: str) -> Any:
    """The recorded result of ``key``, or :data:`ABSENT`."""
    row = store._one("SELECT reply FROM requests WHERE request_key = ?", (key,))
    return ABSENT if row is None else decode(bytes(row[0]))


def record(store: "SqlStore", key: str, result: Any, now: float) -> None:
    """Record ``result`` under ``key``, in the caller's transaction (with the change it made)."""
    store._x("INSERT INTO requests (request_key, reply, created) VALUES (?, ?, ?)", (key, encode(result), now))


def prune(store: "SqlStore", before: float) -> int:
    """Delete records made before ``before``, in the caller's transaction; returns how many."""
    return int(store._x("DELETE FROM requests WHERE created < ?", (before,)).rowcount or 0)
