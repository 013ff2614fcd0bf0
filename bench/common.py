"""Helpers shared by the benchmarks: sizes, cache dropping, result tables and files.

Importing it makes a script run against the source tree it belongs to: from a checkout
(``python3 bench/X.py``), ``tectofs`` is imported from that checkout, not from whatever tree
is installed (an editable install of another clone) or from nowhere (nothing installed), and
so are the clusters, mounts and workers it starts (``PYTHONPATH``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any, Iterator

_HERE = os.path.dirname(os.path.abspath(__file__))
# TECTOFS_BENCH_TREE: the checkout to measure instead of this script's own (cpu_per_gb.py runs its
# children, with their clusters, against another revision's tree this way)
_TREE = os.environ.get("TECTOFS_BENCH_TREE") or os.path.dirname(_HERE)
if os.path.exists(os.path.join(_TREE, "tectofs", "__init__.py")):
    if _TREE not in sys.path:
        sys.path.insert(0, _TREE)
    _PATHS = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if sys.argv and os.path.dirname(os.path.abspath(sys.argv[0])) == _HERE and _PATHS[0] != _TREE:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_TREE, *_PATHS) if p)  # run as a script
try:
    _LOAD_AT_START: list[float] | None = [round(x, 2) for x in os.getloadavg()]
except OSError:
    _LOAD_AT_START = None


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def drop_caches() -> bool:
    """Drop the page cache so reads come from disk (root only); False where not allowed."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def print_table(result: dict[str, Any]) -> None:
    rows = result["rows"]
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths)))
    for name, value in result.get("ratios", {}).items():
        print(f"{name}: {value}")


def write_results(out_dir: str, name: str, result: dict[str, Any]) -> str:
    """``<out_dir>/<name>.json``, with commit, date, host and load average (before: when this
    process imported this module, for a script run alone; ``tectofs bench`` rewrites the file
    with the load average from just before each benchmark)."""
    from tectofs.bench import run_info

    result.update(run_info(_LOAD_AT_START))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    return path


def work_dir(path: str | None) -> str | None:
    """``--work-dir``, created if missing (``tectofs.bench.ensure_work_dir``)."""
    from tectofs.bench import ensure_work_dir

    return ensure_work_dir(path)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


@contextlib.contextmanager
def baseline_tree(revision: str) -> Iterator[str]:
    """A temporary git worktree of ``revision`` of this checkout (removed afterwards): the
    tree a same-run A/B measures against."""
    root = subprocess.run(["git", "-C", _HERE, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix="tectofs-bench-baseline-")
    tree = os.path.join(scratch, "tree")
    subprocess.run(["git", "-C", root, "worktree", "add", "--detach", tree, revision], capture_output=True, check=True)
    try:
        yield tree
    finally:
        subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def alternate(trees: dict[str, str], rounds: int, command: list[str], env: dict[str, dict[str, str]] | None = None,
              timeout_s: float = 3600) -> dict[str, dict[str, list[float]]]:
    """Run ``command`` (a child that prints one JSON object ``{key: [values]}`` as its last
    line) once per tree and round, alternating the order every round (first to last, then last
    to first), each child importing ``tectofs`` from its tree (``env``: more variables per
    name); the values of every key, gathered per tree name."""
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for r in range(rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            child_env = {**os.environ, "PYTHONPATH": trees[name], "TECTOFS_BENCH_TREE": trees[name],
                         **(env or {}).get(name, {})}
            print(f"round {r + 1}/{rounds}: {name} ...", flush=True)
            out = subprocess.run(command, env=child_env, cwd=trees[name], capture_output=True, text=True,
                                 timeout=timeout_s)
            if out.returncode:
                raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
            for key, values in json.loads(out.stdout.strip().splitlines()[-1]).items():
                runs[name].setdefault(key, []).extend(values)
    return runs
