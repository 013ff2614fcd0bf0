"""Group commit: one thread owns the store and folds many operations into one transaction.

Single-row transactions cap SQLite at ~16k commits/s here; folding up to
``group_commit_batch_max`` operations into one commit reaches ~190k rows/s. Every operation
runs in its own savepoint, so one caller's error (say, ``NotFound``) rolls back only its own
changes. Results are handed back only after the batch's COMMIT returned: nothing a caller
is told happened can be lost to a crash of the metadata service.

Because all operations pass through one thread in order, the store is linearizable: an
operation sees every operation whose result was delivered before it was submitted.

An operation is a function of the store, typically a lambda calling one typed method of it
(``runner.call(lambda store: store.lookup(parts), returns=Attrs)``): the type checker sees the
callee, its arguments and the result type, and nothing is looked up by name.

An operation called with a ``request_key`` is run at most once per key: its result is
recorded in its own savepoint, encoded as it was returned, and a later call with that key
gets the recorded result back decoded as ``returns`` (:mod:`tectofs.store.requests`). The
caller makes the keys: the metadata service, which knows the call it serves, keys each
store operation of a call that carries a call id. The store knows nothing of the wire
beyond the declared types it answers with (``tests/test_tidy.py`` holds it to that).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from .. import limits
from ..errors import TectofsError
from . import requests
from .engine import SqlStore

log = logging.getLogger(__name__)

_STOP = object()
ResultT = TypeVar("ResultT")
Deliver = Callable[[Any, "BaseException | None"], None]


@dataclass
class _Pending(Generic[ResultT]):
    """One queued operation: what to run, how its recorded result reads back, and whom to tell."""

    operation: Callable[[SqlStore], ResultT]
    returns: type[ResultT] | None
    request_key: str | None
    loop: asyncio.AbstractEventLoop | None  # None: ``deliver`` is called on the store thread
    future: asyncio.Future[ResultT] | None
    deliver: Deliver | None = None

    @property
    def label(self) -> str:
        """The operation's name, for logs: the lambda's place (``MetadataService.rpc_create.<locals>...``)."""
        return getattr(self.operation, "__qualname__", "operation")


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
        self._queue: queue.Queue[Any] = queue.Queue()  # of _Pending, and _STOP
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

    async def call(self, operation: Callable[[SqlStore], ResultT], *, returns: type[ResultT] | None = None,
                   request_key: str | None = None) -> ResultT:
        """Run ``operation(store)`` in the next group commit; return its result (or raise its
        error) once that commit is durable. With ``request_key``, at most once: if an operation
        with that key committed before, its recorded result decoded as ``returns`` (which a
        keyed call must give), and nothing runs (a failed operation records nothing). One key
        names one operation: a caller running several for one logical call gives each its own,
        in the same order on every retry. ``operation`` runs on the store's thread and must
        only call the store."""
        assert request_key is None or returns is not None, "a keyed call names the type its record reads back as"
        if self._inline_store is not None:
            return self._run_inline(_Pending(operation, returns, request_key, None, None))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[ResultT] = loop.create_future()
        self._queue.put(_Pending(operation, returns, request_key, loop, future))
        return await future

    def call_sync(self, operation: Callable[[SqlStore], ResultT]) -> ResultT:
        """``call`` without a key, blocking: for tools and tests without an event loop."""
        if self._inline_store is not None:
            return self._run_inline(_Pending(operation, None, None, None, None))
        done = threading.Event()
        outcome: list[tuple[Any, BaseException | None]] = []

        def deliver(result: Any, error: BaseException | None) -> None:
            outcome.append((result, error))
            done.set()

        self._queue.put(_Pending(operation, None, None, None, None, deliver))
        done.wait()
        [(result, error)] = outcome
        if error is not None:
            raise error
        return result  # type: ignore[no-any-return]  # what ``operation`` returned: a ResultT

    def close(self) -> None:
        """Stop after the operations queued so far (their callers are answered), and close the store."""
        if self._inline_store is not None:
            self._inline_store.close()
            self._inline_store = None
            return
        self._queue.put(_STOP)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run_inline(self, pending: _Pending[ResultT]) -> ResultT:
        assert self._inline_store is not None
        [(result, error)] = self._execute(self._inline_store, [pending])
        self.stats["operations"] += 1
        if self._on_batch is not None:
            self._on_batch(1)
        if error is not None:
            raise error
        return result  # type: ignore[no-any-return]  # what ``operation`` returned: a ResultT

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

    def _run_batch(self, store: SqlStore, batch: list[_Pending[Any]]) -> None:
        outcomes = self._execute(store, batch)
        self.stats["operations"] += len(batch)
        self.stats["largest_batch"] = max(self.stats["largest_batch"], len(batch))
        if self._on_batch is not None:
            self._on_batch(len(batch))
        # One wakeup per event loop and batch, not per operation: each call_soon_threadsafe
        # writes to the loop's self-pipe.
        settled: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any, BaseException | None]]] = {}
        for pending, (result, error) in zip(batch, outcomes):
            if pending.deliver is not None:
                pending.deliver(result, error)
            else:
                assert pending.loop is not None and pending.future is not None
                settled.setdefault(pending.loop, []).append((pending.future, result, error))
        for loop, outcomes_of_loop in settled.items():
            try:
                loop.call_soon_threadsafe(_settle_all, outcomes_of_loop)
            except RuntimeError:
                pass  # that loop is closed: nobody waits for these results any more

    def _execute(self, store: SqlStore, batch: list[_Pending[Any]]) -> list[tuple[Any, BaseException | None]]:
        """Run ``batch`` in one transaction; return each operation's (result, error).

        A transaction the database aborts as retryable (PostgreSQL serialization conflicts
        between metadata services) runs again after a jittered backoff; a batch that keeps
        conflicting is split into one transaction per operation, which conflict less."""
        for attempt in range(limits.store_retries_max):
            outcomes: list[tuple[Any, BaseException | None]] = []
            try:
                store.tx_begin()
                for pending in batch:
                    store.tx_savepoint("op")
                    try:
                        outcomes.append((_run_once(store, pending), None))
                        store.tx_release("op")
                    except Exception as exc:
                        if not isinstance(exc, TectofsError) and store.dialect.is_retryable(exc):
                            raise  # the database aborted the whole transaction: run the batch again
                        # Whatever one operation raises is undone alone; the batch goes on.
                        store.tx_rollback_to("op")
                        store.tx_release("op")
                        if not isinstance(exc, TectofsError):
                            log.error("metadata operation %s failed", pending.label, exc_info=exc)
                            exc = TectofsError(
                                f"metadata operation {pending.label} failed: {type(exc).__name__}: {exc}")
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


def _run_once(store: SqlStore, pending: _Pending[ResultT]) -> ResultT:
    """``pending.operation(store)``; with a request key, at most once: the result recorded for
    the key if there is one, else the operation's, recorded in the same (savepoint of the)
    transaction."""
    key = pending.request_key
    if key is not None:
        assert pending.returns is not None
        recorded = requests.lookup(store, key, pending.returns)
        if not isinstance(recorded, requests.Absent):
            return recorded
    result = pending.operation(store)
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
