"""The tectofs client library.

    import tectofs.client
    fs = tectofs.client.connect("127.0.0.1:7420")
    with fs.open("/ckpt/step-100/model.bin", "wb") as f:   # striped, erasure coded
        f.write(data)                                     # visible to others at close
    fs.read_bytes("/ckpt/step-100/model.bin")

Metadata goes to the metadata service; data goes straight to chunk servers, in parallel.
:class:`AsyncFileSystem` is the async core; :class:`FileSystem` is its blocking facade.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core import AsyncFileSystem, Stat
    from .files import AsyncFile
    from .sync import FileSystem, RawFile

DEFAULT_ADDRESS_ENV = "TECTOFS_META"

# The package's names are imported when first used, not with the package: a chunk server
# imports ``tectofs.client.metadata`` and ``.blocks`` only, and the whole client took 0.15 s of
# each server process's start (``python -X importtime``).
_EXPORTED_FROM = {"AsyncFileSystem": "core", "Stat": "core", "AsyncFile": "files", "FileSystem": "sync",
                  "RawFile": "sync"}


def __getattr__(name: str) -> Any:
    module = _EXPORTED_FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def connect(address: str | None = None, credentials: str | None = None, leases: bool = False) -> FileSystem:
    """Connect to the metadata service at ``HOST:PORT`` (default: ``$TECTOFS_META``) as the
    user of ``credentials`` (a credential file; default ``$TECTOFS_CREDENTIALS``, else the one
    ``tectofs up`` wrote for this address: ``tectofs.wire.auth.find_credential``). ``leases``:
    hold metadata leases and answer stats and extended attributes from a cache while they last
    (``client/metadata_cache.py``; another client's change is seen at the next call all the same)."""
    address = address or os.environ.get(DEFAULT_ADDRESS_ENV)
    if not address:
        raise ValueError(f"no metadata service address: pass HOST:PORT or set {DEFAULT_ADDRESS_ENV}")
    from .sync import FileSystem

    return FileSystem(address, credentials, leases)


__all__ = ["AsyncFile", "AsyncFileSystem", "FileSystem", "RawFile", "Stat", "connect"]
