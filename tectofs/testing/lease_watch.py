"""A second client of the simulation that holds metadata leases and answers stats from its cache
while they last (``server/meta/leases.py``, ``client/lease_session.py``,
``client/metadata_cache.py``), and the invariant it must keep:

(f) no answer from its cache is older than a change whose call already returned: a cached size
    is that of a version no acknowledged write had replaced before the answer, of a file no
    acknowledged unlink had removed.

It also creates bursts of files in new directories, which it claims and creates in without calls
(``client/claims.py``), while the other client lists them; the schedule checks

(g) a listing that began after a create returned shows its file, unless the service refused that
    create when it was sent (``lost``: the creator's session ran out, or the service restarted,
    before it was sent); and once healed, every create that returned and was not lost is there,
    with the content its close returned from. Likewise for the files it then unlinks: a listing
    begun after an unlink returned does not show the name, unless that unlink was lost.

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


def burst_content(path: str) -> bytes:
    """What a burst writes into ``path`` (nothing into one in three)."""
    n = int(path.rsplit("c", 1)[1])
    return b"" if n % 3 == 0 else bytes([n % 251]) * (n * 311 % 5000 + 1)


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
        assert self.client.metadata_cache is not None and self.client.claims is not None
        self.cache = self.client.metadata_cache
        self.created: dict[str, float] = {}  # path -> when its create returned
        self.removed: dict[str, float] = {}  # path -> when its unlink returned
        self.removing: dict[str, float] = {}  # path -> when its unlink began (it may have failed)
        self.lost: set[str] = set()  # creates the service refused when they were sent
        claims, forget = self.client.claims, self.client.claims.on_lost

        def lost(paths: list[str]) -> None:
            self.lost.update(paths)
            if forget is not None:
                forget(paths)
        claims.on_lost = lost

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

    async def create_burst(self, directory: str, count: int) -> None:
        """Make ``directory`` and ``count`` empty files in it, one after another: the first few
        by calls, the rest without (the client claims the directory)."""
        try:
            await self.cluster.loop.spawn(WATCH_HOST, self.client.mkdir(directory))
        except (TectofsError, OSError):
            return
        for i in range(count):
            path = f"{directory}/c{i}"
            data = burst_content(path)
            try:
                handle = await self.cluster.loop.spawn(WATCH_HOST, self.client.open(path, "xb"))
                if data:  # its first commit goes with its create (client/claims.py)
                    await self.cluster.loop.spawn(WATCH_HOST, handle.write(0, data))
                await self.cluster.loop.spawn(WATCH_HOST, handle.close())
            except (TectofsError, OSError):
                continue
            self.created[path] = self.cluster.clock.now
        for i in range(1, count, 4):  # some go again: unlinked without calls too
            path = f"{directory}/c{i}"
            if path not in self.created:
                continue
            self.removing[path] = self.cluster.clock.now
            try:
                await self.cluster.loop.spawn(WATCH_HOST, self.client.remove(path))
            except (TectofsError, OSError):
                continue
            self.removed[path] = self.cluster.clock.now

    async def send_creates(self) -> None:
        """Send what it created and has not sent (once healed)."""
        assert self.client.claims is not None
        try:
            await self.cluster.loop.spawn(WATCH_HOST, self.client.claims.flush())
        except (TectofsError, OSError):
            pass
