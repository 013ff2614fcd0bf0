"""Attributes as the kernel sees them: a :class:`Stat` (with what this mount's open writers
changed and did not commit yet) as a ``pyfuse3.EntryAttributes``, and ``statfs`` as
``pyfuse3.StatvfsData``."""

from __future__ import annotations

import stat as statmod

import pyfuse3

from tectofs import limits
from tectofs.client.core import Stat
from tectofs.client.fuse.handles import Uncommitted
from tectofs.wire import messages

io_size_hint_bytes = 1 * limits.MiB  # st_blksize: buffer size that cp, dd conv=... pick
free_inodes_reported = 2**32         # statfs: tectofs has no inode limit; df -i shows this many free
statfs_fragment_bytes = 4096

KIND_BITS = {"file": statmod.S_IFREG, "dir": statmod.S_IFDIR, "symlink": statmod.S_IFLNK, "fifo": statmod.S_IFIFO,
             "socket": statmod.S_IFSOCK, "char": statmod.S_IFCHR, "block": statmod.S_IFBLK}


def entry_attributes(st: Stat, uncommitted: Uncommitted | None = None) -> pyfuse3.EntryAttributes:
    """The kernel's view of ``st`` (timeouts left 0: ``KernelCache.timeouts`` sets them). What
    open writers changed and did not commit yet (their size, the time of their last change as
    mtime and ctime, times and a mode set on the file they write) overrides the committed
    attributes."""
    size, mtime, ctime, atime, mode = st.size, st.mtime, st.ctime, st.atime, st.mode
    if uncommitted is not None:
        size = uncommitted.size
        if uncommitted.modified_at is not None:
            mtime, ctime = max(mtime, uncommitted.modified_at), max(ctime, uncommitted.modified_at)
        mtime = mtime if uncommitted.mtime is None else uncommitted.mtime
        atime = atime if uncommitted.atime is None else uncommitted.atime
        mode = mode if uncommitted.mode is None else uncommitted.mode
    entry = pyfuse3.EntryAttributes()
    entry.st_ino = st.ino
    entry.generation = 0
    entry.st_mode = KIND_BITS[st.kind] | (mode & 0o7777)
    entry.st_nlink = st.nlink
    entry.st_uid = st.uid
    entry.st_gid = st.gid
    entry.st_rdev = st.rdev
    entry.st_size = size
    entry.st_blksize = io_size_hint_bytes
    entry.st_blocks = (st.stored + 511) // 512  # what is stored, so du sees holes
    entry.st_atime_ns = int(atime * 1e9)
    entry.st_mtime_ns = int(mtime * 1e9)
    entry.st_ctime_ns = int(ctime * 1e9)
    return entry


def directory_entry(ino: int) -> pyfuse3.EntryAttributes:
    """"." or ".." in a listing: inode number and type only (readdir(3) hides an entry whose
    d_ino is 0; the kernel links neither name, so they count no lookup)."""
    entry = pyfuse3.EntryAttributes()
    entry.st_ino = ino
    entry.st_mode = statmod.S_IFDIR
    return entry


def statvfs(reply: messages.StatfsReply) -> pyfuse3.StatvfsData:
    """``df``: what files can store (raw capacity of the live chunk servers times the data
    share of the root's policy, e.g. 4/6 for rs(4,2)), and inodes. tectofs has no inode table
    to fill: free inodes are reported as ``free_inodes_reported``."""
    data = pyfuse3.StatvfsData()
    data.f_bsize = io_size_hint_bytes
    data.f_frsize = statfs_fragment_bytes
    data.f_blocks = reply.usable // statfs_fragment_bytes
    data.f_bfree = reply.usable_free // statfs_fragment_bytes
    data.f_bavail = reply.usable_free // statfs_fragment_bytes
    data.f_files = reply.files + free_inodes_reported
    data.f_ffree = free_inodes_reported
    data.f_favail = free_inodes_reported
    data.f_namemax = reply.name_max or limits.name_length_max_bytes
    return data
