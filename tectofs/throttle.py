"""A byte-rate limit for background work (rebuilds, scrubbing): a token bucket.

``await take(n)`` returns once ``n`` more bytes fit the rate, so work paced by it averages at
most ``rate`` bytes a second, with bursts of up to one second's worth. A request larger
than the burst waits for its share of time and passes (it is never refused). A rate of 0
means unlimited. One bucket per process; coroutines share it in arrival order.
"""

from __future__ import annotations

import asyncio
import time


class RateLimiter:
    def __init__(self, rate_bytes_per_s: float, clock=time.monotonic) -> None:  # type: ignore[no-untyped-def]
        self.rate = float(rate_bytes_per_s)
        self._clock = clock
        self._tokens = self.rate
        self._last = clock()
        self._lock = asyncio.Lock()

    def delay_for(self, n: int) -> float:
        """Take ``n`` bytes from the bucket; return how long the caller must wait first."""
        if self.rate <= 0:
            return 0.0
        now = self._clock()
        self._tokens = min(self.rate, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def take(self, n: int) -> None:
        async with self._lock:  # first come, first served
            delay = self.delay_for(n)
            if delay > 0:
                await asyncio.sleep(delay)
