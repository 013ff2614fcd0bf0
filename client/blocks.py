"""Moving one block to and from chunk servers: encode, checksum, parallel put with spares;
parallel get, end-to-end verification, degraded decode and repair.

A block descriptor (as in a layout and in a commit) is::

    {"idx", "block_id", "policy", "length", "valid",
     "chunks": [{"position", "server_id", "address", "length", "crc"}]}
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from typing import Any

from tectofs import checksum, erasure
from tectofs.buffers import BufferPool
from tectofs.errors import (
    Busy,
    ChecksumMismatch,
    ConnectionLost,
    DataUnavailable,
    NoSpace,
    TectofsError,
    Timeout,
)
from tectofs.policy import parse as parse_policy
from tectofs.rpc import RpcClient

log = logging.getLogger("tectofs.client")

# Errors after which another server should be tried for the same chunk.
_SERVER_FAILURES = (ConnectionLost, Timeout, Busy, NoSpace, ChecksumMismatch)


class BlockIO:
    """Block-level data path shared by every open file of one client."""

    def __init__(self, rpc: RpcClient, meta_address: str, executor: Executor, buffers: BufferPool) -> None:
        """``buffers`` backs block buffers, encoded chunks and received chunks; ``rpc`` must
        receive reply payloads into it."""
        self.buffers = buffers
        self.rpc = rpc
        self.meta_address = meta_address
        self.executor = executor
        self.stats = {"degraded_reads": 0, "repaired_chunks": 0, "spare_writes": 0, "bad_chunks": 0}

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    # ------------------------------------------------------------------ write

    async def write_block(self, idx: int, data: memoryview, allocation: dict[str, Any]) -> dict[str, Any]:
        """Encode ``data`` under the allocation's policy and store every chunk on a distinct
        server, falling back to the allocation's spare servers; returns the block descriptor
        to commit. Raises NoSpace if fewer servers than chunks accepted the block."""
        policy = parse_policy(allocation["policy"])
        chunks, crcs = await self._in_thread(_encode_and_checksum, policy, data, self.buffers.get)
        try:
            return await self._place(idx, data, allocation, policy, chunks, crcs)
        finally:
            if policy.kind == "rs":
                for chunk in chunks:
                    self.buffers.put(chunk)

    async def _place(
        self, idx: int, data: memoryview, allocation: dict[str, Any], policy: Any, chunks: list[Any], crcs: list[Any]
    ) -> dict[str, Any]:
        servers = list(allocation["servers"])
        primaries, spares = servers[: policy.width], servers[policy.width :]
        block_id = allocation["block_id"]
        spare_lock = asyncio.Lock()

        async def place(position: int) -> dict[str, Any]:
            server = primaries[position]
            errors = []
            while True:
                try:
                    await self._put(server["address"], block_id, position, chunks[position], crcs[position])
                    return {
                        "position": position, "server_id": server["server_id"], "address": server["address"],
                        "length": len(chunks[position]), "crc": crcs[position][1],
                    }
                except _SERVER_FAILURES as exc:
                    errors.append(f"{server['address']}: {exc}")
                    async with spare_lock:
                        if not spares:
                            raise NoSpace(
                                f"block {block_id} chunk {position}: no chunk server accepted it ({'; '.join(errors)})"
                            ) from None
                        server = spares.pop(0)
                    self.stats["spare_writes"] += 1
                    log.info("chunk %d of block %d goes to spare %s", position, block_id, server["address"])

        placed = await asyncio.gather(*(place(p) for p in range(policy.width)))
        return {"idx": idx, "block_id": block_id, "policy": str(policy), "length": len(data), "chunks": placed}

    async def _put(
        self, address: str, block_id: int, position: int, chunk: Any, crcs: tuple[list[int], int], overwrite: bool = False
    ) -> None:
        pieces, whole = crcs
        await self.rpc.call(
            address, "put_chunk",
            {"block_id": block_id, "position": position, "crcs": pieces, "crc": whole, "overwrite": overwrite},
            chunk, idempotent=True,
        )

    # ------------------------------------------------------------------ read

    async def read_block(self, block: dict[str, Any]) -> memoryview:
        """Return the block's ``length`` bytes, reading any ``needed`` chunks in parallel,
        data chunks first; parity (or other replicas) stand in for chunks that are missing,
        unreachable or fail their checksum, and such chunks are repaired in the background.

        The result is a buffer of the pool: give it back with ``self.buffers.put`` when done."""
        policy = parse_policy(block["policy"])
        by_position = {c["position"]: c for c in block["chunks"]}
        order = sorted(by_position)
        got: dict[int, Any] = {}
        failed: dict[int, str] = {}
        corrupt: list[int] = []
        next_candidate = 0

        async def fetch(position: int) -> None:
            chunk = by_position[position]
            try:
                got[position] = await self._get(block["block_id"], chunk)
            except ChecksumMismatch as exc:
                failed[position] = str(exc)
                corrupt.append(position)
            except (TectofsError, OSError) as exc:
                failed[position] = str(exc)

        while len(got) < policy.needed:
            missing = policy.needed - len(got)
            batch = order[next_candidate : next_candidate + missing]
            if not batch:
                raise DataUnavailable(
                    f"block {block['block_id']}: only {len(got)} of {policy.needed} needed chunks readable; "
                    + "; ".join(f"chunk {p}: {why}" for p, why in sorted(failed.items()))
                )
            next_candidate += len(batch)
            await asyncio.gather(*(fetch(p) for p in batch))
        if failed:
            self.stats["degraded_reads"] += 1
            for position in failed:
                await self._report(block, by_position[position], failed[position])
        out = self.buffers.get(block["length"])
        try:
            await self._in_thread(erasure.decode_into, policy, got, out)
        except BaseException:
            self.buffers.put(out)
            raise
        if corrupt:
            asyncio.get_running_loop().create_task(self._repair(block, policy, got, corrupt))
        else:
            for payload in got.values():
                self.buffers.put(payload)
        return out

    async def _get(self, block_id: int, chunk: dict[str, Any]) -> Any:
        if not chunk.get("address"):
            raise ConnectionLost(f"chunk server {chunk['server_id']} is not registered")
        header, payload = await self.rpc.call(
            chunk["address"], "get_chunk", {"block_id": block_id}, idempotent=True, retries_max=1
        )
        if len(payload) != chunk["length"]:
            self.buffers.put(payload)
            raise ChecksumMismatch(f"chunk of {len(payload)} bytes where {chunk['length']} were written")
        whole = await self._in_thread(checksum.crc, payload)
        if whole != chunk["crc"]:
            self.buffers.put(payload)
            raise ChecksumMismatch(f"chunk from {chunk['address']} does not match the checksum recorded at write")
        return payload

    async def _report(self, block: dict[str, Any], chunk: dict[str, Any], reason: str) -> None:
        self.stats["bad_chunks"] += 1
        try:
            await self.rpc.call(
                self.meta_address, "report_bad_chunk",
                {"block_id": block["block_id"], "position": chunk["position"], "server_id": chunk["server_id"],
                 "reason": reason[:500]},
                retries_max=0, timeout_s=5,
            )
        except TectofsError:
            pass

    async def _repair(self, block: dict[str, Any], policy: Any, available: dict[int, Any], positions: list[int]) -> None:
        """Rewrite chunks that failed their checksum from the ones that did not."""
        try:
            rebuilt = await self._in_thread(erasure.reconstruct, policy, available, positions, block["length"])
            for position, data in rebuilt.items():
                chunk = next(c for c in block["chunks"] if c["position"] == position)
                crcs = await self._in_thread(_checksums, data)
                if crcs[1] != chunk["crc"]:
                    log.error("repair of block %d chunk %d rebuilt different bytes; not written", block["block_id"], position)
                    continue
                await self._put(chunk["address"], block["block_id"], position, data, crcs, overwrite=True)
                self.stats["repaired_chunks"] += 1
                log.info("repaired chunk %d of block %d on %s", position, block["block_id"], chunk["address"])
        except Exception as exc:  # best effort: the read already succeeded
            log.warning("repair of block %d failed: %s", block["block_id"], exc)
        finally:
            for payload in available.values():
                self.buffers.put(payload)


def _checksums(data: Any) -> tuple[list[int], int]:
    return checksum.piece_crcs(data), checksum.crc(data)


def _encode_and_checksum(
    policy: Any, data: memoryview, allocate: Any
) -> tuple[list[Any], list[tuple[list[int], int]]]:
    chunks = erasure.encode(policy, data, allocate)
    if policy.kind == "rep":
        sums = _checksums(data)
        return chunks, [sums] * len(chunks)
    return chunks, [_checksums(c) for c in chunks]
