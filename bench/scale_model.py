"""What a 24,576-GPU job would need from tectofs, derived from figures measured here.

    python3 -m tectofs.benchmarks.scale_model --burst bench/results/burst.json --client-io bench/results/client_io.json
    python3 -m tectofs.benchmarks.scale_model        # no burst results here: the figures SCALE.md was made from

Reads the burst results (``bench/burst.py``: MDS operations per rank, MDS and chunk-server
CPU seconds per phase) and optionally the large-stream results (``bench/client_io.py``),
applies stated assumptions about the job (a Llama-3-405B-like model, fully sharded
checkpoint state) and the storage hosts, and writes ``bench/SCALE.md``: chunk servers,
metadata operations per second and network per checkpoint.

The transferable figures are *costs*, not speeds: CPU seconds per GB a chunk-server
process spends, and CPU seconds per metadata operation. Speeds measured on this machine
are bounded by its one shared virtual disk and two cores, which a storage host does not
share with anything.

Without burst results (a fresh clone: ``bench/results/`` is not in git) it models from
``bench/scale_figures.json``, the measured figures the committed ``SCALE.md`` was made from;
``--json FILE`` writes a run's figures in the same form (its ``measured`` part).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, fields
from typing import Any

GB = 1e9
MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BURST = os.path.join(HERE, "results", "burst.json")
DEFAULT_FIGURES = os.path.join(HERE, "scale_figures.json")



@dataclass
class Job:
    gpus: int = 24_576
    gpus_per_node: int = 8
    parameters: float = 405e9
    # bf16 weights (2) + fp32 master weights (4) + Adam first and second moments (4 + 4)
    checkpoint_bytes_per_parameter: float = 14.0
    write_window_s: float = 60.0   # a checkpoint is durable this long after the barrier
    load_window_s: float = 60.0    # every rank has its state back this long after a restart
    files_per_rank: int = 1        # DCP: one data file per rank, plus one .metadata


@dataclass
class Storage:
    data_chunks: int = 4           # rs(4,2)
    parity_chunks: int = 2
    block_bytes: int = 64 * MiB
    processes_per_host: int = 8    # one chunk-server process per NVMe drive (each is ~1 core: the GIL)
    drive_write_GBps: float = 2.0  # sustained, per drive
    drive_read_GBps: float = 5.0
    nic_GBps: float = 25.0         # 2 x 100 GbE per storage host
    node_nic_GBps: float = 50.0    # 400 Gb/s front-end per GPU node
    headroom: float = 1.3          # spare capacity: a host down, rebuild traffic, stragglers


def _load(path: str | None) -> dict[str, Any] | None:
    if not path:
        return None
    with open(path) as f:
        return json.load(f)  # type: ignore[no-any-return]


def measured_figures(burst: dict[str, Any], client_io: dict[str, Any] | None) -> dict[str, Any]:
    """The per-server and per-MDS figures the model uses, each with where it came from."""
    phases = burst["phases"]
    save, load, storm = phases["save"], phases.get("load"), phases.get("metadata")
    assert save["ranks_ok"] > 0, "the burst run has no successful saves"
    expansion = _expansion(burst["policy"])
    client_bytes = save["ranks_ok"] * burst["shard_bytes"]
    raw_bytes = client_bytes * expansion
    figures: dict[str, Any] = {
        "source": {"ranks": burst["ranks"], "shard_bytes": burst["shard_bytes"], "servers": burst["servers"],
                   "policy": burst["policy"], "errors": burst.get("error_count", 0),
                   "pack_max_bytes": burst.get("pack_max_bytes", 0)},
        "mds_ops_per_rank_save": save["mds_operations"] / save["ranks_ok"],
        "mds_ops_per_rank_load": load["mds_operations"] / max(1, load["ranks_ok"]) if load else None,
        "burst_save_GBps": save["aggregate_GBps"],
        "burst_load_GBps": load["aggregate_GBps"] if load else None,
        "burst_save_mds_ops_per_s": save["mds_ops_per_s"],
        "close_p99_s": (save.get("close_latency_s") or {}).get("p99"),
        "min_live_chunk_servers": min((p.get("liveness") or {}).get("min_live_chunk_servers", burst["servers"])
                                      for p in (save, load, storm) if p),
        "max_heartbeat_age_s": max((p.get("liveness") or {}).get("max_heartbeat_age_s", 0.0)
                                   for p in (save, load, storm) if p),
        "listen_overflows": sum(((p.get("liveness") or {}).get("tcp_host_wide") or {}).get("ListenOverflows", 0)
                                for p in (save, load, storm) if p),
    }
    cpu = save.get("cpu_s") or {}
    base = burst.get("baseline") or {}
    width = _width(burst["policy"])
    small = None
    if cpu.get("chunk_servers"):
        small = (save["ranks_ok"] * _chunks_per_file(burst), raw_bytes / GB, cpu["chunk_servers"])
        figures["chunk_cpu_s_per_raw_GB_small_chunks"] = small[2] / small[1]
    large = None
    if (base.get("write_cpu_s") or {}).get("chunk_servers"):
        large = (base["blocks"] * width, base["bytes"] * expansion / GB, base["write_cpu_s"]["chunk_servers"])
        figures["chunk_cpu_s_per_raw_GB_large_chunks"] = large[2] / large[1]
    per_put, per_gb = _fit_costs(small, large)
    figures["chunk_cpu_s_per_put"] = per_put
    figures["chunk_cpu_s_per_raw_GB"] = per_gb
    if (base.get("read_cpu_s") or {}).get("chunk_servers"):
        figures["chunk_cpu_s_per_GB_read"] = base["read_cpu_s"]["chunk_servers"] / (base["bytes"] / GB)
    else:
        load_cpu = (load or {}).get("cpu_s") or {}
        if load_cpu.get("chunk_servers") and load["ranks_ok"]:
            figures["chunk_cpu_s_per_GB_read"] = load_cpu["chunk_servers"] / (load["ranks_ok"] * burst["shard_bytes"] / GB)
    if storm and storm.get("cpu_s", {}).get("mds"):
        figures["mds_cpu_s_per_op"] = storm["cpu_s"]["mds"] / max(1, storm["mds_operations"])
        figures["mds_ops_per_s_observed"] = storm["mds_ops_per_s"]
    elif cpu.get("mds"):
        figures["mds_cpu_s_per_op"] = cpu["mds"] / max(1, save["mds_operations"])
        figures["mds_ops_per_s_observed"] = save["mds_ops_per_s"]
    if client_io:
        rows = {r["what"]: r for r in client_io["rows"]}
        write = rows.get("client write", {}).get("GB/s (median)")
        if write:
            figures["single_stream_write_GBps"] = write
            figures["large_chunk_raw_GBps_per_server_here"] = write * expansion / burst["servers"]
        read = rows.get("client read", {}).get("GB/s (median)")
        if read:
            figures["single_stream_read_GBps"] = read
    return figures


def _fit_costs(small: tuple[float, float, float] | None,
               large: tuple[float, float, float] | None) -> tuple[float, float]:
    """Chunk-server CPU = per_put * puts + per_GB * GB, from two runs ``(puts, GB, cpu_s)``:
    the burst (many small chunks) and the single large writer (few large ones)."""
    if small and large:
        (p1, g1, c1), (p2, g2, c2) = small, large
        det = p1 * g2 - p2 * g1
        if det:
            per_put, per_gb = (c1 * g2 - c2 * g1) / det, (p1 * c2 - p2 * c1) / det
            if per_put >= 0 and per_gb >= 0:
                return per_put, per_gb
        per_gb = c2 / g2
        return max(0.0, (c1 - per_gb * g1) / p1), per_gb
    if small:
        return small[2] / small[0], 0.0
    if large:
        return 0.0, large[2] / large[1]
    return 0.0, 0.0


def _width(policy: str) -> int:
    inner = policy[policy.index("(") + 1 : policy.index(")")]
    return sum(int(x) for x in inner.split(",")) if "," in inner else int(inner)


def _parity(policy: str) -> int:
    inner = policy[policy.index("(") + 1 : policy.index(")")]
    return int(inner.split(",")[1]) if "," in inner else 0


def _expansion(policy: str) -> float:
    inner = policy[policy.index("(") + 1 : policy.index(")")]
    if policy.startswith("rep"):
        return float(inner)
    k, m = (int(x) for x in inner.split(","))
    return (k + m) / k


def _chunks_per_file(burst: dict[str, Any]) -> int:
    block = burst.get("dir_block_size") or burst["block_size"]
    return math.ceil(burst["shard_bytes"] / block) * _width(burst["policy"])


def model(job: Job, storage: Storage, figures: dict[str, Any]) -> dict[str, Any]:
    checkpoint_bytes = job.parameters * job.checkpoint_bytes_per_parameter
    per_gpu = checkpoint_bytes / job.gpus
    expansion = (storage.data_chunks + storage.parity_chunks) / storage.data_chunks
    width = storage.data_chunks + storage.parity_chunks
    blocks_per_rank = math.ceil(per_gpu / storage.block_bytes)
    raw_bytes = checkpoint_bytes * expansion
    write_client_GBps = checkpoint_bytes / job.write_window_s / GB
    write_raw_GBps = write_client_GBps * expansion
    read_GBps = checkpoint_bytes / job.load_window_s / GB  # reads fetch k of k+m chunks

    # Chunk servers: the tightest of CPU (one core per process), drives, NIC.
    chunk_bytes = storage.block_bytes / storage.data_chunks
    cpu_write = figures.get("chunk_cpu_s_per_raw_GB", 0.0) + figures.get("chunk_cpu_s_per_put", 0.0) * GB / chunk_bytes
    cpu_write = cpu_write or None
    cpu_read = figures.get("chunk_cpu_s_per_GB_read")
    process_write_GBps = 1 / cpu_write if cpu_write else float("inf")
    process_read_GBps = 1 / cpu_read if cpu_read else float("inf")
    host_write = {
        "cpu": storage.processes_per_host * process_write_GBps,
        "drives": storage.processes_per_host * storage.drive_write_GBps,
        "nic": storage.nic_GBps,
    }
    host_read = {
        "cpu": storage.processes_per_host * process_read_GBps,
        "drives": storage.processes_per_host * storage.drive_read_GBps,
        "nic": storage.nic_GBps,
    }
    write_limit = min(host_write, key=host_write.__getitem__)
    read_limit = min(host_read, key=host_read.__getitem__)
    hosts_write = write_raw_GBps / host_write[write_limit]
    hosts_read = read_GBps / host_read[read_limit]
    hosts = max(width, math.ceil(max(hosts_write, hosts_read) * storage.headroom))
    puts = job.gpus * blocks_per_rank * width

    # Metadata: per rank create, allocate (batches of 1, 2, 4, 8 blocks), commit (which
    # answers with the new layout); the coordinator's .metadata and rename are a handful more.
    allocate_calls = math.ceil(math.log2(blocks_per_rank + 1))
    ops_per_rank_save = job.files_per_rank * (2 + allocate_calls)
    ops_save = job.gpus * ops_per_rank_save + 8
    ops_load = job.gpus * 2  # layout of .metadata and of the rank's file
    mds_cpu = figures.get("mds_cpu_s_per_op")
    mds_capacity = 1 / mds_cpu if mds_cpu else figures.get("mds_ops_per_s_observed", float("nan"))
    barrier_creates_s = job.gpus * job.files_per_rank / mds_capacity

    node_bytes = per_gpu * job.gpus_per_node * expansion
    return {
        "checkpoint_TB": checkpoint_bytes / 1e12,
        "per_gpu_MB": per_gpu / 1e6,
        "blocks_per_rank": blocks_per_rank,
        "raw_TB_written": raw_bytes / 1e12,
        "write_client_GBps": write_client_GBps,
        "write_raw_GBps": write_raw_GBps,
        "read_GBps": read_GBps,
        "chunk_cpu_s_per_raw_GB_at_job_chunks": cpu_write,
        "chunk_bytes": chunk_bytes,
        "chunk_process_write_GBps_cpu_bound": process_write_GBps,
        "chunk_process_read_GBps_cpu_bound": process_read_GBps,
        "host_write_GBps": host_write,
        "host_read_GBps": host_read,
        "host_write_limit": write_limit,
        "host_read_limit": read_limit,
        "storage_hosts": hosts,
        "chunk_server_processes": hosts * storage.processes_per_host,
        "chunk_puts_per_checkpoint": puts,
        "chunk_puts_per_s": puts / job.write_window_s,
        "mds_ops_per_rank_save": ops_per_rank_save,
        "mds_ops_per_checkpoint": ops_save,
        "mds_ops_per_restart": ops_load,
        "mds_ops_per_s_needed_over_window": ops_save / job.write_window_s,
        "mds_capacity_ops_per_s": mds_capacity,
        "mds_services_needed_over_window": math.ceil(ops_save / job.write_window_s / mds_capacity),
        "barrier_create_storm_s": barrier_creates_s,
        "node_bytes_per_checkpoint_GB": node_bytes / GB,
        "node_nic_share_over_window": node_bytes / job.write_window_s / GB / storage.node_nic_GBps,
        "storage_front_end_Tbps": write_raw_GBps * 8 / 1000,
    }


def render(job: Job, storage: Storage, figures: dict[str, Any], out: dict[str, Any], sources: list[str]) -> str:
    def f(x: Any, digits: int = 2) -> str:
        if isinstance(x, float):
            if x == float("inf"):
                return "unbounded"
            return f"{x:,.{digits}f}"
        return f"{x:,}" if isinstance(x, int) else str(x)

    src = figures["source"]
    lines = [
        "# What a 24,576-GPU checkpoint needs from tectofs",
        "",
        f"Generated by `python3 -m tectofs.benchmarks.scale_model` on {time.strftime('%Y-%m-%d %H:%M')} from "
        + ", ".join(f"`{s}`" for s in sources) + ". Re-run it after new burst results.",
        "",
        "## Measured here (2 cores, one shared virtual disk, every process on one host)",
        "",
        f"Burst: {src['ranks']} ranks x {src['shard_bytes'] / MiB:g} MiB, {src['servers']} chunk servers, "
        f"{src['policy']}, "
        + (f"chunks up to {src['pack_max_bytes'] / MiB:g} MiB packed (`--pack-max`), " if src.get("pack_max_bytes") else "")
        + f"errors {src['errors']}.",
        "",
        "| figure | value | use |",
        "|---|---|---|",
        f"| chunk-server CPU per raw GB written, small chunks (the burst) | "
        f"{f(figures.get('chunk_cpu_s_per_raw_GB_small_chunks', float('nan')))} s | with the next row: the fit below |",
        f"| chunk-server CPU per raw GB written, large chunks (one large writer) | "
        f"{f(figures.get('chunk_cpu_s_per_raw_GB_large_chunks', float('nan')))} s | |",
        f"| fit: CPU per chunk put + CPU per raw GB | {f(1e3 * figures['chunk_cpu_s_per_put'])} ms + "
        f"{f(figures['chunk_cpu_s_per_raw_GB'])} s | cost of a chunk-server process at the job's chunk size |",
        f"| chunk-server CPU per GB read | {f(figures.get('chunk_cpu_s_per_GB_read'))} s | read ceiling per process |",
        f"| MDS CPU per metadata operation | {f(1e3 * figures.get('mds_cpu_s_per_op', float('nan')), 3)} ms | "
        "capacity of one MDS (asyncio loop + store thread: ~one core) |",
        f"| MDS ops/s observed (metadata storm) | {f(figures.get('mds_ops_per_s_observed'), 0)} | "
        "lower bound: limited by the clients sharing the 2 cores |",
        f"| MDS operations per rank per save (1-block files) | {f(figures['mds_ops_per_rank_save'])} | "
        "checks the op count the model assumes |",
        f"| burst save / load aggregate | {f(figures['burst_save_GBps'], 3)} / "
        f"{f(figures.get('burst_load_GBps') or float('nan'), 3)} GB/s | disk- and core-bound here, not used |",
    ]
    if "single_stream_write_GBps" in figures:
        lines.append(f"| one large stream write / read (client_io) | {f(figures['single_stream_write_GBps'], 3)} / "
                     f"{f(figures.get('single_stream_read_GBps', float('nan')), 3)} GB/s | baseline, not used |")
    lines += [
        "",
        "## Assumptions",
        "",
        f"- Job: {job.gpus:,} GPUs ({job.gpus_per_node} per node), {job.parameters / 1e9:,.0f}B parameters "
        f"(Llama-3-405B-like), {job.checkpoint_bytes_per_parameter:g} bytes of checkpoint state per parameter "
        "(bf16 weights 2 + fp32 master weights 4 + Adam moments 4 + 4), fully sharded: every rank writes a "
        f"distinct shard of {f(out['per_gpu_MB'], 0)} MB in one file (DCP), plus one `.metadata`.",
        f"- Targets: a checkpoint durable {job.write_window_s:g} s after the barrier (the async writer hides "
        f"this from training); every rank's state back {job.load_window_s:g} s after a restart.",
        f"- Storage hosts: {storage.processes_per_host} chunk-server processes each (one per NVMe drive, "
        f"{storage.drive_write_GBps:g} GB/s write / {storage.drive_read_GBps:g} GB/s read sustained per drive), "
        f"{storage.nic_GBps:g} GB/s of network; rs({storage.data_chunks},{storage.parity_chunks}) with "
        f"{storage.block_bytes >> 20} MiB blocks; {storage.headroom:g}x headroom (a host down, rebuilds, stragglers).",
        "- A chunk-server process is bound to ~one core by the GIL: its CPU cost per GB sets its ceiling. "
        "That cost is fitted as a cost per chunk put plus a cost per byte, from the burst (many small "
        "chunks) and the single large writer (few large ones) of the same run, then taken at the job's "
        "chunk size. fsync waits are not CPU: the drives' bandwidth is a separate limit.",
        "",
        "## Result per checkpoint",
        "",
        "| quantity | value |",
        "|---|---|",
        f"| checkpoint size | {f(out['checkpoint_TB'])} TB ({f(out['raw_TB_written'])} TB stored with parity) |",
        f"| write bandwidth, client side / into chunk servers | {f(out['write_client_GBps'], 1)} / "
        f"{f(out['write_raw_GBps'], 1)} GB/s ({f(out['storage_front_end_Tbps'], 2)} Tb/s) |",
        f"| read bandwidth at restart | {f(out['read_GBps'], 1)} GB/s |",
        f"| chunk-server CPU per raw GB at {out['chunk_bytes'] / MiB:g} MiB chunks | "
        f"{f(out['chunk_cpu_s_per_raw_GB_at_job_chunks'] or float('nan'))} s |",
        f"| one chunk-server process, CPU-bound | {f(out['chunk_process_write_GBps_cpu_bound'])} GB/s write, "
        f"{f(out['chunk_process_read_GBps_cpu_bound'])} GB/s read |",
        f"| one storage host, write (cpu / drives / nic) | {' / '.join(f(v, 1) for v in out['host_write_GBps'].values())}"
        f" GB/s: **{out['host_write_limit']}-bound** |",
        f"| one storage host, read (cpu / drives / nic) | {' / '.join(f(v, 1) for v in out['host_read_GBps'].values())}"
        f" GB/s: **{out['host_read_limit']}-bound** |",
        f"| **storage hosts** (chunk-server processes) | **{out['storage_hosts']}** ({out['chunk_server_processes']}) |",
        f"| chunk puts per checkpoint | {f(out['chunk_puts_per_checkpoint'])} ({f(out['chunk_puts_per_s'], 0)}/s "
        "over the window) |",
        f"| metadata operations per checkpoint | {f(out['mds_ops_per_checkpoint'])} "
        f"({out['mds_ops_per_rank_save']} per rank: create, {out['mds_ops_per_rank_save'] - 2} allocate, commit) |",
        f"| **metadata ops/s** needed over the window / one MDS's capacity | "
        f"**{f(out['mds_ops_per_s_needed_over_window'], 0)}** / {f(out['mds_capacity_ops_per_s'], 0)} "
        f"-> {out['mds_services_needed_over_window']} MDS |",
        f"| the barrier's {job.gpus:,} simultaneous creates, absorbed by one MDS in | "
        f"{f(out['barrier_create_storm_s'])} s |",
        f"| metadata operations per restart | {f(out['mds_ops_per_restart'])} |",
        f"| **network per GPU node** per checkpoint | **{f(out['node_bytes_per_checkpoint_GB'], 2)} GB** "
        f"({f(100 * out['node_nic_share_over_window'], 2)}% of a {storage.node_nic_GBps:g} GB/s NIC over the window) |",
        "",
        "## Reading it",
        "",
        *_conclusions(job, storage, figures, out),
        "",
    ]
    return "\n".join(lines)


def _conclusions(job: Job, storage: Storage, figures: dict[str, Any], out: dict[str, Any]) -> list[str]:
    lines = []
    share = out["mds_ops_per_s_needed_over_window"] / out["mds_capacity_ops_per_s"]
    if out["mds_services_needed_over_window"] <= 1:
        lines.append(
            f"- Metadata: one MDS covers a checkpoint's operations at {100 * share:.0f}% of its measured capacity "
            "(data never passes through it; allocations are batched); the barrier's creates queue for "
            f"{out['barrier_create_storm_s']:.1f} s. More MDS (over PostgreSQL) only matter for many jobs at once."
        )
    else:
        lines.append(
            f"- Metadata: a checkpoint needs {out['mds_services_needed_over_window']} MDS at the measured cost per "
            "operation: run several stateless MDS over PostgreSQL, or cut operations per rank."
        )
    lines.append(
        f"- Chunk servers: {out['storage_hosts']} storage hosts, bound by **{out['host_write_limit']}** on write and "
        f"**{out['host_read_limit']}** on read."
        + (" A Python chunk server's CPU per GB is the lever: large blocks (writes of 1 MiB and more go to"
           " disk with O_DIRECT, reads of 1 MiB and more leave by sendfile); what is left is receiving and"
           " checking each byte."
           if "cpu" in (out["host_write_limit"], out["host_read_limit"]) else "")
    )
    lines.append(
        f"- Network: each GPU node sends {out['node_bytes_per_checkpoint_GB']:.2f} GB per checkpoint "
        f"({100 * out['node_nic_share_over_window']:.2f}% of its NIC over the window); the storage front end "
        f"({out['storage_front_end_Tbps']:.2f} Tb/s) is what must be provisioned."
    )
    seen = []
    if figures["min_live_chunk_servers"] < figures["source"]["servers"]:
        seen.append(f"the MDS counted as few as {figures['min_live_chunk_servers']} of {figures['source']['servers']} "
                    f"chunk servers live (oldest heartbeat {figures['max_heartbeat_age_s']:.1f} s), failing allocations")
    if figures["listen_overflows"]:
        seen.append(f"{figures['listen_overflows']:,} TCP listen-queue overflows (host-wide) delayed new connections "
                    "by SYN retransmits of 1 s and more")
    if seen:
        lines.append("- Seen in the measured burst, assumed fixed here (they grow with the rank count): "
                     + "; ".join(seen) + ".")
    close_p99 = figures.get("close_p99_s")
    lines.append(
        "- Not modelled: stragglers"
        + (f" (p99 close latency in the measured burst: {close_p99:.1f} s)" if close_p99 else "")
        + ", rebuild traffic after a host loss, GC of old checkpoints, and the MDS's liveness view of "
        "chunk servers under load."
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--burst", default=None,
                        help="results of bench/burst.py (default: bench/results/burst.json if there, else --figures)")
    parser.add_argument("--client-io", default=None, help="results of bench/client_io.py (optional)")
    parser.add_argument("--figures", default=DEFAULT_FIGURES,
                        help="measured figures to model from when there are no burst results (a --json output; "
                             "default: bench/scale_figures.json, what SCALE.md was made from)")
    parser.add_argument("--lease-services", default=None,
                        help="results of lease_services.py for the section on N metadata services (default: the"
                             " 'lease_services' of --figures, what SCALE.md was made from)")
    parser.add_argument("--out", default=os.path.join(HERE, "SCALE.md"))
    parser.add_argument("--json", default=None, help="also write inputs and results as JSON here")
    for group in (Job, Storage):
        for field in fields(group):
            parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    burst_path = args.burst or (DEFAULT_BURST if os.path.exists(DEFAULT_BURST) else None)
    try:
        if burst_path is None:
            figures = _load(args.figures)["measured"]  # type: ignore[index]
            sources = [os.path.relpath(args.figures)]
            print(f"no burst results ({os.path.relpath(DEFAULT_BURST)}): modelling from {sources[0]}")
        else:
            burst = _load(burst_path)
            if burst is None or not burst.get("phases", {}).get("save"):
                print(f"{burst_path}: no burst results with a save phase; run tectofs bench burst first", file=sys.stderr)
                return 1
            client_io = _load(args.client_io) if args.client_io and os.path.exists(args.client_io) else None
            figures = measured_figures(burst, client_io)
            sources = [burst_path] + ([args.client_io] if client_io else [])
    except (OSError, ValueError, KeyError) as exc:
        print(f"scale_model: cannot read the measured figures: {exc}", file=sys.stderr)
        return 1
    job = Job(**{f.name: getattr(args, f.name) for f in fields(Job)})
    storage = Storage(**{f.name: getattr(args, f.name) for f in fields(Storage)})
    out = model(job, storage, figures)
    text = render(job, storage, figures, out, sources)
    services = _load(args.lease_services) if args.lease_services else (_load(args.figures) or {}).get("lease_services")
    if services is not None and "model" in services:
        from tectofs.benchmarks.lease_services import render_model

        text += "\n" + "\n".join(render_model(services))
    with open(args.out, "w") as f:
        f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"job": asdict(job), "storage": asdict(storage), "measured": figures, "model": out}, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
