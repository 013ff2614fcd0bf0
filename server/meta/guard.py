"""Who may call what on the metadata service: hello authentication (``resolve``), the
operations each kind of peer may call (``authorize``), and the POSIX caller a request acts as
(``caller``). Permission bits themselves are checked in the store (``tectofs.store.access``).

- anonymous (a hello without ``auth``): ``ping`` only;
- cluster members (hold the cluster key: chunk servers, tools run with ``--key-file``):
  everything, as a trusted caller (no permission bits);
- users (a credential; ``root`` derives from the key): the namespace and data operations, as
  their uid, gid and groups; administrators (root, ``--admin`` users) also manage users and
  drain servers; a proxy credential (``--proxy``: a multi-user FUSE mount) may act for a
  local user (``act_as`` in its hello), and its connection then has that user's identity;
  proxies may also ask for the secret of another user's ticket (a memory agent checking it).
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable

from tectofs import limits
from tectofs.errors import AuthenticationFailed, PermissionDenied
from tectofs.store.access import Caller
from tectofs.store.users import StoredUser
from tectofs.wire import auth, messages

# Operations only cluster members call: chunk servers, and the S3 gateway (``s3_principal``:
# users' S3 secrets, to check request signatures).
MEMBER_OPERATIONS = frozenset({
    "register_server", "heartbeat", "inventory_begin", "inventory", "repair_done", "repair_failed",
    "s3_principal",
})
# Operations of administrators (members, root, users added with --admin).
ADMIN_OPERATIONS = frozenset({"drain", "user_add", "user_remove", "user_list"})
# Operations of proxies (root, members, users added with --proxy): a memory agent asks for the
# secret of a ticket a trainer proves (tectofs.wire.auth, *Tickets*).
PROXY_OPERATIONS = frozenset({"ticket_secret"})
ANONYMOUS_OPERATIONS = frozenset({"ping"})


class MetaGuard:
    """``find_user(name)`` looks a user up in the store (``StoredUser``, with its secret, or None)."""

    def __init__(self, ring: auth.KeyRing, find_user: Callable[[str], Awaitable[StoredUser | None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ring = ring
        self._find_user = find_user
        self._clock = clock
        # name -> (looked up at, user): a burst of thousands of ranks connecting as one user
        # must not queue thousands of hello lookups behind the store's work.
        self._users: dict[str, tuple[float, StoredUser | None]] = {}

    async def find_user(self, name: str) -> StoredUser | None:
        now = self._clock()
        cached = self._users.get(name)
        if cached is not None and now - cached[0] < limits.user_cache_s:
            return cached[1]
        user = await self._find_user(name)
        if len(self._users) >= limits.user_cache_entries_max:
            self._users.clear()
        self._users[name] = (now, user)
        return user

    def forget_user(self, name: str) -> None:
        """A user was changed or removed here: the next hello looks it up again."""
        self._users.pop(name, None)

    def _key(self, key_id: str, whose: str) -> bytes:
        key = self.ring.get(key_id)
        if key is None:
            raise AuthenticationFailed(
                f"{whose}: unknown cluster key {key_id[:64]!r} (another cluster's key file, or a key removed by a"
                " rotation; root's credential is made anew with 'tectofs init --root DIR')")
        return key

    async def resolve(self, claim: messages.HelloAuth) -> tuple[bytes, auth.Peer]:
        if claim.kind == "key":
            return self._key(claim.key_id, "this peer"), auth.MEMBER
        if claim.user == "root":
            secret = auth.root_secret(self._key(claim.key_id, "root's credential"))
            peer = auth.Peer(kind="user", name="root", uid=0, gid=0, admin=True, proxy=True)
        else:
            user = await self.find_user(claim.user)
            if user is None:
                raise AuthenticationFailed(f"unknown user {claim.user[:64]!r}")
            assert user.secret is not None  # user_get answers with the secret
            secret = bytes.fromhex(user.secret)
            peer = auth.Peer(kind="user", name=user.name, uid=user.uid, gid=user.gid,
                             groups=frozenset(user.groups), admin=user.admin, proxy=user.proxy)
        if claim.act_as is not None:
            if not peer.proxy:
                raise AuthenticationFailed(
                    f"user {peer.name} may not act for other users (only credentials made with --proxy may)")
            act = claim.act_as
            peer = auth.Peer(kind="user", name=f"{peer.name}:uid{act.uid}", uid=act.uid, gid=act.gid,
                             groups=frozenset(act.groups), admin=False, proxy=False)
        return secret, peer

    @staticmethod
    def authorize(peer: auth.Peer, operation: str) -> None:
        if peer.is_member or operation in ANONYMOUS_OPERATIONS:
            return
        if peer.kind == "anonymous":
            raise PermissionDenied(
                f"{operation}: not authenticated: this client has no credential for the cluster (tectofs up writes"
                " root's where client commands find it; others pass --credentials FILE or $TECTOFS_CREDENTIALS)")
        if operation in MEMBER_OPERATIONS:
            raise PermissionDenied(f"{operation}: only the cluster's own servers and gateways (holders of its key) may call it")
        if operation in ADMIN_OPERATIONS and not peer.admin:
            raise PermissionDenied(f"{operation}: {peer.describe()} is not an administrator")
        if operation in PROXY_OPERATIONS and not peer.proxy:
            raise PermissionDenied(f"{operation}: {peer.describe()} may not act for other users (only credentials"
                                   " made with --proxy may)")

    @staticmethod
    def caller(peer: auth.Peer) -> Caller | None:
        """The POSIX identity a request acts with in the store; None for members (trusted)."""
        return None if peer.is_member else Caller(peer.uid, peer.gid, peer.groups)
