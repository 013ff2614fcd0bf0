"""Reed-Solomon speed: why tectofs encodes a block in 2 MiB segments, and how it decodes one
with data chunks missing.

    python3 -m tectofs.benchmarks.erasure_segments --block 64M --policy 'rs(4,2)'

Encodes the same block with pyeclib/ISA-L once whole and in segments of 1, 2, 4 and 8 MiB
(best of 3 each) and prints GB/s and the ratio to the whole-block call. Then decodes a block
with its first ``m`` data chunks missing (a degraded read), segment by segment, with
pyeclib's ``decode``, with pyeclib's ``reconstruct`` of the missing fragments only (what
``tectofs.erasure.decode_into`` does with read-only chunks), and as ``decode_into`` does with
the writable buffers a client receives into (ISA-L called directly), each in a fresh process,
checks each gives the block back, and prints CPU seconds per GB of the first pass and of the
best of 3 (the direct path's first pass includes its one-time check against pyeclib).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from tectofs import erasure
from tectofs.benchmarks.common import parse_size
from tectofs.erasure import _driver, _fragment_size, _segments
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


def decode_s(length: int, policy_text: str, how: str) -> tuple[float, float]:
    """CPU seconds to decode a block of ``length`` random bytes with its first ``m`` data
    chunks missing, first pass and best of 3: with pyeclib's ``decode`` of every segment
    (``how="decode"``), or with ``erasure.decode_into`` given read-only chunks (``"reconstruct"``:
    pyeclib's reconstruct of the missing fragments) or writable ones (``"decode_into"``: ISA-L)."""
    policy = parse(policy_text)
    k, m = policy.data, policy.redundancy
    block = os.urandom(length)
    chunks = erasure.encode(policy, block)
    # Read-only chunks keep decode_into on pyeclib's reconstruct; writable ones take ISA-L directly.
    got: dict[int, erasure.Buffer] = {p: bytes(chunks[p]) if how == "reconstruct" else memoryview(chunks[p])
                                      for p in range(m, k + m)}
    out = memoryview(bytearray(length))
    driver = _driver(k, m)

    def with_decode() -> None:
        position = 0
        for offset, n in _segments(length):
            f = _fragment_size(k, m, n)
            fragments = [memoryview(v)[position : position + f].tobytes() for v in got.values()]
            out[offset : offset + n] = driver.decode(fragments)[:n]
            position += f

    decode = with_decode if how == "decode" else (lambda: erasure.decode_into(policy, got, out))
    times = []
    for _ in range(3):
        out[:] = bytes(length)
        started = time.process_time()
        decode()
        times.append(time.process_time() - started)
        if bytes(out) != block:
            raise SystemExit(f"{how}: the block did not come back")
    return times[0], min(times)


def _decode_in_child(length: int, policy_text: str, how: str) -> tuple[float, float]:
    """``decode_s`` in a fresh process (the allocator's state changes what pyeclib pays)."""
    import subprocess

    from tectofs import children

    done = subprocess.run([sys.executable, "-P", "-m", "tectofs.benchmarks.erasure_segments", "--decode", how,
                           "--block", str(length), "--policy", policy_text], env=children.cli_env(),
                          capture_output=True, text=True, check=True)
    first, best = done.stdout.split()
    return float(first), float(best)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--block", type=parse_size, default=parse_size("64M"))
    parser.add_argument("--policy", default="rs(4,2)")
    parser.add_argument("--decode", choices=("decode", "reconstruct", "decode_into"), help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    if args.decode:
        print(*decode_s(args.block, args.policy, args.decode))
        return
    policy = parse(args.policy)
    block = os.urandom(args.block)
    whole = encode_s(block, len(block), policy.data, policy.redundancy)
    print(f"whole {args.block >> 20} MiB block: {len(block) / whole / 1e9:.2f} GB/s")
    for mib in (1, 2, 4, 8):
        t = encode_s(block, mib << 20, policy.data, policy.redundancy)
        print(f"{mib} MiB segments: {len(block) / t / 1e9:.2f} GB/s ({whole / t:.1f}x the whole-block call)")
    gb = args.block / 1e9
    print(f"degraded decode ({policy.redundancy} data chunks missing), CPU s per GB, each in a fresh process, "
          f"first pass / best of 3:")
    for how, what in (("decode", "pyeclib decode of every segment"),
                      ("reconstruct", "pyeclib reconstruct of the missing fragments"),
                      ("decode_into", "ISA-L directly, in place (a client's degraded read)")):
        first, best = _decode_in_child(args.block, args.policy, how)
        print(f"  {what}: {first / gb:.2f} / {best / gb:.2f}")


if __name__ == "__main__":
    main()
