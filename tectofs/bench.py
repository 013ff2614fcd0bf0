"""``tectofs bench``: the one entry point to every benchmark.

    tectofs bench client-io --out results/          # one large file: client vs local disk
    tectofs bench checkpoint --out results/         # DCP save/load through the plugin
    tectofs bench fuse --out results/               # one stream through the mount; creates/stats/unlinks
    tectofs bench fuse --metadata-only --files 2000 # just creates/s, stats/s, unlinks/s vs. a local directory
    tectofs bench burst --out results/              # N ranks checkpoint at once
    tectofs bench repair --out results/             # rebuild throughput; a save during a rebuild
    tectofs bench all --out results/ --quick        # everything, small sizes

Each benchmark shows a progress bar while it runs, then prints a table, writes
``<out>/<name>.json`` and draws ``<out>/<name>.png``. Results are ratios against baselines
measured in the same run (a local file, one large client stream), because this kind of
machine is shared and absolute figures drift 20-40% between runs.

Targets are printed as met / NOT met (in the table, the summary and the chart) and a
benchmark's summary line never says "ok": it says whether its targets were met. GB/s is
10^9 bytes per second, MiB 2^20 bytes. Every JSON records the commit, the date (UTC), the
host and the load average before and after the run. Figures are medians of at least 3 runs.

The benchmarks themselves are the scripts in the source tree's ``bench/`` directory (they
also run alone: ``python bench/burst.py --help``); a built package ships them as
``tectofs/benchmarks/``. This module imports them by path from whichever is there.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from types import ModuleType
from typing import Any, Callable

MiB = 1 << 20
BENCHMARKS = ("client-io", "checkpoint", "fuse", "burst", "repair")
MIN_SAMPLES = 3  # medians: every figure a ratio uses is the median of at least this many runs
_REPEATS_MAX = 1000  # --repeats: more runs per figure than anyone waits for
_PROCESSES_MAX = 1024  # --processes (burst): worker processes
_FILES_MAX = 10_000_000  # --files (fuse): files per metadata run
UNITS = "GB/s = 10^9 bytes/s; MiB = 2^20 bytes; s = seconds (wall clock)"


class BenchmarkMissing(Exception):
    """A benchmark script is in neither the installed package nor a source tree."""


def bench_dir() -> str:
    """Where the benchmark scripts are: ``tectofs/benchmarks/`` in a built (wheel) install,
    else ``bench/`` of the source tree this package runs from (a checkout, an editable install)."""
    package = os.path.dirname(os.path.realpath(__file__))
    shipped = os.path.join(package, "benchmarks")
    if os.path.exists(os.path.join(shipped, "common.py")):
        return shipped
    return os.path.join(os.path.dirname(package), "bench")


def load_script(name: str) -> ModuleType:
    """Import ``<bench_dir()>/<name>.py`` by path (the scripts import each other as top-level modules)."""
    path = os.path.join(bench_dir(), f"{name}.py")
    if not os.path.exists(path):
        raise BenchmarkMissing(
            f"{path} not found: this tectofs install has no benchmarks; run them from a source checkout "
            f"of tectofs (its bench/ directory; pip install -e '.[bench,torch]' there)"
        )
    module_name = f"tectofs_bench_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


# ---------------------------------------------------------------------- where and when a run happened


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_info(load_before: list[float] | None) -> dict[str, Any]:
    """What a result file records besides its figures: ``commit`` (``git rev-parse HEAD`` of
    the source tree this package runs from, else the package version), ``date`` (UTC, ISO
    8601), ``host`` and ``load_average`` before and after the run."""
    return {
        **_commit(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "kernel": platform.release(),
                 "python": platform.python_version()},
        "load_average": {"before": load_before, "after": load_average()},
        "units": UNITS,
    }


def _commit() -> dict[str, Any]:
    tree = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    try:
        top, sha = subprocess.run(["git", "-C", tree, "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                                  text=True, timeout=10, check=True).stdout.split()
        if os.path.realpath(top) != tree:  # an installed package inside some other repository
            raise ValueError(top)
        dirty = subprocess.run(["git", "-C", tree, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
        return {"commit": sha, "commit_source": "git", "uncommitted_changes": bool(dirty)}
    except (OSError, ValueError, subprocess.SubprocessError):
        from importlib.metadata import PackageNotFoundError, version

        try:
            return {"commit": f"tectofs {version('tectofs')}", "commit_source": "package version"}
        except PackageNotFoundError:
            return {"commit": "unknown", "commit_source": "none (not a git checkout, not installed)"}


def ensure_work_dir(path: str | None) -> str | None:
    """Create ``--work-dir`` (and its parents) if it does not exist; a clear error if it cannot be."""
    if path is None:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise SystemExit(f"tectofs bench: cannot create --work-dir {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SystemExit(f"tectofs bench: --work-dir {path} is not writable")
    return path


# ---------------------------------------------------------------------- targets


def target(name: str, measured: float | None, at_least: float | None = None, at_most: float | None = None,
           unit: str = "x") -> dict[str, Any]:
    """One target of a result: ``{"name", "measured", "target", "met"}``; a missing or NaN
    measurement is not met."""
    value = _numeric(measured)
    if at_least is not None:
        assert at_most is None
        met, needs = value is not None and value >= at_least, f">= {at_least:g}{unit}"
    else:
        assert at_most is not None
        met, needs = value is not None and value <= at_most, f"<= {at_most:g}{unit}"
    return {"name": name, "measured": None if value is None else round(value, 4), "target": needs, "met": met}


def targets_of(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The result's targets: its ``targets`` list, else the older ``targets_met`` {name: bool}."""
    if result.get("targets") is not None:
        return list(result["targets"])
    return [{"name": name, "measured": None, "target": name, "met": bool(met)}
            for name, met in (result.get("targets_met") or {}).items()]


