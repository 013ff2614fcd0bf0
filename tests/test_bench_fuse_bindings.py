"""``tectofs bench fuse-bindings``: the in-memory file system every binding serves, the figures
and ratios it reports, its options, and (slow) a quick run through every installed binding,
with one that is not installed reported as such while the others run."""

from __future__ import annotations

import errno
import json
import os
import stat as statmod

import pytest

from tectofs.benchmarks import fuse_bindings, run
from tectofs.benchmarks.fuse_bindings import BINDINGS, Binding, Sizes
from tectofs.benchmarks.memory_tree import LISTING_HANDLES, ROOT_INODE, MemoryTree, times_ns


def test_memory_tree_names_contents_and_unlinked_open_files():
    tree = MemoryTree()
    directory = tree.make(ROOT_INODE, b"d", statmod.S_IFDIR | 0o755, 0, 0)
    assert tree.inodes[ROOT_INODE].nlink == 3
    file = tree.make(directory.ino, b"f", statmod.S_IFREG | 0o644, 1000, 1000)
    with pytest.raises(FileExistsError):
        tree.make(directory.ino, b"f", statmod.S_IFREG | 0o644, 0, 0)
    assert tree.lookup(directory.ino, b"f") is file
    assert tree.resolve("/d/f") is file
    assert tree.parent_and_name("/d/f") == (directory.ino, b"f")
    fh = tree.open(file.ino)
    assert tree.write(fh, 5, b"abc") == 3
    assert tree.read(fh, 0, 100) == b"\0" * 5 + b"abc"
    assert tree.largest_write_bytes == 3 and tree.largest_read_bytes == 100
    tree.setattr(file.ino, mode=0o600, uid=7, size=2)
    assert file.mode == statmod.S_IFREG | 0o600 and file.uid == 7 and file.gid == 1000 and file.size == 2
    handle = tree.opendir(directory.ino)
    assert handle >= LISTING_HANDLES  # never mistaken for an inode number
    tree.make(directory.ino, b"g", statmod.S_IFREG | 0o644, 0, 0)
    assert [name for name, _ in tree.listing(handle)] == [b"f"]  # the snapshot taken at opendir
    with pytest.raises(OSError) as error:
        tree.remove(ROOT_INODE, b"d", directory=True)
    assert error.value.errno == errno.ENOTEMPTY
    tree.remove(directory.ino, b"f", directory=False)
    with pytest.raises(FileNotFoundError):
        tree.lookup(directory.ino, b"f")
    assert tree.read(fh, 0, 2) == b"\0\0"  # unlinked, still open
    tree.release(fh)
    assert file.ino not in tree.inodes  # its last name and handle gone
    with pytest.raises(OSError) as error:
        tree.getxattr()
    assert error.value.errno == errno.ENODATA
    assert tree.calls["create"] == 3 and tree.calls["mkdir"] == 1 and tree.calls["unlink"] == 1  # refused ones too


def test_utimens_times_follow_omit_and_now():
    atime, mtime = times_ns((5 * 10**9 + (1 << 30) - 2, 7 * 10**9 + 3))  # atime UTIME_OMIT
    assert atime is None and mtime == 7 * 10**9 + 3
    atime, mtime = times_ns((5 * 10**9 + (1 << 30) - 1, 7))  # atime UTIME_NOW
    assert atime is not None and atime > 10**18 and mtime == 7
    assert times_ns((1_700_000_000 * 10**9, 2)) == (1_700_000_000 * 10**9, 2)


def _figures(value):
    return {step.name: [value, value * 2, value * 3] for step in fuse_bindings.STEPS}


def test_summary_medians_speed_and_cpu_per_operation(capsys):
    sizes = Sizes(files=100, listing=1000, size_bytes=64 << 20, tree_files=50)
    names = ["mfusepy", "mfusepy-handoff", "pyfuse3-asyncio", "llfuse"]
    figures = {"mfusepy": _figures(10.0), "mfusepy-handoff": _figures(20.0), "pyfuse3-asyncio": _figures(40.0),
               "llfuse": {}}
    cpu = {"mfusepy": _figures(1.0), "mfusepy-handoff": _figures(1.0), "pyfuse3-asyncio": _figures(0.5), "llfuse": {}}
    status = {"mfusepy": "ran", "mfusepy-handoff": "ran", "pyfuse3-asyncio": "ran",
              "llfuse": f"not installed: {BINDINGS['llfuse'].install}"}
    result = fuse_bindings.summarize(names, 3, sizes, figures, cpu, status, {}, [])
    rows = {row["what"]: row for row in result["rows"]}
    assert rows["pyfuse3-asyncio creates/s"]["median"] == 80.0  # median of 40, 80, 120
    assert rows["pyfuse3-asyncio creates/s"]["speed vs mfusepy"] == 4.0  # a rate: 80 / 20
    assert rows["pyfuse3-asyncio untar s"]["speed vs mfusepy"] == 0.25  # seconds: 20 / 80, slower
    assert rows["mfusepy creates/s"]["daemon CPU ms/op"] == 20.0  # 2 s over 100 creates
    assert rows["mfusepy write MB/s"]["daemon CPU ms/op"] == round(2000 / 64, 2)  # per MiB
    assert rows["pyfuse3-asyncio readdir s"]["daemon CPU ms/op"] == 1.0  # 1 s over 1,000 entries
    assert rows["pyfuse3-asyncio stats/s"]["CPU vs mfusepy"] == 0.5
    assert rows["pyfuse3-asyncio stats/s"]["speed vs mfusepy-handoff"] == 2.0  # today's mount's shape
    assert rows["pyfuse3-asyncio untar s"]["speed vs mfusepy-handoff"] == 0.5
    assert rows["llfuse untar s"]["speed vs mfusepy-handoff"] is None
    assert rows["llfuse stats/s"]["median"] is None and rows["llfuse stats/s"]["speed vs mfusepy"] is None
    assert result["ratios"]["pyfuse3-asyncio creates/s speed / mfusepy"] == 4.0
    assert result["ratios"]["pyfuse3-asyncio creates/s speed / mfusepy-handoff"] == 2.0
    assert not any(key.startswith("llfuse") for key in result["ratios"])
    assert result["bindings"]["llfuse"]["status"].startswith("not installed: apt-get install -y libfuse-dev")
    fuse_bindings.print_summary(result)
    printed = capsys.readouterr().out
    assert "llfuse: not installed: " in printed
    assert "80 (4x)" in printed


