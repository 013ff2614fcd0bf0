"""Who makes each request of a FUSE mount (``operations.py``), and whether a mount serves
every local user.

A multi-user mount runs each kernel request as its caller: the kernel gives the uid, gid and
pid of the calling thread (pyfuse3's ``RequestContext``), :class:`Callers` adds its supplementary groups (from
``/proc/PID/status``) and the request runs on ``AsyncFileSystem.acting_as(uid, gid,
groups)``, a view with its own metadata connection whose hello names that user (only a
proxy credential may). :func:`choose_sharing` decides whether a mount can be multi-user.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from tectofs import limits
from tectofs.client.core import AsyncFileSystem

log = logging.getLogger("tectofs.fuse")

T = TypeVar("T")



Identity = tuple[int, int, tuple[int, ...]]  # uid, gid, supplementary groups


class Caller(Protocol):
    """Who made a kernel request (``pyfuse3.RequestContext``)."""

    @property
    def uid(self) -> int: ...
    @property
    def gid(self) -> int: ...
    @property
    def pid(self) -> int: ...


class Callers:
    """Who makes each kernel request, as the metadata service is to see it.

    ``acting`` (a multi-user mount over a proxy credential): a request of local uid U runs on
    ``AsyncFileSystem.acting_as(U, gid, groups)``, so the metadata service checks U's
    permissions and what U creates is U's; except requests of ``plain_uid`` (the mount's own
    user, when its credential is that user's), which run on the plain client. Not ``acting``:
    every request runs on the plain client, as the credential's user.

    The kernel sends uid, gid and pid but not the supplementary groups: they are read from
    ``/proc/PID/status`` of the calling thread and remembered ``limits.fuse_caller_cache_s`` per pid (a
    ``cp -r`` makes thousands of requests); if unreadable (the process is gone, or in another
    pid namespace), the caller has just its gid."""

    def __init__(self, acting: bool = False, plain_uid: int | None = None) -> None:
        self.acting = acting
        self.plain_uid = plain_uid
        self._groups: dict[int, tuple[float, int, int, tuple[int, ...]]] = {}  # pid -> (when, uid, gid, groups)

    def identity(self, caller: Caller) -> Identity | None:
        """Who the metadata service is to see for a request made by ``caller``; None: the
        plain client."""
        if not self.acting or caller.uid == self.plain_uid:
            return None
        return caller.uid, caller.gid, self._groups_of(caller.pid, caller.uid, caller.gid)

    def _groups_of(self, pid: int, uid: int, gid: int) -> tuple[int, ...]:
        now = time.monotonic()
        cached = self._groups.get(pid)
        if cached is not None and now - cached[0] < limits.fuse_caller_cache_s and cached[1:3] == (uid, gid):
            return cached[3]  # same pid and ids: not a new process that reused the pid
        groups = _supplementary_groups(pid)
        if len(self._groups) >= limits.fuse_caller_cache_entries_max:
            self._groups.clear()
        self._groups[pid] = (now, uid, gid, groups)
        return groups


def _supplementary_groups(pid: int) -> tuple[int, ...]:
    """The ``Groups:`` of process (or thread) ``pid``, at most ``limits.fuse_caller_groups_max``; none if
    unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    groups = sorted({int(g) for g in line.split()[1:]})
                    if len(groups) > limits.fuse_caller_groups_max:
                        log.info("process %d is in %d groups; the metadata service sees the first %d",
                                 pid, len(groups), limits.fuse_caller_groups_max)
                    return tuple(groups[:limits.fuse_caller_groups_max])
    except (OSError, ValueError):
        pass
    return ()


async def on_view(fs: AsyncFileSystem, identity: Identity | None, call: Callable[[AsyncFileSystem], Awaitable[T]]) -> T:
    """``call`` on ``fs`` or, for ``identity``, on its view acting as that user."""
    return await call(fs if identity is None else fs.acting_as(*identity))


def user_allow_other(fuse_conf: str = "/etc/fuse.conf") -> bool:
    """Whether /etc/fuse.conf lets users other than root mount with ``allow_other``."""
    try:
        with open(fuse_conf) as f:
            return any(line.split("#")[0].strip() == "user_allow_other" for line in f)
    except OSError:
        return False


def choose_sharing(requested: bool | None, who: Any, euid: int) -> tuple[bool, str]:
    """Whether a mount serves every local user (multi-user) and a line saying so and why.

    ``requested``: True (``--allow-other``: multi-user or ``SystemExit``), False
    (``--single-user``), None (multi-user when possible). ``who``: the ``whoami`` reply of the
    mount's credential (None: no credential). Multi-user needs a proxy credential (root's, or
    ``tectofs user add --proxy``) and, for a mount not run by root, ``user_allow_other`` in
    /etc/fuse.conf."""
    if requested is False:
        return False, f"single-user mount (--single-user): only uid {euid} can use it"
    obstacle = ""
    if who is None:
        obstacle = "it has no credential"
    elif not who.proxy:
        obstacle = (f"the credential of user {who.name} is not a proxy credential (tectofs user add --proxy),"
                    " so it cannot act for other local users")
    elif euid != 0 and not user_allow_other():
        obstacle = "/etc/fuse.conf lacks user_allow_other, which a mount not run by root needs to let others in"
    if not obstacle:
        return True, ("multi-user mount: every local user can use it, as themselves (allow_other,"
                      " default_permissions; the metadata service checks each caller's permissions)")
    if requested:
        raise SystemExit(f"tectofs mount: cannot let other users in (--allow-other): {obstacle}")
    return False, f"single-user mount: only uid {euid} can use it, because {obstacle}"
