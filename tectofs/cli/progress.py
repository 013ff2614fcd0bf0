"""One progress line on stderr for a whole transfer: ``12.0/96.0 MiB  12%  85.3 MiB/s  ETA 0:01  name``.

Shown only when asked and stderr is a terminal (a script or a log file never gets
carriage returns); redrawn at most 10 times a second; cleared at the end, so what the
command prints afterwards starts on a clean line. Units are powers of 1024 and say so.
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, TextIO

from .output import human, shown


class Progress:
    """``update(n)`` as bytes move; ``close()`` (or leaving ``with``) clears the line."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled and self.stream.isatty()
        self.total = total
        self.done = 0
        self.name = ""
        self.started = time.monotonic()
        self._drawn = 0.0
        self._width = 0

    def describe(self, name: str) -> None:
        """Name the file now moving (shown at the end of the line)."""
        self.name = shown(name, self.stream)  # drawn only on a terminal
        self._draw(force=True)

    def update(self, n: int) -> None:
        self.done += n
        self._draw()

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        percent = f"{100 * self.done // self.total:3d}%" if self.total else "   -"
        left = (self.total - self.done) / rate if rate > 0 and self.total >= self.done else 0
        eta = f"ETA {int(left) // 60}:{int(left) % 60:02d}"
        return f"{human(self.done)}/{human(self.total)} {percent} {human(rate)}/s {eta}  {self.name}"

    def _draw(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._drawn < 0.1:
            return
        self._drawn = now
        columns = shutil.get_terminal_size((80, 24)).columns - 1
        text = self.line()[:columns]
        self.stream.write("\r" + text + " " * max(0, self._width - len(text)))
        self.stream.flush()
        self._width = len(text)

    def close(self) -> None:
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
