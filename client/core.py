"""The async client: namespace calls to the metadata service, data straight to chunk servers."""

from __future__ import annotations

import asyncio
import functools
import operator
import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

from tectofs import allocator, checksum, limits, metrics, paths, xattr_names
from tectofs.buffers import BufferPool
from tectofs.errors import InvalidArgument, IsADirectory, NoAttribute, NotFound
from tectofs.wire import auth, messages, shared_blocks
from tectofs.wire.leases import SESSION_BYTES, Recall
from tectofs.wire.transport import parse_group

from .blocks import BlockIO
from .cached_opens import CachedOpens
from .claims import CLAIMS_ENDING, CreateClaims
from .context import FileContext
from .files import AsyncFile
from .lease_session import LeaseSession
from .leases import LeaseEndings
from .metadata import MetadataClient
from .metadata_cache import ABSENT, MISS, CachedLayout, MetadataCache, Miss, changed_paths
from .metered import MeteredRpcClient

AnswerT = TypeVar("AnswerT")
_MODES = {
    # mode: (readable, writable, create, truncate, exclusive, append)
    "rb": (True, False, False, False, False, False),
    "r+b": (True, True, False, False, False, False),
    "wb": (False, True, True, True, False, False),
    "w+b": (True, True, True, True, False, False),
    "xb": (False, True, True, True, True, False),
    "x+b": (True, True, True, True, True, False),
    "ab": (False, True, True, False, False, True),
    "a+b": (True, True, True, False, False, True),
}


@dataclass(frozen=True)
class Stat:
    ino: int
    kind: str  # "file", "dir", "symlink", or a special file: "fifo", "socket", "char", "block"
    size: int
    mode: int
    uid: int
    gid: int
    atime: float
    mtime: float
    ctime: float
    nlink: int
    policy: str
    block_size: int
    target: str | None
    stored: int = 0  # bytes of data the file really stores: holes and zero heads and tails excluded
    write_min: int = 0  # chunks a block needs to be accepted when servers are missing (0: the policy's)
    rdev: int = 0  # a device node's device number
    # This client's file handle for the inode (tectofs.wire.auth): what a call naming it by number
    # shows; not part of what a stat compares or prints.
    handle: bytes = field(default=b"", repr=False, compare=False)
    # How many extended attributes it has (None: the service did not say): what a cache holding
    # these attributes answers the kernel's probes with.
    xattrs: int | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_attrs(cls, attrs: messages.Attrs) -> "Stat":
        """The stat of ``attrs``. Made without the frozen dataclass's ``__init__`` (one
        ``object.__setattr__`` per field): a create through the mount makes four, a listing one
        per entry, and this takes a quarter of the time."""
        stat = object.__new__(cls)
        stat.__dict__.update(zip(_STAT_FIELDS, _stat_values(attrs)))
        return stat

    @property
    def is_dir(self) -> bool:
        return self.kind == "dir"

    @property
    def is_file(self) -> bool:
        return self.kind == "file"


_STAT_FIELDS = tuple(f.name for f in fields(Stat))
_stat_values = operator.attrgetter(*_STAT_FIELDS)


@dataclass(frozen=True)
class DirectoryChange:
    """What a create or an unlink did to its directory (NFSv3's ``wcc_data``): the directory's
    attributes ``after`` the call and its ctime before (None from a metadata service that does
    not say). A client that recorded the ctime after its previous change there knows, when
    ``ctime_before`` equals it, that nobody else changed the directory in between."""

    after: Stat
    ctime_before: float | None

    @classmethod
    def from_reply(cls, directory: messages.Attrs | None, ctime_before: float | None) -> "DirectoryChange | None":
        return None if directory is None else cls(Stat.from_attrs(directory), ctime_before)


