"""Atomic publish: new content becomes visible only through a successful commit. A write that
fails — servers missing, an exception inside ``with``, Ctrl-C — leaves the previous version
(or, for a new file, no file at all), through the library, ``tectofs put`` and the mount."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from tectofs import errors, limits

pytestmark = pytest.mark.slow  # starts processes (the fast lane is in-process: tests/conftest.py)

MiB = 1 << 20


def _cli(cluster: Any, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tectofs.cli", args[0], "--meta", cluster.address, *args[1:]],
                          capture_output=True, text=True, timeout=120, **kwargs)


def _without_servers(c: Any, count: int) -> None:
    """Kill ``count`` chunk servers and wait until the MDS counts them dead."""
    for i in range(count):
        c.kill_chunk_server(i)
    deadline = time.monotonic() + 30
    while sum(s.live for s in c.servers()) > len(c.chunk_data_dirs) - count:
        assert time.monotonic() < deadline, "the metadata service still counts killed servers live"
        time.sleep(0.2)


def test_failed_writes_publish_nothing(make_cluster: Callable[..., Any], tmp_path: Any) -> None:
    c = make_cluster()
    fs = c.fs
    fs.mkdir("/d", policy="rep(6)")  # readable with 5 of 6 servers gone, not writable (needs 2)
    old = os.urandom(3 * MiB)
    fs.write_bytes("/d/good", old)
    _without_servers(c, 5)

    with pytest.raises(errors.NoSpace):  # an overwrite of a good file
        fs.write_bytes("/d/good", os.urandom(MiB))
    assert fs.read_bytes("/d/good") == old
    with pytest.raises(errors.NoSpace):  # a new file: no 0-byte leftover
        fs.write_bytes("/d/new", os.urandom(MiB))
    assert not fs.exists("/d/new")
    with pytest.raises(errors.NoSpace):  # a file object, failing at close
        with fs.open("/d/new-file-object", "wb") as f:
            f.write(b"x" * (limits.inline_bytes_default + 1))
    assert not fs.exists("/d/new-file-object")
    with fs.open("/d/small", "wb") as f:  # a small file lives in the metadata store: no chunk server needed
        f.write(b"x" * 1000)
    assert fs.read_bytes("/d/small") == b"x" * 1000

    local = tmp_path / "one-mib.bin"
    local.write_bytes(os.urandom(MiB))
    put = _cli(c, "put", "-q", str(local), "/d/good")
    assert put.returncode != 0 and "live chunk servers" in put.stderr, put.stderr
    assert fs.read_bytes("/d/good") == old
    put = _cli(c, "put", "-q", str(local), "/d/put-new")
    assert put.returncode != 0
    assert not fs.exists("/d/put-new")
    _cp_through_mount_fails(c, str(local), tmp_path, old)


def _cp_through_mount_fails(c: Any, local: str, tmp_path: Any, old: bytes) -> None:
    from tests.test_fuse import _REASON

    if _REASON is not None:
        return
    from tectofs.client.fuse import start_mount_process

    where = str(tmp_path / "mnt")
    os.mkdir(where)
    with start_mount_process(c.address, where, log_path=str(tmp_path / "mount.log")):
        cp = subprocess.run(["cp", local, f"{where}/d/good"], capture_output=True, text=True, timeout=120)
        assert cp.returncode != 0, "cp over a good file reported success"
        cp = subprocess.run(["cp", local, f"{where}/d/cp-new"], capture_output=True, text=True, timeout=120)
        assert cp.returncode != 0
    assert c.fs.read_bytes("/d/good") == old
    assert not c.fs.exists("/d/cp-new")


def test_an_exception_inside_with_publishes_nothing(cluster: Any) -> None:
    fs = cluster.fs
    fs.write_bytes("/with-old", b"the previous version")
    for mode in ("wb", "w+b", "r+b"):
        with pytest.raises(RuntimeError):
            with fs.open("/with-old", mode) as f:
                f.write(os.urandom(3 * MiB))  # whole blocks were already sent: they go to GC
                raise RuntimeError("training crashed")
        assert fs.read_bytes("/with-old") == b"the previous version", mode
    with pytest.raises(RuntimeError):
        with fs.open("/with-new", "wb") as f:
            f.write(b"partial")
            raise RuntimeError("training crashed")
    assert not fs.exists("/with-new")
    f = fs.open("/explicit-abort", "wb")
    f.write(b"never")
    f.abort()
    assert not fs.exists("/explicit-abort")


def _ctrl_c_as_at_a_terminal() -> None:
    """A shell that runs the test suite as a background job (``.ci/run &``) starts it with
    SIGINT ignored, and children inherit that: give the child the default, as a terminal does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("existing", [False, True])
