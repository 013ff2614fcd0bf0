"""The FUSE mount: ``tectofs mount``.

``operations`` (the kernel's requests answered through the client library), ``mount`` (the
``tectofs mount`` entry point), ``process`` (starting and stopping a mount daemon), ``daemon``,
``users`` (callers' credentials in a multi-user mount), ``readdir``, ``listings``,
``fresh``, ``handles`` and ``links`` (what the mount remembers between requests), ``binding``
(how libfuse calls the operations).
"""

import os

# The mount is written for libfuse 3. mfusepy loads libfuse 2 when both are installed (the
# fuse2 development package beside libfuse3 is common) and then refuses libfuse 3's options
# ("unknown option max_threads"): ask it for libfuse 3, unless the user chose otherwise.
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

from tectofs.client.fuse.process import MountProcess, is_mounted, start_mount_process  # noqa: E402

__all__ = ["MountProcess", "is_mounted", "start_mount_process"]
