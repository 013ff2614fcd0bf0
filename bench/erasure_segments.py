"""Reed-Solomon encode speed by segment size: why tectofs encodes a block in 2 MiB segments.

    python bench/erasure_segments.py --block 64M --policy 'rs(4,2)'

Encodes the same block with pyeclib/ISA-L once whole and in segments of 1, 2, 4 and 8 MiB
(best of 3 each) and prints GB/s and the ratio to the whole-block call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import parse_size  # noqa: E402

from tectofs.erasure import _driver
from tectofs.policy import parse


def encode_s(block: bytes, segment: int, k: int, m: int) -> float:
    driver, view = _driver(k, m), memoryview(block)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for offset in range(0, len(view), segment):
            driver.encode(view[offset : offset + segment].tobytes())
        best = min(best, time.perf_counter() - started)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--policy", default="rs(4,2)")
    args = parser.parse_args()
    policy = parse(args.policy)
    block = os.urandom(args.block)
    whole = encode_s(block, len(block), policy.data, policy.redundancy)
    print(f"whole {args.block >> 20} MiB block: {len(block) / whole / 1e9:.2f} GB/s")
    for mib in (1, 2, 4, 8):
        t = encode_s(block, mib << 20, policy.data, policy.redundancy)
        print(f"{mib} MiB segments: {len(block) / t / 1e9:.2f} GB/s ({whole / t:.1f}x the whole-block call)")


if __name__ == "__main__":
    main()
