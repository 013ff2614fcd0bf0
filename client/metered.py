"""The client's RPC pool, counted: every metadata and chunk call's outcome, latency and
bytes, and every retry with its reason (``RpcClient.retrying``), go to the process's
:class:`tectofs.metrics.ClientMetrics`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from tectofs.errors import TectofsError
from tectofs.metrics import ClientMetrics
from tectofs.wire.client import Payload, Reply, ReplySink, RpcClient

CHUNK_OPS = frozenset({"put_chunk", "get_chunk"})


class MeteredRpcClient(RpcClient):
    """An :class:`RpcClient` that reports to ``metrics``: ``put_chunk``/``get_chunk`` as chunk
    requests (with the chunk's bytes), every other operation as a metadata request. A call
    cancelled (a hedge that lost, a straggler given up) is not counted."""

    def __init__(self, metrics: ClientMetrics, **options: Any) -> None:
        super().__init__(**options)
        self.metrics = metrics

    async def exchange(self, address: str, op: str, header: dict[str, Any], payload: Payload, *,
                       idempotent: bool, timeout_s: float | None, retries_max: int | None, call_id: bytes | None,
                       receive_into: ReplySink | None) -> Reply:
        chunk = op in CHUNK_OPS
        started = time.perf_counter()
        try:
            reply = await super().exchange(address, op, header, payload, idempotent=idempotent, timeout_s=timeout_s,
                                           retries_max=retries_max, call_id=call_id, receive_into=receive_into)
        except asyncio.CancelledError:
            raise
        except TectofsError as exc:
            self._done(chunk, op, exc.code, started, 0)
            raise
        except Exception:
            self._done(chunk, op, "error", started, 0)
            raise
        received = len(reply[1]) or (receive_into.received_bytes if receive_into is not None else 0)
        self._done(chunk, op, "ok", started, len(payload) if op == "put_chunk" else received)
        return reply

    def _done(self, chunk: bool, op: str, outcome: str, started: float, nbytes: int) -> None:
        seconds = time.perf_counter() - started
        if chunk:
            self.metrics.chunk_done(op, outcome, seconds, nbytes)
        else:
            self.metrics.meta_done(op, outcome, seconds)

    def retrying(self, op: str, reason: str) -> None:
        self.metrics.retried("chunk" if op in CHUNK_OPS else "meta", reason)
