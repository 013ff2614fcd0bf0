"""The mount daemon's end: SIGTERM or SIGINT commits what is open, unmounts and exits 0."""

from __future__ import annotations

import os
import signal
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
