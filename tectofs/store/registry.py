"""The time-driven part of the metadata store: the chunk-server registry (registration,
heartbeats, liveness, GC orders) and leases (writers' allocations, readers' holds), with the
expiry of what nobody renews. A mixin of ``SqlStore``: it runs on the store's connection, in
the store's transactions (see ``engine.py`` for the contract).
"""

from __future__ import annotations

import json

import msgspec

from .. import limits
from ..errors import NoSpace, NotFound
from ..wire.values import ServerInfo
from .base import StoreParts


class ServersAndLeases(StoreParts):
    """Registry and lease operations; ``SqlStore`` provides the connection helpers."""

    def register_server(self, uuid: str, address: str, capacity: int, used: int, metrics_url: str | None = None) -> int:
        """Register (or re-register, by ``uuid``) a chunk server reached at ``address``, whose
        metrics are at ``metrics_url`` (None: not served); returns its server id."""
        now = self.clock()
        row = self._one("SELECT server_id FROM servers WHERE uuid = ?", (uuid,))
        if row is None and self._one("SELECT COUNT(*) FROM servers")[0] >= limits.servers_max:
            raise NoSpace(f"this metadata service already has {limits.servers_max} chunk servers registered")
        if row is not None:
            self._x(
                "UPDATE servers SET address = ?, capacity = ?, used = ?, last_heartbeat = ?, metrics_url = ?"
                " WHERE server_id = ?",
                (address, capacity, used, now, metrics_url, row[0]),
            )
            return int(row[0])
        (server_id,) = self._one("SELECT COALESCE(MAX(server_id), 0) + 1 FROM servers")
        # Only one process listens at an address: a server registered there under another
        # uuid is gone (its data directory replaced), not merely late with its heartbeat.
        # Left live until it missed its heartbeats, it could be given a second position of
        # the same block as this one, which the process at that address refuses.
        self._x("UPDATE servers SET last_heartbeat = 0 WHERE address = ? AND uuid <> ?", (address, uuid))
        self._x(
            "INSERT INTO servers (server_id, uuid, address, capacity, used, inflight, chunks, last_heartbeat,"
            " registered, metrics_url) VALUES (?, ?, ?, ?, ?, 0, 0, ?, ?, ?)",
            (server_id, uuid, address, capacity, used, now, now, metrics_url),
        )
        return int(server_id)

    def heartbeat(
        self, server_id: int, capacity: int, used: int, inflight: int, chunks: int, address: str | None = None,
        orders_max: int = limits.gc_orders_per_heartbeat_max, stats: dict[str, int] | None = None,
        metrics_url: str | None = None,
    ) -> list[int]:
        """Record a server's load, progress ``stats`` (scrub, repair), address and metrics URL
        (None: unchanged; a store upgraded under running servers learns their URLs this way);
        return (and forget) block ids whose chunk it must delete."""
        cur = self._x(
            "UPDATE servers SET capacity = ?, used = ?, inflight = ?, chunks = ?, last_heartbeat = ?,"
            " address = COALESCE(?, address), stats = COALESCE(?, stats), metrics_url = COALESCE(?, metrics_url)"
            " WHERE server_id = ?",
            (capacity, used, inflight, chunks, self.clock(), address, _kept(stats), metrics_url, server_id),
        )
        if cur.rowcount == 0:
            raise NotFound(f"chunk server {server_id} is not registered; register again")
        now = self.clock()
        rows = self._all(  # not what a live reader's lease still holds, never a chunk a block places here
            "SELECT block_id FROM gc_queue g WHERE server_id = ? AND due <= ? AND NOT EXISTS"
            " (SELECT 1 FROM read_leases r WHERE r.ino = g.ino AND g.ino != 0 AND r.expires > ?) AND NOT EXISTS"
            " (SELECT 1 FROM chunks c WHERE c.block_id = g.block_id AND c.server_id = g.server_id) LIMIT ?",
            (server_id, now, now, orders_max),
        )
        ids = [int(r[0]) for r in rows]
        for block_id in ids:
            self._x("DELETE FROM gc_queue WHERE server_id = ? AND block_id = ?", (server_id, block_id))
        return ids

    def servers(self) -> list[ServerInfo]:
        """Every registered chunk server, by id; ``live``: a heartbeat arrived (at the service,
        ``heartbeats_seen``, or as stored) within ``server_dead_after_s``."""
        now = self.clock()
        rows = self._all(
            "SELECT server_id, uuid, address, capacity, used, inflight, chunks, last_heartbeat, state, stats,"
            " metrics_url FROM servers ORDER BY server_id"
        )
        out = []
        for r in rows:
            last = max(r[7], self.heartbeats_seen.get(r[0], 0.0))
            out.append(ServerInfo(
                server_id=r[0], uuid=r[1], address=r[2], capacity=r[3], used=r[4], inflight=r[5], chunks=r[6],
                last_heartbeat=last, live=now - last <= self.server_dead_after_s, state=r[8],
                stats=_STATS_DECODER.decode(r[9] or "{}"), metrics_url=r[10],
            ))
        return out

    def live_servers(self) -> list[ServerInfo]:
        """``servers`` that are live."""
        return [s for s in self.servers() if s.live]

    def renew(self, ino: int, writer: int = 0, reader: int = 0, reader_lease_s: float = limits.reader_lease_s) -> int:
        """Leases. A live writer's: what it allocated and staged for ``ino`` does not expire.
        A reader's: the chunks of ``ino``'s blocks are kept (not collected) until it lapses,
        even after the file is unlinked or replaced."""
        now = self.clock()
        renewed = 0
        if writer:
            renewed += self._x("UPDATE allocations SET created = ? WHERE ino = ? AND writer = ?", (now, ino, writer)).rowcount
            self._x("UPDATE staged SET created = ? WHERE ino = ? AND writer = ?", (now, ino, writer))
        if reader:
            self._x(
                "INSERT INTO read_leases (ino, reader, expires) VALUES (?, ?, ?)"
                " ON CONFLICT (ino, reader) DO UPDATE SET expires = excluded.expires",
                (ino, reader, now + reader_lease_s),
            )
            renewed += 1
        return int(renewed)

    def expire_allocations(self, older_than_s: float = limits.allocation_grace_s) -> int:
        """Queue chunks of blocks allocated but never committed (a writer that crashed)."""
        cutoff = self.clock() - older_than_s
        rows = self._all("SELECT block_id, servers FROM allocations WHERE created < ?", (cutoff,))
        now = self.clock()
        for block_id, servers in rows:
            for server_id in json.loads(servers):
                self._x(
                    "INSERT INTO gc_queue (server_id, block_id, due) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                    (server_id, block_id, now),
                )
            self._x("DELETE FROM allocations WHERE block_id = ?", (block_id,))
        self._x("DELETE FROM staged WHERE created < ?", (cutoff,))  # what crashed writers staged
        self._x("DELETE FROM read_leases WHERE expires < ?", (now,))  # readers gone
        return len(rows)

    def counts(self) -> dict[str, int]:
        """Rows per table (inodes, blocks, chunks, allocations, gc_queue, servers)."""
        out = {}
        for table in ("inodes", "blocks", "chunks", "allocations", "gc_queue", "servers"):
            (out[table],) = self._one(f"SELECT COUNT(*) FROM {table}")
        return out


# What ``servers`` shows of a server's progress: a fixed, short set, so the reply listing
# ``limits.servers_max`` servers stays within its budget whatever a server sends.
SERVER_STATS_KEPT = ("scrub_passes", "scrub_pass_chunks", "scrub_pass_checked", "scrub_corrupt", "repairs_done",
                     "repairs_running", "repair_bytes", "inventory_missing", "pack_dead_bytes",
                     "disk_id")  # tectofs.capacity: which file system the server is on


_STATS_DECODER = msgspec.json.Decoder(dict[str, int])


def _kept(stats: dict[str, int] | None) -> str | None:
    if not stats:
        return None
    return json.dumps({k: int(stats[k]) for k in SERVER_STATS_KEPT if k in stats})
