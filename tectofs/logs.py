"""Structured logging for every tectofs process: one line per event, as text, key=value or JSON.

``setup(level, fmt, file)`` configures the root logger once per process (calling it again
replaces what the previous call installed):

- ``text``: ``2026-12-01 08:07:27,123 tectofs.meta WARNING message`` (a traceback, when the
  event carries one, follows on its own lines);
- ``kv``: ``ts=2026-12-01T08:07:27.123Z level=warning logger=tectofs.meta msg="message" key=value``,
  where ``key=value`` are the ``extra=`` fields of the call; a traceback becomes one ``exc="..."``
  field, so every event stays one line;
- ``json``: one JSON object per line with the same fields (``ts``, ``level``, ``logger``,
  ``msg``, extras, ``exc``).

``file``: append to that file through a ``WatchedFileHandler`` (after logrotate moves the
file away, the next event reopens the path), else write to stderr. Level and format not given
fall back to ``$TECTOFS_LOG_LEVEL`` / ``$TECTOFS_LOG_FORMAT`` (so the servers ``tectofs up``
starts log like it), then WARNING / text.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

FORMATS = ("text", "kv", "json")
LEVELS = ("debug", "info", "warning", "error", "critical")
LEVEL_ENV = "TECTOFS_LOG_LEVEL"
FORMAT_ENV = "TECTOFS_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"

# Attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_installed: list[logging.Handler] = []
_file: str | None = None


def _timestamp(record: logging.LogRecord) -> str:
    """UTC, ISO 8601 with milliseconds: ``2026-12-01T08:07:27.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def fields(record: logging.LogRecord, formatter: logging.Formatter) -> dict[str, Any]:
    """The event as ordered fields: ts, level, logger, msg, the call's extras, exc (if any)."""
    out: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
                           "msg": record.getMessage()}
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_") and key not in out:
            out[key] = value
    if record.exc_info:
        out["exc"] = formatter.formatException(record.exc_info)
    elif record.exc_text:
        out["exc"] = record.exc_text
    if record.stack_info:
        out["stack"] = formatter.formatStack(record.stack_info)
    return out


def _kv_value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
    else:
        text = json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\\\n\t'):
        return text
    return json.dumps(text)  # quoted, with \" \\ \n escaped: still one line


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... msg="..." key=value`` (logfmt): one line per event."""

    def format(self, record: logging.LogRecord) -> str:
        items = fields(record, self)
        items["msg"] = json.dumps(items["msg"])  # always quoted, so the message is easy to find
        return " ".join(f"{key}={value if key == 'msg' else _kv_value(value)}" for key, value in items.items())


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``{"ts": ..., "level": ..., "logger": ..., "msg": ..., ...}``."""

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record, self), default=str)


def formatter(fmt: str) -> logging.Formatter:
    if fmt == "kv":
        return KeyValueFormatter()
    if fmt == "json":
        return JsonFormatter()
    if fmt == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {fmt!r}: use one of {', '.join(FORMATS)}")


def level_number(level: str) -> int:
    if level.lower() not in LEVELS:
        raise ValueError(f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")
    return int(getattr(logging, level.upper()))


def setup(level: str | None = None, fmt: str | None = None, file: str | None = None) -> None:
    """Configure the root logger: ``level`` (a name in :data:`LEVELS`), ``fmt`` (one of
    :data:`FORMATS`), ``file`` (append there, reopened after rotation; None: stderr). Raises
    ``ValueError`` for an unknown level or format and ``OSError`` if the file cannot be opened."""
    global _file
    level = level or os.environ.get(LEVEL_ENV) or "warning"
    fmt = fmt or os.environ.get(FORMAT_ENV) or "text"
    handler: logging.Handler
    chosen = formatter(fmt)
    number = level_number(level)
    if file:
        from logging.handlers import WatchedFileHandler  # only daemons that log to a file pay for it

        handler = WatchedFileHandler(file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(chosen)
    root = logging.getLogger()
    for old in _installed:
        root.removeHandler(old)
        old.close()
    _installed[:] = [handler]
    root.addHandler(handler)
    root.setLevel(number)
    _file = os.path.abspath(file) if file else None


def log_file() -> str | None:
    """The file :func:`setup` sends events to (absolute), or None when they go to stderr."""
    return _file


def state_dir() -> str:
    """Where a daemon without ``--log-file`` keeps its log: ``$XDG_STATE_HOME/tectofs``, else
    ``~/.local/state/tectofs`` (created, mode 0700)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    path = os.path.join(base, "tectofs")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path
