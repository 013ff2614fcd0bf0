"""Where the client encodes and checksums a small block: what a hand-off to a codec thread and
back costs on this machine, against the work itself (rs(4,2) and rep(3) encode with crcs, by
block size). ``client/blocks.py``'s ``LOOP_COMPUTE_BYTES_MAX`` was chosen from these figures:
below it the work runs on the event loop. Medians of ``--repeats`` timings of ``--calls`` calls.

    python3 -m tectofs.benchmarks.loop_compute
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from tectofs.benchmarks.common import print_table, write_results

SIZES = (4096, 16384, 65536, 262144)


def _per_call_us(fn: Callable[[], Any], calls: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(runs)


def hand_off_us(calls: int, repeats: int) -> float:
    """One ``run_in_executor`` of a no-op and back, from a running loop."""
    pool = ThreadPoolExecutor(2)

    async def timed() -> float:
        loop = asyncio.get_running_loop()
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(calls):
                await loop.run_in_executor(pool, int)
            runs.append((time.perf_counter() - started) / calls * 1e6)
        return statistics.median(runs)

    try:
        return asyncio.run(timed())
    finally:
        pool.shutdown()


def run(calls: int, repeats: int) -> dict[str, Any]:
    from tectofs.client.blocks import LOOP_COMPUTE_BYTES_MAX, _encode_and_checksum
    from tectofs.policy import parse

    def buffer(n: int) -> memoryview:
        return memoryview(bytearray(n))

    rows = []
    for name in ("rs(4,2)", "rep(3)"):
        policy = parse(name)
        for size in SIZES:
            data = memoryview(os.urandom(size))
            _encode_and_checksum(policy, data, buffer)  # the first encode of a policy checks ISA-L
            rows.append({"policy": name, "bytes": size,
                         "encode_us": round(_per_call_us(lambda: _encode_and_checksum(policy, data, buffer),
                                                         calls, repeats), 1)})
    return {"benchmark": "loop_compute", "hand_off_us": round(hand_off_us(calls, repeats), 1), "rows": rows,
            "loop_compute_bytes_max": LOOP_COMPUTE_BYTES_MAX, "calls": calls, "repeats": repeats}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    result = run(args.calls, args.repeats)
    write_results(args.out, "loop_compute", result)
    print_table(result)
    print(f"codec-thread hand-off and back: {result['hand_off_us']} us; on the loop up to "
          f"{result['loop_compute_bytes_max']} bytes")


if __name__ == "__main__":
    main()
