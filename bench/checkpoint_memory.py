"""The memory-tier rows of ``tectofs bench checkpoint`` (``checkpoint_bench.py``, section (h)).

Three agents on this host stand for three nodes: node 1's (the trainer's), which replicates to
node 2's, and an empty one standing for the node that replaces node 1 after it is lost. Each
round saves the state dict with ``dcp.save`` and ``CheckpointWriter(tier="memory")`` (returns
once node 2 holds a copy), waits until the agent has persisted it to the chunk servers, then
restores that same step three ways, each a ``dcp.load`` with a ``CheckpointReader`` given other
agents: after a trainer crash (node 1's agent first: read in place from shared memory), after
a node loss (the replacement's empty agent, then node 2's: read over loopback from the peer),
and from the chunk servers (no agent). The page cache is dropped before every load, as for the
other loads of the benchmark. Ratios: the chunk servers' restore time over each memory restore.

    python3 -m tectofs.benchmarks.checkpoint_memory --size 1G --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from typing import Any, Callable

from tectofs.benchmarks.common import drop_caches, parse_size, write_results

MiB = 1 << 20
RESTORES = {  # row -> which agents the reader is given ({local}, {peer}, {spare}: node 1, node 2, the replacement)
    "tectofs restore after a trainer crash (this host's memory agent)": "{local},{peer}",
    "tectofs restore after a node loss (a peer's memory agent)": "{spare},{peer}",
    "tectofs restore from the chunk servers (same step)": "",
}
SOURCES = dict(zip(RESTORES, ("memory", "peer", "storage")))  # row -> the tier its loads must read
SAVE_ROW = "tectofs save, memory tier (2 copies in memory)"
WAIT_S = 600.0


class _Agents:
    """Agent processes for the measurement, stopped (SIGTERM: each drops its memory) at the end."""

    def __init__(self, root: str, cluster: str) -> None:
        self.root, self.cluster = root, cluster
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> str:
        from tectofs.agent.process import start_agent

        proc, address = start_agent(self.root, "--cluster", self.cluster, *args, name=f"agent-{len(self.procs)}")
        self.procs.append(proc)
        return address

    def __enter__(self) -> _Agents:
        return self

    def __exit__(self, *exc: Any) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def measure(base: str, sd: Any, target: Any, nbytes: int, repeats: int, record: Callable[[str, float], None],
            load_into_target: Callable[[Callable[[], Any], str], None]) -> dict[str, Any]:
    """Run the rounds against the cluster at ``base`` (a ``tectofs://`` directory), saving ``sd``
    and loading into ``target`` through ``load_into_target(load, row)`` (which times it and
    compares); ``record`` gets the save rows. Returns the tier each restore read from."""
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt
    from tectofs import uri as _uri
    from tectofs.agent.client import agent_client

    memory = str(4 * nbytes + 64 * MiB)
    loaded_from: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="tectofs-memory-bench-") as tmp, _Agents(tmp, _uri.resolve(base)[0].meta_address) as agents:
        peer = agents.start("--memory-bytes", memory)
        local = agents.start("--memory-bytes", memory, "--peers", peer)
        spare = agents.start("--memory-bytes", memory)
        writer = tt.CheckpointWriter(tier="memory", agent=f"{local},{peer}")
        for i in range(repeats):
            uri = f"{base}/step_{i}"
            started = time.perf_counter()
            dcp.save(sd, checkpoint_id=uri, storage_writer=writer)
            record(SAVE_ROW, time.perf_counter() - started)
            deadline = time.monotonic() + WAIT_S
            while not getattr(agent_client(uri).locate(local, uri), "persisted", False):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{uri} was not persisted within {WAIT_S:g} s")
                time.sleep(0.1)
            for row, agent in RESTORES.items():
                reader = tt.CheckpointReader(agent=agent.format(local=local, peer=peer, spare=spare))
                load_into_target(lambda: dcp.load(target, checkpoint_id=uri, storage_reader=reader), row)
                loaded_from.setdefault(row, []).append(reader.loaded_from)
    return {"loaded_from": loaded_from}


RATIO_TARGETS = {  # issue 34's: restore from memory 10x faster than from the chunk servers, from a peer 3x
    "restore after a trainer crash: chunk servers' time / this host's memory agent's": 10.0,
    "restore after a node loss: chunk servers' time / a peer memory agent's": 3.0,
}


def read_as_named(result: dict[str, Any]) -> bool:
    """Whether every restore of ``measure``'s ``result`` read the tier its row names."""
    return all(set(tiers) == {SOURCES[row]} for row, tiers in result["loaded_from"].items())


def ratios(median_s: Callable[[str], float]) -> dict[str, float]:
    """The restore ratios, from the rows' median times."""
    storage = median_s("tectofs restore from the chunk servers (same step)")
    return {
        "restore after a trainer crash: chunk servers' time / this host's memory agent's": round(
            storage / median_s("tectofs restore after a trainer crash (this host's memory agent)"), 2),
        "restore after a node loss: chunk servers' time / a peer memory agent's": round(
            storage / median_s("tectofs restore after a node loss (a peer's memory agent)"), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"), help="state dict bytes (default 1G)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    import torch

    import tectofs
    from tectofs.server.cluster import LocalCluster

    tree = os.path.dirname(os.path.dirname(os.path.realpath(tectofs.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)}
    gen = torch.Generator().manual_seed(0)
    rows = max(1, args.size // 8 // 4 // 4096)
    sd = {f"layer{i}": torch.randn(rows, 4096, generator=gen) for i in range(8)}
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    nbytes = sum(t.nbytes for t in sd.values())
    times: dict[str, list[float]] = {}
    exact: list[bool] = []

    def record(row: str, seconds: float) -> None:
        times.setdefault(row, []).append(seconds)

    def load_into_target(load: Callable[[], Any], row: str) -> None:
        for t in target.values():
            t.zero_()
        drop_caches()
        started = time.perf_counter()
        load()
        record(row, time.perf_counter() - started)
        exact.append(all(torch.equal(sd[k], target[k]) for k in sd))

    with tempfile.TemporaryDirectory(prefix="tectofs-memory-bench-") as tmp:
        with LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)", gc_delay_s=3600.0,
                          extra_env={"PYTHONPATH": env["PYTHONPATH"]}) as cluster:
            result = measure(f"tectofs://{cluster.address}/bench/memory", sd, target, nbytes, args.repeats, record,
                             load_into_target)
    median = {row: statistics.median(runs) for row, runs in times.items()}
    result.update({"benchmark": "checkpoint_memory", "size_bytes": nbytes, "repeats": args.repeats,
                   "bit_exact": all(exact), "read_as_named": read_as_named(result),
                   "rows": [{"what": row, "GB/s (median)": round(nbytes / median[row] / 1e9, 3),
                             "median_s": round(median[row], 4), "runs_s": [round(t, 4) for t in times[row]]}
                            for row in times],
                   "ratios": ratios(median.__getitem__)})
    write_results(args.out, "checkpoint_memory", result)
    for row in result["rows"]:
        print(f"{row['what']:70s} {row['median_s']:8.4f} s  {row['GB/s (median)']:7.3f} GB/s")
    for name, value in result["ratios"].items():
        print(f"{name}: {value}")
    print("loaded from:", result["loaded_from"], "bit exact:", result["bit_exact"])


if __name__ == "__main__":
    main()
