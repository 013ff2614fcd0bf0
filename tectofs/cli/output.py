"""How the client commands show things: names on a terminal, permission strings, sizes, times, JSON.

Pure functions over ``tectofs.client.Stat``-like objects (``kind``, ``mode``, ``size`` ...),
so they import nothing heavy and are easy to test.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterable

from tectofs.arguments.terminal import shown as shown  # shared with the argument parser's usage errors

_KIND_LETTER = {"dir": "d", "file": "-", "symlink": "l", "fifo": "p", "socket": "s", "char": "c", "block": "b"}


def human(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: powers of 1024, named as such."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def short_human(n: float) -> str:
    """``ls -h`` / ``du -h`` style, no space: ``512``, ``1.5K``, ``12M``, ``3.0G`` (powers of 1024)."""
    for unit in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1024 or unit == "P":
            if not unit:
                return str(int(n))
            return f"{n:.1f}{unit}" if abs(n) < 10 else f"{n:.0f}{unit}"
        n /= 1024
    return str(n)


def permissions(kind: str, mode: int) -> str:
    """``("file", 0o100644)`` -> ``"-rw-r--r--"``, with setuid/setgid/sticky as ``s``/``S``, ``t``/``T``."""
    chars = [_KIND_LETTER.get(kind, "?")]
    for shift, special, mark in ((6, 0o4000, "s"), (3, 0o2000, "s"), (0, 0o1000, "t")):
        bits = (mode >> shift) & 7
        chars += ["r" if bits & 4 else "-", "w" if bits & 2 else "-"]
        execute = bool(bits & 1)
        if mode & special:
            chars.append(mark if execute else mark.upper())
        else:
            chars.append("x" if execute else "-")
    return "".join(chars)


def octal(mode: int) -> str:
    """``0o100644`` -> ``"0644"`` (permission and setuid/setgid/sticky bits)."""
    return f"{mode & 0o7777:04o}"


def local_time(epoch: float, precise: bool = False) -> str:
    """``2026-12-01 08:07`` in local time; ``precise``: ``2026-12-01 08:07:27.123456 +0000``."""
    t = time.localtime(epoch)
    if not precise:
        return time.strftime("%Y-%m-%d %H:%M", t)
    return time.strftime("%Y-%m-%d %H:%M:%S", t) + f".{int(epoch % 1 * 1e6):06d} " + time.strftime("%z", t)


def iso_utc(epoch: float) -> str:
    """``2026-12-01T08:07:27.123456Z``: what the JSON output carries beside the epoch seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch)) + f".{int(epoch % 1 * 1e6):06d}Z"


def stat_dict(st: Any, **more: Any) -> dict[str, Any]:
    """Every field of a ``Stat``, plus ``mode_octal``, ``permissions`` and ``*_iso`` times."""
    out = dict(vars(st))
    out["mode_octal"] = octal(st.mode)
    out["permissions"] = permissions(st.kind, st.mode)
    for key in ("atime", "mtime", "ctime"):
        out[f"{key}_iso"] = iso_utc(getattr(st, key))
    out.update(more)
    return out


def print_json(value: Any) -> None:
    """One JSON document on stdout (indented, keys in the order given)."""
    json.dump(value, sys.stdout, indent=1, default=str)
    sys.stdout.write("\n")


def print_json_array(items: Iterable[Any]) -> None:
    """A JSON array written as ``items`` come, so a huge listing never sits in memory."""
    out = sys.stdout
    out.write("[")
    for i, item in enumerate(items):
        out.write("\n " if i == 0 else ",\n ")
        out.write(json.dumps(item, default=str))
    out.write("\n]\n")
