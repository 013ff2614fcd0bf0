"""Which FUSE binding for a low-level, inode-based mount: the same in-memory file system served
through each, measured from one process.

    tectofs bench fuse-bindings                     # every binding, 3 rounds
    tectofs bench fuse-bindings --quick --rounds 1  # a smoke run: few files, 8 MiB
    python3 -m tectofs.benchmarks.fuse_bindings --bindings mfusepy pyfuse3-asyncio

The bindings (:data:`BINDINGS`; the file system and its adapters:
:mod:`tectofs.benchmarks.fuse_binding_servers`, :mod:`tectofs.benchmarks.memory_tree`):

- ``mfusepy``: libfuse3's high-level path API through ctypes, libfuse's worker threads (what
  ``tectofs mount`` runs on today), the handler doing the work itself;
- ``mfusepy-handoff``: the same, each request's work handed to an asyncio loop thread and
  waited for (``run_coroutine_threadsafe(...).result()``), as ``tectofs mount`` calls the
  client library;
- ``llfuse``, ``llfuse-handoff``: libfuse2's low-level inode API in Cython, worker threads
  (the hand-off waits with llfuse's global lock released);
- ``pyfuse3-asyncio``: libfuse3's low-level inode API in Cython in asyncio mode: the handlers
  are coroutines on the daemon's one event loop, the loop that reads ``/dev/fuse``;
- ``pyfuse3-trio``: the same on trio, pyfuse3's default (what the asyncio mode costs).

Each runs in a child process on a temporary mountpoint, all mounted before the first round
and unmounted (``fusermount3 -u``) after the last, even on failure. Kernel attribute and entry
timeouts are 0 in every binding, so every ``stat`` reaches the daemon; each mount's read-ahead
is raised to 1 MiB (as ``tectofs mount`` does); the page cache is dropped before each read
step (llfuse keeps it across opens). Rounds alternate the order of the bindings (first to last,
then last to first); figures are medians of ``--rounds`` rounds (default 3).

The steps, per binding and round:

- ``creates/s``: ``open(O_CREAT|O_EXCL|O_WRONLY)`` + ``close`` of ``--files`` (2,000) empty files
  in a new directory;
- ``stats/s``: ``os.stat`` of each of them;
- ``readdir s``: ``os.listdir`` of a directory of ``--listing-entries`` (10,000) empty files
  (made before the first round), then ``os.stat`` of every name;
- ``write MB/s``: a ``--size`` (256 MiB) file written in 1 MiB ``write`` calls, then closed;
- ``read MB/s``: read back in 1 MiB ``readinto`` calls, after dropping the page cache;
- ``untar s``: GNU ``tar -xf`` (as root: owners and modes restored, so per file create, write,
  ``futimens``, ``fchown``, ``fchmod``, close) of ``--tree-files`` (2,000) files of about 4 KiB
  in 20 directories.

Reported per binding and step: the median and each round's figure, the speed relative to
``mfusepy`` and to ``mfusepy-handoff`` (today's mount's shape; > 1: faster), and the daemon's
CPU time per operation (its utime + stime from
``/proc/PID/stat`` across the step; an operation is a file created, stat'ed, listed or
untarred, or a MiB written or read). A binding that is not installed is reported as
``not installed: <what to run>`` and the others run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from tectofs.benchmarks.common import drop_caches, parse_size, process_cpu_s, write_results
from tectofs.benchmarks.fuse_binding_servers import UNAVAILABLE_EXIT
from tectofs.benchmarks.report import Result

MiB = 1 << 20
CALL_BYTES = 1 * MiB            # bytes per write / readinto call
READ_AHEAD_KB = 1024            # each mount's read-ahead (tectofs mount raises its own alike)
DEFAULT_FILES = 2000
DEFAULT_LISTING = 10_000
DEFAULT_SIZE = 256 * MiB
DEFAULT_TREE_FILES = 2000
QUICK = {"files": 100, "listing": 300, "size": 8 * MiB, "tree_files": 100}
DEFAULT_ROUNDS = 3
ROUNDS_MAX = 100
COUNT_MAX = 1_000_000
TREE_DIRECTORIES = 20
TREE_FILE_BYTES = (3 << 10, 5 << 10)  # each tree file's size is drawn from this range (about 4 KiB)
TREE_SEED = 20240601
mount_wait_s = 30.0             # a daemon must have mounted within this
step_timeout_s = 600.0          # one step on one binding; past it the daemon is killed, the step fails
BASELINE = "mfusepy"
TODAY = "mfusepy-handoff"       # the shape of today's tectofs mount: path API, threads, a hand-off per request


@dataclass(frozen=True)
class Binding:
    """One way to serve the file system: ``server`` and ``hand_off`` are
    ``fuse_binding_servers``'s arguments; ``module`` must import; ``install`` says how."""

    server: str
    module: str
    install: str
    api: str
    hand_off: bool = False
    options: tuple[str, ...] = ()  # more of the server's options


