"""Replication beside the upload: a primary agent forwards each piece of a save to its peers
as it arrives (Gemini's pipelined replication), so that at the seal the peers already hold
the files and only check and seal them. A peer that fails a piece is left out of the rest of
the save; the seal then copies the whole step to another peer instead (``service._replicate``).
At most ``pieces_max`` pieces are in flight per save: a put waits for a slot, so a slow peer
slows the upload down rather than letting pieces pile up in memory."""

from __future__ import annotations

import asyncio
from typing import Callable

from tectofs import errors
from tectofs.wire.client import RpcClient

from . import messages


class Forwarding:
    """The forwarding of one save (``save``) to ``peers``. ``release(payload)`` gives each
    piece's buffer back once it is sent to every peer."""

    def __init__(self, client: RpcClient, save: str, peers: list[str], pieces_max: int,
                 release: Callable[[memoryview], None]) -> None:
        assert pieces_max >= 1
        self.client, self.save, self.peers, self.release = client, save, list(peers), release
        self.failed: dict[str, str] = {}  # peer -> why it was left out
        self._slots = asyncio.Semaphore(pieces_max)
        self._tasks: set[asyncio.Task[None]] = set()

    async def forward(self, request: messages.PutRequest, payload: memoryview) -> None:
        """Send ``payload`` (the piece ``request`` names, marked ``replica``) to every peer, in
        the background; waits only for a free slot. The payload is released once sent."""
        assert request.replica
        await self._slots.acquire()
        task = asyncio.get_running_loop().create_task(self._send(request, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, request: messages.PutRequest, payload: memoryview) -> None:
        try:
            for peer in self.peers:
                if peer not in self.failed:
                    try:
                        await self.client.call(peer, messages.PUT, request, payload)
                    except (errors.TectofsError, OSError) as exc:
                        self.failed[peer] = f"{type(exc).__name__}: {exc}"
        finally:
            self.release(payload)
            self._slots.release()

    async def finished(self) -> list[str]:
        """Wait for every piece sent so far; the peers that took all of them."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        return [peer for peer in self.peers if peer not in self.failed]

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()
