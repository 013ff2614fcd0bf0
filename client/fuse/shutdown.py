"""How a mount stops: ``fusermount3 -u``, SIGTERM, SIGINT, or several of them at once, each
ending with exit code 0, the mount point unmounted and libfuse's session never touched once gone.

libfuse's ``struct fuse_session`` exists from ``pyfuse3.init`` until ``pyfuse3.close``
destroys it (and pyfuse3 then holds a null pointer): every libfuse call must fall in between.
``pyfuse3.terminate`` writes the session's ``exited`` flag with no check, so a stop signal
that arrived after ``close`` (an unmount ended the mount, then SIGTERM) wrote through a null
pointer (SIGSEGV). The notifications that drop what the kernel caches are sent from two threads
(this mount's recall thread, ``KernelCache``, and pyfuse3's own for ``invalidate_entry_async``);
libfuse checks them for a null session, not for a freed one.

So, in :func:`tectofs.client.fuse.mount._serve_async`:

- :class:`Stopper` takes SIGINT and SIGTERM from the start (a Python handler that only
  records the signal and asks the event loop to stop); it calls ``pyfuse3.terminate`` only
  while pyfuse3 serves (from just after ``init`` until ``main`` returned), once. A signal
  before ``init`` means no mount at all; one after ``main`` returned is noted, nothing more.
- Once ``main`` returned (any cause): recalls stop, open files are committed, the hooks into
  pyfuse3 and libfuse (``opendir_reply``, ``kernel_opendir``) are taken out, and
  :func:`wait_notifications` lets both notification threads finish what they were sending,
  all before ``pyfuse3.close`` unmounts and destroys the session.
- Once the client is closed, before the event loop closes (and with it the pipe a signal
  wakes it through), :func:`ignore_stop_signals` sets SIGINT and SIGTERM to "ignore" for the
  rest of the process (which exits next): a late signal (``fusermount3 -u``
  and SIGTERM at once) cannot kill a mount that stopped cleanly. Until then the handler only
  records; the switch from it to "ignore" is one ``sigaction``, so no signal finds the default
  action in between (as one would after ``loop.remove_signal_handler``, or while Python
  finalizes: it resets its own handlers to the default, not "ignore").
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from types import FrameType

import pyfuse3

log = logging.getLogger("tectofs.fuse")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
notifications_wait_s = 5.0  # time for the notification threads to finish before the session goes

# The threads that send notifications through the session: KernelCache's executor
# (thread_name_prefix "tectofs-recall") and pyfuse3's invalidate_entry_async thread (an
# unnamed threading.Thread, so named after its target function).
_NOTIFYING_THREADS = ("tectofs-recall", "(_notify_loop)")


class Stopper:
    """SIGINT and SIGTERM for one mount, on the event loop ``loop`` (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.by: list[str] = []  # the stop signals received, in order
        self._serving = False
        self._terminated = False
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._signalled)

    def _signalled(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes, possibly inside pyfuse3's loop:
        # only record, and let the event loop stop pyfuse3 at its next turn.
        self.by.append(signal.Signals(signum).name)
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._stop)

    @property
    def stopping(self) -> bool:
        return bool(self.by)

    def serving(self) -> None:
        """``pyfuse3.init`` succeeded: from now on, a stop signal terminates pyfuse3's main
        loop (at once, if one arrived already)."""
        self._serving = True
        if self.by:
            self._stop()

    def served(self) -> None:
        """``pyfuse3.main`` returned: no call into the session from a signal any more."""
        self._serving = False

    def ended_by(self) -> str:
        """What ended pyfuse3's main loop: the first stop signal, or else an unmount."""
        return self.by[0] if self._terminated else "an unmount (fusermount3 -u)"

    def _stop(self) -> None:
        if self._serving and not self._terminated:
            self._terminated = True
            pyfuse3.terminate()
        elif self.by:
            log.debug("%s: the mount is not serving (any more); nothing to terminate", self.by[-1])

def ignore_stop_signals() -> None:
    """SIGINT and SIGTERM are ignored from now on, by the whole process (it is exiting)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def wait_notifications(timeout_s: float = notifications_wait_s) -> bool:
    """Wait until no thread sends notifications through libfuse's session (they end once
    recalls stopped and pyfuse3's main loop returned); False if one still runs after
    ``timeout_s`` (a notification the kernel holds back, waiting for a directory lock that a
    request left unanswered holds: closing the device ends that request)."""
    deadline = time.monotonic() + timeout_s
    for thread in threading.enumerate():
        notifying = thread.name.startswith(_NOTIFYING_THREADS[0]) or thread.name.endswith(_NOTIFYING_THREADS[1])
        if notifying and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s still sends a notification to the kernel after %.0f s; unmounting anyway",
                            thread.name, timeout_s)
                return False
    return True
