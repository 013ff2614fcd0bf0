"""Group commit: concurrent writers share one sync (leader/follower)."""

from __future__ import annotations

import threading
import time
from typing import Callable


class GroupSync:
    """``wait_durable()`` returns once a call of ``sync`` that *started after the call* has
    finished, so every write made before it is durable. The first waiter becomes the leader
    and syncs; waiters arriving meanwhile are covered by the leader's next round. Thread-safe;
    blocking (the chunk server calls it from I/O threads). ``on_sync(seconds)`` is told how
    long each sync took; ``syncs`` counts them."""

    def __init__(self, sync: Callable[[], None], on_sync: Callable[[float], None] | None = None) -> None:
        self._sync = sync
        self._on_sync = on_sync
        self._cond = threading.Condition()
        self._requested = 0
        self._done = 0
        self._syncing = False
        self.syncs = 0

    def wait_durable(self) -> None:
        with self._cond:
            self._requested += 1
            ticket = self._requested
            while self._done < ticket:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                target = self._requested
                self._cond.release()
                started = time.perf_counter()
                try:
                    self._sync()
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                self._done = max(self._done, target)
                self.syncs += 1
                if self._on_sync is not None:
                    self._on_sync(time.perf_counter() - started)
