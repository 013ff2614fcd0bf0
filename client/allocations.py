"""The placements one open handle (``AsyncFile``, ``client/files.py``) writes its next blocks
to: asked of the metadata service in batches that double (1, 2, 4, 8) while the handle keeps
writing, and asked *ahead*, in the background, as soon as the handle is sure to need one.

Asking ahead matters for the files an untar or a copy writes: each is written in small
records and sent at close. Asked at close, the allocation's round trip (and, in a claimed
directory, the sending of the queued create before it) is two of the close's four waits;
asked once the file outgrew what is stored inline, it overlaps the records that follow.

An allocation asked ahead and never used costs nothing lasting: it names no data, and the
metadata service lets it lapse with the writer's lease (as a crashed writer's).
"""

from __future__ import annotations

import asyncio
from typing import Callable

from tectofs import limits
from tectofs.errors import NoSpace
from tectofs.wire import messages

from .block_reads import consume_outcome
from .metadata import MetadataClient


class Allocations:
    def __init__(self, metadata: MetadataClient, request: Callable[[int], messages.AllocateRequest],
                 on_lease: Callable[[float], None]) -> None:
        """``request(count)``: the allocate request for ``count`` placements (the handle's
        file and writer); ``on_lease(lease_s)``: told of every grant (the writer's lease to
        renew)."""
        self.metadata, self.request, self.on_lease = metadata, request, on_lease
        self._ready: list[messages.Allocation] = []
        self._batch = 1
        self._ahead: asyncio.Task[None] | None = None

    async def take(self) -> messages.Allocation:
        """The next placement: one asked ahead if there is one (waiting for it if it is on its
        way), else a batch asked now. ``NoSpace`` is retried a few times with waits (servers
        may look dead for a moment: a slow metadata service, a restart) before it is raised."""
        if not self._ready and self._ahead is not None:
            ahead, self._ahead = self._ahead, None
            await asyncio.wait([ahead])  # its outcome is what it put in _ready: if it failed, asked again below
        if not self._ready:
            for attempt in range(limits.placement_attempts_max):
                try:
                    await self._ask()
                    break
                except NoSpace:
                    if attempt + 1 == limits.placement_attempts_max:
                        raise
                    await asyncio.sleep(limits.heartbeat_interval_s * (attempt + 1))
        return self._ready.pop(0)

    def put_back(self, allocation: messages.Allocation) -> None:
        """A placement taken and not used: the next ``take`` gives it again."""
        self._ready.insert(0, allocation)

    def ask_ahead(self) -> None:
        """The handle will need a placement: ask for the next batch in the background, unless
        one is held or already on its way."""
        if self._ready or self._ahead is not None:
            return
        self._ahead = asyncio.get_running_loop().create_task(self._ask())
        self._ahead.add_done_callback(consume_outcome)

    def forget(self) -> None:
        """The handle closed: what was asked ahead lapses. An ask on its way is left to end
        (not cancelled: before its call, it may be sending this client's queued creates,
        which must not be cut off halfway)."""
        self._ahead = None
        self._ready.clear()

    async def _ask(self) -> None:
        reply = await self.metadata.allocate(self.request(self._batch))
        self._ready.extend(reply.blocks)
        self.on_lease(reply.lease_s)
        self._batch = min(self._batch * 2, 8)
