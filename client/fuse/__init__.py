"""The FUSE mount: ``tectofs mount``, on pyfuse3 (libfuse 3's low-level, inode-based API) in
asyncio mode.

``operations`` and ``file_operations`` (the kernel's requests answered through the async
client), ``state`` (what the handlers share, errno mapping), ``setattrs``, ``inodes`` (inode
numbers to paths), ``kernel_cache`` (what the kernel may cache, and invalidations),
``attributes``, ``readdir``, ``listings``, ``fresh`` and ``handles`` (what the mount remembers
between requests), ``users`` (callers' credentials in a multi-user mount), ``mount`` (the
``tectofs mount`` entry point), ``process`` (starting and stopping a mount daemon), ``daemon``.

Importing this package needs no libfuse: ``process`` only runs ``tectofs mount`` children.
"""

from tectofs.client.fuse.process import MountProcess, is_mounted, start_mount_process

__all__ = ["MountProcess", "is_mounted", "start_mount_process"]
