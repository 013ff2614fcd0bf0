"""The FUSE mount, driven the way people use it: coreutils, tar, dd, Python file objects,
torch.save/torch.load, a second mount, and a model-based comparison with a local directory.

Every mount is a real ``tectofs mount`` child process (``start_mount_process``) on a real
local cluster (1 MiB blocks, so small files span blocks); every mount is unmounted in a
``finally`` and every subprocess has a timeout, so a broken daemon fails a test instead of
hanging the suite.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import random
import shutil
import stat
import subprocess
import threading
import time
import uuid
from typing import Any, Callable, Iterator

import pytest

from tectofs import errors
from tectofs.wire import messages

MiB = 1 << 20
COMMAND_TIMEOUT_S = 120


def _fuse_unavailable() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    if shutil.which("fusermount3") is None:
        return "fusermount3 is not installed (apt-get install fuse3)"
    try:
        import pyfuse3  # noqa: F401
    except Exception as exc:  # ImportError, or OSError when libfuse3 cannot be loaded
        return f"pyfuse3/libfuse3 unavailable: {exc}"
    return None


_REASON = _fuse_unavailable()
pytestmark = [pytest.mark.fuse, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

if _REASON is None:
    from tectofs.client.fuse import MountProcess, is_mounted, start_mount_process


def sh(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), check=True, capture_output=True, timeout=COMMAND_TIMEOUT_S, **kwargs)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Mounted:
    """A mount of the module's cluster plus the client library over the same cluster."""

    def __init__(self, process: "MountProcess", fs: Any) -> None:
        self.process = process
        self.root = process.mountpoint
        self.fs = fs

    def fresh_dir(self, prefix: str) -> tuple[str, str]:
        """A new empty directory: (path through the mount, tectofs path)."""
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        os.mkdir(os.path.join(self.root, name))
        return os.path.join(self.root, name), "/" + name


@pytest.fixture(scope="module")
def mounted(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mounted]:
    mountpoint = str(tmp_path_factory.mktemp("mnt"))
    process = start_mount_process(cluster.address, mountpoint,
                                  log_path=str(tmp_path_factory.mktemp("mount-log") / "mount.log"))
    try:
        yield Mounted(process, cluster.fs)
    finally:
        process.stop()
        assert not is_mounted(mountpoint), f"{mountpoint} is still mounted"


