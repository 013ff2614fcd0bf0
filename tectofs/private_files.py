"""Storage that only its server's user can read.

A metadata store holds every small file's bytes (inline) and a chunk server's directory every
chunk: a file readable by other local users there would let any of them read every tectofs
user's data past the service's permission checks. Servers therefore take group and other
permissions off what they store in (as PostgreSQL insists on a 0700 data directory), including
storage made by an earlier release with the default umask.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("tectofs")

DIRECTORY_MODE = 0o700
FILE_MODE = 0o600


def owner_only(path: str, mode: int) -> None:
    """Give ``path`` (if it exists and is this user's) permission bits ``mode`` when it grants
    group or others anything. A path another user owns, or on a filesystem that refuses the
    change, is left as it is, with a warning: the server still starts."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_IMODE(st.st_mode) & 0o077:
        return
    if st.st_uid != os.geteuid():
        log.warning("%s is readable by other users, and belongs to uid %d: chmod %o it", path, st.st_uid, mode)
        return
    try:
        os.chmod(path, mode)
    except OSError as exc:
        log.warning("%s is readable by other users and could not be made private (%s): chmod %o it", path, exc, mode)
