"""The end of closed handles' leases, told to the metadata service in batches.

Every open handle holds a lease (``AsyncFileSystem.open``); its close ends it, so that a file
unlinked while open goes at once rather than when the lease lapses (``limits.reader_lease_s``).
Ending one lease per close would cost a metadata call per file, as much as the create
itself when many small files are written; instead closes queue their lease here and one
``release_leases`` call ends all those of the last ``limits.lease_release_delay_s`` (or
``limits.leases_per_release_max`` at once). A batch that fails is not retried: its leases
lapse as a crashed client's would, which only delays the removal of files unlinked while
open.
"""

from __future__ import annotations

import asyncio
import logging

from tectofs import limits
from tectofs.errors import TectofsError
from tectofs.wire import messages

from .metadata import MetadataClient

log = logging.getLogger("tectofs.client")


class LeaseEndings:
    """Leases of closed handles, waiting to be ended (on the client's event loop)."""

    def __init__(self, metadata: MetadataClient, delay_s: float = limits.lease_release_delay_s,
                 batch_max: int = limits.leases_per_release_max) -> None:
        """``metadata``: the client's own metadata connection (its views queue here too: the
        batch is sent as the client, a proxy that may end leases issued to any uid)."""
        self.metadata = metadata
        self.delay_s = delay_s
        self.batch_max = batch_max
        self._pending: list[messages.HeldLease] = []
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def end(self, ino: int, reader: int, handle: bytes, issued_to: int | None = None) -> None:
        """The handle holding lease ``reader`` on ``ino`` (named with the file ``handle``,
        issued to uid ``issued_to`` when a view acting for that user opened it) closed (call on
        the event loop)."""
        self._pending.append(messages.HeldLease(ino=ino, reader=reader, handle=handle, uid=issued_to))
        if len(self._pending) >= self.batch_max:
            self._send()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.delay_s, self._send)

    def _send(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[: self.batch_max], self._pending[self.batch_max:]
            task = asyncio.get_running_loop().create_task(self._release(batch))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _release(self, batch: list[messages.HeldLease]) -> None:
        try:
            await self.metadata.release_leases(messages.ReleaseLeasesRequest(leases=batch))
        except TectofsError as exc:  # they lapse after limits.reader_lease_s instead
            log.debug("could not end %d leases of closed handles: %s", len(batch), exc)

    async def flush(self) -> None:
        """End every queued lease now and wait for the calls (before the client closes)."""
        self._send()
        if self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    def __repr__(self) -> str:
        return f"LeaseEndings(pending={len(self._pending)}, sending={len(self._sending)})"
