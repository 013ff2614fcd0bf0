"""What packed chunks cost a chunk server's memory and start-up: its in-memory index.

    python3 -m tectofs.benchmarks.pack_index --count 100000 --chunk 4K --repeats 3

Writes ``--count`` chunks of ``--chunk`` bytes as packed records (``ChunkStore`` with
``--pack-max``; no fdatasync, which the index does not depend on), closes the store, then
opens it again ``--repeats`` times, as a chunk server does at start: every record header is
read back and indexed. Reports the medians of the reopen's wall time per record and of the
Python memory the index holds per record (``tracemalloc``: what the store allocated and kept
while opening). The segments are in the page cache here; from a cold disk, a start also
reads every header from the device.
"""

from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc

from tectofs.benchmarks.common import parse_size

MiB = 1 << 20


def measure(count: int, chunk_bytes: int, repeats: int, parent: str | None = None) -> dict[str, float]:
    """Write ``count`` packed chunks, reopen the store ``repeats`` times; medians per record."""
    from tectofs import checksum
    from tectofs.server.chunk.storage import ChunkStore

    data = memoryview(os.urandom(chunk_bytes))
    crcs, whole = checksum.piece_and_whole_crcs(data)
    root = tempfile.mkdtemp(dir=parent, prefix="tectofs-pack-index-")
    try:
        store = ChunkStore(root, sync="none", pack_max_bytes=max(chunk_bytes, 4096))
        for i in range(count):
            store.write(i + 1, 0, data, crcs, whole)
        assert store.packs is not None
        store.packs.close()
        del store
        seconds, memory = [], []
        for _ in range(repeats):
            gc.collect()
            tracemalloc.start()
            started = time.perf_counter()
            store = ChunkStore(root, sync="none", pack_max_bytes=max(chunk_bytes, 4096))
            seconds.append(time.perf_counter() - started)
            memory.append(tracemalloc.get_traced_memory()[0])
            tracemalloc.stop()
            assert store.packs is not None and store.packs.chunk_count == count
            store.packs.close()
            del store
    finally:
        shutil.rmtree(root)
    return {"records": count, "chunk_bytes": chunk_bytes,
            "start_us_per_record": statistics.median(seconds) / count * 1e6,
            "index_bytes_per_record": statistics.median(memory) / count}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000, help="packed chunks to write (default 100000)")
    parser.add_argument("--chunk", type=parse_size, default=4096, help="bytes per chunk (default 4K; at most 4M)")
    parser.add_argument("--repeats", type=int, default=3, help="reopens; medians are reported (default 3)")
    parser.add_argument("--work-dir", help="where the store goes (default: the system's temporary directory)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.repeats < 1 or not 1 <= args.chunk <= 4 * MiB:
        parser.error("--count and --repeats must be at least 1, --chunk between 1 byte and 4M")
    result = measure(args.count, args.chunk, args.repeats, args.work_dir)
    print(f"{result['records']} packed chunks of {result['chunk_bytes']} bytes: start {result['start_us_per_record']:.1f} us"
          f" per record, index {result['index_bytes_per_record']:.0f} bytes per record"
          f" (a million: {result['start_us_per_record']:.0f} s, {result['index_bytes_per_record']:.0f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
