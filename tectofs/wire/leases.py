"""The messages of metadata leases (``server/meta/leases.py`` says how leases work)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from tectofs import limits
from tectofs.wire.values import Id, Ino, Message

SESSION_BYTES = 16  # a lease session id: random, chosen by the client, said in its hellos


class Recall(Message, frozen=True, kw_only=True):
    """The holder must stop answering anything about ``inos`` from its cache (the names in
    those that are directories, and their attributes, extended attributes, targets), then
    acknowledge ``id`` in its next keepalive."""

    id: Id
    inos: Annotated[list[Ino], msgspec.Meta(max_length=limits.lease_recall_inodes_max)]


class KeepaliveRequest(Message, frozen=True, kw_only=True):
    """Keep the session of this connection's hello alive; ``acked``: the recalls done since the
    last keepalive; ``wait_s``: how long the service may hold the call for a recall; ``end``:
    the client is going, its leases with it (answered at once)."""

    acked: Annotated[list[Id], msgspec.Meta(max_length=limits.lease_recalls_per_reply_max * 4)] = []
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=limits.lease_keepalive_wait_s)] = 0.0
    end: bool = False


class KeepaliveReply(Message, frozen=True, kw_only=True):
    """``renewed``: the session's leases last ``lease_s`` from when the keepalive was sent (not
    renewed while a recall is outstanding); ``restarted``: the service did not know the session
    (new, expired, or the service restarted): nothing cached before this reply may be trusted;
    ``recalls``: due, oldest first (more may follow in the next reply)."""

    lease_s: float
    renewed: bool
    restarted: bool
    recalls: Annotated[list[Recall], msgspec.Meta(max_length=limits.lease_recalls_per_reply_max)] = []
