"""Which errno a namespace call answers when several apply (issue 52): the metadata service
resolves paths and checks in Linux's order, so every client (library, mount, fsspec, S3) agrees
with the kernel. Each case runs on a directory of this machine (the kernel's answer) and on the
metadata store, with the same tree; and a few through a library client of a cluster."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tectofs.errors import TectofsError
from tectofs.store import SqlStore
from tectofs.store.dialect import SqliteDialect
from tectofs.wire.values import WrittenBlock, WrittenChunk
from tests.conftest import TestCluster as ClusterWithClient

DIRS = ["d", "d/s", "e"]
FILES = ["d/file", "d/s/f"]
# (call, source, destination): each answers an error both on Linux and on tectofs
CASES = [
    ("link", "d/s", "nope/x"),  # a directory into a missing directory: ENOENT before EPERM
    ("link", "d/s", "d/file"),  # a directory onto an existing name: EEXIST before EPERM
    ("link", "d/s", "d/file/x"),  # a directory under a file: ENOTDIR before EPERM
    ("link", "d/s", "d/new"),  # EPERM: directories have no hard links
    ("link", "d/missing", "nope/x"),
    ("link", "d/file", "e"),
    ("rename", "d/missing", "d/file/x"),  # the destination's directory is a file: ENOTDIR before ENOENT
    ("rename", "d/missing", "nope/x"),
    ("rename", "nope/missing", "d/file/x"),  # the source's directory first
    ("rename", "d/s/missing", "d/s"),  # a missing file onto its own directory: ENOENT
    ("rename", "d/s/f", "d/s"),  # a file onto a directory that holds it: ENOTEMPTY, not EISDIR
    ("rename", "d/s/f", "d"),
    ("rename", "d/s", "d"),
    ("rename", "d", "d/s/x"),  # into itself: EINVAL
    ("rename", "d/file", "e"),  # a file onto an empty directory: EISDIR
    ("rename", "e", "d/file"),  # a directory onto a file: ENOTDIR
    ("rename_noreplace", "d/file", "d/file"),  # onto itself: EEXIST, as onto any existing name
    ("rename_noreplace", "d", "d/s"),  # EEXIST before EINVAL
    ("rename_noreplace", "d/missing", "d/file"),  # ENOENT before EEXIST
    ("exchange", "d/missing", "d/file/x"),  # as rename: both directories first, ENOTDIR
    ("exchange", "d/s", "d"),  # EINVAL either way round
]
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2  # renameat2's flags (linux/fs.h)


def _call(target: Any, call: str, src: Any, dst: Any) -> Any:
    if call == "rename_noreplace":
        return target.rename(src, dst, noreplace=True)
    return getattr(target, call)(src, dst)


def _renameat2(src: Path, dst: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, bytes(src), -100, bytes(dst), flags) != 0:  # -100: AT_FDCWD
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


def _linux(root: Path, call: str, src: str, dst: str) -> int:
    try:
        if call in ("rename_noreplace", "exchange"):
            _renameat2(root / src, root / dst, RENAME_NOREPLACE if call == "rename_noreplace" else RENAME_EXCHANGE)
        else:
            getattr(os, call)(root / src, root / dst)
    except OSError as exc:
        return int(exc.errno or 0)
    return 0


def _tectofs(run: Callable[[str, str, str], Any], call: str, src: str, dst: str) -> int:
    try:
        run(call, src, dst)
    except TectofsError as exc:
        return exc.errno
    return 0


def _name(code: int) -> str:
    return errno.errorcode.get(code, "ok")


@pytest.fixture
def linux_tree(tmp_path: Path) -> Path:
    root = tmp_path / "linux"
    for d in DIRS:
        (root / d).mkdir(parents=True)
    for f in FILES:
        (root / f).write_bytes(b"")
    return root


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(SqliteDialect(str(tmp_path / "meta.db")), "rep(1)", 1 << 20)
    for d in DIRS:
        s.mkdir(d.split("/"))
    for f in FILES:
        s.create(f.split("/"))
    yield s
    s.close()


@pytest.mark.parametrize("call,src,dst", CASES)
def test_the_store_answers_as_linux(linux_tree: Path, store: SqlStore, call: str, src: str, dst: str) -> None:
    expected = _linux(linux_tree, call, src, dst)
    assert expected != 0  # every case fails on Linux: the tree is unchanged for the next

    def run(call: str, src: str, dst: str) -> Any:
        return _call(store, call, src.split("/"), dst.split("/"))

    assert _name(_tectofs(run, call, src, dst)) == _name(expected)


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterWithClient]:
    cluster = ClusterWithClient(str(tmp_path_factory.mktemp("errno")), servers=1, policy="rep(1)")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.slow
def test_a_library_client_answers_as_linux(small_cluster: ClusterWithClient, linux_tree: Path) -> None:
    fs = small_cluster.fs
    for d in DIRS:
        fs.mkdir("/" + d)
    for f in FILES:
        fs.write_bytes("/" + f, b"")

    def run(call: str, src: str, dst: str) -> Any:
        return _call(fs, call, "/" + src, "/" + dst)

    answers = {(call, src, dst): (_name(_tectofs(run, call, src, dst)), _name(_linux(linux_tree, call, src, dst)))
               for call, src, dst in CASES}
    assert {case: got for case, (got, _) in answers.items()} == {case: want for case, (_, want) in answers.items()}


@pytest.mark.slow
def test_a_mount_answers_as_linux(small_cluster: ClusterWithClient, linux_tree: Path,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """Through FUSE the kernel walks the paths and asks the mount for each name: the same order."""
    from tests.test_fuse import _fuse_unavailable

    reason = _fuse_unavailable()
    if reason is not None:
        pytest.skip(reason)
    from tectofs.client.fuse import is_mounted, start_mount_process

    small_cluster.fs.mkdir("/m")
    for d in DIRS:
        small_cluster.fs.mkdir("/m/" + d)
    for f in FILES:
        small_cluster.fs.write_bytes("/m/" + f, b"")
    mountpoint = str(tmp_path_factory.mktemp("errno-mnt"))
    process = start_mount_process(small_cluster.address, mountpoint,
                                  log_path=str(tmp_path_factory.mktemp("errno-mount-log") / "mount.log"))
    try:
        root = Path(mountpoint) / "m"
        got = {case: _name(_linux(root, *case)) for case in CASES}
        assert got == {case: _name(_linux(linux_tree, *case)) for case in CASES}
    finally:
        process.stop()
        assert not is_mounted(mountpoint)


def test_a_commit_after_its_allocation_expired_says_so(tmp_path: Path) -> None:
    """A writer that renewed nothing for the allocation grace (stalled, paused, cut off: seed 37
    of the simulated histories) is refused with EINVAL; the message names the expiry."""
    now = [1000.0]
    s = SqlStore(SqliteDialect(str(tmp_path / "meta.db")), "rep(1)", 1 << 20, clock=lambda: now[0])
    try:
        s.register_server("uuid-0", "127.0.0.1:1000", 1 << 40, 0)
        ino = s.create(["f"]).ino
        (block,) = s.allocate(ino, 1, writer=5)
        now[0] += 30
        assert s.expire_allocations(older_than_s=20) == 1
        written = WrittenBlock(idx=0, block_id=block.block_id, length=10,
                               chunks=[WrittenChunk(position=0, server_id=block.servers[0].server_id, length=10, crc=1)])
        with pytest.raises(TectofsError, match="allocation expired") as err:
            s.commit(ino, 10, [written], replace=False, writer=5)
        assert err.value.errno == errno.EINVAL
    finally:
        s.close()
