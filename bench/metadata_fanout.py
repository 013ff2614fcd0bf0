"""Load fan-out: every rank of a load reads the checkpoint's ``.metadata``; read from storage
by every rank, or once and broadcast (``CheckpointReader(share_metadata=True)``), in the same
run.

    python3 -m tectofs.benchmarks.metadata_fanout --ranks 16 --tensors 5000 --repeats 5

A local cluster (6 chunk servers, rs(4,2)) stores one checkpoint of ``--tensors`` small
tensors (its ``.metadata`` grows with them, as a sharded model's does with its parameters and
shards). ``--ranks`` processes join a gloo group on loopback and, at a barrier, read the
metadata as ``dcp.load`` does on every rank, alternating the two ways ``--repeats`` times.
Reported, as medians: the time until the slowest rank has the metadata's bytes, the reads of
``.metadata`` from storage, and the chunks the chunk servers served; and, once, what one rank
then spends unpickling it (the same either way: on 2 cores, 16 ranks unpickling a large
``.metadata`` take longer than reading it). On one host the broadcast
goes over loopback; on a cluster it goes over the training network.
"""

from __future__ import annotations

import argparse
import os
import pickle
import socket
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from typing import Any

from tectofs.benchmarks.common import print_table, work_dir, write_results

MODES = (("every rank reads", False), ("read once, broadcast", True))


def _chunk_gets(fs: Any) -> int:
    from tectofs.wire import messages

    total = 0
    for server in fs.servers():
        if server.live and server.address:
            reply, _ = fs.run(fs.aio.rpc.call(server.address, messages.CHUNK_STAT, messages.Empty(), timeout_s=10))
            total += reply.stats.get("gets", 0)
    return total


def _rank_main(rank: int, world: int, port: int, uri: str, address: str, repeats: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    import tectofs.torch as tt
    from tectofs.uri import filesystem

    warnings.simplefilter("ignore")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    try:
        blob = tt.CheckpointReader(uri).metadata_bytes()  # warm: connections to the MDS and the chunk servers
        decode_s = time.perf_counter()  # what every rank then spends unpickling it, either way
        entries = len(pickle.loads(blob).state_dict_metadata)
        decode_s = time.perf_counter() - decode_s
        samples: list[dict[str, Any]] = []
        for i in range(repeats):
            for name, share in MODES:
                fetches = [0]

                class Counting(tt.CheckpointReader):
                    def _fetch_metadata(self, loc: Any) -> bytes:
                        fetches[0] += 1
                        return super()._fetch_metadata(loc)

                gets_before = _chunk_gets(filesystem(address)) if rank == 0 else 0
                dist.barrier()
                started = time.perf_counter()
                got = Counting(uri, share_metadata=share).metadata_bytes()
                elapsed = torch.tensor([time.perf_counter() - started, float(fetches[0])], dtype=torch.float64)
                if got != blob:
                    raise RuntimeError(f"rank {rank}: the metadata's bytes differ ({name})")
                dist.all_reduce(elapsed[:1], op=dist.ReduceOp.MAX)
                dist.all_reduce(elapsed[1:], op=dist.ReduceOp.SUM)
                if rank == 0:
                    samples.append({"mode": name, "run": i, "slowest rank s": float(elapsed[0]),
                                    "reads of .metadata": int(elapsed[1]),
                                    "chunks served": _chunk_gets(filesystem(address)) - gets_before,
                                    "entries": entries, "unpickle s (rank 0)": decode_s})
        if rank == 0:
            import json

            with open(out_path, "w") as f:
                json.dump(samples, f)
    finally:
        dist.destroy_process_group()


def run(out_dir: str, ranks: int = 16, tensors: int = 5000, repeats: int = 5, work: str | None = None) -> dict[str, Any]:
    """Start a cluster, store the checkpoint, run the ranks; return (and write) the medians."""
    import torch
    import torch.distributed.checkpoint as dcp
    import torch.multiprocessing as mp

    import tectofs.torch as tt
    from tectofs.server.cluster import LocalCluster

    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory(dir=work, prefix="tectofs-fanout-") as tmp:
        cluster = LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)", log_to_files=True)
        cluster.start()
        try:
            uri = f"tectofs://{cluster.address}/fanout/step_1"
            dcp.save({f"layers.{i}.weight": torch.full((8,), float(i)) for i in range(tensors)},
                     storage_writer=tt.CheckpointWriter(uri))
            size = tt.filesystem(cluster.address).stat("/fanout/step_1/.metadata").size
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            out_path = os.path.join(tmp, "samples.json")
            mp.spawn(_rank_main, args=(ranks, port, uri, cluster.address, repeats, out_path), nprocs=ranks, join=True)
            import json

            with open(out_path) as f:
                samples = json.load(f)
        finally:
            tt.close_all()
            cluster.stop()
    rows = []
    for name, _ in MODES:
        mine = [s for s in samples if s["mode"] == name]
        rows.append({"what": name, **{k: round(statistics.median(s[k] for s in mine), 4)
                                      for k in ("slowest rank s", "reads of .metadata", "chunks served")}})
    ratio = rows[1]["slowest rank s"] / rows[0]["slowest rank s"]
    result = {"benchmark": "metadata_fanout", "ranks": ranks, "tensors": tensors, "metadata_bytes": size,
              "unpickle_s": samples[0]["unpickle s (rank 0)"],
              "repeats": repeats, "samples": samples, "rows": rows,
              "ratios": {"read once / every rank reads (slowest rank)": round(ratio, 3)}, "errors": []}
    write_results(out_dir, "metadata_fanout", result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=16, help="processes in the gloo group (default 16)")
    parser.add_argument("--tensors", type=int, default=5000, help="tensors in the checkpoint (default 5000)")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each way, alternated (default 5)")
    parser.add_argument("--work-dir", default=None, help="where the cluster goes, created if missing (default: $TMPDIR)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.ranks < 2 or args.repeats < 3:
        parser.error("--ranks must be at least 2 and --repeats at least 3 (figures are medians)")
    result = run(args.out, args.ranks, args.tensors, args.repeats, work_dir(args.work_dir))
    print(f".metadata: {result['metadata_bytes']:,} bytes, {args.tensors} tensors, {args.ranks} ranks; "
          f"medians of {args.repeats} runs; unpickling it then takes {result['unpickle_s']:.2f} s per rank either way")
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
