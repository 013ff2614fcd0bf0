"""``tectofs bench``: the one entry point to every benchmark.

    tectofs bench client-io --out results/          # one large file: client vs local disk
    tectofs bench checkpoint --out results/         # DCP save/load through the plugin
    tectofs bench fuse --out results/               # one stream through the mount; creates/stats/unlinks
    tectofs bench fuse --metadata-only --files 2000 # just creates/s, stats/s, unlinks/s vs. a local directory
    tectofs bench burst --out results/              # N ranks checkpoint at once
    tectofs bench repair --out results/             # rebuild throughput; a save during a rebuild
    tectofs bench tree --out results/               # untar/import/ls/cat/rm a package tree: local, tectofs,
                                                    #   JuiceFS, SeaweedFS (when installed); creates/s
    tectofs bench fuse-bindings --out results/      # one in-memory file system through mfusepy, llfuse and
                                                    #   pyfuse3 (when installed): creates, stats, listing, I/O, untar
    tectofs bench all --out results/ --quick        # everything, small sizes

Each benchmark shows a progress bar while it runs, then prints a table, writes
``<out>/<name>.json`` and draws ``<out>/<name>.png``. Results are ratios against baselines
measured in the same run (a local file, one large client stream), because this kind of
machine is shared and absolute figures drift 20-40% between runs.

Targets are printed as met / NOT met (in the table, the summary and the chart) and a
benchmark's summary line never says "ok": it says whether its targets were met. GB/s is
10^9 bytes per second, MiB 2^20 bytes. Every JSON records the commit, the date (UTC), the
host and the load average before and after the run. Figures are medians of at least 3 runs.

The benchmarks are the modules of ``tectofs.benchmarks`` (``bench/`` of a source tree, shipped
in the package); each also runs alone: ``python3 -m tectofs.benchmarks.burst --help``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

from tectofs.benchmarks.charts import draw_chart
from tectofs.benchmarks.report import (
    Result,
    SummaryEntry,
    ensure_work_dir,
    load_average,
    print_result,
    print_targets,
    run_info,
    show,
    summary_state,
    targets_of,
    verdict,
)

MiB = 1 << 20
MIN_SAMPLES = 3  # medians: every figure a ratio uses is the median of at least this many runs
_REPEATS_MAX = 1000  # --repeats: more runs per figure than anyone waits for
_PROCESSES_MAX = 1024  # --processes (burst): worker processes
_FILES_MAX = 10_000_000  # --files (fuse): files per metadata run

Progress = Callable[[int], None]  # progress(n): n more steps done


class _ProgressBar:
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


# ---------------------------------------------------------------------- the benchmarks
# Each runner imports its benchmark when called: ``tectofs bench --help`` loads none of them
# (nor torch, which some need).


def samples(args: argparse.Namespace) -> int:
    """Runs per figure: ``--repeats``, else 3, --quick included (its sizes are smaller, not its
    sample count: every figure is a median of at least ``MIN_SAMPLES`` runs)."""
    return max(MIN_SAMPLES, args.repeats or MIN_SAMPLES)


def _client_io(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import client_io

    size = args.size or (128 * MiB if args.quick else 1024 * MiB)
    return client_io.run(args.out, size_bytes=size, repeats=samples(args), work_dir=args.work_dir, progress=progress)


def _fuse(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import fuse_bench

    size = args.size or (128 * MiB if args.quick else 2048 * MiB)
    return fuse_bench.run(args.out, size_bytes=size, repeats=samples(args), work_dir=args.work_dir, progress=progress,
                          files=args.files or fuse_bench.META_FILES_DEFAULT, meta_repeats=samples(args),
                          data=not args.metadata_only)


def _fuse_steps(args: argparse.Namespace) -> int:
    return (0 if args.metadata_only else samples(args)) + samples(args)


def _fuse_summary(result: Result) -> None:
    from tectofs.benchmarks import fuse_bench

    fuse_bench.print_summary(result)


def _checkpoint(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import checkpoint_bench

    size = {"size_bytes": args.size} if args.size else {}
    return checkpoint_bench.run(args.out, quick=args.quick, work_dir=args.work_dir, progress=progress,
                                repeats=samples(args), **size)


def _repair(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import repair

    size = {"size_bytes": args.size} if args.size else {}
    return repair.run(args.out, quick=args.quick, work_dir=args.work_dir, progress=progress, repeats=samples(args),
                      **size)


def _burst(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import burst

    ranks = args.ranks or (128 if args.quick else 1024)
    shard = args.shard or (256 << 10 if args.quick else 1 * MiB)
    # Until the client sizes write buffers to the data (not a whole block per open file),
    # the checkpoint directory gets blocks close to the shard size; see bench/burst.py.
    dir_block_size = args.dir_block_size or max(64 << 10, 1 << (shard - 1).bit_length())
    return burst.run_repeated(
        args.out, samples(args), ranks, shard, args.processes or (2 if args.quick else 4), dir_block_size=dir_block_size,
        baseline_bytes=64 * MiB if args.quick else 256 * MiB, work_dir=args.work_dir, progress=progress,
    )


def _tree(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import tree

    return tree.run_from_args(args, progress)


def _tree_steps(args: argparse.Namespace) -> int:
    from tectofs.benchmarks import tree

    return tree.steps(args)


def _tree_summary(result: Result) -> None:
    from tectofs.benchmarks import tree

    tree.print_summary(result)


def _fuse_bindings(args: argparse.Namespace, progress: Progress) -> Result:
    from tectofs.benchmarks import fuse_bindings

    return fuse_bindings.run_from_args(args, progress)


def _fuse_bindings_steps(args: argparse.Namespace) -> int:
    from tectofs.benchmarks import fuse_bindings

    return fuse_bindings.steps(args)


def _fuse_bindings_summary(result: Result) -> None:
    from tectofs.benchmarks import fuse_bindings

    fuse_bindings.print_summary(result)


def _burst_summary(result: Result) -> None:
    from tectofs.benchmarks import burst_report

    burst_report.print_summary(result)


@dataclass(frozen=True)
class Benchmark:
    """One benchmark ``tectofs bench`` runs."""

    module: str  # its module in tectofs.benchmarks, and the name of its result files
    run: Callable[[argparse.Namespace, Progress], Result]
    steps: Callable[[argparse.Namespace], int | None]  # progress steps, if known before the run
    print_summary: Callable[[Result], None] = print_result


RUNS: dict[str, Benchmark] = {
    "client-io": Benchmark("client_io", _client_io, samples),
    # checkpoint: per run 6 timings, two warm async_saves (staging before returning, beside the step), three
    # incremental-checkpoint saves, two 16-rank loads, a degraded load, a memory-tier save and three restores;
    # two async load checks
    "checkpoint": Benchmark("checkpoint_bench", _checkpoint, lambda a: 18 * samples(a) + 2),
    "fuse": Benchmark("fuse_bench", _fuse, _fuse_steps, _fuse_summary),
    "burst": Benchmark("burst", _burst, lambda a: 6 * samples(a), _burst_summary),  # per run: burst.PROGRESS_STEPS
    "repair": Benchmark("repair", _repair, lambda a: None),  # same options as checkpoint: --quick, --size, --repeats
    "tree": Benchmark("tree", _tree, _tree_steps, _tree_summary),  # its own options: tree.add_options
    # its own options: fuse_bindings.add_options; --files, --size, --rounds and --quick shared
    "fuse-bindings": Benchmark("fuse_bindings", _fuse_bindings, _fuse_bindings_steps, _fuse_bindings_summary),
}
BENCHMARKS = tuple(RUNS)  # in the order `all` runs them


def _missing_dependency(exc: ModuleNotFoundError) -> str | None:
    """The package a benchmark needs and this install lacks (torch, mfusepy...), or None when
    the missing module is tectofs's own (a defect, not a skip)."""
    name = (exc.name or "").split(".")[0]
    return None if name in ("", "tectofs") else name


