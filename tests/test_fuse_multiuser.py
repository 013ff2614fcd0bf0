"""A multi-user FUSE mount: every local user of the node uses one mount, each with the
permissions POSIX gives them, and what each creates is theirs.

The mount runs as root (as the tests do) with root's credential, so it is multi-user by
default (``allow_other``, ``default_permissions``) and runs each request as its caller
(``AsyncFileSystem.acting_as``). Other users are real processes: ``setpriv --reuid=65534``
(``nobody``) and 65533, running coreutils with a timeout. Every test runs twice: with the
kernel checking mode bits first (the default) and with ``--no-default-permissions``, where
only the metadata service checks, so a refusal there proves the request really ran as its
caller.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
import types
import uuid
from typing import Any, Iterator

import pytest

from tests.test_fuse import _fuse_unavailable

MiB = 1 << 20
COMMAND_TIMEOUT_S = 120
NOBODY, OTHER = 65534, 65533
GROUP = 4242  # a supplementary group of no real user

_REASON = _fuse_unavailable()
pytestmark = [pytest.mark.fuse, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

if _REASON is None:
    from tectofs.client.fuse import is_mounted, start_mount_process
    from tectofs.client.fuse import users as fuse_users
    from tectofs.client.fuse.users import choose_sharing


def as_user(uid: int, *command: str, groups: tuple[int, ...] = (),
            stdout: int = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    """``command`` run as ``uid`` (gid ``uid``, supplementary ``groups`` only)."""
    who = ["setpriv", f"--reuid={uid}", f"--regid={uid}"]
    who += [f"--groups={','.join(map(str, groups))}"] if groups else ["--clear-groups"]
    return subprocess.run(who + list(command), stdout=stdout, stderr=subprocess.PIPE, timeout=COMMAND_TIMEOUT_S,
                          cwd="/")


def ok(result: subprocess.CompletedProcess[bytes]) -> bytes:
    assert result.returncode == 0, f"{result.args} failed: {result.stderr.decode(errors='replace')}"
    return result.stdout


def refused(result: subprocess.CompletedProcess[bytes], message: str) -> None:
    """The command failed with ``message`` (strerror of EACCES or EPERM)."""
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode != 0 and message in stderr, f"{result.args}: expected {message!r}, got" \
        f" code {result.returncode}, stderr {stderr!r}"


def sha(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _world_reachable_dir(prefix: str) -> str:
    """A new directory every user can reach (pytest's tmp_path is root's alone, 0700)."""
    path = tempfile.mkdtemp(prefix=prefix)
    os.chmod(path, 0o755)
    return path


@pytest.fixture(scope="module", params=[True, False], ids=["kernel-checks-too", "metadata-service-only"])
def mountpoint(request: pytest.FixtureRequest, cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    where = _world_reachable_dir("tectofs-multiuser-")
    process = start_mount_process(cluster.address, where, credentials=cluster.credential_file,
                                  default_permissions=request.param,
                                  log_path=str(tmp_path_factory.mktemp("mount-log") / "mount.log"))
    try:
        with open("/proc/self/mounts") as f:
            options = next(line.split()[3] for line in f if line.split()[1] == where).split(",")
        assert "allow_other" in options and ("default_permissions" in options) == request.param, options
        yield where
    finally:
        process.stop()
        assert not is_mounted(where), f"{where} is still mounted"
        os.rmdir(where)


@pytest.fixture
def base(mountpoint: str) -> str:
    """A fresh root-owned 0755 directory in the mount."""
    path = os.path.join(mountpoint, f"t-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    os.chmod(path, 0o755)
    return path


def _root_makes(base: str) -> tuple[str, str, str]:
    """root's /private (0600 file), /secret (0700 dir), /shared (01777 dir) under ``base``."""
    private, secret, shared = (os.path.join(base, name) for name in ("private", "secret", "shared"))
    with open(private, "wb") as f:
        f.write(b"root's secret\n")
    os.chmod(private, 0o600)
    os.mkdir(secret)
    os.chmod(secret, 0o700)
    os.mkdir(shared)
    os.chmod(shared, 0o1777)
    return private, secret, shared


