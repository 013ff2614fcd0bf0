"""The client's RPC pool, counted: every metadata and chunk call's outcome, latency and
bytes, and every retry with its reason, go to the process's
:class:`tectofs.metrics.ClientMetrics`.

Retries happen inside ``RpcClient.call`` (``tectofs.rpc_client``), which asks
``_connection`` for a connection once per try and, before trying again after a lost
connection or a timeout, ``forget``\\s that member's connections: so a second ``_connection``
within one call is a retry, after a BUSY answer if nothing was forgotten since the last try,
on another member of a failover group if the member changed, else after a connection failure.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from typing import Any

from tectofs.errors import TectofsError
from tectofs.metrics import ClientMetrics
from tectofs.rpc import Reply, RpcClient

CHUNK_OPS = frozenset({"put_chunk", "get_chunk"})


class _Tries:
    """One call's tries so far: the member of the last one, and whether its connection was lost."""

    __slots__ = ("service", "member", "lost")

    def __init__(self, service: str) -> None:
        self.service = service
        self.member: str | None = None
        self.lost = False


_current: contextvars.ContextVar[_Tries | None] = contextvars.ContextVar("tectofs_rpc_tries", default=None)


class MeteredRpcClient(RpcClient):
    """An :class:`RpcClient` that reports to ``metrics``: ``put_chunk``/``get_chunk`` as chunk
    requests (with the chunk's bytes), every other operation as a metadata request. A call
    cancelled (a hedge that lost, a straggler given up) is not counted."""

    def __init__(self, metrics: ClientMetrics, **options: Any) -> None:
        super().__init__(**options)
        self.metrics = metrics

    async def call(self, address: str, op: str, header: dict[str, Any] | None = None, payload: Any = b"",
                   **options: Any) -> Reply:
        chunk = op in CHUNK_OPS
        token = _current.set(_Tries("chunk" if chunk else "meta"))
        started = time.perf_counter()
        try:
            reply = await super().call(address, op, header, payload, **options)
        except asyncio.CancelledError:
            raise
        except TectofsError as exc:
            self._done(chunk, op, exc.code, started, 0)
            raise
        except Exception:
            self._done(chunk, op, "error", started, 0)
            raise
        finally:
            _current.reset(token)
        self._done(chunk, op, "ok", started, len(payload) if op == "put_chunk" else len(reply[1]))
        return reply

    def _done(self, chunk: bool, op: str, outcome: str, started: float, nbytes: int) -> None:
        seconds = time.perf_counter() - started
        if chunk:
            self.metrics.chunk_done(op, outcome, seconds, nbytes)
        else:
            self.metrics.meta_done(op, outcome, seconds)

    async def _connection(self, address: str) -> Any:
        tries = _current.get()
        if tries is not None:
            if tries.member is not None:
                reason = "busy" if not tries.lost else "failover" if address != tries.member else "connection"
                self.metrics.retried(tries.service, reason)
            tries.member, tries.lost = address, False
        return await super()._connection(address)

    def forget(self, address: str) -> None:
        tries = _current.get()
        if tries is not None:
            tries.lost = True
        super().forget(address)
