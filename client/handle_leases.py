"""The leases one open handle keeps while it is open (``AsyncFile``, ``client/files.py``).

- Its *writer's* lease: what it allocated and staged is kept while it renews, a few times per
  allocation lease (``AllocateReply.lease_s``), so a write of any length commits; a writer that
  crashed stops renewing and its chunks expire.
- Its *reader's* lease (taken by ``open``): the chunks of the version it opened stay, even if
  the file is unlinked or replaced meanwhile; renewed every ``limits.reader_lease_s / 4``.

One task renews both, at the faster pace. When the handle closes, ``stop`` hands back the
reader's lease and when it was last granted or renewed (on the event loop's clock, as sent),
for the handle to end it or park it (``MetadataCache.park_reader``).
"""

from __future__ import annotations

import asyncio
import logging

from tectofs import limits
from tectofs.errors import TectofsError
from tectofs.wire import messages

from .metadata import MetadataClient

log = logging.getLogger("tectofs.client")


class HandleLeases:
    def __init__(self, metadata: MetadataClient, path: str, ino: int, handle: bytes, writer: int) -> None:
        """``metadata``: the handle's metadata client; ``ino`` and ``handle``: its file, by
        number; ``writer``: the id naming what the handle stages."""
        self.metadata, self.path, self.ino, self.handle, self.writer = metadata, path, ino, handle, writer
        self.writer_lease_s: float | None = None  # set by the first allocation
        self.reader = 0  # a reader's lease id (0: none)
        self.reader_since = 0.0  # when it was granted or last renewed (the loop's clock, as sent)
        self._first: asyncio.TimerHandle | None = None  # the first renewal, until it starts the task
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    def keep_writer(self, lease_s: float) -> None:
        """Renew the writer's lease (its allocations: ``lease_s`` long) from now on."""
        renewing_too_seldom = self.writer_lease_s is None or lease_s < self.writer_lease_s
        self.writer_lease_s = lease_s
        if renewing_too_seldom:  # e.g. at the read lease's pace
            self._cancel()
        self._start()

    def hold_reader(self, reader: int, since: float | None = None) -> None:
        """Keep reader's lease ``reader`` (granted or renewed when the event loop's clock read
        ``since``; None: now)."""
        self.reader = reader
        self.reader_since = asyncio.get_running_loop().time() if since is None else since
        self._start()

    def stop(self) -> tuple[int, float]:
        """Renew nothing more; the reader's lease held (0: none) and when it was last granted
        or renewed, now the caller's to end or park."""
        self._stopped = True
        self._cancel()
        reader, self.reader = self.reader, 0
        return reader, self.reader_since

    def _period(self) -> float | None:
        """How long between two renewals (None: nothing to renew)."""
        periods = [s for s in (self.writer_lease_s, limits.reader_lease_s if self.reader else None) if s]
        return max(0.05, min(periods) / 4) if periods else None

    def _start(self) -> None:
        """The first renewal, a period from now: a timer, and the renewing task only when it
        fires (most handles close long before: an untar opens and closes one per file)."""
        period = self._period()
        if period is None or self._stopped or self._first is not None or (self._task is not None and not self._task.done()):
            return
        self._first = asyncio.get_running_loop().call_later(period, self._begin)

    def _begin(self) -> None:
        self._first = None
        if not self._stopped:
            self._task = asyncio.get_running_loop().create_task(self._renew())

    def _cancel(self) -> None:
        if self._first is not None:
            self._first.cancel()
            self._first = None
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _renew(self) -> None:
        while not self._stopped:
            sent, reader = asyncio.get_running_loop().time(), self.reader
            try:
                await self.metadata.renew(messages.RenewRequest(
                    ino=self.ino, handle=self.handle, writer=self.writer if self.writer_lease_s else 0, reader=reader))
                if reader and reader == self.reader:
                    self.reader_since = sent
            except TectofsError as exc:  # the next renewal, or the commit, will tell
                log.warning("%s: lease renewal failed: %s", self.path, exc)
            period = self._period()
            if period is None:
                return
            await asyncio.sleep(period)
