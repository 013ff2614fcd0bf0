"""``DeviceWait``: the FUSE device watched once, waiters woken only for a pending request.

A pipe stands for the device (a byte written: a request queued; a byte read: taken)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, AsyncIterator

import pytest

from tectofs.client.fuse.device_wait import DeviceWait


class Closed(Exception):
    pass


def _run(body: Any) -> Any:
    return asyncio.run(asyncio.wait_for(body(), timeout=10))


@contextlib.asynccontextmanager
async def _device() -> AsyncIterator[tuple[int, int, DeviceWait]]:
    """(the device's end pyfuse3 reads, the kernel's end, a DeviceWait), closed after."""
    reader, writer = os.pipe()
    waiting = DeviceWait(Closed)
    try:
        yield reader, writer, waiting
    finally:
        waiting.notify_closing(reader)
        os.close(reader)
        os.close(writer)


def test_a_waiter_wakes_for_a_request_and_only_for_one_still_pending() -> None:
    async def body() -> None:
        async with _device() as (reader, writer, waiting):
            task = asyncio.ensure_future(waiting.wait_readable(reader))
            await asyncio.sleep(0.05)
            assert not task.done()  # nothing queued
            os.write(writer, b"r")
            await asyncio.wait_for(task, 2)
            os.read(reader, 1)  # pyfuse3 reads it
            # The loop may still hold the edge of that request: the next waiter sleeps until another.
            task = asyncio.ensure_future(waiting.wait_readable(reader))
            await asyncio.sleep(0.05)
            assert not task.done()
            os.write(writer, b"s")
            await asyncio.wait_for(task, 2)
            # A request already pending when the wait begins: returned after one turn of the loop.
            await asyncio.wait_for(waiting.wait_readable(reader), 2)

    _run(body)


def test_a_pending_request_nobody_waits_for_does_not_spin_the_loop() -> None:
    async def body() -> None:
        async with _device() as (reader, writer, waiting):
            edges = 0
            original = waiting._edge

            def counted(fd: int) -> None:
                nonlocal edges
                edges += 1
                original(fd)

            waiting._edge = counted  # type: ignore[method-assign]
            task = asyncio.ensure_future(waiting.wait_readable(reader))
            os.write(writer, b"r")
            await asyncio.wait_for(task, 2)
            # Every task busy in a handler: the request stays unread, no waiter. With a
            # level-triggered watch the callback would run on every turn of the loop.
            for _ in range(200):
                await asyncio.sleep(0)
            assert edges <= 2, edges
            await asyncio.wait_for(waiting.wait_readable(reader), 2)  # still found pending

    _run(body)


def test_closing_the_device_ends_the_wait_with_the_closed_error() -> None:
    async def body() -> None:
        async with _device() as (reader, _, waiting):
            task = asyncio.ensure_future(waiting.wait_readable(reader))
            await asyncio.sleep(0.02)
            waiting.notify_closing(reader)
            with pytest.raises(Closed):
                await asyncio.wait_for(task, 2)

    _run(body)
