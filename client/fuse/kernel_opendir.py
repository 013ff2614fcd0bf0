"""Directories opened by the kernel alone (FUSE's "no opendir"): no OPENDIR nor RELEASEDIR per
``opendir(3)``, and the kernel keeps every listing it reads (``tectofs mount``'s default while it
holds leases; ``--mount-opens-directories``: off).

A file system that answers an OPENDIR with ENOSYS tells the kernel to open directories by
itself from then on: it sends no OPENDIR nor RELEASEDIR again, and gives every directory handle
the flags that keep its listing (``FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR``: ``fuse_do_open``,
"Default for no-open", Linux 5.10 and later). Its READDIRPLUS requests then carry a handle of 0
and the directory's inode number. What drops a kept listing is said in ``kernel_listings.py``.

pyfuse3 (3.3 to 3.5) passes a READDIRPLUS's handle to ``readdir`` but drops its inode number.
:func:`install` therefore puts a function of ours in libfuse's table of the session's
operations, in place of pyfuse3's ``readdirplus``: it gives a request whose handle is 0 the
handle ``HANDLELESS | inode`` and calls pyfuse3's function, which passes it to ``readdir``.

The table is in libfuse's ``struct fuse_session``, found from a request (a ``struct fuse_req``
begins with a pointer to its session in every libfuse 3). :func:`install` checks all it relies
on before it writes anything: the session names this mount's mount point and a ``/dev/fuse``
descriptor of this process, and at exactly one place near its start lies a table whose entries
are set where pyfuse3 sets them (each inside pyfuse3's module) and empty where it does not.
Anything else (another libfuse, pyfuse3, kernel or platform): it writes nothing, says why once
in the log, and directories are opened through the mount as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Any

import pyfuse3

from tectofs.client.fuse.opendir_reply import LAYOUTS_HOLD, FuseFileInfo

log = logging.getLogger("tectofs.fuse")

HANDLELESS = 1 << 62  # a READDIRPLUS handle with this bit is ``HANDLELESS | inode`` of a kernel-opened directory

# struct fuse_lowlevel_ops (fuse_lowlevel.h, libfuse 3), in order up to readdirplus; pyfuse3's
# init_fuse_ops sets the entries of _SET_BY_PYFUSE3 and leaves the others empty.
_OPS = ("init destroy lookup forget getattr setattr readlink mknod mkdir unlink rmdir symlink rename link open read "
        "write flush release fsync opendir readdir releasedir fsyncdir statfs setxattr getxattr listxattr "
        "removexattr access create getlk setlk bmap ioctl poll write_buf retrieve_reply forget_multi flock "
        "fallocate readdirplus").split()
_SET_BY_PYFUSE3 = frozenset(
    "init lookup forget getattr setattr readlink mknod mkdir unlink rmdir symlink rename link open read write "
    "flush release fsync opendir readdirplus releasedir fsyncdir statfs setxattr getxattr listxattr removexattr "
    "access create forget_multi write_buf poll".split())
_READDIRPLUS = _OPS.index("readdirplus")
_TABLE_OFFSETS = range(16, 129, 8)  # where the table may begin in struct fuse_session (libfuse 3.14: 40)
_FD_OFFSET = 12  # struct fuse_session: char *mountpoint; volatile int exited; int fd; ...
KERNEL_MIN = (5, 10)


_ARGS = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int64, ctypes.POINTER(FuseFileInfo))
_CALLED_FROM_C = ctypes.CFUNCTYPE(None, *_ARGS)
_CALLING_PYFUSE3 = ctypes.PYFUNCTYPE(None, *_ARGS)  # keeps the GIL held: pyfuse3's handler runs Python

_installed: tuple[Any, Any] | None = None  # (our function as libfuse calls it, pyfuse3's), kept alive
_slot: ctypes.c_void_p | None = None  # the table's readdirplus entry, which holds ours
_refused: str | None = None  # why not (then nothing was written)


def _mapped_range(path: str) -> tuple[int, int] | None:
    """The addresses this process maps the file ``path`` at (lowest, highest), or None."""
    real = os.path.realpath(path)
    spans = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and os.path.realpath(fields[5]) == real:
                start, end = fields[0].split("-")
                spans.append((int(start, 16), int(end, 16)))
    return (min(s for s, _ in spans), max(e for _, e in spans)) if spans else None


def _fuse_descriptors() -> set[int]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "/dev/fuse":
                found.add(int(name))
        except OSError:  # closed meanwhile
            pass
    return found


def find_table(session: int, mountpoint: str, module: tuple[int, int] | None,
               descriptors: set[int]) -> tuple[int | None, str]:
    """The address of the operations table in the ``struct fuse_session`` at ``session``, or
    None and why not (see the module docstring); ``module``: where pyfuse3's module is mapped;
    ``descriptors``: this process's ``/dev/fuse`` descriptors."""
    named = ctypes.c_char_p.from_address(session).value
    if named is None or os.fsdecode(named) != mountpoint:
        return None, f"the session names mount point {named!r}, not {mountpoint!r}"
    if ctypes.c_int.from_address(session + _FD_OFFSET).value not in descriptors:
        return None, "the session's descriptor is not this process's /dev/fuse"
    if module is None:
        return None, "pyfuse3's module is not mapped from its file"
    low, high = module
    found = []
    for offset in _TABLE_OFFSETS:
        entries = [ctypes.c_void_p.from_address(session + offset + 8 * i).value for i in range(len(_OPS))]
        if all((entry is not None and low <= entry < high) == (name in _SET_BY_PYFUSE3)
               for entry, name in zip(entries, _OPS)):
            found.append(session + offset)
    if len(found) != 1:
        return None, f"{len(found)} places in libfuse's session look like pyfuse3's table of operations"
    return found[0], ""


