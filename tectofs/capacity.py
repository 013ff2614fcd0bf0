"""Raw capacity of a cluster whose chunk servers may share file systems.

Each chunk server reports its capacity as the bytes its chunks use plus the free space of the
file system under its data directory. Several servers on one file system (``tectofs up``'s
six on one disk, or two per flash device) would each count that free space: ``tectofs df``
showed 429G free on a disk with 73G. So every server also reports which file system it is on
(:func:`filesystem_id`, in its heartbeat's ``stats`` as ``disk_id``), and
:func:`raw_capacity` counts each file system's free space once. Servers that do not say (an
older version) count as before, each on a file system of its own.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
from typing import Any, Iterable

DISK_ID = "disk_id"  # key in a heartbeat's stats


@functools.lru_cache(maxsize=1)
def _machine() -> str:
    """This host's identity: /etc/machine-id, else the boot id, else the host name."""
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return text
        except OSError:
            pass
    return socket.gethostname()


def filesystem_id(path: str) -> int:
    """A positive 63-bit number naming the file system that holds ``path`` on this host (equal
    for every directory on that file system, bind mounts included); 0 if ``path`` cannot be
    examined (the server then counts as on a file system of its own)."""
    try:
        device = os.stat(path).st_dev
    except OSError:
        return 0
    digest = hashlib.blake2b(f"{_machine()}:{device}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1) or 1


def raw_capacity(servers: Iterable[Any]) -> tuple[int, int]:
    """``(capacity, used)`` of ``servers`` (``ServerInfo``: ``capacity``, ``used``, ``stats``),
    each file system's free space counted once (the least any of its servers reported: the
    most recent, as files only grow between heartbeats when a cluster is being written)."""
    capacity = used = 0
    free_by_disk: dict[int, int] = {}
    for s in servers:
        used += s.used
        disk = s.stats.get(DISK_ID) if s.stats else None
        free = max(0, s.capacity - s.used)
        if not disk:
            capacity += s.capacity
        else:
            capacity += s.used
            free_by_disk[disk] = min(free, free_by_disk.get(disk, free))
    return capacity + sum(free_by_disk.values()), used
