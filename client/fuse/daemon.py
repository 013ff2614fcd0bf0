"""``tectofs mount --daemon``: fork, detach, and log to a file (never to /dev/null).

The daemon's stdout, stderr and log events are appended to :func:`log_path`: the process's
``--log-file`` if one was given, else ``mount-<mountpoint>.log`` in the tectofs state
directory (``tectofs.logs.state_dir()``). A daemon that cannot mount sends its reason to the
waiting parent, which raises it as ``SystemExit`` naming the log.
"""

from __future__ import annotations

import logging
import os
import select
import time
from typing import Callable

from tectofs.client.fuse.process import mount_wait_s

log = logging.getLogger("tectofs.fuse")


def log_path(mountpoint: str) -> str:
    """Where the daemon serving ``mountpoint`` logs (see the module docstring)."""
    from tectofs import logs

    name = mountpoint.strip("/").replace("/", "-") or "root"
    return logs.log_file() or os.path.join(logs.state_dir(), f"mount-{name}.log")


def daemonize(serve: Callable[[Callable[[], None]], None], mountpoint: str) -> str:
    """Fork before any thread exists; the child detaches and serves, the parent waits until
    the kernel has initialized the mount (or the child failed) and returns the daemon's log
    file (:func:`log_path`)."""
    path = log_path(mountpoint)
    log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_fd)
        os.close(log_fd)
        status = _read_status(read_fd, mount_wait_s)
        os.close(read_fd)
        if status != "ok":
            raise SystemExit(f"tectofs mount: {mountpoint}: {status or 'the daemon exited without mounting'} (log: {path})")
        log.info("%s mounted by daemon %d; its log: %s", mountpoint, pid, path)
        return path
    code = 1
    try:
        os.close(read_fd)
        os.setsid()
        os.chdir("/")
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd in (1, 2):  # log events (to stderr by default) and anything printed land in the log
            os.dup2(log_fd, fd)
        os.close(log_fd)

        def ready() -> None:
            os.write(write_fd, b"ok\n")

        serve(ready)
        code = 0
    except BaseException as exc:  # report to the waiting parent, never return into its code
        log.error("mount daemon failed: %s: %s", type(exc).__name__, exc)
        try:
            os.write(write_fd, f"{type(exc).__name__}: {exc}\n".encode()[:4000])
        except OSError:
            pass
    finally:
        os._exit(code)


def _read_status(fd: int, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    text = b""
    while b"\n" not in text:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return f"no answer from the mount daemon within {timeout_s:.0f}s"
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            text += chunk
    return text.decode(errors="replace").strip()
