"""crc32c speed: the ``crc32c`` package against ISA-L called directly (``tectofs.isal``), and a
chunk's piece and whole crcs computed in two passes against ``checksum.piece_and_whole_crcs``
(ISA-L, the whole folded from the pieces).

    python3 -m tectofs.benchmarks.crc_speed --size 256M --repeats 7

One process, each measurement alternated with its counterpart ``--repeats`` times; medians of
CPU seconds, printed as GB/s and as CPU seconds per GB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Callable

import crc32c

from tectofs import checksum, isal
from tectofs.benchmarks.common import parse_size


def _two_passes(view: memoryview, piece: int) -> tuple[list[int], int]:
    """What the client did before: each piece's crc, then the whole chunk's, with the package."""
    pieces = [crc32c.crc32c(view[i : i + piece]) for i in range(0, len(view), piece)]
    return pieces, crc32c.crc32c(view)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="256M", help="bytes checksummed per measurement (default 256M)")
    parser.add_argument("--repeats", type=int, default=7, help="alternated measurements of each (default 7)")
    args = parser.parse_args()
    if not isal.available():
        raise SystemExit("ISA-L is not available here (or TECTOFS_ISAL=0): nothing to compare")
    size = parse_size(args.size)
    view = memoryview(bytearray(os.urandom(1 << 20)) * max(1, size // (1 << 20)))
    gb = len(view) / 1e9
    piece = checksum.PIECE
    pairs: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        ("whole buffer", lambda: crc32c.crc32c(view), lambda: isal.crc32c(view)),
        ("64 KiB pieces", lambda: [crc32c.crc32c(view[i : i + piece]) for i in range(0, len(view), piece)],
         lambda: checksum.piece_crcs(view)),
        ("pieces + whole chunk crc", lambda: _two_passes(view, piece), lambda: checksum.piece_and_whole_crcs(view)),
    ]
    print(f"{'what':28s} {'crc32c package':>22s} {'tectofs (ISA-L)':>22s}   ratio of CPU")
    for name, old, new in pairs:
        assert old() == new(), name
        seconds: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            for key, fn in (("old", old), ("new", new)):
                started = time.process_time()
                fn()
                seconds[key].append(time.process_time() - started)
        o, n = statistics.median(seconds["old"]), statistics.median(seconds["new"])
        print(f"{name:28s} {gb / o:7.1f} GB/s {o / gb:.3f} s/GB {gb / n:7.1f} GB/s {n / gb:.3f} s/GB   {n / o:.2f}")


if __name__ == "__main__":
    main()
