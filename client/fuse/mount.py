"""Serving the mount: ``tectofs mount --meta HOST:PORT /mnt/tectofs`` (or :func:`mount`)
connects, chooses single- or multi-user sharing, and runs pyfuse3 (libfuse 3's low-level
API) over :class:`~tectofs.client.fuse.operations.TectofsOperations` on one asyncio event
loop, in the foreground or as a daemon. SIGINT and SIGTERM unmount and stop it; files still
open are committed first. Any mix of them and ``fusermount3 -u``, in any order, ends with exit
code 0 (``shutdown.py`` says what may touch libfuse's session while it stops)."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import Callable

import pyfuse3
import pyfuse3.asyncio

from tectofs import diagnostics
from tectofs.client.core import AsyncFileSystem
from tectofs.client.fuse import device_wait, kernel_opendir, opendir_reply, shutdown
from tectofs.client.fuse.daemon import daemonize
from tectofs.client.fuse.operations import TectofsOperations
from tectofs.client.fuse.process import is_mounted
from tectofs.client.fuse.shutdown import Stopper
from tectofs.client.fuse.users import Callers, choose_sharing

log = logging.getLogger("tectofs.fuse")

requests_in_flight_max = 64  # kernel requests served at once (pyfuse3's max_tasks); --single-thread: 1


def mount_options(address: str, shared: bool, default_permissions: bool, debug: bool) -> set[str]:
    """libfuse's mount options: a failover group "A,B" shows as "tectofs:A+B" (libfuse splits
    options at commas); a multi-user mount lets every local user in (``allow_other``) and
    has the kernel check mode bits first (``default_permissions``, unless turned off)."""
    options = {"fsname=tectofs:" + address.replace(",", "+"), "subtype=tectofs"}
    if shared:
        options.add("allow_other")
        if default_permissions:
            options.add("default_permissions")
    if debug:
        options.add("debug")
    return options


async def _serve_async(address: str, mountpoint: str, threads: bool, attr_timeout_s: float, debug: bool,
                       on_ready: Callable[[], None] | None, credentials: str | None, multi_user: bool | None,
                       default_permissions: bool, negative_cache_s: float, leases: bool, xattrs: bool,
                       async_creates: bool = True, kernel_opens_directories: bool = True) -> None:
    loop = asyncio.get_running_loop()
    diagnostics.dump_tasks_on_sigusr1(loop)
    stopper = Stopper(loop)  # from here on, SIGINT and SIGTERM stop the mount (shutdown.py)
    # fails here, before anything is mounted, if the cluster is unreachable or refuses the credential
    fs = AsyncFileSystem(address, credentials, leases=leases, async_creates=async_creates)
    if fs.claims is not None:  # a close of a small new file does not wait for its sending (a local disk's close)
        fs.claims.commits_in_background = True
    try:
        who = await fs.metadata.whoami() if fs.credential is not None else None
        if who is None:
            await fs.metadata.ping()
        euid = os.geteuid()
        shared, why = choose_sharing(multi_user, who, euid)
        if shared or multi_user is False:
            log.info("%s: %s", mountpoint, why)
        else:  # fell back to single-user: say why
            log.warning("%s: %s", mountpoint, why)
        callers = Callers(acting=shared, plain_uid=euid if who is not None and who.uid == euid else None)
        kernel_checks = not shared or default_permissions
        # The kernel checks every caller's permissions before it asks: what the client cached
        # may answer every caller (else each asks the service, which checks as them).
        fs.views_share_cache = kernel_checks
        operations = TectofsOperations(fs, mountpoint, attr_timeout_s, on_ready, callers,
                                       entry_timeout_s=None if kernel_checks else 0.0,
                                       negative_cache_s=negative_cache_s, xattrs=xattrs)
        if operations.cache.listings.enabled:
            # The kernel opens directories itself where the mount's own user may read every
            # listing the kernel lets a caller read: a single-user mount, or root's.
            handover = kernel_opens_directories and (not shared or (who is not None and who.uid == 0))
            opendir_reply.install(operations.keeps_listing,
                                  (lambda request: kernel_opendir.install(request, mountpoint)) if handover else None)
        if stopper.stopping:
            operations.stop_recalls()
            opendir_reply.uninstall()
            log.info("%s not mounted: %s came first", mountpoint, stopper.by[0])
            return
        try:
            pyfuse3.init(operations, mountpoint, mount_options(address, shared, default_permissions, debug))
        except RuntimeError as exc:  # libfuse logged why (mountpoint busy, no /dev/fuse, bad option, ...)
            opendir_reply.uninstall()
            raise SystemExit(f"tectofs mount: libfuse could not mount {mountpoint}: {exc}") from None
        stopper.serving()
        try:
            await pyfuse3.main(min_tasks=1, max_tasks=requests_in_flight_max if threads else 1)
        finally:
            # In this order (shutdown.py): nothing may use libfuse's session once it is closed.
            stopper.served()
            try:
                operations.stop_recalls()
                await operations.close_all()
            finally:
                opendir_reply.uninstall()
                kernel_opendir.uninstall()
                device_wait.closing()
                await asyncio.to_thread(shutdown.wait_notifications)
                pyfuse3.close(unmount=True)
        log.info("%s unmounted; stopped by %s", mountpoint, stopper.ended_by())
    finally:
        try:
            await fs.close()
        finally:  # before the loop closes its wakeup pipe, which the stop signals' handler writes to
            shutdown.ignore_stop_signals()


def _serve(address: str, mountpoint: str, threads: bool, attr_timeout_s: float, debug: bool,
           on_ready: Callable[[], None] | None = None, credentials: str | None = None,
           multi_user: bool | None = None, default_permissions: bool = True, negative_cache_s: float = 0.0,
           leases: bool = True, xattrs: bool = True, async_creates: bool = True,
           kernel_opens_directories: bool = True) -> None:
    pyfuse3.asyncio.enable()
    if not device_wait.install():
        log.info("pyfuse3's asyncio layer is not the one expected: the FUSE device is registered per request")
    try:
        asyncio.run(_serve_async(address, mountpoint, threads, attr_timeout_s, debug, on_ready, credentials,
                                 multi_user, default_permissions, negative_cache_s, leases, xattrs, async_creates,
                                 kernel_opens_directories))
    finally:  # the process exits next: a late SIGINT or SIGTERM must not kill it (shutdown.py)
        shutdown.ignore_stop_signals()


def mount(address: str, mountpoint: str, foreground: bool = True, threads: bool = True,
          attr_timeout_s: float = 1.0, debug: bool = False, credentials: str | None = None,
          multi_user: bool | None = None, default_permissions: bool = True,
          negative_cache_s: float = 0.0, leases: bool = True, xattrs: bool = True,
          async_creates: bool = True, kernel_opens_directories: bool = True) -> str | None:
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

    ``leases`` (default; ``--no-leases``: off): hold metadata leases, so the kernel keeps
    names (absent ones too) and attributes for as long as they last, and drops them when
    another client's change recalls them, before that change returns (``kernel_cache.py``);
    without, the kernel keeps them ``attr_timeout_s`` and absent names not at all.

    ``async_creates`` (default, with leases; ``--no-async-creates``: off): a burst of creates
    or unlinks in one directory claims it, and the next ones there are answered without
    waiting for the metadata service, sent in batches (``client/claims.py``), and so is the
    ``close`` of a small file written whole there (its bytes go with its create): every other
    client still sees each at its next call; one is durable once this mount's next call reached
    the service (an ``fsync`` is one) or 50 ms later, as on a local disk.

    ``kernel_opens_directories`` (default, with leases, in a single-user mount or one run with
    root's credential; ``--mount-opens-directories``: off): the kernel opens directories by
    itself, with no request to the mount, and keeps every listing it reads until a change or a
    recall drops it (``kernel_opendir.py``, ``kernel_listings.py``); off, each ``opendir(3)``
    reaches the mount (OPENDIR, then RELEASEDIR), whose reply still lets the kernel keep the
    listing while a lease is held.

    ``xattrs=False`` (``--no-xattrs``): no extended attributes through this mount; ``getfattr``
    and ``setfattr`` fail with "Operation not supported", and the kernel stops asking for them
    (``ls -l`` probes each file, the kernel checks ``security.capability`` before every write):
    faster listings and writes where nobody needs them, as JuiceFS's default.

    ``threads=False`` (``--single-thread``): one kernel request at a time (else up to
    ``requests_in_flight_max`` coroutines on the one event loop).

    Foreground: blocks until unmounted (``fusermount3 -u MOUNTPOINT``, SIGINT or SIGTERM); from
    its return on, this process ignores SIGINT and SIGTERM (it is to exit: a late one must not
    kill it).
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
                              negative_cache_s=negative_cache_s, leases=leases, xattrs=xattrs,
                              async_creates=async_creates, kernel_opens_directories=kernel_opens_directories)
    if foreground:
        serve()
        return None
    return daemonize(lambda ready: serve(on_ready=ready), mountpoint)