def test_options_of_tectofs_bench_fuse_bindings():
    args = run.build_parser().parse_args(["fuse-bindings", "--quick", "--rounds", "1", "--bindings", "mfusepy",
                                          "pyfuse3-asyncio", "--listing-entries", "50"])
    assert fuse_bindings.sizes_from_args(args) == Sizes(files=fuse_bindings.QUICK["files"], listing=50,
                                                        size_bytes=fuse_bindings.QUICK["size"],
                                                        tree_files=fuse_bindings.QUICK["tree_files"])
    assert fuse_bindings.steps(args) == 2
    args = run.build_parser().parse_args(["fuse-bindings", "--files", "10", "--size", "2M"])
    assert fuse_bindings.sizes_from_args(args) == Sizes(10, fuse_bindings.DEFAULT_LISTING, 2 << 20,
                                                        fuse_bindings.DEFAULT_TREE_FILES)
    assert fuse_bindings.steps(args) == fuse_bindings.DEFAULT_ROUNDS * len(BINDINGS)
    with pytest.raises(SystemExit) as exit_:
        run.build_parser().parse_args(["fuse-bindings", "--bindings", "fusepy"])
    assert exit_.value.code == 2
    assert run.RUNS["fuse-bindings"].module == "fuse_bindings"


def test_the_tarball_is_the_same_every_time(tmp_path):
    first = fuse_bindings.make_tarball(str(tmp_path / "a.tar"), 30)
    assert first == fuse_bindings.make_tarball(str(tmp_path / "b.tar"), 30)
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()
    assert 30 * 3072 <= first <= 30 * 5120


_ABSENT = Binding("mfusepy", "tectofs_no_such_fuse_binding", "pip install tectofs-no-such-fuse-binding", "none")


@pytest.mark.fuse
@pytest.mark.slow  # mounts
@pytest.mark.timeout(300)
@pytest.mark.skipif(fuse_bindings.fuse_missing() is not None, reason=fuse_bindings.fuse_missing() or "")
def test_quick_run_measures_every_installed_binding(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(BINDINGS, "absent", _ABSENT)
    out, work = tmp_path / "results", tmp_path / "work"
    work.mkdir()
    code = run.main(["fuse-bindings", "--quick", "--rounds", "1", "--out", str(out), "--work-dir", str(work)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    with open(out / "fuse_bindings.json") as f:
        result = json.load(f)
    sizes = Sizes(fuse_bindings.QUICK["files"], fuse_bindings.QUICK["listing"], fuse_bindings.QUICK["size"],
                  fuse_bindings.QUICK["tree_files"])
    assert result["rounds"] == 1 and result["error_count"] == 0, result["errors"]
    rows = {(row["binding"], row["step"]): row for row in result["rows"]}
    installed = [name for name, binding in BINDINGS.items() if fuse_bindings.installed(binding)]
    assert "absent" not in installed
    for name in BINDINGS:
        info = result["bindings"][name]
        if name not in installed:
            assert info["status"] == f"not installed: {BINDINGS[name].install}"
            assert all(rows[(name, step)]["median"] is None for step in result["steps"])
            assert f"{name}: not installed: {BINDINGS[name].install}" in printed
            continue
        assert info["status"] == "ran", info
        for step in fuse_bindings.STEPS:
            row = rows[(name, step.name)]
            assert row["median"] > 0 and len(row["runs"]) == 1, row
            assert row["daemon CPU ms/op"] is not None and row["daemon CPU ms/op"] >= 0, row
            base = rows[("mfusepy", step.name)]["median"] if "mfusepy" in installed else None
            if base and name != "mfusepy":
                expected = row["median"] / base if step.unit != "s" else base / row["median"]
                assert row["speed vs mfusepy"] == pytest.approx(expected, rel=0.01)
        served = info["served"]  # what the daemon says it did: every create reached it
        assert served["calls"]["create"] == sizes.files + sizes.listing + sizes.tree_files + 1, served
        if BINDINGS[name].server != "mfusepy":  # inode APIs: every stat asked the daemon for attributes
            assert served["calls"]["getattr"] >= sizes.files + sizes.listing, served
        if BINDINGS[name].hand_off or BINDINGS[name].server == "pyfuse3":
            assert served["threads_that_ran_the_tree"] == 1, served  # all on one loop thread
        if name == "pyfuse3-asyncio":
            assert served["handler_loops"] == 1, served  # the handlers were coroutines on one asyncio loop
    assert os.path.exists(out / "fuse_bindings.png") or "matplotlib is not installed" in printed
    with open("/proc/self/mounts") as f:
        assert str(work) not in f.read()  # every mount is gone
    assert os.listdir(work) == []  # and so are the mountpoints