def run_one(name: str, args: argparse.Namespace) -> SummaryEntry:
    """Run benchmark ``name``; print its table and targets; write JSON (with ``run_info``) and
    PNG. Returns its summary entry: ``ok`` means it ran without errors, not that its targets
    were met (``summary_state`` says that)."""
    benchmark = RUNS[name]
    print(f"\n== {name} ==", flush=True)
    progress = _ProgressBar(name, benchmark.steps(args))
    load_before = load_average()
    started = time.perf_counter()
    try:
        result = benchmark.run(args, progress)
    except ModuleNotFoundError as exc:
        progress.close()
        package = _missing_dependency(exc)
        if package is None:
            raise
        print(f"{name}: skipped: it needs {package}, which is not installed ({exc})")
        return {"ok": False, "skipped": True, "error": f"needs {package}: {exc}"}
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
    json_path = os.path.join(args.out, f"{benchmark.module}.json")
    with open(json_path, "w") as f:  # the script wrote its own; again, with when, where and how loaded
        json.dump(result, f, indent=2, default=str)
    benchmark.print_summary(result)
    print_targets(result)
    png = draw_chart(result, os.path.join(args.out, f"{benchmark.module}.png"), f"tectofs bench {name}")
    errors = result.get("error_count", len(result.get("errors") or []))
    entry: SummaryEntry = {"ok": not errors, "seconds": round(seconds, 1), "json": json_path, "png": png,
                           "ratios": result.get("ratios", {}), "targets": targets_of(result), "error_count": errors}
    print(f"{name}: {summary_state(entry)}; {seconds:.0f}s; results {json_path}" + (f", chart {png}" if png else ""))
    return entry


