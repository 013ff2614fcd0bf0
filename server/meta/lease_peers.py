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
PAYLOAD_KEYS_MAX = 60  # keys per notification (PostgreSQL's payload is at most 8000 bytes)
SCHEMA = ("CREATE TABLE IF NOT EXISTS lease_services"
          " (id TEXT PRIMARY KEY, seen TIMESTAMPTZ NOT NULL, sessions INT NOT NULL DEFAULT 0)")


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

    async def start(self) -> None:
        import psycopg  # type: ignore[import-not-found]

        self._listen = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self._send = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        await self._send.execute(SCHEMA)
        await self._listen.execute(f"LISTEN {CHANNEL}")
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
        or ``2 * lease_s``."""
        peers = set(self.live)
        if not peers:
            return
        ordered = sorted(keys, key=repr)
        waits = []
        for start in range(0, len(ordered), PAYLOAD_KEYS_MAX):
            change = secrets.token_hex(8)
            done = asyncio.Event()
            self._waiting[change] = (set(peers), done)
            waits.append((change, done))
            await self._notify({"kind": "recall", "from": self.id, "change": change, "by": changed_by.hex(),
                                "keys": [list(k) for k in ordered[start:start + PAYLOAD_KEYS_MAX]]})
        try:
            await asyncio.wait_for(asyncio.gather(*(done.wait() for _, done in waits)), 2 * self.table.lease_s)
        except asyncio.TimeoutError:
            self.acks_expired += 1
            log.warning("a peer metadata service did not acknowledge a recall within %g s", 2 * self.table.lease_s)
        finally:
            for change, _ in waits:
                self._waiting.pop(change, None)

    async def _notify(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            await self._send.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(message)))


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
                    waiting = self._waiting.get(message.get("change", ""))
                    if waiting is not None:
                        waiting[0].discard(message.get("from", ""))
                        if not waiting[0]:
                            waiting[1].set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._unsound(f"the lease channel failed: {exc}")

    async def _recall_for_peer(self, message: dict[str, Any]) -> None:
        keys = [tuple(k) for k in message.get("keys", [])]
        await self.table.recall(keys, changed_by=bytes.fromhex(message.get("by", "")), remote=True)
        try:
            await self._notify({"kind": "ack", "to": message["from"], "change": message["change"], "from": self.id})
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
