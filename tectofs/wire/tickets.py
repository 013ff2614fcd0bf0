"""Messages of the ticket operations (``tectofs.wire.auth``, *Tickets*): ``ticket`` (a client
asks for a ticket of its own identity, for memory agents) and ``ticket_secret`` (a memory agent,
a proxy, asks for the secret of a ticket a caller proved). Listed in
``messages.META_OPERATIONS`` like every other operation."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from tectofs.wire.operation import Operation
from tectofs.wire.values import Address, Int64, KeyId, Message, Owner

TicketSecret = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]


class Ticket(Message, frozen=True, kw_only=True):
    """An identity the metadata service vouches for (``tectofs.wire.auth``, *Tickets*): the
    user ``uid``, ``gid``, ``groups`` (``proxy``: may act for others) until ``expiry``
    (seconds since 1970), signed with cluster key ``key_id``; ``issuer``: the metadata
    service that issued it, which a server checking it asks for the ticket's secret."""

    uid: Owner
    gid: Owner
    groups: Annotated[list[Owner], msgspec.Meta(max_length=256)] = []
    proxy: bool = False
    expiry: Int64
    key_id: KeyId
    issuer: Address


class TicketRequest(Message, frozen=True, kw_only=True):
    """``issuer``: the address the caller reaches the service by (a failover group's list),
    written into the ticket so that a server checking it knows whom to ask."""

    issuer: Address


class TicketReply(Message, frozen=True, kw_only=True):
    """A ticket for the caller and its secret (``tectofs.wire.auth.ticket_secret``)."""

    ticket: Ticket
    secret: TicketSecret


class TicketSecretReply(Message, frozen=True, kw_only=True):
    secret: TicketSecret


TICKET: Final = Operation("ticket", TicketRequest, TicketReply, idempotent=True)
TICKET_SECRET: Final = Operation("ticket_secret", Ticket, TicketSecretReply, idempotent=True)