def _tree(root: str) -> dict[str, Any]:
    """Relative path -> ("dir",) / ("file", sha, mode) / ("symlink", target), for comparisons."""
    found: dict[str, Any] = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                found[relative] = ("symlink", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                found[relative] = ("dir",)
            else:
                with open(path, "rb") as f:
                    found[relative] = ("file", sha(f.read()), stat.S_IMODE(st.st_mode))
    return found


def _make_source_tree(root: str, rng: random.Random) -> None:
    os.makedirs(os.path.join(root, "a", "b", "c"))
    os.makedirs(os.path.join(root, "empty-dir"))
    files = {
        "empty": b"",
        "small.txt": b"hello tectofs\n" * 10,
        "a/one-block": rng.randbytes(MiB),
        "a/b/multi-block": rng.randbytes(2 * MiB + 12345),
        "a/b/c/odd": rng.randbytes(777_777),
        "a/b/c/exec.sh": b"#!/bin/sh\necho hi\n",
    }
    for relative, data in files.items():
        with open(os.path.join(root, relative), "wb") as f:
            f.write(data)
    os.chmod(os.path.join(root, "a/b/c/exec.sh"), 0o755)
    os.chmod(os.path.join(root, "small.txt"), 0o600)
    os.symlink("b/multi-block", os.path.join(root, "a", "link"))


# ---------------------------------------------------------------------- tools


def test_cp_r_copies_a_tree_both_ways(mounted: Mounted, tmp_path: Any, rng: random.Random) -> None:
    source = str(tmp_path / "src")
    _make_source_tree(source, rng)
    where, tectofs_dir = mounted.fresh_dir("cp")
    sh("cp", "-a", source, os.path.join(where, "copy"))
    assert _tree(os.path.join(where, "copy")) == _tree(source)
    sh("diff", "-r", source, os.path.join(where, "copy"))
    # What cp wrote through the mount is what the client library reads, bit for bit.
    with open(os.path.join(source, "a/b/multi-block"), "rb") as f:
        assert mounted.fs.read_bytes(f"{tectofs_dir}/copy/a/b/multi-block") == f.read()
    sh("cp", "-r", os.path.join(where, "copy"), str(tmp_path / "back"))
    assert _tree(str(tmp_path / "back")) == _tree(source)


def test_tar_create_and_extract(mounted: Mounted, tmp_path: Any, rng: random.Random) -> None:
    source = str(tmp_path / "src")
    _make_source_tree(source, rng)
    where, _ = mounted.fresh_dir("tar")
    archive = os.path.join(where, "tree.tar")
    sh("tar", "-C", source, "-cf", archive, ".")
    os.mkdir(os.path.join(where, "out"))
    sh("tar", "-C", os.path.join(where, "out"), "-xf", archive)
    assert _tree(os.path.join(where, "out")) == _tree(source)
    # mtimes survive extraction: tar sets them (whole seconds in its format) on the open file
    # before closing it, and the commit at close must not overwrite them
    for relative in ("a/b/c/odd", "a/b/multi-block", "empty"):
        expected = int(os.lstat(os.path.join(source, relative)).st_mtime)
        assert os.lstat(os.path.join(where, "out", relative)).st_mtime == expected, relative
    # and an archive made from the mount extracts locally to the same tree
    sh("tar", "-C", os.path.join(where, "out"), "-czf", str(tmp_path / "again.tgz"), ".")
    os.mkdir(tmp_path / "local-out")
    sh("tar", "-C", str(tmp_path / "local-out"), "-xzf", str(tmp_path / "again.tgz"))
    assert _tree(str(tmp_path / "local-out")) == _tree(source)


def test_dd_large_file_round_trip(mounted: Mounted, tmp_path: Any) -> None:
    local = str(tmp_path / "big")
    sh("dd", "if=/dev/urandom", f"of={local}", "bs=1M", "count=32", "status=none")
    where, tectofs_dir = mounted.fresh_dir("dd")
    sh("dd", f"if={local}", f"of={where}/big", "bs=1M", "conv=fsync", "status=none")
    assert os.stat(f"{where}/big").st_size == 32 * MiB
    sh("dd", f"if={where}/big", f"of={tmp_path}/back", "bs=1M", "status=none")
    sh("cmp", local, f"{tmp_path}/back")
    with open(local, "rb") as f:
        assert sha(mounted.fs.read_bytes(f"{tectofs_dir}/big")) == sha(f.read())
    # odd block sizes and an offset write into the middle (copy-on-write of two blocks)
    sh("dd", "if=/dev/zero", f"of={where}/big", "bs=12345", "count=100", f"seek={(5 * MiB) // 12345}",
       "conv=notrunc", "status=none")
    with open(local, "r+b") as f:
        f.seek(((5 * MiB) // 12345) * 12345)
        f.write(bytes(12345 * 100))
    sh("cmp", local, f"{where}/big")


# ---------------------------------------------------------------------- Python file API


def test_python_open_seek_read_write(mounted: Mounted, tmp_path: Any, rng: random.Random) -> None:
    where, tectofs_dir = mounted.fresh_dir("py")
    path, model_path = f"{where}/f", str(tmp_path / "model")
    data = rng.randbytes(3 * MiB + 100)
    for p in (path, model_path):
        with open(p, "wb") as f:
            f.write(data)
    with open(path, "r+b") as f, open(model_path, "r+b") as model:
        for _ in range(40):
            offset = rng.randrange(4 * MiB)
            if rng.random() < 0.5:
                chunk = rng.randbytes(rng.randrange(1, 300_000))
                for g in (f, model):
                    g.seek(offset)
                    g.write(chunk)
            else:
                length = rng.randrange(2 * MiB)
                for g in (f, model):
                    g.seek(offset)
                assert f.read(length) == model.read(length)
            assert f.tell() == model.tell()
        f.seek(0, os.SEEK_END)
        model.seek(0, os.SEEK_END)
        assert f.tell() == model.tell()
    with open(model_path, "rb") as model:
        expected = model.read()
    with open(path, "rb") as f:
        assert f.read() == expected
    assert mounted.fs.read_bytes(f"{tectofs_dir}/f") == expected


def test_a_new_descriptor_reads_what_an_open_one_wrote_after_the_cache_expires(mounted: Mounted) -> None:
    """As on a local disk: a second open of a file on the same mount reads the bytes another
    open descriptor wrote and has not closed, also once the kernel's cached attributes have
    expired and its page cache no longer serves the read (found by the mount-vs-local model:
    keep_open, write_kept, a pause, read)."""
    where, _ = mounted.fresh_dir("peers")
    path = f"{where}/f"
    with open(path, "wb") as f:
        f.write(b"old content")
    writer = os.open(path, os.O_RDWR)
    try:
        os.pwrite(writer, b"N", 0)
        time.sleep(1.3)  # past the mount's 1 s attribute timeout
        with open(path, "rb") as f:
            assert f.read() == b"Nld content"
        os.pwrite(writer, b"E", 1)
        with open(path, "rb") as f:
            assert f.read() == b"NEd content"
    finally:
        os.close(writer)
    with open(path, "rb") as f:
        assert f.read() == b"NEd content"


def test_client_and_mount_see_the_same_bytes(mounted: Mounted, rng: random.Random) -> None:
    where, tectofs_dir = mounted.fresh_dir("xchg")
    through_mount = rng.randbytes(2 * MiB + 4321)
    with open(f"{where}/from-mount", "wb") as f:
        f.write(through_mount)
    assert mounted.fs.read_bytes(f"{tectofs_dir}/from-mount") == through_mount
    through_client = rng.randbytes(3 * MiB - 1)
    mounted.fs.write_bytes(f"{tectofs_dir}/from-client", through_client)
    with open(f"{where}/from-client", "rb") as f:
        assert f.read() == through_client
    mounted.fs.write_bytes(f"{tectofs_dir}/from-client", b"rewritten")  # same mount, file changed under it
    with open(f"{where}/from-client", "rb") as f:
        assert f.read() == b"rewritten"


def test_append(mounted: Mounted) -> None:
    where, tectofs_dir = mounted.fresh_dir("append")
    path = f"{where}/log"
    expected = b""
    for i in range(5):
        line = f"line {i}\n".encode() * (i * 50_000 + 1)
        with open(path, "ab") as f:
            f.write(line)
            expected += line
            assert f.tell() == len(expected)
    sh("sh", "-c", f"echo shell >> '{path}'")
    expected += b"shell\n"
    with open(path, "rb") as f:
        assert f.read() == expected
    assert mounted.fs.read_bytes(f"{tectofs_dir}/log") == expected


def test_a_descriptor_held_open_reads_what_another_one_committed(mounted: Mounted) -> None:
    """Within one mount, descriptors of a file share its contents as on a local disk: a
    descriptor opened before another one's append and close reads the appended bytes."""
    where, _ = mounted.fresh_dir("shared-view")
    path = f"{where}/f"
    with open(path, "wb") as f:
        f.write(b"x" * 1000)
    held = os.open(path, os.O_RDWR)
    try:
        assert os.pread(held, 2000, 0) == b"x" * 1000  # its cached view of the first version
        with open(path, "ab") as f:
            f.write(b"y")
        assert os.pread(held, 2000, 0) == b"x" * 1000 + b"y"
        os.pwrite(held, b"z", 0)  # and the held one's own change is not lost to the next commit
        os.fsync(held)
    finally:
        os.close(held)
    with open(path, "rb") as f:
        assert f.read() == b"z" + b"x" * 999 + b"y"


def test_truncate_by_path_and_handle(mounted: Mounted, rng: random.Random) -> None:
    where, _ = mounted.fresh_dir("trunc")
    path = f"{where}/f"
    data = rng.randbytes(3 * MiB)
    with open(path, "wb") as f:
        f.write(data)
    os.truncate(path, MiB + 10)  # inside the second block: that block is rewritten
    assert os.stat(path).st_size == MiB + 10
    os.truncate(path, 2 * MiB)  # growing: the tail reads as zeros
    with open(path, "rb") as f:
        assert f.read() == data[: MiB + 10] + bytes(MiB - 10)
    with open(path, "r+b") as f:
        f.truncate(100)
        assert os.fstat(f.fileno()).st_size == 100
        f.seek(0, os.SEEK_END)
        f.write(b"end")
    with open(path, "rb") as f:
        assert f.read() == data[:100] + b"end"
    with open(path, "wb"):  # O_TRUNC
        pass
    assert os.stat(path).st_size == 0


def test_rename_replace_and_noreplace(mounted: Mounted) -> None:
    where, _ = mounted.fresh_dir("rename")
    for name, content in (("a", b"new"), ("b", b"old")):
        with open(f"{where}/{name}", "wb") as f:
            f.write(content)
    os.replace(f"{where}/a", f"{where}/b")  # the checkpoint commit pattern
    assert not os.path.exists(f"{where}/a")
    with open(f"{where}/b", "rb") as f:
        assert f.read() == b"new"
    os.mkdir(f"{where}/d1")
    os.mkdir(f"{where}/d2")
    with open(f"{where}/d1/inner", "wb") as f:
        f.write(b"x")
    os.rename(f"{where}/d1", f"{where}/d2")  # a directory replaces an empty one
    assert os.listdir(f"{where}/d2") == ["inner"]
    os.mkdir(f"{where}/d3")
    with pytest.raises(OSError) as raised:
        os.rename(f"{where}/d3", f"{where}/d2")
    assert raised.value.errno == errno.ENOTEMPTY
    with open(f"{where}/c", "wb") as f:
        f.write(b"c")
    libc = ctypes.CDLL(None, use_errno=True)
    AT_FDCWD, RENAME_NOREPLACE = -100, 1
    result = libc.renameat2(AT_FDCWD, f"{where}/c".encode(), AT_FDCWD, f"{where}/b".encode(), RENAME_NOREPLACE)
    assert result == -1
    assert ctypes.get_errno() == errno.EEXIST
    with open(f"{where}/b", "rb") as f:
        assert f.read() == b"new"
    assert libc.renameat2(AT_FDCWD, f"{where}/c".encode(), AT_FDCWD, f"{where}/e".encode(), RENAME_NOREPLACE) == 0
    RENAME_EXCHANGE = 2
    assert libc.renameat2(AT_FDCWD, f"{where}/e".encode(), AT_FDCWD, f"{where}/b".encode(), RENAME_EXCHANGE) == 0
    with open(f"{where}/b", "rb") as f, open(f"{where}/e", "rb") as g:
        assert (f.read(), g.read()) == (b"c", b"new")
    sh("mv", f"{where}/e", f"{where}/d2/e")
    assert sorted(os.listdir(f"{where}/d2")) == ["e", "inner"]


def test_times_owner_and_mode_set_on_a_file_being_written_go_with_its_commit(mounted: Mounted) -> None:
    """What tar does per file: create (mode 0600), write, futimens, fchown to the owner it has,
    fchmod 0644, close. The mount shows each change at once and commits them with the data;
    afterwards the library reads them back. A chmod that takes permission away is applied at
    once, for everyone. A file renamed while open gets its times under its new name, and the
    file made at its old name keeps its own."""
    where, tectofs_dir = mounted.fresh_dir("stamped")
    fd = os.open(f"{where}/f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, b"data" * 1000)
        os.utime(fd, ns=(1_500_000_000_000_000_000, 1_600_000_000_000_000_000))
        os.fchown(fd, os.getuid(), os.getgid())
        os.fchmod(fd, 0o644)
        seen = os.stat(f"{where}/f")
        assert (seen.st_mtime_ns, seen.st_atime_ns) == (1_600_000_000_000_000_000, 1_500_000_000_000_000_000)
        assert stat.S_IMODE(seen.st_mode) == 0o644 and seen.st_size == 4000
    finally:
        os.close(fd)
    st = mounted.fs.stat(f"{tectofs_dir}/f")
    assert abs(st.mtime - 1.6e9) < 1e-6 and abs(st.atime - 1.5e9) < 1e-6 and st.mode & 0o7777 == 0o644
    assert mounted.fs.read_bytes(f"{tectofs_dir}/f") == b"data" * 1000
    assert abs(os.stat(f"{where}/f").st_mtime_ns - 1_600_000_000_000_000_000) < 1000

    fd = os.open(f"{where}/private", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"secret")
        os.fchmod(fd, 0o600)  # takes read permission away: everyone sees it before the close
        assert mounted.fs.stat(f"{tectofs_dir}/private").mode & 0o7777 == 0o600
    finally:
        os.close(fd)
    assert mounted.fs.read_bytes(f"{tectofs_dir}/private") == b"secret"

    with open(f"{where}/g", "wb") as g:
        g.write(b"g")
        g.flush()
        os.rename(f"{where}/g", f"{where}/h")
        with open(f"{where}/g", "wb") as other:
            other.write(b"other")
            other.flush()
            os.utime(f"{where}/h", ns=(1_000_000_000, 1_100_000_000_000_000_000))
    assert os.stat(f"{where}/h").st_mtime_ns == 1_100_000_000_000_000_000
    assert os.stat(f"{where}/g").st_mtime_ns != 1_100_000_000_000_000_000
    with open(f"{where}/h", "rb") as h, open(f"{where}/g", "rb") as g2:
        assert (h.read(), g2.read()) == (b"g", b"other")


def test_ls_l_attributes(mounted: Mounted) -> None:
    where, tectofs_dir = mounted.fresh_dir("attrs")
    with open(f"{where}/f", "wb") as f:
        f.write(b"z" * 12345)
    os.chmod(f"{where}/f", 0o640)
    os.mkdir(f"{where}/d", 0o750)
    os.symlink("f", f"{where}/l")
    os.utime(f"{where}/f", ns=(1_000_000_000, 1_600_000_000_123_456_000))
    st = os.stat(f"{where}/f")
    assert st.st_size == 12345
    assert stat.S_ISREG(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640
    assert abs(st.st_mtime_ns - 1_600_000_000_123_456_000) < 1000
    assert st.st_ino == mounted.fs.stat(f"{tectofs_dir}/f").ino
    assert st.st_uid == os.getuid()
    listing = {line.split()[-1] if "->" not in line else line.split()[-3]: line.split()
               for line in sh("ls", "-l", where).stdout.decode().splitlines()[1:]}
    assert listing["f"][0] == "-rw-r-----"
    assert listing["f"][4] == "12345"
    assert listing["d"][0].startswith("drwxr-x---")
    assert listing["l"][0].startswith("l")
    assert os.readlink(f"{where}/l") == "f"
    with open(f"{where}/l", "rb") as f:
        assert f.read() == b"z" * 12345
    assert sorted(os.listdir(where)) == ["d", "f", "l"]
    names = sh("ls", "-a", where).stdout.decode().split()
    assert "." in names
    assert ".." in names
    vfs = os.statvfs(where)
    assert vfs.f_namemax == 255
    assert vfs.f_blocks > 0


def test_errors_reach_callers_as_errno(mounted: Mounted) -> None:
    where, _ = mounted.fresh_dir("errors")
    os.mkdir(f"{where}/d")
    with open(f"{where}/d/f", "wb") as f:
        f.write(b"x")
    cases: list[tuple[int, Callable[[], Any]]] = [
        (errno.ENOENT, lambda: open(f"{where}/missing", "rb")),
        (errno.ENOENT, lambda: os.stat(f"{where}/missing/x")),
        (errno.EEXIST, lambda: os.mkdir(f"{where}/d")),
        (errno.EEXIST, lambda: open(f"{where}/d/f", "xb")),
        (errno.ENOTEMPTY, lambda: os.rmdir(f"{where}/d")),
        (errno.EISDIR, lambda: open(f"{where}/d", "wb")),
        (errno.EISDIR, lambda: os.unlink(f"{where}/d")),
        (errno.ENOTDIR, lambda: os.rmdir(f"{where}/d/f")),
        (errno.ENOTDIR, lambda: open(f"{where}/d/f/x", "wb")),
        (errno.EINVAL, lambda: os.rename(f"{where}/d", f"{where}/d/sub")),
        (errno.EPERM, lambda: os.link(f"{where}/d", f"{where}/hard")),
        (errno.EEXIST, lambda: os.link(f"{where}/d/f", f"{where}/d")),
    ]
    for expected, action in cases:
        with pytest.raises(OSError) as raised:
            action()
        assert raised.value.errno == expected, (action, raised.value)


def test_special_files(mounted: Mounted) -> None:
    """FIFOs, sockets and device nodes are stored as metadata and served by the kernel: a FIFO
    made on the mount carries bytes between two processes; tar sees them all."""
    import socket
    import stat as statmod
    import threading

    where, path = mounted.fresh_dir("special")
    os.mkfifo(f"{where}/fifo", 0o640)
    os.mknod(f"{where}/null", statmod.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(f"{where}/disk", statmod.S_IFBLK | 0o600, os.makedev(8, 1))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(f"{where}/sock")
    kinds = {name: statmod.S_IFMT(os.lstat(f"{where}/{name}").st_mode) for name in os.listdir(where)}
    assert kinds == {"fifo": statmod.S_IFIFO, "null": statmod.S_IFCHR, "disk": statmod.S_IFBLK,
                     "sock": statmod.S_IFSOCK}
    st = os.lstat(f"{where}/null")
    umask = os.umask(0)
    os.umask(umask)
    assert (os.major(st.st_rdev), os.minor(st.st_rdev), st.st_mode & 0o7777) == (1, 3, 0o666 & ~umask)
    assert os.lstat(f"{where}/fifo").st_mode & 0o7777 == 0o640 & ~umask
    assert mounted.fs.stat(f"{path}/disk").kind == "block"
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(f"{where}/fifo", "rb").read()))
    reader.start()
    with open(f"{where}/fifo", "wb") as f:
        f.write(b"through the pipe")
    reader.join(timeout=10)
    assert got == [b"through the pipe"]
    os.rename(f"{where}/fifo", f"{where}/fifo2")
    assert statmod.S_ISFIFO(os.lstat(f"{where}/fifo2").st_mode)
    for name in ("fifo2", "null", "disk", "sock"):
        os.unlink(f"{where}/{name}")
    assert os.listdir(where) == []


def test_hard_links(mounted: Mounted) -> None:
    """Names of one inode: data written through one is read through the other, nlink counts
    them, the file goes with its last name, and cp -a / tar keep them linked."""
    where, path = mounted.fresh_dir("hardlinks")
    os.mkdir(f"{where}/d")
    with open(f"{where}/f", "wb") as f:
        f.write(b"first")
    os.link(f"{where}/f", f"{where}/d/g")
    st_f, st_g = os.stat(f"{where}/f"), os.stat(f"{where}/d/g")
    assert st_f.st_ino == st_g.st_ino and st_f.st_nlink == st_g.st_nlink == 2
    with open(f"{where}/d/g", "r+b") as f:
        f.write(b"FIRST")
    with open(f"{where}/f", "rb") as f:
        assert f.read() == b"FIRST"
    assert mounted.fs.stat(f"{path}/f").nlink == 2
    os.unlink(f"{where}/f")
    assert os.stat(f"{where}/d/g").st_nlink == 1
    with open(f"{where}/d/g", "rb") as f:
        assert f.read() == b"FIRST"
    os.link(f"{where}/d/g", f"{where}/h")
    copy = f"{where}/copy"
    os.mkdir(copy)
    subprocess.run(["cp", "-a", f"{where}/d", f"{where}/h", copy], check=True, timeout=60)
    assert os.stat(f"{copy}/d/g").st_ino == os.stat(f"{copy}/h").st_ino
    os.rename(f"{where}/h", f"{where}/d/g")  # two names of one file: nothing happens
    assert os.stat(f"{where}/h").st_nlink == 2


def test_a_file_unlinked_while_open_stays_readable_and_writable(mounted: Mounted) -> None:
    where, path = mounted.fresh_dir("unlinked-open")
    with open(f"{where}/f", "wb") as f:
        f.write(b"kept until the last close")
    reader = open(f"{where}/f", "rb")
    writer = open(f"{where}/f", "r+b")
    try:
        ino = os.fstat(reader.fileno()).st_ino
        os.unlink(f"{where}/f")
        assert not os.path.exists(f"{where}/f")
        time.sleep(1.1)  # the kernel's attributes of the inode expire (the mount's 1 s)
        gone = os.fstat(reader.fileno())  # a nameless inode: answered through an open descriptor
        assert (gone.st_ino, gone.st_nlink, gone.st_size) == (ino, 0, len(b"kept until the last close"))
        writer.seek(0, os.SEEK_END)
        writer.write(b", and appended to")
        writer.flush()
        os.fsync(writer.fileno())
        attrs = mounted.fs.run(mounted.fs.aio.metadata.getattr(messages.InoRequest(ino=ino))).attrs
        assert (attrs.nlink, attrs.size) == (0, len(b"kept until the last close, and appended to"))
        assert reader.read(4) == b"kept"
    finally:
        reader.close()
        writer.close()
    deadline = time.monotonic() + 10  # the handles' leases end as they close
    while time.monotonic() < deadline:
        try:
            mounted.fs.run(mounted.fs.aio.metadata.getattr(messages.InoRequest(ino=ino)))
        except errors.StaleFile:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"inode {ino} outlived its last name and its last handle")


def test_a_file_unlinked_while_open_takes_chmod_chown_and_times_through_its_descriptor(mounted: Mounted) -> None:
    """(``mkstemp``, unlink, then ``fchmod``/``fchown``/``futimens``: the file has no path any
    more; they go by inode number with the descriptor's handle.)"""
    where, _ = mounted.fresh_dir("unlinked-chmod")
    fd = os.open(f"{where}/f", os.O_CREAT | os.O_RDWR, 0o644)
    other = os.open(f"{where}/f", os.O_RDWR)  # a second writer: no change rides on the creator's commit
    try:
        os.write(fd, b"data")
        ino = os.fstat(fd).st_ino
        os.unlink(f"{where}/f")
        os.fchmod(fd, 0o600)
        os.utime(other, ns=(1_000_000_000, 2_000_000_000))
        attrs = mounted.fs.run(mounted.fs.aio.metadata.getattr(messages.InoRequest(ino=ino))).attrs
        assert (attrs.mode & 0o7777, attrs.nlink, attrs.size) == (0o600, 0, 4)
        assert (attrs.atime, attrs.mtime) == pytest.approx((1.0, 2.0))
        seen = os.fstat(fd)
        assert (seen.st_mode & 0o7777, seen.st_atime_ns, seen.st_mtime_ns) == (0o600, 1_000_000_000, 2_000_000_000)
        os.fchown(fd, 4321, -1)  # (the tests run as root)
        attrs = mounted.fs.run(mounted.fs.aio.metadata.getattr(messages.InoRequest(ino=ino))).attrs
        assert (attrs.uid, attrs.mode & 0o7777) == (4321, 0o600)
        assert os.pread(other, 4, 0) == b"data"
    finally:
        os.close(fd)
        os.close(other)


def test_extended_attributes(mounted: Mounted, tmp_path: Any) -> None:
    """os.*xattr through the mount, and cp -a and tar --xattrs keep them both ways."""
    where, path = mounted.fresh_dir("xattrs")
    with open(f"{where}/f", "wb") as f:
        f.write(b"data")
    os.setxattr(f"{where}/f", "user.colour", b"blue")
    os.setxattr(f"{where}/f", "trusted.note", b"\x00\x01")
    assert os.getxattr(f"{where}/f", "user.colour") == b"blue"
    assert sorted(os.listxattr(f"{where}/f")) == ["trusted.note", "user.colour"]
    assert mounted.fs.getxattr(f"{path}/f", "trusted.note") == b"\x00\x01"
    with pytest.raises(OSError) as raised:
        os.setxattr(f"{where}/f", "user.colour", b"red", os.XATTR_CREATE)
    assert raised.value.errno == errno.EEXIST
    with pytest.raises(OSError) as raised:
        os.getxattr(f"{where}/f", "user.missing")
    assert raised.value.errno == errno.ENODATA
    subprocess.run(["cp", "-a", f"{where}/f", f"{where}/copy"], check=True, timeout=COMMAND_TIMEOUT_S)
    assert os.getxattr(f"{where}/copy", "user.colour") == b"blue"
    local = tmp_path / "local"
    subprocess.run(["cp", "-a", f"{where}/f", str(local)], check=True, timeout=COMMAND_TIMEOUT_S)
    assert os.getxattr(local, "user.colour") == b"blue"
    archive = tmp_path / "x.tar"
    subprocess.run(["tar", "--xattrs", "--xattrs-include=*", "-cf", str(archive), "-C", where, "f"], check=True,
                   timeout=COMMAND_TIMEOUT_S)
    os.mkdir(f"{where}/untarred")
    subprocess.run(["tar", "--xattrs", "--xattrs-include=*", "-xf", str(archive), "-C", f"{where}/untarred"],
                   check=True, timeout=COMMAND_TIMEOUT_S)
    assert os.getxattr(f"{where}/untarred/f", "user.colour") == b"blue"
    os.removexattr(f"{where}/f", "user.colour")
    assert os.listxattr(f"{where}/f") == ["trusted.note"]


def test_statfs_reports_usable_capacity_and_inodes(mounted: Mounted) -> None:
    where, _ = mounted.fresh_dir("statfs")
    # Capacity follows the servers' disks, which other programs on this machine fill and
    # empty between heartbeats: the mount's answer must lie between the service's before and after.
    before = mounted.fs.statfs()
    vfs = os.statvfs(where)
    raw = mounted.fs.statfs()
    assert raw.policy == "rs(4,2)" and raw.capacity > 0
    low, high = sorted((before.capacity * 4 // 6, raw.capacity * 4 // 6))
    assert low - 2 * vfs.f_frsize < vfs.f_blocks * vfs.f_frsize < high + 2 * vfs.f_frsize
    assert vfs.f_bavail <= vfs.f_blocks and vfs.f_ffree > 0 and vfs.f_files >= raw.files + vfs.f_ffree - 1000
    assert vfs.f_namemax == 255


def test_paths_deeper_than_path_max(mounted: Mounted) -> None:
    """The kernel bounds each path a process passes (PATH_MAX, relative to a directory it
    holds), not how deep a tree goes: absolute paths of 6,000 bytes work."""
    where, path = mounted.fresh_dir("deep")
    name = "d" * 200
    fd = os.open(where, os.O_DIRECTORY)
    try:
        for _ in range(30):
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        out = os.open("f", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd)
        os.write(out, b"deep")
        os.close(out)
    finally:
        os.close(fd)
    deep = path + ("/" + name) * 30 + "/f"
    assert len(deep) > 6000 and mounted.fs.read_bytes(deep) == b"deep"


def test_torch_save_and_load(mounted: Mounted) -> None:
    torch = pytest.importorskip("torch")
    import io

    where, tectofs_dir = mounted.fresh_dir("torch")
    state = {"weight": torch.randn(512, 1024), "bias": torch.arange(1000, dtype=torch.int64),
             "half": torch.randn(300, 300).to(torch.bfloat16), "step": 7}
    torch.save(state, f"{where}/model.pt")
    loaded = torch.load(f"{where}/model.pt")
    assert loaded["step"] == 7
    for key in ("weight", "bias", "half"):
        assert torch.equal(loaded[key], state[key])
    mapped = torch.load(f"{where}/model.pt", mmap=True)
    assert torch.equal(mapped["weight"], state["weight"])
    via_client = torch.load(io.BytesIO(mounted.fs.read_bytes(f"{tectofs_dir}/model.pt")))
    assert torch.equal(via_client["weight"], state["weight"])


def test_parallel_writers_and_readers(mounted: Mounted) -> None:
    """Several threads write and read different files at once (multi-threaded serving)."""
    where, _ = mounted.fresh_dir("parallel")
    payloads = {i: random.Random(i).randbytes(2 * MiB + i * 1000) for i in range(4)}
    failures: list[BaseException] = []
    stop = threading.Event()

    def worker(i: int) -> None:
        try:
            for _ in range(2):
                with open(f"{where}/f{i}", "wb") as f:
                    f.write(payloads[i])
                with open(f"{where}/f{i}", "rb") as f:
                    assert f.read() == payloads[i]
        except BaseException as exc:  # reported below
            failures.append(exc)

    def lister() -> None:
        while not stop.is_set():
            os.listdir(where)

    threads = [threading.Thread(target=worker, args=(i,)) for i in payloads]
    watcher = threading.Thread(target=lister)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=COMMAND_TIMEOUT_S)
    stop.set()
    watcher.join(timeout=10)
    assert not failures, failures
    assert sorted(os.listdir(where)) == [f"f{i}" for i in payloads]


# ---------------------------------------------------------------------- two mounts, faults


def test_close_to_open_across_two_mounts(mounted: Mounted, cluster: Any, tmp_path: Any) -> None:
    second = start_mount_process(cluster.address, str(tmp_path / "second"), log_path=str(tmp_path / "second.log"))
    try:
        where, _ = mounted.fresh_dir("c2o")
        other = os.path.join(second.mountpoint, os.path.basename(where))
        for i in range(4):
            data = os.urandom(10 + 700_000 * i)
            if i:
                os.stat(f"{other}/f")  # the second kernel now caches the old size ...
            with open(f"{where}/f", "wb") as f:
                f.write(data)
            with open(f"{other}/f", "rb") as f:  # ... and must not use it after this open
                assert f.read() == data
        with open(f"{where}/f.tmp", "wb") as f:
            f.write(b"committed by rename")
        os.replace(f"{where}/f.tmp", f"{where}/f")
        with open(f"{other}/f", "rb") as f:
            assert f.read() == b"committed by rename"
    finally:
        second.stop()


def test_chunk_server_loss_is_invisible_to_readers_and_writes_fail_cleanly(
    make_cluster: Callable[..., Any], tmp_path: Any
) -> None:
    own = make_cluster()
    process = start_mount_process(own.address, str(tmp_path / "mnt"), log_path=str(tmp_path / "mount.log"))
    try:
        root = process.mountpoint
        data = os.urandom(6 * MiB + 1)
        with open(f"{root}/f", "wb") as f:
            f.write(data)
        own.kill_chunk_server(0)
        own.kill_chunk_server(3)
        with open(f"{root}/f", "rb") as f:  # rs(4,2): any 4 of 6 chunks rebuild each block
            assert f.read() == data
        # Four of six servers left: a new rs(4,2) block cannot be placed.
        with pytest.raises(OSError) as raised:
            with open(f"{root}/g", "wb") as f:
                f.write(os.urandom(3 * MiB))
        assert raised.value.errno == errno.ENOSPC
    finally:
        process.stop()


# ---------------------------------------------------------------------- model-based


def test_mount_behaves_like_a_local_directory(mounted: Mounted, tmp_path: Any) -> None:
    """Hypothesis: data, names, hard links, FIFOs, modes, owners, xattrs and files held open
    across renames and unlinks, the same under the mount as on a local disk (as root; the
    same machine runs as an ordinary user in test_fuse_multiuser.py)."""
    from tests import mount_model

    where, _ = mounted.fresh_dir("model")
    local = tmp_path / "local"
    local.mkdir()
    mount_model.run(where, str(local), examples=30, steps=20)