# ---------------------------------------------------------------------- refusals


def test_other_users_get_what_posix_gives_them(base: str) -> None:
    private, secret, shared = _root_makes(base)
    assert b"private" in ok(as_user(NOBODY, "ls", base))  # allow_other: nobody is let in at all
    refused(as_user(NOBODY, "cat", private), "Permission denied")
    refused(as_user(NOBODY, "sh", "-c", f"echo x >> {private}"), "Permission denied")
    refused(as_user(NOBODY, "touch", f"{secret}/x"), "Permission denied")
    refused(as_user(NOBODY, "ls", secret), "Permission denied")
    refused(as_user(NOBODY, "rm", "-f", private), "Permission denied")  # base is root's 0755
    refused(as_user(NOBODY, "mkdir", f"{base}/mine"), "Permission denied")
    refused(as_user(NOBODY, "chmod", "777", private), "Operation not permitted")
    refused(as_user(NOBODY, "chown", str(NOBODY), private), "Operation not permitted")
    refused(as_user(NOBODY, "touch", "-d", "2001-01-01", private), "Permission denied")
    # nothing of root's changed
    st = os.stat(private)
    assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o600, 0)
    with open(private, "rb") as f:
        assert f.read() == b"root's secret\n"
    assert os.listdir(secret) == []


def test_what_a_user_creates_is_theirs(base: str) -> None:
    _, _, shared = _root_makes(base)
    mine = f"{shared}/mine"
    ok(as_user(NOBODY, "sh", "-c", f"echo one > {mine} && echo two >> {mine}"))
    st = os.stat(mine)  # as root
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY, NOBODY, 0o644)
    assert ok(as_user(NOBODY, "cat", mine)) == b"one\ntwo\n"
    assert ok(as_user(NOBODY, "ls", shared)).split() == [b"mine"]
    ok(as_user(NOBODY, "chmod", "600", mine))  # the owner may
    ok(as_user(NOBODY, "touch", "-d", "2001-01-01", mine))
    assert stat.S_IMODE(os.stat(mine).st_mode) == 0o600 and os.stat(mine).st_mtime < 1e9 + 1e8
    refused(as_user(NOBODY, "chown", "0", mine), "Operation not permitted")  # giving it away: root only
    # the caller's umask shapes new files and directories (the kernel applies it)
    ok(as_user(NOBODY, "sh", "-c", f"umask 077 && echo x > {shared}/f077 && mkdir {shared}/d077"))
    ok(as_user(NOBODY, "sh", "-c", f"umask 022 && mkdir {shared}/d022 && ln -s mine {shared}/link"))
    for name, mode in (("f077", 0o600), ("d077", 0o700), ("d022", 0o755)):
        assert stat.S_IMODE(os.stat(f"{shared}/{name}").st_mode) == mode, name
    for name in ("f077", "d077", "d022", "link"):
        st = os.lstat(f"{shared}/{name}")
        assert (st.st_uid, st.st_gid) == (NOBODY, NOBODY), f"{name} is owned by {st.st_uid}:{st.st_gid}"
    ok(as_user(NOBODY, "touch", f"{shared}/d077/inside"))
    # another user is held to the mode bits nobody chose
    refused(as_user(OTHER, "cat", mine), "Permission denied")
    refused(as_user(OTHER, "touch", f"{shared}/d077/x"), "Permission denied")
    # root cannot be prevented
    with open(mine, "ab") as f:
        f.write(b"three\n")
    with open(mine, "rb") as f:
        assert f.read() == b"one\ntwo\nthree\n"
    assert os.listdir(f"{shared}/d077") == ["inside"]
    os.chown(mine, 0, 0)
    assert os.stat(mine).st_uid == 0
    refused(as_user(NOBODY, "cat", mine), "Permission denied")


