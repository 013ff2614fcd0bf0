"""``tectofs://HOST:PORT/path`` URIs and one cached client connection per address per process."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tectofs.wire.transport import parse_group

from . import paths
from .errors import InvalidArgument

if TYPE_CHECKING:  # the client itself is imported at the first connection: importing this module stays cheap
    from tectofs.client import FileSystem

SCHEME = "tectofs"
PREFIX = SCHEME + "://"


@dataclass(frozen=True)
class Location:
    """A parsed URI: ``address`` is ``HOST:PORT`` (``None``: the client's default,
    ``$TECTOFS_META``), ``path`` an absolute, validated tectofs path."""

    address: str | None
    path: str

    def uri(self, path: str | None = None) -> str:
        return f"{PREFIX}{self.address or ''}{path if path is not None else self.path}"

    def child(self, name: str) -> "Location":
        return Location(self.address, paths.join(self.path, paths.check_name(name)))

    @property
    def parent(self) -> str:
        parts = paths.split(self.path)
        return "/" + "/".join(parts[:-1])

    @property
    def name(self) -> str:
        parts = paths.split(self.path)
        return parts[-1] if parts else ""


def is_uri(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(PREFIX)


def parse(uri: str | os.PathLike) -> Location:
    """``"tectofs://10.0.0.1:7000/runs/a/step_100"`` -> ``Location("10.0.0.1:7000", "/runs/a/step_100")``.

    ``tectofs:///path`` (empty authority) means the client's default address; the authority may
    be a failover group of metadata services (``tectofs://A:7420,B:7420/path``). Paths are
    checked with the same rules as the metadata service (no ``..``, no empty names)."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri.startswith(PREFIX):
        raise InvalidArgument(f"not a tectofs URI (expected {PREFIX}HOST:PORT/path): {uri!r}")
    rest = uri[len(PREFIX):]
    slash = rest.find("/")
    authority, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    if authority:
        try:
            parse_group(authority)  # HOST:PORT, or a failover group HOST:PORT,HOST:PORT
        except InvalidArgument as exc:
            raise InvalidArgument(f"bad address in {uri!r}: {exc}") from None
    parts = paths.split(path)
    return Location(authority or None, "/" + "/".join(parts))


_lock = threading.Lock()
_connections: dict[tuple[int, str | None], FileSystem] = {}  # (pid, address) -> its connection


def filesystem(address: str | None) -> FileSystem:
    """The process-wide :class:`tectofs.client.FileSystem` for ``address`` (thread-safe; a
    forked child gets its own connection, never its parent's sockets)."""
    key = (os.getpid(), address)
    fs = _connections.get(key)
    if fs is not None:
        return fs
    with _lock:
        fs = _connections.get(key)
        if fs is None:
            import tectofs.client

            fs = tectofs.client.connect(address)
            _connections[key] = fs
        return fs


def resolve(uri: str | os.PathLike) -> tuple[FileSystem, Location]:
    """``uri``'s process-wide connection (:func:`filesystem`) and its parsed location."""
    loc = parse(uri)
    return filesystem(loc.address), loc


def close_all() -> None:
    """Close the cached connections of this process (tests, shutdown)."""
    with _lock:
        items = [(k, v) for k, v in _connections.items() if k[0] == os.getpid()]
        for key, fs in items:
            _connections.pop(key, None)
            try:
                fs.close()
            except Exception:
                pass