def test_ctrl_c_during_put_publishes_nothing(cluster: Any, tmp_path: Any, existing: bool) -> None:
    fs = cluster.fs
    target = f"/interrupted-{existing}"
    if existing:
        fs.write_bytes(target, b"keep me")
    fifo = str(tmp_path / "source")
    os.mkfifo(fifo)
    put = subprocess.Popen([sys.executable, "-m", "tectofs.cli", "put", "--meta", cluster.address, fifo, target],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_as_at_a_terminal)
    try:
        with open(fifo, "wb") as source:  # blocks until put opened it
            source.write(os.urandom(5 * MiB))  # some whole blocks go out; then the source stalls
            source.flush()
            time.sleep(1.0)
            put.send_signal(signal.SIGINT)
            _, stderr = put.communicate(timeout=60)
    finally:
        if put.poll() is None:
            put.kill()
    assert put.returncode == 130, stderr
    assert "interrupted; nothing it was writing was published" in stderr
    assert "Traceback" not in stderr
    if existing:
        assert fs.read_bytes(target) == b"keep me"
    else:
        assert not fs.exists(target)


def test_put_into_a_missing_directory_is_an_error(cluster: Any, tmp_path: Any) -> None:
    local = tmp_path / "small.bin"
    local.write_bytes(b"small")
    put = _cli(cluster, "put", "-q", str(local), "/nodir/")
    assert put.returncode != 0 and "not a directory" in put.stderr, put.stderr
    assert not cluster.fs.exists("/nodir")


# ---------------------------------------------------------------------- identity and CLI safety


def test_second_chunk_server_on_a_used_directory_refuses(cluster: Any) -> None:
    data_dir = cluster.chunk_data_dirs[0]
    second = subprocess.run([sys.executable, "-m", "tectofs.cli", "chunk", "--data", data_dir, "--meta", cluster.address,
                             "--port", "0", "--key-file", cluster.key_file], capture_output=True, text=True, timeout=60)
    assert second.returncode != 0
    assert "in use by another chunk server" in second.stderr, second.stderr
    assert sum(s.live for s in cluster.servers()) == len(cluster.chunk_data_dirs)
    cluster.fs.write_bytes("/after-second-server", b"still fine")
    assert cluster.fs.read_bytes("/after-second-server") == b"still fine"


def test_up_check_does_not_touch_a_running_cluster(cluster: Any, tmp_path: Any) -> None:
    before = sorted(os.listdir(cluster.root))
    import tectofs

    source = os.path.dirname(os.path.dirname(os.path.abspath(tectofs.__file__)))  # this tree, from any cwd
    check = subprocess.run([sys.executable, "-m", "tectofs.cli", "up", "--check", "--port", "0"],
                           capture_output=True, text=True, timeout=180, cwd=cluster.root,
                           env={**os.environ, "PYTHONPATH": source})
    assert check.returncode == 0, check.stderr
    assert sorted(os.listdir(cluster.root)) == before  # no ./tectofs-data next to the cluster's files
    assert sum(s.live for s in cluster.servers()) == len(cluster.chunk_data_dirs)


