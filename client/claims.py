"""Asynchronous creates: the client's side (``server/meta/claims.py`` is the service's).

A leasing client that keeps creating files in one directory (``limits.claim_after_creates``
creates, each a call) *claims* it: the service makes this client's lease session the only one
that may read or change the directory and hands it inode numbers (``claim_directory``). Then a
create of a name this client knows is absent costs no call: it takes the next number, answers
with the attributes the service would have given, and queues the create. The queue is sent as
one ``create_many`` per directory run:

- before any other metadata call of this client (``MetadataClient.flush_before``), so every
  call the service sees comes after the creates this client answered before it: an open of the
  file for writing, a commit, an unlink, a rename, a release of its lease;
- ``limits.create_flush_delay_s`` after the first create queued;
- when the service recalls the claim (another client read or changed the directory: its call
  waits for this flush), and when the client closes.

So every other client sees what a create answered at its next call. What a client promises its
user is a local file system's: a create is durable once something after it reached the
service (an ``fsync``, a ``close`` of a written file, any call) or at most
``create_flush_delay_s`` later; a client that dies before loses the creates it did not send,
as a crash of the machine loses what an ext4 did not write back. If the service refuses a
batch (the claim ran out with the session: a client cut off for a whole lease), those creates
are lost, and said so in the log (``lost``).

The first commit of a small file created so (written whole, inline) goes with its create.
By default its caller waits for that sending (a library's ``close`` is durable when it
returns). With ``commits_in_background`` (the mount's), it does not: the commit is answered
at once with the layout the service will store (the same bytes, times and size: the service
takes the client's time as the commit's, as it does for the create), and is durable as the
creates are: at this client's next call (``fsync`` is one: ``sync``), or
``create_flush_delay_s`` later. CephFS's buffered creates and Lustre's write-back behave so;
a ``close`` on a local disk does too. A commit the service could refuse for another reason
than a lost claim (a mode change, a file past the inline size) is never answered so.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import stat as statmod
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import msgspec

from tectofs import limits, paths
from tectofs.errors import Busy, ConnectionLost, TectofsError, Timeout
from tectofs.wire import inline_echo, messages
from tectofs.wire.claims import ClaimRequest, CreateManyRequest, PendingContent, PendingCreate, PendingUnlink
from tectofs.wire.leases import Recall
from tectofs.wire.values import Block

from .block_reads import consume_outcome
from .metadata import MetadataClient

log = logging.getLogger("tectofs.client")
# Errors of a sending the service did not answer: what it carried is sent again, not lost.
UNANSWERED = (ConnectionLost, Timeout, Busy, asyncio.TimeoutError, ConnectionError)
# This client's own calls after which it creates by calls again: a claimed directory may have
# moved (rename, exchange, rmdir) or its permissions, owner or policy changed.
CLAIMS_ENDING = frozenset({"rename", "exchange", "rmdir", "setattr", "set_policy", "setxattr", "removexattr"})


@dataclass
class _Claimed:
    """A directory this client holds claimed: its attributes as its creates left them, the
    attributes its new files get, and the inode numbers (with their handles) not used yet."""

    path: str
    directory: messages.Attrs
    template: messages.Attrs
    inline_max: int
    numbers: list[tuple[int, bytes]] = field(default_factory=list)  # (ino, handle), next first
    granted: int = 0  # how many numbers its last claim handed out (the next asks twice as many)
    asking: bool = False  # a claim of more numbers is under way


@dataclass
class AsyncCreate:
    """What a create answered without a call: the new file's attributes and its directory's
    before (ctime) and after."""

    attrs: messages.Attrs
    directory: messages.Attrs
    directory_ctime_before: float
    inline_max: int


class CreateClaims:
    """One leasing client's claims and its queue of creates not sent yet (see the module)."""

    def __init__(self, metadata: MetadataClient, *, uid: int, gid: int,
                 clock: Callable[[], float] = time.time) -> None:
        self.metadata = metadata
        self.uid, self.gid = uid, gid
        self.clock = clock
        self._claims: dict[str, _Claimed] = {}
        self._creates_by_call: dict[str, int] = {}  # creates made by calls, by directory (bounded)
        self._made: set[str] = set()  # directories this client made and has not claimed (bounded)
        self._queue: list[tuple[_Claimed, PendingCreate | PendingUnlink]] = []
        self._queued = 0  # creates and unlinks ever queued (what a flush sends up to)
        self._sending = asyncio.Lock()
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # claims of more numbers, under way
        # One per claim call under way: the directories whose claims were recalled meanwhile
        # (None in it: the session was lost). Its answer may come after the recall of what it
        # granted (the service recalls the others' leases before it answers): not to be used.
        self._claiming: list[set[int | None]] = []
        self._layouts: dict[int, messages.LayoutSegment] = {}  # sent commits' answers, for their callers
        self._refused: dict[int, BaseException] = {}  # ... or the service's refusal
        self._awaited: set[int] = set()  # files whose first commit's caller waits for its sending
        self._created: dict[int, tuple[messages.Attrs, int]] = {}  # queued creates' attributes, inline_max
        self._content_queued = 0  # bytes of file data the queue carries
        # The mount's: a small file's first commit does not wait for its sending (see the module).
        self.commits_in_background = False
        self.on_lost: Callable[[list[str]], None] | None = None  # told the paths of creates refused
        self.created = 0  # creates answered without a call
        self.unlinked = 0  # unlinks answered without a call
        self.sent = 0  # of them, made at the service
        self.lost = 0  # of them, refused by the service
        self.background_commits = 0  # first commits answered before their sending
        self.claims = 0

    @property
    def pending(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ creating

    def create(self, path: str, mode: int, reader: int = 0) -> AsyncCreate | None:
        """Create file ``path`` (known absent: the caller checked its cache) with no call if its
        directory is claimed here and numbers are left; None: create it by a call. ``reader``:
        the creating handle's reader's lease, which the create takes when it is sent (so the
        file lives while open, even unlinked)."""
        parts = paths.split(path)
        if not parts:
            return None
        claimed = self._claims.get(paths.join(*parts[:-1]) if len(parts) > 1 else "/")
        if claimed is None or not claimed.numbers:
            return None
        ino, handle = claimed.numbers.pop(0)
        if len(claimed.numbers) == claimed.granted // 2 and not claimed.asking:  # more before these run out
            task = asyncio.get_running_loop().create_task(self._claim(claimed.path))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        now = self.clock()
        before = claimed.directory
        claimed.directory = msgspec.structs.replace(before, mtime=now, ctime=now)
        attrs = msgspec.structs.replace(claimed.template, ino=ino, mode=claimed.template.mode & ~0o7777 | mode & 0o7777,
                                        atime=now, mtime=now, ctime=now, handle=handle)
        self._queue.append((claimed, PendingCreate(name=parts[-1], ino=ino, mode=mode & 0o7777, time=now, reader=reader)))
        if self.commits_in_background:
            self._created[ino] = (attrs, claimed.inline_max)
        self._queued += 1
        self.created += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(limits.create_flush_delay_s, self._send_soon)
        return AsyncCreate(attrs=attrs, directory=claimed.directory, directory_ctime_before=before.ctime,
                           inline_max=claimed.inline_max)

    def made_directory(self, path: str) -> None:
        """This client made directory ``path``: its first create there claims it (a new
        directory is most often filled by whoever made it: untar, ``cp -r``)."""
        if len(self._made) > 4096:
            self._made.clear()
        self._made.add(paths.join(path))

    async def claim_made(self, path: str) -> bool:
        """Before creating ``path``: claim its directory if this client made it and has not
        claimed it yet; whether a claim was granted."""
        parts = paths.split(path)
        directory = paths.join(*parts[:-1]) if len(parts) > 1 else "/"
        if directory not in self._made:
            return False
        self._made.discard(directory)
        if directory in self._claims:
            return False
        await self._claim(directory)
        return directory in self._claims

    async def created_by_call(self, path: str, created: bool) -> None:
        """A create (or an unlink) by a call in ``path``'s directory answered (``created``: it
        made, or removed, the file): after a few in one directory, claim it."""
        if not created:
            return
        parts = paths.split(path)
        directory = paths.join(*parts[:-1]) if len(parts) > 1 else "/"
        if directory in self._claims:  # its numbers ran out: more (unless asked for already)
            if not self._claims[directory].asking:
                await self._claim(directory)
            return
        if len(self._creates_by_call) > 4096:
            self._creates_by_call.clear()
        count = self._creates_by_call.get(directory, 0) + 1
        self._creates_by_call[directory] = count
        if count >= limits.claim_after_creates:
            del self._creates_by_call[directory]
            await self._claim(directory)

    async def _claim(self, directory: str) -> None:
        """Claim ``directory``, or more numbers there: ``limits.claim_inodes_first`` at first
        (most directories of a tree hold a few files: each number the service hands out costs it
        a file handle and the reply its bytes), then each time twice the last, up to
        ``limits.claim_inodes``."""
        held = self._claims.get(directory)
        count = limits.claim_inodes_first if held is None else min(limits.claim_inodes, 2 * held.granted)
        if held is not None:
            held.asking = True
        recalled: set[int | None] = set()
        self._claiming.append(recalled)
        try:
            reply = await self.metadata.claim_directory(ClaimRequest(path=directory, count=count, uid=self.uid,
                                                                     gid=self.gid))
        except TectofsError as exc:
            log.debug("claiming %s failed: %s", directory, exc)
            return
        finally:
            # By identity: list.remove compares sets by value, and would take another call's
            # equal set (both empty, say) out instead, so recalls would stop reaching that call.
            self._claiming = [other for other in self._claiming if other is not recalled]
            if held is not None:
                held.asking = False
        if not reply.granted or reply.directory is None or reply.template is None:
            return
        if None in recalled or reply.directory.ino in recalled:  # granted, then taken back before its answer
            log.debug("the claim of %s was recalled before its answer arrived: creating there by calls", directory)
            return
        numbers = list(zip(range(reply.first, reply.first + count), reply.handles or itertools.repeat(b"")))
        claimed = self._claims.get(directory)
        if claimed is not None and claimed.directory.ino == reply.directory.ino:
            claimed.numbers.extend(numbers)
            claimed.granted = count
            return
        self._claims[directory] = _Claimed(path=directory, directory=reply.directory, template=reply.template,
                                           inline_max=reply.inline_max, numbers=numbers, granted=count)
        self.claims += 1

    def unlink(self, path: str, ino: int) -> tuple[messages.Attrs, float] | None:
        """Unlink ``path``, which names regular file ``ino`` and is its only name (the caller's
        cache says so), with no call if its directory is claimed here (and not sticky: whether
        the caller may is the service's to say) and its create was sent already; the directory's
        attributes after and its ctime before. None: unlink it by a call."""
        parts = paths.split(path)
        if not parts:
            return None
        claimed = self._claims.get(paths.join(*parts[:-1]) if len(parts) > 1 else "/")
        if claimed is None or claimed.directory.mode & statmod.S_ISVTX or any(
                pending.ino == ino for _, pending in self._queue):
            return None
        now = self.clock()
        before = claimed.directory
        claimed.directory = msgspec.structs.replace(before, mtime=now, ctime=now)
        self._queue.append((claimed, PendingUnlink(name=parts[-1], ino=ino)))
        self._queued += 1
        self.unlinked += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(limits.create_flush_delay_s, self._send_soon)
        return claimed.directory, before.ctime

    def absorb_commit(self, request: messages.CommitRequest) -> Awaitable[messages.LayoutSegment] | None:
        """For ``MetadataClient.absorb_commit``: the first commit of a file created without a
        call and not sent yet goes with its create (one round trip for a small file written
        whole); the sending of both, which answers the commit's layout. None: an ordinary commit."""
        if request.writer is not None or request.holes or len(request.blocks) > 1 or any(
                block.inline is None for block in request.blocks):
            return None
        for i in range(len(self._queue) - 1, -1, -1):
            claimed, pending = self._queue[i]
            if isinstance(pending, PendingCreate) and pending.ino == request.ino:
                if pending.content is not None:
                    return None
                created = self._created.pop(request.ino, None)
                now = self.clock()
                layout = None if created is None else _layout_after(created[0], created[1], request, now)
                if layout is not None and self._content_queued + request.size > limits.background_commit_bytes_max:
                    layout = None  # the service is behind: this caller waits for the queue to drain
                content = PendingContent(size=request.size, blocks=list(request.blocks), mtime=request.mtime,
                                         atime=request.atime, mode=request.mode,
                                         ctime=now if layout is not None else None)
                self._queue[i] = (claimed, msgspec.structs.replace(pending, content=content))
                self._content_queued += _content_bytes(self._queue[i][1])
                if layout is None:
                    self._awaited.add(request.ino)
                    return self._committed(request)
                done: asyncio.Future[messages.LayoutSegment] = asyncio.get_running_loop().create_future()
                done.set_result(layout)
                self.background_commits += 1
                return done
        return None

    async def _committed(self, request: messages.CommitRequest) -> messages.LayoutSegment:
        try:
            await self.flush()  # everything queued so far: this create and its content with it
        finally:
            self._awaited.discard(request.ino)
        refused = self._refused.pop(request.ino, None)
        if refused is not None:
            raise refused
        return inline_echo.restore(self._layouts.pop(request.ino), request.blocks)

    # ------------------------------------------------------------------ what the client's own calls change

    def directory_changed(self, directory: str, after: messages.Attrs | None) -> None:
        """This client's call changed claimed ``directory`` (its attributes after, if said)."""
        claimed = self._claims.get(directory)
        if claimed is None:
            return
        if after is None or after.ino != claimed.directory.ino:
            self._claims.pop(directory, None)  # not known any more: create by calls there
        else:
            claimed.directory = after

    def forget_under(self, changed: list[str]) -> None:
        """Stop creating without a call in the claimed directories at or below ``changed`` (this
        client's rename, rmdir or permission change there may have moved or closed them); what
        is queued is still sent. A path not resolvable here (None-like: ``[]``) forgets them all."""
        if not changed:
            self._claims.clear()
            return
        roots = [paths.join(path) for path in changed]
        for claimed in [p for p in self._claims if any(p == r or p.startswith(r.rstrip("/") + "/") for r in roots)]:
            del self._claims[claimed]

    # ------------------------------------------------------------------ sending

    def flush_before(self) -> Awaitable[None] | None:
        """For ``MetadataClient.flush_before``: the sending of what is queued, or None if nothing is."""
        return self.flush() if self._queue or self._sending.locked() else None

    def allocating(self, ino: int) -> int | None:
        """For ``MetadataClient.allocate``: the claimed directory (its inode) whose queued create
        makes file ``ino``, whose allocation then need not wait for the sending; None if its
        create is not queued. The sending starts right after the allocation went out (the
        service serves them in that order): it goes on while the file's blocks are put."""
        for claimed, pending in reversed(self._queue):
            if isinstance(pending, PendingCreate) and pending.ino == ino:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = asyncio.get_running_loop().call_later(0, self._send_soon)
                return claimed.directory.ino
        return None

    def _send_soon(self) -> None:
        self._timer = None
        if self._queue:
            task = asyncio.get_running_loop().create_task(self._send_in_background())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send_in_background(self) -> None:
        try:
            await self.flush()
        except UNANSWERED:  # kept, and tried again (the next call of the client tries too)
            if self._timer is None and self._queue:
                self._timer = asyncio.get_running_loop().call_later(limits.claim_backoff_s, self._send_soon)

    async def flush(self) -> None:
        """Send every create queued so far (in order, one ``create_many`` per run of one
        directory; creates queued meanwhile wait for the next sending); returns once the service
        made them or refused them (``lost``, logged), and any sending already under way ended.
        The sending is a task of its own: a caller cancelled while it waits leaves it to end,
        so a batch taken off the queue is always made, put back or reported lost, never dropped."""
        sending = asyncio.get_running_loop().create_task(self._flush(self._queued))
        sending.add_done_callback(consume_outcome)
        await asyncio.shield(sending)

    async def _flush(self, target: int) -> None:
        while True:
            async with self._sending:  # after a sending under way: its creates came first
                if not self._queue or self._queued - len(self._queue) >= target:
                    return
                claimed = self._queue[0][0]
                run, carried = 0, 0
                while run < len(self._queue) and run < limits.create_batch_max and self._queue[run][0] is claimed:
                    carried += _content_bytes(self._queue[run][1])
                    if run and carried > limits.create_batch_bytes_max:
                        break
                    run += 1
                batch = [pending for _, pending in self._queue[:run]]
                del self._queue[:run]
                self._content_queued -= sum(map(_content_bytes, batch))
                for pending in batch:
                    if isinstance(pending, PendingCreate):
                        self._created.pop(pending.ino, None)
                if not self._queue and self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                await self._send(claimed, batch)

    async def _send(self, claimed: _Claimed, batch: "list[PendingCreate | PendingUnlink]") -> None:
        """Send ``batch``. Not answered (the service is down or restarting): it goes back to the
        head of the queue and the error is raised (the call waiting for it fails as it would
        have: a restarted service takes it back in its grace period). Refused: lost."""
        creates = [pending for pending in batch if isinstance(pending, PendingCreate)]
        unlinks = [pending for pending in batch if isinstance(pending, PendingUnlink)]
        try:
            reply = await self.metadata.create_many(CreateManyRequest(
                path=claimed.path, directory=claimed.directory.ino, uid=self.uid, gid=self.gid, creates=creates,
                unlinks=unlinks))
        except UNANSWERED:
            self._queue[:0] = [(claimed, pending) for pending in batch]
            self._content_queued += sum(map(_content_bytes, batch))
            raise
        except (TectofsError, OSError) as exc:
            for pending in creates:
                if pending.content is not None and pending.ino in self._awaited:  # its commit fails with the answer
                    self._refused[pending.ino] = exc
            self.lost += len(batch)
            self._claims.pop(claimed.path, None)
            names = ", ".join(p.name for p in batch[:5]) + (", ..." if len(batch) > 5 else "")
            log.error("%d creates and %d unlinks in %s were lost: the metadata service refused them (%s): %s",
                      len(creates), len(unlinks), claimed.path, exc, names)
            if self.on_lost is not None:
                self.on_lost([paths.join(claimed.path, p.name) for p in batch])
            return
        written = [pending.ino for pending in creates if pending.content is not None]
        self._layouts.update((ino, layout) for ino, layout in zip(written, reply.layouts) if ino in self._awaited)
        self.sent += len(batch)

    async def recalled(self, recall: Recall | None) -> None:
        """A lease recall (None: the session was lost): the claims it ends are given back once
        what was created there is sent."""
        if recall is not None and not recall.claims:
            return
        for recalled in self._claiming:
            recalled.update([None] if recall is None else recall.claims)
        if recall is None:
            self._claims.clear()
        else:
            for path in [p for p, c in self._claims.items() if c.directory.ino in recall.claims]:
                del self._claims[path]
        try:
            await self.flush()
        except UNANSWERED:  # tried again later: a restarted service takes them back in its grace period
            if self._timer is None and self._queue:
                self._timer = asyncio.get_running_loop().call_later(limits.claim_backoff_s, self._send_soon)

    async def close(self) -> None:
        """Send what is queued; what cannot be sent now is lost (said in the log)."""
        self._claims.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            await self.flush()
        except UNANSWERED as exc:
            log.error("%d files created were lost: the metadata service did not answer at close (%s)",
                      len(self._queue), exc)
            self.lost += len(self._queue)
            self._queue.clear()
            self._created.clear()
            self._content_queued = 0


def _layout_after(attrs: messages.Attrs, inline_max: int, request: messages.CommitRequest,
                  now: float) -> messages.LayoutSegment | None:
    """The layout the service stores for the first commit ``request`` of a file created without
    a call with ``attrs`` (``inline_max``: its claim's), at ``now`` (the commit's ctime, which
    the service takes from the client); None where the service could answer otherwise than
    with this layout or a refusal of the whole batch (a mode change, checked against the
    caller; anything but no block or one inline block 0 from the file's start, within the
    inline size)."""
    if (request.mode is not None or request.holes or request.shrunk_to is not None or len(request.blocks) > 1
            or request.size > inline_max or request.size > attrs.block_size):
        return None
    blocks, stored = [], 0
    if request.blocks:  # (none: an empty file, or one grown by truncate alone: a hole)
        block = request.blocks[0]
        stored = min(block.length, request.size)
        if block.inline is None or block.idx != 0 or block.start != 0 or stored <= 0:
            return None
        blocks.append(Block(idx=0, block_id=0, policy=attrs.policy, start=0, length=block.length, valid=stored,
                            chunks=[], inline=block.inline))
    after = msgspec.structs.replace(attrs, size=request.size, mtime=request.mtime or now, ctime=now,
                                    atime=attrs.atime if request.atime is None else request.atime, stored=stored)
    return messages.LayoutSegment(attrs=after, inline_max=inline_max, blocks=blocks)


def _content_bytes(pending: "PendingCreate | PendingUnlink") -> int:
    """The bytes of file data ``pending`` carries (its first commit's inline block)."""
    if isinstance(pending, PendingUnlink) or pending.content is None:
        return 0
    return sum(len(block.inline.data) for block in pending.content.blocks if block.inline is not None)
