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

The benchmarks themselves are the scripts in the source tree's ``bench/`` directory (they
also run alone: ``python bench/burst.py --help``); this module finds them from the
installed package (editable installs) and imports them by path.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import sys
import time
import traceback
from types import ModuleType
from typing import Any, Callable

MiB = 1 << 20
BENCHMARKS = ("client-io", "checkpoint", "fuse", "burst", "repair")


class BenchmarkMissing(Exception):
    """A benchmark script is not in this tree (not written yet, or not an editable install)."""


def bench_dir() -> str:
    """``bench/`` of the source tree this package was installed from."""
    package = os.path.dirname(os.path.realpath(__file__))
    return os.path.join(os.path.dirname(package), "bench")


def load_script(name: str) -> ModuleType:
    """Import ``bench/<name>.py`` by path (``bench/`` is not a package)."""
    path = os.path.join(bench_dir(), f"{name}.py")
    if not os.path.exists(path):
        raise BenchmarkMissing(
            f"{path} not found: the benchmarks live in the source tree's bench/ directory "
            f"(install tectofs editable from a checkout: pip install -e '.[bench]')"
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


def draw_chart(result: dict[str, Any], path: str, title: str) -> str | None:
    """A PNG of the result (bars of its main figure per row; burst: throughput and latency).
    Returns the path, or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no chart (pip install 'tectofs[bench]')", file=sys.stderr)
        return None
    if result.get("benchmark") == "burst":
        figure = _burst_figure(plt, result, title)
    else:
        figure = _rows_figure(plt, result, title)
    if figure is None:
        return None
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _rows_figure(plt: Any, result: dict[str, Any], title: str) -> Any:
    rows = result.get("rows") or []
    if not rows:
        return None
    keys = list(rows[0])
    label_key = next((k for k in keys if isinstance(rows[0][k], str)), keys[0])
    value_key = next((k for k in keys if k != label_key and any(_numeric(r.get(k)) is not None for r in rows)), None)
    if value_key is None:
        return None
    labels = [str(r[label_key]) for r in rows]
    values = [_numeric(r.get(value_key)) or 0.0 for r in rows]
    figure, axis = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.8))
    bars = axis.barh(labels, values, color="#4C72B0")
    axis.invert_yaxis()
    axis.set_xlabel(value_key)
    axis.bar_label(bars, fmt="%.3g", padding=3)
    ratios = result.get("ratios") or {}
    subtitle = "\n".join(f"{k}: {v}" for k, v in list(ratios.items())[:4])
    axis.set_title(title + (f"\n{subtitle}" if subtitle else ""), fontsize=9)
    return figure


def _burst_figure(plt: Any, result: dict[str, Any], title: str) -> Any:
    base = result.get("baseline") or {}
    phases = result.get("phases") or {}
    save, load = phases.get("save") or {}, phases.get("load") or {}
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["1 client write", "1 client read", f"{result['ranks']} ranks save", f"{result['ranks']} ranks load"]
    values = [base.get("write_GBps", 0.0), base.get("read_GBps", 0.0), save.get("aggregate_GBps", 0.0),
              load.get("aggregate_GBps", 0.0)]
    bars = left.bar(names, values, color=["#999999", "#bbbbbb", "#4C72B0", "#55A868"])
    left.bar_label(bars, fmt="%.3f", padding=2)
    left.set_ylabel("GB/s (aggregate)")
    left.set_title("throughput vs. one large client", fontsize=10)
    left.tick_params(axis="x", labelrotation=15)
    series: list[tuple[str, Any]] = [("save", save.get("latency_s")), ("close/commit", save.get("close_latency_s")),
              ("commit RPC", save.get("rpc_commit_s")), ("load", load.get("latency_s"))]
    series = [(n, s) for n, s in series if s]
    width = 0.25
    for i, q in enumerate(("p50", "p99", "max")):
        xs = [j + (i - 1) * width for j in range(len(series))]
        right.bar(xs, [s.get(q, 0.0) for _, s in series], width, label=q)
    right.set_xticks(range(len(series)), [n for n, _ in series])
    right.set_ylabel("seconds (save, load: from the barrier)")
    right.set_title("per-rank latency", fontsize=10)
    right.legend()
    ratios = result.get("ratios") or {}
    figure.suptitle(f"{title}: {result['ranks']} ranks x {result['shard_bytes'] / MiB:g} MiB, errors "
                    f"{result.get('error_count', 0)}; " + ", ".join(f"{k} {v}" for k, v in ratios.items()), fontsize=10)
    return figure


# ---------------------------------------------------------------------- the benchmarks


def _call(run: Callable[..., dict[str, Any]], out_dir: str, **kwargs: Any) -> dict[str, Any]:
    """Call ``run(out_dir, ...)`` with the keyword arguments it accepts."""
    parameters = inspect.signature(run).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return run(out_dir, **kwargs)
    return run(out_dir, **{k: v for k, v in kwargs.items() if k in parameters})


def _client_io(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    repeats = args.repeats or (1 if args.quick else 3)
    size = args.size or (256 * MiB if args.quick else 1024 * MiB)
    return _call(module.run, args.out, size_bytes=size, repeats=repeats, work_dir=args.work_dir, progress=progress)


def _fuse(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    repeats = args.repeats or (1 if args.quick else 3)
    size = args.size or (256 * MiB if args.quick else 2048 * MiB)
    # metadata: medians of at least 3 runs even when --quick, unless --repeats says otherwise
    return _call(module.run, args.out, size_bytes=size, repeats=repeats, work_dir=args.work_dir, progress=progress,
                 files=args.files, meta_repeats=args.repeats or 3, data=not args.metadata_only)


def _fuse_steps(args: argparse.Namespace) -> int:
    return (0 if args.metadata_only else args.repeats or (1 if args.quick else 3)) + (args.repeats or 3)


def _checkpoint(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"quick": args.quick, "work_dir": args.work_dir, "progress": progress}
    if args.size:
        kwargs["size_bytes"] = args.size
    if args.repeats:
        kwargs["repeats"] = args.repeats
    return _call(module.run, args.out, **kwargs)


def _burst(module: ModuleType, args: argparse.Namespace, progress: Callable[..., Any]) -> dict[str, Any]:
    ranks = args.ranks or (128 if args.quick else 1024)
    shard = args.shard or (256 << 10 if args.quick else 1 * MiB)
    # Until the client sizes write buffers to the data (not a whole block per open file),
    # the checkpoint directory gets blocks close to the shard size; see bench/burst.py.
    dir_block_size = args.dir_block_size or max(64 << 10, 1 << (shard - 1).bit_length())
    return module.run(  # type: ignore[no-any-return]
        args.out, ranks, shard, args.processes or (2 if args.quick else 4), dir_block_size=dir_block_size,
        baseline_bytes=64 * MiB if args.quick else 256 * MiB, work_dir=args.work_dir, progress=progress,
    )


Runner = Callable[[ModuleType, argparse.Namespace, Callable[..., Any]], dict[str, Any]]
_RUNNERS: dict[str, tuple[str, Runner, Callable[[argparse.Namespace], int | None]]] = {
    # name: (script in bench/ = result file name, runner, progress steps if known before the run)
    "client-io": ("client_io", _client_io, lambda a: a.repeats or (1 if a.quick else 3)),
    "checkpoint": ("checkpoint_bench", _checkpoint, lambda a: getattr(a, "checkpoint_steps", None)),
    "fuse": ("fuse_bench", _fuse, _fuse_steps),
    "burst": ("burst", _burst, lambda a: 5),
    "repair": ("repair", _checkpoint, lambda a: None),  # same options as checkpoint: --quick, --size, --repeats
}


def run_one(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run benchmark ``name``; print its table; write JSON and PNG. Returns a summary entry
    ``{"ok", "seconds", "json", "png", "ratios", "error"}``."""
    result_name, runner, total = _RUNNERS[name]
    print(f"\n== {name} ==", flush=True)
    try:
        module = load_script(result_name)
    except BenchmarkMissing as exc:
        print(f"{name}: skipped: {exc}")
        return {"ok": False, "skipped": True, "error": str(exc)}
    progress = _Progress(name, getattr(module, "PROGRESS_STEPS", None) or total(args))
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
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, f"{result_name}.json")
    if not os.path.exists(json_path):  # every script writes its own; keep one anyway
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2, default=str)
    printer = getattr(module, "print_summary", None)
    (printer if callable(printer) else print_result)(result)
    png = draw_chart(result, os.path.join(args.out, f"{result_name}.png"), f"tectofs bench {name}")
    errors = result.get("error_count", len(result.get("errors") or []))
    print(f"{name}: {seconds:.0f}s; results {json_path}" + (f", chart {png}" if png else ""))
    return {"ok": not errors, "seconds": round(seconds, 1), "json": json_path, "png": png,
            "ratios": result.get("ratios", {}), "error_count": errors}


