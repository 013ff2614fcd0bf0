"""The record a history checker reads: who called what on the shared tree, when, and what came back.

A **history** is what several clients (mounts, library clients, the S3 gateway, fsspec) on
several hosts did to one small shared tree: each :class:`Operation` names its client, its kind
(one of :data:`KINDS`), its arguments, the time it was invoked and the time it completed
(``None``: never, as far as anyone knows: the client crashed or the call timed out), and its
result: a value (``read``: bytes; ``list``: sorted names; ``stat``: a :func:`stat_summary`;
``getxattr``: bytes; the rest: ``None``) or the errno's name (``"ENOENT"``).

Each :class:`Client` says what it is (``kind``: one of :data:`CLIENT_KINDS`; the calls it can
make and the fields it can observe follow from it, ``tectofs.testing.namespace_model``), its
host, and the rules its guarantees depend on: when it was killed (``crashed_at``), how long an
acknowledged change of its may stay lost in a crash (``durability_window_s``: 0.05 for a mount
with async creates, else 0), how stale its cached answers may be (``stale_window_s``: a mount
with ``--no-leases`` caches for its ``--attr-timeout``), and how far its clock may be off the
others' (``clock_error_s``).

Times are seconds on one clock shared by all clients (virtual time in the simulator; on real
hosts ``time.time()`` with each client's ``clock_error_s`` its NTP bound). A history is saved as
JSON (:meth:`History.save`, :meth:`History.load`; format version :data:`FORMAT_VERSION`), with
the seed and the command line that reproduce the run (``seed``, ``replay``) printed with any
violation. :class:`Recorder` wraps calls and records them.

JSON: ``{"version": 1, "seed": 7, "replay": "...", "initial": {"/d": null, "/d/f": {"b64": ""}},
"clients": [{"id": "c0", "kind": "mount", "host": "h0", ...}], "operations": [{"id": 0,
"client": "c0", "kind": "write", "args": {"path": "/d/f", "data": {"b64": "aGk="}},
"invoke": 0.5, "complete": 0.51, "value": null, "error": null}]}``: bytes anywhere are
``{"b64": ...}``; the initial tree maps each path to ``null`` (a directory) or its bytes.
"""

from __future__ import annotations

import base64
import errno
import json
import os
import stat as stat_module
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Union

FORMAT_VERSION = 1

#: Operation kinds, each modelled by ``namespace_model.apply`` (whose docstring is their contract).
KINDS = ("create", "write", "append", "read", "stat", "list", "rename", "link", "unlink", "chmod", "chown",
         "truncate", "mkdir", "rmdir", "setxattr", "getxattr", "fsync")
#: Kinds that change nothing (their results are what a cache may answer stale).
READ_KINDS = frozenset({"read", "stat", "list", "getxattr"})
CLIENT_KINDS = ("mount", "library", "s3", "fsspec")
#: What ``stat`` answers, as compared: permission bits only in ``mode``; ``size`` of files only.
STAT_FIELDS = ("kind", "mode", "uid", "gid", "nlink", "size")

Arg = Union[str, int, bytes]
StatValue = dict[str, Union[str, int]]
Value = Union[None, bytes, list[str], StatValue]


class BadHistory(ValueError):
    """The record itself is wrong (unknown kind or client, a call its client cannot make, bad JSON)."""


@dataclass(frozen=True)
class Client:
    id: str
    kind: str = "library"
    host: str = "h0"
    crashed_at: float | None = None
    durability_window_s: float = 0.0
    stale_window_s: float = 0.0
    clock_error_s: float = 0.0


@dataclass(frozen=True)
class Operation:
    id: int
    client: str
    kind: str
    args: Mapping[str, Arg]
    invoke: float
    complete: float | None
    value: Value = None
    error: str | None = None

    @property
    def unknown(self) -> bool:
        """Whether nobody knows if (and when) it took effect: it never completed."""
        return self.complete is None

    def paths(self) -> list[str]:
        return [str(self.args[name]) for name in ("path", "dest") if name in self.args]

    def describe(self) -> str:
        shown = []
        for name, arg in self.args.items():
            shown.append(f"{name}={_short(arg)}" if name not in ("path", "dest") else str(arg))
        return f"{self.kind}({', '.join(shown)})"

    def outcome(self) -> str:
        if self.unknown:
            return "unknown (no answer)"
        return self.error if self.error is not None else ("ok" if self.value is None else _short(self.value))


