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

Results are stored as msgpack (msgspec), exactly as the store operation returned them (a
reply Struct, a list of them, a number...), and a replay decodes them with the type the caller
names (``StoreRunner.call(..., returns=...)``), so a retry gets the same typed value.

Records made before typed results (a release whose store returned dicts and tuples, tuples
wrapped in msgpack extension 1) are read compatibly by :func:`decode`: the old dict of an
``Attrs``, a layout or an allocation has the fields of today's Struct; an old tuple
(``create_file``'s ``(attrs, created, directory, ctime)``, ``unlink``'s ``(directory, ctime)``) is
read as the fields of the reply Struct in order, and a shorter one (an older release's) leaves
the rest at their defaults. A record that still cannot be read is *not* taken as absent: the
operation it records did happen (it committed with its record), and running it again could
do it twice (a second file, a rename of what is now elsewhere). The retry is answered
:class:`~tectofs.errors.TectofsError` ("the reply of this call was lost") instead, and the
client reports the failure of a call that may have succeeded, as after any lost reply. Records
are pruned after ``limits.request_dedupe_retention_s``, so this can only meet a retry that
straddles the upgrade.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ..errors import TectofsError

if TYPE_CHECKING:
    from .engine import SqlStore

ResultT = TypeVar("ResultT")

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS requests (
        request_key TEXT PRIMARY KEY, reply BYTEA NOT NULL, created DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS requests_created ON requests (created)",
]

_LEGACY_TUPLE = 1  # msgpack extension type code of a tuple, in records of releases before typed results


class Absent:
    """What ``lookup`` returns for a key never recorded (a type of its own, so that
    ``lookup(...)`` is ``ResultT | Absent`` to the type checker)."""


ABSENT = Absent()
_ENCODER = msgspec.msgpack.Encoder()


_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}  # by type: a handful, one per kind of reply


def _decoder(returns: Any) -> msgspec.msgpack.Decoder[Any]:
    decoder = _DECODERS.get(returns)
    if decoder is None:
        decoder = _DECODERS[returns] = msgspec.msgpack.Decoder(returns)
    return decoder


def _legacy_ext(code: int, data: memoryview) -> Any:
    if code != _LEGACY_TUPLE:
        raise ValueError(f"unknown msgpack extension {code} in a recorded reply")
    return list(_LEGACY_DECODER.decode(data))


_LEGACY_DECODER = msgspec.msgpack.Decoder(ext_hook=_legacy_ext)


def encode(result: object) -> bytes:
    """``result`` (what a store operation returned: Structs, lists, numbers, bytes, None) as bytes."""
    return _ENCODER.encode(result)


def decode(data: bytes, returns: type[ResultT]) -> ResultT:
    """What :func:`encode` was given, as ``returns``; a record of a release before typed results
    read compatibly (see the module's docstring), else :class:`TectofsError`."""
    try:
        result: ResultT = _decoder(returns).decode(data)
        return result
    except (msgspec.DecodeError, msgspec.ValidationError):
        pass
    try:
        legacy = _LEGACY_DECODER.decode(data)
        if (isinstance(legacy, list) and isinstance(returns, type) and issubclass(returns, msgspec.Struct)
                and not returns.__struct_config__.array_like):
            legacy = dict(zip(returns.__struct_fields__, legacy))  # an old tuple: the reply's fields in order
        converted: ResultT = msgspec.convert(legacy, returns)
        return converted
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise TectofsError(
            f"the reply of this call was recorded by an earlier release and cannot be read ({exc}); the call did"
            " happen: check its outcome before trying again"
        ) from None


def create_schema(store: "SqlStore") -> None:
    """Create the table if missing (in its own transaction)."""
    store.tx_begin()
    for statement in SCHEMA:
        store._x(statement)
    store.tx_commit()


def lookup(store: "SqlStore", key: str, returns: type[ResultT]) -> ResultT | Absent:
    """The recorded result of ``key`` as ``returns``, or :data:`ABSENT`."""
    row = store._one("SELECT reply FROM requests WHERE request_key = ?", (key,))
    return ABSENT if row is None else decode(bytes(row[0]), returns)


def record(store: "SqlStore", key: str, result: object, now: float) -> None:
    """Record ``result`` under ``key``, in the caller's transaction (with the change it made)."""
    store._x("INSERT INTO requests (request_key, reply, created) VALUES (?, ?, ?)", (key, encode(result), now))


def prune(store: "SqlStore", before: float) -> int:
    """Delete records made before ``before``, in the caller's transaction; returns how many."""
    return int(store._x("DELETE FROM requests WHERE created < ?", (before,)).rowcount or 0)
