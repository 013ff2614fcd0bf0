"""Metadata operations per second through one and two metadata services over one PostgreSQL
store, with metadata leases held, in the same run: what a second service adds, and what a
client that caches (and so must be recalled) costs the clients that change things.

    python3 -m tectofs.benchmarks.lease_services --files 2000 --concurrency 32 --rounds 3

Each round, for 1 and then 2 services (alternating order between rounds): a fresh database on a
throwaway PostgreSQL server (``tectofs.testing.postgres``), a local cluster (6 chunk servers)
and, with 2 services, a second ``tectofs meta`` on the same store. One client per service, the
``--concurrency`` calls in flight split between them: creates of ``--files`` empty files, a stat
of each, then ``creates under a watcher``: a client holding leases (on the last service) lists
the directory every 100 creates, so creates keep recalling its listing. Reported: operations per
second (medians over rounds), the 2-service/1-service ratio of each, and the watched/unwatched
ratio of creates. On one host the services share its cores with PostgreSQL and the client: the
numbers say what coordination costs, not what more hosts would add (``bench/SCALE.md`` models N).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Any, Awaitable, Callable

from tectofs.benchmarks.common import print_table, write_results

HERE = os.path.dirname(os.path.realpath(__file__))
KINDS = ("create", "stat", "create_watched")


async def _spread(count: int, concurrency: int, clients: list[Any], one: Callable[[Any, int], Awaitable[Any]]) -> float:
    """``one(client, i)`` for every ``i`` below ``count``, ``concurrency`` at once, worker ``w``
    using ``clients[w % len(clients)]``; returns operations per second."""
    indexes = iter(range(count))

    async def worker(w: int) -> None:
        for i in indexes:
            await one(clients[w % len(clients)], i)

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return count / (time.perf_counter() - started)


async def _measure(addresses: list[str], credential: str, files: int, concurrency: int) -> dict[str, float]:
    from tectofs.client.core import AsyncFileSystem

    clients = [AsyncFileSystem(a, credential) for a in addresses]
    watcher = AsyncFileSystem(addresses[-1], credential, leases=True)
    try:
        assert watcher.lease_session is not None
        deadline = time.monotonic() + 30
        while not watcher.lease_session.remaining():
            if time.monotonic() > deadline:
                raise SystemExit("the watcher got no lease in 30 s")
            await asyncio.sleep(0.05)
        await clients[0].mkdir("/ops")
        await clients[0].mkdir("/watched")

        async def create(fs: Any, i: int) -> None:
            await fs.write_bytes(f"/ops/f{i:07d}", b"")

        async def stat(fs: Any, i: int) -> None:
            await fs.stat(f"/ops/f{i:07d}")

        async def create_watched(fs: Any, i: int) -> None:
            await fs.write_bytes(f"/watched/f{i:07d}", b"")
            if i % 100 == 0:
                await watcher.scandir("/watched")

        rates = {"create": await _spread(files, concurrency, clients, create),
                 "stat": await _spread(files, concurrency, clients, stat)}
        await watcher.scandir("/watched")
        rates["create_watched"] = await _spread(files, concurrency, clients, create_watched)
        rates["recalls_acknowledged"] = float(watcher.lease_session.recalls_done)
        return rates
    finally:
        for fs in (*clients, watcher):
            await fs.close()


def one_round(services: int, files: int, concurrency: int, pg_url: str) -> dict[str, float]:
    from tectofs.server.cluster import LocalCluster
    from tectofs.testing.postgres import new_database

    with tempfile.TemporaryDirectory(prefix="tectofs-lease-services-") as tmp:
        cluster = LocalCluster(os.path.join(tmp, "cluster"), servers=6, store=new_database(pg_url))
        cluster.start()
        extra = []
        try:
            addresses = [cluster.address]
            for _ in range(services - 1):
                address, process = cluster.start_extra_meta()
                addresses.append(address)
                extra.append(process)
            return asyncio.run(_measure(addresses, cluster.credential_file, files, concurrency))
        finally:
            for process in extra:
                process.terminate()
                process.wait(timeout=20)
            cluster.stop()


def run(files: int, concurrency: int, rounds: int) -> dict[str, Any]:
    from tectofs.testing import postgres

    lacks = postgres.missing()
    if lacks:
        raise SystemExit(f"PostgreSQL cannot run here: {'; '.join(lacks)} (scripts/install.sh installs it)")
    samples: dict[int, dict[str, list[float]]] = {1: {}, 2: {}}
    with postgres.server() as pg_url:
        for r in range(rounds):
            for services in ((1, 2) if r % 2 == 0 else (2, 1)):
                rates = one_round(services, files, concurrency, pg_url)
                print(f"round {r + 1}, {services} service(s): " + ", ".join(f"{k} {v:,.0f}" for k, v in rates.items()),
                      flush=True)
                for kind, value in rates.items():
                    samples[services].setdefault(kind, []).append(value)
    medians = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    rows = [{"services": n, **{f"{k}/s": f"{medians[n][k]:,.0f}" for k in KINDS},
             "watcher recalls": f"{medians[n]['recalls_acknowledged']:.0f}"} for n in (1, 2)]
    ratios = {f"{k}: 2 services / 1": round(medians[2][k] / medians[1][k], 3) for k in KINDS}
    ratios.update({f"creates watched / unwatched, {n} service(s)": round(
        medians[n]["create_watched"] / medians[n]["create"], 3) for n in (1, 2)})
    return {"benchmark": "lease_services", "files": files, "concurrency": concurrency, "rounds": rounds,
            "samples": samples, "medians": medians, "rows": rows, "ratios": ratios}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000, help="files per kind and round (default 2000)")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each measuring 1 and 2 services (default 3)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON result goes")
    args = parser.parse_args()
    result = run(args.files, args.concurrency, args.rounds)
    print_table(result)
    print("wrote", write_results(args.out, "lease_services", result))


if __name__ == "__main__":
    main()
