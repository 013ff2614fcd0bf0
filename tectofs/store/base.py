"""What the store's mixins (``registry.py``, ``health.py``) use of ``SqlStore``: its
connection helpers, clock and settings. ``SqlStore`` (``engine.py``) provides them all."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..wire.values import ServerInfo

if TYPE_CHECKING:
    import random

    from ..wire.leases import LeaseKey
    from ..wire.values import Attrs
    from .access import Caller


class StoreParts:
    gc_delay_s: float
    inline_max: int
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

    def servers(self) -> list[ServerInfo]:
        raise NotImplementedError

    def heartbeat(self, server_id: int, capacity: int, used: int, inflight: int, chunks: int,
                  address: str | None = None, orders_max: int = 0, stats: dict[str, int] | None = None,
                  metrics_url: str | None = None) -> list[int]:
        raise NotImplementedError

    if TYPE_CHECKING:  # for the type checker only: provided by SqlStore and the other mixins
        rng: random.Random
        modified: set[LeaseKey] | None  # what the running operation changed, as lease keys (engine.py)

        def _get(self, ino: int) -> Attrs: ...

        def _resolve(self, parts: list[str], caller: Caller | None = None) -> Attrs: ...

        def _child_attrs(self, parent: int, name: str) -> Attrs | None: ...

        def _drop_blocks(self, ino: int, from_idx: int = 0, only_idx: int | None = None) -> None: ...

        def _count_stored(self, ino: int) -> None: ...

        def _regular_file(self, parts: list[str], caller: Caller | None, want: int) -> Attrs: ...

        def live_servers(self) -> list[ServerInfo]: ...

        def renew(self, ino: int, writer: int = 0, reader: int = 0, reader_lease_s: float = ...) -> int: ...
