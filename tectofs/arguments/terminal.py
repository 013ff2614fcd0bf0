"""How a name is written where a person may read it (``shown``): what every ``tectofs`` command and
the argument parser's usage errors write names through."""

from __future__ import annotations

import sys
from typing import TextIO


def shown(text: object, stream: TextIO | None = None) -> str:
    """``text`` (a file name, a path, a user or server name, a message quoting one) as it may
    be written to ``stream`` (default: stdout). Every command writes such strings through this.

    On a terminal, each character that is not printable (``str.isprintable``: controls such
    as ESC, newline, tab and DEL, format characters such as U+202E, separators other than
    the space) is shown as ``?``: a name can then neither drive the terminal (ESC sequences
    set colours, titles, the clipboard) nor fake lines of output. Anywhere else (a pipe, a
    file, a script) the text is written unchanged, and ``--json`` is exact everywhere.

    This is what coreutils ``ls -q`` does, POSIX's permitted default for a terminal; chosen
    over coreutils' shell-escape quoting (``'a'$'\033''b'``) because it replaces character
    for character, so it works inside longer lines (``ls -l`` columns, ``status`` rows, error
    messages) without quoting the rest, and leaves ordinary names untouched. It is lossy
    (``a\nb`` and ``a\tb`` both show as ``a?b``): the exact name is in ``--json`` output or
    through a pipe."""
    text = str(text)
    if text.isprintable() or not _is_terminal(sys.stdout if stream is None else stream):
        return text
    return "".join(c if c.isprintable() else "?" for c in text)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (ValueError, OSError):  # closed, or not a file at all
        return False
