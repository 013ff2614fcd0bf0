"""Waiting for the FUSE device to be readable without re-registering it for every request.

pyfuse3's asyncio layer (``pyfuse3.asyncio.wait_readable``) adds the device to the event
loop's epoll set before every request and removes it after: two ``epoll_ctl`` calls and the
selector's bookkeeping each time. Profiled on this mount serving ``open``/``read``/``close``
of a cached file (three kernel requests each), that was a fifth of the daemon's samples.

``DeviceWait`` watches the device once, through an epoll set of its own in edge-triggered
mode (``EPOLLET``) that the event loop watches: it turns readable when a request arrives, not
for as long as one is pending, so nothing spins while every task is busy in a handler and the
device stays registered. A waiter is woken only when a zero-timeout ``poll`` of the device
confirms a request is pending (pyfuse3 reads it right after the wait, blocking the loop if
nothing is there); a waiter that finds one pending returns after one turn of the loop (other
tasks run between two requests, as before).
"""

from __future__ import annotations

import asyncio
import select


class _Watch:
    """The device ``fd`` watched by ``loop`` through an edge-triggered epoll set."""

    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self.fd, self.loop = fd, loop
        self.edges = select.epoll()
        self.edges.register(fd, select.EPOLLIN | select.EPOLLET)
        self.device = select.poll()
        self.device.register(fd, select.POLLIN)

    def pending(self) -> bool:
        """A request is there to read (now, not as of the last edge)."""
        return bool(self.device.poll(0))

    def close(self) -> None:
        self.loop.remove_reader(self.edges.fileno())
        self.edges.close()


class DeviceWait:
    """``wait_readable(fd)`` and ``notify_closing(fd)`` for ``pyfuse3.asyncio`` (see the
    module docstring); ``closed_error``: the exception pyfuse3 expects a closed device to raise."""

    def __init__(self, closed_error: type[Exception]) -> None:
        self.closed_error = closed_error
        self._watches: dict[int, _Watch] = {}
        self._waiters: dict[int, asyncio.Future[None]] = {}  # pyfuse3 lets one task at a time wait

    async def wait_readable(self, fd: int) -> None:
        watch = self._watches.get(fd)
        if watch is None:
            watch = self._watches[fd] = _Watch(fd, asyncio.get_running_loop())
            watch.loop.add_reader(watch.edges.fileno(), self._edge, fd)
        if watch.pending():
            await asyncio.sleep(0)
            if watch.pending():
                return
        future: asyncio.Future[None] = watch.loop.create_future()
        self._waiters[fd] = future
        try:
            await future
        finally:
            if self._waiters.get(fd) is future:
                del self._waiters[fd]

    def _edge(self, fd: int) -> None:
        watch = self._watches[fd]
        watch.edges.poll(0)  # take the edge: the set is not readable again until the next request
        future = self._waiters.get(fd)
        if future is not None and not future.done() and watch.pending():
            del self._waiters[fd]
            future.set_result(None)

    def notify_closing(self, fd: int) -> None:
        """The device is closing: its waiter gets ``closed_error``, the watch goes."""
        future = self._waiters.pop(fd, None)
        if future is not None and not future.done():
            future.set_exception(self.closed_error())
        watch = self._watches.pop(fd, None)
        if watch is not None:
            watch.close()

    def close(self) -> None:
        """pyfuse3's main loop returned: every device watched is about to close (an unmount
        ended the loop without ``notify_closing``): stop watching them."""
        for fd in list(self._watches):
            self.notify_closing(fd)


_waiting: DeviceWait | None = None  # the one installed


def closing() -> None:
    """pyfuse3's main loop returned (see :meth:`DeviceWait.close`); nothing if not installed."""
    if _waiting is not None:
        _waiting.close()


def install() -> bool:
    """Make ``pyfuse3.asyncio`` (enabled) wait through a ``DeviceWait``; False, changing
    nothing, if its layer is not the one this was written against (``wait_readable``,
    ``notify_closing`` and ``ClosedResourceError`` in ``pyfuse3.asyncio``)."""
    import pyfuse3.asyncio as layer

    global _waiting
    needed = ("wait_readable", "notify_closing", "ClosedResourceError")
    if not all(hasattr(layer, name) for name in needed):
        return False
    waiting = _waiting = DeviceWait(layer.ClosedResourceError)
    layer.wait_readable = waiting.wait_readable  # type: ignore[assignment]
    layer.notify_closing = waiting.notify_closing  # type: ignore[assignment]
    return True