_MFUSEPY_INSTALL = "apt-get install -y fuse3 && pip install mfusepy"
_LLFUSE_INSTALL = "apt-get install -y libfuse-dev pkg-config && pip install llfuse"
_PYFUSE3_INSTALL = "apt-get install -y libfuse3-dev pkg-config && pip install pyfuse3"
BINDINGS: dict[str, Binding] = {
    "mfusepy": Binding("mfusepy", "mfusepy", _MFUSEPY_INSTALL, "libfuse3 high-level (paths), ctypes, threads"),
    "mfusepy-handoff": Binding("mfusepy", "mfusepy", _MFUSEPY_INSTALL,
                               "libfuse3 high-level (paths), ctypes, threads + hand-off to an asyncio loop",
                               hand_off=True),
    "llfuse": Binding("llfuse", "llfuse", _LLFUSE_INSTALL, "libfuse2 low-level (inodes), Cython, threads"),
    "llfuse-handoff": Binding("llfuse", "llfuse", _LLFUSE_INSTALL,
                              "libfuse2 low-level (inodes), Cython, threads + hand-off to an asyncio loop",
                              hand_off=True),
    "pyfuse3-asyncio": Binding("pyfuse3", "pyfuse3", _PYFUSE3_INSTALL,
                               "libfuse3 low-level (inodes), Cython, coroutines on one asyncio loop"),
    "pyfuse3-trio": Binding("pyfuse3", "pyfuse3", _PYFUSE3_INSTALL,
                            "libfuse3 low-level (inodes), Cython, coroutines on trio (pyfuse3's default)",
                            options=("--trio",)),
}


@dataclass(frozen=True)
class Step:
    name: str
    unit: str          # of the figure: a rate ("ops/s", "MB/s") or "s"
    operation: str     # what CPU time is counted per


STEPS = (Step("creates/s", "ops/s", "create"), Step("stats/s", "ops/s", "stat"),
         Step("readdir s", "s", "entry"), Step("write MB/s", "MB/s", "MiB"), Step("read MB/s", "MB/s", "MiB"),
         Step("untar s", "s", "file"))


