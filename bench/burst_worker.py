"""The worker side of the burst harness (``bench/burst.py``): one process, one asyncio loop,
many simulated ranks, each with its own tectofs client.

Started by the coordinator as ``python -m tectofs.benchmarks.burst_worker CONFIG_JSON``; reads one JSON
command per line on stdin (``save``, ``load``, ``metadata``, ``exit``) and answers one JSON
event per line on stdout. End of input (the coordinator died) ends the worker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import resource
import sys
import time
from typing import Any, Callable

MiB = 1 << 20
METADATA_HEADER_BYTES = 4096  # .metadata: a JSON header padded to this, then 32 bytes per rank
READ_PIECE_BYTES = 8 * MiB


class BurstError(Exception):
    """The run could not go on (a worker died or a phase overran); the message says where."""



def _rank_rotation(rank: int, shard_bytes: int) -> int:
    """Each rank's shard is the process's random base rotated by this many bytes, so shards
    differ without holding one copy per rank."""
    return (rank * 4099 * 64) % shard_bytes if shard_bytes else 0


class _Rank:
    def __init__(self, rank: int, fs: Any) -> None:
        self.rank = rank
        self.fs = fs
        self.digest = b""


class _Worker:
    """One process's ranks. Commands arrive as JSON lines on stdin, replies leave on stdout."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.shard_bytes = int(config["shard_bytes"])
        rng = random.Random(f"{config['seed']}-{config['worker']}")
        self.base = memoryview(rng.randbytes(self.shard_bytes))
        self.ranks: list[_Rank] = []

    def _pieces(self, rank: int) -> tuple[memoryview, memoryview]:
        k = _rank_rotation(rank, self.shard_bytes)
        return self.base[k:], self.base[:k]

    async def setup(self) -> dict[str, Any]:
        from tectofs.client import AsyncFileSystem
        from tectofs.client.metadata import MetadataClient

        class TimedMetadataClient(MetadataClient):
            """Records the time spent in each metadata operation (e.g. ``commit``)."""

            def __init__(self, rpc: Any, address: str) -> None:
                super().__init__(rpc, address)
                self.op_seconds: dict[str, float] = {}

            async def call(self, operation: Any, request: Any, complete: Any = None, *, ordered: bool = True) -> Any:
                started = time.perf_counter()
                try:
                    return await super().call(operation, request, complete, ordered=ordered)
                finally:
                    seconds = time.perf_counter() - started
                    self.op_seconds[operation.name] = self.op_seconds.get(operation.name, 0.0) + seconds

        class TimedFileSystem(AsyncFileSystem):
            def __init__(self, address: str) -> None:
                super().__init__(address)
                self.metadata = timed = TimedMetadataClient(self.meta_rpc, address)
                self.op_seconds = timed.op_seconds

        address = self.config["address"]
        for rank in self.config["ranks"]:
            state = _Rank(rank, TimedFileSystem(address))
            first, second = self._pieces(rank)
            digest = hashlib.sha256(first)
            digest.update(second)
            state.digest = digest.digest()
            self.ranks.append(state)
        # Like a real job: every rank connects before the first checkpoint.
        results = await asyncio.gather(*(r.fs.metadata.ping() for r in self.ranks), return_exceptions=True)
        errors = [f"rank {r.rank}: connect: {_describe(x)}" for r, x in zip(self.ranks, results) if isinstance(x, BaseException)]
        return {"event": "ready", "errors": errors[:20], "error_count": len(errors)}

    async def _run_ranks(self, command: dict[str, Any], one: Callable[[_Rank, dict[str, Any]], Any]) -> dict[str, Any]:
        timeout_s = float(command["timeout_s"])
        await asyncio.sleep(max(0.0, float(command["start_at"]) - time.time()))  # the barrier

        async def bounded(state: _Rank) -> list[Any]:
            started = time.time()
            state.fs.op_seconds.clear()
            try:
                timings = await asyncio.wait_for(one(state, command), timeout_s)
                error = None
            except asyncio.TimeoutError:
                timings, error = {}, f"did not finish within {timeout_s:.0f}s"
            except Exception as exc:
                timings, error = {}, _describe(exc)
            return [state.rank, started, time.time(), timings, dict(state.fs.op_seconds), error]

        rows = await asyncio.gather(*(bounded(r) for r in self.ranks))
        return {"event": command["op"], "rows": rows, "max_rss_bytes": _max_rss_bytes()}

    async def _save_one(self, state: _Rank, command: dict[str, Any]) -> dict[str, Any]:
        path = f"{command['dir']}/rank-{state.rank}.bin"
        t0 = time.perf_counter()
        handle = await state.fs.open(path, "wb")
        t1 = time.perf_counter()
        try:
            first, second = self._pieces(state.rank)
            await handle.write(0, first)
            if len(second):
                await handle.write(len(first), second)
            t2 = time.perf_counter()
            await handle.close()
        except BaseException:
            await handle.abort()
            raise
        t3 = time.perf_counter()
        return {"open_s": t1 - t0, "write_s": t2 - t1, "close_s": t3 - t2, "digest": state.digest.hex(),
                "spare_writes": state.fs.blocks.stats.get("spare_writes", 0),
                "hedged_writes": state.fs.blocks.stats.get("hedged_writes", 0)}

    async def _load_one(self, state: _Rank, command: dict[str, Any]) -> dict[str, Any]:
        directory = command["dir"]
        t0 = time.perf_counter()
        recorded = await state.fs.read_range(f"{directory}/.metadata", METADATA_HEADER_BYTES + 32 * state.rank, 32)
        t1 = time.perf_counter()
        handle = await state.fs.open(f"{directory}/rank-{state.rank}.bin", "rb")
        try:
            if handle.size != self.shard_bytes:
                raise BurstError(f"shard has {handle.size} bytes, {self.shard_bytes} were written")
            digest = hashlib.sha256()
            buffer = bytearray(min(READ_PIECE_BYTES, max(1, self.shard_bytes)))
            offset = 0
            while offset < handle.size:
                n = await handle.readinto(offset, buffer)
                if n <= 0:
                    raise BurstError(f"short read at offset {offset}")
                digest.update(memoryview(buffer)[:n])
                offset += n
        finally:
            await handle.close()
        t2 = time.perf_counter()
        if recorded != state.digest:
            raise BurstError(f"digest in .metadata is {recorded.hex()[:16]}..., this rank wrote {state.digest.hex()[:16]}...")
        if digest.digest() != state.digest:
            raise BurstError(f"read back digest {digest.hexdigest()[:16]}... differs from the one written")
        return {"metadata_s": t1 - t0, "read_s": t2 - t1, "verified": True}

    async def _metadata_one(self, state: _Rank, command: dict[str, Any]) -> dict[str, Any]:
        """Create and close empty files: create + commit + layout each, no data."""
        t0 = time.perf_counter()
        for i in range(int(command["files_per_rank"])):
            handle = await state.fs.open(f"{command['dir']}/r{state.rank}-{i}", "wb")
            await handle.close()
        return {"files_s": time.perf_counter() - t0}

    async def close(self) -> None:
        await asyncio.gather(*(r.fs.close() for r in self.ranks), return_exceptions=True)

    async def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        if command["op"] == "save":
            return await self._run_ranks(command, self._save_one)
        if command["op"] == "load":
            return await self._run_ranks(command, self._load_one)
        if command["op"] == "metadata":
            return await self._run_ranks(command, self._metadata_one)
        raise BurstError(f"unknown command {command['op']!r}")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker_main(config_json: str) -> None:
    """Entry of one worker process (``burst.py --worker CONFIG``)."""
    config = json.loads(config_json)
    loop = asyncio.new_event_loop()
    worker = _Worker(config)

    def reply(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        try:
            reply(loop.run_until_complete(asyncio.wait_for(worker.setup(), float(config["setup_timeout_s"]))))
        except Exception as exc:
            reply({"event": "ready", "errors": [f"worker {config['worker']} setup: {_describe(exc)}"], "error_count": 1})
        for line in sys.stdin:  # EOF (the coordinator died) ends the worker
            command = json.loads(line)
            if command["op"] == "exit":
                break
            try:
                reply(loop.run_until_complete(worker.handle(command)))
            except Exception as exc:
                reply({"event": command["op"], "fatal": _describe(exc)})
    finally:
        try:
            loop.run_until_complete(asyncio.wait_for(worker.close(), 30))
        finally:
            loop.close()


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python3 -m tectofs.benchmarks.burst_worker CONFIG_JSON\n\nThe worker side of bench/burst.py, "
              "which starts it; not run by hand: run python3 -m tectofs.benchmarks.burst --help.")
        sys.exit(0 if sys.argv[1:] in (["-h"], ["--help"]) else 2)
    worker_main(sys.argv[1])
