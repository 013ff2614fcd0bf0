"""Every way a ``tectofs mount`` stops ends with exit code 0, no signal, the mount point
unmounted and no crash inside libfuse (``client/fuse/shutdown.py``): ``fusermount3 -u`` then
SIGTERM (which once wrote through libfuse's freed session: SIGSEGV), SIGTERM or SIGINT first,
the metadata service killed first, an unmount and SIGTERM at once.

Before each stop the mount has served listings the kernel keeps, directories the kernel opened
itself, and (in some cases) a directory and a file still open across the stop.
``TECTOFS_SHUTDOWN_REPEAT=5`` runs each stop that many times (races are timing dependent)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from typing import IO, Any, Callable

import pytest

from tests.test_fuse import _fuse_unavailable

_REASON = _fuse_unavailable()
pytestmark = [pytest.mark.fuse, pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

REPEAT = int(os.environ.get("TECTOFS_SHUTDOWN_REPEAT", "1"))
EXIT_WAIT_S = 30.0


class Busy:
    """A mount process that served listings and opens; ``held``: what stays open across the stop."""

    def __init__(self, address: str, tmp: Any, name: str, hold: bool) -> None:
        from tectofs.client.fuse import start_mount_process

        self.mnt = str(tmp / f"mnt-{name}")
        self.mount = start_mount_process(address, self.mnt, log_path=str(tmp / f"mount-{name}.log"))
        self.name = name
        self.held: list[int] = []
        self.held_file: IO[bytes] | None = None
        directory = f"{self.mnt}/{name}"
        os.makedirs(f"{directory}/sub", exist_ok=True)
        for i in range(4):
            with open(f"{directory}/f{i}", "wb") as f:
                f.write(b"x" * (i + 1))
        for _ in range(2):  # the second listing is the kernel's kept copy
            assert sorted(os.listdir(directory)) == ["f0", "f1", "f2", "f3", "sub"]
            os.listdir(self.mnt)
        with open(f"{directory}/f3", "rb") as f:
            assert f.read() == b"xxxx"
        if hold:
            self.held.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY))  # a kernel-opened directory
            self.held_file = open(f"{directory}/open-across-stop", "wb")
            self.held_file.write(b"written, not closed")
            self.held_file.flush()

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.mount.process

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def assert_stopped_cleanly(self) -> None:
        from tectofs.client.fuse import is_mounted

        try:
            code = self.process.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{self.name}: the mount did not exit within {EXIT_WAIT_S:.0f} s:\n{self.mount.log_tail()}")
        crash = _kernel_says_segfault(self.process.pid)
        assert code == 0, f"{self.name}: exit code {code} ({_signal_name(code)}){crash}:\n{self.mount.log_tail()}"
        assert not crash, crash
        deadline = time.monotonic() + 5
        while is_mounted(self.mnt) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_mounted(self.mnt), f"{self.name}: still mounted after the mount exited"
        assert "Traceback" not in self.mount.log_tail(20_000), self.mount.log_tail(20_000)

    def close(self) -> None:
        for fd in self.held:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.held_file is not None:
            try:
                self.held_file.close()
            except OSError:  # the mount is gone: the descriptor's close fails, the data stayed
                pass
        self.mount.stop()


def _signal_name(code: int) -> str:
    return signal.Signals(-code).name if code < 0 else "no signal"


def _kernel_says_segfault(pid: int) -> str:
    """The kernel log's line on a crash of ``pid``, if the log can be read ('' otherwise)."""
    try:
        text = subprocess.run(["dmesg"], capture_output=True, timeout=10).stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line for line in text.splitlines() if f"[{pid}]: segfault" in line]
    return f"; kernel log: {lines[-1].strip()}" if lines else ""


def _fusermount(mnt: str, *flags: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["fusermount3", "-u", *flags, mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _run(address: str, tmp: Any, name: str, hold: bool, stop: Callable[[Busy], None]) -> None:
    """``REPEAT`` times: a busy mount, stopped by ``stop``."""
    for attempt in range(REPEAT):
        busy = Busy(address, tmp, f"{name}-{attempt}", hold)
        try:
            stop(busy)
            busy.assert_stopped_cleanly()
        finally:
            busy.close()


@pytest.mark.parametrize("delay_s", [0.0, 0.02])
def test_unmount_then_sigterm(cluster: Any, tmp_path: Any, delay_s: float) -> None:
    """The unmount ends the session; the SIGTERM that follows finds it gone (it crashed there)."""
    def stop(busy: Busy) -> None:
        assert _fusermount(busy.mnt).wait(timeout=30) == 0
        time.sleep(delay_s)
        busy.signal(signal.SIGTERM)
        time.sleep(0.05)
        if busy.process.poll() is None:
            busy.signal(signal.SIGTERM)

    _run(cluster.address, tmp_path, f"unmount-term-{delay_s}", False, stop)


def test_lazy_unmount_with_files_open_then_sigterm(cluster: Any, tmp_path: Any) -> None:
    """A lazy unmount leaves the session serving what is open; SIGTERM then ends it."""
    def stop(busy: Busy) -> None:
        assert _fusermount(busy.mnt, "-z").wait(timeout=30) == 0
        busy.signal(signal.SIGTERM)

    _run(cluster.address, tmp_path, "lazy-term", True, stop)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_first_with_files_open(cluster: Any, tmp_path: Any, sig: signal.Signals) -> None:
    """A signal stops a mount that has a directory and a file open; the file is committed."""
    def stop(busy: Busy) -> None:
        busy.signal(sig)
        time.sleep(0.01)
        busy.signal(sig)  # a second one, as an impatient user sends, while it stops

    _run(cluster.address, tmp_path, sig.name, True, stop)
    for attempt in range(REPEAT):
        assert cluster.fs.read_bytes(f"/{sig.name}-{attempt}/open-across-stop") == b"written, not closed"


@pytest.mark.parametrize("order", ["unmount-first", "sigterm-first"])
def test_unmount_and_sigterm_at_once(cluster: Any, tmp_path: Any, order: str) -> None:
    def stop(busy: Busy) -> None:
        if order == "sigterm-first":
            busy.signal(signal.SIGTERM)
        unmount = _fusermount(busy.mnt)
        if order == "unmount-first":
            busy.signal(signal.SIGTERM)
        unmount.wait(timeout=30)  # one of the two unmounts finds nothing to unmount: fine
        busy.signal(signal.SIGTERM)

    _run(cluster.address, tmp_path, order, False, stop)


@pytest.mark.parametrize("how", ["sigterm", "unmount"])
def test_metadata_service_gone_then_stop(make_cluster: Callable[..., Any], tmp_path: Any, how: str) -> None:
    """With the metadata service killed, the mount still stops (what is open cannot be
    committed: the log says so). A cluster per attempt: a restarted service holds changes back
    for a lease's length."""
    for attempt in range(REPEAT):
        cluster = make_cluster(servers=3, policy="rs(2,1)")
        busy = Busy(cluster.address, tmp_path, f"meta-gone-{how}-{attempt}", how == "sigterm")
        try:
            cluster.kill_meta()
            if how == "unmount":
                assert _fusermount(busy.mnt).wait(timeout=30) == 0
                time.sleep(0.02)
            busy.signal(signal.SIGTERM)
            busy.assert_stopped_cleanly()
        finally:
            busy.close()  # (make_cluster stops the clusters)
