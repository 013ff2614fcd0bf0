"""A second client of the simulation that holds metadata leases and answers stats from its cache
while they last (``server/meta/leases.py``, ``client/lease_session.py``,
``client/metadata_cache.py``), and the invariant it must keep:

(f) no answer from its cache is older than a change whose call already returned: a cached size
    is that of a version no acknowledged write had replaced before the answer, of a file no
    acknowledged unlink had removed.

Its host is crashed and partitioned by the network's faults like any other; when the metadata
service crashes, its leases go with the connection (or run out), and a restarted service holds
changes back for a lease's time (its grace period).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from tectofs.client import AsyncFileSystem
from tectofs.errors import TectofsError
from tectofs.testing.loop import host_context
from tectofs.wire import auth

if TYPE_CHECKING:
    from tectofs.testing.cluster import Cluster

WATCH_HOST = "10.0.9.2"


class LeaseWatcher:
    """The leasing client, whose stats its library cache answers while it may
    (``client/metadata_cache.py``); each answer from the cache goes to ``check(name, size,
    at_s)`` (the schedule's invariant f)."""

    def __init__(self, cluster: "Cluster", check: Callable[[str, int, float], None]) -> None:
        self.cluster = cluster
        self.check = check
        credential = auth.Credential.root_from_keys(auth.KeyRing(cluster.key_file))
        self.client: AsyncFileSystem = host_context(WATCH_HOST).run(
            AsyncFileSystem, cluster.meta_address, credential, clock=cluster.clock.monotonic, leases=True)
        assert self.client.metadata_cache is not None
        self.cache = self.client.metadata_cache

    @property
    def served(self) -> int:
        """Answers its cache gave."""
        return self.cache.hits

    async def stat(self, name: str) -> None:
        """Stat ``name``; an answer from the cache (which comes at once) is checked."""
        started = self.cluster.clock.now
        hits = self.cache.hits
        try:
            st = await self.cluster.loop.spawn(WATCH_HOST, self.client.stat(f"/{name}"))
        except (TectofsError, OSError):
            return
        if self.cache.hits > hits:
            self.check(name, st.size, started)