@dataclass(frozen=True)
class Sizes:
    files: int         # creates and stats
    listing: int       # entries of the listed directory
    size_bytes: int    # the file written and read
    tree_files: int    # files in the tarball

    def operations(self, step: str) -> int:
        """How many operations ``step`` does (its CPU time is reported per operation)."""
        return {"creates/s": self.files, "stats/s": self.files, "readdir s": self.listing,
                "write MB/s": max(1, self.size_bytes // MiB), "read MB/s": max(1, self.size_bytes // MiB),
                "untar s": self.tree_files}[step]


# ---------------------------------------------------------------------- the daemons


class Unavailable(Exception):
    """A binding that cannot run here; ``reason`` is its status."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def fuse_missing() -> str | None:
    """Why no FUSE file system can be mounted here (None: it can)."""
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is missing (apt-get install -y fuse3)"
    return None


def installed(binding: Binding) -> bool:
    return importlib.util.find_spec(binding.module) is not None


def version(binding: Binding) -> str:
    try:
        return f"{binding.module} {importlib.metadata.version(binding.module)}"
    except importlib.metadata.PackageNotFoundError:
        return binding.module


class Daemon:
    """One binding's file system served in a child process on ``mountpoint``."""

    def __init__(self, name: str, binding: Binding, mountpoint: str, log_path: str, stats_path: str) -> None:
        from tectofs.client.fuse import MountProcess, is_mounted

        self.name = name
        self.mountpoint = mountpoint
        self.stats_path = stats_path
        os.makedirs(mountpoint)
        command = [sys.executable, "-P", "-m", "tectofs.benchmarks.fuse_binding_servers", binding.server, mountpoint,
                   "--stats", stats_path, *(["--hand-off"] if binding.hand_off else []), *binding.options]
        from tectofs import children

        env = children.cli_env()
        env["FUSE_LIBRARY_NAME"] = "fuse3"  # mfusepy: libfuse3, also where libfuse2 (llfuse's) is installed
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, env=env)
        self.mount = MountProcess(process, mountpoint, log_path)
        deadline = time.monotonic() + mount_wait_s
        while not is_mounted(mountpoint):
            code = process.poll()
            if code is not None:
                tail = self.mount.log_tail(1000).strip()
                if code == UNAVAILABLE_EXIT:
                    raise Unavailable(f"not installed: {binding.install} ({tail.splitlines()[-1] if tail else ''})")
                raise Unavailable(f"not run: the daemon exited with {code} before mounting: {tail[-500:]}")
            if time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"not run: not mounted within {mount_wait_s:.0f} s: {self.mount.log_tail(500)}")
            time.sleep(0.05)
        _raise_read_ahead(mountpoint)

    @property
    def pid(self) -> int:
        return self.mount.pid

    def stop(self) -> dict[str, Any]:
        """Unmount and reap; what the daemon says it served (empty if it wrote nothing)."""
        self.mount.stop()
        try:
            with open(self.stats_path) as f:
                stats: dict[str, Any] = json.load(f)
                return stats
        except (OSError, ValueError):
            return {}


def _raise_read_ahead(mountpoint: str) -> None:
    """1 MiB read-ahead on the mount's device (the kernel's default, 128 KiB, would cut every
    binding's sequential reads into 128 KiB requests). Needs root; elsewhere it stays."""
    with contextlib.suppress(OSError):
        device = os.stat(mountpoint).st_dev
        with open(f"/sys/class/bdi/{os.major(device)}:{os.minor(device)}/read_ahead_kb", "w") as f:
            f.write(str(READ_AHEAD_KB))


@contextlib.contextmanager
def _deadline(daemon: Daemon, what: str) -> Iterator[None]:
    """Kill the daemon if the step runs past ``step_timeout_s`` (its syscalls then fail, with
    ENOTCONN, and the step with them); a step that ran past it raises even if it returned."""
    timer = threading.Timer(step_timeout_s, daemon.mount.process.kill)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if timer.finished.is_set() and daemon.mount.process.poll() is not None:
            raise TimeoutError(f"{what} took more than {step_timeout_s:.0f} s: daemon killed")


# ---------------------------------------------------------------------- the steps


def make_tarball(path: str, files: int) -> int:
    """A tar of ``files`` files of about 4 KiB in ``TREE_DIRECTORIES`` directories (owned by root,
    mode 0644, a fixed mtime), the same bytes every time; returns the bytes of the files."""
    rng = random.Random(TREE_SEED)
    total = 0
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for d in range(min(TREE_DIRECTORIES, files)):
            info = tarfile.TarInfo(f"tree/d{d:02d}")
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 1_700_000_000
            tar.addfile(info)
        for n in range(files):
            data = rng.randbytes(rng.randint(*TREE_FILE_BYTES))
            info = tarfile.TarInfo(f"tree/d{n % TREE_DIRECTORIES:02d}/f{n:05d}.py")
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, _Bytes(data))
            total += len(data)
    return total


