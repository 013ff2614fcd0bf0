"""The metadata service's operations on users and identities: adding, removing and listing
users (administrators), the S3 gateway's lookup of a signing key (members), ``whoami``, and the
tickets memory agents check (``ticket``; ``ticket_secret`` for proxies: ``tectofs.wire.auth``,
*Tickets*). Who may call which is the guard's (``server/meta/guard.py``)."""

from __future__ import annotations

import logging
import math
import secrets
import time
from typing import Callable, Protocol, TypeVar

from tectofs import limits
from tectofs.errors import NotFound, PermissionDenied
from tectofs.store import SqlStore
from tectofs.store.users import MAYBE_USER, StoredUser
from tectofs.wire import auth, messages
from tectofs.wire.server import current_peer

from .guard import MetaGuard

log = logging.getLogger("tectofs.meta")

ReplyT = TypeVar("ReplyT", bound=messages.Message)
ResultT = TypeVar("ResultT")
Reply = tuple[ReplyT, bytes]
USER_ENTRY_BYTES_MAX = 640  # one UserInfo, encoded, at most (64 groups, 64-byte names and keys)


def _user_info(user: StoredUser) -> messages.UserInfo:
    return messages.UserInfo(name=user.name, uid=user.uid, gid=user.gid, groups=list(user.groups),
                             admin=user.admin, proxy=user.proxy, s3_access_key=user.s3_access_key)


class Service(Protocol):
    """What these handlers use of the metadata service (``server/meta/service.py``)."""

    guard: MetaGuard
    keys: auth.KeyRing

    async def _call(self, operation: Callable[[SqlStore], ResultT], returns: type[ResultT], *,
                    always_admitted: bool = False, new_directory: bool = False) -> ResultT: ...


class UserOperations:
    """The handlers of ``service``: they run store operations through its ``_call`` (exactly
    once per request), tell its hello guard of changed users and sign with its key ring."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def rpc_user_add(self, r: messages.UserAddRequest, _: memoryview) -> Reply[messages.UserAddReply]:
        secret = secrets.token_bytes(auth.KEY_BYTES)
        s3_secret = secrets.token_urlsafe(30)
        s3_access_key = "TFS" + secrets.token_hex(8).upper()
        user = await self.service._call(lambda store: store.user_add(
            r.name, r.uid, r.gid, list(r.groups), admin=r.admin, proxy=r.proxy, secret_hex=secret.hex(),
            s3_access_key=s3_access_key, s3_secret=s3_secret,
        ), StoredUser)
        self.service.guard.forget_user(r.name)  # a lookup of the name before it existed is not kept
        log.warning("user %s added (uid %d, gid %d%s%s) by %s", r.name, r.uid, r.gid, ", admin" if r.admin else "",
                    ", proxy" if r.proxy else "", current_peer.get().describe())
        # A retry answered from the record gets the secrets the store recorded, not this call's.
        return messages.UserAddReply(user=_user_info(user), secret=bytes.fromhex(user.secret or secret.hex()),
                                     s3_secret_key=user.s3_secret or s3_secret), b""

    async def rpc_user_remove(self, r: messages.UserNameRequest, _: memoryview) -> Reply[messages.Empty]:
        await self.service._call(lambda store: store.user_remove(r.name), type(None))
        self.service.guard.forget_user(r.name)
        log.warning("user %s removed by %s", r.name, current_peer.get().describe())
        return messages.Empty(), b""

    async def rpc_user_list(self, r: messages.Empty, _: memoryview) -> Reply[messages.UserListReply]:
        users = await self.service._call(lambda store: store.user_list(), list[StoredUser])
        budget = limits.reply_header_budget_bytes // USER_ENTRY_BYTES_MAX
        return messages.UserListReply(users=[_user_info(u) for u in users[:budget]], more=len(users) > budget), b""

    async def rpc_s3_principal(self, r: messages.S3KeyRequest, _: memoryview) -> Reply[messages.S3PrincipalReply]:
        """The user an S3 access key names (its user name, or the pair ``user add`` made) and
        the secret that key signs with; NotFound for any other key."""
        if r.access_key == "root":
            root = messages.UserInfo(name="root", uid=0, gid=0, groups=[], admin=True, proxy=True)
            return messages.S3PrincipalReply(
                user=root, secret_key=auth.s3_secret_key(auth.root_secret(self.service.keys.signing[1]))), b""
        user = await self.service._call(lambda store: store.user_get(r.access_key), MAYBE_USER)
        if user is not None and user.secret is not None:
            return messages.S3PrincipalReply(user=_user_info(user), secret_key=auth.s3_secret_key(bytes.fromhex(user.secret))), b""
        user = await self.service._call(lambda store: store.user_by_s3_key(r.access_key), MAYBE_USER)
        if user is None or user.s3_secret is None:
            raise NotFound(f"no user has the S3 access key {r.access_key!r}")
        return messages.S3PrincipalReply(user=_user_info(user), secret_key=user.s3_secret), b""

    async def rpc_ticket(self, r: messages.TicketRequest, _: memoryview) -> Reply[messages.TicketReply]:
        """A ticket for the caller's identity (the user its connection acts as), valid for
        ``limits.ticket_ttl_s`` and up to ``limits.ticket_expiry_step_s`` more, and its secret
        (``tectofs.wire.auth``, *Tickets*). Expiries fall on multiples of that step, so the
        tickets one identity takes within a step are one ticket: thousands of ranks of one job
        cost an agent one ``ticket_secret`` call, not one each."""
        peer = current_peer.get()
        key_id, key = self.service.keys.signing
        groups = sorted(peer.groups)
        step = limits.ticket_expiry_step_s
        expiry = int(math.ceil((time.time() + limits.ticket_ttl_s) / step) * step)
        ticket = messages.Ticket(uid=peer.uid, gid=peer.gid, groups=groups, proxy=peer.proxy, expiry=expiry,
                                 key_id=key_id, issuer=r.issuer)
        return messages.TicketReply(ticket=ticket, secret=auth.ticket_secret(key, peer.uid, peer.gid, groups,
                                                                             peer.proxy, expiry)), b""

    async def rpc_ticket_secret(self, r: messages.Ticket, _: memoryview) -> Reply[messages.TicketSecretReply]:
        """The secret of ticket ``r`` (for proxies: a memory agent checking a trainer's hello);
        refused if it expired or names a key this cluster does not hold."""
        key = self.service.keys.get(r.key_id)
        if key is None:
            raise PermissionDenied(f"ticket signed with unknown cluster key {r.key_id[:64]!r}")
        if r.expiry < time.time():
            raise PermissionDenied(f"ticket of uid {r.uid} expired {time.time() - r.expiry:.0f} s ago")
        return messages.TicketSecretReply(secret=auth.ticket_secret(key, r.uid, r.gid, r.groups, r.proxy,
                                                                     r.expiry)), b""

    async def rpc_whoami(self, r: messages.Empty, _: memoryview) -> Reply[messages.WhoamiReply]:
        peer = current_peer.get()
        return messages.WhoamiReply(kind=peer.kind, name=peer.name, uid=peer.uid, gid=peer.gid,
                                    groups=sorted(peer.groups), admin=peer.admin, proxy=peer.proxy), b""