def test_search_permission_taken_away_holds_at_once(base: str) -> None:
    """A directory whose owner removes its search permission is closed to them at once, even
    for names just looked up (the kernel may have cached them: with the metadata service as
    the only checker, names are not cached). Found by the mount model: ``link`` gave EEXIST."""
    _, _, shared = _root_makes(base)
    ok(as_user(NOBODY, "sh", "-c", f"mkdir {shared}/d && echo x > {shared}/d/f && cat {shared}/d/f"))
    script = (f"import os\nos.stat({shared + '/d/f'!r})\nos.chmod({shared + '/d'!r}, 0o644)\n"
              f"try:\n    os.link({shared + '/d/f'!r}, {shared + '/d'!r})\n"
              "except OSError as e:\n    print(os.strerror(e.errno))\n")
    assert ok(as_user(NOBODY, sys.executable, "-c", script)).strip() == b"Permission denied"  # not "File exists"
    refused(as_user(NOBODY, "cat", f"{shared}/d/f"), "Permission denied")


def test_a_directory_its_owner_may_not_read_is_refused_at_open(base: str) -> None:
    """``open(dir, O_RDONLY)`` of a mode-0 directory by its (non-root) owner fails with EACCES
    at the open, as on a local disk, whoever checks permissions. Found by the mount model:
    with the metadata service as the only checker, the open succeeded and the ``read`` after
    it gave EISDIR."""
    _, _, shared = _root_makes(base)
    ok(as_user(NOBODY, "mkdir", f"{shared}/closed"))
    ok(as_user(NOBODY, "chmod", "0", f"{shared}/closed"))
    script = (f"import os\ntry:\n    os.open({shared + '/closed'!r}, os.O_RDONLY)\n    print('opened')\n"
              "except OSError as e:\n    print(os.strerror(e.errno))\n")
    assert ok(as_user(NOBODY, sys.executable, "-c", script)).strip() == b"Permission denied"
    refused(as_user(NOBODY, "ls", f"{shared}/closed"), "Permission denied")


def test_sticky_directory(base: str) -> None:
    _, _, shared = _root_makes(base)
    ok(as_user(NOBODY, "sh", "-c", f"echo keep > {shared}/keep"))
    refused(as_user(OTHER, "rm", "-f", f"{shared}/keep"), "Operation not permitted")
    refused(as_user(OTHER, "mv", f"{shared}/keep", f"{shared}/taken"), "Operation not permitted")
    # dd reports an error at close too (a shell's >> would not): the kernel refuses the open,
    # or, with the metadata service alone checking, the commit at close
    refused(as_user(OTHER, "dd", "if=/dev/zero", f"of={shared}/keep", "bs=2", "count=1", "oflag=append",
                    "conv=notrunc", "status=none"), "Permission denied")
    refused(as_user(OTHER, "truncate", "-s", "0", f"{shared}/keep"), "Permission denied")
    assert os.listdir(shared) == ["keep"]
    with open(f"{shared}/keep", "rb") as f:
        assert f.read() == b"keep\n"
    ok(as_user(OTHER, "touch", f"{shared}/others"))  # but may add its own
    ok(as_user(NOBODY, "mv", f"{shared}/keep", f"{shared}/kept"))
    ok(as_user(NOBODY, "rm", f"{shared}/kept"))
    assert os.listdir(shared) == ["others"]
    os.unlink(f"{shared}/others")  # root may


def test_supplementary_groups_count(base: str) -> None:
    """The kernel does not send them: the mount reads them from /proc/PID/status."""
    team = f"{base}/team"
    os.mkdir(team)
    os.chown(team, 0, GROUP)
    os.chmod(team, 0o770)
    refused(as_user(NOBODY, "touch", f"{team}/x"), "Permission denied")
    ok(as_user(NOBODY, "touch", f"{team}/x", groups=(GROUP,)))
    assert os.stat(f"{team}/x").st_uid == NOBODY
    assert ok(as_user(NOBODY, "ls", team, groups=(7, GROUP))).split() == [b"x"]


def test_an_open_file_keeps_the_identity_it_was_opened_with(base: str) -> None:
    """POSIX checks permission at open: a descriptor root opened stays writable in the
    hands of a process of nobody's (its writes and its commit at close are the opener's)."""
    path = f"{base}/roots"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        ok(as_user(NOBODY, "printf", "written by nobody", stdout=fd))
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"written by nobody"
    assert os.stat(path).st_uid == 0
    refused(as_user(NOBODY, "cat", path), "Permission denied")


