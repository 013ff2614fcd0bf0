"""Chunk servers clients set aside (issue 53): what one client learned of a vanished server,
told to every new client.

A client that gives up on a chunk server (its get went unanswered past the server's deadline, or
the connection failed: ``client/server_health.py``) reports it as an "unreachable" bad chunk.
From then until the metadata service hears from the server again (a heartbeat or, restarted, its
registration: it answers again), and
at most ``HOLD_S`` after the last such report:

- layouts flag the server's chunks (``ChunkRef.set_aside``): a new client reads parity instead
  of asking that server first, and pays no deadline to learn what another client already did;
- allocations leave the server out (a write then needs no hedge or spare to get around it),
  unless too few servers are left without it, when they are made as before.

Advice only, as on a client: a flagged chunk is still read when nothing else is left.
"""

from __future__ import annotations

import time
from typing import Awaitable, Callable, TypeVar

import msgspec

from tectofs import limits
from tectofs.errors import NoSpace
from tectofs.wire import messages

HOLD_S = 2 * limits.server_down_memo_s  # a report holds this long at most (renewed by the next)

T = TypeVar("T")


class SetAside:
    """``heard``: server id -> when its last heartbeat arrived (the service's
    ``heartbeats_seen``), on ``clock``."""

    def __init__(self, heard: dict[int, float], clock: Callable[[], float] = time.time, hold_s: float = HOLD_S) -> None:
        self.heard = heard
        self.clock = clock
        self.hold_s = hold_s
        self._reported: dict[int, float] = {}  # server id -> when a client last reported it

    def report(self, server_id: int) -> None:
        if server_id in self.heard:  # (a server this service knows: reports cannot grow this without bound)
            self._reported[server_id] = self.clock()

    def heard_from(self, server_id: int) -> None:
        """The server registered (a restart): it answers again, before its next heartbeat."""
        self._reported.pop(server_id, None)

    def current(self) -> set[int]:
        """The servers set aside now."""
        now = self.clock()
        for server_id, at in list(self._reported.items()):
            if now - at >= self.hold_s or self.heard.get(server_id, 0.0) > at:
                del self._reported[server_id]
        return set(self._reported)

    def flag(self, layout: messages.LayoutSegment) -> messages.LayoutSegment:
        """``layout`` with the chunks on servers set aside flagged."""
        servers = self.current() if self._reported else set()
        if not servers or not any(c.server_id in servers for b in layout.blocks for c in b.chunks):
            return layout
        return msgspec.structs.replace(layout, blocks=[
            msgspec.structs.replace(b, chunks=[msgspec.structs.replace(c, set_aside=True) if c.server_id in servers
                                               else c for c in b.chunks])
            if any(c.server_id in servers for c in b.chunks) else b for b in layout.blocks])

    async def allocate(self, allocate: Callable[[list[int]], Awaitable[T]], exclude: list[int]) -> T:
        """``allocate(exclude)``, leaving out the servers set aside too while enough are left."""
        servers = self.current() if self._reported else set()
        if servers - set(exclude):
            try:
                return await allocate(sorted(servers | set(exclude)))
            except NoSpace:
                pass  # too few without them: as before
        return await allocate(exclude)
