"""The messages of metadata leases (``server/meta/leases.py`` says how leases work)."""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from tectofs import limits
from tectofs.wire.operation import Operation
from tectofs.wire.values import Id, Ino, Message, Name

SESSION_BYTES = 16  # a lease session id: random, chosen by the client, said in its hellos


class Entry(Message, frozen=True, array_like=True):
    """One name of a directory."""

    parent: Ino
    name: Name


class Recall(Message, frozen=True, kw_only=True):
    """The holder must stop answering from its cache about: the attributes (extended
    attributes, target, inline data) of ``inos``; the names ``entries`` (present or absent);
    the complete listings of the directories ``listings``; send the creates it has not sent yet in
    the directories ``claims`` and stop creating there without a call (``tectofs.wire.claims``);
    then acknowledge ``id`` in its next keepalive."""

    id: Id
    inos: Annotated[list[Ino], msgspec.Meta(max_length=limits.lease_recall_keys_max)] = []
    entries: Annotated[list[Entry], msgspec.Meta(max_length=limits.lease_recall_keys_max)] = []
    listings: Annotated[list[Ino], msgspec.Meta(max_length=limits.lease_recall_keys_max)] = []
    claims: Annotated[list[Ino], msgspec.Meta(max_length=limits.lease_recall_keys_max)] = []


class KeepaliveRequest(Message, frozen=True, kw_only=True):
    """Keep the session of this connection's hello alive; ``acked``: the recalls done since the
    last keepalive; ``wait_s``: how long the service may hold the call for a recall; ``end``:
    the client is going, its leases with it (answered at once); ``unsent``: the client still
    holds creates it has not sent (``tectofs.wire.claims``): the claims a restarted service
    restored for it stay until a keepalive without (its sending may have failed, to be tried
    again)."""

    acked: Annotated[list[Id], msgspec.Meta(max_length=limits.lease_recalls_per_reply_max * 4)] = []
    wait_s: Annotated[float, msgspec.Meta(ge=0, le=limits.lease_keepalive_wait_s)] = 0.0
    end: bool = False
    unsent: bool = False


class KeepaliveReply(Message, frozen=True, kw_only=True):
    """``renewed``: the session's leases last ``lease_s`` from when the keepalive was sent (not
    renewed while a recall is outstanding); ``restarted``: the service did not know the session
    (new, expired, or the service restarted): nothing cached before this reply may be trusted;
    ``recalls``: due, oldest first (more may follow in the next reply)."""

    lease_s: float
    renewed: bool
    restarted: bool
    recalls: Annotated[list[Recall], msgspec.Meta(max_length=limits.lease_recalls_per_reply_max)] = []


KEEPALIVE: Final = Operation("keepalive", KeepaliveRequest, KeepaliveReply, idempotent=True)


# What a lease covers, as the metadata service keys it (``server/meta/leases.py``):
ATTRS = "a"  # ("a", ino): an inode's attributes, extended attributes, symlink target and inline data
ENTRY = "e"  # ("e", directory ino, name): one name of a directory, present or absent
LISTING = "l"  # ("l", directory ino): a directory's complete listing
CLAIM = "x"  # ("x", directory ino): an exclusive claim on a directory (``tectofs.wire.claims``)
LeaseKey = tuple[Any, ...]


def recall_of(recall_id: int, keys: "list[LeaseKey]") -> "Recall":
    """The recall of ``keys``, as the wire carries it."""
    return Recall(id=recall_id, inos=sorted(k[1] for k in keys if k[0] == ATTRS),
                  entries=[Entry(parent=k[1], name=k[2]) for k in keys if k[0] == ENTRY],
                  listings=sorted(k[1] for k in keys if k[0] == LISTING),
                  claims=sorted(k[1] for k in keys if k[0] == CLAIM))