def test_an_open_descriptor_outlives_the_search_permission_it_was_opened_with(base: str) -> None:
    """A descriptor opened while its path could be walked keeps reading, writing, committing
    and fstat-ing after root takes search permission on its directory away, as on Linux: the
    mount's calls on it name the inode by number, with the handle its open was issued; a new
    open by path is refused."""
    work = f"{base}/work"
    os.mkdir(work)
    os.chmod(work, 0o777)
    script = (f"import os, sys\nf = open({work + '/f'!r}, 'w+b')\nf.write(b'before'); f.flush()\n"
              "print('opened', flush=True)\nsys.stdin.readline()\n"
              "f.write(b' after')\nf.flush()\nos.fsync(f.fileno())\nf.seek(0)\n"
              "data = f.read().decode()\nsize = os.fstat(f.fileno()).st_size\nprint(data, size, flush=True)\nf.close()\n")
    who = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    process = subprocess.Popen(who + [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, cwd="/")
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline() == b"opened\n", process.stderr.read() if process.stderr else b""
        os.chmod(work, 0o700)  # root's now: nobody may not search it
        refused(as_user(NOBODY, "cat", f"{work}/f"), "Permission denied")
        out, err = process.communicate(b"go\n", timeout=COMMAND_TIMEOUT_S)
    finally:
        process.kill()
        process.wait(timeout=COMMAND_TIMEOUT_S)
    assert process.returncode == 0, err.decode(errors="replace")
    assert out == b"before after 12\n"
    with open(f"{work}/f", "rb") as f:
        assert f.read() == b"before after"
    assert os.stat(f"{work}/f").st_uid == NOBODY


# ---------------------------------------------------------------------- data


def test_large_copies_by_another_user(base: str) -> None:
    _, _, shared = _root_makes(base)
    local = _world_reachable_dir("tectofs-multiuser-src-")
    try:
        source = f"{local}/source"
        with open(source, "wb") as f:
            f.write(os.urandom(5 * MiB + 12345))
        os.chmod(source, 0o644)
        ok(as_user(NOBODY, "dd", f"if={source}", f"of={shared}/dd", "bs=1M", "conv=fsync", "status=none"))
        ok(as_user(NOBODY, "cp", source, f"{shared}/cp"))
        expected = sha(source)
        for name in ("dd", "cp"):
            st = os.stat(f"{shared}/{name}")
            assert (st.st_uid, st.st_size) == (NOBODY, 5 * MiB + 12345), name
            assert sha(f"{shared}/{name}") == expected, name
        lines = ok(as_user(NOBODY, "sha256sum", f"{shared}/dd", f"{shared}/cp")).decode().split("\n")
        assert [line.split()[0] for line in lines if line] == [expected, expected]
        ok(as_user(NOBODY, "cmp", source, f"{shared}/dd"))
    finally:
        shutil.rmtree(local)


# ---------------------------------------------------------------------- single-user mounts


def test_single_user_mount_keeps_other_users_out(cluster: Any, tmp_path: Any) -> None:
    where = _world_reachable_dir("tectofs-single-user-")
    process = start_mount_process(cluster.address, where, multi_user=False, log_path=str(tmp_path / "mount.log"))
    try:
        with open("/proc/self/mounts") as f:
            options = next(line.split()[3] for line in f if line.split()[1] == where)
        assert "allow_other" not in options and "default_permissions" not in options, options
        os.listdir(where)  # root, who mounted it
        refused(as_user(NOBODY, "ls", where), "Permission denied")
    finally:
        process.stop()
        os.rmdir(where)


def test_when_a_mount_is_multi_user(monkeypatch: pytest.MonkeyPatch) -> None:
    root = types.SimpleNamespace(name="root", uid=0, proxy=True)
    alice = types.SimpleNamespace(name="alice", uid=1000, proxy=False)
    node = types.SimpleNamespace(name="node", uid=1000, proxy=True)
    assert choose_sharing(None, root, euid=0)[0]
    assert not choose_sharing(False, root, euid=0)[0]
    shared, why = choose_sharing(None, alice, euid=0)
    assert not shared and "not a proxy credential" in why
    assert not choose_sharing(None, None, euid=0)[0]
    with pytest.raises(SystemExit, match="proxy"):
        choose_sharing(True, alice, euid=1000)
    monkeypatch.setattr(fuse_users, "user_allow_other", lambda: False)
    shared, why = choose_sharing(None, node, euid=1000)
    assert not shared and "user_allow_other" in why
    with pytest.raises(SystemExit, match="user_allow_other"):
        choose_sharing(True, node, euid=1000)
    monkeypatch.setattr(fuse_users, "user_allow_other", lambda: True)
    assert choose_sharing(None, node, euid=1000)[0]


def test_mount_behaves_like_a_local_directory_for_an_ordinary_user(base: str) -> None:
    """The Hypothesis model of test_fuse.py (data, names, links, FIFOs, modes, owners,
    xattrs, files held open) run by uid 1000 against a local directory of its own: the
    permission checks agree with the local disk's, step by step."""
    user = 1000
    local = _world_reachable_dir("tectofs-model-local-")
    try:
        os.chown(local, user, user)
        os.chown(base, user, user)
        result = subprocess.run(
            [sys.executable, "-m", "tests.mount_model", base, local, "--as-user", str(user), "--examples", "15"],
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), capture_output=True, timeout=600,
        )
        assert result.returncode == 0, result.stderr.decode(errors="replace")[-6000:]
    finally:
        shutil.rmtree(local, ignore_errors=True)