def _unsupported() -> str | None:
    """Why this process cannot have the kernel open directories, or None."""
    if not LAYOUTS_HOLD:
        return f"not x86_64 Linux ({sys.platform} {os.uname().machine})"
    release = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2] if part.isdigit())
    if release < KERNEL_MIN:
        return f"Linux {os.uname().release} does not keep the listings of directories it opens (5.10 does)"
    return None


def install(request: int, mountpoint: str) -> bool:
    """Put our READDIRPLUS in the session's table, found from the request at address
    ``request`` (a ``fuse_req_t`` being served), unless something differs from what it expects
    (then it writes nothing, from now on). Returns whether it is in place (now or before): the
    OPENDIR being served may then be answered ENOSYS. Call it on the thread that serves
    requests (the table is read there)."""
    global _installed, _refused, _slot
    if _installed is not None:
        return True
    if _refused is not None:
        return False
    _refused = _unsupported()
    if _refused is None:
        session = ctypes.c_void_p.from_address(request).value if request else None
        table, why = (find_table(session, mountpoint, _mapped_range(pyfuse3.__file__ or ""), _fuse_descriptors())
                      if session else (None, "the request names no session"))
        if table is None:
            _refused = why
        else:
            _slot = ctypes.c_void_p.from_address(table + 8 * _READDIRPLUS)
            _installed = replace(_slot)
            log.info("directories are opened by the kernel, which keeps their listings")
            return True
    log.info("directories are opened through the mount (%s)", _refused)
    return False


def replace(slot: ctypes.c_void_p) -> tuple[Any, Any]:
    """Write our READDIRPLUS into ``slot``, which holds pyfuse3's; returns both (kept alive)."""
    address = slot.value
    assert address is not None  # find_table checked it is set
    pyfuse3_readdirplus = _CALLING_PYFUSE3(address)

    def readdirplus(req: int, ino: int, size: int, off: int, fi: Any) -> None:
        try:
            if fi.contents.fh == 0:
                fi.contents.fh = HANDLELESS | ino
        finally:  # pyfuse3's function always runs: it replies, even with an error
            pyfuse3_readdirplus(req, ino, size, off, fi)

    ours = _CALLED_FROM_C(readdirplus)
    slot.value = ctypes.cast(ours, ctypes.c_void_p).value
    return ours, pyfuse3_readdirplus


def uninstall() -> None:
    """Put pyfuse3's READDIRPLUS back in the session's table and forget the session (a later
    mount in this process looks again). Call it once pyfuse3's main loop returned (no request is
    served any more) and before ``pyfuse3.close`` destroys the session (the table is in it)."""
    global _installed, _refused, _slot
    if _installed is not None and _slot is not None:
        _slot.value = ctypes.cast(_installed[1], ctypes.c_void_p).value
    _installed = _slot = _refused = None


def active() -> bool:
    """Whether the kernel is to open directories (OPENDIRs are then answered ENOSYS)."""
    return _installed is not None


def inode_of(fh: int) -> int | None:
    """The directory's inode for a READDIRPLUS handle of a kernel-opened directory, else None."""
    return fh & ~HANDLELESS if fh & HANDLELESS else None
