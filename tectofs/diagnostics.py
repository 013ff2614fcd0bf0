"""Asking a running process where it waits.

``kill -USR1 PID`` on any tectofs process (metadata service, chunk server, mount) logs, at
WARNING, the stack of every asyncio task on its event loop: what a hung request is waiting
for, without stopping the process or attaching a debugger.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import threading
import time
from typing import Callable

log = logging.getLogger("tectofs.diagnostics")


def log_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Log every task of ``loop`` with its stack; call it on the loop's own thread."""
    tasks = asyncio.all_tasks(loop)
    out = io.StringIO()
    for task in tasks:
        task.print_stack(limit=12, file=out)
    log.warning("%d asyncio tasks:\n%s", len(tasks), out.getvalue())


def dump_tasks_on_sigusr1(loop: asyncio.AbstractEventLoop) -> None:
    """On SIGUSR1, log the tasks of ``loop``, which runs in the main thread (the servers)."""
    loop.add_signal_handler(signal.SIGUSR1, log_tasks, loop)


def dump_tasks_on_sigusr1_from_thread(loop: Callable[[], asyncio.AbstractEventLoop | None]) -> None:
    """On SIGUSR1, log the tasks of the loop ``loop()`` returns, which runs on another thread
    (the mount, whose main thread sits inside libfuse and never runs a Python signal handler).

    Call it from the main thread *before* any other thread starts: SIGUSR1 is blocked here and
    in every thread started after, and a thread of its own waits for it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})

    def wait() -> None:
        while True:
            signal.sigwait({signal.SIGUSR1})
            target = loop()
            if target is not None and not target.is_closed():
                target.call_soon_threadsafe(log_tasks, target)

    threading.Thread(target=wait, name="tectofs-diagnostics", daemon=True).start()


class RateLimitedLog:
    """At most ``lines_per_s`` lines a second through ``logger.warning``; what it drops is
    counted and reported in one line when the next second begins. For messages a peer can
    provoke at will (invalid requests, reports), so that no peer can fill the disk."""

    def __init__(self, logger: logging.Logger, lines_per_s: int, what: str) -> None:
        self.logger = logger
        self.lines_per_s = lines_per_s
        self.what = what
        self._window_start = 0.0
        self._lines = 0
        self._dropped = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._window_start >= 1.0:
            if self._dropped:
                self.logger.warning("%d more %s not logged", self._dropped, self.what)
            self._window_start, self._lines, self._dropped = now, 0, 0
        if self._lines < self.lines_per_s:
            self._lines += 1
            self.logger.warning(message, *args)
        else:
            self._dropped += 1


def file_tail(path: str, max_bytes: int) -> str:
    """The last ``max_bytes`` of a log file, as text ("" if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
