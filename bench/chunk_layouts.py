"""What a chunk costs the kernel: a file per chunk vs packed records, in one process.

    python3 -m tectofs.benchmarks.chunk_layouts --chunk 256K --count 3000 --repeats 3
    python3 -m tectofs.benchmarks.chunk_layouts --chunk 16M --count 64 --repeats 3

Writes ``--count`` chunks of ``--chunk`` bytes through ``ChunkStore`` from 16 threads (a
chunk server's I/O threads, without the network), from a page-aligned buffer as a chunk
server receives them, in these layouts, alternated: ``files`` (a file each: write,
fdatasync, rename, directory fsync; chunks of at least 1 MiB with ``O_DIRECT``), ``files,
page cache`` (the same, never ``O_DIRECT``), ``files, no sync`` (without the syncs) and
``packed`` (``--pack-max``: records in a segment file, one shared fdatasync per batch; chunks
up to 4 MiB). Reports medians of wall time, MiB/s, and user and system CPU seconds of this
process: where the per-file and per-byte costs show up.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from tectofs.benchmarks.common import parse_size

# name: (sync mode, pack_max (None: the chunk size), O_DIRECT allowed)
LAYOUTS = {"files": ("each", 0, True), "files, page cache": ("each", 0, False), "files, no sync": ("none", 0, False),
           "packed": ("each", None, False)}


def one_run(layout: str, chunk_bytes: int, count: int, parent: str | None) -> dict[str, float]:
    from tectofs import checksum
    from tectofs.buffers import BufferPool
    from tectofs.server.chunk.storage import ChunkStore

    sync, pack, direct = LAYOUTS[layout]
    data = BufferPool(chunk_bytes, aligned=True).get(chunk_bytes)
    data[:] = os.urandom(chunk_bytes)
    crcs, whole = checksum.piece_and_whole_crcs(data)
    root = tempfile.mkdtemp(dir=parent, prefix="tectofs-layouts-")
    try:
        store = ChunkStore(root, sync=sync, pack_max_bytes=chunk_bytes if pack is None else pack)
        store.direct_io = direct
        before, started = os.times(), time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda i: store.write(i + 1, 0, data, crcs, whole), range(count)))
        wall, after = time.perf_counter() - started, os.times()
        if store.packs is not None:
            store.packs.close()
    finally:
        shutil.rmtree(root)
    return {"wall_s": wall, "MiB_s": count * chunk_bytes / wall / 2**20,
            "user_s": after.user - before.user, "sys_s": after.system - before.system}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", type=parse_size, default=256 << 10,
                        help="bytes per chunk (default 256K; packed only up to 4M)")
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each layout, alternated (at least 3)")
    parser.add_argument("--work-dir", default=None, help="where the stores go (default: $TMPDIR)")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (figures are medians)")
    from tectofs import limits

    layouts = [name for name, (_, pack, _) in LAYOUTS.items()
               if pack is not None or args.chunk <= limits.chunk_pack_max_bytes_max]
    samples: dict[str, list[dict[str, float]]] = {layout: [] for layout in layouts}
    for _ in range(args.repeats):
        for layout in layouts:
            samples[layout].append(one_run(layout, args.chunk, args.count, args.work_dir))
    print(f"{args.count} chunks of {args.chunk >> 10} KiB, 16 threads; medians of {args.repeats}")
    print(f"{'layout':20}{'wall s':>9}{'MiB/s':>9}{'user s':>9}{'sys s':>9}")
    for layout, runs in samples.items():
        m = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        print(f"{layout:20}{m['wall_s']:9.2f}{m['MiB_s']:9.0f}{m['user_s']:9.2f}{m['sys_s']:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
