"""What one client knows of the chunk servers it reads from: how fast each answered lately (its
hedge deadline), which ones it sets aside for a while (failed, or late past their deadline),
and how many hedges it may still send (the bound on the extra load hedging adds).

The deadline rule (``ServerLatencies.deadline``): a chunk get to a server is late once it
ran ``max(HEDGE_FLOOR_S, HEDGE_MEDIAN_FACTOR x median, p95)`` of that server's last
``WINDOW`` answered gets (or, with fewer than ``SAMPLES_MIN`` of its own, of every server's),
never more than ``HEDGE_CAP_S``. A client that has timed nothing yet uses the gets of the
same block that already arrived (``HEDGE_MEDIAN_FACTOR`` x their median), else the cap.

The load bound (``HedgeBudget``): a token bucket, one hedge per token; every chunk get adds
``HEDGE_FRACTION`` of a token, and the bucket holds at most ``HEDGE_BURST`` (it starts full,
so a new client process can hedge its first blocks). Over any long window hedges are at most
``HEDGE_FRACTION`` of gets plus ``HEDGE_BURST``. A get to a server set aside is hedged
without a token: the server is presumed gone, so the hedge replaces a get rather than
adding one.
"""

from __future__ import annotations

import collections
import statistics
import time
from typing import Callable, Deque

from tectofs import limits

WINDOW = 32                # answered gets remembered per server
SAMPLES_MIN = 3            # fewer of a server's own: judge it by every server's
HEDGE_FLOOR_S = 0.02       # never hedge a get younger than this
HEDGE_MEDIAN_FACTOR = 2.0  # ... nor one younger than this many times the median
HEDGE_CAP_S = 1.0          # ... and always hedge one older than this
SET_ASIDE_FACTOR = 4.0     # a get unanswered this many deadlines sets its server aside at once
SET_ASIDE_MIN_S = 0.25     # (never before this)
LATE_SET_ASIDE_S = 2.0     # a server set aside for being late: this long, doubled each time in a row
HEDGE_FRACTION = 0.05      # the bucket gains this much per get ...
HEDGE_BURST = 4.0          # ... up to this many hedges


class ServerLatencies:
    """Recent answer times of whole-chunk gets, per server address."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self._by_server: dict[str, Deque[float]] = {}
        self._all: Deque[float] = collections.deque(maxlen=window * 4)

    def record(self, address: str | None, seconds: float) -> None:
        if not address:
            return
        self._by_server.setdefault(address, collections.deque(maxlen=self.window)).append(seconds)
        self._all.append(seconds)

    def samples(self, address: str | None) -> list[float]:
        own = self._by_server.get(address or "")
        if own is not None and len(own) >= SAMPLES_MIN:
            return list(own)
        return list(self._all) if len(self._all) >= SAMPLES_MIN else []

    def deadline(self, address: str | None, siblings_s: list[float] | None = None) -> float:
        """How long a get to ``address`` may run before it is late (see the module docstring);
        ``siblings_s``: how long the gets of the same block that arrived took."""
        times = self.samples(address) or list(siblings_s or [])
        if not times:
            return HEDGE_CAP_S
        times.sort()
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))] if len(times) >= SAMPLES_MIN else 0.0
        return min(HEDGE_CAP_S, max(HEDGE_FLOOR_S, HEDGE_MEDIAN_FACTOR * statistics.median(times), p95))

    @staticmethod
    def set_aside_after(deadline: float) -> float:
        """How long a get may go unanswered before its server is set aside, mid-read."""
        return max(SET_ASIDE_MIN_S, SET_ASIDE_FACTOR * deadline)


class HedgeBudget:
    """The token bucket of the module docstring."""

    def __init__(self, fraction: float = HEDGE_FRACTION, burst: float = HEDGE_BURST) -> None:
        self.fraction = fraction
        self.burst = burst
        self.tokens = burst

    def requested(self) -> None:
        """One chunk get sent."""
        self.tokens = min(self.burst, self.tokens + self.fraction)

    def take(self) -> bool:
        """May one more hedge go out? (It takes a token if so.)"""
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class DownServers:
    """Chunk servers this client set aside: it failed to reach them (connection refused, lost or
    timed out: for ``limits.server_down_memo_s``), or they were late past their hedge deadline
    (``late``: ``LATE_SET_ASIDE_S``, doubled each time in a row, at most the memo). Reads ask
    other chunks first meanwhile. Advice only: a server set aside is still asked when no other
    chunk is left, and a chunk it serves clears the mark. A server ``late`` sets aside is also
told to ``on_set_aside`` (``BlockIO`` tells the metadata service, whose layouts then flag it
for every new client: ``server/meta/set_aside.py``). Also holds this client's
    :class:`ServerLatencies` and :class:`HedgeBudget`."""

    def __init__(self, memo_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 on_set_aside: Callable[[str], None] | None = None) -> None:
        self.memo_s = limits.server_down_memo_s if memo_s is None else memo_s
        self.clock = clock
        self.on_set_aside = on_set_aside  # told of each server ``late`` sets aside (BlockIO: the metadata service)
        self._until: dict[str, float] = {}
        self._strikes: dict[str, int] = {}
        self.latencies = ServerLatencies()
        self.budget = HedgeBudget()

    def mark(self, address: str | None) -> None:
        if address:
            self._until[address] = self.clock() + self.memo_s

    def late(self, address: str | None) -> None:
        """``address`` left a get unanswered past its deadline (and the read went on without it)."""
        if not address:
            return
        if self.on_set_aside is not None and not self.is_down(address):
            self.on_set_aside(address)
        strikes = self._strikes[address] = self._strikes.get(address, 0) + 1
        until = self.clock() + min(self.memo_s, LATE_SET_ASIDE_S * 2 ** min(strikes - 1, 16))
        self._until[address] = max(self._until.get(address, 0.0), until)

    def answered(self, address: str) -> None:
        self._until.pop(address, None)
        self._strikes.pop(address, None)

    def is_down(self, address: str | None) -> bool:
        if not address or address not in self._until:
            return False
        if self.clock() >= self._until[address]:
            del self._until[address]
            return False
        return True
