"""What an open file needs from the client that opened it, and nothing more.

``AsyncFile`` (``client/files.py``) used to hold the whole ``AsyncFileSystem`` and reach into
it for five things; the file system and its files imported each other (and the lease batcher
imported the file system back). A :class:`FileContext` names those things: the file system
builds one for each ``open`` (a view acting for another user hands out its own metadata
client and uid), and the file depends on this module only. ``core -> files -> context`` and
``core -> leases`` are then the only edges: no cycle at run time nor for the type checker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from tectofs.buffers import BufferPool
from tectofs.metrics import ClientMetrics
from tectofs.wire.values import LayoutSegment

from .blocks import BlockIO
from .leases import LeaseEndings
from .metadata import MetadataClient


@dataclass(frozen=True, slots=True)
class FileContext:
    """The services an open file uses, all shared with the client that opened it.

    - ``metadata``: layout, allocate, stage, renew, commit and unlink calls, made as the
      opening user (a view's own connection);
    - ``blocks``: encode, put and read blocks on chunk servers (shared by every view);
    - ``buffers``: block buffers (the process's pool; what the file takes it gives back);
    - ``metrics``: the process's client metrics (bytes written and read, retries);
    - ``lease_endings``: where a closing handle queues its reader lease to be ended,
      sent as ``acting_uid`` (None: the client's own user);
    - ``park_reader``: where a closing read-only handle may leave its reader lease for the
      next open instead (``MetadataCache.park_reader(layout, uid, reader, since)``: True if
      kept; None: a client without a metadata cache)."""

    metadata: MetadataClient
    blocks: BlockIO
    buffers: BufferPool
    metrics: ClientMetrics
    lease_endings: LeaseEndings
    acting_uid: int | None = None
    park_reader: Callable[[LayoutSegment, int | None, int, float], bool] | None = None
