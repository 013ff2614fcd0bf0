"""The kernel opens directories by itself (``client/fuse/kernel_opendir.py``): the mount finds
libfuse's table of operations only where everything it checks holds, and its READDIRPLUS gives
a handle-less request the directory's inode and hands every request to pyfuse3's function."""

from __future__ import annotations

import ctypes
from typing import Any

from tectofs.client.fuse import kernel_opendir
from tectofs.client.fuse.kernel_opendir import _OPS, _SET_BY_PYFUSE3, HANDLELESS, find_table
from tectofs.client.fuse.opendir_reply import FuseFileInfo

MODULE = (0x7000_0000, 0x7001_0000)  # where "pyfuse3's module" lies in these fake sessions
TABLE_AT = 40  # as in libfuse 3.14 (3.10 to 3.13: 32)


def _session(mountpoint: bytes, fd: int, set_also: tuple[str, ...] = (), table_at: int = TABLE_AT) -> Any:
    """A fake ``struct fuse_session``: mount point, descriptor and pyfuse3's table of operations."""
    memory = (ctypes.c_uint64 * 64)()
    name = ctypes.create_string_buffer(mountpoint)
    base = ctypes.addressof(memory)
    ctypes.c_void_p.from_address(base).value = ctypes.addressof(name)
    ctypes.c_int.from_address(base + 12).value = fd
    for index, op in enumerate(_OPS):
        if op in _SET_BY_PYFUSE3 or op in set_also:
            ctypes.c_void_p.from_address(base + table_at + 8 * index).value = MODULE[0] + 16 * index
    return memory, name  # (both kept alive by the caller)


def test_the_table_is_found_only_where_every_check_holds() -> None:
    memory, _name = _session(b"/mnt/t", fd=9)
    base = ctypes.addressof(memory)
    assert find_table(base, "/mnt/t", MODULE, {9}) == (base + TABLE_AT, "")
    table, why = find_table(base, "/mnt/other", MODULE, {9})
    assert table is None and "mount point" in why
    table, why = find_table(base, "/mnt/t", MODULE, {8})
    assert table is None and "/dev/fuse" in why
    table, why = find_table(base, "/mnt/t", (0x1000, 0x2000), {9})  # entries outside pyfuse3's module
    assert table is None and "0 places" in why
    table, why = find_table(base, "/mnt/t", None, {9})
    assert table is None and "mapped" in why
    memory, _name = _session(b"/mnt/t", fd=9, set_also=("bmap",))  # an entry pyfuse3 does not set
    assert find_table(ctypes.addressof(memory), "/mnt/t", MODULE, {9})[0] is None
    memory, _name = _session(b"/mnt/t", fd=9, table_at=32)  # libfuse 3.10 to 3.13
    assert find_table(ctypes.addressof(memory), "/mnt/t", MODULE, {9}) == (ctypes.addressof(memory) + 32, "")
    memory, _name = _session(b"/mnt/t", fd=9, table_at=160)  # farther than any libfuse 3 puts it
    assert find_table(ctypes.addressof(memory), "/mnt/t", MODULE, {9})[0] is None


def test_our_readdirplus_names_the_inode_of_a_handleless_request_and_calls_pyfuse3s() -> None:
    calls: list[tuple[int, int, int, int]] = []

    def pyfuse3_readdirplus(req: int, ino: int, size: int, off: int, fi: Any) -> None:
        calls.append((ino, size, off, fi.contents.fh))

    theirs = kernel_opendir._CALLED_FROM_C(pyfuse3_readdirplus)
    slot = ctypes.c_void_p(ctypes.cast(theirs, ctypes.c_void_p).value)
    ours, _ = kernel_opendir.replace(slot)
    assert slot.value == ctypes.cast(ours, ctypes.c_void_p).value
    assert slot.value is not None
    call = kernel_opendir._CALLING_PYFUSE3(slot.value)
    info = FuseFileInfo()
    call(1, 42, 4096, 0, ctypes.pointer(info))  # a kernel-opened directory: handle 0
    info.fh = 7
    call(1, 43, 4096, 5, ctypes.pointer(info))  # opened through the mount: its handle stays
    assert calls == [(42, 4096, 0, HANDLELESS | 42), (43, 4096, 5, 7)]
    assert kernel_opendir.inode_of(HANDLELESS | 42) == 42 and kernel_opendir.inode_of(7) is None
