"""The client's encode, CPU seconds and page faults per GB encoded by two threads at once (as
the client's codec pool does), with and without one of its settings:

    python3 -m tectofs.benchmarks.encode_cpu --compare isal --size 1G --repeats 5     # ISA-L called directly, or pyeclib
    python3 -m tectofs.benchmarks.encode_cpu --compare malloc --size 1G --repeats 5   # tectofs.allocator.tune(), or glibc's defaults

Each configuration runs in its own process (both settings are per process), alternated
``--repeats`` times; medians are printed, and the ratio of the new path's CPU to the old one's
from the same run. ``--compare malloc`` measures with pyeclib's path (``TECTOFS_ISAL=0``),
whose per-segment allocations the malloc setting is about.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tectofs import children
from tectofs.benchmarks.common import parse_size

BLOCK = 64 << 20


def child(size: int) -> None:
    """Encode ``size`` bytes in 64 MiB blocks on two threads (after one warm-up pass); print
    CPU seconds and minor page faults per GB as JSON."""
    from tectofs import allocator, erasure
    from tectofs.buffers import BufferPool
    from tectofs.policy import parse

    if os.environ.get("TECTOFS_MALLOC_TUNING") != "0":
        allocator.tune()
    policy, pool = parse("rs(4,2)"), BufferPool(1 << 30)
    block = memoryview(bytearray(os.urandom(BLOCK)))
    blocks = max(1, size // BLOCK)

    def encode(_: int) -> None:
        for chunk in erasure.encode(policy, block, pool.get):
            pool.put(chunk)

    with ThreadPoolExecutor(2) as threads:
        list(threads.map(encode, range(blocks)))  # warm: the pool holds its buffers
        before = resource.getrusage(resource.RUSAGE_SELF)
        list(threads.map(encode, range(blocks)))
        after = resource.getrusage(resource.RUSAGE_SELF)
    gb = blocks * BLOCK / 1e9
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    print(json.dumps({"cpu_s_per_gb": cpu / gb, "faults_per_gb": (after.ru_minflt - before.ru_minflt) / gb}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", choices=sorted(COMPARISONS), default="isal",
                        help="which setting to turn off and on (default isal)")
    parser.add_argument("--size", default="1G", help="bytes encoded per measurement (default 1G)")
    parser.add_argument("--repeats", type=int, default=5, help="processes per configuration (default 5)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = parse_size(args.size)
    if args.child:
        child(size)
        return
    configurations = COMPARISONS[args.compare]
    runs: dict[str, list[dict]] = {name: [] for name, _ in configurations}
    for _ in range(args.repeats):
        for name, env_setting in configurations:
            env = children.cli_env({**os.environ, **env_setting})  # the child's tectofs is this process's
            out = subprocess.run([sys.executable, "-P", "-m", "tectofs.benchmarks.encode_cpu", "--child", "--size",
                                  str(size)], env=env, capture_output=True, text=True, check=True, timeout=600).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    medians = {name: {key: statistics.median(r[key] for r in rs) for key in ("cpu_s_per_gb", "faults_per_gb")}
               for name, rs in runs.items()}
    for name, m in medians.items():
        print(f"{name:28s} encode CPU {m['cpu_s_per_gb']:.3f} s/GB   minor page faults {m['faults_per_gb']:,.0f} per GB")
    (old, _), (new, _) = configurations
    print(f"{new} / {old} encode CPU: {medians[new]['cpu_s_per_gb'] / medians[old]['cpu_s_per_gb']:.2f}"
          f" (medians of {args.repeats}, alternated)")


# name -> environment, the old configuration first
COMPARISONS = {
    "malloc": [("glibc defaults", {"TECTOFS_MALLOC_TUNING": "0", "TECTOFS_ISAL": "0"}),
               ("tectofs.allocator.tune()", {"TECTOFS_MALLOC_TUNING": "1", "TECTOFS_ISAL": "0"})],
    "isal": [("through pyeclib", {"TECTOFS_ISAL": "0"}), ("ISA-L called directly", {"TECTOFS_ISAL": "1"})],
}


if __name__ == "__main__":
    main()
