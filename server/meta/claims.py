"""The metadata service's operations of asynchronous creates (``tectofs.wire.claims``): a lease
session claims a directory, then creates files there with no call and sends them in batches.

While a session holds a directory claimed, nobody else may read or change it: any operation of
another caller that reads or changes one of its names, its listing or its attributes is undone
on the store's thread, the claim recalled (its holder sends the creates it made and
acknowledges, or its session runs out) and the operation run again (``MetadataService._call``;
``LeaseTable.claimed_by_other``). So what a create answered is seen by every other client's
next call, as if it had been a call itself. Claims live in the service's memory: several
services over PostgreSQL grant none (their peers could not see them)."""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Protocol, TypeVar

from tectofs import paths
from tectofs.errors import InvalidArgument, PermissionDenied
from tectofs.store import SqlStore, StoreRunner
from tectofs.store.access import Caller
from tectofs.wire import messages
from tectofs.wire.claims import ClaimReply, ClaimRequest, CreateManyReply, CreateManyRequest
from tectofs.wire.server import current_peer

from .leases import LeaseTable

log = logging.getLogger("tectofs.meta")
ReplyT = TypeVar("ReplyT", bound=messages.Message)
ResultT = TypeVar("ResultT")
Reply = tuple[ReplyT, bytes]
_REFUSED = ClaimReply(granted=False)


class Service(Protocol):
    """What these handlers use of the metadata service (``server/meta/service.py``)."""

    leases: LeaseTable
    runner: StoreRunner

    @property
    def grants_claims(self) -> bool: ...

    async def _call(self, operation: Callable[[SqlStore], ResultT], returns: type[ResultT], *,
                    always_admitted: bool = False, new_directory: bool = False, own_kept: bool = True) -> ResultT: ...

    def _caller(self) -> Caller | None: ...

    def _attrs(self, attrs: messages.Attrs) -> messages.Attrs: ...

    def _handle(self, ino: int) -> bytes: ...

    def _segment(self, layout: messages.LayoutSegment) -> messages.LayoutSegment: ...


class ClaimOperations:
    """``claim_directory`` and ``create_many`` of ``service``."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self._forgetting: set[asyncio.Task[None]] = set()

    async def restore(self) -> None:
        """At start: hold the claims a predecessor over this store granted (the store keeps
        them) through the grace period, so their holders' unsent creates are taken back before
        anyone reads or changes those directories (``LeaseTable.restore_claims``); from now
        on, claims that end are forgotten by the store too."""
        leases, loop = self.service.leases, asyncio.get_running_loop()
        ranges = await self.service.runner.call(lambda store: store.claims_recorded())

        def ended(firsts: list[int]) -> None:
            loop.call_soon_threadsafe(self._forget, firsts)
        leases.on_claims_ended = ended
        if not ranges:
            return
        if not leases.in_grace():  # nobody can hold them (no lease was ever granted over the store)
            self._forget([first for first, _, _, _ in ranges])
            return
        leases.restore_claims(ranges)
        loop.call_later(leases.grace_until - leases.clock(), leases.end_restored)
        log.info("holding %d claimed directories for their clients' unsent creates until the grace period ends",
                 len({directory for _, _, directory, _ in ranges}))

    def _forget(self, firsts: list[int]) -> None:
        task = asyncio.get_running_loop().create_task(self._forget_now(firsts))
        self._forgetting.add(task)
        task.add_done_callback(self._forgetting.discard)

    async def _forget_now(self, firsts: list[int]) -> None:
        try:
            await self.service.runner.call(lambda store: store.forget_claims(firsts))
        except Exception as exc:  # kept: a restarted service holds them through its grace period
            log.warning("forgetting %d ended claim ranges failed: %s", len(firsts), exc)

    async def rpc_claim_directory(self, r: ClaimRequest, _: memoryview) -> Reply[ClaimReply]:
        session = current_peer.get().session
        if not session or not self.service.grants_claims:
            return _REFUSED, b""
        parts, caller, leases = paths.split(r.path), self.service._caller(), self.service.leases

        def claim(store: SqlStore) -> ClaimReply:
            try:
                directory, template, first = store.claim_directory(parts, r.count, r.uid, r.gid, caller=caller)
            except InvalidArgument:  # a setgid directory: created by calls
                return _REFUSED
            # (the others' holdings of its files' attributes were recalled by the first claim, and
            # none was granted since: a claim of more numbers does not look at them again)
            children = () if leases.holds_claim(session, directory.ino) else store.children(directory.ino)
            stale = leases.claim(session, directory.ino, first, r.count, children)
            if stale is None:
                return _REFUSED
            store.record_claim(first, r.count, directory.ino, session)
            assert store.modified is not None
            store.modified.update(stale)  # the others' names, listing and attributes of it: recalled first
            return ClaimReply(granted=True, directory=directory, template=template, first=first,
                              inline_max=store._inline_max(template))

        reply = await self.service._call(claim, ClaimReply, own_kept=False)  # (what it recalls is the others')
        if not reply.granted:
            return reply, b""
        assert reply.directory is not None and reply.template is not None
        handles = [self.service._handle(reply.first + i) for i in range(r.count)]
        return ClaimReply(granted=True, directory=self.service._attrs(reply.directory), template=reply.template,
                          first=reply.first, handles=handles if any(handles) else [],
                          inline_max=reply.inline_max), b""

    def unsent_file(self, directory: int, ino: int) -> Callable[[SqlStore], messages.Attrs | None]:
        """For ``allocate`` (``AllocateRequest.claimed_in``), on the store's thread: what file
        ``ino`` will be, if it does not exist yet and the calling session holds the claim on
        ``directory`` that handed out its number (its create is on its way: checked there, so
        the claim cannot end meanwhile); None: allocate as for any file."""
        session, leases = current_peer.get().session, self.service.leases

        def unsent(store: SqlStore) -> messages.Attrs | None:
            if directory and leases.claim_covers(session, directory, (ino,)):
                return store.claimed_file(directory, ino)
            return None
        return unsent

    async def rpc_create_many(self, r: CreateManyRequest, _: memoryview) -> Reply[CreateManyReply]:
        session = current_peer.get().session
        parts, caller, leases = paths.split(r.path), self.service._caller(), self.service.leases

        def create_many(store: SqlStore) -> CreateManyReply:
            # Checked here, on the store's thread: the claim cannot end between the check and the creates.
            if not leases.claim_covers(session, r.directory, (c.ino for c in r.creates)):
                raise PermissionDenied(
                    f"{r.path}: this session holds no claim there handing out those inode numbers (it was"
                    " recalled, or the session ran out): these creates are refused")
            return store.create_many(parts, r.directory, r.creates, r.uid, r.gid, caller=caller, unlinks=r.unlinks)

        # Not granted to its sender: while the claim holds, nobody else reads or changes the
        # directory; when it ends, the client drops what it learned under it (client/claims.py).
        made = await self.service._call(create_many, CreateManyReply, own_kept=False)
        return CreateManyReply(directory=self.service._attrs(made.directory),
                               layouts=[self.service._segment(layout) for layout in made.layouts]), b""
