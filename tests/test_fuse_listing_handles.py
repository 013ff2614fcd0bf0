"""Through the mount, a directory its user may read but not search lists as on Linux (issue 51,
part 2): ``ls`` shows the names (with their inode numbers and types), while ``stat`` and
``open`` of an entry fail with EACCES, however often the directory is listed; the kernel gets
no attributes for those entries (READDIRPLUS with node id 0), so neither a dentry it keeps nor
a listing it keeps lets a process reach the files, and no byte of them is read.

Real processes: a local cluster, a user made with ``tectofs user add``, a single-user mount
with that user's credential (the kernel checks nothing: the metadata service decides), with
the kernel opening directories itself, with the mount opening them, and without leases.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tempfile
from typing import Any, Iterator

import pytest

from tests.test_fuse import _REASON
from tests.test_listing_handles import make_tree

MiB = 1 << 20
COMMAND_TIMEOUT_S = 60

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.fixture(scope="module")
def alice_credentials(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("alice") / "alice.credentials")
    subprocess.run([sys.executable, "-m", "tectofs.cli", "user", "add", "alice", "--uid", "1000", "--gid", "1000",
                    "--out", path], env={**os.environ, "TECTOFS_META": cluster.address}, check=True,
                   capture_output=True, timeout=COMMAND_TIMEOUT_S)
    return path


@pytest.fixture(scope="module")
def tree(cluster: Any) -> dict[str, bytes]:
    """Root's /rx (0744) with in.bin (chunks) and small.bin (inline), 0644; /pub (0755) with open.bin."""
    return make_tree(cluster.fs)


@pytest.fixture(params=["kernel-opens", "mount-opens", "no-leases"])
def mountpoint(cluster: Any, alice_credentials: str, tree: dict[str, bytes], tmp_path: Any,
               request: pytest.FixtureRequest) -> Iterator[str]:
    from tectofs.client.fuse import start_mount_process

    mount = start_mount_process(cluster.address, str(tmp_path / "mnt"), credentials=alice_credentials,
                                multi_user=False, leases=request.param != "no-leases",
                                kernel_opens_directories=request.param == "kernel-opens",
                                log_path=str(tmp_path / "mount.log"))
    try:
        yield mount.mountpoint
    finally:
        mount.stop()


def _outcome(call: Any) -> Any:
    """What ``call()`` did: the name of the errno it failed with, or what it returned."""
    try:
        return call()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def test_ls_shows_the_names_and_stat_and_open_are_refused(cluster: Any, tree: dict[str, bytes],
                                                          mountpoint: str) -> None:
    rx = f"{mountpoint}/rx"
    for _ in range(3):  # listed again: from the kernel's kept listing, where there is one
        assert sorted(os.listdir(rx)) == ["in.bin", "small.bin"]
        for entry in os.scandir(rx):
            # getdents' d_ino and d_type, as on Linux
            assert (entry.inode(), entry.is_file(follow_symlinks=False)) == (cluster.fs.stat(f"/rx/{entry.name}").ino,
                                                                            True)
        for name, data in tree.items():
            path = f"{rx}/{name}"

            def read(path: str = path) -> bytes:
                with open(path, "rb") as f:
                    return f.read()

            got = _outcome(read)
            assert got != data, f"alice read {name} through the mount"
            assert got == "EACCES", f"open {name}: {got!r:.200}"
            assert _outcome(lambda: os.stat(path)) == "EACCES", name
            assert _outcome(lambda: os.lstat(path)) == "EACCES", name
            assert _outcome(lambda: os.access(path, os.R_OK)) is False, name
    listed = subprocess.run(["ls", "-l", rx], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    assert listed.returncode == 1, listed  # GNU ls: a name shown, its attributes not reachable
    assert "Permission denied" in listed.stderr and "in.bin" in listed.stdout and "small.bin" in listed.stdout
    assert "?" in listed.stdout
    # A directory alice may search lists with attributes, and its files open.
    assert os.stat(f"{mountpoint}/pub/open.bin").st_size == 20
    with open(f"{mountpoint}/pub/open.bin", "rb") as f:
        assert f.read() == b"anyone may read this"
    for name, data in tree.items():
        assert cluster.fs.read_bytes(f"/rx/{name}") == data


@pytest.fixture
def shared_mountpoint(cluster: Any, tree: dict[str, bytes]) -> Iterator[str]:
    """A multi-user mount (root's credential, ``allow_other``), each request run as its caller,
    where only the metadata service checks permissions (``--no-default-permissions``)."""
    from tectofs.client.fuse import start_mount_process

    where = tempfile.mkdtemp(prefix="tectofs-listing-")
    os.chmod(where, 0o755)  # (reachable by uid 1000)
    mount = start_mount_process(cluster.address, where, credentials=cluster.credential_file, multi_user=True,
                                default_permissions=False, log_path=f"{where}.log")
    try:
        yield mount.mountpoint
    finally:
        mount.stop()
        os.rmdir(where)
        os.unlink(f"{where}.log")


def _as_alice(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", *command],
                          capture_output=True, text=True, errors="replace", timeout=COMMAND_TIMEOUT_S,
                          cwd="/")


def test_a_multi_user_mount_lists_names_to_a_user_who_may_not_search(tree: dict[str, bytes],
                                                                     shared_mountpoint: str) -> None:
    """uid 1000, a real process on a mount that runs its requests as it: the same as above,
    with the names-only entries of a listing read as that user (``acting_as``). (This mount
    keeps no dentry, its entry timeout being 0: f3fad0d passed this one too.)"""
    rx = f"{shared_mountpoint}/rx"
    for _ in range(2):
        listed = _as_alice("ls", rx)
        assert listed.returncode == 0 and listed.stdout.split() == ["in.bin", "small.bin"], listed
        for name in tree:
            for command in (["stat", f"{rx}/{name}"], ["cat", f"{rx}/{name}"]):
                result = _as_alice(*command)
                assert result.returncode != 0 and "Permission denied" in result.stderr, result
                assert result.stdout == "", f"{command}: {result.stdout[:200]!r}"
    # root, on the same mount, sees everything
    assert sorted(os.listdir(rx)) == ["in.bin", "small.bin"]
    for name, data in tree.items():
        with open(f"{rx}/{name}", "rb") as f:
            assert f.read() == data
