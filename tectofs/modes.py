"""Rules on permission bits shared by the metadata store and the mount."""

from __future__ import annotations

import stat as statmod


def killed_by_write(mode: int) -> int:
    """The set-id bits of ``mode`` a write by a process without ``CAP_FSETID`` clears (Linux's
    ``should_remove_suid``: set-user-ID, and set-group-ID when group-executable). Nonzero: the
    file is set-id in the sense ``fs.protected_hardlinks`` and write-clearing both use."""
    kill = mode & statmod.S_ISUID
    if mode & (statmod.S_ISGID | statmod.S_IXGRP) == statmod.S_ISGID | statmod.S_IXGRP:
        kill |= statmod.S_ISGID
    return kill