class _Bytes:
    """A readable file over ``data`` (what ``TarFile.addfile`` reads)."""

    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.at = 0

    def read(self, size: int = -1) -> bytes:
        end = len(self.view) if size < 0 else min(len(self.view), self.at + size)
        piece = bytes(self.view[self.at:end])
        self.at = end
        return piece


def create_files(directory: str, count: int) -> list[str]:
    os.mkdir(directory)
    names = [os.path.join(directory, f"f{n:06d}") for n in range(count)]
    for name in names:
        os.close(os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    return names


def stat_files(names: list[str]) -> None:
    for name in names:
        os.stat(name)


def list_and_stat(directory: str, entries: int) -> None:
    listed = os.listdir(directory)
    if len(listed) != entries:
        raise RuntimeError(f"listed {len(listed)} of {entries} entries in {directory}")
    for name in listed:
        os.stat(os.path.join(directory, name))


def write_file(path: str, block: bytes, size: int) -> None:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    try:
        view = memoryview(block)
        done = 0
        while done < size:
            done += os.write(fd, view[:min(len(view), size - done)])
    finally:
        os.close(fd)


def read_file(path: str, size: int) -> None:
    buffer = bytearray(CALL_BYTES)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            total += n
    if total != size:
        raise RuntimeError(f"read {total} bytes of {size} from {path}")


def untar(tarball: str, directory: str) -> None:
    os.mkdir(directory)
    done = subprocess.run(["tar", "-xf", tarball, "-C", directory], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=step_timeout_s)
    if done.returncode:
        raise RuntimeError(f"tar -xf exited with {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")


def one_round(daemon: Daemon, r: int, sizes: Sizes, tarball: str, block: bytes) -> dict[str, tuple[float, float]]:
    """Every step once on ``daemon``'s mount: step -> (its figure, daemon CPU seconds)."""
    root = daemon.mountpoint
    names: list[str] = []
    big = os.path.join(root, f"big-{r}")

    def create() -> None:
        names.extend(create_files(os.path.join(root, f"creates-{r}"), sizes.files))

    actions: dict[str, Callable[[], None]] = {
        "creates/s": create,
        "stats/s": lambda: stat_files(names),
        "readdir s": lambda: list_and_stat(os.path.join(root, "listing"), sizes.listing),
        "write MB/s": lambda: write_file(big, block, sizes.size_bytes),
        "read MB/s": lambda: read_file(big, sizes.size_bytes),
        "untar s": lambda: untar(tarball, os.path.join(root, f"untar-{r}")),
    }
    figures = {}
    for step in STEPS:
        if step.name == "read MB/s":
            drop_caches()
        cpu = process_cpu_s(daemon.pid)
        with _deadline(daemon, f"{daemon.name} {step.name}"):
            started = time.perf_counter()
            actions[step.name]()
            seconds = time.perf_counter() - started
        used = process_cpu_s(daemon.pid) - cpu
        if step.unit == "ops/s":
            figures[step.name] = (sizes.files / seconds, used)
        elif step.unit == "MB/s":
            figures[step.name] = (sizes.size_bytes / seconds / 1e6, used)
        else:
            figures[step.name] = (seconds, used)
    os.unlink(big)  # 256 MiB of the daemon's memory
    return figures


# ---------------------------------------------------------------------- rounds


def _stop(daemon: Daemon, served: dict[str, dict[str, Any]]) -> None:
    served[daemon.name] = daemon.stop()


def run(out_dir: str, bindings: list[str] | tuple[str, ...] | None = None, rounds: int = DEFAULT_ROUNDS,
        sizes: Sizes = Sizes(DEFAULT_FILES, DEFAULT_LISTING, DEFAULT_SIZE, DEFAULT_TREE_FILES),
        work_dir: str | None = None, progress: Callable[[int], None] | None = None) -> Result:
    """Measure ``bindings`` (default: all of :data:`BINDINGS`) for ``rounds`` rounds; writes and
    returns ``fuse_bindings.json``'s result."""
    names = list(bindings or BINDINGS)
    assert rounds >= 1 and all(name in BINDINGS for name in names), names
    assert sizes.files >= 1 and sizes.listing >= 1 and sizes.size_bytes >= 1 and sizes.tree_files >= 1
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    cpu: dict[str, dict[str, list[float]]] = {name: {} for name in names}
    status: dict[str, str] = {}
    served: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    block = os.urandom(CALL_BYTES)
    caches_dropped = drop_caches()
    with tempfile.TemporaryDirectory(prefix="tectofs-bench-bindings-", dir=work_dir) as tmp, \
            contextlib.ExitStack() as stack:
        tarball = os.path.join(tmp, "tree.tar")
        tree_bytes = make_tarball(tarball, sizes.tree_files)
        daemons: dict[str, Daemon] = {}
        missing = fuse_missing()
        for name in names:
            binding = BINDINGS[name]
            if not installed(binding):
                status[name] = f"not installed: {binding.install}"
                continue
            if missing is not None:
                status[name] = f"not run: {missing}"
                errors.append(f"{name}: {status[name]}")
                continue
            try:
                daemon = Daemon(name, binding, os.path.join(tmp, name), os.path.join(tmp, f"{name}.log"),
                                os.path.join(tmp, f"{name}.stats.json"))
            except Unavailable as exc:
                status[name] = exc.reason
                if not exc.reason.startswith("not installed"):
                    errors.append(f"{name}: {exc.reason}")
                continue
            stack.callback(_stop, daemon, served)
            daemons[name] = daemon
            status[name] = "ran"
            try:  # the listed directory, made once (not timed)
                with _deadline(daemon, f"{name}: making the listed directory"):
                    create_files(os.path.join(daemon.mountpoint, "listing"), sizes.listing)
            except (OSError, RuntimeError) as exc:
                status[name] = f"failed making the listed directory: {type(exc).__name__}: {exc}"
                errors.append(f"{name}: {status[name]}")
        for r in range(rounds):
            order = list(daemons) if r % 2 == 0 else list(daemons)[::-1]
            for name in order:
                if status[name] == "ran":
                    try:
                        for step, (figure, used) in one_round(daemons[name], r, sizes, tarball, block).items():
                            figures[name].setdefault(step, []).append(figure)
                            cpu[name].setdefault(step, []).append(used)
                    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                        log = daemons[name].mount.log_tail(300).strip()
                        status[name] = (f"failed in round {r + 1}: {type(exc).__name__}: {exc}"
                                        + (f"; daemon log: {log}" if log else ""))
                        errors.append(f"{name}: {status[name]}")
                        print(f"fuse-bindings: {name}: {status[name]}", file=sys.stderr, flush=True)
                if progress is not None:
                    progress(1)
    result = summarize(names, rounds, sizes, figures, cpu, status, served, errors)
    result.update({"tree_bytes": tree_bytes, "caches_dropped": caches_dropped})
    write_results(out_dir, "fuse_bindings", result)
    return result


# ---------------------------------------------------------------------- results


def _significant(value: float) -> float:
    return float(f"{value:.4g}")


def speed_ratio(step: Step, figure: float | None, baseline: float | None) -> float | None:
    """How much faster than the baseline (> 1: faster): rates divided, seconds the other way."""
    if not figure or not baseline:
        return None
    return _significant(figure / baseline if step.unit != "s" else baseline / figure)


def summarize(names: list[str], rounds: int, sizes: Sizes, figures: dict[str, dict[str, list[float]]],
              cpu: dict[str, dict[str, list[float]]], status: dict[str, str], served: dict[str, dict[str, Any]],
              errors: list[str]) -> Result:
    """One row per binding and step: median, each round's figure, speed relative to
    :data:`BASELINE` and the daemon's CPU per operation (and relative to the baseline's)."""
    medians = {name: {step: statistics.median(values) for step, values in steps.items() if values}
               for name, steps in figures.items()}
    cpu_per_op = {name: {step: statistics.median(values) / sizes.operations(step) for step, values in steps.items()
                         if values} for name, steps in cpu.items()}
    rows: list[dict[str, Any]] = []
    ratios: dict[str, Any] = {}
    for step in STEPS:
        for name in names:
            median = medians.get(name, {}).get(step.name)
            base = medians.get(BASELINE, {}).get(step.name)
            today = medians.get(TODAY, {}).get(step.name)
            per_op = cpu_per_op.get(name, {}).get(step.name)
            base_per_op = cpu_per_op.get(BASELINE, {}).get(step.name)
            row: dict[str, Any] = {
                "what": f"{name} {step.name}", "binding": name, "step": step.name, "unit": step.unit,
                "median": None if median is None else _significant(median),
                "runs": [_significant(v) for v in figures.get(name, {}).get(step.name, [])],
                f"speed vs {BASELINE}": speed_ratio(step, median, base),
                f"speed vs {TODAY}": speed_ratio(step, median, today),
                "daemon CPU ms/op": None if per_op is None else _significant(per_op * 1000),
                "per": step.operation,
                f"CPU vs {BASELINE}": _significant(per_op / base_per_op) if per_op and base_per_op else None,
            }
            rows.append(row)
            if name != BASELINE and row[f"speed vs {BASELINE}"] is not None:
                ratios[f"{name} {step.name} speed / {BASELINE}"] = row[f"speed vs {BASELINE}"]
            if name not in (BASELINE, TODAY) and row[f"speed vs {TODAY}"] is not None:
                ratios[f"{name} {step.name} speed / {TODAY}"] = row[f"speed vs {TODAY}"]
    return {
        "benchmark": "fuse_bindings", "rounds": rounds, "files": sizes.files, "listing_entries": sizes.listing,
        "size_bytes": sizes.size_bytes, "tree_files": sizes.tree_files, "baseline": BASELINE, "today": TODAY,
        "steps": [step.name for step in STEPS],
        "bindings": {name: {"status": status.get(name, "not run"), "api": BINDINGS[name].api,
                            "version": version(BINDINGS[name]) if installed(BINDINGS[name]) else "",
                            "served": served.get(name, {})} for name in names},
        "rows": rows, "ratios": ratios, "targets": [], "errors": errors, "error_count": len(errors),
        "note": (f"medians of {rounds} round(s), bindings alternating order per round; one process measures; "
                 f"attribute and entry timeouts 0 in every binding; speed > 1: faster than {BASELINE}; daemon CPU "
                 f"per operation (a create, a stat, an entry listed and stat'ed, a MiB, a file untarred)"),
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"
    return str(value)


def print_summary(result: Result) -> None:
    """Two tables (a column per binding that ran): each step's median with its speed relative to
    the baseline, then the daemon's CPU per operation; then each binding's status."""
    names = list(result["bindings"])
    ran = [n for n in names if result["bindings"][n]["status"] == "ran" or
           result["bindings"][n]["status"].startswith("failed")]
    by = {(r["binding"], r["step"]): r for r in result["rows"]}
    baseline, today = result["baseline"], result.get("today", TODAY)
    for title, value_key, ratio_key, reference in (
            (f"median (speed vs {baseline}: > 1 faster)", "median", f"speed vs {baseline}", baseline),
            (f"speed vs {today} (today's mount: path API, threads, a hand-off per request; > 1 faster)", None,
             f"speed vs {today}", today),
            (f"daemon CPU ms per operation (vs {baseline}: < 1 less)", "daemon CPU ms/op", f"CPU vs {baseline}",
             baseline)):
        print(title)
        header = ["step", *ran]
        lines = []
        for step in result["steps"]:
            line = [step]
            for name in ran:
                row = by[(name, step)]
                if value_key is None:
                    line.append(_cell(row.get(ratio_key)) + ("x" if row.get(ratio_key) is not None else ""))
                    continue
                ratio = "" if name == reference or row[ratio_key] is None else f" ({_cell(row[ratio_key])}x)"
                line.append(_cell(row[value_key]) + ratio)
            lines.append(line)
        widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for line in lines:
            print("  ".join(c.ljust(w) for c, w in zip(line, widths)))
        print()
    for name in names:
        info = result["bindings"][name]
        served = info.get("served") or {}
        extra = ""
        if served:
            extra = (f"; largest write {served.get('largest_write_bytes', 0) // 1024} KiB, read "
                     f"{served.get('largest_read_bytes', 0) // 1024} KiB; threads running the file system: "
                     f"{served.get('threads_that_ran_the_tree')}")
        print(f"{name}: {info['status']}" + (f" ({info['version']}; {info['api']}{extra})" if info["version"] else ""))
    for error in result.get("errors") or []:
        print(f"error: {error}")
    print(result["note"])


# ---------------------------------------------------------------------- command line


def add_options(parser: argparse.ArgumentParser, standalone: bool) -> None:
    """The options of ``tectofs bench fuse-bindings`` (``standalone``: also those ``tectofs bench``
    shares: --files, --size, --rounds, --quick, --out, --work-dir)."""
    from tectofs.arguments import numbers

    parser.add_argument("--bindings", nargs="+", choices=list(BINDINGS), default=None,
                        help="fuse-bindings: which to measure (default: all; those not installed are reported so)")
    parser.add_argument("--listing-entries", type=numbers.count(1, COUNT_MAX), default=None,
                        help=f"fuse-bindings: entries of the listed directory (default {DEFAULT_LISTING:,}, "
                             f"--quick {QUICK['listing']})")
    parser.add_argument("--tree-files", type=numbers.count(1, COUNT_MAX), default=None,
                        help=f"fuse-bindings: files in the untarred tree (default {DEFAULT_TREE_FILES:,}, "
                             f"--quick {QUICK['tree_files']})")
    if standalone:
        parser.add_argument("--files", type=numbers.count(1, COUNT_MAX), default=None,
                            help=f"files created and stat'ed (default {DEFAULT_FILES:,}, --quick {QUICK['files']})")
        parser.add_argument("--size", type=parse_size, default=None, help="bytes written and read (default 256M)")
        parser.add_argument("--rounds", type=numbers.count(1, ROUNDS_MAX), default=None,
                            help=f"rounds, alternating the order of the bindings (default {DEFAULT_ROUNDS})")
        parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
        parser.add_argument("--out", default="bench-results", help="directory for fuse_bindings.json and .png")
        parser.add_argument("--work-dir", default=None, help="where the mountpoints live (default: temp dir)")


def sizes_from_args(args: argparse.Namespace) -> Sizes:
    quick = bool(args.quick)
    return Sizes(files=args.files or (QUICK["files"] if quick else DEFAULT_FILES),
                 listing=args.listing_entries or (QUICK["listing"] if quick else DEFAULT_LISTING),
                 size_bytes=args.size or (QUICK["size"] if quick else DEFAULT_SIZE),
                 tree_files=args.tree_files or (QUICK["tree_files"] if quick else DEFAULT_TREE_FILES))


def run_from_args(args: argparse.Namespace, progress: Callable[[int], None] | None = None) -> Result:
    """``tectofs bench fuse-bindings`` and ``python3 -m tectofs.benchmarks.fuse_bindings``."""
    return run(args.out, bindings=args.bindings, rounds=args.rounds or DEFAULT_ROUNDS, sizes=sizes_from_args(args),
               work_dir=args.work_dir, progress=progress)


def steps(args: argparse.Namespace) -> int:
    """Progress steps: one per binding and round."""
    return (args.rounds or DEFAULT_ROUNDS) * len(args.bindings or BINDINGS)


def main(argv: list[str] | None = None) -> int:
    from tectofs.arguments.parser import Parser
    from tectofs.benchmarks.charts import draw_chart
    from tectofs.benchmarks.common import work_dir

    parser = Parser(prog="python3 -m tectofs.benchmarks.fuse_bindings", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser, standalone=True)
    args = parser.parse_args(argv)
    args.work_dir = work_dir(args.work_dir)
    result = run_from_args(args)
    print_summary(result)
    png = draw_chart(result, os.path.join(args.out, "fuse_bindings.png"), "tectofs bench fuse-bindings")
    print(f"results {os.path.join(args.out, 'fuse_bindings.json')}" + (f", chart {png}" if png else ""))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
