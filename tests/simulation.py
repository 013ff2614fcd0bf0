"""A deterministic simulation of a whole tectofs cluster in one process, in the spirit of
FoundationDB's simulator.

What runs is the real code where the logic lives: the metadata store (``SqlStore``, on the
in-memory SQLite store below), the chunk servers' rebuilds (``Repairer``) and inventory
reports (``Inventory``), erasure coding and checksums. What is simulated: the clock (a float
that steps advance), chance (one ``random.Random(seed)``, the store's rng and the source of
every fault), the network (calls are function calls; a dead peer does not answer), chunk
servers' disks (dicts: block id -> chunk) and the metadata service's loops (heartbeats that
deliver GC deletes and rebuild orders, repair scheduling, allocation expiry: ``tick``).

``run(seed)`` plays one random schedule: a few servers, files under rs(4,2) and rep(3),
then faults (server deaths and returns, wiped disks, bit flips, deleted chunk files,
metadata-service restarts) interleaved with client writes and time passing; then faults
stop and the cluster heals. Checked throughout; the first violation raises
``SimulationFailed("simulation seed S failed at step N: ...")``:

(a) every file reads back bit-exact from the chunks a reader can get (checked at random
    checkpoints and at the end), since no block ever has more than m positions failed
    between two moments of full redundancy: the schedule keeps to that, and a position
    that fails without a fault is itself a violation;
(b) after faults stop and time passes, ``health_summary`` shows every block healthy, no
    rebuild queued or running, and every chunk really is where the store says;
(c) no GC order deletes a chunk that a block places on that server (checked at delivery);
(d) no block places two of its chunks on one server (a server holds one chunk per block).

Deterministic: nothing reads the wall clock or an unseeded random source, so a seed replays
its schedule exactly (``tests/test_simulation.py`` prints seeds; ``TECTOFS_SIM_SEED`` replays).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import random
import sqlite3
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, TypeVar, cast

from tectofs import checksum, erasure, limits
from tectofs.errors import (
    AlreadyExists,
    ChecksumMismatch,
    ChunkMissing,
    ConnectionLost,
    InvalidArgument,
    NoSpace,
    TectofsError,
)
from tectofs.policy import parse as parse_policy
from tectofs.server.chunk.repair import Repairer
from tectofs.server.chunk.scrub import Inventory, report
from tectofs.server.chunk.storage import ChunkInfo, ChunkStore
from tectofs.store import SqlStore
from tectofs.store.dialect import SqliteDialect
from tectofs.wire import messages
from tectofs.wire.client import RpcClient

BLOCK_SIZE = limits.block_size_min_bytes  # 64 KiB: the smallest block the store accepts
POLICIES = {"rs": "rs(4,2)", "rep": "rep(3)"}
WIDTH_MAX = max(parse_policy(p).width for p in POLICIES.values())
CAPACITY = 1 << 40
# Virtual seconds, short so that a schedule of a few dozen steps crosses every threshold.
DEAD_AFTER_S = 5.0
REPAIR_AFTER_S = 12.0
REPAIR_TIMEOUT_S = 20.0
GC_DELAY_S = 4.0
ALLOCATION_GRACE_S = 20.0
ORPHAN_GRACE_S = 8.0
FAULT_STEPS = (12, 24)
HEAL_TICKS_MAX = 80
# Fault and client events of a schedule step, with their weights.
EVENTS = {"quiet": 14, "kill": 14, "revive": 16, "wipe": 7, "flip": 12, "delete": 9, "restart": 7,
          "write": 10, "overwrite": 5, "unlink": 3, "crash": 3, "drain": 3}
FAULTS = {"kill", "wipe", "flip", "delete"}

ResultT = TypeVar("ResultT")


class SimulationFailed(AssertionError):
    """An invariant did not hold; the message names the seed that replays it."""


class MemoryDialect(SqliteDialect):
    """The in-memory store: SQLite in memory, one named shared-cache database per dialect.

    Stores opened one after another on a dialect see the same data, as a restarted metadata
    service sees its file: the database lives as long as the dialect (a keeper connection
    holds it) or until ``close``, not with any store's connection. Same SQL, same engine as
    the SQLite file store; only durability differs."""

    _names = itertools.count()

    def __init__(self) -> None:
        super().__init__(f"file:tectofs-memory-{next(self._names)}?mode=memory&cache=shared")
        self._release = weakref.finalize(self, self.connect().close)

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, uri=True, isolation_level=None, check_same_thread=False)

    def close(self) -> None:
        self._release()


class Clock:
    """Virtual time for the store (``clock=``): seconds that only ``advance`` moves."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Chunk:
    position: int
    data: bytes
    crc: int  # what the writer sent (the chunk file's footer): reads and scrubs check data against it

    @property
    def sound(self) -> bool:
        return checksum.crc(self.data) == self.crc


