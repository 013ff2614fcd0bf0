"""Asking a running process where it waits.

``kill -USR1 PID`` on any tectofs process (metadata service, chunk server, mount) logs, at
WARNING, the stack of every asyncio task on its event loop: what a hung request is waiting
for, without stopping the process or attaching a debugger.
"""

from __future__ import annotations

import asyncio
import io
import logging
import signal

log = logging.getLogger("tectofs.diagnostics")


def log_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Log every task of ``loop`` with its stack; call it on the loop's own thread."""
    tasks = asyncio.all_tasks(loop)
    out = io.StringIO()
    for task in tasks:
        task.print_stack(limit=12, file=out)
    log.warning("%d asyncio tasks:\n%s", len(tasks), out.getvalue())


def dump_tasks_on_sigusr1(loop: asyncio.AbstractEventLoop) -> None:
    """Install the SIGUSR1 handler for ``loop`` (which may run on another thread); call it
    from the main thread."""
    signal.signal(signal.SIGUSR1, lambda signum, frame: loop.call_soon_threadsafe(log_tasks, loop))
