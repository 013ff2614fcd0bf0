"""One seeded fault schedule over a cluster of production roles, and its invariants.

``run(seed)`` builds a ``Cluster`` (``tectofs.testing.cluster``), writes a few files through
the real client, then plays a schedule: client writes (some slow: their handles renew their
allocations' leases), overwrites, reads and unlinks in flight
while chunk machines crash (losing what their disks had not made durable), restart, lose their
disks, are partitioned or get disks that fail and lie (``tectofs.testing.disk``), chunk files
are flipped or deleted, the metadata service crashes and restarts (its clock stepped), and
the client crashes mid-write — all over a network that, per seed, delays, reorders and drops
messages (``NetworkFaults``). Then faults stop and the cluster must heal on its own. The
first violated invariant raises ``SimulationFailed`` naming the seed and the command that
replays it:

(a) every read returns bytes some write wrote (every read the client completes, and a read
    of every file once healed);
(b) after faults stop every block heals: each block places every position on a running
    server whose disk holds a sound copy, no repair queued or running;
(c) no GC order deletes a chunk the store places on that server (checked as it reaches
    the disk);
(d) no block places two of its chunks on one server;
(e) no acknowledged write is lost: a read never returns a version that an acknowledged
    write, begun after that version was acknowledged, had replaced before the read began
    (writes that overlap may commit in either order), and no acknowledged file vanishes.

The schedule keeps faults within what rs(4,2) survives: at most one fault (a crashed,
wiped or partitioned server, a flaky disk, a damaged chunk) outstanding until the cluster is
whole again (``unhealed``); a degraded write is the second one it may meet.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from tectofs.client import AsyncFileSystem
from tectofs.errors import TectofsError
from tectofs.policy import parse as parse_policy
from tectofs.testing.cluster import BLOCK_SIZE, ChunkHost, Cluster, quiet_logs
from tectofs.testing.lease_watch import WATCH_HOST, LeaseWatcher, burst_content
from tectofs.testing.network import NetworkFaults

FAULT_STEPS = (10, 20)
HEAL_ROUNDS_MAX = 60
HEAL_ROUND_S = 3.0
VIRTUAL_DEADLINE_S = 1500.0
EVENTS = {"write": 14, "overwrite": 8, "read": 8, "crash_chunk": 10, "restart_chunk": 12, "wipe_chunk": 3,
          "partition": 4, "flip": 8, "delete_chunk_file": 5, "crash_meta": 5, "flaky_disk": 4,
          "crash_client": 3, "unlink": 3, "slow_write": 3, "pause": 10, "watch": 14, "isolate_watcher": 3,
          "burst": 5}
BUDGETED = {"crash_chunk", "wipe_chunk", "partition", "flip", "delete_chunk_file", "flaky_disk"}


def replay_command(seed: int) -> str:
    return f"python3 -m tectofs.testing --seed {seed}"


class SimulationFailed(AssertionError):
    """An invariant did not hold; the message names the seed and the command replaying it."""


@dataclass
class Version:
    """One write of a file: when it began, and when it was acknowledged (None: not yet, or
    never — it failed, and whether its commit landed is unknown)."""

    data: bytes
    started_s: float
    acked_s: float | None = None
    ended_s: float | None = None  # when it returned, acknowledged or failed


@dataclass
class FileModel:
    """What the application knows of one file: every write of it, with its timing. Writes
    that overlap may commit in either order; a write that began after another was
    acknowledged commits after it (close-to-open)."""

    versions: list[Version] = field(default_factory=list)
    maybe_unlinked_s: float | None = None  # when an unlink of it that failed began: it may be gone

    @property
    def maybe_unlinked(self) -> bool:
        return self.maybe_unlinked_s is not None

    def superseded(self, version: Version | None, before_s: float) -> Version | None:
        """An acknowledged write (acknowledged before ``before_s``) that must have committed
        after ``version`` (None: the empty file its first write created); None if there is none."""
        for later in self.versions:
            if later.acked_s is None or later.acked_s >= before_s:
                continue
            if version is None or (version.acked_s is not None and later.started_s > version.acked_s):
                return later
        return None

    def empty_superseded(self, before_s: float) -> Version | None:
        """An acknowledged write that must have replaced every empty file an answer at
        ``before_s`` may show (None: an empty file may be right): the one the first write
        created, and — after an unlink that failed, so may have removed the file — each one a
        later write created anew (its create lands before it returns; a write begun after that
        commits after it)."""
        winner = self.superseded(None, before_s)
        if winner is None or self.maybe_unlinked_s is None:
            return winner
        for creator in self.versions:
            if not self.maybe_unlinked_s < creator.started_s < before_s:
                continue
            if not any(w.acked_s is not None and w.acked_s < before_s
                       and (w is creator or (creator.ended_s is not None and w.started_s > creator.ended_s))
                       for w in self.versions):
                return None
        return winner

    def find(self, data: bytes) -> list[Version]:
        return [v for v in self.versions if v.data == data]

    def check(self, data: bytes, read_started_s: float) -> str | None:
        """Why ``data``, read by a read that began at ``read_started_s``, is wrong (None: it
        may be right): "(a) ..." bytes no write wrote, "(e) ..." a version an acknowledged
        write replaced before the read began."""
        candidates = self.find(data)
        if not candidates and data != b"":
            return f"(a) reads back {len(data)} bytes that no write wrote (sha {hashlib.sha256(data).hexdigest()[:12]})"
        lost = [self.superseded(v, read_started_s) for v in candidates]
        if data == b"":
            lost.append(self.empty_superseded(read_started_s))
        if all(lost):
            winner = lost[0]
            assert winner is not None
            return (f"(e) holds an older version ({len(data)} bytes) though a write of {len(winner.data)} bytes,"
                    f" begun at {winner.started_s:.3f}s after it was acknowledged, was acknowledged at"
                    f" {winner.acked_s:.3f}s")
        return None


class Simulation:
    def __init__(self, seed: int, *, tolerate: bool = True, echo: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.tolerate = tolerate
        self.rng = random.Random(seed)
        faults = NetworkFaults(
            delay_p=self.rng.choice([0.0, 0.01, 0.05]),
            drop_p=self.rng.choice([0.0, 0.0, 0.002, 0.01]),
        )
        self.cluster = Cluster(seed, self.rng, faults, self.rng.randint(7, 9), echo=echo)
        self.trace = self.cluster.trace
        self.files: dict[str, FileModel] = {}
        self.inflight: set[asyncio.Task[None]] = set()
        self.writing: Counter[str] = Counter()  # writes in flight, by file
        # Faults not yet healed: kind, host, block id, and the writes in flight when it struck.
        self.faults: list[tuple[str, ChunkHost, int, frozenset[int]]] = []
        self.writes_in_flight: set[int] = set()
        self.write_ids = 0
        self.stats: Counter[str] = Counter()
        self.step = 0
        self.violation: SimulationFailed | None = None
        self.cluster.on_delete = self.check_gc
        self.watcher: LeaseWatcher | None = None  # a second client, holding leases (invariant f)
        self.unlinked_s: dict[str, float] = {}  # name -> when an unlink of it was acknowledged
        self.listings: list[tuple[str, float, float, set[str]]] = []  # a burst directory, listed from, to, what was there

    # ------------------------------------------------------------------ plumbing

    def fail(self, message: str) -> None:
        """Raise the violation; the first one is also kept, for checks that run where a
        role would swallow the error (a GC order's delete runs as an unawaited future)."""
        recent = "\n    ".join(self.trace.lines[-12:])
        failed = SimulationFailed(f"simulation seed {self.seed} failed at step {self.step}: {message}\n"
                                  f"  replay: {replay_command(self.seed)}\n  last events:\n    {recent}")
        if self.violation is None:
            self.violation = failed
        raise failed

    async def pause(self, low: float, high: float) -> None:
        await asyncio.sleep(self.rng.uniform(low, high))

    def placements(self) -> dict[int, tuple[str, list[tuple[int, int, int, int]]]]:
        """block id -> (policy, [(position, server id, crc, length)]) as the store records them."""
        blocks: dict[int, tuple[str, list[tuple[int, int, int, int]]]] = {
            int(b): (str(p), []) for b, p in self.cluster.query("SELECT block_id, policy FROM blocks")}
        for block_id, position, server_id, crc, length in self.cluster.query(
                "SELECT block_id, position, server_id, crc, length FROM chunks"):
            if block_id in blocks:
                blocks[block_id][1].append((position, server_id, crc, length))
        return blocks

    # ------------------------------------------------------------------ invariants

    def check_gc(self, chunk: ChunkHost, block_ids: list[int]) -> None:
        """(c) A GC order reaching a disk never names a chunk placed there."""
        server_id = chunk.process.server_id if chunk.process is not None else None
        for block_id in block_ids:
            placed = self.cluster.query("SELECT position FROM chunks WHERE block_id = ? AND server_id = ?",
                                        (block_id, server_id))
            if placed:
                self.fail(f"(c) a GC order deletes chunk {placed[0][0]} of block {block_id} on server {server_id}"
                          f" ({chunk.host}), where the store places it")
        self.stats["gc_deletes"] += len(block_ids)

    def check_placement(self) -> None:
        """(d) No block places two of its chunks on one server."""
        for block_id, (_, chunks) in self.placements().items():
            servers = [server_id for _, server_id, _, _ in chunks]
            if len(set(servers)) < len(servers):
                self.fail(f"(d) block {block_id} places two of its chunks on one server: {sorted(chunks)}"
                          " (position, server, crc, length)")

    def check_read(self, name: str, model: FileModel, data: bytes, started_s: float) -> None:
        """(a) and (e): a read returns a version that was written, and not one an acknowledged
        write had replaced before the read began."""
        wrong = model.check(data, started_s)
        if wrong is not None:
            self.fail(f"{wrong[:4]}{name} {wrong[4:]}")

    def check_leased(self, name: str, size: int, at_s: float) -> None:
        """(f) An answer of the leasing client's cache (its size of ``name`` at ``at_s``) is not
        older than a change whose call had returned: no acknowledged write had replaced that
        version, no acknowledged unlink had removed the file."""
        unlinked = self.unlinked_s.get(name)
        if unlinked is not None and unlinked < at_s:
            self.fail(f"(f) a leased cache answered for {name} at {at_s:.3f}s, unlinked at {unlinked:.3f}s")
        model = self.files.get(name)
        if model is None:
            return
        candidates = [v for v in model.versions if len(v.data) == size]
        if not candidates and size != 0:
            self.fail(f"(f) a leased cache answered size {size} for {name}, which no write wrote")
        options = [model.superseded(v, at_s) for v in candidates] + ([model.empty_superseded(at_s)] if size == 0 else [])
        if options and all(options):
            self.fail(f"(f) a leased cache answered size {size} for {name} at {at_s:.3f}s, though a write"
                      " acknowledged before then replaced that version")

    def unhealed(self) -> list[str]:
        """Why the cluster is not whole (empty: healed), from the store and the disks."""
        why = []
        servers = self.cluster.chunk_by_server_id()
        for block_id, (policy, chunks) in self.placements().items():
            positions = {position for position, _, _, _ in chunks}
            if len(positions) < parse_policy(policy).width:
                why.append(f"block {block_id} places {len(positions)} chunks")
                continue
            for position, server_id, crc, length in chunks:
                chunk = servers.get(server_id)
                if chunk is None or chunk.process is None:
                    why.append(f"block {block_id} position {position} on server {server_id}, not running")
                    continue
                try:
                    info = chunk.process.store.verify(block_id)
                except (TectofsError, OSError) as exc:
                    why.append(f"block {block_id} position {position} on {chunk.host}: {type(exc).__name__}")
                    continue
                if (info.position, info.whole_crc, info.length) != (position, crc, length):
                    why.append(f"block {block_id} position {position} on {chunk.host} holds another chunk")
        (repairs,) = self.cluster.query("SELECT COUNT(*) FROM repairs")[0]
        if repairs:
            why.append(f"{repairs} repairs queued or running")
        return why

    def fault(self, kind: str, chunk: ChunkHost, block_id: int = 0) -> None:
        self.faults.append((kind, chunk, block_id, frozenset(self.writes_in_flight)))

    def resolve_faults(self) -> None:
        """Forget the faults the cluster has healed: all of them, once it is whole and every
        write in flight when one struck has ended (a chunk it damaged before its block was
        committed shows only once the block is: seed 877515303)."""
        if not self.faults or any(c.partitioned or not c.up or c.disk.flaky for c in self.cluster.chunks):
            return
        if any(during & self.writes_in_flight for _, _, _, during in self.faults) or self.unhealed():
            return
        self.faults.clear()

    # ------------------------------------------------------------------ client work

    def data_for(self, name: str) -> bytes:
        size = self.rng.choice([1, self.rng.randrange(1, BLOCK_SIZE), BLOCK_SIZE,
                                self.rng.randrange(BLOCK_SIZE, 3 * BLOCK_SIZE)])
        return random.Random(self.rng.getrandbits(64)).randbytes(size)

    async def write(self, name: str, data: bytes, pause_s: float = 0.0) -> None:
        """Replace the file's content; ``pause_s``: a slow writer, whose open handle must keep
        its allocations alive (writer leases) while it waits between its two halves."""
        version = Version(data, self.cluster.clock.now)
        self.files.setdefault(name, FileModel()).versions.append(version)
        self.writing[name] += 1
        self.write_ids += 1
        write_id = self.write_ids
        self.writes_in_flight.add(write_id)
        client = self.cluster.client
        assert client is not None
        try:
            if pause_s:
                await self.write_slowly(client, name, data, pause_s)
            else:
                await self.cluster.as_client(client.write_bytes(f"/{name}", data))
        except (TectofsError, OSError, asyncio.CancelledError) as exc:  # cancelled: the client crashed
            self.stats["writes_failed"] += 1
            self.trace(f"client: write {name} ({len(data)} bytes) failed: {type(exc).__name__}")
            return
        finally:
            self.writing[name] -= 1
            self.writes_in_flight.discard(write_id)
            version.ended_s = self.cluster.clock.now
        version.acked_s = self.cluster.clock.now
        self.stats["writes_acked"] += 1
        self.trace(f"client: write {name} ({len(data)} bytes) acknowledged")

    async def write_slowly(self, client: AsyncFileSystem, name: str, data: bytes, pause_s: float) -> None:
        handle = await self.cluster.as_client(client.open(f"/{name}", "wb"))
        try:
            half = len(data) // 2
            await self.cluster.as_client(handle.write(0, data[:half]))
            await asyncio.sleep(pause_s)
            await self.cluster.as_client(handle.write(half, data[half:]))
            await self.cluster.as_client(handle.close())
        except BaseException:
            if self.cluster.client is client:  # (a crashed client's handle is gone with it)
                await self.cluster.as_client(handle.abort())
            raise

    async def read(self, name: str) -> None:
        client = self.cluster.client
        assert client is not None
        started_s = self.cluster.clock.now
        model = self.files[name]
        try:
            data = await self.cluster.as_client(client.read_bytes(f"/{name}"))
        except (TectofsError, OSError, asyncio.CancelledError) as exc:
            self.stats["reads_failed"] += 1
            self.trace(f"client: read {name} failed: {type(exc).__name__}")
            return
        self.stats["reads"] += 1
        self.check_read(name, model, data, started_s)

    async def watch(self, name: str) -> None:
        """The leasing client stats ``name`` a few times, while writes go on: from its cache
        whenever its leases allow (invariant f)."""
        assert self.watcher is not None
        for _ in range(self.rng.randint(2, 6)):
            if name not in self.files:
                return
            await self.watcher.stat(name)
            await self.pause(0.0, 2.0)

    async def isolate_watcher(self, name: str) -> None:
        """The leasing client's host drops off the network unnoticed (no connection closes) while
        the metadata service restarts and the file it watches is rewritten: it must stop
        answering from its cache before the rewrite can return (the service's grace period)."""
        network = self.cluster.network
        assert self.watcher is not None
        await self.watcher.stat(name)
        network.unreachable.add(WATCH_HOST)
        self.trace("watcher: PARTITIONED")
        self.background(self.watch(name))
        self.cluster.crash_meta()
        await self.pause(0.5, 3.0)
        await self.cluster.start_meta(self.cluster.meta_skew_s)
        self.background(self.write(name, self.data_for(name)))
        await self.pause(0.0, 45.0)
        network.unreachable.discard(WATCH_HOST)
        self.trace("watcher: reachable again")

    async def unlink(self, name: str) -> None:
        """Remove a file no write of this schedule is writing (a read may be: its handle keeps
        the version it opened)."""
        client = self.cluster.client
        assert client is not None
        started_s = self.cluster.clock.now
        model = self.files.pop(name)
        try:
            await self.cluster.as_client(client.remove(f"/{name}"))
        except (TectofsError, OSError, asyncio.CancelledError) as exc:
            self.files[name] = model
            model.maybe_unlinked_s = started_s
            self.trace(f"client: unlink {name} failed: {type(exc).__name__}")
            return
        self.stats["unlinked"] += 1
        self.unlinked_s[name] = self.cluster.clock.now
        self.trace(f"client: unlink {name}")

    def background(self, coro: Any) -> None:
        """Run a client operation beside the schedule; an error it did not expect fails the run."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self.inflight.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.inflight.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, SimulationFailed):
            try:
                self.fail(f"a client operation raised {type(exc).__name__}: {exc}")
            except SimulationFailed:
                pass  # kept in self.violation, raised by the schedule

    # ------------------------------------------------------------------ the schedule

    async def setup(self) -> None:
        await self.cluster.start_meta()
        for chunk in self.cluster.chunks:
            await self.cluster.start_chunk(chunk)
        self.cluster.start_client()
        self.watcher = LeaseWatcher(self.cluster, self.check_leased)
        for i in range(self.rng.randint(2, 3)):
            name = f"f{i}"
            await self.write(name, self.data_for(name))

    def budget_left(self) -> bool:
        return not self.tolerate or not self.faults

    async def fault_step(self) -> None:
        self.step += 1
        kind = self.rng.choices(list(EVENTS), weights=list(EVENTS.values()))[0]
        if kind in BUDGETED and not self.budget_left():
            kind = "pause"
        cluster = self.cluster
        up = [c for c in cluster.chunks if c.up and not c.partitioned]
        if kind in ("write", "overwrite") or (kind == "read" and not self.files):
            name = self.rng.choice(sorted(self.files)) if kind == "overwrite" and self.files else f"f{self.step + 10}"
            self.background(self.write(name, self.data_for(name)))
        elif kind == "slow_write":
            name = f"f{self.step + 10}"
            data = random.Random(self.rng.getrandbits(64)).randbytes(self.rng.randrange(2 * BLOCK_SIZE, 4 * BLOCK_SIZE))
            self.background(self.write(name, data, pause_s=self.rng.uniform(10.0, 45.0)))
        elif kind == "read":
            self.background(self.read(self.rng.choice(sorted(self.files))))
        elif kind == "watch" and self.watcher is not None and self.files:
            name = self.rng.choice(sorted(self.files))
            self.background(self.watch(name))
        elif kind == "crash_chunk" and up:
            chunk = self.rng.choice(up)
            cluster.crash_chunk(chunk)
            self.fault(kind, chunk)
        elif kind == "wipe_chunk" and up:
            chunk = self.rng.choice(up)
            cluster.wipe_chunk(chunk)
            self.fault(kind, chunk)
        elif kind == "partition" and up:
            chunk = self.rng.choice(up)
            cluster.partition(chunk, True)
            self.fault(kind, chunk)
        elif kind == "flaky_disk" and up:
            chunk = self.rng.choice(up)
            disk = chunk.disk
            disk.eio_p = self.rng.choice([0.0, 0.02, 0.2])
            disk.lie_p = self.rng.choice([0.0, 0.05, 0.3])
            disk.full = self.rng.random() < 0.3 or not (disk.eio_p or disk.lie_p)
            self.trace(f"chunk {chunk.host}: disk FLAKY (EIO {disk.eio_p}, lies {disk.lie_p}, full {disk.full})")
            self.fault(kind, chunk)
        elif kind == "restart_chunk":
            for chunk in cluster.chunks:
                if chunk.partitioned:
                    cluster.partition(chunk, False)
                    break
                if chunk.disk.flaky:
                    chunk.disk.heal()
                    self.trace(f"chunk {chunk.host}: disk behaves again")
                    break
            else:
                down = [c for c in cluster.chunks if not c.up]
                if down and cluster.meta is not None:
                    await cluster.start_chunk(self.rng.choice(down))
        elif kind in ("flip", "delete_chunk_file") and up:
            chunk = self.rng.choice(up)
            assert chunk.process is not None
            block_ids = sorted(chunk.process.store.block_ids())
            if block_ids:
                block_id = self.rng.choice(block_ids)
                self.damage(chunk, block_id, kind)
                self.fault(kind, chunk, block_id)
        elif kind == "burst" and self.watcher is not None:
            directory, count = f"/b{self.step}", self.rng.randint(3, 12)
            self.trace(f"watcher: burst of {count} creates in {directory}")
            self.background(self.watcher.create_burst(directory, count))
            for _ in range(self.rng.randint(1, 4)):  # some while creates are unsent (within 50 ms)
                self.background(self.list_burst(directory, self.rng.uniform(0.0, self.rng.choice([0.05, 0.5, 3.0]))))
        elif kind == "isolate_watcher" and self.watcher is not None and self.files and cluster.meta is not None:
            await self.isolate_watcher(self.rng.choice(sorted(self.files)))
        elif kind == "crash_meta" and cluster.meta is not None:
            cluster.crash_meta()
            await self.pause(0.5, 6.0)
            skew = self.rng.choice([0.0, 0.0, self.rng.uniform(-2.0, 2.0), self.rng.uniform(5.0, 30.0)])
            await cluster.start_meta(cluster.meta_skew_s + skew)
        elif kind == "crash_client" and cluster.client is not None:
            self.stats.update({f"client_{k}": v for k, v in self.client_stats().items()})
            cluster.crash_client()
            await self.pause(0.0, 2.0)
            cluster.start_client()
        elif kind == "unlink":
            idle = sorted(n for n in self.files if not self.writing[n])
            if idle:
                self.background(self.unlink(self.rng.choice(idle)))
        self.stats[kind] += 1
        await self.pause(0.2, 3.0)
        if self.violation is not None:
            raise self.violation
        self.check_placement()
        self.resolve_faults()

    def damage(self, chunk: ChunkHost, block_id: int, kind: str) -> None:
        """A disk that lies: one bit of a chunk file flipped, or the file gone."""
        assert chunk.process is not None
        path = chunk.process.store.path(block_id)
        if kind == "delete_chunk_file":
            os.unlink(path)
        else:
            with open(path, "r+b") as f:
                length = os.fstat(f.fileno()).st_size
                at = self.rng.randrange(length)
                f.seek(at)
                byte = f.read(1)[0]
                f.seek(at)
                f.write(bytes([byte ^ (1 << self.rng.randrange(8))]))
        self.trace(f"chunk {chunk.host}: {kind} block {block_id}")

    async def heal(self) -> None:
        """Faults stop: the network is quiet, every server runs; the cluster must heal."""
        self.step += 1
        cluster = self.cluster
        cluster.network.quiet = True
        self.trace("faults stop")
        if self.inflight:
            await asyncio.wait(list(self.inflight))
        if cluster.meta is None:
            await cluster.start_meta()
        for chunk in cluster.chunks:
            if chunk.partitioned:
                cluster.partition(chunk, False)
            chunk.disk.heal()
        for _ in range(3):
            for chunk in cluster.chunks:
                if not chunk.up:
                    await cluster.start_chunk(chunk)
            if all(c.up for c in cluster.chunks):
                break
            await asyncio.sleep(2.0)
        why: list[str] = []
        for rounds in range(HEAL_ROUNDS_MAX):
            await asyncio.sleep(HEAL_ROUND_S)
            why = self.unhealed()
            if not why:
                self.stats["heal_rounds"] += rounds + 1
                break
        else:
            self.fail(f"(b) not healed {HEAL_ROUNDS_MAX * HEAL_ROUND_S:.0f} s after faults stopped: {why[:6]}")
        self.trace("healed")
        self.check_placement()
        for name in sorted(self.files):
            await self.final_read(name)
        await self.check_bursts()

    async def list_burst(self, directory: str, after_s: float) -> None:
        """The other client lists a directory the leasing client creates in (invariant g)."""
        await asyncio.sleep(after_s)
        client = self.cluster.client
        if client is None:
            return
        started_s = self.cluster.clock.now
        try:
            names = await self.cluster.as_client(client.listdir(directory))
        except (TectofsError, OSError, asyncio.CancelledError):
            return
        self.listings.append((directory, started_s, self.cluster.clock.now, {f"{directory}/{n}" for n in names}))
        self.stats["burst_listings"] += 1

    async def check_bursts(self) -> None:
        """(g) Every listing of a burst's directory showed each file whose create returned before
        it began, unless that create was refused when sent; once healed, every create that
        returned and was not refused is there."""
        watcher, client = self.watcher, self.cluster.client
        if watcher is None or client is None or not watcher.created:
            return
        await watcher.send_creates()
        for directory, started_s, ended_s, seen in self.listings:
            for path, created_s in watcher.created.items():
                removed_s, removing_s = watcher.removed.get(path), watcher.removing.get(path)
                if not path.startswith(directory + "/") or path in watcher.lost:
                    continue
                if created_s < started_s and path not in seen and (removing_s is None or removing_s > ended_s):
                    self.fail(f"(g) a listing of {directory} begun at {started_s:.3f} s missed {path}, created"
                              f" at {created_s:.3f} s")
                if removed_s is not None and removed_s < started_s and path in seen:
                    self.fail(f"(g) a listing of {directory} begun at {started_s:.3f} s shows {path}, unlinked"
                              f" at {removed_s:.3f} s")
        for directory in sorted({p.rsplit("/", 1)[0] for p in watcher.created}):
            names = {f"{directory}/{n}" for n in await self.cluster.as_client(client.listdir(directory))}
            missing = sorted(p for p in watcher.created if p.startswith(directory + "/") and p not in names
                             and p not in watcher.lost and p not in watcher.removing)  # (a failed unlink may have landed)
            if missing:
                self.fail(f"(g) once healed, {directory} lacks created files {missing[:5]}")
            back = sorted(p for p in watcher.removed if p.startswith(directory + "/") and p in names
                          and p not in watcher.lost)
            if back:
                self.fail(f"(g) once healed, {directory} still has unlinked files {back[:5]}")
        for path in sorted(p for p in watcher.created if p not in watcher.lost and p not in watcher.removing):
            data = await self.cluster.as_client(client.read_bytes(path))
            if data != burst_content(path):
                self.fail(f"(g) once healed, {path} reads {len(data)} bytes, not the {len(burst_content(path))} written")
        assert watcher.client.claims is not None
        self.stats.update({"claims": watcher.client.claims.claims, "creates_without_call": watcher.client.claims.created,
                           "creates_lost": len(watcher.lost), "unlinks_without_call": watcher.client.claims.unlinked})

    async def final_read(self, name: str) -> None:
        """(a) and (e): once healed, every file reads back as a version no acknowledged write
        replaced (every write has ended by now)."""
        model = self.files[name]
        client = self.cluster.client
        assert client is not None
        started_s = self.cluster.clock.now
        try:
            data = await self.cluster.as_client(client.read_bytes(f"/{name}"))
        except (TectofsError, OSError) as exc:
            acked = [v for v in model.versions if v.acked_s is not None]
            if isinstance(exc, FileNotFoundError):
                if acked and not model.maybe_unlinked:
                    self.fail(f"(e) {name} is gone, though a write of {len(acked[-1].data)} bytes was acknowledged")
                return
            self.fail(f"(a) {name} cannot be read once healed: {type(exc).__name__}: {exc}")
            return
        self.check_read(name, model, data, started_s)

    def digest(self) -> str:
        """A fingerprint of the run: its events and where every chunk ended up."""
        h = hashlib.sha256("\n".join(self.trace.lines).encode())
        h.update(repr(sorted(self.cluster.query("SELECT block_id, position, server_id, crc FROM chunks"))).encode())
        return h.hexdigest()

    async def main(self) -> None:
        async with asyncio.timeout(VIRTUAL_DEADLINE_S):
            await self.setup()
            for _ in range(self.rng.randint(*FAULT_STEPS)):
                await self.fault_step()
            await self.heal()
        self.trace(f"digest {self.digest()}")

    def client_stats(self) -> dict[str, int]:
        client = self.cluster.client
        if client is None:
            return {}
        cache = client.metadata_cache
        return {**client.blocks.stats, "cache_answers": cache.hits if cache is not None else 0,
                "reader_leases_reused": cache.leases_reused if cache is not None else 0}


def run(seed: int, *, tolerate: bool = True, echo: Callable[[str], None] | None = None) -> Simulation:
    """Play the schedule of ``seed``; raise ``SimulationFailed`` naming it on any violation
    (or any unexpected error). Returns the finished simulation (stats, trace, digest)."""
    with quiet_logs():
        return _play(seed, tolerate, echo)


def _play(seed: int, tolerate: bool, echo: Callable[[str], None] | None) -> Simulation:
    state = random.getstate()
    random.seed(seed)  # the little chance the roles take from the global source (retry jitter)
    sim = Simulation(seed, tolerate=tolerate, echo=echo)
    try:
        sim.cluster.run(sim.main())
        if sim.violation is not None:
            raise sim.violation
        sim.stats.update({f"client_{k}": v for k, v in sim.client_stats().items()})
        sim.stats.update({f"net_{k}": v for k, v in sim.cluster.network.stats.items()})
        sim.stats.update(sim.cluster.meta_served)
        sim.stats.update(sim.cluster.meta_requests())
        if sim.watcher is not None:
            sim.stats["leased_answers"] = sim.watcher.served
        for chunk in sim.cluster.chunks:
            sim.stats.update({f"disk_{k}": v for k, v in chunk.disk.stats.items()})
    except SimulationFailed as exc:
        raise sim.violation or exc
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        if sim.violation is not None:
            raise sim.violation from exc
        try:
            sim.fail(f"{type(exc).__name__}: {exc}")
        except SimulationFailed as failed:
            raise failed from exc
    finally:
        sim.cluster.close()
        random.setstate(state)
    return sim