@dataclass
class File:
    parts: list[str]
    blocks: dict[int, bytes] = field(default_factory=dict)  # idx -> the bytes stored at the block's start
    size: int = 0


async def _inline(fn: Any, *args: Any) -> Any:
    return fn(*args)


class ChunkServer:
    """One simulated chunk server. Its disk (block id -> ``Chunk``) survives a kill unless
    wiped; what the process holds in memory (rebuild orders received, not run yet) does not.
    It is the ``ChunkStore`` of its real ``Repairer`` and ``Inventory`` (``write``,
    ``block_ids``, ``read``), which reach the metadata service through ``sim.metadata``
    (their typed interface, ``MetadataReports``)."""

    def __init__(self, sim: Simulation, uuid: str, address: str) -> None:
        self.sim, self.uuid, self.address = sim, uuid, address
        self.server_id = 0
        self.up = False
        self.wiped = False  # its disk is gone, and with it the identity (uuid) kept there
        self.replaced = False  # a new server runs at its address
        self.draining = False  # an operator drained it: it takes no new chunks, its chunks move
        self.disk: dict[int, Chunk] = {}
        self.orders: dict[tuple[int, int], messages.RepairOrder] = {}
        # This server and Peers stand in for the ChunkStore and RpcClient that repair and scrub drive.
        store, peers = cast(ChunkStore, self), cast(RpcClient, sim.peers)
        self.repairer = Repairer(store, peers, sim.metadata, _inline, limits.repair_concurrency_per_server, 0)
        self.inventory = Inventory(store, sim.metadata, _inline, lambda: self.server_id)

    def write(self, block_id: int, position: int, data: Any, piece_crcs: list[int], crc: int,
              overwrite: bool = False) -> None:
        """As ``ChunkStore.write``: the same chunk again is a no-op, another one is refused
        unless ``overwrite`` (a rebuild) or the one there is damaged; a rebuild never replaces
        a sound chunk of another position."""
        old = self.disk.get(block_id)
        if old is not None and old.sound:
            if not overwrite:
                if (old.position, old.crc, len(old.data)) == (position, crc, len(data)):
                    return
                raise AlreadyExists(f"chunk {block_id:x} already stored with other content")
            if old.position != position:
                raise AlreadyExists(f"chunk {block_id:x}: this server holds position {old.position}, not {position}")
        self.disk[block_id] = Chunk(position, bytes(data), crc)

    def block_ids(self) -> list[int]:
        return list(self.disk)

    def read(self, block_id: int) -> Chunk:
        """A verified chunk, as ``get_chunk`` serves a small one (the simulation's chunks are far
        under ``limits.chunk_sendfile_min_bytes``, above which the reader alone checks)."""
        chunk = self.disk.get(block_id)
        if chunk is None:
            raise ChunkMissing(f"chunk {block_id:x} is not stored on {self.address}")
        if not chunk.sound:
            raise ChecksumMismatch(f"chunk {block_id:x} on {self.address} is damaged")
        return chunk

    def verify(self, block_id: int) -> ChunkInfo:
        """As ``ChunkStore.verify`` (the scrubber's whole-chunk check)."""
        chunk = self.read(block_id)
        return ChunkInfo(block_id, chunk.position, len(chunk.data), chunk.crc, [])

    def load(self) -> tuple[int, int]:
        return sum(len(c.data) for c in self.disk.values()), len(self.disk)


