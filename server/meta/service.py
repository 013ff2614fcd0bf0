"""The metadata service (MDS): namespace, block maps and the chunk-server registry.

It never touches file data. Clients ask it for layouts (which chunk servers hold which
chunks of which block), for block allocations (where to write), and to commit what they
wrote; chunk servers register and heartbeat. Every operation goes through the store runner,
which folds concurrent operations into group commits.

Requests arrive validated against their declared types (``tectofs.wire.messages``; the RPC layer
refuses the rest); paths are then split and checked here, so a bad path gets the same clear
error whichever client sent it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from typing import Callable, TypeVar

import msgspec

from tectofs import limits, paths
from tectofs.diagnostics import RateLimitedLog
from tectofs.errors import Busy, InvalidArgument, PermissionDenied
from tectofs.metrics import MetaMetrics
from tectofs.server import addresses
from tectofs.store import SqlStore, StoreRunner
from tectofs.store.access import Caller
from tectofs.store.dialect import dialect_for
from tectofs.wire import auth, inline_echo, messages, shared_blocks
from tectofs.wire.leases import ENTRY, LISTING, KeepaliveReply, KeepaliveRequest, LeaseKey
from tectofs.wire.server import Handlers, RpcServer, current_call, current_peer

from . import drain_check
from .claims import ClaimOperations
from .guard import MetaGuard
from .lease_peers import LeasePeers
from .leases import ClaimConflict, LeaseTable
from .set_aside import SetAside
from .told import granted as granted_keys
from .told import parents, with_handles
from .users import UserOperations

log = logging.getLogger("tectofs.meta")

ReplyT = TypeVar("ReplyT", bound=messages.Message)
ResultT = TypeVar("ResultT")
Reply = tuple[ReplyT, bytes]  # what a handler answers: the reply, and no payload
LEASES_GRANTED = "lease_sessions"  # the store's counter of services that granted leases over it


def _walked_directories(store: SqlStore) -> list[int]:
    """The directories the operation's path walks went through, / first (while leases are kept)."""
    return [key[1] for key in store.walked or () if key[0] == ENTRY]


def capability(keys: auth.KeyRing, block_id: int, mode: str, expiry: int, uid: int | None = None) -> messages.Capability:
    key, tag = auth.sign_capability(keys, block_id, mode, expiry, uid)
    return messages.Capability(mac=tag, expiry=expiry, key=key, uid=uid)


def layout_segment(
    layout: messages.LayoutSegment, keys: auth.KeyRing, ttl_s: float, handle: bytes = b""
) -> messages.LayoutSegment:
    """A layout segment of the store's, with a read capability for each block stored in chunks
    (and the caller's ``handle`` for the file)."""
    expiry = auth.capability_expiry(ttl_s)
    return msgspec.structs.replace(
        layout, attrs=msgspec.structs.replace(layout.attrs, handle=handle),
        blocks=[b if b.inline is not None else msgspec.structs.replace(b, cap=capability(keys, b.block_id, "r", expiry))
                for b in layout.blocks],
    )


