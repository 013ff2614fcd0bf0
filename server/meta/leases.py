"""Read leases on metadata, and their recalls (NFSv4 delegations, CephFS capabilities, Chubby's
cache invalidations carried by KeepAlives).

A client that says a *session* id in its hello (``messages.Hello.session``) holds a lease on
what its reads told it (``tectofs.wire.leases``: the keys): each name its paths walked, present
or absent (``("e", directory, name)``); the attributes, extended attributes, target and inline
data of each inode an answer carried (``("a", ino)``); each directory it listed
(``("l", directory)``). While its session lives, it may answer those from its cache without
asking. A change (``SqlStore.modified``, ``tectofs/store/lease_keys.py``: the names a statement
added, removed or repointed, and with them their directory's listing; the inodes whose rows it
updated) *recalls* what it invalidated from every other session holding it, and the changing
call returns only once each holder acknowledged or its session ran out; the changing session,
whose client keeps what its change taught it, is granted the names and attributes it changed
(not for a claim's calls: ``MetadataService._call``'s ``own_kept``). A recall ends the
holding: the holder is recalled again only after it read the thing again, so a client that
keeps creating in a directory another client once listed pays one recall, not one per create.
Names are leased one by one, so walking through a directory is not disturbed by creates of
other names in it.

Sessions live by ``keepalive`` calls (Chubby's KeepAlive): the client has one outstanding at a
time; the service holds it until a recall is due or ``limits.lease_keepalive_wait_s`` passed,
answers with the recalls, and the next keepalive acknowledges them. A session's expiry is
``lease_s`` after its last keepalive *arrived*; the client counts from when it *sent* it, so the
client stops trusting its cache first. A keepalive that arrives while a recall to its session
is unacknowledged does not renew it: a client that receives recalls and never acknowledges them
cannot hold a change back for longer than one ``lease_s`` (a dead or partitioned client costs a
change at most that). An expired session is forgotten with all its leases; its next keepalive
starts it afresh and says so (``restarted``), and the client then drops everything it cached.

Thread safety: grants are recorded on the store's thread, during the operation that read what
they cover (so a change whose store operation runs after it is sure to see the holder), and
recalls are sent from the event loop's, after the changing operation committed: every method
takes the table's lock.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable

from tectofs import limits
from tectofs.errors import TectofsError
from tectofs.wire.leases import ATTRS, CLAIM, ENTRY, LISTING, KeepaliveReply, LeaseKey, Recall, recall_of


class ClaimConflict(TectofsError):
    """An operation read or changed a directory another session holds claimed (its creates
    there may not have reached the service yet): it is undone, the claim recalled, and it runs
    again (``MetadataService._call``). Never leaves the service."""

    code = "busy"

    def __init__(self, directory: int) -> None:
        super().__init__(f"directory {directory} is claimed by another client")
        self.directory = directory


def _done(future: "asyncio.Future[None]") -> None:
    if not future.done():
        future.set_result(None)


@dataclass
class _Claim:
    """A session's exclusive claim on a directory: the inode numbers it was handed there, and
    the recall under way (done when the holder sent its creates and acknowledged)."""

    session: bytes
    ranges: list[tuple[int, int]]  # (first, count)
    recalled: "asyncio.Future[None] | None" = None
    # Kept by a predecessor (the store's claims table): its holder may send the creates it made
    # until its session's second keepalive here (its client sends them all in between, however
    # long that takes) or, if it did not come back, the grace period ends; whoever needs the
    # directory meanwhile waits.
    restored: bool = False


@dataclass
class _Session:
    expires: float
    uid: int
    holding: "OrderedDict[LeaseKey, None]" = field(default_factory=OrderedDict)  # oldest grant first
    recalls: dict[int, Recall] = field(default_factory=dict)  # sent or due, not acknowledged, by id
    due: asyncio.Event | None = None  # set when a recall is queued (wakes the held keepalive)
    acked: dict[int, asyncio.Future[None]] = field(default_factory=dict)  # recall id -> done
    fresh: bool = True  # no keepalive yet since the one that started it


class LeaseTable:
    """Who holds what, and the recalls on their way. Bounded: a session holds at most
    ``holding_max`` keys (granting more recalls its oldest at once, without waiting), and
    ``sessions_max`` sessions live at a time (a new one past that is not granted anything)."""

    def __init__(self, lease_s: float = limits.lease_s, *, holding_max: int = limits.lease_inodes_per_session_max,
                 sessions_max: int = limits.lease_sessions_max, clock: Callable[[], float] = time.monotonic) -> None:
        self.lease_s = lease_s
        self.holding_max = holding_max
        self.sessions_max = sessions_max
        self.clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[bytes, _Session] = {}
        self._holders: dict[LeaseKey, set[bytes]] = {}
        self._ids = itertools.count(1)
        self.loop: asyncio.AbstractEventLoop | None = None  # the service's, known from the first keepalive
        self.grace_until = 0.0  # before this, every change waits (leases of a predecessor may live)
        self.renewing = True  # False: sessions are not renewed (a service cut off from its peers)
        self._refused_at = -1e18  # when a new session was last refused for want of renewing
        # Recalls that peers sent (lease_peers.py), for reads that may have raced them:
        self.change_seq = 0
        self._changed_at: dict[LeaseKey, int] = {}
        self._horizon = 0  # what changed before this was forgotten
        self.recalls_sent = 0
        self.recalls_expired = 0  # completed because the holder's session ran out, not by its ack
        # Claims (asynchronous creates): directory -> claim; held names and listings by directory
        # (what a claim recalls from the others); when each directory's claim was last recalled.
        self._claims: dict[int, _Claim] = {}
        self._by_directory: dict[int, set[LeaseKey]] = {}
        self._claim_recalled_at: dict[int, float] = {}
        self.claims_granted = 0
        self.claims_recalled = 0
        # Told (with the lock held: it must only schedule) the first numbers of the ranges of
        # claims that ended, which the store then forgets (``SqlStore.forget_claims``).
        self.on_claims_ended: Callable[[list[int]], None] | None = None

    @property
    def active(self) -> bool:
        """Whether any session lives (no session: no grant to record, no recall to send)."""
        return bool(self._sessions)

    def sessions_wanted(self) -> int:
        """Sessions this service holds or was asked for in the last lease (lease_peers.py publishes it)."""
        with self._lock:
            return len(self._sessions) + (1 if self.clock() - self._refused_at < self.lease_s else 0)

    def in_grace(self) -> bool:
        return self.grace_until > self.clock()

    def holders(self, key: LeaseKey) -> set[bytes]:
        with self._lock:
            return set(self._holders.get(key, ()))

    # ------------------------------------------------------------------ grants (store thread)

    def grant(self, session: bytes, keys: Iterable[LeaseKey], since: int | None = None) -> list[LeaseKey]:
        """Record that ``session`` holds ``keys`` (an unknown or expired session: nothing).
        ``since``: the ``change_seq`` when the read began; returns the keys a peer's recall
        named since then (the read may have seen them before the change: ``raced``)."""
        with self._lock:
            held = self._sessions.get(session)
            if held is None or held.expires <= self.clock():
                return []
            keys = list(keys)
            raced = [] if since is None else (
                keys if since < self._horizon else [k for k in keys if self._changed_at.get(k, 0) > since])
            for key in keys:
                if key in held.holding:
                    held.holding.move_to_end(key)
                    continue
                held.holding[key] = None
                self._holders.setdefault(key, set()).add(session)
                if key[0] == ENTRY or key[0] == LISTING:
                    self._by_directory.setdefault(key[1], set()).add(key)
            evicted = []
            while len(held.holding) > self.holding_max:
                key, _ = held.holding.popitem(last=False)
                self._drop_holder(key, session)
                evicted.append(key)
            if evicted:
                self._queue(held, evicted)  # not waited for: the holder just drops the oldest
            return raced

    async def settled(self) -> None:
        """Wait until no lease granted before now can still be held against a change already
        made: the grace period is over and every recall now outstanding was acknowledged or
        ran out. For a change answered from the store's record of an earlier attempt (whose
        recalls that attempt, or a predecessor that crashed, may not have finished)."""
        grace_s = self.grace_until - self.clock()
        if grace_s > 0:
            await asyncio.sleep(grace_s)
        with self._lock:
            pending = [(done, held.expires) for held in self._sessions.values()
                       for done in held.acked.values() if not done.done()]
        for done, expires in pending:
            await self._wait(done, expires)

    async def recall_raced(self, session: bytes, keys: list[LeaseKey]) -> None:
        """Recall ``keys`` from ``session`` alone (a read that raced a peer's recall of them) and
        wait until it acknowledged or ran out."""
        with self._lock:
            held = self._sessions.get(session)
            if held is None:
                return
            for key in keys:
                if key in held.holding:
                    del held.holding[key]
                    self._drop_holder(key, session)
            dones = self._awaited(held, self._queue(held, keys))
            expires = held.expires
        for done in dones:
            await self._wait(done, expires)

    # ------------------------------------------------------------------ recalls (event loop)

    async def recall(self, keys: Iterable[LeaseKey], *, changed_by: bytes = b"", remote: bool = False) -> None:
        """Recall ``keys`` from every session holding any of them but ``changed_by`` (the
        session whose call changed them: its client keeps its own cache right), and wait until
        each acknowledged or ran out; in the grace period after a restart, wait until it ends.
        ``remote``: the change was made through a peer service (its reads in flight may have raced it)."""
        waits: list[tuple[asyncio.Future[None], float]] = []
        grace_s = self.grace_until - self.clock()
        if grace_s > 0:  # a holder of the predecessor's may not know yet: wait until its lease ran out
            await asyncio.sleep(grace_s)
        with self._lock:
            keys = set(keys)
            if remote:
                self._note_remote(keys)
            targets: dict[bytes, list[LeaseKey]] = {}
            for key in keys:
                for session in self._holders.get(key, ()):
                    if session != changed_by:
                        targets.setdefault(session, []).append(key)
            for session, held_keys in targets.items():
                held = self._sessions[session]
                for key in held_keys:
                    del held.holding[key]
                    self._drop_holder(key, session)
                waits.extend((done, held.expires) for done in self._awaited(held, self._queue(held, held_keys)))
        for done, expires in waits:
            await self._wait(done, expires)

    async def _wait(self, done: "asyncio.Future[None]", expires: float) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(done), timeout=max(0.0, expires - self.clock()))
        except asyncio.TimeoutError:
            self.recalls_expired += 1
            self._expire_overdue()

    def _note_remote(self, keys: set[LeaseKey]) -> None:
        self.change_seq += 1
        if len(self._changed_at) > limits.lease_remote_changes_kept:
            self._changed_at.clear()
            self._horizon = self.change_seq
        for key in keys:
            self._changed_at[key] = self.change_seq

    def _queue(self, held: _Session, keys: list[LeaseKey]) -> list[int]:
        """Queue the recalls of ``keys`` to ``held`` (``limits.lease_recall_keys_max`` keys each)
        and wake its keepalive (from any thread); returns their ids. Called with the lock held."""
        ids = []
        for start in range(0, len(keys), limits.lease_recall_keys_max):
            recall = recall_of(next(self._ids), keys[start:start + limits.lease_recall_keys_max])
            held.recalls[recall.id] = recall
            ids.append(recall.id)
            self.recalls_sent += 1
        self._wake(held)
        return ids

    @staticmethod
    def _awaited(held: _Session, recall_ids: list[int]) -> "list[asyncio.Future[None]]":
        """Futures done when each of ``recall_ids`` is acknowledged (on the event loop)."""
        loop = asyncio.get_running_loop()
        return [held.acked.setdefault(recall_id, loop.create_future()) for recall_id in recall_ids]

    def _wake(self, held: _Session) -> None:
        if held.due is None or self.loop is None:
            return
        try:
            on_loop = asyncio.get_running_loop() is self.loop
        except RuntimeError:  # the store's thread
            on_loop = False
        if on_loop:
            held.due.set()
        else:
            self.loop.call_soon_threadsafe(held.due.set)

    def _drop_holder(self, key: LeaseKey, session: bytes) -> None:
        holders = self._holders.get(key)
        if holders is not None:
            holders.discard(session)
            if not holders:
                del self._holders[key]
                if key[0] == ENTRY or key[0] == LISTING:
                    under = self._by_directory.get(key[1])
                    if under is not None:
                        under.discard(key)
                        if not under:
                            del self._by_directory[key[1]]

    def _expire_overdue(self) -> None:
        with self._lock:
            self._expire_unlocked(self.clock())

    def _forget(self, session: bytes) -> None:
        held = self._sessions.pop(session)
        for directory in [d for d, claim in self._claims.items() if claim.session == session]:
            self._end_claim(directory)
        for key in held.holding:
            self._drop_holder(key, session)
        for done in held.acked.values():
            if not done.done():
                done.set_result(None)
        self._wake(held)


    # ------------------------------------------------------------------ claims (asynchronous creates)

    def claim(self, session: bytes, directory: int, first: int, count: int,
              children: Iterable[int] = ()) -> "list[LeaseKey] | None":
        """Record (on the store's thread, inside the claiming operation) that ``session`` holds
        ``directory`` claimed, with inode numbers ``first .. first + count - 1`` to create files
        there. None: not granted (an unknown session, a claim of another session's or one being
        recalled, a claim recalled less than ``limits.claim_backoff_s`` ago). Else the keys other
        sessions hold that the claimant's creates and unlinks will make stale (the directory's
        names, listing and attributes, the attributes of its ``children``): the claiming call
        recalls them before it answers."""
        with self._lock:
            held = self._sessions.get(session)
            now = self.clock()
            if held is None or held.expires <= now:
                return None
            if now - self._claim_recalled_at.get(directory, -1e18) < limits.claim_backoff_s:
                return None
            claim = self._claims.get(directory)
            if claim is not None and (claim.session != session or claim.recalled is not None or claim.restored):
                return None
            if claim is None:
                claim = self._claims[directory] = _Claim(session=session, ranges=[])
                self.claims_granted += 1
            claim.ranges.append((first, count))
            stale: list[LeaseKey] = [*self._by_directory.get(directory, ()), (ATTRS, directory)]
            stale.extend((ATTRS, child) for child in children if (ATTRS, child) in self._holders)
            return stale

    def holds_claim(self, session: bytes, directory: int) -> bool:
        """Whether ``session`` holds ``directory`` claimed (a claim of more numbers)."""
        with self._lock:
            claim = self._claims.get(directory)
            return claim is not None and claim.session == session

    def claimed_by_other(self, keys: Iterable[LeaseKey], session: bytes, parents: "dict[int, int] | None" = None,
                         parent_of: "Callable[[int], int | None] | None" = None) -> int | None:
        """The first directory that a session other than ``session`` holds claimed among what
        ``keys`` name: a directory's names, listing or attributes, or the attributes of a file
        in it (its parent from ``parents``, 0 there: not a regular file; else ``parent_of``:
        the claim's holder may have unlinked it); None if none (on the store's thread)."""
        if not self._claims:
            return None
        with self._lock:
            for key in keys:
                if key[0] == ENTRY or key[0] == LISTING or key[0] == ATTRS:
                    claim = self._claims.get(key[1])
                    if claim is not None and claim.session != session:
                        return key[1]
                    if key[0] == ATTRS and claim is None:
                        parent = parents.get(key[1]) if parents else None
                        if parent is None and parent_of is not None:
                            parent = parent_of(key[1])
                        claim = self._claims.get(parent) if parent is not None else None
                        if claim is not None and claim.session != session:
                            return parent
        return None

    def restore_claims(self, ranges: Iterable[tuple[int, int, int, bytes]]) -> None:
        """The claims a predecessor over this store granted (``(first, count, directory,
        session)`` rows): held until each holder's second keepalive here or the grace period's
        end (``end_restored``), so its unsent creates are taken back before anyone reads there."""
        with self._lock:
            for first, count, directory, session in ranges:
                claim = self._claims.setdefault(directory, _Claim(session=session, ranges=[], restored=True))
                if claim.session == session:
                    claim.ranges.append((first, count))

    def end_restored(self, session: bytes | None = None) -> None:
        """End the restored claims of ``session`` (None: the grace period is over: those of
        every holder that did not come back; one that did is still sending, each batch after
        the last: its second keepalive, or its session running out, ends them)."""
        with self._lock:
            for directory in [d for d, claim in self._claims.items() if claim.restored and (
                    claim.session == session if session is not None else claim.session not in self._sessions)]:
                self._end_claim(directory)

    def claim_covers(self, session: bytes, directory: int, inos: Iterable[int]) -> bool:
        """Whether ``session`` holds ``directory`` claimed (being recalled counts: its holder is
        sending what it created) and was handed every one of ``inos`` with that claim."""
        with self._lock:
            claim = self._claims.get(directory)
            if claim is None or claim.session != session:
                return False
            if claim.restored and not self.in_grace():  # only a holder that came back is still sending
                held = self._sessions.get(session)
                if held is None or held.expires <= self.clock():
                    return False
            return all(any(first <= ino < first + count for first, count in claim.ranges) for ino in inos)

    async def recall_claim(self, directory: int) -> None:
        """End the claim on ``directory``: its holder sends the creates it made there and
        acknowledges (or its session runs out), then nobody holds it. Every caller waiting for
        the same claim waits for the one recall."""
        with self._lock:
            claim = self._claims.get(directory)
            if claim is None:
                return
            held = self._sessions.get(claim.session)
            if claim.restored:  # its holder sends what it created once it hears of the restart
                if claim.recalled is None:
                    claim.recalled = asyncio.get_running_loop().create_future()
                recalled, expires = claim.recalled, max(self.grace_until, held.expires if held else 0.0)
            elif held is None:
                self._end_claim(directory)
                return
            else:
                if claim.recalled is None:
                    (claim.recalled,) = self._awaited(held, self._queue(held, [(CLAIM, directory)]))
                    self.claims_recalled += 1
                recalled, expires = claim.recalled, held.expires
        await self._wait(recalled, expires)
        with self._lock:
            if self._claims.get(directory) is claim:
                self._end_claim(directory)

    def _end_claim(self, directory: int) -> None:
        """Forget the claim on ``directory`` (called with the lock held)."""
        claim = self._claims.pop(directory)
        if claim.restored and claim.recalled is not None and not claim.recalled.done():
            claim.recalled.get_loop().call_soon_threadsafe(_done, claim.recalled)
        if self.on_claims_ended is not None:
            self.on_claims_ended([first for first, _ in claim.ranges])
        self._claim_recalled_at[directory] = self.clock()
        if len(self._claim_recalled_at) > limits.lease_remote_changes_kept:
            self._claim_recalled_at.clear()

    # ------------------------------------------------------------------ keepalives (event loop)

    async def keepalive(self, session: bytes, uid: int, acked: Iterable[int], wait_s: float,
                        unsent: bool = False) -> KeepaliveReply:
        """One keepalive of ``session`` (for caller ``uid``): acknowledge ``acked``, renew the
        session unless a recall to it is outstanding, then answer the due recalls, waiting up to
        ``wait_s`` for one. A session id in use by another uid is refused (PermissionError).
        The session's second keepalive here ends the claims restored for it, unless its client
        says it still holds ``unsent`` creates (then a later one without does)."""
        self.loop = asyncio.get_running_loop()
        now = self.clock()
        with self._lock:
            self._expire_unlocked(now)
            held = self._sessions.get(session)
            restarted = held is None
            if held is None:
                if len(self._sessions) >= self.sessions_max or not self.renewing:
                    self._refused_at = now
                    return KeepaliveReply(lease_s=self.lease_s, renewed=False, restarted=True, recalls=[])
                held = self._sessions[session] = _Session(expires=now + self.lease_s, uid=uid)
            elif held.uid != uid:
                raise PermissionError("that lease session belongs to another user")
            elif held.fresh and not unsent:  # its client heard it was new, and sent what it created before
                held.fresh = False
                for directory in [d for d, c in self._claims.items() if c.restored and c.session == session]:
                    self._end_claim(directory)
            for recall_id in acked:
                held.recalls.pop(recall_id, None)
                done = held.acked.pop(recall_id, None)
                if done is not None and not done.done():
                    done.set_result(None)
            renewed = not held.recalls and self.renewing
            if renewed:
                held.expires = now + self.lease_s
            if not held.recalls and wait_s > 0:
                held.due = asyncio.Event()
                due = held.due
            else:
                due = None
        if due is not None:
            try:
                await asyncio.wait_for(due.wait(), timeout=wait_s)
            except asyncio.TimeoutError:
                pass
        with self._lock:
            alive = self._sessions.get(session) is held
            if alive:
                held.due = None
            recalls = list(held.recalls.values()) if alive else []
        return KeepaliveReply(lease_s=self.lease_s, renewed=renewed and alive, restarted=restarted or not alive,
                              recalls=recalls[:limits.lease_recalls_per_reply_max])

    def _expire_unlocked(self, now: float) -> None:
        for session in [s for s, held in self._sessions.items() if held.expires <= now]:
            self._forget(session)

    def end(self, session: bytes, uid: int) -> None:
        """The client (as ``uid``) ended its session: forget it and everything it held."""
        with self._lock:
            held = self._sessions.get(session)
            if held is not None and held.uid == uid:
                self._forget(session)

