"""A second client of the simulation that holds metadata leases and answers stats from its cache
while they last, as a FUSE mount's kernel cache does (``server/meta/leases.py``,
``client/lease_session.py``), and the invariant it must keep:

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
from tectofs.wire.leases import Recall

ROOT_INO = 1

if TYPE_CHECKING:
    from tectofs.testing.cluster import Cluster
    from tectofs.testing.schedule import FileModel

WATCH_HOST = "10.0.9.2"


class LeaseWatcher:
    def __init__(self, cluster: "Cluster", fail: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.fail = fail
        self.cache: dict[str, tuple[int, int]] = {}  # name -> (ino, size), as a stat answered while leased
        self.unlinked_s: dict[str, float] = {}  # name -> when an unlink of it was acknowledged
        self.served = 0
        credential = auth.Credential.root_from_keys(auth.KeyRing(cluster.key_file))
        self.client: AsyncFileSystem = host_context(WATCH_HOST).run(
            AsyncFileSystem, cluster.meta_address, credential, clock=cluster.clock.monotonic, leases=True)
        session = self.client.lease_session
        assert session is not None
        self.session = session
        session.listeners.append(self._recalled)

    async def _recalled(self, recall: "Recall | None") -> None:
        if recall is None:
            self.cache.clear()
            return
        gone = set(recall.inos)
        names = {e.name for e in recall.entries if e.parent == ROOT_INO}  # the simulation's files are in /
        for name in [n for n, (ino, _) in self.cache.items() if ino in gone or n in names]:
            del self.cache[name]

    def unlinked(self, name: str) -> None:
        self.unlinked_s[name] = self.cluster.clock.now

    async def stat(self, name: str, model: "FileModel") -> None:
        """Stat ``name``: from the cache while leases are held (checking (f)), else from the service."""
        now = self.cluster.clock.now
        cached = self.cache.get(name)
        if cached is not None and self.session.remaining() > 0:
            self.served += 1
            self.check(name, model, cached[1], now)
            return
        epoch = self.session.epoch
        try:
            st = await self.cluster.loop.spawn(WATCH_HOST, self.client.stat(f"/{name}"))
        except (TectofsError, OSError):
            return
        if self.session.still(epoch):
            self.cache[name] = (st.ino, st.size)

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
