"""Helpers shared by the benchmarks: sizes, cache dropping, result tables and files, and the
same-run A/B against another revision (:func:`baseline_tree`, :func:`alternate`).

Imported as ``tectofs.benchmarks.common``: a benchmark measures the ``tectofs`` it is imported
with (a checkout's, run from its root as ``python3 -m tectofs.benchmarks.X``; an installed
one), and so do the clusters, mounts and workers it starts (``tectofs.children``).
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

from tectofs.benchmarks.report import ensure_work_dir, run_info

_HERE = os.path.dirname(os.path.realpath(__file__))  # bench/ of the checkout, or the installed package
try:
    _LOAD_AT_START: list[float] | None = [round(x, 2) for x in os.getloadavg()]
except OSError:
    _LOAD_AT_START = None


def _refuse_another_trees_script() -> None:
    """``python3 bench/X.py`` runs X.py of one tree with whichever ``tectofs`` is importable,
    maybe another tree's (an editable install of another clone), whose benchmarks, clusters
    and client it would then measure: refuse that mix, saying how to run it."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path is None or getattr(main, "__spec__", None) is not None:  # python -m, or not a script
        return
    script_dir = os.path.dirname(os.path.realpath(path))
    if script_dir == _HERE or not os.path.exists(os.path.join(script_dir, "common.py")):
        return
    name = os.path.splitext(os.path.basename(path))[0]
    tree = os.path.dirname(script_dir)
    raise SystemExit(f"{path} belongs to {tree}, but tectofs is imported from {os.path.dirname(_HERE)}: run "
                     f"'python3 -m tectofs.benchmarks.{name}' in {tree}, or set PYTHONPATH={tree}")


_refuse_another_trees_script()


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
    result.update(run_info(_LOAD_AT_START))
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2, default=str)
    return path


def work_dir(path: str | None) -> str | None:
    """``--work-dir``, created if missing (:func:`tectofs.benchmarks.report.ensure_work_dir`)."""
    return ensure_work_dir(path)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def source_tree() -> str:
    """The source checkout these benchmarks belong to (the root above ``bench/``); a clear
    error when they run from an installed package, which has no revisions to compare."""
    tree = os.path.dirname(_HERE)
    if not os.path.exists(os.path.join(tree, "tectofs", "__init__.py")):
        raise SystemExit(f"{_HERE} is not in a source checkout of tectofs: an A/B against another revision "
                         "runs from a git checkout (python3 -m tectofs.benchmarks.NAME from its root)")
    return tree


@contextlib.contextmanager
def baseline_tree(revision: str) -> Iterator[str]:
    """A temporary git worktree of ``revision`` of this checkout (removed afterwards): the
    tree a same-run A/B measures against. Its ``tectofs/benchmarks`` is made a link to these
    benchmarks, whatever the revision had there (nothing, before the benchmarks were a
    package; its own ``bench/`` after): both arms run this tree's benchmark code (the same
    workload), each against its own tree's tectofs."""
    root = subprocess.run(["git", "-C", source_tree(), "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, check=True).stdout.strip()
    scratch = tempfile.mkdtemp(prefix="tectofs-bench-baseline-")
    tree = os.path.join(scratch, "tree")
    subprocess.run(["git", "-C", root, "worktree", "add", "--detach", tree, revision], capture_output=True, check=True)
    try:
        benchmarks = os.path.join(tree, "tectofs", "benchmarks")
        if os.path.isdir(benchmarks) and not os.path.islink(benchmarks):
            shutil.rmtree(benchmarks)
        elif os.path.lexists(benchmarks):
            os.remove(benchmarks)
        os.symlink(_HERE, benchmarks)
        yield tree
    finally:
        subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)


def alternate(trees: dict[str, str], rounds: int, module: str, args: list[str],
              env: dict[str, dict[str, str]] | None = None, timeout_s: float = 3600) -> dict[str, dict[str, list[float]]]:
    """Run ``python -m module args`` (a child that prints one JSON object ``{key: [values]}``
    as its last line) once per tree and round, alternating the order every round (first to
    last, then last to first), each child importing ``tectofs`` from its tree (``env``: more
    variables per name); the values of every key, gathered per tree name. ``module`` is one
    of ``tectofs.benchmarks``: a baseline tree has this tree's (:func:`baseline_tree`)."""
    assert module.startswith("tectofs.benchmarks."), module
    runs: dict[str, dict[str, list[float]]] = {name: {} for name in trees}
    for r in range(rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            child_env = {**os.environ, "PYTHONPATH": trees[name], **(env or {}).get(name, {})}
            print(f"round {r + 1}/{rounds}: {name} ...", flush=True)
            # -P: nothing but PYTHONPATH ahead of the standard library (not the working directory)
            out = subprocess.run([sys.executable, "-P", "-m", module, *args], env=child_env, cwd=trees[name],
                                 capture_output=True, text=True, timeout=timeout_s)
            if out.returncode:
                raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
            for key, values in json.loads(out.stdout.strip().splitlines()[-1]).items():
                runs[name].setdefault(key, []).extend(values)
    return runs


def fs_type(path: str) -> str:
    """The file system type of the mount holding ``path`` (from /proc/self/mounts)."""
    path, best, kind = os.path.realpath(path), "", "?"
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and (path == fields[1] or path.startswith(fields[1].rstrip("/") + "/")) \
                        and len(fields[1]) >= len(best):
                    best, kind = fields[1], fields[2]
    except OSError:
        pass
    return kind
