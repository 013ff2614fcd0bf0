"""The FUSE mount: ``tectofs mount``.

``operations`` (the kernel's requests answered through the client library), ``mount`` (the
``tectofs mount`` entry point), ``process`` (starting and stopping a mount daemon), ``daemon``,
``users`` (callers' credentials in a multi-user mount), ``readdir``, ``listings``,
``directories`` and ``links`` (what the mount remembers between requests).
"""

from tectofs.client.fuse.process import MountProcess, is_mounted, start_mount_process

__all__ = ["MountProcess", "is_mounted", "start_mount_process"]