class Peers:
    """What a chunk server's ``RpcClient`` to its peers does here: ``get_chunk`` only."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    async def call(self, address: str, operation: messages.AnyOperation, request: messages.Message,
                   *_: Any, **__: Any) -> tuple[messages.GetChunkReply, bytes]:
        assert operation is messages.GET_CHUNK and isinstance(request, messages.GetChunkRequest), operation
        server = self.sim.reachable(address)
        if server is None:
            raise ConnectionLost(f"{address} does not answer")
        chunk = server.read(request.block_id)
        reply = messages.GetChunkReply(crcs=[], chunk_length=len(chunk.data), position=chunk.position, crc=chunk.crc)
        return reply, chunk.data


class Metadata:
    """The metadata service as chunk servers' background work calls it (``MetadataReports``),
    answered as ``server/meta/service.py``'s handlers do, from the simulated store. While
    the service restarts, every call fails as a lost connection does."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim

    def _reachable(self) -> None:
        if not self.sim.mds_up:
            raise ConnectionLost("the metadata service is restarting")

    async def report_bad_chunk(self, request: messages.ReportBadChunkRequest) -> messages.Empty:
        self._reachable()
        if request.kind in ("corrupt", "missing"):
            self.sim.call(lambda store: store.mark_bad(request.block_id, request.server_id))
        return messages.Empty()

    async def repair_done(self, request: messages.RepairDoneRequest) -> messages.Empty:
        self._reachable()
        r = request
        placed = self.sim.call(lambda store: store.repair_done(r.block_id, r.position, r.server_id, r.length, r.crc))
        self.sim.stats["rebuilds"] += bool(placed)
        return messages.Empty()

    async def repair_failed(self, request: messages.RepairFailedRequest) -> messages.Empty:
        self._reachable()
        self.sim.call(lambda store: store.repair_failed(request.block_id, request.position, request.server_id, request.occupied))
        return messages.Empty()

    async def inventory_begin(self, request: messages.InventoryBeginRequest) -> messages.InventoryBeginReply:
        self._reachable()
        return messages.InventoryBeginReply(report=self.sim.call(lambda store: store.inventory_begin(request.server_id)))

    async def inventory(self, request: messages.InventoryRequest) -> messages.InventoryReply:
        self._reachable()
        r = request
        found = self.sim.call(lambda store: store.inventory(r.server_id, r.report, r.block_ids, r.last, ORPHAN_GRACE_S))
        return found


