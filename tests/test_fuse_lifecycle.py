"""The mount daemon's end: SIGTERM or SIGINT commits what is open, unmounts and exits 0."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.test_fuse import _fuse_unavailable

_REASON = _fuse_unavailable()
pytestmark = [pytest.mark.fuse, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_commits_open_files_and_unmounts(cluster: Any, tmp_path: Any, sig: signal.Signals) -> None:
    from tectofs.client.fuse import is_mounted, start_mount_process

    mnt = str(tmp_path / "mnt")
    mount = start_mount_process(cluster.address, mnt, log_path=str(tmp_path / "mount.log"))
    try:
        name = f"open-at-{sig.name}"
        held = open(f"{mnt}/{name}", "wb")
        held.write(b"written, not closed")
        held.flush()  # in the daemon's file handle, not committed: no close yet
        assert not cluster.fs.exists(f"/{name}") or cluster.fs.stat(f"/{name}").size == 0
        mount.process.send_signal(sig)
        assert mount.process.wait(timeout=30) == 0
        assert not is_mounted(mnt)
        assert cluster.fs.read_bytes(f"/{name}") == b"written, not closed"
        assert "Traceback" not in mount.log_tail()
        with pytest.raises(OSError):
            held.close()  # the mount is gone: the descriptor's close fails, the data stayed
    finally:
        mount.stop()
        assert not os.path.ismount(mnt)


def test_sequential_reads_get_an_8_mib_read_ahead(cluster: Any, tmp_path: Any) -> None:
    """The device read-ahead is raised after the kernel's INIT (which would cap it at 128 KiB),
    so sequential reads reach the daemon as 1 MiB requests."""
    from tectofs.client.fuse import start_mount_process

    if os.geteuid() != 0:
        pytest.skip("raising a device's read-ahead needs root")
    mnt = str(tmp_path / "mnt")
    with start_mount_process(cluster.address, mnt, log_path=str(tmp_path / "mount.log")):
        with open("/proc/self/mountinfo") as f:
            device = [line.split()[2] for line in f if line.split()[4] == mnt][-1]
        os.stat(mnt)  # answered once the kernel's INIT is
        deadline = time.monotonic() + 10
        while True:
            with open(f"/sys/class/bdi/{device}/read_ahead_kb") as f:
                read_ahead_kb = int(f.read())
            if read_ahead_kb == 8192 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert read_ahead_kb == 8192
