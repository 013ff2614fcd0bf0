"""The command line never destroys what is not its own (issue 51, part 5), tried as a user
would: ``get`` into a device, a FIFO or ``-``; Ctrl-C during a ``put``; a drain that could
never finish; ``df`` on servers sharing a disk; the tree benchmark's relative ``--work-dir``.
Exit statuses of every command: tests/test_cli_exits.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from tectofs.wire import messages

MiB = 1 << 20


def tectofs(*args: str, address: str, timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tectofs.cli", *args], capture_output=True,
                          env={**os.environ, "TECTOFS_META": address}, timeout=timeout, **kwargs)


def one_line(result: subprocess.CompletedProcess, command: str) -> str:
    err = result.stderr.decode() if isinstance(result.stderr, bytes) else result.stderr
    assert "Traceback" not in err and "never retrieved" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tectofs {command}: "), err
    return lines[0]


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod needs root")


@needs_root
def test_get_writes_into_devices_and_fifos_and_dash_is_stdout(cluster, tmp_path):
    """``get X /dev/full`` replaced the device by a 256 MiB regular file (and ``/dev/null``
    likewise, as root): an existing device or FIFO is written into, as cp does."""
    a = cluster.address
    data = os.urandom(2 * MiB + 3)
    cluster.fs.write_bytes("/victims.bin", data)

    null = tmp_path / "null"  # our own nodes: /dev/null's and /dev/full's numbers
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    done = tectofs("get", "/victims.bin", str(null), address=a)
    assert done.returncode == 0, done.stderr
    st = os.stat(null)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)

    full = tmp_path / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    failed = tectofs("get", "/victims.bin", str(full), address=a)
    assert failed.returncode == 1 and "No space left on device" in one_line(failed, "get")
    assert str(full) in one_line(failed, "get")
    st = os.stat(full)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 7)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = tectofs("get", "/victims.bin", str(fifo), address=a)
    reader.join(timeout=30)
    assert done.returncode == 0, done.stderr
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and got == [data]

    to_stdout = tectofs("get", "/victims.bin", "-", address=a)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert to_stdout.stdout == data and b"MiB" in to_stdout.stderr  # the summary is not mixed into the data
    assert not os.path.exists("-")
    two = tectofs("get", "/victims.bin", "/victims.bin", "-", address=a)
    assert two.returncode == 2 and "standard output" in one_line(two, "get")


def _default_sigint() -> None:
    """In the child: SIGINT as at a terminal. A suite started in the background by a shell
    inherits it ignored, and so would the put (Python installs its Ctrl-C handler only over the
    default): it would then ignore the test's SIGINT and finish when its input closes."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_interrupted_put_prints_one_line(cluster, tmp_path):
    """Ctrl-C during a put: exit 130 and one line; no "Future exception was never retrieved"
    tracebacks of the sends it cut off (seen in 3 of 7 runs). Interrupted at several points
    of the transfer; the deterministic case is test_a_cancelled_send_leaves_no_unretrieved_failure."""
    block = os.urandom(4 * MiB)
    for i, delay in enumerate((0.0, 0.4)):
        put = subprocess.Popen([sys.executable, "-m", "tectofs.cli", "put", "-", f"/interrupted-{i}"],
                               env={**os.environ, "TECTOFS_META": cluster.address}, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_default_sigint)
        fed = [0]

        def feed(put: subprocess.Popen = put, fed: list[int] = fed) -> None:
            with contextlib.suppress(OSError, ValueError):
                while True:  # until the put goes away
                    put.stdin.write(block)  # type: ignore[union-attr]
                    fed[0] += len(block)

        threading.Thread(target=feed, daemon=True).start()
        deadline = time.monotonic() + 30
        while fed[0] < 24 * MiB:  # it reads standard input: copying is under way
            assert time.monotonic() < deadline and put.poll() is None, put.stderr.read()  # type: ignore[union-attr]
            time.sleep(0.01)
        time.sleep(delay)
        put.send_signal(signal.SIGINT)
        try:
            _, err = put.communicate(timeout=60)
        finally:
            put.kill()
        assert put.returncode == 130, err
        assert one_line(subprocess.CompletedProcess([], 130, b"", err), "put").endswith("was published")
        assert not cluster.fs.exists(f"/interrupted-{i}")


def test_a_cancelled_send_leaves_no_unretrieved_failure():
    """The cause of those tracebacks: a frame sent by a thread whose sender was cancelled (the
    thread then fails, ConnectionLost) left that failure in a future nobody retrieved."""
    from tectofs.wire.transport import FramedProtocol

    class Sink(FramedProtocol):
        def frame_received(self, frame: Any) -> None:
            pass

    async def scenario() -> list[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _, context: reported.append(context))
        ours, peer = socket.socketpair()  # the peer never reads: the thread blocks on a full socket
        try:
            _, protocol = await loop.connect_accepted_socket(Sink, ours)
            sending = asyncio.ensure_future(protocol.send_encoded(b"h" * 16, memoryview(bytearray(8 * MiB))))
            await asyncio.sleep(0.3)
            assert protocol.sending_file  # a thread is sending it
            sending.cancel()
            with contextlib.suppress(BaseException):
                await sending
            del sending
            for _ in range(5):
                gc.collect()
                await asyncio.sleep(0.05)
        finally:
            peer.close()
        return reported

    reported = asyncio.run(scenario())
    assert not [r for r in reported if "never retrieved" in str(r.get("message"))], reported


