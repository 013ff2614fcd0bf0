"""Who an S3 access key is: the tectofs user the gateway acts as, and the secret that user
signs with.

**Keys.** A user's access key id is the tectofs user name; the secret access key is
:func:`tectofs.wire.auth.s3_secret_key` of the user's tectofs secret. A user computes it from their
own credential file (``tectofs s3 keys``). The S3 key pair ``tectofs user add`` stores (and
writes into the credential file as ``s3_access_key`` / ``s3_secret_key``) works too, as the
same user.

**Where the gateway finds them.** It holds the cluster key, so it is a cluster member, and
asks the metadata service (``s3_principal``, a member-only operation) who an access key is and
which secret it signs with: any user added with ``tectofs user add`` is served at once, with no
file to copy. Answers are cached ``limits.user_cache_s``: a user removed is refused within that
time, and an unknown key is asked again after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from tectofs import limits
from tectofs.client import AsyncFileSystem
from tectofs.client.metadata import MetadataClient
from tectofs.errors import NotFound
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient

ROOT = "root"


def keys_of(credential: auth.Credential) -> tuple[str, str]:
    """``(access key id, secret access key)`` of a credential's user."""
    return credential.user, auth.s3_secret_key(credential.secret)


@dataclass(frozen=True)
class Principal:
    """An authenticated S3 caller: the tectofs identity requests run as, and its secret."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    secret: str


class Principals:
    """Looks access keys up on the metadata service. ``fs`` is the gateway's root connection
    (the views that act as each user come from it); ``ring`` the cluster key, with which a
    second connection proves membership; ``clock`` is injectable for tests."""

    def __init__(self, fs: AsyncFileSystem, ring: auth.KeyRing, clock: Callable[[], float] = time.monotonic) -> None:
        self.fs, self.clock = fs, clock
        member = RpcClient(default_auth=auth.ClientAuth(ring=ring))
        member.expect_role(fs.meta_address, "meta")
        self._member = MetadataClient(member, fs.meta_address)
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    async def _ask(self, access_key: str) -> Principal | None:
        try:
            reply = await self._member.s3_principal(messages.S3KeyRequest(access_key=access_key))
        except NotFound:
            return None
        user = reply.user
        return Principal(user.name, user.uid, user.gid, tuple(user.groups), reply.secret_key)

    async def lookup(self, access_key: str) -> Principal | None:
        """The principal an access key names, or None (unknown, or its user was removed)."""
        now = self.clock()
        cached = self._cache.get(access_key)
        if cached is not None and now - cached[0] < limits.user_cache_s:
            return cached[1]
        principal = await self._ask(access_key)
        if len(self._cache) >= limits.user_cache_entries_max:
            self._cache.clear()
        self._cache[access_key] = (now, principal)
        return principal

    def filesystem(self, principal: Principal) -> AsyncFileSystem:
        """The client view that acts as ``principal`` on the metadata service."""
        if principal.name == ROOT:
            return self.fs
        return self.fs.acting_as(principal.uid, principal.gid, principal.groups)

    async def close(self) -> None:
        await self._member.rpc.close()
