"""One chunk server, many concurrent puts: group commit vs. a sync per chunk.

    python3 -m tectofs.benchmarks.chunk_put --chunk 16M --count 40
    python3 -m tectofs.benchmarks.chunk_put --chunk 256K --count 600

Starts a one-server cluster per sync mode (``--sync group`` and ``--sync each``) and sends
``--count`` chunks of ``--chunk`` bytes with 64 in flight; reports puts/s, MiB/s and the
server's CPU seconds, and the ratio group / each from the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from tectofs import checksum
from tectofs.benchmarks.common import parse_size, process_cpu_s
from tectofs.server.cluster import LocalCluster
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient


def measure(mode: str, chunk_bytes: int, count: int) -> tuple[float, float]:
    """MiB/s and server CPU seconds for ``count`` concurrent puts under ``mode``."""
    data = os.urandom(chunk_bytes)
    crcs, whole = checksum.piece_and_whole_crcs(data)
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        with LocalCluster(os.path.join(tmp, "c"), servers=1, policy="rep(1)", sync=mode) as cluster:
            address = cluster.servers()[0].address
            pid = cluster.chunk_processes[0].pid  # type: ignore[union-attr]

            async def main() -> tuple[float, float]:
                # As a cluster member (the key): the server's put path without capabilities.
                rpc = RpcClient(connections_per_server=4, default_auth=auth.ClientAuth(ring=auth.KeyRing(cluster.key_file)))
                gate = asyncio.Semaphore(64)

                async def put(i: int) -> None:
                    async with gate:
                        request = messages.PutChunkRequest(block_id=i + 1, position=0, crcs=crcs, crc=whole)
                        await rpc.call(address, messages.PUT_CHUNK, request, data)

                cpu0, started = process_cpu_s(pid), time.perf_counter()
                await asyncio.gather(*(put(i) for i in range(count)))
                elapsed = time.perf_counter() - started
                await rpc.close()
                return count * chunk_bytes / elapsed / 2**20, process_cpu_s(pid) - cpu0

            return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", type=parse_size, default=parse_size("16M"))
    parser.add_argument("--count", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    results = {}
    for mode in ("each", "group"):
        runs = [measure(mode, args.chunk, args.count) for _ in range(args.repeats)]
        results[mode] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        print(f"--sync {mode:5s}: {results[mode][0]:7.0f} MiB/s, server CPU {results[mode][1]:.2f} s (medians)")
    print(f"group / each: {results['group'][0] / results['each'][0]:.2f}x throughput, "
          f"{results['group'][1] / results['each'][1]:.2f}x CPU")


if __name__ == "__main__":
    main()
