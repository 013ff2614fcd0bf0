"""Group commit: one thread owns the store and folds many operations into one transaction.

Single-row transactions cap SQLite at ~16k commits/s here; folding up to
``group_commit_batch_max`` operations into one commit reaches ~190k rows/s. Every operation
runs in its own savepoint, so one caller's error (say, ``NotFound``) rolls back only its own
changes. Results are handed back only after the batch's COMMIT returned: nothing a caller
is told happened can be lost to a crash of the metadata service.

Because all operations pass through one thread in order, the store is linearizable: an
operation sees every operation whose result was delivered before it was submitted.

An operation called with a ``request_key`` is run at most once per key: its result is
recorded in its own savepoint, and a later call with that key gets the recorded result
(:mod:`tectofs.store.requests`). The caller makes the keys: the metadata service, which
knows the call it serves, keys each store operation of a call that carries a call id. The
store knows nothing of the wire (``tests/test_tidy.py`` holds it to that).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from typing import Any, Callable

from .. import limits
from ..errors import TectofsError
from . import requests
from .engine import SqlStore

log = logging.getLogger(__name__)

_STOP = object()


class StoreRunner:
    """Runs ``SqlStore`` methods for asyncio callers, batching them into group commits.

    ``inline=True`` (the simulator's, ``tectofs.testing``): no thread; each call runs at once, in
    a transaction of its own, on the caller's thread, with the same savepoints, exactly-once
    records and error handling, so a schedule of calls is deterministic."""

    def __init__(self, open_store: Callable[[], SqlStore], batch_max: int = limits.group_commit_batch_max,
                 on_batch: Callable[[int], None] | None = None, *, inline: bool = False) -> None:
        """``on_batch(size)`` is called on the store thread after each group commit (metrics)."""
        self.batch_max = batch_max
        self._on_batch = on_batch
        self._queue: queue.Queue[Any] = queue.Queue()
        self._open_store = open_store
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.stats = {"operations": 0, "commits": 0, "largest_batch": 0, "retries": 0}
        self._inline_store: SqlStore | None = None
        if inline:
            self._inline_store = open_store()
            requests.create_schema(self._inline_store)
            return
        self._thread: threading.Thread | None = threading.Thread(target=self._main, name="tectofs-store", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            raise self._startup_error

    @property
    def queued(self) -> int:
        """Operations waiting for the store thread (approximate, as queue sizes are)."""
        return self._queue.qsize()

    async def call(self, method: str, *args: Any, request_key: str | None = None, **kwargs: Any) -> Any:
        """Run ``store.<method>(*args, **kwargs)`` in the next group commit; return its result
        (or raise its error) once that commit is durable. With ``request_key``, at most once:
        if an operation with that key committed before, its recorded result, and nothing runs
        (a failed operation records nothing). One key names one operation: a caller running
        several for one logical call gives each its own, in the same order on every retry."""
        if self._inline_store is not None:
            return self._run_inline(method, args, kwargs, request_key)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._queue.put((method, args, kwargs, request_key, loop, future))
        return await future

    def call_sync(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Blocking variant for tools and tests without an event loop."""
        if self._inline_store is not None:
            return self._run_inline(method, args, kwargs, None)
        done = threading.Event()
        box: dict[str, Any] = {}

        def deliver(result: Any, error: BaseException | None) -> None:
            box["result"], box["error"] = result, error
            done.set()

        self._queue.put((method, args, kwargs, None, None, deliver))
        done.wait()
        if box["error"] is not None:
            raise box["error"]
        return box["result"]

    def close(self) -> None:
        if self._inline_store is not None:
            self._inline_store.close()
            self._inline_store = None
            return
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run_inline(self, method: str, args: Any, kwargs: Any, request_key: str | None) -> Any:
        assert self._inline_store is not None
        [(result, error)] = self._execute(self._inline_store, [(method, args, kwargs, request_key, None, None)])
        self.stats["operations"] += 1
        if self._on_batch is not None:
            self._on_batch(1)
        if error is not None:
            raise error
        return result

    # ------------------------------------------------------------------ store thread

    def _main(self) -> None:
        try:
            store = self._open_store()
            requests.create_schema(store)
        except BaseException as exc:  # report to the constructor instead of dying silently
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        pruned_at = 0.0
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    return
                if time.monotonic() - pruned_at > limits.request_dedupe_prune_interval_s:
                    pruned_at = time.monotonic()
                    self._prune(store)
                batch = [first]
                while len(batch) < self.batch_max:
                    try:
                        item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is _STOP:
                        self._queue.put(_STOP)
                        break
                    batch.append(item)
                self._run_batch(store, batch)
        finally:
            store.close()

    def _run_batch(self, store: SqlStore, batch: list[Any]) -> None:
        outcomes = self._execute(store, batch)
        self.stats["operations"] += len(batch)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        if self._on_batch is not None:
            self._on_batch(len(batch))
        # One wakeup per event loop and batch, not per operation: each call_soon_threadsafe
        # writes to the loop's self-pipe.
        settled: dict[Any, list[tuple[Any, Any, BaseException | None]]] = {}
        for (_method, _args, _kwargs, _key, loop, future), (result, error) in zip(batch, outcomes):
            if loop is None:
                future(result, error)
            else:
                settled.setdefault(loop, []).append((future, result, error))
        for loop, outcomes_of_loop in settled.items():
            try:
                loop.call_soon_threadsafe(_settle_all, outcomes_of_loop)
            except RuntimeError:
                pass  # that loop is closed: nobody waits for these results any more

    def _execute(self, store: SqlStore, batch: list[Any]) -> list[tuple[Any, BaseException | None]]:
        """Run ``batch`` in one transaction; return each operation's (result, error).

        A transaction the database aborts as retryable (PostgreSQL serialization conflicts
        between metadata services) runs again after a jittered backoff; a batch that keeps
        conflicting is split into one transaction per operation, which conflict less."""
        for attempt in range(limits.store_retries_max):
            outcomes: list[tuple[Any, BaseException | None]] = []
            try:
                store.tx_begin()
                for method, args, kwargs, key, _loop, _future in batch:
                    store.tx_savepoint("op")
                    try:
                        outcomes.append((_run_once(store, method, args, kwargs, key), None))
                        store.tx_release("op")
                    except Exception as exc:
                        if not isinstance(exc, TectofsError) and store.dialect.is_retryable(exc):
                            raise  # the database aborted the whole transaction: run the batch again
                        # Whatever one operation raises is undone alone; the batch goes on.
                        store.tx_rollback_to("op")
                        store.tx_release("op")
                        if not isinstance(exc, TectofsError):
                            log.error("metadata operation %s failed", method, exc_info=exc)
                            exc = TectofsError(f"metadata operation {method} failed: {type(exc).__name__}: {exc}")
                        outcomes.append((None, exc))
                store.tx_commit()
                self.stats["commits"] += 1
                return outcomes
            except Exception as exc:
                try:
                    store.tx_rollback()
                except Exception:
                    pass
                if not store.dialect.is_retryable(exc) or attempt + 1 == limits.store_retries_max:
                    log.exception("metadata batch of %d operations failed", len(batch))
                    return [(None, exc)] * len(batch)
                self.stats["retries"] += 1
                if len(batch) > 1 and attempt >= 1:
                    return [self._execute(store, [item])[0] for item in batch]
                time.sleep(random.uniform(0, 0.01 * 2**attempt))
        raise AssertionError("unreachable")


    def _prune(self, store: SqlStore) -> None:
        """Forget recorded results older than ``limits.request_dedupe_retention_s`` (one
        transaction of its own; a failure is logged and tried again next interval)."""
        try:
            store.tx_begin()
            pruned = requests.prune(store, time.time() - limits.request_dedupe_retention_s)
            store.tx_commit()
        except Exception as exc:
            try:
                store.tx_rollback()
            except Exception:
                pass
            log.warning("pruning recorded request results failed: %s", exc)
            return
        if pruned:
            log.debug("pruned %d recorded request results", pruned)


def _run_once(store: SqlStore, method: str, args: Any, kwargs: Any, key: str | None) -> Any:
    """``store.<method>(*args, **kwargs)``; with a request ``key``, at most once: the result
    recorded for ``key`` if there is one, else the operation's, recorded in the same
    (savepoint of the) transaction."""
    if key is not None:
        recorded = requests.lookup(store, key)
        if recorded is not requests.ABSENT:
            return recorded
    result = getattr(store, method)(*args, **kwargs)
    if key is not None:
        requests.record(store, key, result, time.time())
    return result


def _settle_all(outcomes: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for future, result, error in outcomes:
        _settle(future, result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
