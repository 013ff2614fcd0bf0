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
numbers say what coordination costs, not what more hosts would add: for that, the CPU each
operation cost the services (``/proc``) gives a model of N services on N hosts
(:func:`services_model`, printed after the table; ``bench/SCALE.md`` carries it).
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


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the processes ``pids`` used so far (Linux ``/proc``)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15)
    return total


async def _measure(addresses: list[str], credential: str, files: int, concurrency: int,
                   service_pids: list[int]) -> dict[str, float]:
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

        rates: dict[str, float] = {}
        for kind, one in (("create", create), ("stat", stat), ("create_watched", create_watched)):
            if kind == "create_watched":
                await watcher.scandir("/watched")
            cpu = _cpu_s(service_pids)
            rates[kind] = await _spread(files, concurrency, clients, one)
            rates[f"{kind}_cpu_ms_per_op"] = 1000 * (_cpu_s(service_pids) - cpu) / files  # all services together
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
            assert cluster.meta_process is not None
            pids = [cluster.meta_process.pid, *(p.pid for p in extra)]
            return asyncio.run(_measure(addresses, cluster.credential_file, files, concurrency, pids))
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
                print(f"round {r + 1}, {services} service(s): " + ", ".join(
                    f"{k} {v:.3f}" if k.endswith("_per_op") else f"{k} {v:,.0f}" for k, v in rates.items()), flush=True)
                for kind, value in rates.items():
                    samples[services].setdefault(kind, []).append(value)
    medians = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    rows = [{"services": n, **{f"{k}/s": f"{medians[n][k]:,.0f}" for k in KINDS},
             "watcher recalls": f"{medians[n]['recalls_acknowledged']:.0f}"} for n in (1, 2)]
    ratios = {f"{k}: 2 services / 1": round(medians[2][k] / medians[1][k], 3) for k in KINDS}
    ratios.update({f"creates watched / unwatched, {n} service(s)": round(
        medians[n]["create_watched"] / medians[n]["create"], 3) for n in (1, 2)})
    return {"benchmark": "lease_services", "files": files, "concurrency": concurrency, "rounds": rounds,
            "samples": samples, "medians": medians, "rows": rows, "ratios": ratios,
            "model": services_model(medians)}


def services_model(medians: dict[int, dict[str, float]], counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict[str, Any]:
    """Metadata operations per second for N services, each on a host of its own, from the CPU
    the services spent per operation with 1 and with 2 of them (``*_cpu_ms_per_op``: all
    services together). A read costs its service alone: N services serve N times one's reads.
    A change costs its service ``c`` and, with peers, each peer ``p`` more (the recall it is
    told of on the LISTEN/NOTIFY channel, its heartbeat share): with two services the pair
    spends ``c + p`` per change, so ``p`` is that minus one service's ``c``; N services spend
    ``c + (N - 1) p`` per change, and serve ``N / (c + (N - 1) p)`` changes a second when each
    host's service is CPU-bound (a Python service uses about one core). PostgreSQL's own
    limit (its commits, one per change) is not modelled: it is measured on the same host here."""
    c = medians[1]["create_cpu_ms_per_op"] / 1000
    p = max(0.0, medians[2]["create_cpu_ms_per_op"] / 1000 - c)
    read = medians[1]["stat_cpu_ms_per_op"] / 1000
    rows = [{"services": n, "changes/s": round(n / (c + (n - 1) * p)), "reads/s": round(n / read)} for n in counts]
    return {"change_cpu_s": c, "peer_cpu_s_per_change": p, "read_cpu_s": read, "rows": rows,
            "changes_ceiling_per_s": round(1 / p) if p else None}


def render_model(result: dict[str, Any]) -> list[str]:
    """``bench/SCALE.md``'s section on N metadata services, from a result of :func:`run`."""
    model = result["model"]
    ceiling = model["changes_ceiling_per_s"]
    lines = [
        "## Several metadata services (one PostgreSQL store, a host each)",
        "",
        f"Measured by `python3 -m tectofs.benchmarks.lease_services --files {result['files']} --concurrency"
        f" {result['concurrency']} --rounds {result['rounds']}` (commit {str(result.get('commit', '?'))[:10]}"
        + (" with the changes that followed it" if result.get("uncommitted_changes") else "") + ", medians): every"
        " service's CPU per operation (`/proc`), with 1 and with 2 services on this host. A change costs the"
        f" service that makes it {1000 * model['change_cpu_s']:.3f} ms of CPU and each peer"
        f" {1000 * model['peer_cpu_s_per_change']:.3f} ms (its share of the recall channel and the heartbeats);"
        f" a read {1000 * model['read_cpu_s']:.3f} ms of its own service alone. With a CPU-bound service per host:",
        "",
        "| services | changes/s | reads/s |",
        "|---|---|---|",
        *(f"| {row['services']} | {row['changes/s']:,} | {row['reads/s']:,} |" for row in model["rows"]),
        "",
        "Reads scale with the services; changes scale while the peers' share is small against a change's own"
        " cost" + (f", towards {ceiling:,}/s (every service then spends its core on the others' recalls)"
                   if ceiling else "") + ". Not modelled: PostgreSQL's own commit rate (one commit per change;"
        " measured on this host with everything else) and the clients' round trips.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000, help="files per kind and round (default 2000)")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, each measuring 1 and 2 services (default 3)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON result goes")
    args = parser.parse_args()
    result = run(args.files, args.concurrency, args.rounds)
    print_table(result)
    model = result["model"]
    print(f"model: a change costs its service {1000 * model['change_cpu_s']:.3f} ms of CPU and each peer"
          f" {1000 * model['peer_cpu_s_per_change']:.3f} ms; a read {1000 * model['read_cpu_s']:.3f} ms")
    for row in model["rows"]:
        print(f"  {row['services']:>2} services: {row['changes/s']:>8,} changes/s  {row['reads/s']:>9,} reads/s")
    print("wrote", write_results(args.out, "lease_services", result))


if __name__ == "__main__":
    main()
