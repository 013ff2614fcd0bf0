"""Let the kernel keep a directory's listing: ``FOPEN_KEEP_CACHE | FOPEN_CACHE_DIR`` on the reply
to an OPENDIR, which pyfuse3 (3.3 to 3.5) gives no way to ask for.

The kernel serves ``getdents`` from its own copy of a listing, with no request to the mount, only
for a directory handle opened with ``FOPEN_CACHE_DIR`` (and keeps that copy across opens only
with ``FOPEN_KEEP_CACHE``: an open without it drops the copy). libfuse sets both from the
``cache_readdir`` and ``keep_cache`` bits of the ``fuse_file_info`` it replies with. pyfuse3's
``opendir`` takes only a handle number from Python: its reply copies the ``fuse_file_info``
libfuse passed in (zeroed) with that number as ``fh``, from a ``_Container`` object that its
request coroutine holds while it awaits the handler.

:func:`keep_listing`, awaited inside an ``opendir`` handler, finds that ``_Container`` (the
handler's task awaits pyfuse3's ``_session_loop`` coroutine, which awaits the OPENDIR
coroutine, whose frame holds it; only while they are suspended do they say what they await,
so it suspends the handler for one turn of the loop and looks from a callback), checks that it
is the one it expects, field by field, and sets the two bits. The layout checked is
pyfuse3's ``_Container`` (``handlers.pxi``) on x86-64 Linux with libfuse 3's ``fuse_file_info``,
whose bit positions libfuse keeps for its ABI. If anything differs (another pyfuse3, another
platform) it sets nothing, says so once in the log, and every later call returns False at once:
the mount then lists every directory through itself, as without this module.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import sys

log = logging.getLogger("tectofs.fuse")

_SEARCH_DEPTH = 8  # task -> coroutine wrapper -> _session_loop -> its frame -> OPENDIR coroutine -> its frame -> _Container


class _FuseFileInfo(ctypes.Structure):
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
        ("fi", _FuseFileInfo),
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


_usable = sys.platform == "linux" and ctypes.sizeof(ctypes.c_void_p) == 8 and ctypes.sizeof(_FuseFileInfo) == 40


def _is_container(obj: object) -> bool:
    kind = type(obj)
    return kind.__name__ == "_Container" and kind.__module__.startswith("pyfuse3")


def _awaited_container(task: "asyncio.Task[object]") -> object | None:
    """The ``_Container`` that ``task``'s suspended chain of coroutines holds (None: none found)."""
    level: list[object] = [task.get_coro()]
    seen: set[int] = set()
    for _ in range(_SEARCH_DEPTH):
        following: list[object] = []
        for obj in level:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if _is_container(obj):
                return obj
            name = type(obj).__name__
            if name in ("coroutine", "coroutine_wrapper") or name.startswith("__pyx_scope_struct"):
                following.extend(gc.get_referents(obj))
        level = following
    return None


def _set_bits(task: "asyncio.Task[object]", inode: int) -> bool:
    """Set ``keep_cache`` and ``cache_readdir`` in the reply of ``task``'s OPENDIR of ``inode``."""
    global _usable
    found = _awaited_container(task)
    reason = None
    if found is None:
        reason = "no pyfuse3 _Container found in the handler's coroutines"
    elif type(found).__basicsize__ != ctypes.sizeof(_Container):
        reason = f"pyfuse3's _Container is {type(found).__basicsize__} bytes, not {ctypes.sizeof(_Container)}"
    else:
        container = _Container.from_address(id(found))
        if container.ino != inode or container.fi.fh != 0 or not container.req or container.ob_type != id(type(found)):
            reason = "pyfuse3's _Container does not hold this OPENDIR where expected"
        else:
            container.fi.keep_cache = 1
            container.fi.cache_readdir = 1
            return True
    _usable = False
    log.info("the kernel will not keep directory listings (%s): every listing goes through the mount", reason)
    return False


async def keep_listing(inode: int) -> bool:
    """From inside an ``opendir`` handler of ``inode``: have its reply tell the kernel to keep
    the listing it reads through the handle, and to keep the one it has (see the module
    docstring). Returns whether it could; suspends the handler for one turn of the loop."""
    if not _usable:
        return False
    task = asyncio.current_task()
    if task is None:
        return False
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bool] = loop.create_future()

    def look() -> None:
        if not done.done():  # (the request may have been interrupted meanwhile)
            done.set_result(_set_bits(task, inode))

    loop.call_soon(look)
    return await done


def available() -> bool:
    """Whether :func:`keep_listing` may still work here (False once it found it could not)."""
    return _usable