def _short(value: object, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass
class History:
    clients: dict[str, Client] = field(default_factory=dict)
    operations: list[Operation] = field(default_factory=list)
    initial: dict[str, bytes | None] = field(default_factory=dict)  # path -> bytes, or None: a directory
    seed: int | None = None
    replay: str = ""

    def client(self, client_id: str, kind: str = "library", host: str = "h0", **rules: float) -> Client:
        """Declare a client (``rules``: ``crashed_at``, ``durability_window_s``, ``stale_window_s``, ``clock_error_s``)."""
        if kind not in CLIENT_KINDS:
            raise BadHistory(f"client {client_id}: kind {kind!r} is none of {', '.join(CLIENT_KINDS)}")
        made = Client(client_id, kind, host, **rules)  # type: ignore[arg-type]
        self.clients[client_id] = made
        return made

    def add(self, client: str, kind: str, invoke: float, complete: float | None, result: Value = None,
            error: str | None = None, **args: Arg) -> Operation:
        """Append one operation (ids count up from 0) and return it: ``result`` is its value."""
        op = Operation(len(self.operations), client, kind, dict(args), invoke, complete, result, error)
        self.operations.append(op)
        return op

    def crash(self, client_id: str, at: float) -> None:
        self.clients[client_id] = replace(self.clients[client_id], crashed_at=at)

    def validate(self) -> None:
        ids = set()
        for op in self.operations:
            if op.client not in self.clients:
                raise BadHistory(f"operation {op.id}: unknown client {op.client!r}")
            if op.kind not in KINDS:
                raise BadHistory(f"operation {op.id}: unknown kind {op.kind!r}")
            if op.complete is not None and op.complete < op.invoke:
                raise BadHistory(f"operation {op.id}: completes at {op.complete} before its invoke at {op.invoke}")
            if op.id in ids:
                raise BadHistory(f"operation id {op.id} appears twice")
            ids.add(op.id)
            for path in op.paths():
                if not path.startswith("/"):
                    raise BadHistory(f"operation {op.id}: path {path!r} is not absolute")

    # ------------------------------------------------------------------ JSON

    def to_json(self) -> dict[str, object]:
        return {
            "version": FORMAT_VERSION, "seed": self.seed, "replay": self.replay,
            "initial": {path: None if data is None else _encode(data) for path, data in self.initial.items()},
            "clients": [vars(client).copy() for client in self.clients.values()],
            "operations": [{"id": op.id, "client": op.client, "kind": op.kind,
                            "args": {name: _encode(arg) for name, arg in op.args.items()},
                            "invoke": op.invoke, "complete": op.complete, "value": _encode(op.value),
                            "error": op.error} for op in self.operations],
        }

    @classmethod
    def from_json(cls, data: object) -> History:
        try:
            assert isinstance(data, dict), "a JSON object"
            if data.get("version") != FORMAT_VERSION:
                raise BadHistory(f"format version {data.get('version')!r}, expected {FORMAT_VERSION}")
            history = cls(seed=data.get("seed"), replay=str(data.get("replay") or ""))
            for path, encoded in dict(data.get("initial") or {}).items():
                history.initial[str(path)] = None if encoded is None else _bytes(_decode(encoded))
            for client in data["clients"]:
                client = dict(client)
                client_id = str(client.pop("id"))
                history.client(client_id, str(client.pop("kind", "library")), str(client.pop("host", "h0")),
                               **{name: float(v) for name, v in client.items() if v is not None})
            for op in data["operations"]:
                args = {str(name): _arg(_decode(arg)) for name, arg in dict(op.get("args") or {}).items()}
                complete = op.get("complete")
                history.operations.append(Operation(
                    int(op["id"]), str(op["client"]), str(op["kind"]), args, float(op["invoke"]),
                    None if complete is None else float(complete), _value(_decode(op.get("value"))),
                    None if op.get("error") is None else str(op["error"])))
        except BadHistory:
            raise
        except (AssertionError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadHistory(f"not a history: {exc!r}") from exc
        history.validate()
        return history

    def save(self, path: str | os.PathLike[str]) -> None:
        with open(path, "w") as file:
            json.dump(self.to_json(), file, indent=1)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> History:
        try:
            with open(path) as file:
                data = json.load(file)
        except (OSError, json.JSONDecodeError) as exc:
            raise BadHistory(f"{path}: {exc}") from exc
        return cls.from_json(data)


def _encode(value: object) -> object:
    if isinstance(value, bytes):
        return {"b64": base64.b64encode(value).decode()}
    if isinstance(value, dict):
        return {"stat": dict(value)}
    return value


def _decode(value: object) -> object:
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(str(value["b64"]))
    if isinstance(value, dict) and set(value) == {"stat"}:
        return {str(k): v for k, v in dict(value["stat"]).items()}
    return value


def _bytes(value: object) -> bytes:
    if not isinstance(value, bytes):
        raise BadHistory(f"expected bytes ({{'b64': ...}}), got {value!r}")
    return value


def _arg(value: object) -> Arg:
    if isinstance(value, (str, int, bytes)) and not isinstance(value, bool):
        return value
    raise BadHistory(f"argument {value!r} is not a string, an integer or bytes")


def _value(value: object) -> Value:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, list):
        return [str(name) for name in value]
    if isinstance(value, dict):
        return {str(k): v if isinstance(v, str) else int(v) for k, v in value.items()}
    raise BadHistory(f"result {value!r} is none of null, bytes, a list of names or a stat")


# ---------------------------------------------------------------------- recording real calls

#: Errors after which nobody knows whether the call took effect: recorded as unknown.
UNKNOWN_ERRNOS = frozenset({errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED, errno.ENOTCONN, errno.EIO,
                            errno.EPIPE, errno.ESHUTDOWN})


def stat_summary(result: os.stat_result) -> StatValue:
    """What the checker compares of an ``os.stat`` answer (a recorder's ``normalize`` for ``stat``)."""
    kind = "dir" if stat_module.S_ISDIR(result.st_mode) else "file"
    summary: StatValue = {"kind": kind, "mode": stat_module.S_IMODE(result.st_mode), "uid": result.st_uid,
                          "gid": result.st_gid, "nlink": result.st_nlink}
    if kind == "file":
        summary["size"] = result.st_size
    return summary


class Recorder:
    """Records calls into ``history`` from any number of threads: ``call`` notes the time,
    runs ``fn``, notes the time again and its result. An ``OSError`` is the answer (its errno's
    name) unless it is one of :data:`UNKNOWN_ERRNOS` (or any other exception): then the call's
    effect is unknown and it is recorded as never completed. ``clock``: seconds on the clock
    all the history's clients share."""

    def __init__(self, history: History, clock: Callable[[], float] = time.time) -> None:
        self.history = history
        self.clock = clock
        self._lock = threading.Lock()

    def call(self, client: str, kind: str, fn: Callable[[], object], normalize: Callable[[object], Value] | None = None,
             **args: Arg) -> Operation:
        if kind not in KINDS:
            raise BadHistory(f"unknown kind {kind!r}")
        invoke = self.clock()
        value: Value = None
        error: str | None = None
        complete: float | None
        try:
            raw = fn()
        except OSError as exc:
            complete = None if exc.errno in UNKNOWN_ERRNOS or exc.errno is None else self.clock()
            error = None if complete is None else errno.errorcode.get(exc.errno or 0, f"E{exc.errno}")
        except Exception:  # noqa: BLE001 - the call's fate is unknown; the recording goes on
            complete = None
        else:
            complete = self.clock()
            value = normalize(raw) if normalize is not None else _value(raw)
        with self._lock:
            return self.history.add(client, kind, invoke, complete, value, error, **args)
