"""Serving the mount: ``tectofs mount --meta HOST:PORT /mnt/tectofs`` (or :func:`mount`)
connects, chooses single- or multi-user sharing, and runs libfuse over
:class:`~tectofs.client.fuse.TectofsOperations` in the foreground or as a daemon."""

from __future__ import annotations

import functools
import logging
import os
from typing import Callable

from tectofs import diagnostics
from tectofs.client import connect
from tectofs.client.fuse import is_mounted
from tectofs.client.fuse.binding import TectofsFuse
from tectofs.client.fuse.daemon import daemonize
from tectofs.client.fuse.operations import TectofsOperations
from tectofs.client.fuse.users import Callers, choose_sharing
from tectofs.client.sync import FileSystem

log = logging.getLogger("tectofs.fuse")

threads_max = 16  # libfuse worker threads (-o max_threads)
_FUSE_MAIN_STOPPED = 8  # fuse_main's code after the loop ended by a signal (codes 1-7: could not mount)



def _serve(address: str, mountpoint: str, threads: bool, attr_timeout_s: float, debug: bool,
           on_ready: Callable[[], None] | None = None, credentials: str | None = None,
           multi_user: bool | None = None, default_permissions: bool = True, negative_cache_s: float = 0.0) -> None:
    client: list[FileSystem] = []
    diagnostics.dump_tasks_on_sigusr1_from_thread(lambda: client[0].loop if client else None)
    # fails here, before anything is mounted, if the cluster is unreachable or refuses the credential
    fs = connect(address, credentials)
    client.append(fs)
    try:
        who = fs.run(fs.aio.metadata.whoami()) if fs.aio.credential is not None else None
        euid = os.geteuid()
        shared, why = choose_sharing(multi_user, who, euid)
        if shared or multi_user is False:
            log.info("%s: %s", mountpoint, why)
        else:  # fell back to single-user: say why
            log.warning("%s: %s", mountpoint, why)
        callers = Callers(acting=shared, plain_uid=euid if who is not None and who.uid == euid else None)
        kernel_checks = not shared or default_permissions
        operations = TectofsOperations(fs, mountpoint, attr_timeout_s, on_ready, callers,
                                       entry_timeout_s=None if kernel_checks else 0.0,
                                       negative_cache_s=negative_cache_s)
        try:
            TectofsFuse(
                operations, mountpoint, foreground=True, nothreads=not threads, debug=debug,
                # a failover group "A,B" shows as "tectofs:A+B" (libfuse splits options at commas)
                fsname="tectofs:" + address.replace(",", "+"), subtype="tectofs",
                max_threads=threads_max, max_idle_threads=threads_max,
                allow_other=shared, default_permissions=shared and default_permissions,
            )
        except RuntimeError as exc:
            code = exc.args[0] if exc.args else None
            if code == _FUSE_MAIN_STOPPED:  # SIGINT/SIGTERM: libfuse unmounted and stopped serving
                log.info("%s unmounted by a signal", mountpoint)
                return
            # libfuse printed why (mountpoint busy, no /dev/fuse, bad option, ...)
            raise SystemExit(f"tectofs mount: libfuse could not mount {mountpoint} (fuse_main code {code})") from None
    finally:
        fs.close()


def mount(address: str, mountpoint: str, foreground: bool = True, threads: bool = True,
          attr_timeout_s: float = 1.0, debug: bool = False, credentials: str | None = None,
          multi_user: bool | None = None, default_permissions: bool = True,
          negative_cache_s: float = 0.0) -> str | None:
    """Mount the cluster whose metadata service is at ``address`` on ``mountpoint``.

    ``credentials``: the credential file (default: ``tectofs.wire.auth.find_credential``).
    ``multi_user``: serve every local user, each with their own identity and permissions
    (None: when possible, see :func:`choose_sharing`; True: or fail; False: only the user
    running the mount). ``default_permissions=False`` leaves permission checks of a
    multi-user mount to the metadata service alone (the kernel then does not check mode bits
    against cached attributes first; ``access(2)`` then always says yes), and makes every path
    walk ask the service again (no cached names: slower lookups). ``negative_cache_s`` > 0:
    lookups of names absent from a directory this mount made are answered without a call for
    that long after the mount's last change there (creates take one call instead of two;
    another client's new name there may read as absent that long: JuiceFS's
    ``--negative-entry-cache``, off by default there too).

    Foreground: blocks until unmounted (``fusermount3 -u MOUNTPOINT``, SIGINT or SIGTERM).
    Background (``foreground=False``): returns once the mount is serving, leaving a detached
    daemon behind, and returns the file it logs to (``daemon.log_path``: ``--log-file``, else
    one per mount point); raises ``SystemExit`` with the daemon's reason if it could not mount."""
    mountpoint = os.path.abspath(mountpoint)
    if is_mounted(mountpoint):
        raise SystemExit(f"tectofs mount: {mountpoint} is already a mount point: fusermount3 -u {mountpoint} first")
    if not os.path.isdir(mountpoint):
        raise SystemExit(f"tectofs mount: {mountpoint} is not a directory")
    serve = functools.partial(_serve, address, mountpoint, threads, attr_timeout_s, debug, credentials=credentials,
                              multi_user=multi_user, default_permissions=default_permissions,
                              negative_cache_s=negative_cache_s)
    if foreground:
        serve()
        return None
    return daemonize(lambda ready: serve(on_ready=ready), mountpoint)