def build_parser(prog: str = "tectofs bench") -> argparse.ArgumentParser:
    from tectofs import limits
    from tectofs.arguments import numbers
    from tectofs.arguments.parser import Parser  # usage errors as one line, exit status 2, like every tectofs command

    parser = Parser(prog=prog, description=__doc__)
    parser.add_argument("benchmark", choices=[*BENCHMARKS, "all"], help="which benchmark to run")
    parser.add_argument("--out", default="bench-results", help="directory for JSON results and PNG charts")
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run of a few minutes")
    parser.add_argument("--work-dir", default=None,
                        help="where clusters and local files live, created if missing (default: temp dir)")
    parser.add_argument("--size", type=numbers.size(), default=None,
                        help="client-io/fuse/checkpoint/fuse-bindings: bytes per run")
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
    parser.add_argument("--files", type=numbers.count(1, _FILES_MAX), default=None,
                        help="fuse/tree/fuse-bindings: empty files created, stat'ed and unlinked per metadata run "
                             "(default 2000; tree --quick 200, fuse-bindings --quick 100)")
    parser.add_argument("--metadata-only", action="store_true",
                        help="fuse: only the metadata part (creates/s, stats/s, unlinks/s vs. a local directory)")
    from tectofs.benchmarks import fuse_bindings, tree  # their options only (they import no cluster or client)

    tree.add_options(parser, standalone=False)
    fuse_bindings.add_options(parser, standalone=False)
    parser.add_argument("-v", "--verbose", action="store_true", help="print tracebacks of failed benchmarks")
    return parser


def main(argv: list[str] | None = None, prog: str = "tectofs bench") -> int:
    """Run ``argv`` (the arguments after ``tectofs bench``); return the exit status: 0 when
    every benchmark ran without errors (whether or not it met its targets: the table, the
    summary and the chart say that), 1 otherwise (a benchmark skipped for want of a dependency
    counts as a failure)."""
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
                measured = "" if t.get("measured") is None else f" {show(t['measured'])}"
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
