"""Block health and self-healing: which chunks are readable, what to rebuild, where, and in
which order; chunk inventories; drains. A mixin of ``SqlStore`` (see ``engine.py`` for the
transaction contract); the metadata service drives it, chunk servers do the data work.

A chunk is *available* when its row is ``state`` 0 (nothing reported it corrupt or missing)
and its server is live. A chunk *needs a rebuild* when its position has no row (a degraded
write left it out), its row is bad (``state`` 1: a checksum failure, or missing from the
server's inventory), or its server has been dead longer than ``repair_after_s`` ("out", as
Ceph calls it). A chunk on a *draining* server needs a *move*: copied, not rebuilt, after
every rebuild. Blocks with fewer available chunks above what a read needs come first.

Rebuilds are rows of ``repairs``, one per (block, position), with the server chosen to store
the new chunk (``target``). A target learns its orders from its heartbeat replies
(``repair_orders``), pulls what it needs from the sources, and reports ``repair_done``: the new
placement is committed then, and the old copy, if any, goes to the GC queue. An order not done
within ``repair_timeout_s`` is withdrawn and scheduled again.

Invariant kept here: no chunk row is removed or re-pointed unless its replacement has been
reported durable; a GC order is never sent for a chunk a block still places on that server.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

from .. import limits
from ..errors import InvalidArgument, NotFound
from ..policy import parse as parse_policy
from ..wire.leases import ATTRS
from ..wire.messages import DrainReply, FileHealth, HeartbeatReply, InventoryReply, RepairOrder
from ..wire.values import ChunkRef, ServerInfo
from .base import StoreParts

OK, BAD = 0, 1
IN, DRAINING = "in", "draining"

HEALTH_SCHEMA = [
    """CREATE TABLE IF NOT EXISTS repairs (
        block_id BIGINT NOT NULL, position INTEGER NOT NULL, target INTEGER NOT NULL,
        priority INTEGER NOT NULL, created DOUBLE PRECISION NOT NULL,
        sent DOUBLE PRECISION NOT NULL DEFAULT 0, PRIMARY KEY (block_id, position))""",
]

HEALTH_COLUMNS = [
    ("chunks", "state", "state INTEGER NOT NULL DEFAULT 0", None),
    ("chunks", "since", "since DOUBLE PRECISION NOT NULL DEFAULT 0", None),  # when the row was written
    ("chunks", "seen", "seen BIGINT NOT NULL DEFAULT 0", None),  # the last inventory report that listed it
    ("servers", "state", "state TEXT NOT NULL DEFAULT 'in'", None),
    ("servers", "stats", "stats TEXT NOT NULL DEFAULT '{}'", None),
    ("servers", "report", "report BIGINT NOT NULL DEFAULT 0", None),  # inventory report in progress
    ("servers", "report_started", "report_started DOUBLE PRECISION NOT NULL DEFAULT 0", None),
]

_MOVE_PRIORITY = 1000  # after every rebuild


def _marks(values: Iterable[Any]) -> str:
    return ",".join("?" for _ in values) or "NULL"


class BlockHealth(StoreParts):
    """Health, repair and inventory operations; ``SqlStore`` provides the connection helpers,
    ``servers()`` (liveness) and ``gc_delay_s``."""

    # ------------------------------------------------------------------ what is readable

    def _live_ids(self) -> set[int]:
        return {s.server_id for s in self.servers() if s.live}

    def _for_blocks(self, sql: str, block_ids: list[int], params: tuple[Any, ...] = ()) -> list[Any]:
        """Rows of ``sql`` (its ``{ids}`` replaced by placeholders, after ``params``) for every
        block id, asked 500 at a time (a bound on the statement's parameters)."""
        rows: list[Any] = []
        for i in range(0, len(block_ids), 500):
            part = block_ids[i : i + 500]
            rows += self._all(sql.format(ids=_marks(part)), (*params, *part))
        return rows

    def _block_chunks(self, block_ids: list[int]) -> dict[int, list[tuple[int, int, int, int, int]]]:
        """block id -> [(position, server_id, length, crc, state)]."""
        out: dict[int, list[tuple[int, int, int, int, int]]] = {b: [] for b in block_ids}
        for row in self._for_blocks(
            "SELECT block_id, position, server_id, length, crc, state FROM chunks WHERE block_id IN ({ids})", block_ids
        ):
            out[int(row[0])].append(tuple(int(v) for v in row[1:]))  # type: ignore[arg-type]
        return out

    def block_health(self, inos: list[int]) -> list[FileHealth]:
        """Per file: its blocks, and how many are healthy, under-redundant and unreadable now."""
        if len(inos) > limits.health_inos_per_call_max:
            raise InvalidArgument(f"block_health takes at most {limits.health_inos_per_call_max} files")
        live = self._live_ids()
        files = {ino: {"ino": ino, "blocks": 0, "healthy": 0, "under_redundant": 0, "unreadable": 0} for ino in inos}
        rows = self._all(
            f"SELECT b.ino, b.policy, c.server_id, c.state, b.block_id FROM blocks b"
            f" LEFT JOIN chunks c ON c.block_id = b.block_id WHERE b.ino IN ({_marks(inos)}) ORDER BY b.block_id",
            inos,
        )
        per_block: dict[tuple[int, int], list[Any]] = {}  # (ino, block id) -> [ino, policy, chunks available]
        for ino, policy, server_id, state, block_id in rows:  # (a block shared by two files counts for both)
            entry = per_block.setdefault((ino, block_id), [ino, policy, 0])
            if server_id is not None and state == OK and server_id in live:
                entry[2] += 1
        for ino, policy, available in per_block.values():
            files[ino]["blocks"] += 1
            files[ino][self._grade(parse_policy(policy), available)] += 1
        return [FileHealth(**files[ino]) for ino in inos]

    @staticmethod
    def _grade(policy: Any, available: int) -> str:
        if available >= policy.width:
            return "healthy"
        return "under_redundant" if available >= policy.needed else "unreadable"

    def health_summary(self) -> dict[str, int]:
        """Blocks of the whole namespace by health, the repair queue, and the chunks still
        placed on draining servers."""
        live = self._live_ids()
        out = {"healthy": 0, "under_redundant": 0, "unreadable": 0}
        rows = self._all(
            f"SELECT b.policy, COUNT(c.position) FROM blocks b LEFT JOIN chunks c ON c.block_id = b.block_id"
            f" AND c.state = {OK} AND c.server_id IN ({_marks(live)}) GROUP BY b.block_id, b.policy",
            sorted(live),
        )
        for policy, available in rows:
            out[self._grade(parse_policy(policy), int(available))] += 1
        (queued,) = self._one("SELECT COUNT(*) FROM repairs WHERE sent = 0")
        (running,) = self._one("SELECT COUNT(*) FROM repairs WHERE sent > 0")
        (draining,) = self._one(
            f"SELECT COUNT(*) FROM chunks c JOIN servers s ON s.server_id = c.server_id WHERE s.state = '{DRAINING}'"
        )
        return {**out, "repairs_queued": int(queued), "repairs_running": int(running), "draining_chunks": int(draining)}

    # ------------------------------------------------------------------ reports

    def mark_bad(self, block_id: int, server_id: int) -> bool:
        """A chunk of ``block_id`` on ``server_id`` failed its checksum or is not there: it
        stops counting as available, and its repair is scheduled."""
        cur = self._x(
            f"UPDATE chunks SET state = {BAD} WHERE block_id = ? AND server_id = ? AND state = {OK}",
            (block_id, server_id),
        )
        return bool(cur.rowcount)

    def inventory_begin(self, server_id: int) -> int:
        """Start a full report of the chunks ``server_id`` holds; the server lists its disk
        after this returns, so every chunk committed before now is in the listing."""
        report = self._next("inventory")
        cur = self._x(
            "UPDATE servers SET report = ?, report_started = ? WHERE server_id = ?", (report, self.clock(), server_id)
        )
        if cur.rowcount == 0:
            raise NotFound(f"chunk server {server_id} is not registered; register again")
        return report

    def inventory(
        self, server_id: int, report: int, block_ids: list[int], last: bool,
        orphan_grace_s: float = limits.orphan_grace_s,
    ) -> InventoryReply:
        """Part of report ``report``: the chunks listed are seen; those no block places on this
        server (and no allocation or rebuild will) are orphans, collected after
        ``orphan_grace_s``. With ``last``, the chunks the store places on the server, written
        before the report began and not listed, are marked bad (their rebuild follows)."""
        row = self._one("SELECT report, report_started FROM servers WHERE server_id = ?", (server_id,))
        if row is None or int(row[0]) != report:
            raise InvalidArgument(f"inventory report {report} of chunk server {server_id} is not the current one")
        started = float(row[1])
        ids = sorted(set(block_ids))
        marks = _marks(ids)
        self._x(f"UPDATE chunks SET seen = ? WHERE server_id = ? AND block_id IN ({marks})", (report, server_id, *ids))
        known = {int(r[0]) for r in self._all(
            f"SELECT block_id FROM chunks WHERE server_id = ? AND block_id IN ({marks})"
            f" UNION SELECT block_id FROM allocations WHERE block_id IN ({marks})"
            f" UNION SELECT block_id FROM repairs WHERE target = ? AND block_id IN ({marks})",
            (server_id, *ids, *ids, server_id, *ids),
        )}
        orphans = [b for b in ids if b not in known]
        due = self.clock() + orphan_grace_s
        for block_id in orphans:
            self._x(
                "INSERT INTO gc_queue (server_id, block_id, due) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (server_id, block_id, due),
            )
        missing = 0
        if last:
            missing = self._x(
                f"UPDATE chunks SET state = {BAD} WHERE server_id = ? AND seen != ? AND since < ? AND state = {OK}",
                (server_id, report, started),
            ).rowcount
            self._x("UPDATE servers SET report = 0 WHERE server_id = ?", (server_id,))
        return InventoryReply(missing=int(missing), orphans=len(orphans))

    # ------------------------------------------------------------------ drain

    def _find_server(self, server: str) -> ServerInfo:
        """By id, uuid or address; an address a dead server once had and a live one has now
        means the live one; several (or none) live with that address: ambiguous, refused."""
        found = [s for s in self.servers() if server in (str(s.server_id), s.uuid, s.address)]
        live = [s for s in found if s.live]
        if len(found) == 1 or len(live) == 1:
            return found[0] if len(found) == 1 else live[0]
        if found:
            raise InvalidArgument(f"{server!r} names {len(found)} chunk servers ({len(live)} live): give the id or uuid")
        raise NotFound(f"no chunk server {server!r} (give its id, uuid or address: tectofs status lists them)")

    def drain(self, server: str, cancel: bool = False) -> DrainReply:
        """Move every chunk off ``server`` (id, uuid or address): it takes no new chunks, and
        its chunks are copied elsewhere after every rebuild. ``cancel`` takes it back in."""
        found = self._find_server(server)
        state = IN if cancel else DRAINING
        self._x("UPDATE servers SET state = ? WHERE server_id = ?", (state, found.server_id))
        if cancel:
            self._x("DELETE FROM repairs WHERE sent = 0 AND priority >= ?", (_MOVE_PRIORITY,))
        (chunks,) = self._one("SELECT COUNT(*) FROM chunks WHERE server_id = ?", (found.server_id,))
        return DrainReply(server_id=found.server_id, state=state, chunks=int(chunks))

    # ------------------------------------------------------------------ scheduling

    def schedule_repairs(
        self, repair_after_s: float = limits.repair_after_s,
        per_server_max: int = limits.repair_concurrency_per_server,
        round_max: int = limits.repair_scheduled_per_round_max,
        timeout_s: float = limits.repair_timeout_s,
    ) -> int:
        """Queue rebuilds (most endangered blocks first) and moves, each with a target server;
        withdraw orders that timed out or whose target died. Returns how many were queued."""
        now = self.clock()
        servers = {s.server_id: s for s in self.servers()}
        live = {sid for sid, s in servers.items() if s.live}
        out = {sid for sid, s in servers.items() if not s.live and now - s.last_heartbeat > repair_after_s}
        draining = {sid for sid, s in servers.items() if s.state == DRAINING}
        self._x("DELETE FROM repairs WHERE sent > 0 AND sent < ?", (now - timeout_s,))
        for (target,) in self._all("SELECT DISTINCT target FROM repairs"):
            if target in out:  # merely dead (restarting, or unseen since this service started): timeout
                self._x("DELETE FROM repairs WHERE target = ?", (target,))
        troubled = sorted(out | draining)
        candidates = [int(r[0]) for r in self._all(  # bounded: a huge backlog is worked off round by round
            f"SELECT block_id FROM (SELECT block_id FROM chunks WHERE state != {OK} OR server_id IN ({_marks(troubled)})"
            " UNION SELECT block_id FROM blocks WHERE missing > 0) AS troubled ORDER BY block_id LIMIT ?",
            (*troubled, limits.repair_candidates_per_round_max),
        )]
        if not candidates:
            return 0
        pending: set[tuple[int, int]] = set()
        pending_targets: dict[int, set[int]] = {}  # a rebuild queued earlier lands there: not another
        for b, p, t in self._all("SELECT block_id, position, target FROM repairs"):
            pending.add((int(b), int(p)))
            pending_targets.setdefault(int(b), set()).add(int(t))
        deletes_due = self._deletes_due(candidates, now)
        load = {sid: 0 for sid in live if servers[sid].state == IN}
        for target, count in self._all("SELECT target, COUNT(*) FROM repairs GROUP BY target"):
            if target in load:
                load[target] = int(count)
        policies = self._policies(candidates)
        chunk_rows = self._block_chunks(candidates)
        holders: dict[int, set[int]] = {}  # block id -> servers that hold (or will hold) one of its chunks
        work = []
        for block_id in candidates:
            if block_id not in policies:
                continue  # the file went away meanwhile
            policy = parse_policy(policies[block_id])
            rows = chunk_rows[block_id]
            available = [r for r in rows if r[4] == OK and r[1] in live]
            if len(available) < policy.needed:
                continue  # unreadable now; maybe servers come back
            # One chunk of a block per server; not where a delete of the block is due (it goes first).
            holders[block_id] = {r[1] for r in rows} | pending_targets.get(block_id, set()) | deletes_due.get(
                block_id, set())
            placed = {r[0]: r for r in rows}
            margin = len(available) - policy.needed
            for position in range(policy.width):
                if (block_id, position) in pending:
                    continue
                row = placed.get(position)
                if row is None or row[4] != OK or row[1] in out:
                    work.append((margin, block_id, position, row))
                elif row[1] in draining:
                    work.append((_MOVE_PRIORITY + margin, block_id, position, row))
        work.sort(key=lambda w: (w[0], w[1], w[2]))
        queued = 0
        for priority, block_id, position, row in work:
            if queued >= round_max:
                break
            targets = [sid for sid in load if sid not in holders[block_id] and load[sid] < per_server_max]
            if not targets and row is not None and row[4] != OK and row[1] in load and load[row[1]] < per_server_max:
                targets = [row[1]]  # no other server: rebuild a corrupt chunk in place
            if not targets:
                continue
            target = min(targets, key=lambda sid: (load[sid], servers[sid].used, sid))
            load[target] += 1
            holders[block_id].add(target)
            # A delete of this block still waiting for its GC delay on the target (the spare of a
            # hedged write) must not follow the rebuilt chunk: dropped. One already sent runs
            # before the rebuild writes (the target orders them); a stale copy of another position
            # makes the target refuse the write, and ``repair_failed(occupied)`` queues its delete
            # due at once, which keeps the target out of rebuilds of the block until it is gone.
            self._x("DELETE FROM gc_queue WHERE server_id = ? AND block_id = ?", (target, block_id))
            self._x(
                "INSERT INTO repairs (block_id, position, target, priority, created) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT DO NOTHING",  # another metadata service over the same store may have queued it
                (block_id, position, target, priority, now),
            )
            queued += 1
        return queued

    def _policies(self, block_ids: list[int]) -> dict[int, str]:
        rows = self._for_blocks("SELECT block_id, policy FROM blocks WHERE block_id IN ({ids})", block_ids)
        return {int(b): str(p) for b, p in rows}

    def _deletes_due(self, block_ids: list[int], now: float) -> dict[int, set[int]]:
        """block id -> servers with a delete of that block due now (sent at their next heartbeat)."""
        out: dict[int, set[int]] = {}
        for block_id, server_id in self._for_blocks(
            "SELECT block_id, server_id FROM gc_queue WHERE due <= ? AND block_id IN ({ids})", block_ids, (now,)
        ):
            out.setdefault(int(block_id), set()).add(int(server_id))
        return out

    def heartbeat_with_orders(
        self, server_id: int, capacity: int, used: int, inflight: int, chunks: int, address: str | None,
        stats: dict[str, int], orders_max: int = limits.repair_orders_per_heartbeat_max,
        metrics_url: str | None = None,
    ) -> HeartbeatReply:
        """A heartbeat (``heartbeat``: its delete orders) and the rebuild orders for that server,
        in one operation: one queue entry and one transaction per heartbeat."""
        deletes = self.heartbeat(server_id, capacity, used, inflight, chunks, address, stats=stats,
                                 metrics_url=metrics_url)
        return HeartbeatReply(delete=deletes, repairs=self.repair_orders(server_id, orders_max))

    def repair_orders(self, server_id: int, count: int) -> list[RepairOrder]:
        """Up to ``count`` queued orders for ``server_id``, most urgent first, each with its
        sources (the block's available chunks and their addresses); marked sent."""
        now = self.clock()
        rows = self._all(
            "SELECT DISTINCT r.block_id, r.position, b.policy, b.length, r.priority FROM repairs r"
            " JOIN blocks b ON b.block_id = r.block_id"  # (DISTINCT: a block shared by several files, once)
            " WHERE r.target = ? AND r.sent = 0 ORDER BY r.priority, r.block_id LIMIT ?",
            (server_id, count),
        )
        if not rows:
            return []
        servers = self.servers()
        live = {s.server_id for s in servers if s.live}
        addresses = {s.server_id: s.address for s in servers}
        chunk_rows = self._block_chunks([int(r[0]) for r in rows])
        orders: list[RepairOrder] = []
        for block_id, position, policy, length, _ in rows:
            own = [c for c in chunk_rows[block_id] if c[0] == position]
            sources = [
                ChunkRef(position=c[0], server_id=c[1], address=addresses.get(c[1]), length=c[2], crc=c[3])
                for c in chunk_rows[block_id] if c[4] == OK and c[1] in live and c[1] != server_id
            ]
            orders.append(RepairOrder(block_id=block_id, position=position, policy=policy, length=length,
                                      crc=own[0][3] if own else None, sources=sources))
            self._x("UPDATE repairs SET sent = ? WHERE block_id = ? AND position = ?", (now, block_id, position))
        return orders

    def repair_done(self, block_id: int, position: int, server_id: int, length: int, crc: int) -> bool:
        """``server_id`` stored a rebuilt chunk durably: place it there (the old copy goes to
        the GC queue). A late report (its order withdrawn: this service was away when the
        rebuild finished) is placed too while it still fits: the position is not held by a
        sound chunk on a live server, the crc is the one recorded, and the server holds no
        other chunk of the block. Otherwise (another server rebuilt it, the block is gone, the
        crc differs) the new chunk is an orphan, queued for deletion. Returns whether the
        placement changed."""
        order = self._one("SELECT target FROM repairs WHERE block_id = ? AND position = ?", (block_id, position))
        block = self._one("SELECT policy FROM blocks WHERE block_id = ?", (block_id,))
        old = self._one(
            "SELECT server_id, crc, state FROM chunks WHERE block_id = ? AND position = ?", (block_id, position)
        )
        if order is None and block is not None and self._late_rebuild_fits(block_id, position, server_id, crc, old):
            order = (server_id,)
        if order is None or int(order[0]) != server_id or block is None:
            if order is not None and int(order[0]) == server_id:
                self._x("DELETE FROM repairs WHERE block_id = ? AND position = ?", (block_id, position))
            holds = self._one("SELECT 1 FROM chunks WHERE block_id = ? AND server_id = ?", (block_id, server_id))
            if holds is None:
                self._queue_delete(server_id, block_id, 0.0)
            return False
        self._x("DELETE FROM repairs WHERE block_id = ? AND position = ?", (block_id, position))
        if old is not None and int(old[1]) != crc:  # never placed: the target checks this too
            if int(old[0]) != server_id:
                self._queue_delete(server_id, block_id, 0.0)
            return False
        now = self.clock()
        self._x("DELETE FROM gc_queue WHERE server_id = ? AND block_id = ?", (server_id, block_id))
        if old is None:
            self._x(
                f"INSERT INTO chunks (block_id, position, server_id, length, crc, state, since)"
                f" VALUES (?, ?, ?, ?, ?, {OK}, ?)",
                (block_id, position, server_id, length, crc, now),
            )
            self._x("UPDATE blocks SET missing = missing - 1 WHERE block_id = ? AND missing > 0", (block_id,))
        else:
            if int(old[0]) != server_id:
                self._queue_delete(int(old[0]), block_id, self.gc_delay_s)
            self._x(
                f"UPDATE chunks SET server_id = ?, state = {OK}, since = ?, length = ? WHERE block_id = ? AND position = ?",
                (server_id, now, length, block_id, position),
            )
        if self.modified is not None:  # a layout leased with the files' attributes names the old server: recalled
            self.modified.update((ATTRS, int(ino)) for (ino,) in self._all(
                "SELECT DISTINCT ino FROM blocks WHERE block_id = ?", (block_id,)))
        return True

    def _late_rebuild_fits(self, block_id: int, position: int, server_id: int, crc: int, old: Any) -> bool:
        if old is None or int(old[1]) != crc:
            return False
        if int(old[2]) == OK and int(old[0]) != server_id and int(old[0]) in self._live_ids():
            return False  # a sound copy is placed elsewhere (another server rebuilt it meanwhile)
        other = self._one("SELECT 1 FROM chunks WHERE block_id = ? AND server_id = ? AND position != ?",
                          (block_id, server_id, position))
        return other is None

    def repair_failed(self, block_id: int, position: int, server_id: int, occupied: bool = False) -> None:
        """The target gave up (sources unreadable, disk full...): withdraw the order; the next
        round schedules it again, maybe elsewhere. ``occupied``: the target holds a sound chunk
        of another position of this block; if no block places it there, it is a stale copy and
        is deleted at once (a later rebuild may land there)."""
        self._x("DELETE FROM repairs WHERE block_id = ? AND position = ? AND target = ?", (block_id, position, server_id))
        if occupied and self._one("SELECT 1 FROM chunks WHERE block_id = ? AND server_id = ?",
                                  (block_id, server_id)) is None:
            self._x("DELETE FROM gc_queue WHERE server_id = ? AND block_id = ?", (server_id, block_id))
            self._queue_delete(server_id, block_id, 0.0)  # due now, even if one was waiting

    def _queue_delete(self, server_id: int, block_id: int, delay_s: float) -> None:
        self._x(
            "INSERT INTO gc_queue (server_id, block_id, due) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
            (server_id, block_id, self.clock() + delay_s),
        )

    def server_stats(self, server_id: int, stats: dict[str, int]) -> None:
        """Replace the progress counters ``servers`` shows of ``server_id``."""
        self._x("UPDATE servers SET stats = ? WHERE server_id = ?", (json.dumps(stats), server_id))
