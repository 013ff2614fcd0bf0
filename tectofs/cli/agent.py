"""``tectofs agent``: the per-host memory agent of the checkpoint memory tier (``tectofs.agent``)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from tectofs import limits
from tectofs.agent.process import start_agent as start_agent  # tectofs up --agent, the tests

from . import numbers


def cmd_agent(args: argparse.Namespace, serve: Callable[..., None]) -> None:
    """Run the agent until SIGINT/SIGTERM; ``serve`` is ``servers._serve_bound`` (given by the
    CLI, as to ``tectofs s3``: ``servers`` starts agents for ``tectofs up --agent``)."""
    from tectofs.agent.service import AgentService

    peers = [p.strip() for p in (args.peers or "").split(",") if p.strip()]
    cluster = args.cluster or os.environ.get("TECTOFS_META", "")
    if not cluster:
        raise SystemExit("tectofs agent: which cluster's users does it serve? --cluster HOST:PORT (or $TECTOFS_META)")

    def start() -> AgentService:
        return AgentService(args.shm_dir, cluster=cluster, memory_bytes_max=args.memory_bytes,
                            keep_steps=args.keep_steps, peers=peers, replicas=args.replicas, wait_s=args.wait,
                            takeover_s=args.takeover)

    def describe(address: str) -> str:
        return (f"tectofs memory agent on {address} for cluster {cluster} ({args.memory_bytes} bytes, last"
                f" {args.keep_steps} steps, peers {','.join(peers) or 'none'})")

    serve(start, args, describe)


def add_parser(sub: Any, serve: Callable[..., None]) -> None:
    p = sub.add_parser(
        "agent", help="run this host's checkpoint memory agent",
        description="Hold recent checkpoint steps in this host's memory (shared memory, outside the trainers, so a"
        " trainer's crash loses none), replicate each to --peers and persist it to the cluster behind the training."
        " Trainers save with CheckpointWriter(tier='memory') and load with CheckpointReader, finding the agent in"
        " $TECTOFS_AGENT (this agent first, then its peers). Callers prove who they are with a ticket of --cluster;"
        " a step is its saver's alone, and is persisted acting as its saver: the agent's credential"
        " ($TECTOFS_CREDENTIALS) must be a proxy's (tectofs user add NAME --proxy; root's is). Runs until"
        " SIGINT/SIGTERM.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=numbers.PORT, default=0, help="port (default: any free one)")
    p.add_argument("--cluster", default=None, metavar="HOST:PORT[,HOST:PORT]",
                   help="the metadata service whose users it serves and where it persists (default $TECTOFS_META)")
    p.add_argument("--peers", default="", metavar="HOST:PORT,...", help="other hosts' agents to replicate steps to")
    p.add_argument("--replicas", type=numbers.count(0, 8), default=None,
                   help="peers that must hold a step before a save counts as saved in memory (default 1 with peers;"
                        " with fewer, the save is persisted first; 0: one copy in memory suffices)")
    p.add_argument("--memory-bytes", type=numbers.size(limits.MiB), default=8 * limits.GiB, metavar="SIZE",
                   help="host memory for held steps (default 8G); a save that needs more waits for persistence")
    p.add_argument("--keep-steps", type=numbers.count(1, 1 << 20), default=2, metavar="K",
                   help="persisted steps kept in memory, the newest (default 2)")
    p.add_argument("--wait", type=numbers.seconds(0.0, 3600.0), default=60.0, metavar="SECONDS",
                   help="how long a save waits for memory before it fails (default 60)")
    p.add_argument("--takeover", type=numbers.seconds(0.0, 3600.0), default=30.0, metavar="SECONDS",
                   help="a replica persists a step its primary has not reported persisted after this long (default 30)")
    p.add_argument("--shm-dir", default="/dev/shm", help="shared-memory directory the steps live in (default /dev/shm)")
    p.add_argument("--ready-file", help="write the listening address here once serving")
    p.set_defaults(fn=lambda args: cmd_agent(args, serve))