def verdict(met: bool) -> str:
    return "met" if met else "NOT met"


def _show(measured: float | None) -> str:
    return "-" if measured is None else f"{measured:.4g}"


def print_targets(result: dict[str, Any]) -> None:
    """The targets as a table: what, measured, needed, met / NOT met."""
    targets = targets_of(result)
    if not targets:
        return
    rows = [{"target": t["name"], "measured": _show(t.get("measured")), "needs": t["target"],
             "verdict": verdict(t["met"])} for t in targets]
    widths = {k: max(len(k), *(len(r[k]) for r in rows)) for k in rows[0]}
    print("  ".join(k.ljust(w) for k, w in widths.items()))
    for r in rows:
        print("  ".join(r[k].ljust(w) for k, w in widths.items()))
    unmet = sum(not t["met"] for t in targets)
    print(f"targets: {len(targets) - unmet} of {len(targets)} met" + (f", {unmet} NOT met" if unmet else ""))


def summary_state(entry: dict[str, Any]) -> str:
    """The one word (or few) the summary shows for a benchmark: never "ok" while a target is unmet."""
    if entry.get("skipped"):
        return "skipped"
    if entry.get("error") and "targets" not in entry:
        return "FAILED"
    parts = [f"{entry['error_count']} ERRORS"] if entry.get("error_count") else []
    targets = entry.get("targets") or []
    unmet = sum(not t["met"] for t in targets)
    if not targets:
        parts.append("ran, no targets")
    elif unmet:
        parts.append(f"targets NOT met ({unmet} of {len(targets)})")
    else:
        parts.append(f"targets met ({len(targets)} of {len(targets)})")
    return "; ".join(parts)


# ---------------------------------------------------------------------- progress, tables, charts


