"""``tectofs.throttle.RateLimiter``: a token bucket on the event loop's clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from tectofs.throttle import RateLimiter


def test_the_bucket_starts_full_refills_with_time_and_never_refuses() -> None:
    now = [100.0]
    limiter = RateLimiter(1000, clock=lambda: now[0])
    assert limiter.delay_for(600) == 0.0  # full at the first take: a second's worth
    assert limiter.delay_for(600) == pytest.approx(0.2)  # 200 bytes short at 1000 B/s
    now[0] += 0.7  # refilled by 700 bytes
    assert limiter.delay_for(500) == 0.0
    assert limiter.delay_for(5000) == pytest.approx(5.0)  # larger than the burst: waits its share, passes
    assert RateLimiter(0, clock=lambda: now[0]).delay_for(10**9) == 0.0  # 0: unlimited


def test_by_default_it_reads_the_running_loops_clock() -> None:
    class Loop(asyncio.SelectorEventLoop):
        """A loop whose clock stands still: only a limiter that reads it sees no time pass."""

        def time(self) -> float:
            return 42.0

    async def takes() -> float:
        limiter = RateLimiter(1000)
        limiter.delay_for(1000)
        time.sleep(0.05)  # real time passes; the loop's clock does not
        return limiter.delay_for(100)

    loop = Loop()
    try:
        assert loop.run_until_complete(takes()) == pytest.approx(0.1)
    finally:
        loop.close()