def test_cli_refuses_what_it_cannot_do_safely(cluster: Any) -> None:
    fs = cluster.fs
    fs.write_bytes("/keep-me", b"x")
    rm = _cli(cluster, "rm", "-r", "/")
    assert rm.returncode != 0 and "refusing to remove" in rm.stderr, rm.stderr
    assert fs.read_bytes("/keep-me") == b"x"
    fs.mkdir("/policy-dir", policy="rs(4,2)")
    again = _cli(cluster, "mkdir", "-p", "--policy", "rep(3)", "/policy-dir")
    assert again.returncode != 0 and "exists with policy rs(4,2)" in again.stderr, again.stderr
    assert fs.stat("/policy-dir").policy == "rs(4,2)"
    changed = _cli(cluster, "set-policy", "--policy", "rep(3)", "/policy-dir")
    assert changed.returncode == 0, changed.stderr
    assert fs.stat("/policy-dir").policy == "rep(3)"
    wide = _cli(cluster, "mkdir", "--policy", "rs(10,4)", "/too-wide")
    assert wide.returncode != 0 and "needs 14 chunk servers; this cluster has 6" in wide.stderr, wide.stderr
    assert not fs.exists("/too-wide")


def test_up_restarts_a_child_that_died(tmp_path: Any) -> None:
    up = subprocess.Popen([sys.executable, "-m", "tectofs.cli", "up", "--root", str(tmp_path / "root"), "--port", "0"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_ctrl_c_as_at_a_terminal)
    try:
        lines: list[str] = []

        def read_until(text: str, timeout_s: float) -> str:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                line = up.stdout.readline()  # type: ignore[union-attr]
                lines.append(line)
                if text in line:
                    return line
                assert line, "".join(lines)
            raise AssertionError(f"no {text!r} in: " + "".join(lines))

        address = read_until("export TECTOFS_META=", 120).strip().rsplit("=", 1)[1]
        read_until("press Ctrl-C", 30)
        chunk_2 = f"chunk --data {tmp_path / 'root' / 'chunk-2'} "
        pid = int(subprocess.run(["pgrep", "-f", chunk_2], capture_output=True, text=True).stdout.split()[0])
        os.kill(pid, signal.SIGKILL)
        assert "chunk server 2 exited with code -9" in read_until("chunk server 2 exited", 30)
        read_until("chunk server 2 restarted", 60)
        from tectofs.client import connect

        with connect(address) as fs:
            deadline = time.monotonic() + 30
            while sum(s.live for s in fs.servers()) < 6:
                assert time.monotonic() < deadline
                time.sleep(0.3)
            fs.write_bytes("/after-restart", b"ok")
            assert fs.read_bytes("/after-restart") == b"ok"
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            up.kill()


def test_a_cancelled_write_raises_cancelled_and_leaves_all_of_its_data_or_none(cluster: Any) -> None:
    """Writes cancelled at every point of their life (open, write, commit): each one raises
    CancelledError, and every file holds all of its data or none. Python 3.11's
    ``asyncio.wait_for`` swallowed a cancellation that arrived as its reply did, so a cancelled
    write carried on and committed (74 of 200 here, before the RPC client used ``asyncio.timeout``)."""
    import asyncio

    from tectofs.client import AsyncFileSystem

    data = os.urandom(64 * 1024)

    async def main() -> tuple[int, list[str]]:
        fs = AsyncFileSystem(cluster.address)
        await fs.mkdir("/cancelled")
        swallowed = 0
        try:
            for i in range(100):
                # open "wb", write, commit; abort on any exception, the cancellation included
                task = asyncio.get_running_loop().create_task(fs.write_bytes(f"/cancelled/f{i}", data))
                await asyncio.sleep((i % 20) * 0.0003)
                task.cancel()
                try:
                    await task
                    swallowed += task.cancelling() > 0  # finished despite the cancel
                except asyncio.CancelledError:
                    pass
            whole = []
            for name, _ in await fs.scandir("/cancelled"):
                content = await fs.read_bytes(f"/cancelled/{name}")
                assert content in (b"", data)  # "wb" creates the name at open: empty until the commit
                if content:
                    whole.append(name)
            return swallowed, whole
        finally:
            await fs.close()

    swallowed, whole = asyncio.run(main())
    assert swallowed == 0
    assert len(whole) < 100  # most were cancelled before their commit
