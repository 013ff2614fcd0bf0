"""With ``--negative-entry-cache``, the mount answers lookups of names it knows are absent
(``client/fuse/listings.py``): fewer metadata calls per create in a directory it made, never
a wrong answer for its own changes, and another client's changes seen within the option's
time. Without it (the default) another client's new file is seen at once
(``tests/test_fuse.py::test_client_and_mount_see_the_same_bytes``)."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from typing import Any, Callable

import pytest

from tectofs.client.fuse.listings import KnownListings
from tectofs.errors import NotSupported
from tests.test_fuse import _REASON
from tests.test_metrics import scrape


def test_a_listing_follows_its_own_changes_and_drops_on_any_other() -> None:
    known = KnownListings(timeout_s=5.0)
    known.made("/d", ctime=10.0)
    assert known.absent("/d", "a") and not known.absent("/other", "a")
    known.changed("/d", "a", True, ctime_before=10.0, ctime_after=11.0)
    assert not known.absent("/d", "a") and known.absent("/d", "b")
    known.changed("/d", "a", False, ctime_before=11.0, ctime_after=12.0)
    assert known.absent("/d", "a")
    known.changed("/d", "b", True, ctime_before=12.5, ctime_after=13.0)  # someone else changed it at 12.5
    assert not known.absent("/d", "zzz")  # dropped: no longer answered here
    known.made("/e", ctime=1.0)
    known.changed("/e", "x", True, ctime_before=None, ctime_after=2.0)  # an older service: no wcc_data
    assert not known.absent("/e", "y")
    known.made("/f", ctime=1.0)
    known.forget_all()
    assert not known.absent("/f", "y")


def test_listings_expire_and_a_zero_timeout_keeps_none() -> None:
    known = KnownListings(timeout_s=0.2)
    known.made("/d", ctime=1.0)
    assert known.absent("/d", "x")
    time.sleep(0.3)
    assert not known.absent("/d", "x")
    off = KnownListings(timeout_s=0.0)
    off.made("/d", ctime=1.0)
    assert not off.absent("/d", "x")


def test_a_listing_that_grows_too_big_is_dropped() -> None:
    known = KnownListings(timeout_s=5.0, max_names=3)
    known.made("/d", ctime=0.0)
    for i in range(4):
        known.changed("/d", f"n{i}", True, ctime_before=float(i), ctime_after=float(i + 1))
    assert not known.absent("/d", "other")


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_creates_in_a_directory_the_mount_made_skip_the_lookup(make_cluster: Any, tmp_path: Any) -> None:
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster(metrics=True)
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)

    def lookups() -> float:
        metrics = scrape(cluster.metrics_urls["meta"])
        return sum(v for (name, labels), v in metrics.items()
                   if name == "tectofs_meta_requests_total" and dict(labels).get("op") in ("lookup", "getattr"))

    def lookups_while_creating(directory: str) -> float:
        """Metadata lookups while 200 files are created in ``directory``."""
        before = lookups()
        for i in range(200):
            with open(f"{directory}/f{i}", "wb") as f:
                f.write(b"x" * i)
        return lookups() - before

    with start_mount_process(cluster.address, mnt, log_path=str(tmp_path / "mount.log"), negative_cache_s=1.0):
        os.mkdir(f"{mnt}/made")
        made_calls = lookups_while_creating(f"{mnt}/made")
        os.mkdir(f"{mnt}/other")
        cluster.fs.write_bytes("/other/seed", b"")  # another client changed it: not a listing the mount knows
        os.stat(f"{mnt}/other")
        other_calls = lookups_while_creating(f"{mnt}/other")
        assert made_calls < 20, made_calls  # the lookup before each create answered by the mount
        # there, every create's lookup asks, but the first's: the listing the mount made is
        # found stale by that create's reply (another client wrote /other/seed)
        assert other_calls >= 199, other_calls
        assert sorted(os.listdir(f"{mnt}/made")) == sorted(f"f{i}" for i in range(200))
        assert all(os.path.getsize(f"{mnt}/made/f{i}") == i for i in range(200))
        # never wrong about its own changes: a removed name is gone, a renamed-in one is there
        os.unlink(f"{mnt}/made/f0")
        assert not os.path.exists(f"{mnt}/made/f0")
        os.rename(f"{mnt}/other/f1", f"{mnt}/made/moved")
        assert os.path.exists(f"{mnt}/made/moved")
        with pytest.raises(FileExistsError):
            os.open(f"{mnt}/made/f5", os.O_CREAT | os.O_EXCL | os.O_WRONLY)

        # another client's create is seen within the negative cache time (1 s here) ...
        os.mkdir(f"{mnt}/shared")
        open(f"{mnt}/shared/mine", "wb").close()
        cluster.fs.write_bytes("/shared/theirs", b"hello")
        deadline = time.monotonic() + 1.5
        while not os.path.exists(f"{mnt}/shared/theirs"):
            assert time.monotonic() < deadline, "another client's file unseen past the negative cache time"
            time.sleep(0.05)
        # ... and at once after the mount's own next change there shows the directory changed
        os.mkdir(f"{mnt}/shared2")
        open(f"{mnt}/shared2/a", "wb").close()
        cluster.fs.write_bytes("/shared2/theirs", b"hello")
        open(f"{mnt}/shared2/b", "wb").close()  # its wcc_data: the ctime before is not the one known
        assert os.path.exists(f"{mnt}/shared2/theirs")


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_a_listing_brings_every_entrys_attributes(make_cluster: Any, tmp_path: Any) -> None:
    """READDIRPLUS: one listing gives the kernel every entry's attributes, so stat of each
    listed name (``ls -l``, ``du``) asks the metadata service nothing while they are fresh;
    and ``ls -l``'s probe of ``system.posix_acl_access`` (a namespace tectofs does not keep)
    is answered without a call."""
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster(metrics=True)
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)
    cluster.fs.mkdir("/listed")
    for i in range(300):
        cluster.fs.write_bytes(f"/listed/f{i}", b"x" * i)

    def calls(*ops: str) -> float:
        metrics = scrape(cluster.metrics_urls["meta"])
        return sum(v for (name, labels), v in metrics.items()
                   if name == "tectofs_meta_requests_total" and dict(labels).get("op") in ops)

    with start_mount_process(cluster.address, mnt, log_path=str(tmp_path / "mount.log"), attr_timeout_s=60.0):
        before = calls("lookup", "getattr")
        names = os.listdir(f"{mnt}/listed")
        sizes = {name: os.lstat(f"{mnt}/listed/{name}").st_size for name in names}
        assert sizes == {f"f{i}": i for i in range(300)}
        assert calls("lookup", "getattr") - before < 10  # the listing's own, not one per file

        before = calls("getxattr")
        for name in names[:50]:
            with pytest.raises(OSError) as unsupported:
                os.getxattr(f"{mnt}/listed/{name}", "system.posix_acl_access")
            assert unsupported.value.errno == errno.EOPNOTSUPP
        assert calls("getxattr") == before


def _requests(log_path: str, opcode: str) -> int:
    """Requests of ``opcode`` in a mount's libfuse debug log."""
    with open(log_path, errors="replace") as f:
        return sum(f"opcode: {opcode} " in line for line in f)


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_ls_l_learns_once_per_mount_that_selinux_labels_are_not_kept(make_cluster: Any, tmp_path: Any) -> None:
    """``security.selinux`` is not supported (EOPNOTSUPP, to get and to set; not listed), so
    ``ls -l``, which probes it on every file for the ``.`` after the mode, stops after the
    first: 60 files listed twice cost at most two GETXATTRs each time (its first label and ACL
    probes), where each file cost one before. Other ``security.*`` attributes are kept as ever."""
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster()
    cluster.fs.mkdir("/labels")
    for i in range(60):
        cluster.fs.write_bytes(f"/labels/f{i}", b"x")
    mnt, log_path = str(tmp_path / "mnt"), str(tmp_path / "mount.log")
    with start_mount_process(cluster.address, mnt, log_path=log_path, debug=True):
        for _ in range(2):
            listed = subprocess.run(["ls", "-lR", f"{mnt}/labels"], capture_output=True, text=True, timeout=60)
            assert listed.returncode == 0, listed.stderr
            assert sum(line.startswith("-rw") for line in listed.stdout.splitlines()) == 60
        path = f"{mnt}/labels/f0"
        for call in (lambda: os.getxattr(path, "security.selinux"),
                     lambda: os.setxattr(path, "security.selinux", b"system_u:object_r:x:s0")):
            with pytest.raises(OSError) as unsupported:
                call()
            assert unsupported.value.errno == errno.EOPNOTSUPP
        os.setxattr(path, "security.label", b"kept")
        assert os.getxattr(path, "security.label") == b"kept"
        assert os.listxattr(path) == ["security.label"]
    # per ls at most its first label probe and its first ACL probe (each then cached per
    # device), and this test's own three: before, every file listed cost one
    assert _requests(log_path, "GETXATTR") <= 2 * 2 + 3
    with pytest.raises(NotSupported):
        cluster.fs.setxattr("/labels/f1", "security.selinux", b"x")


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_without_xattrs_the_kernel_stops_asking(make_cluster: Any, tmp_path: Any) -> None:
    """``--no-xattrs``: every extended-attribute call fails EOPNOTSUPP, as on a filesystem
    without them, and the kernel sends at most one request of each kind (libfuse's debug
    log counts them) however many files are probed or written; data is untouched. With
    xattrs (the default) the same probes reach the mount once per file."""
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster()
    cluster.fs.mkdir("/probed")
    for i in range(40):
        cluster.fs.write_bytes(f"/probed/f{i}", b"x" * i)

    def probe_and_write(mnt: str, xattrs: bool) -> None:
        for i in range(40):
            path = f"{mnt}/probed/f{i}"
            with pytest.raises(OSError) as absent:
                os.getxattr(path, "security.capability")  # the kernel's probe before a write
            assert absent.value.errno == (errno.ENODATA if xattrs else errno.EOPNOTSUPP)
            if not xattrs:
                for call in (lambda: os.listxattr(path), lambda: os.setxattr(path, "user.a", b"1"),
                             lambda: os.removexattr(path, "user.a")):
                    with pytest.raises(OSError) as unsupported:
                        call()
                    assert unsupported.value.errno == errno.EOPNOTSUPP
            with open(path, "ab") as f:
                f.write(b"y")

    for xattrs in (False, True):
        mnt, log_path = str(tmp_path / f"mnt-{xattrs}"), str(tmp_path / f"mount-{xattrs}.log")
        with start_mount_process(cluster.address, mnt, log_path=log_path, debug=True, xattrs=xattrs):
            probe_and_write(mnt, xattrs)
        getxattrs = _requests(log_path, "GETXATTR")
        if xattrs:
            assert getxattrs >= 40
        else:
            assert getxattrs <= 1
            for opcode in ("LISTXATTR", "SETXATTR", "REMOVEXATTR"):
                assert _requests(log_path, opcode) <= 1, opcode
    assert [cluster.fs.read_bytes(f"/probed/f{i}") for i in range(40)] == [b"x" * i + b"yy" for i in range(40)]


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_a_mkdir_or_rmdir_answers_the_kernels_next_question_about_its_parent(make_cluster: Any, tmp_path: Any) -> None:
    """A mkdir's and an rmdir's replies carry the parent's attributes after them
    (``AttrsReply.directory``, ``UnlinkReply.directory``, as a create's and an unlink's do), so
    the kernel's next permission check in the parent (the next mkdir's or rmdir's) asks the
    metadata service nothing: ``tar -x`` or ``rm -rf`` of a tree of directories costs one call
    per directory, not two. The parent's attributes are right: its link count counts the
    subdirectories, and another client's later change there is seen."""
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster(metrics=True)
    mnt = str(tmp_path / "mnt")
    os.mkdir(mnt)

    def calls(*ops: str) -> float:
        metrics = scrape(cluster.metrics_urls["meta"])
        return sum(v for (name, labels), v in metrics.items()
                   if name == "tectofs_meta_requests_total" and dict(labels).get("op") in ops)

    def questions_while(op: str, change: Callable[[str], None]) -> float:
        """Lookups and getattrs while ``change`` runs on 80 directories (``op`` calls each)."""
        before, changes = calls("lookup", "getattr"), calls(op)
        for i in range(40):
            for path in (f"{mnt}/tree/d{i}", f"{mnt}/tree/d{i}/sub")[:: 1 if op == "mkdir" else -1]:
                change(path)
        assert calls(op) - changes == 80
        return calls("lookup", "getattr") - before

    with start_mount_process(cluster.address, mnt, log_path=str(tmp_path / "mount.log")):
        os.mkdir(f"{mnt}/tree")
        os.stat(f"{mnt}/tree")
        questions = questions_while("mkdir", os.mkdir)
        assert questions < 8, questions  # was one per mkdir
        assert os.stat(f"{mnt}/tree").st_nlink == 42
        assert sorted(os.listdir(f"{mnt}/tree")) == sorted(f"d{i}" for i in range(40))
        cluster.fs.mkdir("/tree/theirs")
        assert os.stat(f"{mnt}/tree").st_nlink == 43
        assert "theirs" in os.listdir(f"{mnt}/tree")

        questions = questions_while("rmdir", os.rmdir)
        assert questions < 8, questions  # was one per rmdir
        assert os.stat(f"{mnt}/tree").st_nlink == 3
        assert os.listdir(f"{mnt}/tree") == ["theirs"]
