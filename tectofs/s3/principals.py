"""Who an S3 access key is: the tectofs user the gateway acts as, and the secret that user
signs with.

**Keys.** A user's access key id is the tectofs user name; the secret access key is
:func:`secret_key` of the user's tectofs secret (``HMAC-SHA256(secret, "tectofs s3 secret
v1")``, hex). A user computes it from their own credential file (``tectofs s3 keys``); root's
tectofs secret derives from the cluster key, so the gateway (which holds the key, to act as any
user) computes root's itself. The gateway also accepts the S3 key pair ``tectofs user add``
stores in a credential file (``s3_access_key`` / ``s3_secret_key``), as the same user.

**Where the gateway finds other users' secrets.** The metadata service does not hand out
users' secrets, so the gateway reads the credential files of the users it serves from a
directory (``--users DIR``: files ``tectofs user add`` wrote). A user's uid, gid and groups,
and whether it still exists, always come from the metadata service (``user_list``, cached
``limits.user_cache_s``): a removed user is refused even if its file is still there.
"""

from __future__ import annotations

import glob
import hashlib
import hmac
import logging
import os
import time
from dataclasses import dataclass
from typing import Callable

from tectofs import auth, limits
from tectofs.client import AsyncFileSystem
from tectofs.errors import TectofsError

log = logging.getLogger("tectofs.s3")
ROOT = "root"


def secret_key(tectofs_secret: bytes) -> str:
    """The S3 secret access key of the user whose tectofs secret this is."""
    return hmac.new(tectofs_secret, b"tectofs s3 secret v1", hashlib.sha256).hexdigest()


def keys_of(credential: auth.Credential) -> tuple[str, str]:
    """``(access key id, secret access key)`` of a credential's user."""
    return credential.user, secret_key(credential.secret)


@dataclass(frozen=True)
class Principal:
    """An authenticated S3 caller: the tectofs identity requests run as, and its secret."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    secret: str


class Principals:
    """Looks access keys up. ``fs`` is the gateway's root connection (``user_list`` needs
    an administrator); ``ring`` the cluster key (root's secret); ``users_dir`` holds user
    credential files (re-read when a file changes); ``clock`` is injectable for tests."""

    def __init__(self, fs: AsyncFileSystem, ring: auth.KeyRing, users_dir: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fs, self.ring, self.users_dir, self.clock = fs, ring, users_dir, clock
        self._identities: tuple[float, dict[str, tuple[int, int, tuple[int, ...]]]] = (-1e18, {})
        self._files: tuple[tuple[tuple[str, float], ...], dict[str, tuple[str, str]]] = ((), {})
        self._scanned = -1e18  # when users_dir was last looked at (at most once a second)

    def _root(self) -> Principal:
        return Principal(ROOT, 0, 0, (), secret_key(auth.root_secret(self.ring.signing[1])))

    def _secrets(self, fresh: bool = False) -> dict[str, tuple[str, str]]:
        """access key -> (user name, secret), from the credential files of ``users_dir``
        (looked at again after a second, or at once when ``fresh``; a file is read again
        only when it changed)."""
        if not self.users_dir or (not fresh and self.clock() - self._scanned < 1.0):
            return self._files[1]
        self._scanned = self.clock()
        paths = sorted(glob.glob(os.path.join(self.users_dir, "*.credentials"))
                       + glob.glob(os.path.join(self.users_dir, "*.json")))
        stamp = tuple((p, os.stat(p).st_mtime) for p in paths if os.path.exists(p))
        if stamp == self._files[0]:
            return self._files[1]
        found: dict[str, tuple[str, str]] = {}
        for path, _ in stamp:
            try:
                credential = auth.Credential.load(path)
            except TectofsError as exc:
                log.warning("%s: not used as an S3 user: %s", path, exc)
                continue
            if credential.user != ROOT:  # root's secret comes from the cluster key only
                found[credential.user] = (credential.user, secret_key(credential.secret))
                if credential.s3_access_key:
                    found[credential.s3_access_key] = (credential.user, credential.s3_secret_key)
        self._files = (stamp, found)
        return found

    async def _identity(self, name: str) -> tuple[int, int, tuple[int, ...]] | None:
        fetched_at, identities = self._identities
        if self.clock() - fetched_at > limits.user_cache_s:
            reply, _ = await self.fs.meta("user_list")
            identities = {u.name: (u.uid, u.gid, tuple(u.groups)) for u in reply.users}
            self._identities = (self.clock(), identities)
        return identities.get(name)

    async def lookup(self, access_key: str) -> Principal | None:
        """The principal an access key names, or None (unknown, or its user was removed)."""
        if access_key == ROOT:
            return self._root()
        entry = self._secrets().get(access_key) or self._secrets(fresh=True).get(access_key)  # a user just added
        if entry is None:
            return None
        identity = await self._identity(entry[0])
        if identity is None:
            return None
        uid, gid, groups = identity
        return Principal(entry[0], uid, gid, groups, entry[1])

    def filesystem(self, principal: Principal) -> AsyncFileSystem:
        """The client view that acts as ``principal`` on the metadata service."""
        if principal.name == ROOT:
            return self.fs
        return self.fs.acting_as(principal.uid, principal.gid, principal.groups)