class _Progress:
    """A tqdm bar when tqdm is installed; otherwise one line per step."""

    def __init__(self, name: str, total: int | None) -> None:
        self.name = name
        self.total = total
        self.done = 0
        try:
            from tqdm import tqdm

            self.bar: Any = tqdm(total=total, desc=name, unit="step", dynamic_ncols=True, file=sys.stderr)
        except ImportError:
            self.bar = None

    def __call__(self, n: int = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        else:
            print(f"{self.name}: {self.done}/{self.total or '?'}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def print_result(result: dict[str, Any]) -> None:
    rows = result.get("rows") or []
    if rows:
        keys = list(rows[0])
        cells = [[_cell(r.get(k)) for k in keys] for r in rows]
        widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        print("  ".join(k.ljust(w) for k, w in zip(keys, widths)))
        for c in cells:
            print("  ".join(v.ljust(w) for v, w in zip(c, widths)))
    for name, value in (result.get("ratios") or {}).items():
        print(f"{name}: {value}")
    errors = result.get("errors") or []
    if errors:
        print(f"errors: {len(errors)}")
        for error in errors[:10]:
            print(f"  {error}")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:.3f}"
    if isinstance(value, list):
        return " ".join(_cell(v) for v in value)
    return "-" if value is None else str(value)


def _numeric(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value else None


BASELINE_COLOUR, TECTOFS_COLOUR, LATENCY_COLOUR = "#9a9a9a", "#4C72B0", "#DD8452"
MET_COLOUR, UNMET_COLOUR = "#2ca02c", "#d62728"


def is_baseline(label: str) -> bool:
    """A row measured without tectofs: a local file or directory, DCP or torch.save on local disk."""
    text = label.lower()
    return "local" in text or text.startswith("baseline")


def draw_chart(result: dict[str, Any], path: str, title: str) -> str | None:
    """A PNG of the result; returns the path, or None when matplotlib is missing or there is
    nothing to draw. See ``chart_figure``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install 'tectofs[bench]')", file=sys.stderr)
        return None
    figure = chart_figure(plt, result, title)
    if figure is None:
        return None
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def chart_figure(plt: Any, result: dict[str, Any], title: str) -> Any:
    """The figure ``draw_chart`` saves: the targets (met in green, NOT met in red) on top, then
    throughput bars (GB/s or ops/s) and, on an axis of their own, latencies in seconds, never
    drawn as a throughput of 0. Baselines and tectofs rows have their own colours and a legend."""
    burst = result.get("benchmark") == "burst"
    panels = _burst_panels(result) if burst else _row_panels(result)
    if not panels:
        return None
    targets = targets_of(result)
    heights = [0.28 * len(targets) + 0.3] if targets else []
    heights += [0.42 * max(len(p["labels"]), 2) + 1.0 for p in panels]
    figure = plt.figure(figsize=(10, sum(heights) + 0.9), layout="constrained")
    grid = figure.add_gridspec(len(heights), 1, height_ratios=heights)
    row = 0
    if targets:
        _targets_axis(figure.add_subplot(grid[0]), targets)
        row = 1
    for i, panel in enumerate(panels):
        axis = figure.add_subplot(grid[row + i])
        colours = [panel["colour"](label) for label in panel["labels"]]
        bars = axis.barh(panel["labels"], panel["values"], color=colours)
        axis.invert_yaxis()
        axis.bar_label(bars, fmt="%.3g", padding=3)
        axis.set_xlabel(panel["unit"])
        axis.set_title(panel["title"], fontsize=9, loc="left")
        axis.margins(x=0.15)
        legend = [(label, colour) for label, colour in panel["legend"] if colour in colours]
        axis.legend(handles=_legend_handles(legend), fontsize=8, loc="lower right")
    if burst:
        title += (f": {result.get('ranks')} ranks x {(result.get('shard_bytes') or 0) / MiB:g} MiB, "
                  f"errors {result.get('error_count', 0)}")
    ratios = result.get("ratios") or {}
    subtitle = "; ".join(f"{k}: {v}" for k, v in list(ratios.items())[:4])
    figure.suptitle(title + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    return figure


def _legend_handles(entries: list[tuple[str, str]]) -> list[Any]:
    from matplotlib.patches import Patch

    return [Patch(color=colour, label=label) for label, colour in entries]


def _targets_axis(axis: Any, targets: list[dict[str, Any]]) -> None:
    axis.axis("off")
    step = 1.0 / max(1, len(targets))
    for i, t in enumerate(targets):
        measured = "" if t.get("measured") is None else f": {_show(t['measured'])}"
        text = f"target {t['name']}{measured} (needs {t['target']}): {verdict(t['met'])}"
        axis.text(0.0, 1.0 - (i + 0.5) * step, text, va="center", fontsize=9,
                  color=MET_COLOUR if t["met"] else UNMET_COLOUR, fontweight="normal" if t["met"] else "bold")


def _row_panels(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows split by what they measured: a rate (GB/s, ops/s) or only a time (seconds)."""
    rows = result.get("rows") or (result.get("metadata") or {}).get("rows") or []
    if not rows:
        return []
    keys = list(rows[0])
    label_key = next((k for k in keys if isinstance(rows[0][k], str)), keys[0])
    rate_key = next((k for k in keys if "/s" in k and any(_numeric(r.get(k)) is not None for r in rows)), None)
    time_key = next((k for k in keys if (k.endswith("_s") or k.endswith(" s")) and
                     any(_numeric(r.get(k)) is not None for r in rows)), None)
    rates, times = [], []
    for r in rows:
        if rate_key is not None and _numeric(r.get(rate_key)) is not None:
            rates.append((str(r[label_key]), _numeric(r[rate_key])))
        elif time_key is not None and _numeric(r.get(time_key)) is not None:
            times.append((str(r[label_key]), _numeric(r[time_key])))

    def colour(label: str) -> str:
        return BASELINE_COLOUR if is_baseline(label) else TECTOFS_COLOUR

    panels = []
    if rates:
        unit = f"{rate_key} (GB = 10^9 bytes)" if "GB/s" in str(rate_key) else str(rate_key)
        panels.append({"title": "throughput (higher is better)", "unit": unit, "labels": [n for n, _ in rates],
                       "values": [v for _, v in rates], "colour": colour,
                       "legend": [("baseline (no tectofs)", BASELINE_COLOUR), ("tectofs", TECTOFS_COLOUR)]})
    if times:
        panels.append({"title": "latency (lower is better)", "unit": f"seconds ({time_key})",
                       "labels": [n for n, _ in times], "values": [v for _, v in times],
                       "colour": lambda label: BASELINE_COLOUR if is_baseline(label) else LATENCY_COLOUR,
                       "legend": [("baseline (no tectofs)", BASELINE_COLOUR), ("tectofs latency", LATENCY_COLOUR)]})
    return panels


def _burst_panels(result: dict[str, Any]) -> list[dict[str, Any]]:
    base = result.get("baseline") or {}
    phases = result.get("phases") or {}
    save, load = phases.get("save") or {}, phases.get("load") or {}
    ranks = result.get("ranks")
    rates = [("1 client write (baseline)", base.get("write_GBps")), ("1 client read (baseline)", base.get("read_GBps")),
             (f"{ranks} ranks save", save.get("aggregate_GBps")), (f"{ranks} ranks load", load.get("aggregate_GBps"))]
    rates = [(n, _numeric(v)) for n, v in rates if _numeric(v) is not None]
    times = []
    for name, series in (("save", save.get("latency_s")), ("close/commit", save.get("close_latency_s")),
                         ("commit RPC", save.get("rpc_commit_s")), ("load", load.get("latency_s"))):
        for q in ("p50", "p99", "max"):
            value = _numeric((series or {}).get(q))
            if value is not None:
                times.append((f"{name} {q}", value))
    panels = []
    if rates:
        panels.append({"title": "aggregate throughput vs. one large client (higher is better)",
                       "unit": "GB/s (10^9 bytes/s, aggregate)", "labels": [n for n, _ in rates],
                       "values": [v for _, v in rates],
                       "colour": lambda label: BASELINE_COLOUR if "baseline" in label else TECTOFS_COLOUR,
                       "legend": [("baseline: one client, one large file", BASELINE_COLOUR),
                                  ("burst of ranks", TECTOFS_COLOUR)]})
    if times:
        panels.append({"title": f"per-rank latency, {ranks} ranks (save, load: from the barrier; lower is better)",
                       "unit": "seconds", "labels": [n for n, _ in times], "values": [v for _, v in times],
                       "colour": lambda label: LATENCY_COLOUR, "legend": [("tectofs latency", LATENCY_COLOUR)]})
    return panels


# ---------------------------------------------------------------------- the benchmarks


def _call(run: Callable[..., dict[str, Any]], out_dir: str, **kwargs: Any) -> dict[str, Any]:
    """Call ``run(out_dir, ...)`` with the keyword arguments it accepts."""
    parameters = inspect.signature(run).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return run(out_dir, **kwargs)
    return run(out_dir, **{k: v for k, v in kwargs.items() if k in parameters})


def samples(args: argparse.Namespace) -> int:
    """Runs per figure: ``--repeats``, else 3, --quick included (its sizes are smaller, not its
    sample count: every figure is a median of at least ``MIN_SAMPLES`` runs)."""
    return max(MIN_SAMPLES, args.repeats or MIN_SAMPLES)


def _client_io(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    size = args.size or (128 * MiB if args.quick else 1024 * MiB)
    return _call(module.run, args.out, size_bytes=size, repeats=samples(args), work_dir=args.work_dir,
                 progress=progress)


def _fuse(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    size = args.size or (128 * MiB if args.quick else 2048 * MiB)
    return _call(module.run, args.out, size_bytes=size, repeats=samples(args), work_dir=args.work_dir, progress=progress,
                 files=args.files, meta_repeats=samples(args), data=not args.metadata_only)


def _fuse_steps(args: argparse.Namespace) -> int:
    return (0 if args.metadata_only else samples(args)) + samples(args)


def _checkpoint(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"quick": args.quick, "work_dir": args.work_dir, "progress": progress,
                              "repeats": samples(args)}
    if args.size:
        kwargs["size_bytes"] = args.size
    return _call(module.run, args.out, **kwargs)


def _burst(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    ranks = args.ranks or (128 if args.quick else 1024)
    shard = args.shard or (256 << 10 if args.quick else 1 * MiB)
    # Until the client sizes write buffers to the data (not a whole block per open file),
    # the checkpoint directory gets blocks close to the shard size; see bench/burst.py.
    dir_block_size = args.dir_block_size or max(64 << 10, 1 << (shard - 1).bit_length())
    return module.run_repeated(  # type: ignore[no-any-return]
        args.out, samples(args), ranks, shard, args.processes or (2 if args.quick else 4), dir_block_size=dir_block_size,
        baseline_bytes=64 * MiB if args.quick else 256 * MiB, work_dir=args.work_dir, progress=progress,
    )


Runner = Callable[[ModuleType, argparse.Namespace, Callable[..., Any]], dict[str, Any]]
_RUNNERS: dict[str, tuple[str, Runner, Callable[[argparse.Namespace], int | None]]] = {
    # name: (script in bench/ = result file name, runner, progress steps if known before the run)
    "client-io": ("client_io", _client_io, samples),
    # checkpoint: per run 6 timings, a warm async_save and a degraded load; one async load check
    "checkpoint": ("checkpoint_bench", _checkpoint, lambda a: 8 * samples(a) + 1),
    "fuse": ("fuse_bench", _fuse, _fuse_steps),
    "burst": ("burst", _burst, lambda a: 6 * samples(a)),  # per run: bench/burst.py's PROGRESS_STEPS
    "repair": ("repair", _checkpoint, lambda a: None),  # same options as checkpoint: --quick, --size, --repeats
}


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmark ``name``; print its table and targets; write JSON (with ``run_info``) and
    PNG. Returns a summary entry ``{"ok", "seconds", "json", "png", "ratios", "targets",
    "error_count"}`` or ``{"ok": False, "error", ["skipped"]}``; "ok" means it ran without
    errors, not that its targets were met (``summary_state`` says that)."""
    result_name, runner, total = _RUNNERS[name]
    print(f"\n== {name} ==", flush=True)
    try:
        module = load_script(result_name)
    except BenchmarkMissing as exc:
        print(f"{name}: skipped: {exc}")
        return {"ok": False, "skipped": True, "error": str(exc)}
    progress = _Progress(name, total(args))
    load_before = load_average()
    started = time.perf_counter()
    try:
        result = runner(module, args, progress)
    except Exception as exc:
        progress.close()
        print(f"{name}: failed: {type(exc).__name__}: {exc}")
        if args.verbose:
            traceback.print_exc()
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    progress.close()
    seconds = time.perf_counter() - started
    result.update(run_info(load_before))
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{result_name}.json")
    with open(json_path, "w") as f:  # the script wrote its own; again, with when, where and how loaded
        json.dump(result, f, indent=2, default=str)
    printer = getattr(module, "print_summary", None)
    (printer if callable(printer) else print_result)(result)
    print_targets(result)
    png = draw_chart(result, os.path.join(args.out, f"{result_name}.png"), f"tectofs bench {name}")
    errors = result.get("error_count", len(result.get("errors") or []))
    entry = {"ok": not errors, "seconds": round(seconds, 1), "json": json_path, "png": png,
             "ratios": result.get("ratios", {}), "targets": targets_of(result), "error_count": errors}
    print(f"{name}: {summary_state(entry)}; {seconds:.0f}s; results {json_path}" + (f", chart {png}" if png else ""))
    return entry


def build_parser(prog: str = "tectofs bench") -> argparse.ArgumentParser:
    from tectofs import limits
    from tectofs.cli import numbers
    from tectofs.cli.options import Parser  # usage errors as one line, exit status 2, like every tectofs command

    parser = Parser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=[*BENCHMARKS, "all"], help="which benchmark to run")
    parser.add_argument("--out", default="bench-results", help="directory for JSON results and PNG charts")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few minutes")
    parser.add_argument("--work-dir", default=None,
                        help="where clusters and local files live, created if missing (default: temp dir)")
    parser.add_argument("--size", type=numbers.size(), default=None, help="client-io/fuse/checkpoint: bytes per run")
    parser.add_argument("--repeats", type=numbers.count(MIN_SAMPLES, _REPEATS_MAX), default=None,
                        help=f"client-io/fuse/checkpoint/repair/burst: runs per figure, the median is reported "
                             f"(default and minimum {MIN_SAMPLES}, --quick included)")
    parser.add_argument("--ranks", type=numbers.count(1, limits.connections_max), default=None,
                        help="burst: simulated ranks (default 1024, quick 128)")
    parser.add_argument("--shard", type=numbers.size(), default=None, help="burst: bytes per rank (default 1M, quick 256K)")
    parser.add_argument("--processes", type=numbers.count(1, _PROCESSES_MAX), default=None,
                        help="burst: worker processes (default 4, quick 2)")
    parser.add_argument("--dir-block-size", type=numbers.BLOCK_SIZE, default=None,
                        help="burst: block size of the checkpoint directory (default: the shard size rounded up)")
    parser.add_argument("--files", type=numbers.count(1, _FILES_MAX), default=2000,
                        help="fuse: empty files created, stat'ed and unlinked per metadata run (default 2000)")
    parser.add_argument("--metadata-only", action="store_true",
                        help="fuse: only the metadata part (creates/s, stats/s, unlinks/s vs. a local directory)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed benchmarks")
    return parser


def main(argv: list[str] | None = None, prog: str = "tectofs bench") -> int:
    """Run ``argv`` (the arguments after ``tectofs bench``); return the exit status: 0 when
    every benchmark ran without errors (whether or not it met its targets: the table, the
    summary and the chart say that), 1 otherwise (missing benchmarks count as failures)."""
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    ensure_work_dir(args.work_dir)
    names = list(BENCHMARKS) if args.benchmark == "all" else [args.benchmark]
    summary = {name: run_one(name, args) for name in names}
    if len(names) > 1:
        print("\n== summary ==")
        for name, entry in summary.items():
            entry["state"] = summary_state(entry)
            print(f"{name:11} {entry['state']}")
            for t in entry.get("targets") or []:
                measured = "" if t.get("measured") is None else f" {_show(t['measured'])}"
                print(f"{'':11}   {verdict(t['met']):7} {t['name']}{measured} (needs {t['target']})")
            ratios = entry.get("ratios") or {}
            if ratios:
                print(f"{'':11}   " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump({**run_info(None), "benchmarks": summary}, f, indent=2, default=str)
    return 0 if all(entry["ok"] for entry in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
