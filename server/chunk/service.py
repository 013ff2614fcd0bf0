"""The chunk server: stores chunks for clients, registers and heartbeats with the MDS.

RPC operations (``messages.CHUNK_OPERATIONS``; requests arrive validated):

- ``put_chunk`` + payload: verified, stored durably, then acknowledged. Answered BUSY,
  before the payload is buffered, when ``inflight_bytes_max`` is reached or its principal
  (the uid in its write capability) holds its fair share of it (``admission.py``).
- ``get_chunk`` -> ``GetChunkReply`` + payload. Ranges under ``limits.chunk_sendfile_min_bytes``,
  packed chunks and reads over TLS are verified here against the stored crcs; larger ranges of
  chunk files leave unread by sendfile (``tectofs.wire.sendfile``): every reader checks a chunk
  against the crc the metadata service recorded at write, end to end.
- ``delete_chunks`` (cluster members only: the metadata service's GC), ``stat``, ``ping``.

Who may: peers that proved the cluster key in their hello (the metadata service, other chunk
servers rebuilding) may do everything; anonymous clients get and put only with a capability
the metadata service signed for that block (``tectofs.wire.auth``), checked here with one HMAC.

Heartbeats carry capacity, load and scrub/repair progress; their replies carry
garbage-collection orders and rebuild orders (``repair.py``). In the background, a scrubber
re-verifies every chunk at a bounded rate and full inventories go to the metadata service
(``scrub.py``).
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import msgspec

from tectofs import limits, private_files
from tectofs.buffers import BufferPool
from tectofs.capacity import DISK_ID, filesystem_id
from tectofs.client.metadata import MetadataClient
from tectofs.errors import (
    AuthenticationFailed,
    CapabilityExpired,
    CapabilityRefused,
    ChunkMissing,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TectofsError,
)
from tectofs.metrics import ChunkMetrics
from tectofs.server import addresses
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient
from tectofs.wire.framing import FrameHeader
from tectofs.wire.sendfile import FileRegion
from tectofs.wire.server import Handlers, RpcServer, current_peer
from tectofs.wire.transport import ReplyPayload

from . import admission
from .disk import REAL_DISK, Disk
from .repair import Repairer
from .scrub import Inventory, Scrubber
from .storage import ChunkStore

log = logging.getLogger("tectofs.chunk")


class ChunkServer:
    def __init__(
        self,
        data_dir: str,
        meta_address: str,
        inflight_bytes_max: int = limits.chunk_inflight_bytes_max,
        heartbeat_interval_s: float = limits.heartbeat_interval_s,
        sync: str = "each",
        io_threads: int = 16,
        scrub_rate_bytes_per_s: float = limits.scrub_rate_bytes_per_s,
        repair_concurrency: int = limits.repair_concurrency_per_server,
        repair_rate_bytes_per_s: float = limits.repair_rate_bytes_per_s,
        inventory_interval_s: float = limits.inventory_interval_s,
        scrub_interval_s: float = limits.scrub_pass_interval_s,
        key_file: str | None = None,
        advertise: str | None = None,
        pack_max_bytes: int = limits.chunk_pack_max_bytes_default,
        *,
        disk: Disk = REAL_DISK,
    ) -> None:
        """``key_file``: the cluster key (required; ``tectofs.wire.auth``). ``pack_max_bytes``:
        chunks up to this size are packed into segment files (``packs.py``; 0: a file each). ``advertise``
        (``HOST[:PORT]``): the address registered with the metadata service, which hands it to
        every client and peer (``server/addresses.py``; default: the bound address; a wildcard
        bind needs it). ``disk``: the chunk-disk seam (``disk.py``; the simulator's fails and lies)."""
        path = auth.key_file_from(key_file)
        if path is None:
            raise InvalidArgument("a chunk server needs the cluster key: --key-file FILE or $TECTOFS_KEY_FILE")
        self.keys = auth.KeyRing(path)
        self.data_dir = os.path.abspath(data_dir)
        os.makedirs(self.data_dir, mode=private_files.DIRECTORY_MODE, exist_ok=True)
        private_files.owner_only(self.data_dir, private_files.DIRECTORY_MODE)  # (chunks below: its owner's alone)
        self._lock_fd = _lock_data_dir(self.data_dir)
        self.meta_address = meta_address
        self.inflight_bytes_max = inflight_bytes_max
        self.heartbeat_interval_s = heartbeat_interval_s
        self.metrics = ChunkMetrics()  # exported by `tectofs chunk --metrics` (tectofs.metrics.serve)
        self.advertise = advertise
        # Where `--metrics` serves (HOST:PORT, set before start()), and what start() derives and registers:
        self.metrics_address: str | None = None
        self.address = ""
        self.metrics_url: str | None = None
        self.store = ChunkStore(self.data_dir, sync=sync, on_sync=self.metrics.sync_seconds.observe,
                                pack_max_bytes=pack_max_bytes, disk=disk)
        self.metrics.watch_disk_free(self.store.disk_free_bytes)
        self.uuid = self._identity()
        self.admission = admission.Admission(inflight_bytes_max)
        self.buffers = BufferPool(inflight_bytes_max, aligned=True)  # received chunks can go to disk with O_DIRECT
        self.server_id: int | None = None
        self.stats = {"puts": 0, "gets": 0, "busy": 0, "checksum_errors": 0, "deleted": 0, "pack_bytes_compacted": 0,
                      "reads_sent_from_file": 0}
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="chunk-io")
        self._gc_io = ThreadPoolExecutor(1, thread_name_prefix="chunk-gc")
        self.rpc = RpcServer(self, "chunk server", messages.CHUNK_OPERATIONS, "chunk", self._handlers(),
                             allocate_payload=self._admit, authenticator=self, observe=self.metrics.requests.observe)
        member = auth.ClientAuth(ring=self.keys)  # to the metadata service and to peers: we hold the key
        self.meta = RpcClient(connections_per_server=1, timeout_s=10, retries_max=1, role="chunk", default_auth=member)
        self.meta.expect_role(meta_address, "meta")
        self.metadata = MetadataClient(self.meta, meta_address)  # the background work's reports (reports.py)
        self.peers = RpcClient(connections_per_server=1, role="chunk", default_auth=member)
        self.repairer = Repairer(self.store, self.peers, self.metadata, self._in_thread, repair_concurrency,
                                 repair_rate_bytes_per_s, deletes_done=self._deletes_done,
                                 busy=lambda: self.inflight_bytes > 0)
        self.repairer.on_idle = self._heartbeat_soon  # ask for more work at once
        self.scrubber = Scrubber(self.store, self.metadata, self._in_thread, scrub_rate_bytes_per_s,
                                 lambda: self.server_id, busy=lambda: self.inflight_bytes > 0,
                                 pass_interval_s=scrub_interval_s)
        self.inventory = Inventory(self.store, self.metadata, self._in_thread, lambda: self.server_id)
        self.inventory_interval_s = inventory_interval_s
        self.scrub_enabled = scrub_rate_bytes_per_s > 0
        self._tasks: list[asyncio.Task[None]] = []
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._register_lock = asyncio.Lock()

    def _identity(self) -> str:
        """A stable identity for this data directory, so a restart keeps its server id."""
        path = os.path.join(self.data_dir, "server.json")
        try:
            with open(path) as f:
                return str(json.load(f)["uuid"])
        except FileNotFoundError:
            ident = str(uuid.uuid4())
            with open(path + ".tmp", "w") as f:
                json.dump({"uuid": ident}, f)
                f.flush()
                os.fsync(f.fileno())
            os.rename(path + ".tmp", path)
            return ident

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port``, register, start heartbeats; returns the advertised address.
        InvalidArgument for a wildcard ``host`` without ``advertise`` (nobody can reach that
        address; refused before listening), or a metrics URL that would name no reachable host
        (refused before registering)."""
        if addresses.is_wildcard(host) and not self.advertise:
            raise InvalidArgument(
                f"a chunk server listening on {host or '*'} (every address) has no address to register: add"
                " --advertise HOST[:PORT], the address clients and other servers reach it at")
        bound = await self.rpc.start(host, port)
        try:
            self.address = addresses.advertised(bound, self.advertise) or bound
            self.metrics_url = addresses.metrics_url(self.metrics_address, self.address) if self.metrics_address else None
        except InvalidArgument:
            await self.rpc.close()
            raise
        await self._register()
        loop = asyncio.get_running_loop()
        self._heartbeat_task = loop.create_task(self._heartbeat_loop())
        self._tasks.append(loop.create_task(self.inventory.run(self.inventory_interval_s)))
        if self.scrub_enabled:
            self._tasks.append(loop.create_task(self.scrubber.run()))
        if self.store.packs is not None:
            self._tasks.append(loop.create_task(self._compact_loop()))
        return self.address

    async def _compact_loop(self) -> None:
        """Return the space of deleted packed chunks: one mostly dead segment at a time, while
        no client writes here (a checkpoint keeps its speed)."""
        while True:
            await asyncio.sleep(limits.chunk_pack_compact_interval_s)
            try:
                while self.inflight_bytes == 0:
                    moved = await self._in_thread(self.store.compact_packs)
                    if not moved:
                        break
                    self.stats["pack_bytes_compacted"] += moved
            except Exception as exc:  # the loop must outlive one bad segment
                log.warning("compacting packed chunks failed: %s (tried again later)", exc)

    async def close(self) -> None:
        for task in [self._heartbeat_task, *self._tasks]:
            if task is not None:
                task.cancel()
        await self.repairer.close()
        await self.rpc.close()
        await self.meta.close()
        await self.peers.close()
        self._io.shutdown(wait=False, cancel_futures=True)
        self._gc_io.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ admission

    def _admit(self, header: FrameHeader, length: int) -> Callable[[], memoryview] | None:
        """Reserve memory for an incoming put's payload from its principal's share of the
        budget (``admission.py``), or refuse it (drained, answered BUSY). The buffer itself is
        taken from the pool only once the payload's first bytes arrived (``tectofs.wire.framing``):
        a peer that declares a payload and sends none commits nothing, and its reservation ends
        with its connection (``payload_abandoned``), which stalls and slow payloads close
        (``tectofs.wire.connlimits``)."""
        if not self.admission.admit(admission.principal_of(header.get("cap")), length):
            self.stats["busy"] += 1
            self.metrics.busy_answers.inc()
            return None
        return lambda: self.buffers.get(length)

    @property
    def inflight_bytes(self) -> int:
        """Bytes of puts admitted and not yet stored (or refused, or abandoned)."""
        return self.admission.total_bytes

    def payload_sent(self, payload: Any) -> None:
        """A reply payload went out: its buffer can serve the next request."""
        self.buffers.put(payload)

    def payload_unused(self, payload: memoryview, header: FrameHeader) -> None:
        """An admitted put turned out invalid: give its reservation and buffer back."""
        self.admission.release(admission.principal_of(header.get("cap")), len(payload))
        self.buffers.put(payload)

    def payload_abandoned(self, length: int, header: FrameHeader) -> None:
        """A connection died mid-payload: give its reservation back."""
        self.admission.release(admission.principal_of(header.get("cap")), length)

    # ------------------------------------------------------------------ who may

    async def resolve(self, claim: messages.HelloAuth) -> tuple[bytes, auth.Peer]:
        """Only cluster members authenticate here; clients come anonymous, with capabilities."""
        key = self.keys.get(claim.key_id) if claim.kind == "key" else None
        if key is None:
            raise AuthenticationFailed(
                "chunk servers authenticate cluster members (the cluster key) only; clients connect without"
                if claim.kind != "key" else f"unknown cluster key {claim.key_id[:64]!r}")
        return key, auth.MEMBER

    @staticmethod
    def authorize(peer: auth.Peer, operation: str) -> None:
        if operation == "delete_chunks" and not peer.is_member:
            raise PermissionDenied("delete_chunks: chunks are deleted only on the metadata service's orders")

    def payload_refusal(self, peer: auth.Peer, header: FrameHeader) -> TectofsError | None:
        """Checked before a put's payload is admitted: without a valid write capability an
        anonymous peer cannot reserve the in-flight budget (the bytes are drained)."""
        if peer.is_member:
            return None
        try:
            cap = messages.convert(header.get("cap"), messages.Capability)
            auth.check_capability(self.keys, messages.convert(header.get("block_id"), messages.Id), "w",
                                  cap.expiry, cap.key, cap.mac, uid=cap.uid)
        except msgspec.ValidationError:
            return CapabilityRefused("put_chunk without a valid capability: ask the metadata service to allocate")
        except CapabilityRefused as exc:
            return exc
        return None

    def _check_capability(self, block_id: int, modes: str, cap: messages.Capability | None) -> None:
        """Members need none; anyone else a capability for this block in one of ``modes``
        ("r": a layout's; "w": an allocation's, which also reads back what its writer wrote)."""
        if current_peer.get().is_member:
            return
        if cap is None:
            auth.check_capability(self.keys, block_id, modes[0], 0, "", b"")
            return
        for mode in modes[:-1]:
            try:
                auth.check_capability(self.keys, block_id, mode, cap.expiry, cap.key, cap.mac, uid=cap.uid)
                return
            except CapabilityRefused as exc:
                if isinstance(exc, CapabilityExpired):
                    raise
        auth.check_capability(self.keys, block_id, modes[-1], cap.expiry, cap.key, cap.mac, uid=cap.uid)

    # ------------------------------------------------------------------ RPC handlers

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

    def _handlers(self) -> Handlers:
        """The handler of each operation of the table (``tectofs.wire.messages``), by operation."""
        handlers = Handlers()
        handlers.add(messages.PUT_CHUNK, self.rpc_put_chunk)
        handlers.add(messages.GET_CHUNK, self.rpc_get_chunk)
        handlers.add(messages.DELETE_CHUNKS, self.rpc_delete_chunks)
        handlers.add(messages.CHUNK_STAT, self.rpc_stat)
        handlers.add(messages.PING, self.rpc_ping)
        return handlers

    async def rpc_put_chunk(self, r: messages.PutChunkRequest, payload: memoryview) -> tuple[messages.Empty, bytes]:
        try:
            self._check_capability(r.block_id, "w", r.cap)
            # Only a rebuild (a member) may replace a chunk: a client's put never changes one stored.
            overwrite = r.overwrite and current_peer.get().is_member
            await self._in_thread(self.store.write, r.block_id, r.position, payload, r.crcs, r.crc, overwrite)
        except TectofsError as exc:
            if exc.code == "checksum":
                self.stats["checksum_errors"] += 1
                self.metrics.checksum_errors.inc()
            raise
        finally:
            self.admission.release(admission.principal_of(r.cap), len(payload))
            self.buffers.put(payload)
        self.stats["puts"] += 1
        self.metrics.bytes_in.inc(len(payload))
        return messages.Empty(), b""

    async def rpc_get_chunk(
        self, r: messages.GetChunkRequest, payload: memoryview,
    ) -> tuple[messages.GetChunkReply, ReplyPayload]:
        self._check_capability(r.block_id, "rw", r.cap)
        try:
            # Large ranges go from the page cache to the socket unread (sendfile; the reader
            # checks them end to end); smaller ones are read and checked here.
            # (Not over TLS: those bytes must pass through the transport, so they are checked here.)
            region_min = None if self.rpc.tls else limits.chunk_sendfile_min_bytes
            reading = asyncio.get_running_loop().run_in_executor(
                self._io, self.store.serve, r.block_id, r.offset, r.length, self.buffers.get, region_min)
            try:
                data, crcs, info = await asyncio.shield(reading)
            except asyncio.CancelledError:  # a region it opened must not leak its descriptor
                reading.add_done_callback(_release_unsent)
                raise
        except ChunkMissing:
            asyncio.get_running_loop().create_task(self.inventory.report_missing(r.block_id))
            raise
        except TectofsError as exc:
            if exc.code == "checksum":
                self.stats["checksum_errors"] += 1
                self.metrics.checksum_errors.inc()
                log.error("chunk %x failed its checksum on read: %s", r.block_id, exc)
            raise
        self.stats["gets"] += 1
        if isinstance(data, FileRegion):
            self.stats["reads_sent_from_file"] += 1
        self.metrics.bytes_out.inc(len(data))
        return messages.GetChunkReply(crcs=crcs, chunk_length=info.length, position=info.position, crc=info.whole_crc), data

    async def rpc_delete_chunks(
        self, r: messages.DeleteChunksRequest, payload: memoryview,
    ) -> tuple[messages.DeleteChunksReply, bytes]:
        return messages.DeleteChunksReply(deleted=await self._in_thread(self._delete, r.block_ids)), b""

    async def _deletes_done(self) -> None:
        """Return once every delete order received so far has run (they run in order on one thread)."""
        await asyncio.get_running_loop().run_in_executor(self._gc_io, lambda: None)

    def _delete(self, block_ids: list[int]) -> int:
        count = sum(1 for block_id in block_ids if self.store.delete(block_id))
        self.stats["deleted"] += count
        return count

    async def rpc_stat(self, r: messages.Empty, payload: memoryview) -> tuple[messages.ChunkStatReply, bytes]:
        return messages.ChunkStatReply(
            **self._load(), server_id=self.server_id, uuid=self.uuid, stats={**self.stats, **self.progress()}
        ), b""

    async def rpc_ping(self, r: messages.Empty, payload: memoryview) -> tuple[messages.PingReply, bytes]:
        return messages.PingReply(), b""

    # ------------------------------------------------------------------ MDS

    def _load(self) -> dict[str, int]:
        used = self.store.used_bytes
        return {
            "capacity": used + self.store.disk_free_bytes(),
            "used": used,
            "inflight": self.inflight_bytes,
            "chunks": self.store.chunk_count,
        }

    async def _register(self) -> None:
        load = self._load()
        reply, _ = await self.meta.call(
            self.meta_address, messages.REGISTER_SERVER,
            messages.RegisterServerRequest(uuid=self.uuid, address=self.address, capacity=load["capacity"],
                                           used=load["used"], metrics_url=self.metrics_url),
            retries_max=limits.rpc_retries_max,
        )
        self.server_id = reply.server_id
        self.repairer.server_id = self.server_id
        log.info("registered with %s as chunk server %d", self.meta_address, self.server_id)

    async def _heartbeat_loop(self) -> None:
        """Heartbeat on a fixed schedule, not one reply after the other: a metadata service
        slow to answer must still hear from this server every interval."""
        outstanding: set[asyncio.Task[None]] = set()
        while True:
            await asyncio.sleep(self.heartbeat_interval_s)
            if len(outstanding) < limits.heartbeats_outstanding_max:
                task = asyncio.get_running_loop().create_task(self._heartbeat())
                outstanding.add(task)
                task.add_done_callback(outstanding.discard)

    def _heartbeat_soon(self) -> None:
        """An extra heartbeat now (rebuilds finished: fetch the next orders without waiting)."""
        if self.server_id is not None and self._heartbeat_task is not None:
            asyncio.get_running_loop().create_task(self._heartbeat())

    def progress(self) -> dict[str, int]:
        return {**self.scrubber.stats, **self.repairer.stats, **self.inventory.stats,
                "pack_dead_bytes": self.store.pack_dead_bytes, DISK_ID: filesystem_id(self.store.root)}

    async def _heartbeat(self) -> None:
        try:
            if self.server_id is None:
                return  # not registered (yet): the registration comes first
            reply, _ = await self.meta.call(
                self.meta_address, messages.HEARTBEAT,
                messages.HeartbeatRequest(server_id=self.server_id, address=self.address, **self._load(),
                                          stats=self.progress(), metrics_url=self.metrics_url),
                retries_max=0,
            )
            if reply.delete:
                # Deletes run on their own thread, never in the way of chunk writes' threads.
                asyncio.get_running_loop().run_in_executor(self._gc_io, self._delete, list(reply.delete))
            for order in reply.repairs:
                self.repairer.submit(order)
            if self.repairer.unreported:
                await self.repairer.resend_reports()
        except NotFound:
            async with self._register_lock:
                await self._register()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the MDS may be restarting; keep serving clients
            log.warning("heartbeat to %s failed: %s", self.meta_address, exc)


def _lock_data_dir(data_dir: str) -> int:
    """Hold an exclusive lock on ``data_dir`` for the life of the process: two chunk servers on
    one directory would share one identity and corrupt each other's chunks. Returns the fd."""
    path = os.path.join(data_dir, "server.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise TectofsError(
            f"{data_dir} is in use by another chunk server (pid {holder}); one directory serves one chunk server"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _release_unsent(reading: "asyncio.Future[Any]") -> None:
    """Close the file region of a read whose request was cancelled before it was answered."""
    if not reading.cancelled() and reading.exception() is None:
        data = reading.result()[0]
        if isinstance(data, FileRegion):
            data.close()