def test_fsck_of_a_missing_path_is_not_under_redundant(cluster):
    """fsck's 1 means under-redundant blocks, its 2 unreadable ones: its own failures exit 8
    (the check failed) and 16 (usage or configuration), as e2fsck's do."""
    missing = tectofs("fsck", "/nope", address=cluster.address, text=True)
    assert missing.returncode == 8 and "no such file" in one_line(missing, "fsck")
    assert tectofs("fsck", "/", "--meta", "127.0.0.1", address=cluster.address).returncode == 16


def _server_ids(cluster: Any) -> list[int]:
    return [s.server_id for s in cluster.fs.servers()]


def test_a_drain_that_could_never_finish_is_refused_at_once(cluster):
    """README's cluster: six servers, rs(4,2). Draining one leaves five, which cannot hold a
    block of six chunks: 'tectofs admin drain 3 --wait' printed "29 chunks left" forever."""
    cluster.fs.write_bytes("/drain-me.bin", os.urandom(3 * MiB))
    server = str(_server_ids(cluster)[2])
    started = time.monotonic()
    try:
        refused = tectofs("admin", "drain", server, "--wait", address=cluster.address, timeout=30, text=True)
    finally:
        states = {str(s.server_id): s.state for s in cluster.fs.servers()}
        if states[server] != "in":
            tectofs("admin", "drain", server, "--cancel", address=cluster.address)
    assert time.monotonic() - started < 15
    line = one_line(refused, "admin drain")
    assert refused.returncode == 1, line
    assert "rs(4,2)" in line and "need 6 chunk servers" in line and "only 5 would remain" in line, line
    assert states[server] == "in"  # nothing changed: it still takes new chunks


def test_drain_wait_gives_up_when_nothing_moves(make_cluster):
    """``--wait`` has a default timeout (``--timeout``: no chunk moved for that long), and says
    so when it runs out; the server goes on draining until cancelled."""
    c = make_cluster(servers=4, policy="rep(3)")
    c.fs.write_bytes("/one.bin", os.urandom(MiB))
    layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path="/one.bin")))
    holders = {chunk.server_id for block in layout.blocks for chunk in block.chunks}
    by_id = {s.server_id: s.address for s in c.fs.servers()}
    (spare,) = set(by_id) - holders  # the only server a chunk could move to
    addresses = [(c.root and open(os.path.join(c.root, f"chunk-{i}.address")).read().strip()) for i in range(4)]
    process = c.chunk_processes[addresses.index(by_id[spare])]
    assert process is not None
    drained = str(min(holders))
    process.send_signal(signal.SIGSTOP)
    try:
        stalled = tectofs("admin", "drain", drained, "--wait", "--timeout", "2", address=c.address, timeout=30, text=True)
    finally:
        process.send_signal(signal.SIGCONT)
    assert stalled.returncode == 1, stalled.stderr
    message = stalled.stderr.splitlines()[-1]
    assert message.startswith("tectofs admin drain: no chunk moved off chunk server") and "in 2s" in message, message
    assert "--cancel" in message
    assert {str(s.server_id): s.state for s in c.fs.servers()}[drained] == "draining"
    assert tectofs("admin", "drain", drained, "--cancel", address=c.address).returncode == 0
    help_text = tectofs("admin", "drain", "--help", address=c.address, text=True).stdout
    assert "default 600" in " ".join(help_text.split())


def test_df_counts_a_shared_file_system_once(cluster):
    """Six servers on one file system each reported its free space: 429G free on a 73G disk."""
    vfs = os.statvfs(cluster.root)
    disk_free = vfs.f_bavail * vfs.f_frsize
    deadline = time.monotonic() + 20
    while True:  # every server heartbeats its file system within a second
        df = json.loads(tectofs("df", "--json", address=cluster.address, text=True).stdout)
        if df["free"] < 1.5 * disk_free or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert 0.5 * disk_free < df["free"] < 1.5 * disk_free, (df, disk_free)
    assert df["capacity"] <= vfs.f_blocks * vfs.f_frsize + df["used"]


@pytest.mark.slow  # starts a process
def test_tree_benchmark_accepts_a_relative_work_dir(tmp_path, monkeypatch):
    """``tectofs bench tree --work-dir ./benchwork`` failed every system: "import dateutil
    loaded .../benchwork/... not from the tree"."""
    from tectofs.benchmarks import tree

    (tmp_path / "benchwork" / "tree").mkdir(parents=True)
    (tmp_path / "benchwork" / "tree" / "relative_mod.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    tree.import_from("./benchwork/tree", "relative_mod")  # raised RuntimeError
