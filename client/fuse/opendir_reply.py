"""Let the kernel keep a directory's listing: ``FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`` on the reply
to an OPENDIR, which pyfuse3 (3.3 to 3.5) gives no way to ask for.

The kernel serves ``getdents`` from its own copy of a listing, with no request to the mount, only
for a directory handle opened with ``FOPEN_CACHE_DIR``, and keeps that copy across opens only
with ``FOPEN_KEEP_CACHE`` (an open without it drops the copy). libfuse sets both from the
``cache_readdir`` and ``keep_cache`` bits of the ``fuse_file_info`` it replies with. pyfuse3's
``opendir`` handler returns only a handle number: pyfuse3 replies with a copy of the
``fuse_file_info`` libfuse passed in (zeroed), that number as its ``fh``.

That copy lives in the ``_Container`` pyfuse3 hands to its module-level coroutine function
``fuse_opendir_async(c)``, which it looks up in its module's globals at every OPENDIR.
:func:`install` puts a function of ours in its place: it reads the directory's inode from ``c``,
asks ``keep(inode)``, sets the two bits if so, and hands ``c`` on to pyfuse3's own function
(which calls the mount's ``opendir`` handler and replies). It reads and writes ``c`` through the
layout below: pyfuse3's ``_Container`` (``handlers.pxi``) on 64-bit Linux, with libfuse 3's
``fuse_file_info`` (whose bit positions libfuse keeps for its ABI). It checks that layout on
every call (the object's size, and an ``fh`` still 0 and a request pointer set where they must
be); if anything differs (another pyfuse3, another platform) it sets nothing from then on and
says so once in the log: the mount then lists every directory through itself, as without it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from typing import Any, Callable

import pyfuse3

log = logging.getLogger("tectofs.fuse")


class FuseFileInfo(ctypes.Structure):
    """libfuse 3's ``struct fuse_file_info`` (``fuse_common.h``)."""

    _fields_ = [
        ("flags", ctypes.c_int),
        ("writepage", ctypes.c_uint, 1),
        ("direct_io", ctypes.c_uint, 1),
        ("keep_cache", ctypes.c_uint, 1),
        ("flush", ctypes.c_uint, 1),
        ("nonseekable", ctypes.c_uint, 1),
        ("flock_release", ctypes.c_uint, 1),
        ("cache_readdir", ctypes.c_uint, 1),
        ("noflush", ctypes.c_uint, 1),
        ("padding", ctypes.c_uint, 24),
        ("padding2", ctypes.c_uint, 32),
        ("fh", ctypes.c_uint64),
        ("lock_owner", ctypes.c_uint64),
        ("poll_events", ctypes.c_uint32),
    ]


class _Container(ctypes.Structure):
    """pyfuse3's ``cdef class _Container`` as laid out in memory (object header, then its C fields)."""

    _fields_ = [
        ("ob_refcnt", ctypes.c_ssize_t),
        ("ob_type", ctypes.c_void_p),
        ("rdev", ctypes.c_uint64),
        ("fi", FuseFileInfo),
        ("ino", ctypes.c_uint64),
        ("parent", ctypes.c_uint64),
        ("req", ctypes.c_void_p),
        ("flags", ctypes.c_int),
        ("mode", ctypes.c_uint32),
        ("off", ctypes.c_int64),
        ("size", ctypes.c_size_t),
        ("stat", ctypes.c_char * 144),  # struct stat on x86-64
        ("fh", ctypes.c_uint64),
    ]


LAYOUTS_HOLD = sys.platform == "linux" and sys.maxsize > 2**32 and os.uname().machine == "x86_64"  # (the layouts here)
_original: Callable[[Any], Any] | None = None  # pyfuse3's own fuse_opendir_async, while ours is installed
_broken: str | None = None  # why the layout was found not to hold (then nothing is set)


def _mark(container: object, keep: Callable[[int], bool], handover: Callable[[int], bool] | None) -> None:
    """Set the two bits in ``container``'s reply if ``keep`` says so for its inode (unless
    ``handover``, given the request's address, says the kernel is to open directories itself)."""
    global _broken
    kind = type(container)
    if kind is not getattr(pyfuse3, "_Container", None) or kind.__basicsize__ != ctypes.sizeof(_Container):
        _broken = (f"pyfuse3 passed a {kind.__name__} of {kind.__basicsize__} bytes, not its _Container of "
                   f"{ctypes.sizeof(_Container)}")
    else:
        c = _Container.from_address(id(container))
        if c.ob_type != id(kind) or c.fi.fh != 0 or not c.req:
            _broken = "pyfuse3's _Container does not hold an OPENDIR where expected"
        elif handover is not None and handover(c.req):
            pass  # answered ENOSYS: the kernel opens directories from now on, and keeps their listings
        elif keep(c.ino):
            c.fi.keep_cache = 1
            c.fi.cache_readdir = 1
    if _broken is not None:
        log.info("the kernel will not keep directory listings (%s): every listing goes through the mount", _broken)


def install(keep: Callable[[int], bool], handover: Callable[[int], bool] | None = None) -> bool:
    """From now on, each OPENDIR's reply asks the kernel to keep the listing (and the copy it
    has) if ``keep(inode)`` returns True; ``keep`` runs on the event loop, before the mount's
    ``opendir`` handler, and must not block. ``handover`` (``kernel_opendir.install``) is asked
    first, with the request's address: True means the handler answers ENOSYS (the kernel opens
    directories from then on), and nothing is marked. Returns whether it could be installed (False:
    another platform, or a pyfuse3 without ``fuse_opendir_async``). :func:`uninstall` undoes it."""
    global _original
    original = getattr(pyfuse3, "fuse_opendir_async", None)
    if _original is not None:
        return False  # installed already
    if not LAYOUTS_HOLD or original is None:
        log.info("the kernel will not keep directory listings: pyfuse3 %s on %s offers no way in",
                 getattr(pyfuse3, "__version__", "?"), sys.platform)
        return False

    def fuse_opendir_async(container: Any) -> Any:
        if _broken is None:
            try:
                _mark(container, keep, handover)
            except Exception:  # pyfuse3 would not reply at all if this raised
                log.exception("could not mark an OPENDIR reply to keep its listing")
        return original(container)

    _original = original
    pyfuse3.fuse_opendir_async = fuse_opendir_async  # type: ignore[attr-defined]
    return True


def uninstall() -> None:
    """Put pyfuse3's own ``fuse_opendir_async`` back (nothing if :func:`install` did not run)."""
    global _original
    if _original is not None:
        pyfuse3.fuse_opendir_async = _original  # type: ignore[attr-defined]
        _original = None


def working() -> bool:
    """Whether OPENDIR replies can be marked (installed, and the layout held so far)."""
    return _original is not None and _broken is None
