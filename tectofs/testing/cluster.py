"""A whole tectofs cluster of production roles in one process, on the simulator's seams.

The real ``MetadataService`` (its store inline on the loop's thread, a SQLite file that
outlives its crashes), real ``ChunkServer``s (each with a data directory that outlives its
crashes unless wiped) and a real ``AsyncFileSystem`` client talk over the in-memory network
(``tectofs.testing.network``) on a virtual-time loop (``tectofs.testing.loop``). Nothing here
answers for a role: the schedule (``tectofs.testing.schedule``) only starts, crashes,
partitions and damages them, and calls the client as an application does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import shutil
import sqlite3
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Iterator, TypeVar

from tectofs import limits
from tectofs.client import AsyncFileSystem
from tectofs.server.chunk.service import ChunkServer
from tectofs.server.meta.service import MetadataService
from tectofs.testing.disk import SimDisk
from tectofs.testing.loop import SimLoop, VirtualClock, host_context
from tectofs.testing.network import Network, NetworkFaults
from tectofs.wire import auth

T = TypeVar("T")

BLOCK_SIZE = limits.block_size_min_bytes  # 64 KiB: the smallest block the store accepts
POLICY = "rs(4,2)"
META_HOST = "10.0.0.1"
META_PORT = 7000
CHUNK_PORT = 7001
CLIENT_HOST = "10.0.9.1"
# Virtual seconds, short so that a schedule of a few dozen steps crosses every threshold.
DEAD_AFTER_S = 7.0
REPAIR_AFTER_S = 8.0
REPAIR_INTERVAL_S = 1.0
GC_DELAY_S = 4.0
ALLOCATION_GRACE_S = 20.0
ORPHAN_GRACE_S = 8.0
HEARTBEAT_S = 2.0
INVENTORY_S = 30.0
SCRUB_PASS_S = 15.0


@dataclass
class ChunkHost:
    """One chunk-server machine: its address, its disk (a directory), and the process running
    on it, if any."""

    host: str
    data_dir: str
    identity: str
    disk: SimDisk
    process: ChunkServer | None = None
    partitioned: bool = False
    generation: int = 0  # how many times its disk was replaced

    @property
    def address(self) -> str:
        return f"{self.host}:{CHUNK_PORT}"

    @property
    def up(self) -> bool:
        return self.process is not None


@dataclass
class Trace:
    """What happened, in virtual time: the readable replay of a seed."""

    clock: VirtualClock
    lines: list[str] = field(default_factory=list)
    echo: Callable[[str], None] | None = None

    def __call__(self, text: str) -> None:
        line = f"{self.clock.now:9.3f}s  {text}"
        self.lines.append(line)
        if self.echo is not None:
            self.echo(line)


class Cluster:
    """The roles of one simulation and the means to crash and restart them."""

    def __init__(self, seed: int, rng: random.Random, faults: NetworkFaults, servers: int,
                 echo: Callable[[str], None] | None = None, network_type: type[Network] = Network) -> None:
        self.seed = seed
        self.rng = rng
        self.clock = VirtualClock()
        self.network = network_type(random.Random(rng.getrandbits(64)), faults)  # a subclass: sim_histories' pauses
        self.loop = SimLoop(self.clock, self.network)
        self.trace = Trace(self.clock, echo=echo)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.dir = tempfile.mkdtemp(prefix=f"tectofs-sim-{seed}-", dir=shm)
        self.key_file = auth.create_key_file(os.path.join(self.dir, "cluster.key"))
        self.store_path = os.path.join(self.dir, "meta.db")
        self.meta_address = f"{META_HOST}:{META_PORT}"
        self.meta: MetadataService | None = None
        self.meta_skew_s = 0.0
        self.meta_served: Counter[str] = Counter()  # requests of metadata services since crashed
        self.chunks = [ChunkHost(f"10.0.1.{i + 1}", os.path.join(self.dir, f"chunk{i + 1}"), self._identity(),
                                 SimDisk(random.Random(rng.getrandbits(64)))) for i in range(servers)]
        self.client: AsyncFileSystem | None = None
        self.on_delete: Callable[[ChunkHost, list[int]], None] | None = None  # the GC invariant's hook
        self.store_rng = random.Random(rng.getrandbits(64))
        # Every third seed keeps small files inline in the metadata store; the others put every
        # file in chunks, so most schedules still exercise the chunk paths (degraded writes,
        # spares, hedges) with the small files the schedules write.
        self.inline_max = limits.inline_bytes_default if seed % 3 == 0 else 0

    def _identity(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def close(self) -> None:
        """Stop every process (their tasks end on this loop, not on a closed one) and remove
        the disks."""
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        if self.meta is not None:
            self.meta.runner.close()
        for chunk in self.chunks:
            self._drop_chunk_process(chunk)
        self.loop.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(main)

    # ------------------------------------------------------------------ the metadata service

    async def start_meta(self, skew_s: float = 0.0) -> None:
        """Start the metadata service; its wall clock reads ``skew_s`` off the others' (a
        host whose clock was stepped while it was down: NTP, a new machine)."""
        assert self.meta is None
        self.meta_skew_s = skew_s

        def skewed() -> float:
            return self.clock.time() + skew_s

        meta = host_context(META_HOST).run(
            MetadataService, self.store_path, POLICY, BLOCK_SIZE, server_dead_after_s=DEAD_AFTER_S,
            gc_delay_s=GC_DELAY_S, allocation_grace_s=ALLOCATION_GRACE_S, repair_after_s=REPAIR_AFTER_S,
            repair_interval_s=REPAIR_INTERVAL_S, orphan_grace_s=ORPHAN_GRACE_S, key_file=self.key_file,
            clock=skewed, rng=random.Random(self.store_rng.getrandbits(64)), inline_store=True,
            inline_max=self.inline_max,
        )
        await self.loop.spawn(META_HOST, meta.start(META_HOST, META_PORT))
        self.meta = meta
        self.trace(f"meta: started{f' (clock {skew_s:+.1f} s)' if skew_s else ''}")

    def meta_requests(self) -> dict[str, int]:
        """Requests the running metadata service answered, by operation (its metrics)."""
        out: dict[str, int] = {}
        if self.meta is not None:
            for metric in self.meta.metrics.registry.collect():
                for sample in metric.samples:
                    if sample.name == "tectofs_meta_requests_total":
                        op = f"meta_{sample.labels['op']}"
                        out[op] = out.get(op, 0) + int(sample.value)
        return out

    def crash_meta(self) -> None:
        """The metadata service's process dies between two steps; its store stays."""
        assert self.meta is not None
        self.meta_served.update(self.meta_requests())
        self.network.crash(META_HOST)
        self.loop.cancel_host(META_HOST)
        self.meta.runner.close()
        self.meta = None
        self.trace("meta: CRASHED")

    # ------------------------------------------------------------------ chunk servers

    async def start_chunk(self, chunk: ChunkHost) -> None:
        assert chunk.process is None
        os.makedirs(chunk.data_dir, exist_ok=True)
        identity = os.path.join(chunk.data_dir, "server.json")
        if not os.path.exists(identity):  # a seeded identity, not uuid4's
            with open(identity, "w") as f:
                f.write(f'{{"uuid": "{chunk.identity}"}}')
        process = host_context(chunk.host).run(
            ChunkServer, chunk.data_dir, self.meta_address, heartbeat_interval_s=HEARTBEAT_S, io_threads=1,
            scrub_rate_bytes_per_s=64 * limits.MiB, inventory_interval_s=INVENTORY_S, scrub_interval_s=SCRUB_PASS_S,
            key_file=self.key_file, pack_max_bytes=0, disk=chunk.disk,
        )
        deliver = process._delete

        def delete(block_ids: list[int]) -> int:  # GC orders as they reach the disk (invariant c)
            if self.on_delete is not None:
                self.on_delete(chunk, block_ids)
            return deliver(block_ids)

        process._delete = delete  # type: ignore[method-assign]
        chunk.process = process
        try:
            await self.loop.spawn(chunk.host, process.start(chunk.host, CHUNK_PORT))
        except Exception as exc:  # could not register (the service is away): the process exits
            self.trace(f"chunk {chunk.host}: start failed ({type(exc).__name__}: {exc})")
            self.crash_chunk(chunk, quiet=True)
            return
        self.trace(f"chunk {chunk.host}: started as server {process.server_id}")

    def _drop_chunk_process(self, chunk: ChunkHost) -> None:
        process, chunk.process = chunk.process, None
        if process is not None:
            os.close(process._lock_fd)
            process._io.shutdown(wait=False)
            process._gc_io.shutdown(wait=False)

    def crash_chunk(self, chunk: ChunkHost, quiet: bool = False) -> None:
        """A chunk server's machine loses power between two steps: the process is gone, and
        of its disk only what was made durable stays."""
        self.network.crash(chunk.host)
        self.loop.cancel_host(chunk.host)
        self._drop_chunk_process(chunk)
        chunk.disk.crash()
        if not quiet:
            self.trace(f"chunk {chunk.host}: CRASHED")

    def wipe_chunk(self, chunk: ChunkHost) -> None:
        """The machine's disk is replaced: a new, empty server at the same address."""
        if chunk.up:
            self.crash_chunk(chunk)
        shutil.rmtree(chunk.data_dir, ignore_errors=True)
        chunk.disk = SimDisk(random.Random(self.rng.getrandbits(64)))
        chunk.generation += 1
        chunk.identity = self._identity()
        self.trace(f"chunk {chunk.host}: disk WIPED")

    def partition(self, chunk: ChunkHost, on: bool) -> None:
        chunk.partitioned = on
        (self.network.unreachable.add if on else self.network.unreachable.discard)(chunk.host)
        self.trace(f"chunk {chunk.host}: {'PARTITIONED' if on else 'reachable again'}")

    def chunk_by_server_id(self) -> dict[int, ChunkHost]:
        return {c.process.server_id: c for c in self.chunks if c.process is not None and c.process.server_id}

    # ------------------------------------------------------------------ the client

    def start_client(self) -> AsyncFileSystem:
        self.network.crashed.discard(CLIENT_HOST)
        credential = auth.Credential.root_from_keys(auth.KeyRing(self.key_file))
        self.client = host_context(CLIENT_HOST).run(AsyncFileSystem, self.meta_address, credential,
                                                   clock=self.clock.monotonic, leases=True)
        return self.client

    def crash_client(self) -> None:
        """The application's process dies mid-whatever: its writes stop where they are."""
        self.network.crash(CLIENT_HOST)
        self.loop.cancel_host(CLIENT_HOST)
        self.client = None
        self.trace("client: CRASHED")

    async def as_client(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self.loop.spawn(CLIENT_HOST, coro)

    # ------------------------------------------------------------------ the checks' view of the store

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The checks' own read-only look at the service's database (invariants only)."""
        connection = sqlite3.connect(f"file:{self.store_path}?mode=ro", uri=True)
        try:
            return connection.execute(sql, args).fetchall()
        finally:
            connection.close()


@contextlib.contextmanager
def quiet_logs() -> Iterator[None]:
    """The roles log every fault they survive; a simulation injects thousands: within this,
    tectofs and asyncio log critical events only (their levels are restored after, so a
    process that also runs other code, a test worker say, logs as before)."""
    loggers = [logging.getLogger(name) for name in ("tectofs", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