_shared: tuple[BufferPool, ThreadPoolExecutor] | None = None
_shared_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """A forked child has none of its parent's threads (a DataLoader worker, say): its clients
    get pools of their own instead of a codec pool whose threads are gone."""
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _process_resources() -> tuple[BufferPool, ThreadPoolExecutor]:
    """One buffer pool and one codec thread pool per process, shared by every client in it
    (a load generator may run a thousand clients in one process)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            allocator.tune()  # no page faults per encode (tectofs.allocator)
            _shared = (
                BufferPool(limits.client_buffer_pool_bytes),
                ThreadPoolExecutor(limits.client_codec_threads, thread_name_prefix="tectofs-codec"),
            )
        return _shared


def normalize_mode(mode: str) -> str:
    """``"r+"``, ``"rb+"``, ``"r+b"`` -> ``"r+b"``; binary only (wrap in io.TextIOWrapper for text)."""
    if "t" in mode:
        raise InvalidArgument(f"open mode {mode!r}: text mode is not supported; open binary and wrap it in io.TextIOWrapper")
    if not mode or set(mode) - set("rwxa+b") or len(set(mode)) != len(mode):
        raise InvalidArgument(f"unsupported open mode {mode!r}: use one of {', '.join(_MODES)}")
    canonical = "".join(sorted(mode, key="rwxa+b".index))
    if "b" not in canonical:
        canonical += "b"
    canonical = canonical.replace("+b", "b+").replace("b+", "+b")
    if canonical not in _MODES:
        raise InvalidArgument(f"unsupported open mode {mode!r}: use one of {', '.join(_MODES)}")
    return canonical


class AsyncFileSystem:
    """A connection to one tectofs cluster. All methods are coroutines on one event loop.

    Paths are absolute; every call that changes the namespace is one metadata transaction."""

    def __init__(self, meta_address: str, credentials: "str | auth.Credential | None" = None, *,
                 clock: Callable[[], float] | None = None, leases: bool = False, async_creates: bool = True) -> None:
        """``meta_address``: ``HOST:PORT``, or a failover group ``HOST:PORT,HOST:PORT,...`` of
        metadata services sharing one store (``tectofs.wire.client.RpcClient``). ``credentials``: a
        credential file or :class:`tectofs.wire.auth.Credential`; by default the one
        :func:`tectofs.wire.auth.find_credential` finds (``$TECTOFS_CREDENTIALS``, or the file ``tectofs
        up`` wrote for this address). Without one, every metadata call is refused.

        Counts in the process's client metrics (:func:`tectofs.metrics.client_metrics`); the
        first client of a process serves them if asked (``$TECTOFS_METRICS``:
        :func:`tectofs.metrics.serve_client_if_asked`). ``clock`` (monotonic seconds; the simulator's
        seam, ``tectofs.testing``): the time that decides when servers found down are tried first again.
        ``leases``: hold metadata leases (``client/lease_session.py``) so that a cache over this
        client may answer without asking; needs a running event loop, which keeps them alive.
        ``async_creates`` (with ``leases``): a burst of creates in one directory claims it and
        creates there without waiting for the service (``client/claims.py``)."""
        parse_group(meta_address)
        self.meta_address = meta_address
        self.credential = (credentials if isinstance(credentials, auth.Credential)
                           else auth.find_credential(meta_address, credentials))
        self.buffers, executor = _process_resources()
        self.metrics = metrics.client_metrics()
        metrics.serve_client_if_asked()
        self.rpc = MeteredRpcClient(self.metrics, allocate_payload=lambda header, n: self.buffers.get(n))
        self.rpc.expect_role(meta_address, "meta")
        if self.credential is not None:
            self.rpc.authenticate(meta_address, auth.ClientAuth(credential=self.credential))
        self.meta_rpc = self.rpc  # metadata calls; chunk traffic always goes through self.rpc
        self.metadata = MetadataClient(self.meta_rpc, meta_address)  # the typed metadata calls
        self.blocks = BlockIO(self.rpc, meta_address, executor, self.buffers, self.metrics)
        if clock is not None:  # the simulator's virtual time (tectofs.testing)
            self.blocks.down.clock = clock
        self._views: dict[tuple[int, int, tuple[int, ...]], AsyncFileSystem] = {}
        self.lease_endings = LeaseEndings(self.metadata)  # shared with the views: sent as this client
        self.acting_uid: int | None = None  # a view's: the uid it acts for (acting_as)
        # the largest file the metadata service keeps inline, as its last answer said (0: none seen yet)
        self.inline_max = 0
        self.lease_session: LeaseSession | None = None
        self.metadata_cache: MetadataCache[Stat] | None = None  # answers while leases are held (this identity's)
        self.cached_opens = CachedOpens()  # read-only handles opened from that cache (views share it)
        # Views acting for other users answer from the cache too: set by a mount whose kernel
        # checks every caller's permissions itself (default_permissions) before it asks.
        self.views_share_cache = False
        self.claims: CreateClaims | None = None
        if leases:
            # The simulator's clock seam comes with its seeded source of chance (tectofs.testing).
            self.lease_session = (LeaseSession(self.metadata) if clock is None else LeaseSession(
                self.metadata, clock=clock, session_id=random.randbytes(SESSION_BYTES)))
            self.lease_session.attach(self.rpc)
            self.metadata_cache = MetadataCache[Stat](make=Stat.from_attrs, end_reader=self.lease_endings.end)
            self.lease_session.listeners.append(self._recalled)
            self.metadata.on_change = self._changed
            self.metadata.lease_token = self.lease_session.token
            if async_creates:
                self.claims = CreateClaims(self.metadata, uid=os.getuid(), gid=os.getgid())
                self.claims.on_lost = self._lost_creates
                self.metadata.flush_before = self.claims.flush_before
                self.metadata.absorb_commit = self.claims.absorb_commit
                self.metadata.allocating = self.claims.allocating
                claims = self.claims
                self.lease_session.unsent = lambda: claims.pending > 0
                self.lease_session.listeners.append(self.claims.recalled)
            self.lease_session.start()

    async def _recalled(self, recall: "Recall | None") -> None:
        if self.metadata_cache is not None:
            self.metadata_cache.forget(recall)

    def _changed(self, operation: str, request: messages.Message, reply: messages.Message | None,
                 began: tuple[int, int] | None, uid: int | None = None) -> None:
        """This client (or its view acting as ``uid``) made a change (``reply`` None: it failed,
        or may have succeeded unseen): answers on their way are not kept, and the cache learns
        or forgets. ``began``: the lease session's token when the call began; if no recall, lost
        lease nor other change of this client's came between, what the reply holds under the
        lease granted with it may be kept (``MetadataCache.changed_by_self``)."""
        assert self.lease_session is not None and self.metadata_cache is not None
        if self.claims is not None and self._claims_follow(operation, request, reply):
            return
        fresh = began is not None and self.lease_session.still_token(began)
        self.lease_session.note_own_change()
        self.metadata_cache.changed_by_self(operation, request, reply, uid if fresh else False)

    def _claims_follow(self, operation: str, request: messages.Message, reply: messages.Message | None) -> bool:
        """Keep the claims (``client/claims.py``) in step with this client's own ``operation``;
        True for the sending of creates, which the cache learned when they were answered."""
        assert self.claims is not None
        if operation == "create_many":
            return True
        path = getattr(request, "path", None)
        if operation == "mkdir" and reply is not None and isinstance(path, str):
            self.claims.made_directory(path)
        if operation in CLAIMS_ENDING:  # a claimed directory may have moved, or its permissions changed
            self.claims.forget_under([p for p in changed_paths(request)] if not getattr(request, "ino", 0) else [])
        elif isinstance(path, str) and (parts := paths.split(path)):
            after = getattr(reply, "directory", None)
            self.claims.directory_changed(paths.join(*parts[:-1]) if len(parts) > 1 else "/",
                                          after if isinstance(after, messages.Attrs) else None)
        return False

    def _lost_creates(self, paths_lost: list[str]) -> None:
        """Creates answered without a call that the service refused: forget them."""
        if self.metadata_cache is not None:
            for path in paths_lost:
                self.metadata_cache.forget_path(path)
        if self.lease_session is not None:
            self.lease_session.note_own_change()

    def _cached(self) -> "MetadataCache[Stat] | None":
        """The cache this client may answer from now (a view acting for another user has none,
        permission checks differing by user, unless ``views_share_cache``)."""
        cache = self.metadata_cache
        if cache is None or (self.acting_uid is not None and not self.views_share_cache) or self.lease_session is None:
            return None
        return cache if self.lease_session.remaining() > 0 else None

    def acting_as(self, uid: int, gid: int, groups: "tuple[int, ...] | list[int]" = ()) -> "AsyncFileSystem":
        """This client as seen by another local user (a multi-user FUSE mount): namespace calls
        are checked against that uid, gid and groups, and what it creates is theirs. Needs a
        proxy credential (``tectofs user add --proxy``, or root's). Views share this client's
        chunk connections and buffers; each has its own metadata connection (its hello names
        the user), and the last ``limits.acting_views_max`` used are kept."""
        key = (uid, gid, tuple(sorted(set(groups))))
        view = self._views.pop(key, None)
        if view is None:
            if self.credential is None:
                raise InvalidArgument("acting for another user needs a (proxy) credential")
            view = object.__new__(AsyncFileSystem)
            view.__dict__.update(self.__dict__)
            view._views = {}
            view.meta_rpc = MeteredRpcClient(self.metrics, allocate_payload=lambda header, n: self.buffers.get(n))
            view.meta_rpc.expect_role(self.meta_address, "meta")
            view.meta_rpc.session = self.rpc.session  # its calls are this client's: its leases, its changes
            view.meta_rpc.authenticate(self.meta_address, auth.ClientAuth(credential=self.credential, act_as=key))
            view.metadata = MetadataClient(view.meta_rpc, self.meta_address)
            if self.lease_session is not None:  # its changes are this client's too
                view.metadata.on_change = functools.partial(self._changed, uid=uid)
                view.metadata.lease_token = self.lease_session.token
                view.metadata.flush_before = self.metadata.flush_before  # in order with this client's creates
            view.acting_uid = uid
            while len(self._views) >= limits.acting_views_max:
                oldest = self._views.pop(next(iter(self._views)))  # the least recently used
                asyncio.get_running_loop().create_task(oldest.meta_rpc.close())
        self._views[key] = view  # most recently used last
        return view

    async def sync(self) -> None:
        """Return once the metadata service stored every create, unlink and small file's first
        commit this client answered without a call (``client/claims.py``): what ``fsync``
        promises. Raises what their sending raised (the service unreachable: they stay queued)."""
        if self.claims is not None:
            await self.claims.flush()

    async def close(self) -> None:
        if self.meta_rpc is self.rpc:
            if self.claims is not None:
                await self.claims.close()
            await self.lease_endings.flush()
            if self.lease_session is not None:
                await self.lease_session.close()
        for view in self._views.values():
            await view.meta_rpc.close()
        self._views.clear()
        if self.meta_rpc is not self.rpc:
            await self.meta_rpc.close()  # a view: the chunk connections are its parent's
            return
        await self.rpc.close()

    # ------------------------------------------------------------------ namespace

    async def stat(self, path: str) -> Stat:
        cache = self._cached()
        cached = cache.lookup(path) if cache is not None else MISS
        if isinstance(cached, Stat):
            return cached
        if cached is ABSENT:
            raise NotFound(f"{path}: no such file or directory")

        async def lookup() -> tuple[Stat, list[int]]:
            reply = await self.metadata.lookup(messages.PathRequest(path=path))
            return Stat.from_attrs(reply.attrs), list(reply.walk)

        if cache is None:
            return (await lookup())[0]
        found = await self._learning(lookup, lambda answer: cache.learned(path, answer[1], answer[0]),
                                     lambda: cache.learned_absent(path))
        return found[0]

    async def _learning(self, call: Callable[[], Awaitable[AnswerT]], learn: Callable[[AnswerT], None],
                        learn_absent: Callable[[], None] | None = None) -> AnswerT:
        """``call()``'s answer from the service; the cache learns it (or, through
        ``learn_absent``, that it found nothing: NotFound, NoAttribute) unless a recall, a lost
        lease or this client's own change crossed the call (``LeaseSession.still_token``)."""
        assert self.lease_session is not None
        token = self.lease_session.token()
        try:
            answer = await call()
        except (NotFound, NoAttribute):
            if learn_absent is not None and self.lease_session.still_token(token):
                learn_absent()
            raise
        if self.lease_session.still_token(token):
            learn(answer)
        return answer

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except NotFound:
            return False

    async def readdir_page(self, path: str, after: str = "") -> tuple[list[tuple[str, Stat]], str | None]:
        """One page of a directory (one metadata call): entries sorted by name after
        ``after``, and the cursor for the next page (None after the last)."""
        reply = await self.metadata.readdir(messages.ReaddirRequest(path=path, after=after))
        return [(entry.name, Stat.from_attrs(entry.attrs)) for entry in reply.entries], reply.next

    async def scandir_pages(self, path: str) -> AsyncIterator[list[tuple[str, Stat]]]:
        """A directory's entries, sorted by name, a page at a time."""
        after: str | None = ""
        while after is not None:
            page, after = await self.readdir_page(path, after)
            yield page

    async def scandir(self, path: str) -> list[tuple[str, Stat]]:
        cache = self._cached()
        cached = cache.listing(path) if cache is not None else MISS
        if isinstance(cached, list):
            return cached

        async def listing() -> list[tuple[str, Stat]]:
            return [entry async for page in self.scandir_pages(path) for entry in page]

        if cache is None:
            return await listing()
        return await self._learning(listing, lambda entries: cache.learned_listing(path, entries))

    async def listdir(self, path: str) -> list[str]:
        return [name for name, _ in await self.scandir(path)]

    async def mkdir(
        self, path: str, mode: int = 0o755, policy: str | None = None, block_size: int | None = None,
        parents: bool = False, exist_ok: bool = False,
    ) -> Stat:
        return (await self._mkdir(path, mode, policy, block_size, parents, exist_ok))[0]

    async def make_directory(self, path: str, mode: int = 0o755) -> "tuple[Stat, DirectoryChange | None]":
        """``mkdir(path, mode)`` (the parent must exist, the name must not), with what it did to
        the parent directory (None: the service did not say)."""
        return await self._mkdir(path, mode)

    async def _mkdir(self, path: str, mode: int, policy: str | None = None, block_size: int | None = None,
                     parents: bool = False, exist_ok: bool = False) -> "tuple[Stat, DirectoryChange | None]":
        request = messages.MkdirRequest(path=path, mode=mode, policy=policy, block_size=block_size, exist_ok=exist_ok,
                                        uid=os.getuid(), gid=os.getgid())
        reply = await (self.metadata.makedirs(request) if parents else self.metadata.mkdir(request))
        return Stat.from_attrs(reply.attrs), DirectoryChange.from_reply(reply.directory, reply.directory_ctime_before)

    async def set_policy(
        self, path: str, policy: str | None = None, block_size: int | None = None, write_min: int | None = None
    ) -> Stat:
        """What new files below directory ``path`` get: policy, block size, write minimum."""
        reply = await self.metadata.set_policy(
            messages.SetPolicyRequest(path=path, policy=policy, block_size=block_size, write_min=write_min))
        return Stat.from_attrs(reply.attrs)

    async def rename(self, src: str, dst: str, noreplace: bool = False) -> None:
        if not noreplace:
            await self._before_removing(dst)
        await self.metadata.rename(messages.RenameRequest(src=src, dst=dst, noreplace=noreplace))

    async def _before_removing(self, *names: str) -> None:
        """This client is about to change ``names`` so that the files they name may lose their
        last name: its handles opened from the cache take readers' leases (``cached_opens``)."""
        if not self.cached_opens.any():
            return
        cache, inos = self._cached(), set[int]()
        for path in names:
            found = cache.lookup(path) if cache is not None else MISS
            if isinstance(found, Miss):
                await self.cached_opens.take_leases(None)  # which file it names is not known here
                return
            if isinstance(found, Stat):
                inos.add(found.ino)
        await self.cached_opens.take_leases(inos)

    async def exchange(self, a: str, b: str) -> None:
        """Atomically swap two entries (files or directories, empty or not)."""
        await self.metadata.exchange(messages.ExchangeRequest(a=a, b=b))

    async def remove(self, path: str) -> DirectoryChange | None:
        """Remove a name; the file goes with its last name, once no handle has it open.
        Returns what that did to the directory it was in (None from a metadata service that
        does not say)."""
        await self._before_removing(path)
        reply = self._unlink_without_call(path)
        if reply is None:
            reply = await self.metadata.unlink(messages.UnlinkRequest(path=path))
            if self.claims is not None and self.acting_uid is None:
                await self.claims.created_by_call(path, True)  # a burst of unlinks claims the directory too
        return DirectoryChange.from_reply(reply.directory, reply.directory_ctime_before)

    def _unlink_without_call(self, path: str) -> messages.UnlinkReply | None:
        """The answer of an unlink of a file's only name in a directory this client holds
        claimed, made with no call (``client/claims.py``); None: make it by a call."""
        cache = self._cached()
        if self.claims is None or self.acting_uid is not None or cache is None:
            return None
        found = cache.lookup(path)
        if not isinstance(found, Stat) or found.kind != "file" or found.nlink != 1:
            return None
        assert self.lease_session is not None
        began = self.lease_session.token()
        made = self.claims.unlink(path, found.ino)
        if made is None:
            return None
        reply = messages.UnlinkReply(directory=made[0], directory_ctime_before=made[1])
        self._changed("unlink", messages.UnlinkRequest(path=path), reply, began)  # the cache forgets it
        return reply

    async def remove_many(self, directory: str, names: Sequence[str]) -> DirectoryChange | None:
        """Remove ``names`` (files, symlinks, special files: not directories) from ``directory``,
        ``limits.unlink_batch_max`` per call, each call one transaction: all of its names or,
        raising the first failure, none of them."""
        change = None
        await self._before_removing(*(paths.join(directory, name) for name in names))
        for first in range(0, len(names), limits.unlink_batch_max):
            reply = await self.metadata.unlink_many(messages.UnlinkManyRequest(
                directory=directory, names=list(names[first : first + limits.unlink_batch_max])))
            change = DirectoryChange.from_reply(reply.directory, reply.directory_ctime_before)
        return change

    async def reference_blocks(self, path: str, source: str, pairs: Sequence[tuple[int, int]]) -> Stat:
        """Make block ``t`` of file ``path`` the block ``s`` of file ``source`` for each ``(t, s)``
        of ``pairs`` (``tectofs.store.sharing``: the same chunks, counted once more, so deleting
        either file keeps what the other uses), ``limits.commit_blocks_max`` pairs per call, each
        call one transaction. ``path`` must already be at least as long as the blocks it takes
        (``truncate`` it first) and have the block size of ``source``. Returns ``path``'s status."""
        if not pairs:
            return await self.stat(path)
        reply = None
        for first in range(0, len(pairs), limits.commit_blocks_max):
            reply = await self.metadata.reference_blocks(shared_blocks.ReferenceBlocksRequest(
                path=path, source=source, pairs=list(pairs[first : first + limits.commit_blocks_max])))
        assert reply is not None
        return Stat.from_attrs(reply.attrs)

    async def shared_blocks(self, directory: str, names: Sequence[str]) -> list[tuple[str, int, int]]:
        """``(name, block_id, stored bytes)`` for each block of the files ``names`` of
        ``directory`` that another use (another file, another index) shares; blocks not listed
        are their file's alone."""
        out: list[tuple[str, int, int]] = []
        for first in range(0, len(names), limits.health_inos_per_call_max):
            page = list(names[first : first + limits.health_inos_per_call_max])
            offset, more = 0, True
            while more:
                reply = await self.metadata.shared_blocks(shared_blocks.SharedBlocksRequest(
                    directory=directory, names=page, offset=offset))
                out += [(page[b.name], b.block_id, b.nbytes) for b in reply.blocks]
                offset, more = offset + len(reply.blocks), reply.more
        return out

    async def getxattr(self, path: str, name: str) -> bytes:
        """An extended attribute's value (``user.*``, ``trusted.*``, ``security.*``; other
        names fail here, without a call: ``tectofs.xattr_names``)."""
        xattr_names.namespace_of(name)
        cache = self._cached()
        cached = cache.xattr(path, name) if cache is not None else MISS
        if isinstance(cached, bytes):
            return cached
        if cached is None:
            raise NoAttribute(f"{path}: no extended attribute {name!r}")

        async def get() -> bytes:
            return bytes((await self.metadata.getxattr(messages.XattrRequest(path=path, name=name))).value)

        if cache is None:
            return await get()
        return await self._learning(get, lambda value: cache.learned_xattr(path, name, value),
                                    lambda: cache.learned_xattr(path, name, None))

    async def listxattr(self, path: str) -> list[str]:
        cache = self._cached()
        cached = cache.xattr_names(path) if cache is not None else MISS
        if isinstance(cached, list):
            return cached

        async def names() -> list[str]:
            return list((await self.metadata.listxattr(messages.PathRequest(path=path))).names)

        if cache is None:
            return await names()
        return await self._learning(names, lambda found: cache.learned_xattr_names(path, found))

    async def setxattr(self, path: str, name: str, value: bytes, flags: int = 0) -> None:
        """``flags``: ``os.XATTR_CREATE`` or ``os.XATTR_REPLACE``, as ``os.setxattr``."""
        xattr_names.namespace_of(name)
        await self.metadata.setxattr(messages.SetxattrRequest(path=path, name=name, value=bytes(value), flags=flags))

    async def removexattr(self, path: str, name: str) -> None:
        xattr_names.namespace_of(name)
        await self.metadata.removexattr(messages.XattrRequest(path=path, name=name))

    async def link(self, src: str, dst: str) -> Stat:
        """A hard link: ``dst`` becomes another name of the file ``src`` (not a directory)."""
        reply = await self.metadata.link(messages.LinkRequest(src=src, dst=dst))
        return Stat.from_attrs(reply.attrs)

    async def rmdir(self, path: str) -> "DirectoryChange | None":
        """Remove the empty directory ``path``; what it did to its parent (None: the service did
        not say)."""
        reply = await self.metadata.rmdir(messages.PathRequest(path=path))
        return DirectoryChange.from_reply(reply.directory, reply.directory_ctime_before)

    async def rmtree(self, path: str) -> None:
        """Remove directory ``path`` and everything below it, depth first: the files of each
        page of a listing in one call (``remove_many``: a directory of 30,000 files is a few
        dozen round trips, not 30,000), then its subdirectories. Stops at the first failure and
        raises it; what was removed by then stays removed (of the failing call's page, nothing)."""
        async for page in self.scandir_pages(path):
            files = [name for name, st in page if not st.is_dir]
            if files:
                await self.remove_many(path, files)
            for name, st in page:
                if st.is_dir:
                    await self.rmtree(paths.join(path, name))
        await self.rmdir(path)

    async def truncate(self, path: str, size: int) -> None:
        """Set a file's size. Shrinking inside a block rewrites that block (copy-on-write)."""
        st = await self.stat(path)
        if st.kind == "dir":
            raise IsADirectory(f"{path} is a directory")
        if size >= st.size or size % st.block_size == 0:
            await self.metadata.truncate(messages.TruncateRequest(path=path, size=size))
            return
        handle = await self.open(path, "r+b")
        try:
            await handle.truncate(size)
        finally:
            await handle.close()

    async def setattr(
        self, path: str, mode: int | None = None, uid: int | None = None, gid: int | None = None,
        atime: float | None = None, mtime: float | None = None,
    ) -> Stat:
        reply = await self.metadata.setattr(
            messages.SetattrRequest(path=path, mode=mode, uid=uid, gid=gid, atime=atime, mtime=mtime))
        return Stat.from_attrs(reply.attrs)

    async def symlink(self, target: str, path: str) -> Stat:
        reply = await self.metadata.symlink(messages.SymlinkRequest(path=path, target=target, uid=os.getuid(), gid=os.getgid()))
        return Stat.from_attrs(reply.attrs)

    async def mknod(self, path: str, mode: int, rdev: int = 0) -> Stat:
        """A FIFO, socket or device node (``mode`` with its ``stat.S_IF*`` type bits): metadata
        only, for the mount, ``tar`` and ``cp -a`` (the kernel serves them locally)."""
        reply = await self.metadata.mknod(messages.MknodRequest(path=path, mode=mode, rdev=rdev, uid=os.getuid(), gid=os.getgid()))
        return Stat.from_attrs(reply.attrs)

    async def readlink(self, path: str) -> str:
        st = await self.stat(path)
        if st.kind != "symlink" or st.target is None:
            raise InvalidArgument(f"{path} is not a symbolic link")
        return st.target

    async def statfs(self) -> messages.StatfsReply:
        """Inodes, and the raw and usable capacity of the live chunk servers (``StatfsReply``)."""
        return await self.metadata.statfs()

    async def servers(self) -> list[messages.ServerInfo]:
        """Every registered chunk server: address, load, liveness, progress counters."""
        return (await self.metadata.servers()).servers

    # ------------------------------------------------------------------ files

    async def open(self, path: str, mode: str = "rb", file_mode: int = 0o644, write_only: bool = False) -> AsyncFile:
        """Open a file. ``wb`` creates the name at once (empty if new) but replaces an existing
        file's content only when the handle commits, so readers never see a partial file.
        ``write_only``: a writable handle that will not be read from (it needs write
        permission on the file rather than read permission; the mount's ``O_WRONLY``).

        Every handle holds a lease while open: the version it opened stays readable after an
        unlink or a replace, and a file unlinked while open lives on (no name, ``nlink`` 0)
        until its last handle closes."""
        readable, writable, create, truncate, exclusive, append = _MODES[normalize_mode(mode)]
        lease = int.from_bytes(os.urandom(8), "big") >> 1 or 1
        if create:
            request = messages.CreateRequest(path=path, mode=file_mode, exclusive=exclusive, uid=os.getuid(),
                                             gid=os.getgid(), reader=lease)
            reply = self._create_without_call(request)
            if reply is None and self.claims is not None and self.acting_uid is None and await self.claims.claim_made(path):
                reply = self._create_without_call(request)  # in a directory this client just made: claimed first
            if reply is None:
                reply = await self.metadata.create(request)
                if self.claims is not None and self.acting_uid is None:
                    await self.claims.created_by_call(path, reply.created)
            handle = await self._opened(path, reply, readable, writable, truncate, lease)
            return handle
        cache = self._cached() if not writable else None
        loop = asyncio.get_running_loop()
        if cache is not None:  # read before, under a lease still held: no call
            cached = cache.take_layout(path, self.acting_uid, loop.time())
            if isinstance(cached, CachedLayout):
                handle = AsyncFile(self._file_context(), path, cached.layout, readable, False, False)
                if cached.reader:  # a larger file: the lease a closed handle parked
                    handle.hold_read_lease(cached.reader, cached.since)
                else:  # a small file, its bytes in hand
                    self.cached_opens.add(handle)
                return handle

        async def layout_call() -> messages.LayoutSegment:
            return await self.metadata.layout(messages.LayoutRequest(
                path=path, reader=lease, write_only=writable and (write_only or not readable)))

        sent = loop.time()
        if cache is None:
            layout = await layout_call()
        else:
            layout = await self._learning(layout_call, lambda found: cache.learned_layout(path, self.acting_uid, found))
        self.inline_max = layout.inline_max
        handle = AsyncFile(self._file_context(), path, layout, readable, writable, truncate)
        handle.hold_read_lease(lease, sent)
        return handle

    def _create_without_call(self, request: messages.CreateRequest) -> messages.CreateReply | None:
        """The answer of a create in a directory this client holds claimed, of a name its
        cache knows is absent, made with no call (``client/claims.py``); None: make it by a call."""
        cache = self._cached()
        if self.claims is None or self.acting_uid is not None or cache is None or cache.lookup(request.path) is not ABSENT:
            return None
        assert self.lease_session is not None
        began = self.lease_session.token()
        made = self.claims.create(request.path, request.mode, request.reader)
        if made is None:
            return None
        reply = messages.CreateReply(attrs=made.attrs, created=True, directory=made.directory,
                                     directory_ctime_before=made.directory_ctime_before, inline_max=made.inline_max)
        self._changed("create", request, reply, began)  # the cache learns it as any own create
        return reply

    async def _opened(self, path: str, reply: messages.CreateReply, readable: bool, writable: bool, truncate: bool,
                      lease: int) -> AsyncFile:
        """The handle of a creating open, from its create's ``reply``."""
        self.inline_max = reply.inline_max
        # a new file has no blocks yet (and its creator may write it whatever its mode)
        layout = messages.LayoutSegment(attrs=reply.attrs, blocks=[], inline_max=reply.inline_max) if (
            truncate or reply.created) else await self.metadata.layout(
                messages.LayoutRequest(ino=reply.attrs.ino, handle=reply.attrs.handle))
        # a file this call created is empty already: nothing to truncate (no commit at close
        # unless something is written)
        handle = AsyncFile(self._file_context(), path, layout, readable, writable, truncate and not reply.created)
        handle.created = reply.created
        handle.directory = DirectoryChange.from_reply(reply.directory, reply.directory_ctime_before)
        handle.hold_read_lease(lease)
        return handle

    def _file_context(self) -> FileContext:
        """What a file this client (or view) opens may use of it (``client/context.py``)."""
        cache = self._cached()
        return FileContext(metadata=self.metadata, blocks=self.blocks, buffers=self.buffers, metrics=self.metrics,
                           lease_endings=self.lease_endings, acting_uid=self.acting_uid,
                           park_reader=cache.park_reader if cache is not None else None)

    async def block_count(self, path: str) -> int:
        """How many blocks a file stores (holes not counted), reading its layout segment by segment."""
        count, first = 0, 0
        while True:
            segment = await self.metadata.layout(messages.LayoutRequest(path=path, first=first))
            count += len(segment.blocks)
            if segment.end is None:
                return count
            first = segment.end

    async def read_bytes(self, path: str) -> bytes:
        handle = await self.open(path, "rb")
        try:
            return await handle.read(0, handle.size)
        finally:
            await handle.close()

    async def read_range(self, path: str, offset: int, length: int) -> bytes:
        handle = await self.open(path, "rb")
        try:
            return await handle.read(offset, length)
        finally:
            await handle.close()

    async def write_bytes(
        self, path: str, data: bytes | bytearray | memoryview, *, exclusive: bool = False,
        mtime: float | None = None, xattrs: Sequence[tuple[str, bytes]] = (), file_mode: int = 0o644,
    ) -> Stat:
        """Replace (or create) a file's content: all of ``data``, or — on any failure — nothing;
        returns its attributes after. ``exclusive``: fail if the name exists. ``mtime``: the
        file's modification time (default: now). ``xattrs``: extended attributes to set with it
        (at most ``limits.create_xattrs_max``, published with the content).

        A small file (up to what the metadata service keeps inline) is one call: created,
        filled and published together. A larger one is written through a handle."""
        if len(xattrs) > limits.create_xattrs_max:
            raise InvalidArgument(f"{len(xattrs)} extended attributes: at most {limits.create_xattrs_max} go with a write")
        entries = [messages.XattrEntry(name=name, value=value) for name, value in xattrs]
        lease = int.from_bytes(os.urandom(8), "big") >> 1 or 1
        content = messages.InlineData(data=bytes(data), crc=checksum.crc(data)) if len(data) <= self.inline_max else None
        reply = await self.metadata.create(messages.CreateRequest(
            path=path, mode=file_mode, exclusive=exclusive, uid=os.getuid(), gid=os.getgid(), reader=0 if content else lease,
            content=content, mtime=mtime, xattrs=entries if content else []))
        if reply.content_stored:
            self.inline_max = reply.inline_max
            return Stat.from_attrs(reply.attrs)
        handle = await self._opened(path, reply, False, True, True, lease)
        try:
            await handle.write(0, data)
            if mtime is not None:
                handle.stamp_times(None, mtime)
            await handle.close()
            for name, value in xattrs:
                await self.setxattr(path, name, value)
        except BaseException:
            await handle.abort()
            raise
        return Stat.from_attrs(handle.attrs)

    async def gather(self, *coros: Any) -> list[Any]:
        return list(await asyncio.gather(*coros))