class MetadataService:
    def __init__(
        self,
        store_url: str,
        default_policy: str = "rs(4,2)",
        default_block_size: int = limits.block_size_default_bytes,
        server_dead_after_s: float = limits.server_dead_after_s,
        gc_delay_s: float = 30.0,
        allocation_grace_s: float = limits.allocation_grace_s,
        repair_after_s: float = limits.repair_after_s,
        repair_interval_s: float = limits.repair_interval_s,
        orphan_grace_s: float = limits.orphan_grace_s,
        key_file: str | None = None,
        capability_ttl_s: float = limits.capability_ttl_s,
        advertise: str | None = None,
        inline_max: int = limits.inline_bytes_default,
        lease_s: float = limits.lease_s,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        inline_store: bool = False,
    ) -> None:
        """``key_file``: the cluster key (``tectofs.wire.auth``), required: peers authenticate
        against it and chunk capabilities are signed with it. ``advertise`` (``HOST[:PORT]``):
        the address others reach this service at, which ``stats`` reports with the metrics URL
        (``server/addresses.py``; default: the bound address, none for a wildcard).
        ``inline_max``: files up to this many bytes are committed inline, their data kept in the
        store with the inode (0: never; at most ``limits.inline_bytes_max``). ``lease_s``: the life
        of a client's metadata leases after its last keepalive (``server/meta/leases.py``).

        The simulator's seams (``tectofs.testing``): ``clock`` (seconds since the epoch) is the
        time of the store's leases, liveness, repairs and GC and of heartbeat arrivals; ``rng``
        the store's source of chance; ``inline_store`` runs each store call at once on the event
        loop's thread (``StoreRunner(inline=True)``) instead of a group-commit thread."""
        path = auth.key_file_from(key_file)
        if path is None:
            raise InvalidArgument("the metadata service needs the cluster key: --key-file FILE or $TECTOFS_KEY_FILE"
                                  " (tectofs init makes one)")
        if not 0 <= inline_max <= limits.inline_bytes_max:
            raise InvalidArgument(f"inline_max {inline_max}: it must be between 0 and {limits.inline_bytes_max}")
        self.keys = auth.KeyRing(path)
        self.capability_ttl_s = capability_ttl_s
        dialect = dialect_for(store_url)
        self.heartbeats_seen: dict[int, float] = {}

        def open_store() -> SqlStore:
            store = SqlStore(dialect, default_policy, default_block_size, gc_delay_s, clock=clock, rng=rng)
            store.server_dead_after_s = server_dead_after_s
            store.inline_max = inline_max
            store.heartbeats_seen = self.heartbeats_seen
            return store

        self.metrics = MetaMetrics()  # exported by `tectofs meta --metrics` (tectofs.metrics.serve)
        self.advertise = advertise
        # Where `--metrics` serves (HOST:PORT, set before start()), and what start() derives:
        self.metrics_address: str | None = None
        self.address: str | None = None  # advertised; None: bound to a wildcard, nothing advertised
        self.metrics_url: str | None = None
        self.clock = clock
        self.runner = StoreRunner(open_store, on_batch=self.metrics.batch_sizes.observe, inline=inline_store)
        self.metrics.watch_queue(lambda: self.runner.queued)
        self.allocation_grace_s = allocation_grace_s
        self.repair_after_s = repair_after_s
        self.server_dead_after_s = server_dead_after_s
        self.repair_interval_s = repair_interval_s
        self.orphan_grace_s = orphan_grace_s
        self.repairs = {"scheduled": 0, "done": 0, "failed": 0}
        self.guard = MetaGuard(self.keys, lambda name: self.runner.call(lambda store: store.user_get(name)))
        self.authorize = self.guard.authorize  # RpcServer asks it before every request
        # Anonymous peers may only ping here: they get a small pool of connections of their own, so
        # a flood of them cannot lock authenticated clients out (tectofs.wire.connlimits).
        self.rpc = RpcServer(self, "metadata service", messages.META_OPERATIONS, "meta", self._handlers(),
                             authenticator=self.guard, observe=self.metrics.requests.observe, pool_anonymous=True)
        # Lease time is measured on a monotonic clock: a stepped wall clock must not end leases
        # early (the simulator's virtual clock is both).
        self.leases = LeaseTable(lease_s, clock=time.monotonic if clock is time.time else clock)
        self._leases_noted = False  # the store knows leases were granted (see _grace_after_restart)
        self.store_url = store_url
        self.peers: LeasePeers | None = None  # the other services over a PostgreSQL store (lease_peers.py)
        self.started = clock()
        self.bad_chunk_reports = 0
        self.set_aside = SetAside(self.heartbeats_seen, clock)  # servers clients set aside (set_aside.py)
        self._bad_chunk_log = RateLimitedLog(log, limits.peer_log_lines_per_s, "bad-chunk reports")
        self.busy_answers = 0
        self._gc_task: asyncio.Task[None] | None = None
        self._repair_task: asyncio.Task[None] | None = None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port``; returns the advertised address (the bound one if none).
        InvalidArgument, before serving anything, if the metrics URL would name no reachable host."""
        bound = await self.rpc.start(host, port)
        try:
            self.address = addresses.advertised(bound, self.advertise)
            self.metrics_url = addresses.metrics_url(self.metrics_address, self.address) if self.metrics_address else None
        except InvalidArgument:
            await self.rpc.close()
            raise
        address = self.address or bound
        await self._grace_after_restart()
        await self._claims.restore()
        if dialect_for(self.store_url).name == "postgresql":
            self.peers = LeasePeers(self.store_url, self.leases)
            await self.peers.start()
        self._gc_task = asyncio.get_running_loop().create_task(self._gc_loop())
        self._repair_task = asyncio.get_running_loop().create_task(self._repair_loop())
        return address

    async def _grace_after_restart(self) -> None:
        """Clients may hold leases a previous service over this store granted (this service's
        predecessor, or a failed-over peer), which this one cannot recall: if the store says any
        were ever granted, changes wait until such leases ran out (NFSv4's grace period)."""
        if await self.runner.call(lambda store: store.counter(LEASES_GRANTED)):
            self.leases.grace_until = self.leases.clock() + self.leases.lease_s
            self._leases_noted = True

    async def close(self) -> None:
        for task in (self._gc_task, self._repair_task):
            if task is not None:
                task.cancel()
        if self.peers is not None:
            await self.peers.close()
        await self.rpc.close()
        self.runner.close()

    async def _gc_loop(self) -> None:
        while True:
            await asyncio.sleep(min(10.0, self.allocation_grace_s / 2))
            try:
                grace_s = self.allocation_grace_s
                expired = await self.runner.call(lambda store: store.expire_allocations(grace_s))
                if expired:
                    log.info("queued %d uncommitted blocks for deletion", expired)
                orphans = await self.runner.call(lambda store: store.collect_orphans())
                if orphans:
                    log.info("removed %d unlinked files no handle holds any more", orphans)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("allocation expiry failed")

    async def _repair_loop(self) -> None:
        """Queue rebuilds of what lost redundancy (and moves off draining servers); targets
        learn their orders from heartbeat replies. Starts once every live server has had time to
        heartbeat this service (after a restart, the store's heartbeats are old)."""
        await asyncio.sleep(self.server_dead_after_s)
        while True:
            await asyncio.sleep(self.repair_interval_s)
            try:
                after_s = self.repair_after_s
                queued = await self.runner.call(
                    lambda store: store.schedule_repairs(after_s, limits.repair_concurrency_per_server * 4)
                )
                if queued:
                    self.repairs["scheduled"] += queued
                    log.info("queued %d chunk rebuilds", queued)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("repair scheduling failed")

    async def _call(self, operation: Callable[[SqlStore], ResultT], returns: type[ResultT], *,
                    always_admitted: bool = False, new_directory: bool = False, own_kept: bool = True) -> ResultT:
        """``operation(store)`` through the runner, for the request being served; it answers
        ``returns``. A request with a call id (``tectofs.wire.server.current_call``) has each
        store operation it runs keyed by its call id and step, so the operation happens at
        most once however often the call is retried, on this service or another over the same
        store (``tectofs.store.requests``: a retry gets the recorded result, read as ``returns``).

        ``operation`` runs on the store's thread: what it needs of the request (paths split,
        the caller) is computed before, here, where the request's context is.
        ``new_directory``: the operation makes the directory it answers (its caller is granted
        its listing, which it knows: empty). ``own_kept``: the caller is granted what it changed
        (its client keeps it); not for a claim's calls (``claims.py``: the client drops, when the
        claim ends, what it learned under it)."""
        # Admission control: past this queue length, new work is refused (the client backs
        # off and retries) instead of growing the queue and everyone's latency without bound.
        # Heartbeats are always admitted: refusing them would declare live servers dead.
        if self.runner.queued >= limits.meta_queue_max and not always_admitted:
            self.busy_answers += 1
            self.metrics.busy_answers.inc()
            raise Busy(f"metadata service has {self.runner.queued} operations queued; retry shortly")
        call = current_call.get()
        key = call.next_key() if call else None
        if self.peers is None and not self.leases.active and not self.leases.in_grace():
            return await self.runner.call(operation, returns=returns, request_key=key)
        session = current_peer.get().session
        for _ in range(limits.claim_retries_max):
            modified, raced = set[LeaseKey](), list[LeaseKey]()
            since = self.leases.change_seq if self.peers is not None else None
            ran: list[bool] = []
            try:
                result = await self.runner.call(self._leased(operation, session, modified, since, raced, new_directory,
                                                             ran, own_kept), returns=returns, request_key=key)
                break
            except ClaimConflict as conflict:  # undone: the claim's holder sends its creates, then again
                await self.leases.recall_claim(conflict.directory)
            finally:
                if raced:  # the answer may predate a peer's change: the client must not keep it
                    await self.leases.recall_raced(session, raced)
        else:
            raise Busy("the directory is claimed by clients in turn; retry shortly")
        if key is not None and not ran:  # answered from the record of an earlier attempt
            await self.leases.settled()
        if modified:
            if self.peers is None:  # (one recall: awaited as is, without gather's task per call)
                await self.leases.recall(modified, changed_by=session)
            else:
                await asyncio.gather(self.leases.recall(modified, changed_by=session),
                                     self.peers.recall(modified, session))
        return result

    def _leased(self, operation: Callable[[SqlStore], ResultT], session: bytes, modified: set[LeaseKey],
                since: int | None, raced: list[LeaseKey], new_directory: bool = False,
                ran: list[bool] | None = None, own_kept: bool = True) -> Callable[[SqlStore], ResultT]:
        """``operation`` that, on the store's thread, grants ``session`` a lease on what it read
        (before any later operation can change it: ``server/meta/leases.py``; into ``raced``,
        what a peer's recall since ``since`` named) and collects into ``modified`` what it
        changed, which ``_call`` then recalls."""
        def run(store: SqlStore) -> ResultT:
            if ran is not None:
                ran.append(True)
            walked: list[LeaseKey] = []
            through: set[LeaseKey] = set()
            store.walked, store.through, store.modified, store.reached = walked, through, modified, 0
            result: ResultT | None = None
            done = False
            try:
                result = operation(store)
                done = True
                return result
            finally:
                reached, store.walked, store.through, store.modified = store.reached, None, None, None
                granted = granted_keys(walked, reached, result)
                # What it read or changed of a directory another session holds claimed: undone
                # (raised over its answer or error), to run again once the claim is recalled. A
                # name found to be a directory is not: a claim's holder only adds and removes files.
                read = [key for key in granted if key not in through] if through else granted
                claimed = self.leases.claimed_by_other(itertools.chain(read, modified), session,
                                                       parents(result), store.parent_of)
                if claimed is not None:
                    modified.clear()
                    raise ClaimConflict(claimed)  # noqa: B012 (replaces the answer on purpose)
                if session:
                    if new_directory and isinstance(result, messages.AttrsReply):
                        granted.append((LISTING, result.attrs.ino))
                    if done and own_kept:  # its client keeps what its own change made: recalled when another changes it
                        granted.extend(key for key in modified if key[0] != LISTING)
                    raced.extend(self.leases.grant(session, granted, since))
        return run

    @property
    def grants_claims(self) -> bool:
        """Whether directories may be claimed here (``claims.py``): not over a store several
        services share (a claim lives in one service's memory)."""
        return self.peers is None

    def _caller(self) -> Caller | None:
        """The POSIX caller the peer acts as: the store checks permission bits as its uid
        (None: a cluster member, trusted)."""
        return self.guard.caller(current_peer.get())

    def _segment(self, layout: messages.LayoutSegment) -> messages.LayoutSegment:
        return layout_segment(self.set_aside.flag(layout), self.keys, self.capability_ttl_s, self._handle(layout.attrs.ino))

    # File handles (tectofs.wire.auth): every inode's attributes a user gets come from a call that
    # checked it may reach that inode, and carry the handle it must show to name the inode by
    # number; every by-number call checks that handle before the store sees the request.

    def _handle(self, ino: int) -> bytes:
        peer = current_peer.get()
        return b"" if peer.is_member else auth.file_handle(self.keys, peer.uid, ino)

    def _attrs(self, attrs: messages.Attrs) -> messages.Attrs:
        """``attrs`` of the store's, with the caller's handle for the inode."""
        handle = self._handle(attrs.ino)
        return msgspec.structs.replace(attrs, handle=handle) if handle else attrs

    def _handles(self) -> Callable[[int], bytes]:
        """``_handle`` for many inodes of one reply (a listing's entries)."""
        peer = current_peer.get()
        return (lambda ino: b"") if peer.is_member else auth.file_handles(self.keys, peer.uid)

    def _attrs_reply(self, attrs: messages.Attrs) -> messages.AttrsReply:
        return messages.AttrsReply(attrs=self._attrs(attrs))

    def _check_handle(self, ino: int, handle: bytes, issued_to: int | None = None) -> None:
        """Refuse a by-number call on ``ino`` unless the caller showed its handle for it. Members
        and root are not asked for one: they may reach every inode anyway. A proxy (a multi-user
        mount's own connection) may show one issued to a uid it acts for (``issued_to``): it may
        act for any uid. The answer is the same whether the inode exists or not, so scanning
        numbers learns nothing."""
        peer = current_peer.get()
        uid = issued_to if issued_to is not None and peer.proxy else peer.uid
        if peer.is_member or peer.uid == 0 or auth.check_file_handle(self.keys, uid, ino, handle):
            return
        raise PermissionDenied(
            f"inode {ino}: no valid file handle for uid {uid} (an inode is named by number only with the"
            " handle that came with its attributes from a lookup, create, open or listing)")

    def _handlers(self) -> Handlers:
        """The handler of each operation of the table (``tectofs.wire.messages``), by operation."""
        handlers = Handlers()
        handlers.add(messages.LOOKUP, self.rpc_lookup)
        handlers.add(messages.GETATTR, self.rpc_getattr)
        handlers.add(messages.MKDIR, self.rpc_mkdir)
        handlers.add(messages.MAKEDIRS, self.rpc_makedirs)
        handlers.add(messages.CREATE, self.rpc_create)
        handlers.add(messages.SYMLINK, self.rpc_symlink)
        handlers.add(messages.MKNOD, self.rpc_mknod)
        handlers.add(messages.READDIR, self.rpc_readdir)
        handlers.add(messages.SETATTR, self.rpc_setattr)
        handlers.add(messages.TRUNCATE, self.rpc_truncate)
        handlers.add(messages.SET_POLICY, self.rpc_set_policy)
        handlers.add(messages.RENAME, self.rpc_rename)
        handlers.add(messages.LINK, self.rpc_link)
        handlers.add(messages.RELEASE, self.rpc_release)
        handlers.add(messages.RELEASE_LEASES, self.rpc_release_leases)
        handlers.add(messages.GETXATTR, self.rpc_getxattr)
        handlers.add(messages.LISTXATTR, self.rpc_listxattr)
        handlers.add(messages.SETXATTR, self.rpc_setxattr)
        handlers.add(messages.REMOVEXATTR, self.rpc_removexattr)
        handlers.add(messages.EXCHANGE, self.rpc_exchange)
        handlers.add(messages.UNLINK, self.rpc_unlink)
        handlers.add(messages.UNLINK_MANY, self.rpc_unlink_many)
        handlers.add(messages.REFERENCE_BLOCKS, self.rpc_reference_blocks)
        handlers.add(messages.SHARED_BLOCKS, self.rpc_shared_blocks)
        handlers.add(messages.RMDIR, self.rpc_rmdir)
        handlers.add(messages.STATFS, self.rpc_statfs)
        handlers.add(messages.LAYOUT, self.rpc_layout)
        handlers.add(messages.ALLOCATE, self.rpc_allocate)
        handlers.add(messages.STAGE, self.rpc_stage)
        handlers.add(messages.RENEW, self.rpc_renew)
        handlers.add(messages.COMMIT, self.rpc_commit)
        handlers.add(messages.REPORT_BAD_CHUNK, self.rpc_report_bad_chunk)
        handlers.add(messages.REPAIR_DONE, self.rpc_repair_done)
        handlers.add(messages.REPAIR_FAILED, self.rpc_repair_failed)
        handlers.add(messages.INVENTORY_BEGIN, self.rpc_inventory_begin)
        handlers.add(messages.INVENTORY, self.rpc_inventory)
        handlers.add(messages.DRAIN, self.rpc_drain)
        handlers.add(messages.BLOCK_HEALTH, self.rpc_block_health)
        handlers.add(messages.REGISTER_SERVER, self.rpc_register_server)
        handlers.add(messages.HEARTBEAT, self.rpc_heartbeat)
        handlers.add(messages.SERVERS, self.rpc_servers)
        handlers.add(messages.STATS, self.rpc_stats)
        handlers.add(messages.PING, self.rpc_ping)
        claims = self._claims = ClaimOperations(self)
        handlers.add(messages.CLAIM_DIRECTORY, claims.rpc_claim_directory)
        handlers.add(messages.CREATE_MANY, claims.rpc_create_many)
        users = UserOperations(self)
        handlers.add(messages.USER_ADD, users.rpc_user_add)
        handlers.add(messages.USER_REMOVE, users.rpc_user_remove)
        handlers.add(messages.USER_LIST, users.rpc_user_list)
        handlers.add(messages.S3_PRINCIPAL, users.rpc_s3_principal)
        handlers.add(messages.WHOAMI, users.rpc_whoami)
        handlers.add(messages.TICKET, users.rpc_ticket)
        handlers.add(messages.TICKET_SECRET, users.rpc_ticket_secret)
        handlers.add(messages.KEEPALIVE, self.rpc_keepalive)
        return handlers

    # ------------------------------------------------------------------ namespace
    # Each rpc_<op> gets its request already validated (tectofs.wire.messages, tectofs.wire.server).

    async def rpc_lookup(self, r: messages.PathRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        """With a lease session, the reply names the directories walked (``walk``): the client's
        cache keys what it learned by them (``client/metadata_cache.py``)."""
        parts, caller = paths.split(r.path), self._caller()
        attrs, walk = await self._call(lambda store: (store.lookup(parts, caller=caller), _walked_directories(store)),
                                       tuple[messages.Attrs, list[int]])
        reply = self._attrs_reply(attrs)
        return (msgspec.structs.replace(reply, walk=walk) if walk and current_peer.get().session else reply), b""

    async def rpc_getattr(self, r: messages.InoRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        self._check_handle(r.ino, r.handle)
        caller = self._caller()
        return self._attrs_reply(await self._call(lambda store: store.getattr_ino(r.ino, caller=caller),
                                                  messages.Attrs)), b""

    async def rpc_mkdir(self, r: messages.MkdirRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        parts, caller = paths.split(r.path), self._caller()
        made = await self._call(lambda store: store.make_directory(
            parts, r.mode, r.uid, r.gid, r.policy, r.block_size, r.exist_ok, caller=caller), messages.AttrsReply,
            new_directory=not r.exist_ok)
        return msgspec.structs.replace(
            made, attrs=self._attrs(made.attrs), directory=self._attrs(made.directory) if made.directory else None), b""

    async def rpc_makedirs(self, r: messages.MkdirRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        parts, caller = paths.split(r.path), self._caller()
        if not parts:
            attrs = await self._call(lambda store: store.mkdir(
                parts, r.mode, r.uid, r.gid, None, None, r.exist_ok, caller=caller), messages.Attrs)
        for depth in range(1, len(parts) + 1):  # one store operation (and step of the call) per level
            prefix, last = parts[:depth], depth == len(parts)
            attrs = await self._call(lambda store: store.mkdir(
                prefix, r.mode, r.uid, r.gid, r.policy if last else None, r.block_size if last else None,
                r.exist_ok if last else True, caller=caller), messages.Attrs)
        return self._attrs_reply(attrs), b""

    async def rpc_create(self, r: messages.CreateRequest, _: memoryview) -> Reply[messages.CreateReply]:
        parts, caller = paths.split(r.path), self._caller()
        made = await self._call(lambda store: store.create_file(
            parts, r.mode, r.uid, r.gid, r.exclusive, r.reader, r.content, r.mtime, r.xattrs, caller=caller),
            messages.CreateReply)
        return msgspec.structs.replace(
            made, attrs=self._attrs(made.attrs), directory=self._attrs(made.directory) if made.directory else None), b""

    async def rpc_symlink(self, r: messages.SymlinkRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        parts, caller = paths.split(r.path), self._caller()
        return self._attrs_reply(await self._call(
            lambda store: store.symlink(parts, r.target, r.uid, r.gid, caller=caller), messages.Attrs)), b""

    async def rpc_mknod(self, r: messages.MknodRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        parts, caller = paths.split(r.path), self._caller()
        return self._attrs_reply(await self._call(
            lambda store: store.mknod(parts, r.mode, r.rdev, r.uid, r.gid, caller=caller), messages.Attrs)), b""

    async def rpc_readdir(self, r: messages.ReaddirRequest, _: memoryview) -> Reply[messages.ReaddirReply]:
        parts, caller = paths.split(r.path), self._caller()
        page = await self._call(lambda store: store.readdir(parts, r.after, r.limit, caller=caller),
                                messages.ReaddirReply)
        return (page if current_peer.get().is_member else with_handles(page, self._handles())), b""

    async def rpc_setattr(self, r: messages.SetattrRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        if r.path is None:
            if not r.ino:
                raise InvalidArgument("setattr names a path, or an inode with its handle")
            self._check_handle(r.ino, r.handle)
        parts, caller = None if r.path is None else paths.split(r.path), self._caller()
        attrs = await self._call(lambda store: store.setattr(
            parts, r.mode, r.uid, r.gid, r.atime, r.mtime, caller=caller, ino=r.ino), messages.Attrs)
        return self._attrs_reply(attrs), b""

    async def rpc_truncate(self, r: messages.TruncateRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        parts, caller = paths.split(r.path), self._caller()
        return self._attrs_reply(await self._call(lambda store: store.truncate(parts, r.size, caller=caller),
                                                  messages.Attrs)), b""

    async def rpc_set_policy(self, r: messages.SetPolicyRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        parts, caller = paths.split(r.path), self._caller()
        return self._attrs_reply(await self._call(
            lambda store: store.set_policy(parts, r.policy, r.block_size, r.write_min, caller=caller),
            messages.Attrs)), b""

    async def rpc_rename(self, r: messages.RenameRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        src, dst, caller = paths.split(r.src), paths.split(r.dst), self._caller()
        return self._attrs_reply(await self._call(lambda store: store.rename(src, dst, r.noreplace, caller=caller),
                                                  messages.Attrs)), b""

    async def rpc_link(self, r: messages.LinkRequest, _: memoryview) -> Reply[messages.AttrsReply]:
        src, dst, caller = paths.split(r.src), paths.split(r.dst), self._caller()
        return self._attrs_reply(await self._call(lambda store: store.link(src, dst, caller=caller),
                                                  messages.Attrs)), b""

    async def rpc_release(self, r: messages.ReleaseRequest, _: memoryview) -> Reply[messages.Empty]:
        self._check_handle(r.ino, r.handle)
        caller = self._caller()
        await self._call(lambda store: store.release(r.ino, r.reader, caller=caller), type(None))
        return messages.Empty(), b""

    async def rpc_release_leases(self, r: messages.ReleaseLeasesRequest, _: memoryview) -> Reply[messages.Empty]:
        for lease in r.leases:
            self._check_handle(lease.ino, lease.handle, lease.uid)
        leases, caller = [(lease.ino, lease.reader) for lease in r.leases], self._caller()
        await self._call(lambda store: store.release_leases(leases, caller=caller), type(None))
        return messages.Empty(), b""

    async def rpc_getxattr(self, r: messages.XattrRequest, _: memoryview) -> Reply[messages.XattrReply]:
        parts, caller = paths.split(r.path), self._caller()
        value = await self._call(lambda store: store.getxattr(parts, r.name, caller=caller), bytes)
        return messages.XattrReply(value=value), b""

    async def rpc_listxattr(self, r: messages.PathRequest, _: memoryview) -> Reply[messages.ListxattrReply]:
        parts, caller = paths.split(r.path), self._caller()
        names = await self._call(lambda store: store.listxattr(parts, caller=caller), list[str])
        return messages.ListxattrReply(names=names), b""

    async def rpc_setxattr(self, r: messages.SetxattrRequest, _: memoryview) -> Reply[messages.Empty]:
        parts, caller = paths.split(r.path), self._caller()
        await self._call(lambda store: store.setxattr(parts, r.name, r.value, r.flags, caller=caller), type(None))
        return messages.Empty(), b""

    async def rpc_removexattr(self, r: messages.XattrRequest, _: memoryview) -> Reply[messages.Empty]:
        parts, caller = paths.split(r.path), self._caller()
        await self._call(lambda store: store.removexattr(parts, r.name, caller=caller), type(None))
        return messages.Empty(), b""

    async def rpc_exchange(self, r: messages.ExchangeRequest, _: memoryview) -> Reply[messages.Empty]:
        a, b, caller = paths.split(r.a), paths.split(r.b), self._caller()
        await self._call(lambda store: store.exchange(a, b, caller=caller), type(None))
        return messages.Empty(), b""

    async def rpc_unlink(self, r: messages.UnlinkRequest, _: memoryview) -> Reply[messages.UnlinkReply]:
        parts, caller = paths.split(r.path), self._caller()
        removed = await self._call(lambda store: store.unlink(parts, r.ino, r.only_if_empty, caller=caller, reader=r.reader),
                                   messages.UnlinkReply)
        return msgspec.structs.replace(
            removed, directory=self._attrs(removed.directory) if removed.directory else None), b""

    async def rpc_unlink_many(self, r: messages.UnlinkManyRequest, _: memoryview) -> Reply[messages.UnlinkReply]:
        directory, caller = paths.split(r.directory), self._caller()
        removed = await self._call(lambda store: store.unlink_many(directory, list(r.names), caller=caller),
                                   messages.UnlinkReply)
        return msgspec.structs.replace(
            removed, directory=self._attrs(removed.directory) if removed.directory else None), b""

    async def rpc_reference_blocks(self, r: shared_blocks.ReferenceBlocksRequest,
                                   _: memoryview) -> Reply[shared_blocks.ReferenceBlocksReply]:
        target, source, caller = paths.split(r.path), paths.split(r.source), self._caller()
        pairs = [(int(t), int(s)) for t, s in r.pairs]
        attrs = await self._call(lambda store: store.reference_blocks(target, source, pairs, caller=caller),
                                 messages.Attrs)
        return shared_blocks.ReferenceBlocksReply(attrs=self._attrs(attrs)), b""

    async def rpc_shared_blocks(self, r: shared_blocks.SharedBlocksRequest,
                                _: memoryview) -> Reply[shared_blocks.SharedBlocksReply]:
        directory, caller = paths.split(r.directory), self._caller()
        rows, more = await self._call(lambda store: store.shared_blocks(
            directory, list(r.names), r.offset, shared_blocks.SHARED_BLOCKS_PER_REPLY_MAX, caller=caller),
            tuple[list[tuple[int, int, int]], bool])
        return shared_blocks.SharedBlocksReply(
            blocks=[shared_blocks.SharedBlock(name=i, block_id=b, nbytes=n) for i, b, n in rows], more=more), b""

    async def rpc_rmdir(self, r: messages.PathRequest, _: memoryview) -> Reply[messages.UnlinkReply]:
        parts, caller = paths.split(r.path), self._caller()
        removed = await self._call(lambda store: store.rmdir(parts, caller=caller), messages.UnlinkReply)
        return msgspec.structs.replace(
            removed, directory=self._attrs(removed.directory) if removed.directory else None), b""

    async def rpc_statfs(self, r: messages.Empty, _: memoryview) -> Reply[messages.StatfsReply]:
        return await self._call(lambda store: store.statfs(), messages.StatfsReply), b""

    # ------------------------------------------------------------------ data layout

    async def rpc_layout(self, r: messages.LayoutRequest, _: memoryview) -> Reply[messages.LayoutSegment]:
        caller = self._caller()
        if r.ino:
            self._check_handle(r.ino, r.handle)
            return self._segment(await self._call(lambda store: store.layout(
                None, r.ino, r.first, r.reader, r.write_only, caller=caller), messages.LayoutSegment)), b""
        if r.path is None:
            raise InvalidArgument("layout needs an ino or a path")
        parts = paths.split(r.path)
        return self._segment(await self._call(lambda store: store.layout(
            parts, None, r.first, r.reader, r.write_only, caller=caller), messages.LayoutSegment)), b""

    async def rpc_allocate(self, r: messages.AllocateRequest, _: memoryview) -> Reply[messages.AllocateReply]:
        self._check_handle(r.ino, r.handle)
        caller, unsent = self._caller(), self._claims.unsent_file(r.claimed_in, r.ino)
        blocks = await self.set_aside.allocate(lambda exclude: self._call(lambda store: store.allocate(
            r.ino, r.count, r.spares, exclude, r.writer, caller=caller, absent_as=unsent(store)),
            list[messages.Allocation]), r.exclude)
        expiry = auth.capability_expiry(self.capability_ttl_s)
        return messages.AllocateReply(blocks=[
            msgspec.structs.replace(b, cap=self._write_capability(b.block_id, expiry)) for b in blocks
        ], lease_s=self.allocation_grace_s), b""

    def _write_capability(self, block_id: int, expiry: int) -> messages.Capability:
        """Signed for the caller's uid: chunk servers share their in-flight budget fairly
        between the uids whose puts they receive (``server/chunk/admission.py``)."""
        return capability(self.keys, block_id, "w", expiry, current_peer.get().uid)

    async def rpc_renew(self, r: messages.RenewRequest, _: memoryview) -> Reply[messages.RenewReply]:
        self._check_handle(r.ino, r.handle)
        caller = self._caller()
        renewed = await self._call(lambda store: store.renew(r.ino, r.writer, r.reader, caller=caller), int)
        return messages.RenewReply(renewed=renewed), b""

    async def rpc_stage(self, r: messages.StageRequest, _: memoryview) -> Reply[messages.Empty]:
        self._check_handle(r.ino, r.handle)
        caller = self._caller()
        await self._call(lambda store: store.stage(r.ino, r.writer, r.blocks, r.holes, r.cut_from, caller=caller),
                         type(None))
        return messages.Empty(), b""

    async def rpc_commit(self, r: messages.CommitRequest, _: memoryview) -> Reply[messages.LayoutSegment]:
        self._check_handle(r.ino, r.handle)
        caller = self._caller()
        def commit(store: SqlStore) -> messages.LayoutSegment:
            layout = store.commit(r.ino, r.size, r.blocks, r.replace, r.mtime, r.shrunk_to, r.holes, r.writer, r.atime,
                                  r.mode, caller=caller)
            return layout if r.echo_inline else inline_echo.omit(layout, r.blocks)  # (recorded as answered)

        layout = await self._call(commit, messages.LayoutSegment)
        return self._segment(layout), b""

    async def rpc_report_bad_chunk(self, r: messages.ReportBadChunkRequest, _: memoryview) -> Reply[messages.Empty]:
        self.bad_chunk_reports += 1
        if r.kind == "unreachable":
            self.set_aside.report(r.server_id)
        marked = r.kind in ("corrupt", "missing") and await self._call(
            lambda store: store.mark_bad(r.block_id, r.server_id), bool)
        self._bad_chunk_log.warning(
            "chunk of block %d at position %d on server %d reported %s%s: %s",
            r.block_id, r.position, r.server_id, r.kind or "unreadable", " (rebuild scheduled)" if marked else "",
            r.reason[:200],
        )
        return messages.Empty(), b""

    # ------------------------------------------------------------------ self-healing

    async def rpc_repair_done(self, r: messages.RepairDoneRequest, _: memoryview) -> Reply[messages.Empty]:
        placed = await self._call(
            lambda store: store.repair_done(r.block_id, r.position, r.server_id, r.length, r.crc), bool)
        self.repairs["done" if placed else "failed"] += 1
        if not placed:
            log.info("rebuilt chunk %d of block %d on server %d is not needed any more; it will be collected",
                     r.position, r.block_id, r.server_id)
        return messages.Empty(), b""

    async def rpc_repair_failed(self, r: messages.RepairFailedRequest, _: memoryview) -> Reply[messages.Empty]:
        self.repairs["failed"] += 1
        self._bad_chunk_log.warning("server %d could not rebuild chunk %d of block %d: %s",
                                    r.server_id, r.position, r.block_id, r.reason[:200])
        await self._call(lambda store: store.repair_failed(r.block_id, r.position, r.server_id, r.occupied),
                         type(None))
        return messages.Empty(), b""

    async def rpc_inventory_begin(self, r: messages.InventoryBeginRequest, _: memoryview) -> Reply[messages.InventoryBeginReply]:
        report = await self._call(lambda store: store.inventory_begin(r.server_id), int)
        return messages.InventoryBeginReply(report=report), b""

    async def rpc_inventory(self, r: messages.InventoryRequest, _: memoryview) -> Reply[messages.InventoryReply]:
        grace_s = self.orphan_grace_s
        found = await self._call(
            lambda store: store.inventory(r.server_id, r.report, r.block_ids, r.last, grace_s), messages.InventoryReply)
        if found.missing or found.orphans:
            log.warning("inventory of chunk server %d: %d chunks missing (rebuild scheduled), %d orphans",
                        r.server_id, found.missing, found.orphans)
        return found, b""

    async def rpc_drain(self, r: messages.DrainRequest, _: memoryview) -> Reply[messages.DrainReply]:
        return await self._call(lambda store: drain_check.drain(store, r.server, r.cancel), messages.DrainReply), b""

    async def rpc_block_health(self, r: messages.BlockHealthRequest, _: memoryview) -> Reply[messages.BlockHealthReply]:
        for file in r.files:
            self._check_handle(file.ino, file.handle)
        inos = [file.ino for file in r.files]
        files = await self._call(lambda store: store.block_health(inos), list[messages.FileHealth])
        return messages.BlockHealthReply(files=files), b""

    # ------------------------------------------------------------------ chunk servers

    async def rpc_register_server(self, r: messages.RegisterServerRequest, _: memoryview) -> Reply[messages.RegisterServerReply]:
        server_id = await self._call(
            lambda store: store.register_server(r.uuid, r.address, r.capacity, r.used, r.metrics_url), int)
        self.set_aside.heard_from(server_id)  # (a restarted server: it answers again)
        return messages.RegisterServerReply(server_id=server_id), b""

    async def rpc_heartbeat(self, r: messages.HeartbeatRequest, _: memoryview) -> Reply[messages.HeartbeatReply]:
        arrived = self.clock()
        if r.server_id in self.heartbeats_seen:  # a known server: alive as of now, whatever the queue
            self.heartbeats_seen[r.server_id] = arrived
        reply = await self._call(lambda store: store.heartbeat_with_orders(
            r.server_id, r.capacity, r.used, r.inflight, r.chunks, r.address, r.stats, metrics_url=r.metrics_url,
        ), messages.HeartbeatReply, always_admitted=True)
        # Liveness counts from arrival, not from when the store got to it (see SqlStore.heartbeats_seen).
        self.heartbeats_seen[r.server_id] = max(arrived, self.heartbeats_seen.get(r.server_id, 0.0))
        return reply, b""

    async def rpc_servers(self, r: messages.Empty, _: memoryview) -> Reply[messages.ServersReply]:
        servers = await self._call(lambda store: store.servers(), list[messages.ServerInfo])
        return messages.ServersReply(servers=servers), b""

    async def rpc_stats(self, r: messages.Empty, _: memoryview) -> Reply[messages.StatsReply]:
        counts = await self._call(lambda store: store.counts(), dict[str, int])
        health = await self._call(lambda store: store.health_summary(), dict[str, int])
        return messages.StatsReply(
            uptime_s=self.clock() - self.started,
            store=dict(self.runner.stats),
            counts={**counts, **health, **{f"repairs_{k}": v for k, v in self.repairs.items()}},
            bad_chunk_reports=self.bad_chunk_reports,
            busy_answers=self.busy_answers,
            invalid_requests=self.rpc.invalid_requests,
            queued=self.runner.queued,
            address=self.address,
            metrics_url=self.metrics_url,
        ), b""

    async def rpc_ping(self, r: messages.Empty, _: memoryview) -> Reply[messages.PingReply]:
        return messages.PingReply(), b""

    async def rpc_keepalive(self, r: KeepaliveRequest, _: memoryview) -> Reply[KeepaliveReply]:
        peer = current_peer.get()
        if not peer.session:
            raise InvalidArgument("keepalive: the connection's hello named no lease session")
        if not self._leases_noted:  # before the first grant: a successor must know to wait
            await self.runner.call(lambda store: store.bump_counter(LEASES_GRANTED))
            self._leases_noted = True
        if r.end:
            self.leases.end(peer.session, peer.uid)
            return KeepaliveReply(lease_s=0.0, renewed=False, restarted=False), b""
        try:
            return await self.leases.keepalive(peer.session, peer.uid, r.acked, r.wait_s, r.unsent), b""
        except PermissionError as exc:
            raise PermissionDenied(str(exc)) from None