_WRITE_AFTER_A_LINE = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
print("open", flush=True)
sys.stdin.readline()
os.write(fd, b"another user's bytes")
print(oct(os.fstat(fd).st_mode & 0o7777), flush=True)
os.close(fd)
"""


@pytest.mark.parametrize("granted_by", ["this-mount", "another-client"])
def test_privileges_granted_while_another_user_writes_are_dropped_by_the_next_write(
        base: str, cluster: Any, mountpoint: str, granted_by: str) -> None:
    """A write-only descriptor bypasses the page cache, where the kernel drops set-id bits and
    capabilities at each write by an unprivileged process; the mount does it for such a
    descriptor instead, for privileges given after it was opened, through this mount or through
    another client (the recall says so). A file that has them when opened goes through the page
    cache (pjdfstest's chmod/12.t)."""
    from tectofs.client import connect

    path = os.path.join(base, "granted")
    with open(path, "wb") as f:
        f.write(b"root's program")
    os.chmod(path, 0o777)
    writer = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-c",
         _WRITE_AFTER_A_LINE, path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/")
    try:
        assert writer.stdout is not None and writer.stdin is not None
        assert writer.stdout.readline() == b"open\n"
        if granted_by == "this-mount":  # root makes it set-user-ID and set-group-ID while nobody has it open
            os.chmod(path, 0o6777)
        else:
            with connect(cluster.address, credentials=cluster.credential_file) as fs:
                fs.chmod(path[len(mountpoint):], 0o6777)
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
        out, err = writer.communicate(timeout=COMMAND_TIMEOUT_S)
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.returncode == 0, err.decode(errors="replace")
    assert out.strip() == b"0o777"  # as a local disk shows it to the writer
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o777
    with open(path, "rb") as f:
        assert f.read() == b"another user's bytes"


def test_a_capability_set_while_root_writes_is_dropped_by_roots_next_write(base: str) -> None:
    """Linux removes ``security.capability`` at any write, even by root (set-id bits it keeps for
    root): root's own write-only descriptor, which bypasses the page cache, loses it too."""
    path = os.path.join(base, "capable")
    with open(path, "wb") as f:
        f.write(b"a program")
    capability = struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)  # VFS_CAP_REVISION_2: cap_net_bind_service
    fd = os.open(path, os.O_WRONLY)
    try:
        os.chmod(path, 0o4755)
        os.setxattr(path, "security.capability", capability)
        assert os.getxattr(path, "security.capability") == capability
        os.write(fd, b"new code")
    finally:
        os.close(fd)
    with pytest.raises(OSError) as no_attribute:
        os.getxattr(path, "security.capability")
    assert no_attribute.value.errno == errno.ENODATA
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o4755  # root writes: set-id bits stay, as on a local disk
