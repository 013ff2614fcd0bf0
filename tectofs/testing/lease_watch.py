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
    from tectofs.testing.schedule import FileModel

WATCH_HOST = "10.0.9.2"


class LeaseWatcher:
    """The leasing client, whose stats its library cache answers while it may
    (``client/metadata_cache.py``), and the check of every answer it gives."""

    def __init__(self, cluster: "Cluster", fail: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.fail = fail
        self.unlinked_s: dict[str, float] = {}  # name -> when an unlink of it was acknowledged
        credential = auth.Credential.root_from_keys(auth.KeyRing(cluster.key_file))
        self.client: AsyncFileSystem = host_context(WATCH_HOST).run(
            AsyncFileSystem, cluster.meta_address, credential, clock=cluster.clock.monotonic, leases=True)
        assert self.client.metadata_cache is not None
        self.cache = self.client.metadata_cache

    @property
    def served(self) -> int:
        """Answers its cache gave."""
        return self.cache.hits

    def unlinked(self, name: str) -> None:
        self.unlinked_s[name] = self.cluster.clock.now

    async def stat(self, name: str, model: "FileModel") -> None:
        """Stat ``name`` and check the answer: (f) for one from the cache, which comes at once."""
        started = self.cluster.clock.now
        hits = self.cache.hits
        try:
            st = await self.cluster.loop.spawn(WATCH_HOST, self.client.stat(f"/{name}"))
        except (TectofsError, OSError):
            return
        if self.cache.hits > hits:
            self.check(name, model, st.size, started)

    def check(self, name: str, model: "FileModel", size: int, at_s: float) -> None:
        unlinked = self.unlinked_s.get(name)
        if unlinked is not None and unlinked < at_s:
            self.fail(f"(f) a leased cache answered for {name} at {at_s:.3f}s, unlinked at {unlinked:.3f}s")
        candidates = [v for v in model.versions if len(v.data) == size]
        if not candidates and size != 0:
            self.fail(f"(f) a leased cache answered size {size} for {name}, which no write wrote")
        options = [model.superseded(v, at_s) for v in candidates] + ([model.superseded(None, at_s)] if size == 0 else [])
        if options and all(options):
            self.fail(f"(f) a leased cache answered size {size} for {name} at {at_s:.3f}s, though a write"
                      " acknowledged before then replaced that version")
