"""What the store's mixins (``registry.py``, ``health.py``) use of ``SqlStore``: its
connection helpers, clock and settings. ``SqlStore`` (``engine.py``) provides them all."""

from __future__ import annotations

from typing import Any, Callable, Iterable


class StoreParts:
    gc_delay_s: float
    server_dead_after_s: float
    heartbeats_seen: dict[int, float]
    clock: Callable[[], float]

    def _x(self, sql: str, params: Iterable[Any] = ()) -> Any:
        raise NotImplementedError

    def _one(self, sql: str, params: Iterable[Any] = ()) -> Any:
        raise NotImplementedError

    def _all(self, sql: str, params: Iterable[Any] = ()) -> list[Any]:
        raise NotImplementedError

    def _next(self, counter: str, count: int = 1) -> int:
        raise NotImplementedError

    def servers(self) -> list[dict[str, Any]]:
        raise NotImplementedError

    def heartbeat(self, server_id: int, capacity: int, used: int, inflight: int, chunks: int,
                  address: str | None = None, orders_max: int = 0, stats: dict[str, int] | None = None) -> list[int]:
        raise NotImplementedError
