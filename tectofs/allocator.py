"""glibc malloc settings for a process that moves checkpoint data through the client.

pyeclib's encode allocates transient buffers of 0.5-2 MiB per segment (the segment as
``bytes``, then each fragment). glibc serves blocks that large with ``mmap`` until one is
freed, then raises its mmap threshold to that size and its trim threshold to twice it
(about 4 MiB here), and trims the heap back to the kernel whenever more than that is free
at its top. Two codec threads encoding at once keep crossing that line: every GB saved cost
the client about 40,000 page faults, each a fresh zeroed page. (Encodes now call ISA-L
directly, ``tectofs.isal``, and allocate nothing per segment; pyeclib's path remains where
ISA-L is not found, for decodes that rebuild fragments, and for repair.)

``tune()`` sets, once per process, ``M_MMAP_THRESHOLD`` to 32 MiB (the ceiling of glibc's own
dynamic threshold on 64-bit) and ``M_TRIM_THRESHOLD`` to 64 MiB (twice that, as glibc's dynamic
rule would set it). Blocks above 32 MiB (large tensors) are still mapped and unmapped on their
own; at most 64 MiB of free memory stays at the top of each heap (arena) instead of being given
back, so a process with many allocating threads may hold somewhat more memory. Measured with
two threads encoding 1 GiB through ``erasure.encode`` (``python bench/encode_cpu.py --compare malloc``, on pyeclib's path):
page faults per GB 41,493 -> 1 and encode CPU 0.422 -> 0.322 s per GB (medians of 5).

Off with ``TECTOFS_MALLOC_TUNING=0``; a no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

log = logging.getLogger("tectofs.allocator")

MMAP_THRESHOLD_BYTES = 32 << 20
TRIM_THRESHOLD_BYTES = 64 << 20
_M_TRIM_THRESHOLD = -1  # from glibc's malloc.h
_M_MMAP_THRESHOLD = -3

_lock = threading.Lock()
_done: bool | None = None


def tune() -> bool:
    """Apply the settings above to this process (the first call does; later calls return the
    same answer). True if they are in effect."""
    global _done
    with _lock:
        if _done is None:
            _done = _apply()
        return _done


def _apply() -> bool:
    if os.environ.get("TECTOFS_MALLOC_TUNING", "1") == "0":
        return False
    try:
        libc = ctypes.CDLL(None)  # the process's own symbols: its C library
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: other C libraries' mallopt takes other parameters
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1
    if not ok:
        log.debug("glibc refused the malloc thresholds; keeping its defaults")
    return ok
