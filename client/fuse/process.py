"""A ``tectofs mount`` as a child process (for ``tectofs up --mount``, tests and benchmarks):
start it, wait until the kernel lists the mount, unmount and reap it. Needs no libfuse in
the parent: only ``fusermount3`` and ``/proc/self/mounts``."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import time
from typing import Any

from tectofs import children
from tectofs.diagnostics import file_tail
from tectofs.errors import TectofsError, Timeout

log = logging.getLogger("tectofs.fuse")

mount_wait_s = 30.0                       # start_mount_process: time for the mount to appear
unmount_wait_s = 30.0                     # MountProcess.stop: time for the daemon to exit


def is_mounted(mountpoint: str) -> bool:
    """Whether ``mountpoint`` appears in /proc/self/mounts (never touches the mount itself,
    so a dead or uninitialized FUSE daemon cannot make it block)."""
    mountpoint = os.path.abspath(mountpoint)
    try:
        with open("/proc/self/mounts") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 1 and _unescape_mount_path(fields[1]) == mountpoint:
                    return True
    except OSError:
        return os.path.ismount(mountpoint)
    return False


def _unescape_mount_path(text: str) -> str:
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


class MountProcess:
    """A ``tectofs mount`` child process serving one mountpoint; :meth:`stop` unmounts it."""

    def __init__(self, process: subprocess.Popen[bytes], mountpoint: str, log_path: str) -> None:
        self.process = process
        self.mountpoint = mountpoint
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, max_bytes: int = 4000) -> str:
        return file_tail(self.log_path, max_bytes)

    def stop(self, timeout_s: float = unmount_wait_s) -> None:
        """Unmount (``fusermount3 -u``, lazily if the mount is busy) and reap the daemon;
        escalates to SIGTERM, then SIGKILL, if it does not exit in time. Idempotent."""
        deadline = time.monotonic() + timeout_s
        if is_mounted(self.mountpoint):
            for attempt in range(10):
                if _fusermount(["-u", self.mountpoint]) == 0 or not is_mounted(self.mountpoint):
                    break
                time.sleep(0.1 * (attempt + 1))
            else:
                log.warning("%s is busy; unmounting lazily", self.mountpoint)
                _fusermount(["-u", "-z", self.mountpoint])
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            if sig is not None and self.process.poll() is None:
                log.warning("mount daemon %d did not exit; sending %s", self.process.pid, sig.name)
                self.process.send_signal(sig)
            try:
                self.process.wait(timeout=max(1.0, deadline - time.monotonic()) if sig is None else 10)
                break
            except subprocess.TimeoutExpired:
                continue
        if is_mounted(self.mountpoint):  # the daemon died under a mount: clear the dead endpoint
            _fusermount(["-u", "-z", self.mountpoint])

    def __enter__(self) -> "MountProcess":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _fusermount(args: list[str]) -> int:
    try:
        return subprocess.run(["fusermount3", *args], capture_output=True, timeout=30).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("fusermount3 %s failed: %s", " ".join(args), exc)
        return -1


def start_mount_process(address: str, mountpoint: str, *, single_thread: bool = False,
                        attr_timeout_s: float | None = None, timeout_s: float = mount_wait_s,
                        log_path: str | None = None, debug: bool = False, credentials: str | None = None,
                        multi_user: bool | None = None, default_permissions: bool = True,
                        negative_cache_s: float | None = None, leases: bool = True,
                        xattrs: bool = True, async_creates: bool = True,
                        kernel_opens_directories: bool = True) -> MountProcess:
    """Run ``python -m tectofs.cli mount --meta ADDRESS MOUNTPOINT`` as a child process and
    return once the kernel lists the mount; raises :class:`Timeout` (with the daemon's log)
    if it does not appear within ``timeout_s``. Call ``.stop()`` to unmount. The other
    options are :func:`tectofs.client.fuse.mount.mount`'s."""
    mountpoint = os.path.abspath(mountpoint)
    os.makedirs(mountpoint, exist_ok=True)
    if is_mounted(mountpoint):
        raise TectofsError(f"{mountpoint} is already a mount point: unmount it first (fusermount3 -u {mountpoint})")
    if log_path is None:
        descriptor, log_path = tempfile.mkstemp(prefix="tectofs-mount-", suffix=".log")
        os.close(descriptor)
    command = children.cli_command("mount", "--meta", address, mountpoint)
    if single_thread:
        command.append("--single-thread")
    if not leases:
        command.append("--no-leases")
    if not xattrs:
        command.append("--no-xattrs")
    if not async_creates:
        command.append("--no-async-creates")
    if not kernel_opens_directories:
        command.append("--mount-opens-directories")
    if attr_timeout_s is not None:
        command += ["--attr-timeout", str(attr_timeout_s)]
    if debug:
        command.append("--debug")
    if credentials is not None:
        command += ["--credentials", credentials]
    if multi_user is not None:
        command.append("--allow-other" if multi_user else "--single-user")
    if not default_permissions:
        command.append("--no-default-permissions")
    if negative_cache_s is not None:
        command += ["--negative-entry-cache", str(negative_cache_s)]
    with open(log_path, "ab") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True, env=children.cli_env())
    handle = MountProcess(process, mountpoint, log_path)
    deadline = time.monotonic() + timeout_s
    while not is_mounted(mountpoint):
        if process.poll() is not None:
            raise TectofsError(f"tectofs mount of {address} on {mountpoint} exited with code "
                               f"{process.returncode}:\n{handle.log_tail()}")
        if time.monotonic() > deadline:
            handle.stop()
            raise Timeout(f"{mountpoint} was not mounted within {timeout_s:.0f}s; daemon log:\n{handle.log_tail()}")
        time.sleep(0.05)
    return handle


def raise_read_ahead(mountpoint: str, read_ahead_bytes: int) -> None:
    """Let the kernel read ahead ``read_ahead_bytes`` on this mount.

    The kernel caps a FUSE mount's read-ahead at its device's setting (128 KiB by default)
    and, when the INIT reply arrives, at that reply's ``max_readahead`` (pyfuse3 answers the
    kernel's own offer, 128 KiB), so sequential reads would arrive as 128 KiB requests, each a
    round trip through this process. Raising the device setting once the INIT reply is sent
    (``TectofsOperations.init``) makes them 1 MiB requests, several in flight. Reads
    /proc/self/mountinfo rather than stat()ing the mount, which could wait for the mount
    itself. Needs root; without it reads are just slower."""
    try:
        with open("/proc/self/mountinfo") as f:
            devices = [line.split()[2] for line in f if _unescape_mount_path(line.split()[4]) == mountpoint]
        if not devices:
            return
        with open(f"/sys/class/bdi/{devices[-1]}/read_ahead_kb", "w") as f:
            f.write(str(read_ahead_bytes // 1024))
    except (OSError, IndexError) as exc:
        log.info("read-ahead of %s stays at the kernel default: %s", mountpoint, exc)
