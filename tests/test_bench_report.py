"""``tectofs bench`` reports honestly: targets as met / NOT met in the table, the summary and
the chart (never "ok" while one is unmet); latencies on their own axis in seconds; baselines
and tectofs in their own colours; every JSON with commit, date, host and load average;
medians of at least 3 runs, --quick included; the work directory created."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import zipfile

import pytest

from tectofs.benchmarks import charts, fuse_bench, report, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _checkpoint_like() -> dict:
    return {
        "benchmark": "checkpoint",
        "rows": [
            {"what": "dcp local save", "GB/s (median)": 0.4, "median_s": 0.6, "runs_s": [0.6, 0.6, 0.7]},
            {"what": "tectofs save", "GB/s (median)": 0.25, "median_s": 1.0, "runs_s": [1.0, 1.1, 0.9]},
            {"what": "torch.save local", "GB/s (median)": 0.45, "median_s": 0.5, "runs_s": [0.5, 0.5, 0.5]},
            {"what": "tectofs async_save blocking", "GB/s (median)": None, "median_s": 0.05, "runs_s": [0.05] * 3},
        ],
        "ratios": {"tectofs save / dcp local save": 0.625},
        "targets": [
            report.target("tectofs save / dcp local save", 0.625, at_least=1.0),
            report.target("async_save blocking / tectofs sync save", 0.04, at_most=0.05),
        ],
    }


# ---------------------------------------------------------------------- targets


def test_target_verdicts():
    assert report.target("x", 1.0, at_least=1.0)["met"] is True
    assert report.target("x", 0.99, at_least=1.0)["met"] is False
    assert report.target("x", 0.05, at_most=0.05)["met"] is True
    assert report.target("x", 0.06, at_most=0.05) == {"name": "x", "measured": 0.06, "target": "<= 0.05x", "met": False}
    assert report.target("x", float("nan"), at_least=0.0)["met"] is False  # nothing measured: not met
    assert report.target("x", None, at_least=0.0)["met"] is False
    # results written before the targets list: {name: bool}
    assert report.targets_of({"targets_met": {"save >= 1.0x": False}})[0]["met"] is False


@pytest.mark.slow  # starts processes
def test_table_and_summary_say_not_met_never_ok(tmp_path, capsys, monkeypatch):
    result = _checkpoint_like()
    report.print_targets(result)
    table = capsys.readouterr().out
    lines = {line.split()[0]: line for line in table.splitlines()[1:-1]}
    assert lines["tectofs"].rstrip().endswith("NOT met") and "0.625" in lines["tectofs"]
    assert lines["async_save"].rstrip().endswith(" met")
    assert "targets: 1 of 2 met, 1 NOT met" in table

    entries = {
        "client-io": {"ok": True, "targets": [], "ratios": {"client write / local write+fsync": 0.2}, "error_count": 0},
        "checkpoint": {"ok": True, "targets": result["targets"], "ratios": result["ratios"], "error_count": 0},
        "fuse": {"ok": True, "targets": [report.target("creates/s", 2000, at_least=1500, unit="/s")], "error_count": 0},
        "burst": {"ok": False, "error": "RuntimeError: boom"},
        "repair": {"ok": False, "skipped": True, "error": "not found"},
        "tree": {"ok": True, "targets": [], "ratios": {}, "error_count": 0},
        "fuse-bindings": {"ok": True, "targets": [], "ratios": {}, "error_count": 0},
    }
    monkeypatch.setattr(run, "run_one", lambda name, args: dict(entries[name]))
    assert run.main(["all", "--out", str(tmp_path)]) == 1  # burst failed
    summary = capsys.readouterr().out.split("== summary ==")[1]
    rows = {line.split()[0]: line for line in summary.splitlines() if line and not line.startswith(" ")}
    assert "targets NOT met (1 of 2)" in rows["checkpoint"]
    assert "targets met (1 of 1)" in rows["fuse"]
    assert "no targets" in rows["client-io"]
    assert "FAILED" in rows["burst"] and "skipped" in rows["repair"]
    assert " ok" not in summary.lower().replace("tectofs", "")
    assert "NOT met tectofs save / dcp local save 0.625 (needs >= 1x)" in summary
    assert "met     creates/s 2000 (needs >= 1500/s)" in summary
    with open(tmp_path / "summary.json") as f:
        saved = json.load(f)
    assert saved["benchmarks"]["checkpoint"]["state"] == "targets NOT met (1 of 2)"
    assert saved["commit"] and saved["date"]


def test_checkpoint_and_fuse_results_carry_targets():
    """The scripts build their targets with ``report.target`` (fuse: the metadata part)."""
    times = {f"{where} {op}": [1.0, 1.0, 1.0] for where in ("local", "mount multi-thread")
             for op in ("creates/s", "stats/s", "listed stats/s", "unlinks/s")}
    meta = fuse_bench._metadata_results(1000, 3, ("mount multi-thread",), times, {}, {})
    assert [(t["name"], t["met"]) for t in meta["targets"]] == [
        ("mount multi-thread creates/s", False), ("mount multi-thread unlinks/s", False)]
    assert meta["ratios"]["mount multi-thread metadata target (1,500 creates/s and 1,500 unlinks/s)"] == "NOT met"


# ---------------------------------------------------------------------- charts


def _bars(axis):
    return {label.get_text(): patch for label, patch in zip(axis.get_yticklabels(), axis.patches)}


def test_chart_puts_latencies_on_their_own_axis_in_seconds():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = charts.chart_figure(plt, _checkpoint_like(), "checkpoint")
    try:
        axes = [a for a in figure.axes if a.patches]
        assert len(axes) == 2
        rates, latencies = axes
        assert "GB/s" in rates.get_xlabel() and "seconds" in latencies.get_xlabel()
        assert set(_bars(rates)) == {"dcp local save", "tectofs save", "torch.save local"}
        assert set(_bars(latencies)) == {"tectofs async_save blocking"}  # not a 0 GB/s bar
        assert _bars(latencies)["tectofs async_save blocking"].get_width() == pytest.approx(0.05)
        colours = {name: bar.get_facecolor() for name, bar in _bars(rates).items()}
        assert colours["dcp local save"] == colours["torch.save local"] != colours["tectofs save"]
        for axis in axes:
            assert axis.get_legend() is not None
        texts = [t for a in figure.axes for t in a.texts if t.get_text().startswith("target ")]
        verdicts = {t.get_text().rsplit(": ", 1)[1]: t.get_color() for t in texts}
        assert set(verdicts) == {"NOT met", "met"} and verdicts["NOT met"] != verdicts["met"]
    finally:
        plt.close(figure)


def test_burst_chart_keeps_latencies_apart():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latency = {"p50": 1.5, "p99": 3.0, "max": 4.0}
    result = {"benchmark": "burst", "ranks": 8, "shard_bytes": 1 << 20, "error_count": 0,
              "baseline": {"write_GBps": 0.4, "read_GBps": 0.8},
              "phases": {"save": {"aggregate_GBps": 0.1, "latency_s": latency},
                         "load": {"aggregate_GBps": 0.2, "latency_s": latency}}}
    figure = charts.chart_figure(plt, result, "burst")
    try:
        rates, latencies = [a for a in figure.axes if a.patches]
        assert "GB/s" in rates.get_xlabel() and latencies.get_xlabel() == "seconds"
        assert "save p99" in _bars(latencies) and "save p99" not in _bars(rates)
        colours = {name: bar.get_facecolor() for name, bar in _bars(rates).items()}
        assert colours["1 client write (baseline)"] != colours["8 ranks save"]
    finally:
        plt.close(figure)


# ---------------------------------------------------------------------- provenance, samples, work dir


@pytest.mark.slow  # starts processes
def test_run_info_records_commit_date_host_and_load(monkeypatch):
    info = report.run_info([1.0, 0.5, 0.25])
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and os.path.dirname(os.path.dirname(os.path.realpath(report.__file__))) == ROOT:
        assert info["commit"] == head.stdout.strip() and info["commit_source"] == "git"
    assert datetime.datetime.strptime(info["date"], "%Y-%m-%dT%H:%M:%SZ")
    assert info["host"]["hostname"] and (info["host"]["cpus"] or 0) >= 1 and info["host"]["kernel"]
    assert info["load_average"]["before"] == [1.0, 0.5, 0.25] and len(info["load_average"]["after"] or ()) == 3
    assert "10^9" in info["units"]

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(report.subprocess, "run", no_git)  # an installed package, not a checkout
    assert report.run_info(None)["commit"].startswith("tectofs ")


def test_quick_still_takes_three_samples():
    parser = run.build_parser()
    assert run.samples(parser.parse_args(["client-io", "--quick"])) == 3
    assert run.samples(parser.parse_args(["fuse", "--quick", "--repeats", "5"])) == 5
    with pytest.raises(SystemExit):
        parser.parse_args(["client-io", "--repeats", "1"])


def test_work_dir_is_created_or_refused_clearly(tmp_path, capsys):
    made = tmp_path / "a" / "b"
    assert report.ensure_work_dir(str(made)) == str(made) and made.is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(SystemExit) as exc:
        report.ensure_work_dir(str(tmp_path / "file" / "sub"))
    assert "cannot create --work-dir" in str(exc.value)


@pytest.mark.timeout(60)
@pytest.mark.slow  # starts processes
def test_quick_client_io_run_records_medians_of_three_and_run_info(tmp_path, capsys):
    """A tiny real run: --quick keeps 3 samples, the missing work dir is made, the JSON says
    when, where and how loaded."""
    work = tmp_path / "not" / "yet"
    code = run.main(["client-io", "--quick", "--size", "2M", "--out", str(tmp_path / "out"), "--work-dir", str(work)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert work.is_dir()
    with open(tmp_path / "out" / "client_io.json") as f:
        result = json.load(f)
    assert result["repeats"] == 3 and all(len(row["runs_s"]) == 3 for row in result["rows"])
    for key in ("commit", "date", "host", "load_average"):
        assert result[key], key
    assert result["load_average"]["before"] is not None and result["load_average"]["after"] is not None
    assert "client-io: ran, no targets" in printed and " ok" not in printed


# ---------------------------------------------------------------------- from a fresh clone, from a wheel


def _fresh_copy(dest) -> str:
    """The files a clone of this working tree would have (tracked + new, not ignored)."""
    listed = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    for rel in filter(None, listed.stdout.decode().split("\0")):
        src, dst = os.path.join(ROOT, rel), os.path.join(dest, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.islink(src):
            os.symlink(os.readlink(src), dst)
        elif os.path.isfile(src):
            with open(src, "rb") as fin, open(dst, "wb") as fout:
                fout.write(fin.read())
    return str(dest)


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}


# Modules of tectofs.benchmarks that are not benchmarks (nothing to run, no --help)
_HELPERS = {"__init__.py", "common.py", "report.py", "charts.py", "filesystems.py", "memory_tree.py",
            "checkpoint_incremental.py", "checkpoint_share_reads.py"}  # parts of others: no command line


@pytest.mark.timeout(120)
@pytest.mark.slow  # starts processes
def test_scripts_run_from_a_fresh_clone(tmp_path):
    """``python3 -m tectofs.benchmarks.scale_model`` models from the committed figures and
    reproduces the committed SCALE.md; every benchmark answers --help and uses the clone's own
    tectofs (run from its root, with nothing on PYTHONPATH); ``python3 bench/X.py`` runs with
    the clone on PYTHONPATH and refuses another tree's tectofs."""
    clone = _fresh_copy(tmp_path / "clone")
    assert not os.path.exists(os.path.join(clone, "bench", "results"))
    run = subprocess.run([sys.executable, "-m", "tectofs.benchmarks.scale_model", "--out", str(tmp_path / "SCALE.md")],
                         cwd=clone, env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with open(os.path.join(clone, "bench", "SCALE.md")) as f:
        committed = f.read().splitlines()
    made = (tmp_path / "SCALE.md").read_text().splitlines()
    assert [line for line in made if not line.startswith("Generated by")] == \
        [line for line in committed if not line.startswith("Generated by")]

    which = subprocess.run([sys.executable, "-c", "import tectofs, tectofs.benchmarks.common as c; "
                            "print(tectofs.__file__); print(c.__file__)"], cwd=clone, env=_clean_env(),
                           capture_output=True, text=True)
    assert [p.startswith(clone) for p in which.stdout.split()] == [True, True], which
    modules = sorted(n for n in os.listdir(os.path.join(clone, "bench")) if n.endswith(".py") and n not in _HELPERS)
    assert "run.py" in modules and "meta_ops.py" in modules
    for name in modules:
        done = subprocess.run([sys.executable, "-m", f"tectofs.benchmarks.{name[:-3]}", "--help"], cwd=clone,
                              env=_clean_env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "usage" in done.stdout, (name, done.stderr[-2000:])

    as_script = subprocess.run([sys.executable, "bench/meta_ops.py", "--help"], cwd=clone,
                               env={**_clean_env(), "PYTHONPATH": clone}, capture_output=True, text=True, timeout=60)
    assert as_script.returncode == 0 and "usage" in as_script.stdout, as_script.stderr[-2000:]
    mixed = subprocess.run([sys.executable, "bench/meta_ops.py", "--help"], cwd=clone,
                           env={**_clean_env(), "PYTHONPATH": ROOT}, capture_output=True, text=True, timeout=60)
    assert mixed.returncode != 0 and "python3 -m tectofs.benchmarks.meta_ops" in mixed.stderr, mixed.stderr[-2000:]


@pytest.mark.timeout(120)
@pytest.mark.slow  # starts processes
def test_a_baseline_tree_runs_these_benchmarks_with_its_own_tectofs():
    """``--baseline REV``: the worktree of REV imports its own tectofs and this tree's
    benchmarks, both for a revision from before tectofs.benchmarks existed and for one with its
    own (which is replaced)."""
    from tectofs.benchmarks import common

    added = subprocess.run(["git", "-C", ROOT, "log", "--format=%H", "--diff-filter=A", "--", "tectofs/benchmarks"],
                           capture_output=True, text=True)
    if added.returncode != 0 or not added.stdout.split():
        pytest.skip("no git history here")
    code = ("import os, tectofs, tectofs.benchmarks.common as c; "
            "print(os.path.dirname(tectofs.__file__)); print(os.path.dirname(os.path.realpath(c.__file__)))")
    for revision in (added.stdout.split()[-1] + "~1", "HEAD"):
        with common.baseline_tree(revision) as tree:
            done = subprocess.run([sys.executable, "-P", "-c", code], cwd=tree, capture_output=True, text=True,
                                  env={**_clean_env(), "PYTHONPATH": tree}, timeout=60)
            assert done.returncode == 0, (revision, done.stderr[-2000:])
            assert done.stdout.split() == [os.path.join(tree, "tectofs"), os.path.join(ROOT, "bench")], revision
        assert not os.path.exists(tree)


@pytest.mark.timeout(180)
@pytest.mark.slow  # builds a wheel, makes a venv, starts a cluster
def test_benchmarks_run_from_an_installed_wheel(tmp_path):
    """A wheel installed in a fresh venv has the benchmarks as ``tectofs.benchmarks``: from a
    directory outside any checkout, with nothing on PYTHONPATH, ``tectofs bench --help`` and a
    tiny real run work with the venv's own tectofs (not this tree's, not an editable install
    of another), and its result names the package version, there being no git checkout."""
    pytest.importorskip("setuptools")
    started = time.monotonic()
    clone = _fresh_copy(tmp_path / "src")
    wheels = tmp_path / "wheels"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                            "-w", str(wheels), clone], capture_output=True, text=True, timeout=100)
    if built.returncode != 0 and "setuptools" in built.stderr and "requirement" in built.stderr.lower():
        pytest.skip(f"cannot build offline: {built.stderr.strip()[-300:]}")
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.iterdir()
    with zipfile.ZipFile(wheel) as archive:  # every module of the source tree, through the symlinks too
        shipped = {name for name in archive.namelist() if name.endswith(".py")}
    sources = {os.path.relpath(os.path.join(where, name), clone) for where, _, names in
               os.walk(os.path.join(clone, "tectofs"), followlinks=True) for name in names if name.endswith(".py")}
    assert "tectofs/benchmarks/run.py" in sources and not sources - shipped, sorted(sources - shipped)
    venv = tmp_path / "venv"
    # --system-site-packages: msgspec, torch... come from this interpreter's site-packages
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr[-2000:]
    python, elsewhere = str(venv / "bin" / "python"), tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _clean_env()
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps",
                                "--no-index", "--ignore-installed", "-q", str(wheel)],
                               cwd=elsewhere, env=env, capture_output=True, text=True, timeout=100)
    assert installed.returncode == 0, installed.stderr[-2000:]

    which = subprocess.run([python, "-c", "import tectofs, tectofs.benchmarks.run as r; print(tectofs.__file__); "
                            "print(r.__file__)"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60)
    assert which.returncode == 0, which.stderr[-2000:]
    for path in which.stdout.split():
        assert path.startswith(str(venv)) and os.path.realpath(path) == path, which.stdout  # the wheel's own files
    tectofs_command = str(venv / "bin" / "tectofs")
    helped = subprocess.run([tectofs_command, "bench", "--help"], cwd=elsewhere, env=env, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "usage: tectofs bench" in helped.stdout, helped.stderr[-2000:]

    out = elsewhere / "out"
    ran = subprocess.run([tectofs_command, "bench", "client-io", "--quick", "--size", "2M", "--out", str(out),
                          "--work-dir", str(elsewhere / "work")], cwd=elsewhere, env=env, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, (ran.stdout[-2000:], ran.stderr[-2000:])
    assert "client-io: ran, no targets" in ran.stdout
    result = json.loads((out / "client_io.json").read_text())
    assert result["commit"] == "tectofs 0.1.0" and result["commit_source"] == "package version"
    assert len(result["rows"]) == 4 and all(len(row["runs_s"]) == 3 for row in result["rows"])
    print(f"wheel built, installed and benchmarked in {time.monotonic() - started:.1f} s")
