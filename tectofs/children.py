"""Running tectofs in a child process: the same tectofs as the parent's.

``python -m tectofs.cli`` puts the working directory first on the child's module path, so a
child started from inside another checkout (a cluster started by a benchmark comparing two
revisions, run from the newer one's directory) would import that checkout's tectofs, not the
one its parent runs: an A/B would measure one tree twice. Children therefore start with
``-P`` (Python 3.11: no working directory on the path) and, when the parent's tectofs comes
from a source checkout, with that checkout first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli_command(*args: str) -> list[str]:
    """``python -P -m tectofs.cli ARGS``, with this process's interpreter."""
    return [sys.executable, "-P", "-m", "tectofs.cli", *args]


def cli_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with this process's tectofs checkout, if
    it runs from one, first on ``PYTHONPATH``. An installed tectofs (site-packages) is found
    the usual way: putting site-packages ahead of the standard library would be wrong."""
    env = dict(os.environ if base is None else base)
    if os.path.exists(os.path.join(_SOURCE_ROOT, "pyproject.toml")):
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != _SOURCE_ROOT]
        env["PYTHONPATH"] = os.pathsep.join([_SOURCE_ROOT, *paths])
    return env
