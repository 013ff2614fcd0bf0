"""A byte-rate limit for background work (rebuilds, scrubbing): a token bucket.

``await take(n)`` returns once ``n`` more bytes fit the rate, so work paced by it averages at
most ``rate`` bytes a second, with bursts of up to one second's worth. A request larger
than the burst waits for its share of time and passes (it is never refused). A rate of 0
means unlimited. One bucket per process; coroutines share it in arrival order.
"""

from __future__ import annotations

import asyncio
from typing import Callable


def _loop_time() -> float:
    """The running event loop's clock (``time.monotonic`` for asyncio's own loops; the
    simulator's virtual time under its loop, so a seed replays exactly)."""
    return asyncio.get_running_loop().time()


class RateLimiter:
    def __init__(self, rate_bytes_per_s: float, clock: Callable[[], float] = _loop_time) -> None:
        """``clock``: seconds, read at each take (default: the running event loop's, so only
        ever called on it)."""
        self.rate = float(rate_bytes_per_s)
        self._clock = clock
        self._tokens = self.rate
        self._last: float | None = None  # the bucket starts full at its first take
        self._lock = asyncio.Lock()

    def delay_for(self, n: int) -> float:
        """Take ``n`` bytes from the bucket; return how long the caller must wait first."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        last = now if self._last is None else self._last
        self._tokens = min(self.rate, self._tokens + (now - last) * self.rate)
        self._last = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def take(self, n: int) -> None:
        async with self._lock:  # first come, first served
            delay = self.delay_for(n)
            if delay > 0:
                await asyncio.sleep(delay)