def build_parser(prog: str = "tectofs bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("benchmark", choices=[*BENCHMARKS, "all"], help="which benchmark to run")
    parser.add_argument("--out", default="bench-results", help="directory for JSON results and PNG charts")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few minutes")
    parser.add_argument("--work-dir", default=None, help="where clusters and local files live (default: temp dir)")
    parser.add_argument("--size", type=_size, default=None, help="client-io/fuse/checkpoint: bytes per run")
    parser.add_argument("--repeats", type=int, default=None, help="client-io/fuse/checkpoint: runs per figure")
    parser.add_argument("--ranks", type=int, default=None, help="burst: simulated ranks (default 1024, quick 128)")
    parser.add_argument("--shard", type=_size, default=None, help="burst: bytes per rank (default 1M, quick 256K)")
    parser.add_argument("--processes", type=int, default=None, help="burst: worker processes (default 4, quick 2)")
    parser.add_argument("--dir-block-size", type=_size, default=None,
                        help="burst: block size of the checkpoint directory (default: the shard size rounded up)")
    parser.add_argument("--files", type=int, default=2000,
                        help="fuse: empty files created, stat'ed and unlinked per metadata run (default 2000)")
    parser.add_argument("--metadata-only", action="store_true",
                        help="fuse: only the metadata part (creates/s, stats/s, unlinks/s vs. a local directory)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed benchmarks")
    return parser


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    try:
        if value and value[-1] in units:
            return int(float(value[:-1]) * units[value[-1]])
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4096, 256K, 64M, 1G") from None


def main(argv: list[str] | None = None, prog: str = "tectofs bench") -> int:
    """Run ``argv`` (the arguments after ``tectofs bench``); return the exit status: 0 when
    every benchmark ran without errors, 1 otherwise (missing benchmarks count as failures)."""
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    names = list(BENCHMARKS) if args.benchmark == "all" else [args.benchmark]
    summary = {name: run_one(name, args) for name in names}
    if len(names) > 1:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2, default=str)
        print("\n== summary ==")
        for name, entry in summary.items():
            state = "ok" if entry["ok"] else ("skipped" if entry.get("skipped") else "FAILED")
            print(f"{name:11} {state:8} " + ", ".join(f"{k} {v}" for k, v in (entry.get("ratios") or {}).items()))
    return 0 if all(entry["ok"] for entry in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
