"""A virtual-time asyncio event loop: the simulator's clock and its executor seam.

``SimLoop`` is a ``SelectorEventLoop`` whose selector never blocks: where a real loop would
wait ``timeout`` seconds for a socket, the virtual clock jumps ``timeout`` ahead and the next
timer is due. So ``asyncio.sleep``, ``wait_for``, ``asyncio.timeout`` and ``call_later`` in the
production code run in virtual time, as fast as the CPU allows, in an order fixed by the
seed. ``run_in_executor`` runs the function at once on the loop's thread (no thread may
reorder a schedule): the chunk server's disk I/O, the client's erasure coding.

Every role runs on a *host* (``HOST``, a context variable): tasks remember the host they
were created on (``tasks_of``), so a crash cancels exactly its process's tasks, and the
network (``tectofs.testing.network``) runs each delivery in its receiver's context.
"""

from __future__ import annotations

import asyncio
import contextvars
import selectors
import weakref
from collections.abc import Coroutine, Generator
from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")

HOST: contextvars.ContextVar[str] = contextvars.ContextVar("tectofs_sim_host", default="sim")
EPOCH_S = 1_800_000_000.0  # what the wall clock reads at virtual time 0


class Fabric(Protocol):
    """Where a ``SimLoop``'s servers listen and its connections go (``tectofs.testing.network.Network``)."""

    def listen(self, loop: SimLoop, owner: str, factory: Callable[[], asyncio.BaseProtocol], host: str,
               port: int) -> Any:
        """Start listening on ``host:port`` (0: a free port) for ``owner``; the listener (an ``asyncio.Server`` look-alike)."""

    async def connect(self, loop: SimLoop, from_host: str, factory: Callable[[], asyncio.BaseProtocol], host: str,
                      port: int) -> tuple[asyncio.Transport, asyncio.BaseProtocol]:
        """Connect ``from_host`` to ``host:port``: its transport and the protocol ``factory`` made."""


class Stuck(RuntimeError):
    """Nothing can ever run again: every task waits for an event that no timer will bring."""


class VirtualClock:
    """Seconds of virtual time; only the loop's idle waits move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        """The wall clock of the simulated hosts (what ``time.time()`` would say)."""
        return EPOCH_S + self.now


class _VirtualSelector(selectors.SelectSelector):
    """Registers file objects like any selector (the loop's self-pipe) but never waits on
    them: ``select`` advances the clock by its timeout and reports nothing ready."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Stuck("the simulation is stuck: no task can run and no timer is pending")
        if timeout > 0:
            self.clock.now += timeout
        return []


class SimLoop(asyncio.SelectorEventLoop):
    """The event loop of one simulation: virtual time, inline executors, an in-memory network
    (``create_server`` and ``create_connection`` go to ``network``; local sockets are absent, so
    the wire stack falls back to TCP as it does on a kernel without them)."""

    def __init__(self, clock: VirtualClock, network: Fabric) -> None:
        super().__init__(_VirtualSelector(clock))
        self.clock = clock
        self.network = network
        # host -> its live tasks in the order they were made (a WeakSet's order follows the
        # tasks' addresses, which differ between two runs of one seed: a crash would cancel
        # them, and trace their failures, in another order)
        self.tasks_of: dict[str, weakref.WeakValueDictionary[int, asyncio.Task[Any]]] = {}
        self._tasks_made = 0
        self.set_task_factory(self._make_task)  # type: ignore[arg-type]

    def time(self) -> float:
        return self.clock.now

    def _make_task(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T] | Generator[Any, None, T],
                      context: contextvars.Context | None = None) -> asyncio.Task[T]:
        task: asyncio.Task[T] = asyncio.Task(coro, loop=loop, context=context)  # type: ignore[arg-type]
        host = context.get(HOST, HOST.get()) if context is not None else HOST.get()
        self._tasks_made += 1
        self.tasks_of.setdefault(host, weakref.WeakValueDictionary())[self._tasks_made] = task
        return task

    def spawn(self, host: str, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Start ``coro`` as a task of ``host``'s process."""
        return self.create_task(coro, context=host_context(host))

    def cancel_host(self, host: str) -> None:
        """A crash: every task of ``host``'s process stops where it is."""
        for task in list(self.tasks_of.pop(host, {}).values()):
            task.cancel()

    def run_in_executor(self, executor: Any, func: Callable[..., T], *args: Any) -> asyncio.Future[T]:  # type: ignore[override]
        future: asyncio.Future[T] = self.create_future()
        try:
            future.set_result(func(*args))
        except BaseException as exc:  # noqa: BLE001 - the caller awaits it, as from a thread
            future.set_exception(exc)
        return future

    async def create_server(self, protocol_factory: Callable[[], asyncio.BaseProtocol],  # type: ignore[override]
                            host: Any = None, port: Any = None, **_: Any) -> Any:
        return self.network.listen(self, HOST.get(), protocol_factory, str(host), int(port or 0))

    async def create_connection(self, protocol_factory: Callable[[], asyncio.BaseProtocol],  # type: ignore[override]
                                host: Any = None, port: Any = None, **_: Any) -> Any:
        return await self.network.connect(self, HOST.get(), protocol_factory, str(host), int(port))

    async def create_unix_server(self, *_: Any, **__: Any) -> Any:  # type: ignore[override]
        raise OSError("no local sockets in the simulation")

    async def create_unix_connection(self, *_: Any, **__: Any) -> Any:  # type: ignore[override]
        raise OSError("no local sockets in the simulation")


def host_context(host: str) -> contextvars.Context:
    """A fresh context in which ``HOST`` is ``host``."""
    context = contextvars.Context()
    context.run(HOST.set, host)
    return context
