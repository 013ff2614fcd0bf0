"""The metadata service (MDS): namespace, block maps and the chunk-server registry.

It never touches file data. Clients ask it for layouts (which chunk servers hold which
chunks of which block), for block allocations (where to write), and to commit what they
wrote; chunk servers register and heartbeat. Every operation goes through the store runner,
which folds concurrent operations into group commits.

Paths arrive as strings and are validated here, so a bad path gets the same clear error
whichever client sent it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from tectofs import limits, paths
from tectofs.errors import Busy, InvalidArgument
from tectofs.rpc import RpcServer
from tectofs.store import SqlStore, StoreRunner
from tectofs.store.dialect import dialect_for

log = logging.getLogger("tectofs.meta")

Reply = tuple[dict[str, Any], bytes]


def _int(header: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = header.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{key} must be an integer, not {value!r}")
    return value


class MetadataService:
    def __init__(
        self,
        store_url: str,
        default_policy: str = "rs(4,2)",
        default_block_size: int = limits.block_size_default_bytes,
        server_dead_after_s: float = limits.server_dead_after_s,
        gc_delay_s: float = 30.0,
        allocation_grace_s: float = limits.allocation_grace_s,
    ) -> None:
        dialect = dialect_for(store_url)
        self.heartbeats_seen: dict[int, float] = {}

        def open_store() -> SqlStore:
            store = SqlStore(dialect, default_policy, default_block_size, gc_delay_s)
            store.server_dead_after_s = server_dead_after_s
            store.heartbeats_seen = self.heartbeats_seen
            return store

        self.runner = StoreRunner(open_store)
        self.allocation_grace_s = allocation_grace_s
        self.rpc = RpcServer(self, "metadata service")
        self.started = time.time()
        self.bad_chunk_reports = 0
        self.busy_answers = 0
        self._gc_task: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        address = await self.rpc.start(host, port)
        self._gc_task = asyncio.get_running_loop().create_task(self._gc_loop())
        return address

    async def close(self) -> None:
        if self._gc_task is not None:
            self._gc_task.cancel()
        await self.rpc.close()
        self.runner.close()

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(min(10.0, self.allocation_grace_s / 2))
            try:
                expired = await self.runner.call("expire_allocations", self.allocation_grace_s)
                if expired:
                    log.info("queued %d uncommitted blocks for deletion", expired)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("allocation expiry failed")

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        # Admission control: past this queue length, new work is refused (the client backs
        # off and retries) instead of growing the queue and everyone's latency without bound.
        if self.runner.queued >= limits.meta_queue_max and method != "heartbeat":
            self.busy_answers += 1
            raise Busy(f"metadata service has {self.runner.queued} operations queued; retry shortly")
        return await self.runner.call(method, *args, **kwargs)

    # ------------------------------------------------------------------ namespace

    async def rpc_lookup(self, h: dict[str, Any], _: memoryview) -> Reply:
        return {"attrs": await self._call("lookup", paths.split(h.get("path")))}, b""

    async def rpc_getattr(self, h: dict[str, Any], _: memoryview) -> Reply:
        return {"attrs": await self._call("getattr_ino", _int(h, "ino"))}, b""

    async def rpc_mkdir(self, h: dict[str, Any], _: memoryview) -> Reply:
        attrs = await self._call(
            "mkdir", paths.split(h.get("path")), _int(h, "mode", 0o755), _int(h, "uid", 0), _int(h, "gid", 0),
            h.get("policy"), _int(h, "block_size"), bool(h.get("exist_ok", False)),
        )
        return {"attrs": attrs}, b""

    async def rpc_makedirs(self, h: dict[str, Any], _: memoryview) -> Reply:
        parts = paths.split(h.get("path"))
        attrs: dict[str, Any] = {}
        for depth in range(1, len(parts) + 1):
            last = depth == len(parts)
            attrs = await self._call(
                "mkdir", parts[:depth], _int(h, "mode", 0o755), _int(h, "uid", 0), _int(h, "gid", 0),
                h.get("policy") if last else None, _int(h, "block_size") if last else None,
                True if not last else bool(h.get("exist_ok", False)),
            )
        return {"attrs": attrs}, b""

    async def rpc_create(self, h: dict[str, Any], _: memoryview) -> Reply:
        attrs = await self._call(
            "create", paths.split(h.get("path")), _int(h, "mode", 0o644), _int(h, "uid", 0), _int(h, "gid", 0),
            bool(h.get("exclusive", False)),
        )
        return {"attrs": attrs}, b""

    async def rpc_symlink(self, h: dict[str, Any], _: memoryview) -> Reply:
        target = h.get("target")
        if not isinstance(target, str):
            raise InvalidArgument("symlink target must be a string")
        attrs = await self._call("symlink", paths.split(h.get("path")), target, _int(h, "uid", 0), _int(h, "gid", 0))
        return {"attrs": attrs}, b""

    async def rpc_readdir(self, h: dict[str, Any], _: memoryview) -> Reply:
        entries = await self._call("readdir", paths.split(h.get("path")))
        return {"entries": [[name, attrs] for name, attrs in entries]}, b""

    async def rpc_setattr(self, h: dict[str, Any], _: memoryview) -> Reply:
        attrs = await self._call(
            "setattr", paths.split(h.get("path")), _int(h, "mode"), _int(h, "uid"), _int(h, "gid"),
            h.get("atime"), h.get("mtime"),
        )
        return {"attrs": attrs}, b""

    async def rpc_truncate(self, h: dict[str, Any], _: memoryview) -> Reply:
        return {"attrs": await self._call("truncate", paths.split(h.get("path")), _int(h, "size"))}, b""

    async def rpc_set_policy(self, h: dict[str, Any], _: memoryview) -> Reply:
        attrs = await self._call("set_policy", paths.split(h.get("path")), h.get("policy"), _int(h, "block_size"))
        return {"attrs": attrs}, b""

    async def rpc_rename(self, h: dict[str, Any], _: memoryview) -> Reply:
        attrs = await self._call(
            "rename", paths.split(h.get("src")), paths.split(h.get("dst")), bool(h.get("noreplace", False))
        )
        return {"attrs": attrs}, b""

    async def rpc_exchange(self, h: dict[str, Any], _: memoryview) -> Reply:
        await self._call("exchange", paths.split(h.get("a")), paths.split(h.get("b")))
        return {}, b""

    async def rpc_unlink(self, h: dict[str, Any], _: memoryview) -> Reply:
        await self._call("unlink", paths.split(h.get("path")))
        return {}, b""

    async def rpc_rmdir(self, h: dict[str, Any], _: memoryview) -> Reply:
        await self._call("rmdir", paths.split(h.get("path")))
        return {}, b""

    async def rpc_statfs(self, h: dict[str, Any], _: memoryview) -> Reply:
        return await self._call("statfs"), b""

    # ------------------------------------------------------------------ data layout

    async def rpc_layout(self, h: dict[str, Any], _: memoryview) -> Reply:
        if "ino" in h:
            return await self._call("layout", None, _int(h, "ino")), b""
        return await self._call("layout", paths.split(h.get("path"))), b""

    async def rpc_allocate(self, h: dict[str, Any], _: memoryview) -> Reply:
        exclude = h.get("exclude") or []
        if not isinstance(exclude, list) or not all(isinstance(x, int) for x in exclude):
            raise InvalidArgument("exclude must be a list of server ids")
        blocks = await self._call(
            "allocate", _int(h, "ino"), _int(h, "count", 1), _int(h, "spares", limits.spare_servers_per_block), exclude
        )
        return {"blocks": blocks}, b""

    async def rpc_commit(self, h: dict[str, Any], _: memoryview) -> Reply:
        blocks = h.get("blocks", [])
        if not isinstance(blocks, list):
            raise InvalidArgument("blocks must be a list")
        layout = await self._call("commit", _int(h, "ino"), _int(h, "size"), blocks, bool(h.get("replace")), h.get("mtime"))
        return layout, b""

    async def rpc_report_bad_chunk(self, h: dict[str, Any], _: memoryview) -> Reply:
        self.bad_chunk_reports += 1
        log.warning(
            "client reports chunk of block %s at position %s on server %s as unreadable: %s",
            h.get("block_id"), h.get("position"), h.get("server_id"), h.get("reason"),
        )
        return {}, b""

    # ------------------------------------------------------------------ chunk servers

    async def rpc_register_server(self, h: dict[str, Any], _: memoryview) -> Reply:
        uuid, address = h.get("uuid"), h.get("address")
        if not isinstance(uuid, str) or not isinstance(address, str):
            raise InvalidArgument("register_server needs uuid and address strings")
        server_id = await self._call("register_server", uuid, address, _int(h, "capacity", 0), _int(h, "used", 0))
        return {"server_id": server_id}, b""

    async def rpc_heartbeat(self, h: dict[str, Any], _: memoryview) -> Reply:
        server_id = _int(h, "server_id")
        arrived = time.time()
        if server_id in self.heartbeats_seen:  # a known server: alive as of now, whatever the queue
            self.heartbeats_seen[server_id] = arrived
        delete = await self._call(
            "heartbeat", server_id, _int(h, "capacity", 0), _int(h, "used", 0), _int(h, "inflight", 0), _int(h, "chunks", 0),
        )
        # Liveness counts from arrival, not from when the store got to it (see SqlStore.heartbeats_seen).
        assert server_id is not None
        self.heartbeats_seen[server_id] = max(arrived, self.heartbeats_seen.get(server_id, 0.0))
        return {"delete": delete}, b""

    async def rpc_servers(self, h: dict[str, Any], _: memoryview) -> Reply:
        return {"servers": await self._call("servers")}, b""

    async def rpc_stats(self, h: dict[str, Any], _: memoryview) -> Reply:
        return {
            "uptime_s": time.time() - self.started,
            "store": dict(self.runner.stats),
            "counts": await self._call("counts"),
            "bad_chunk_reports": self.bad_chunk_reports,
            "busy_answers": self.busy_answers,
            "queued": self.runner.queued,
        }, b""

    async def rpc_ping(self, h: dict[str, Any], _: memoryview) -> Reply:
        return {"ok": True}, b""
