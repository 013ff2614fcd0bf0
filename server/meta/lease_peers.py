"""Leases across several metadata services over one PostgreSQL store.

Each service holds the leases of the clients connected to it (``LeaseTable``). A change made
through one service must also recall what clients of the others hold: after its store
operation committed, the service publishes the keys it invalidated on PostgreSQL's
``LISTEN``/``NOTIFY`` channel ``tectofs_leases``; every other service recalls them from its own
sessions and answers with an acknowledgement on the same channel; the change's call returns
once every live peer acknowledged, or ``2 * lease_s`` passed.

Why that bound holds: a service renews its clients' leases only while its channel is sound
(it checks it every ``lease_s / 4``, and a notification it cannot receive ends that); a
service cut off from PostgreSQL stops renewing within ``lease_s / 4`` plus a check's timeout,
and its clients stop trusting their caches within ``lease_s`` of the last renewal, so before
``2 * lease_s`` has passed since a change it did not acknowledge. Services find each other in
the table ``lease_services`` (each writes its row every ``lease_s / 4``; a row older than
``lease_s`` is a peer that is gone).

Reads racing a remote change: a read that began before a recall arrived from a peer may have
seen the store before that change; what it is granted of what the recall named is recalled from
its session at once, and its answer waits for that (``LeaseTable.grant(..., since=)``), so the
client, whose lease epoch moved meanwhile, does not cache the answer.

The channel is checked end to end: each heartbeat is also a notification to itself, and a
service that did not receive its previous one stops renewing.

A change is told only to the peers that hold sessions (their rows say how many), so services
whose clients hold no leases (the plugin's, the S3 gateway's) cost nothing. The price: a service
whose row said it had no sessions renews none until its peers have read a row that says it has
(two heartbeats, ``lease_s / 2``); a client's first lease takes that long.

Recalls and heartbeats go on the shared channel; an acknowledgement goes on the channel of the
service it answers alone (``tectofs_leases_<id>``), so a change costs each peer one message
received and one sent, whatever the number of services (not one per peer's acknowledgement).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import Any

from tectofs.wire.leases import LeaseKey

from .leases import LeaseTable

log = logging.getLogger("tectofs.meta")

CHANNEL = "tectofs_leases"
PAYLOAD_BYTES_MAX = 7000  # of the changes in one notification (PostgreSQL's payload is under 8000 bytes)
PART_BYTES_MAX = 3000  # of one change's keys: a change with more is told in several parts
SCHEMA = ("CREATE TABLE IF NOT EXISTS lease_services"
          " (id TEXT PRIMARY KEY, seen TIMESTAMPTZ NOT NULL, sessions INT NOT NULL DEFAULT 0)")


def _size(part: dict[str, Any]) -> int:
    return len(json.dumps(part)) + 2


def _parts(keys: list[LeaseKey], by: str) -> list[dict[str, Any]]:
    """``keys`` changed by session ``by`` (hex), cut into parts of at most ``PART_BYTES_MAX``
    bytes of JSON each (a name is at most 255 bytes: every key fits)."""
    parts: list[dict[str, Any]] = []
    current: list[list[Any]] = []
    size = 0
    for key in keys:
        item = list(key)
        length = len(json.dumps(item)) + 2
        if current and size + length > PART_BYTES_MAX:
            parts.append({"by": by, "keys": current})
            current, size = [], 0
        current.append(item)
        size += length
    if current or not parts:
        parts.append({"by": by, "keys": current})
    return parts


def _ack_channel(service_id: str) -> str:
    """The channel the acknowledgements to ``service_id`` (16 hex digits) go on."""
    if len(service_id) != 16 or any(c not in "0123456789abcdef" for c in service_id):
        raise ValueError(f"not a service id: {service_id[:40]!r}")
    return f"{CHANNEL}_{service_id}"


class LeasePeers:
    """This service's link to the other services over ``url`` (a PostgreSQL store)."""

    def __init__(self, url: str, table: LeaseTable) -> None:
        self.url = url
        self.table = table
        self.id = secrets.token_hex(8)
        self.acks_expired = 0
        self._listen: Any = None
        self._send: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._waiting: dict[str, tuple[set[str], asyncio.Event]] = {}  # change id -> peers yet to answer
        self._send_lock = asyncio.Lock()
        self.live: set[str] = set()  # the peers whose rows were fresh at the last heartbeat
        self._beats_sent = 0
        self._beats_heard = 0
        self._published: list[int] = []
        self._outbox: list[dict[str, Any]] = []  # changes to tell the peers of, waiting for the sender
        self._sender: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import psycopg  # type: ignore[import-not-found]

        self._listen = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self._send = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        await self._send.execute(SCHEMA)
        await self._listen.execute(f"LISTEN {CHANNEL}")
        await self._listen.execute(f"LISTEN {_ack_channel(self.id)}")
        self.table.renewing = False
        await self._beat()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._receive()), loop.create_task(self._heartbeat())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for conn in (self._listen, self._send):
            if conn is not None:
                try:
                    await conn.close()
                except Exception:
                    pass

    # ------------------------------------------------------------------ sending

    async def recall(self, keys: set[LeaseKey], changed_by: bytes) -> None:
        """Have every live peer recall ``keys`` from its sessions; wait until each acknowledged,
        or ``2 * lease_s``. Changes made while a notification is being sent go out together in
        the next one (``_send_recalls``), so under load a notification carries many."""
        peers = set(self.live)
        if not peers or not keys:
            return
        waits = []
        for part in _parts(sorted(keys, key=repr), changed_by.hex()):
            change = secrets.token_hex(8)
            done = asyncio.Event()
            self._waiting[change] = (set(peers), done)
            waits.append((change, done))
            self._outbox.append({"change": change, **part})
        if self._sender is None or self._sender.done():
            self._sender = asyncio.get_running_loop().create_task(self._send_recalls())
        try:
            await asyncio.wait_for(asyncio.gather(*(done.wait() for _, done in waits)), 2 * self.table.lease_s)
        except asyncio.TimeoutError:
            self.acks_expired += 1
            log.warning("a peer metadata service did not acknowledge a recall within %g s", 2 * self.table.lease_s)
        finally:
            for change, _ in waits:
                self._waiting.pop(change, None)

    async def _send_recalls(self) -> None:
        """Send what ``recall`` queued, as few notifications as their size allows."""
        while self._outbox:
            batch: list[dict[str, Any]] = []
            size = 0
            while self._outbox and (not batch or size + _size(self._outbox[0]) <= PAYLOAD_BYTES_MAX):
                size += _size(self._outbox[0])
                batch.append(self._outbox.pop(0))
            try:
                await self._notify({"kind": "recall", "from": self.id, "changes": batch})
            except Exception as exc:  # their callers wait out 2 * lease_s, as for a peer that did not answer
                self._unsound(f"cannot send a recall: {exc}")

    async def _notify(self, message: dict[str, Any], channel: str = CHANNEL) -> None:
        async with self._send_lock:
            await self._send.execute("SELECT pg_notify(%s, %s)", (channel, json.dumps(message)))

    # ------------------------------------------------------------------ receiving

    async def _receive(self) -> None:
        try:
            async for notice in self._listen.notifies():
                try:
                    message = json.loads(notice.payload)
                except ValueError:
                    continue
                if message.get("kind") == "beat" and message.get("from") == self.id:
                    self._beats_heard = max(self._beats_heard, int(message.get("n", 0)))
                elif message.get("kind") == "recall" and message.get("from") != self.id:
                    asyncio.get_running_loop().create_task(self._recall_for_peer(message))
                elif message.get("kind") == "ack" and message.get("to") == self.id:
                    for change in message.get("changes", []):
                        waiting = self._waiting.get(change)
                        if waiting is not None:
                            waiting[0].discard(message.get("from", ""))
                            if not waiting[0]:
                                waiting[1].set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._unsound(f"the lease channel failed: {exc}")

    async def _recall_for_peer(self, message: dict[str, Any]) -> None:
        """Recall every change of a peer's notification from this service's sessions, then
        acknowledge them all in one notification to that peer."""
        try:
            channel = _ack_channel(str(message.get("from", "")))
            changes = [(str(c["change"]), [tuple(k) for k in c["keys"]], bytes.fromhex(c["by"]))
                       for c in message.get("changes", [])]
        except (KeyError, TypeError, ValueError) as exc:  # not a service's: nobody waits for its answer
            log.warning("ignored a malformed recall on %s: %s", CHANNEL, exc)
            return
        await asyncio.gather(*(self.table.recall(keys, changed_by=by, remote=True) for _, keys, by in changes))
        try:
            await self._notify({"kind": "ack", "to": message["from"], "from": self.id,
                                "changes": [change for change, _, _ in changes]}, channel)
        except Exception as exc:
            self._unsound(f"cannot acknowledge a recall: {exc}")

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.table.lease_s / 4)
            if self._beats_heard < self._beats_sent:
                self._unsound("the lease channel lost this service's own heartbeat")
                continue
            try:
                await asyncio.wait_for(self._beat(), self.table.lease_s / 4)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._unsound(f"cannot reach the store: {exc}")
                continue
            # Renew only once two rows in a row told the peers we have sessions: every peer has
            # refreshed its list of whom to tell since, so its changes reach our sessions.
            self.table.renewing = len(self._published) == 2 and all(self._published)

    async def _beat(self) -> None:
        """Say we live, learn who else does, and send ourselves the notification that proves
        the channel at the next heartbeat."""
        count = self.table.sessions_wanted()
        if not count:  # the row about to say "none": no session may be started meanwhile
            self.table.renewing = False
        async with self._send_lock:
            await self._send.execute(
                "INSERT INTO lease_services (id, seen, sessions) VALUES (%s, now(), %s)"
                " ON CONFLICT (id) DO UPDATE SET seen = now(), sessions = EXCLUDED.sessions", (self.id, count))
            await self._send.execute("DELETE FROM lease_services WHERE seen < now() - interval '1 hour'")
            cursor = await self._send.execute(
                "SELECT id FROM lease_services WHERE id <> %s AND sessions > 0"
                " AND seen > now() - make_interval(secs => %s)", (self.id, self.table.lease_s))
            self.live = {row[0] for row in await cursor.fetchall()}
        self._published = (self._published + [count])[-2:]
        self._beats_sent += 1
        await self._notify({"kind": "beat", "from": self.id, "n": self._beats_sent})

    def _unsound(self, why: str) -> None:
        if self.table.renewing:
            log.warning("%s: no lease is renewed until it is back", why)
        self.table.renewing = False