class Simulation:
    """One cluster and one schedule, all driven by ``seed``. ``tolerate`` False lets faults
    exceed what the policies survive (to show that the checks catch data loss)."""

    def __init__(self, seed: int, tolerate: bool = True) -> None:
        self.seed = seed
        self.tolerate = tolerate
        self.rng = random.Random(seed)
        self.clock = Clock()
        self.dialect = MemoryDialect()
        self.inspect = self.dialect.connect()  # the checks' own view of the database
        self.store = self._open_store()
        self.mds_up = True
        self.peers = Peers(self)
        self.metadata = Metadata(self)
        self.loop = asyncio.new_event_loop()
        self.servers: list[ChunkServer] = []  # every identity ever started
        self.files: dict[str, File] = {}
        self.failed: dict[int, set[int]] = {}  # block id -> positions failed since it was last fully redundant
        self.step = 0
        self.events: list[str] = []
        self.stats = {"faults": 0, "skipped": 0, "rebuilds": 0, "deletes": 0, "checkpoints": 0, "heal_ticks": 0}

    def close(self) -> None:
        self.store.close()
        self.inspect.close()
        self.dialect.close()
        self.loop.close()

    # ------------------------------------------------------------------ plumbing

    def _open_store(self) -> SqlStore:
        store = SqlStore(self.dialect, "rs(4,2)", BLOCK_SIZE, GC_DELAY_S, clock=self.clock, rng=self.rng)
        store.server_dead_after_s = DEAD_AFTER_S
        return store

    def call(self, operation: Callable[[SqlStore], ResultT]) -> ResultT:
        """``operation(store)`` in a transaction of its own, as the store runner runs a
        batch of one: committed if it returns, rolled back if it raises. Each takes a
        millisecond of virtual time (as real ones do: no two see the same clock)."""
        self.clock.now += 0.001
        store = self.store
        store.tx_begin()
        try:
            result = operation(store)
        except Exception:
            store.tx_rollback()
            raise
        store.tx_commit()
        return result

    def run_async(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run a chunk server's coroutine (a rebuild, an inventory report) to its end."""
        return self.loop.run_until_complete(coro)

    def fail(self, message: str) -> None:
        recent = "; ".join(self.events[-8:])
        raise SimulationFailed(f"simulation seed {self.seed} failed at step {self.step}: {message}\n"
                               f"  last events: {recent}")

    def event(self, text: str) -> None:
        self.step += 1
        self.events.append(f"{self.step}@{self.clock.now - 1_000_000:.1f}s {text}")

    def reachable(self, address: str | None) -> ChunkServer | None:
        """The running server at ``address`` (a wiped server's replacement has its address)."""
        for server in self.servers:
            if server.up and server.address == address:
                return server
        return None

    def up_servers(self) -> list[ChunkServer]:
        return [s for s in self.servers if s.up]

    def spare_capacity(self) -> int:
        """Running servers that take new chunks, beyond the widest policy's width: what a
        kill or a drain may take away while full redundancy stays possible."""
        return len([s for s in self.up_servers() if not s.draining]) - WIDTH_MAX

    # ------------------------------------------------------------------ chunk servers

    def start(self, server: ChunkServer) -> None:
        """A server process starts: it registers, then reports its inventory."""
        if server not in self.servers:
            self.servers.append(server)
        server.up = True
        used, _ = server.load()
        server.server_id = self.call(lambda store: store.register_server(server.uuid, server.address, CAPACITY, used))
        server.repairer.server_id = server.server_id
        self.report_inventory(server)

    def new_server(self, address: str) -> ChunkServer:
        return ChunkServer(self, f"{self.rng.getrandbits(64):016x}", address)

    def heartbeat(self, server: ChunkServer) -> None:
        used, count = server.load()
        deletes = self.call(lambda store: store.heartbeat(server.server_id, CAPACITY, used, 0, count, server.address))
        for block_id in deletes:
            placed = self.inspect.execute(
                "SELECT position FROM chunks WHERE block_id = ? AND server_id = ?", (block_id, server.server_id)
            ).fetchone()
            if placed is not None:
                self.fail(f"(c) a GC order deletes chunk {placed[0]} of block {block_id} on server"
                          f" {server.server_id}, where the block places it")
            self.stats["deletes"] += server.disk.pop(block_id, None) is not None
        for order in self.call(lambda store: store.repair_orders(server.server_id, limits.repair_orders_per_heartbeat_max)):
            server.orders.setdefault((order.block_id, order.position), order)
        if server.repairer.unreported:  # outcomes the service missed while it was away (as service.py does)
            self.run_async(server.repairer.resend_reports())

    def work(self, server: ChunkServer) -> None:
        """Rebuild orders run (some later: a rebuild takes time), scrubbing, inventories."""
        for key, order in list(server.orders.items()):
            if self.rng.random() < 0.7:
                del server.orders[key]
                self.run_async(server.repairer._run(order))
        if self.rng.random() < 0.3:
            self.scrub(server)
        if self.rng.random() < 0.03:
            self.report_inventory(server)

    def scrub(self, server: ChunkServer) -> None:
        """One scrubber pass: damaged chunks are reported corrupt (``scrub.report``)."""
        for block_id, chunk in list(server.disk.items()):
            if not chunk.sound:
                self.run_async(report(self.metadata, server.server_id, block_id, "corrupt", "scrub"))

    def report_inventory(self, server: ChunkServer) -> None:
        try:
            self.run_async(server.inventory.full_report())
        except ConnectionLost:
            pass  # the metadata service is down: the real loop tries again later

    # ------------------------------------------------------------------ the metadata service's loops

    def tick(self, dt: float | None = None) -> None:
        """Time passes; heartbeats, repair scheduling and allocation expiry run in a random
        order (as the service's tasks interleave); then every server works."""
        self.clock.now += self.rng.uniform(1.0, 3.0) if dt is None else dt
        self.event("tick")
        up = self.up_servers()
        actors: list[Any] = [*up, "schedule", "expire"]
        self.rng.shuffle(actors)
        for actor in actors if self.mds_up else []:
            if actor == "schedule":
                self.call(lambda store: store.schedule_repairs(
                    REPAIR_AFTER_S, limits.repair_concurrency_per_server * 4, timeout_s=REPAIR_TIMEOUT_S))
            elif actor == "expire":
                self.call(lambda store: store.expire_allocations(ALLOCATION_GRACE_S))
            else:
                self.heartbeat(actor)
        for server in up:
            self.work(server)
        self.observe(fault=False)

    def restart_mds(self) -> None:
        """The metadata service stops, servers carry on for a while (their calls fail), and
        it comes back over the same database."""
        self.store.close()
        self.mds_up = False
        self.tick(self.rng.uniform(0.5, 8.0))
        self.store = self._open_store()
        self.mds_up = True

    # ------------------------------------------------------------------ clients

    def write_file(self, name: str, replace: bool = True, crash: bool = False) -> None:
        """A client writes blocks of ``name`` (all of it, or some blocks in place) through
        allocate, encode, put (a dead server is replaced by a spare) and commit; a block
        below its ``write_min`` aborts the write. ``crash``: the client dies before its commit."""
        parts = [self.rng.choice(list(POLICIES)), name] if name not in self.files else self.files[name].parts
        made = self.call(lambda store: store.create_file(parts))
        attrs, created = made.attrs, made.created
        writer = self.rng.getrandbits(32) + 1
        indexes = sorted(self.rng.sample(range(4), self.rng.randint(1, 3)))
        contents = {idx: self.rng.randbytes(self.rng.choice((1, 100, 2000, 5000, 20000))) for idx in indexes}
        try:
            allocations = self.call(lambda store: store.allocate(attrs.ino, len(contents), 2, (), writer))
        except NoSpace:
            allocations = []
        written = [self.put_block(idx, data, allocation)
                   for (idx, data), allocation in zip(contents.items(), allocations)]
        file = self.files.get(name) or File(parts)
        if crash:  # nothing committed; its chunks wait for the allocation to expire
            self.files[name] = file
            return
        if len(written) < len(contents) or None in written:
            if created:
                self.call(lambda store: store.unlink(parts, attrs.ino, True))
            return
        blocks = contents if replace else {**file.blocks, **contents}
        size = max(idx * BLOCK_SIZE + len(data) for idx, data in blocks.items())
        blocks_written = [block for block in written if block is not None]
        self.call(lambda store: store.commit(attrs.ino, size, blocks_written, replace, None, None, (), writer))
        self.files[name] = File(parts, blocks, size)

    def put_block(self, idx: int, data: bytes, allocation: messages.Allocation) -> messages.WrittenBlock | None:
        policy = parse_policy(allocation.policy)
        candidates = iter(allocation.servers)
        chunks: list[messages.WrittenChunk] = []
        for position, chunk in enumerate(erasure.encode(policy, data)):
            crc = checksum.crc(chunk)
            for candidate in candidates:
                server = self.reachable(candidate.address)
                try:
                    if server is None:
                        raise ConnectionLost(f"{candidate.address} does not answer")
                    server.write(allocation.block_id, position, chunk, [], crc)
                except TectofsError:
                    continue  # that server failed: the next spare
                chunks.append(messages.WrittenChunk(position=position, server_id=candidate.server_id,
                                                    length=len(chunk), crc=crc))
                break
        if len(chunks) < allocation.write_min:
            return None
        return messages.WrittenBlock(idx=idx, block_id=allocation.block_id, start=0, length=len(data), chunks=chunks)

    # ------------------------------------------------------------------ ground truth and checks

    def placements(self) -> dict[int, tuple[Any, dict[int, tuple[int, int]]]]:
        """Block id -> (policy, {position: (server id, crc)}), as the database says now."""
        out: dict[int, tuple[Any, dict[int, tuple[int, int]]]] = {}
        policies: dict[str, Any] = {}
        for block_id, policy, position, server_id, crc in self.inspect.execute(
            "SELECT b.block_id, b.policy, c.position, c.server_id, c.crc FROM blocks b"
            " LEFT JOIN chunks c ON c.block_id = b.block_id ORDER BY b.block_id, c.position"
        ):
            if block_id not in out:
                out[block_id] = (policies.get(policy) or policies.setdefault(policy, parse_policy(policy)), {})
            entry = out[block_id]
            if position is not None:
                entry[1][position] = (server_id, crc)
        return out

    def bad_positions(self, placements: dict[int, Any]) -> dict[int, set[int]]:
        """Per block, the positions whose chunk is not where the store places it, intact, on
        a running server."""
        by_id = {s.server_id: s for s in self.servers}
        out = {}
        for block_id, (policy, placed) in placements.items():
            bad = set()
            for position in range(policy.width):
                server_id, crc = placed.get(position, (None, None))
                server = by_id.get(server_id)
                chunk = server.disk.get(block_id) if server is not None and server.up else None
                if chunk is None or chunk.position != position or chunk.crc != crc or not chunk.sound:
                    bad.add(position)
            out[block_id] = bad
        return out

    def observe(self, fault: bool) -> None:
        """Update the positions each block has had failed since it was last fully redundant.
        Outside faults, no position may fail; no two chunks of a block may share a server."""
        placements = self.placements()
        for block_id, (_, placed) in placements.items():
            servers = [server_id for server_id, _ in placed.values()]
            if len(set(servers)) < len(servers):
                self.fail(f"(d) block {block_id} places two of its chunks on one server: {placed}"
                          " (position: (server, crc))")
        bad = self.bad_positions(placements)
        for block_id, positions in bad.items():
            known = self.failed.get(block_id)
            if known is not None and not fault and positions - known:
                self.fail(f"chunks {sorted(positions - known)} of block {block_id} became unavailable without a fault")
            self.failed[block_id] = (known or set()) | positions if positions else set()
        for block_id in set(self.failed) - set(bad):
            del self.failed[block_id]

    def tolerable(self, hits: dict[int, set[int]]) -> bool:
        """Whether failing these positions keeps every block within what its policy survives."""
        placements = self.placements()
        return not self.tolerate or all(
            len(self.failed.get(b, set()) | positions) <= placements[b][0].redundancy for b, positions in hits.items()
        )

    def check_reads(self) -> None:
        """(a) Every file reads back bit-exact from the chunks a reader can get."""
        self.stats["checkpoints"] += 1
        for name, file in self.files.items():
            layout = self.call(lambda store: store.layout(file.parts))
            if layout.attrs.size != file.size:
                self.fail(f"(a) {name} has size {layout.attrs.size}, {file.size} were written")
            if [b.idx for b in layout.blocks] != sorted(file.blocks):
                self.fail(f"(a) {name} has blocks {[b.idx for b in layout.blocks]}, {sorted(file.blocks)} were written")
            for block in layout.blocks:
                if self.read_block(block) != file.blocks[block.idx]:
                    self.fail(f"(a) block {block.idx} (id {block.block_id}) of {name} reads back different bytes")

    def read_block(self, block: messages.Block) -> bytes:
        """What a reader decodes: chunks that pass the server's checks and the crc the store
        recorded; a rotating choice of ``needed`` of them, so parity is decoded too."""
        policy = parse_policy(block.policy)
        readable = {}
        for c in block.chunks:
            server = self.reachable(c.address)
            chunk = server.disk.get(block.block_id) if server is not None else None
            if chunk is not None and chunk.sound and chunk.crc == c.crc and len(chunk.data) == c.length:
                readable[c.position] = chunk.data
        if len(readable) < policy.needed:
            self.fail(f"(a) block {block.block_id} is unreadable: chunks {sorted(readable)} of {policy} readable")
        order = sorted(readable)
        turn = block.block_id % len(order)
        picked = {p: readable[p] for p in (order[turn:] + order[:turn])[: policy.needed]}
        out = bytearray(block.length)
        erasure.decode_into(policy, picked, memoryview(out))
        return bytes(out)

    def healed(self) -> bool:
        summary = self.call(lambda store: store.health_summary())
        blocks = self.placements()
        on_drained = self.inspect.execute(
            "SELECT 1 FROM chunks c JOIN servers s ON s.server_id = c.server_id WHERE s.state = 'draining' LIMIT 1"
        ).fetchone()
        return (summary["healthy"] == len(blocks) and not summary["repairs_queued"] and not summary["repairs_running"]
                and on_drained is None
                and not any(self.bad_positions(blocks).values()))

    def digest(self) -> str:
        """A fingerprint of the run: its events and where every chunk ended up."""
        h = hashlib.sha256("\n".join(self.events).encode())
        h.update(repr(self.inspect.execute("SELECT * FROM chunks ORDER BY block_id, position").fetchall()).encode())
        return h.hexdigest()

    # ------------------------------------------------------------------ the schedule

    def setup(self) -> None:
        for directory, policy in POLICIES.items():
            self.call(lambda store: store.mkdir([directory], policy=policy))
        for i in range(self.rng.randint(7, 9)):
            self.start(self.new_server(f"10.0.0.{i + 1}:7001"))
        for i in range(self.rng.randint(3, 6)):
            self.write_file(f"f{i}")
        self.event("setup")
        self.tick()
        self.check_reads()

    def fault_step(self) -> None:
        kind = self.rng.choices(list(EVENTS), weights=list(EVENTS.values()))[0]
        self.event(kind)
        if kind in FAULTS:
            self.fault(kind)
        elif kind == "revive":
            down = [s for s in self.servers if not s.up and not s.replaced]
            if down:
                self.revive(self.rng.choice(down))
        elif kind == "restart":
            self.restart_mds()
        elif kind == "drain":
            self.drain()
        elif kind in ("write", "overwrite", "crash") or (kind == "unlink" and not self.files):
            names = sorted(self.files)
            name = self.rng.choice(names) if names and kind == "overwrite" else f"f{self.step}"
            self.write_file(name, replace=kind != "overwrite", crash=kind == "crash")
        elif kind == "unlink":
            name = self.rng.choice(sorted(self.files))
            self.call(lambda store: store.unlink(self.files.pop(name).parts))
        if self.rng.random() < 0.6:  # else the next event comes at the same instant
            self.tick()
        if self.rng.random() < 0.3:
            self.check_reads()

    def fault(self, kind: str) -> None:
        """Kill a server (``wipe``: and lose its disk), flip a byte in a chunk, or delete a
        chunk file; only if every block stays within its policy's tolerance."""
        up = self.up_servers()
        placements = self.placements()
        if kind in ("kill", "wipe"):
            server = self.rng.choice(up)
            if self.spare_capacity() < (0 if server.draining else 1):
                return
            hits: dict[int, set[int]] = {}
            for block_id, (_, placed) in placements.items():
                for position, (server_id, _) in placed.items():
                    if server_id == server.server_id:
                        hits.setdefault(block_id, set()).add(position)
        else:
            holders = [s for s in self.servers if s.disk and not s.replaced]
            if not holders:
                return
            server = self.rng.choice(holders)
            block_id = self.rng.choice(sorted(server.disk))
            positions = {p for p, (sid, _) in placements.get(block_id, (None, {}))[1].items() if sid == server.server_id}
            hits = {block_id: positions} if positions else {}
        if not self.tolerable(hits):
            self.stats["skipped"] += 1
            return
        self.stats["faults"] += 1
        if kind in ("kill", "wipe"):
            server.up = False
            server.orders.clear()
            if kind == "wipe":
                server.disk.clear()
                server.wiped = True
        elif kind == "flip":
            chunk = server.disk[block_id]
            data = bytearray(chunk.data)
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
            chunk.data = bytes(data)
        else:
            del server.disk[block_id]
        self.observe(fault=True)

    def drain(self) -> None:
        """An operator drains a running server, named by its id, uuid or address."""
        candidates = [s for s in self.up_servers() if not s.draining]
        if self.spare_capacity() < 1:
            return
        server = self.rng.choice(candidates)
        name = self.rng.choice([str(server.server_id), server.uuid, server.address])
        try:
            drained = self.call(lambda store: store.drain(name))
        except InvalidArgument:  # the address also names a wiped server not yet seen dead: ambiguous, refused
            drained = self.call(lambda store: store.drain(server.uuid))
        if drained.server_id != server.server_id:
            self.fail(f"(e) drain {name!r} drained server {drained.server_id}, not the running server"
                      f" {server.server_id} it names")
        server.draining = True

    def revive(self, server: ChunkServer) -> None:
        """A dead server starts again; a wiped one as a new, empty server at its address."""
        if not server.wiped:
            self.start(server)
        else:
            server.replaced = True
            self.start(self.new_server(server.address))

    def heal(self) -> None:
        """Faults stop: a scrub pass and an inventory on every server, then time passes until
        redundancy is restored (bounded)."""
        self.event("heal")
        for server in self.up_servers():
            self.scrub(server)
            self.report_inventory(server)
        for _ in range(HEAL_TICKS_MAX):
            self.tick(self.rng.uniform(2.0, 3.0))
            self.stats["heal_ticks"] += 1
            if self.healed():
                break
        else:
            bad = {b: sorted(p) for b, p in self.bad_positions(self.placements()).items() if p}
            (drained,) = self.inspect.execute(
                "SELECT COUNT(*) FROM chunks c JOIN servers s ON s.server_id = c.server_id WHERE s.state = 'draining'"
            ).fetchone()
            self.fail(f"(b) redundancy not restored after {HEAL_TICKS_MAX} ticks: {self.call(lambda store: store.health_summary())};"
                      f" failed positions per block {bad}; {drained} chunks still on drained servers")
        self.check_reads()


def run(seed: int, tolerate: bool = True) -> Simulation:
    """Play the schedule of ``seed``; raise ``SimulationFailed`` naming it on any violation
    (or any unexpected error). Returns the finished simulation (stats, events, digest)."""
    sim = Simulation(seed, tolerate)
    try:
        sim.setup()
        for _ in range(sim.rng.randint(*FAULT_STEPS)):
            sim.fault_step()
        sim.heal()
        sim.events.append(f"digest {sim.digest()}")
    except SimulationFailed:
        raise
    except Exception as exc:
        raise SimulationFailed(f"simulation seed {seed} failed at step {sim.step}: {type(exc).__name__}: {exc}\n"
                               f"  last events: {'; '.join(sim.events[-8:])}") from exc
    finally:
        sim.close()
    return sim
