"""Exit statuses of ``tectofs`` and the one-line message for each expected failure.

Scripts can rely on these (``tectofs --help`` lists them):
"""

from __future__ import annotations

import errno
import re

OK = 0
FAILED = 1  # the operation failed: not found, permission denied, exists, not a directory, I/O ...
USAGE = 2  # bad options or arguments, no metadata service configured, bad config file
UNREACHABLE = 3  # the cluster could not be reached (refused, timed out, connection lost)
INTERNAL = 70  # a bug in tectofs (EX_SOFTWARE): -v or --log-level debug shows the traceback
INTERRUPTED = 130  # Ctrl-C (128 + SIGINT): nothing being written was published
BROKEN_PIPE = 141  # the reader of stdout went away, e.g. '| head' (128 + SIGPIPE), like coreutils

EPILOG = """exit status:
  0    success
  1    the operation failed (not found, permission denied, exists, I/O ...)
  2    usage or configuration error
  3    the cluster could not be reached
  70   internal error (a bug: -v shows the traceback)
  130  interrupted by Ctrl-C (nothing half-written is published)
  141  stdout closed early (e.g. '| head'), like coreutils
  'tectofs fsck' exits 1 for under-redundant blocks and 2 for unreadable ones; where
  another command exits 1 or 2 it exits 8 (the check failed, e.g. no such path) or 16
  (usage or configuration error), as e2fsck does."""

FSCK_FAILED = 8  # 'tectofs fsck' could not check (its 1 means under-redundant blocks)
FSCK_USAGE = 16  # 'tectofs fsck' was given bad options or configuration (its 2 means unreadable blocks)


def for_command(command: str, status: int) -> int:
    """``status`` as ``command`` exits with it: fsck's 1 and 2 are its findings, so its own
    failures move to 8 and 16 (e2fsck's operational and usage errors)."""
    if command == "fsck":
        return {FAILED: FSCK_FAILED, USAGE: FSCK_USAGE}.get(status, status)
    return status

# optional modules -> the extra that installs them
EXTRAS = {"pyfuse3": "fuse", "torch": "torch", "numpy": "torch", "aiohttp": "s3", "psycopg": "postgresql",
          "matplotlib": "bench", "fsspec": "fsspec", "lightning": "lightning"}
_WHAT = {"fuse": "the FUSE mount", "torch": "the PyTorch plugin", "s3": "the S3 gateway",
         "postgresql": "a PostgreSQL store", "bench": "the benchmark charts", "fsspec": "fsspec",
         "lightning": "the Lightning plugin"}
_ERRNO_PREFIX = re.compile(r"^\[Errno \d+\] ")


def one_line(text: str) -> str:
    """The lines of ``text`` joined with ``; `` (what every error message is written as)."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip()) or "failed"


def describe(exc: BaseException) -> tuple[str, int] | None:
    """``(message, status)`` for an expected failure; None for anything else (a bug). The
    message may span lines (a newline in a file name): the caller escapes it for the terminal
    (``output.shown``) and then makes it :func:`one_line`, so that on a terminal such a
    newline shows as ``?`` instead of splitting the name."""
    from tectofs.errors import ConnectionLost, TectofsError, Timeout
    from tectofs.wire.transport import WrongPeer

    from .common import UsageError
    from .config import ConfigError

    if isinstance(exc, (UsageError, ConfigError, WrongPeer)):  # WrongPeer: the address names another program
        return str(exc), USAGE
    if isinstance(exc, (ConnectionLost, Timeout, ConnectionRefusedError)):
        return str(exc), UNREACHABLE
    if isinstance(exc, TectofsError):
        return str(exc), FAILED
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        extra = EXTRAS.get(top)
        if extra is None:
            return None  # a module tectofs always needs is missing: a broken install, show everything
        return (f"{_WHAT[extra]} needs the '{extra}' extra, which is not installed (no module {top!r}):"
                f" pip install 'tectofs[{extra}]'" + (" (and the fuse3 package)" if extra == "fuse" else "")), FAILED
    if isinstance(exc, OSError):
        if exc.errno == errno.EADDRINUSE:
            return f"{_ERRNO_PREFIX.sub('', str(exc))} (another server is on that port: choose another with --port)", FAILED
        if exc.filename is not None and exc.strerror:
            return f"{exc.filename}: {exc.strerror}", FAILED
        return _ERRNO_PREFIX.sub("", str(exc)), FAILED
    return None
