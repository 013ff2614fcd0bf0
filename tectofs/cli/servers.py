"""``tectofs up``, ``meta``, ``chunk`` and ``mount``: the commands that run servers."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable

from tectofs import diagnostics, limits

from . import numbers
from .common import (
    DEFAULT_PORT,
    KEY_HELP,
    UsageError,
    _human,
    _meta_address,
    _write_atomically,
    add_metrics_flags,
    add_tls_flags,
    client_command,
)

_PACK_MAX = numbers.size(0, limits.chunk_pack_max_bytes_max)  # --pack-max: 0 is off
_POSITIVE_SECONDS = numbers.seconds(above_low=True)  # intervals and lifetimes: 0 would spin or expire at once
_SECONDS = numbers.seconds()


def _advertise(text: str) -> str:
    """``--advertise HOST[:PORT]``, checked (no wildcard, a valid port)."""
    from tectofs.errors import InvalidArgument
    from tectofs.server import addresses

    try:
        addresses.split(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _advertise_host(text: str) -> str:
    """``tectofs up --advertise HOST``: a host only (every server keeps its own port)."""
    from tectofs.server import addresses

    if addresses.split(_advertise(text))[1] is not None:
        raise argparse.ArgumentTypeError(f"bad host {text!r}: give the host only; every server keeps its own port")
    return text


def cmd_meta(args: argparse.Namespace) -> None:
    from tectofs.server.meta import MetadataService

    def start() -> MetadataService:
        service = MetadataService(
            args.store, args.policy, args.block_size, server_dead_after_s=args.dead_after, gc_delay_s=args.gc_delay,
            allocation_grace_s=args.allocation_grace, repair_after_s=args.repair_after,
            repair_interval_s=args.repair_interval, orphan_grace_s=args.orphan_grace, key_file=args.key_file,
            capability_ttl_s=args.capability_ttl, advertise=args.advertise, inline_max=args.inline_max,
            lease_s=args.lease,
        )
        service.rpc.policy = _connection_policy(args)
        return service

    _serve_bound(start, args, lambda a: f"tectofs metadata service on {a} (store {_without_password(args.store)})")


def _connection_policy(args: argparse.Namespace) -> Any:
    """The server's ``ConnectionPolicy`` with ``--connections-max``, or None (the environment's)."""
    if args.connections_max is None:
        return None
    import dataclasses

    from tectofs.wire.connlimits import ConnectionPolicy

    return dataclasses.replace(ConnectionPolicy.from_env(), connections_max=args.connections_max)


def _add_connections_max(p: argparse.ArgumentParser, users_share: bool) -> None:
    shared = (f"; users share them by principal, {limits.connections_reserved:,} (at most a quarter) kept for root and"
              " the cluster's servers" if users_share else "; peer addresses share them")
    p.add_argument("--connections-max", type=numbers.count(1), metavar="N",
                   help=f"connections served at once (default {limits.connections_max}, or $TECTOFS_CONNECTIONS_MAX;"
                   f" lowered to what the open files limit leaves){shared}")


def _without_password(store: str) -> str:
    """A store URL fit to print: ``postgresql://user:secret@host/db`` -> ``postgresql://user:***@host/db``."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(store)
    if not parts.password:
        return store
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def cmd_chunk(args: argparse.Namespace) -> None:
    from tectofs.server.chunk import ChunkServer

    def start() -> ChunkServer:
        server = ChunkServer(
            args.data, args.meta, args.inflight_max, args.heartbeat, sync="none" if args.no_sync else args.sync,
            scrub_rate_bytes_per_s=args.scrub_rate * limits.MiB, repair_concurrency=args.repair_concurrency,
            repair_rate_bytes_per_s=args.repair_rate * limits.MiB, inventory_interval_s=args.inventory_interval,
            scrub_interval_s=args.scrub_interval, key_file=args.key_file, advertise=args.advertise,
            pack_max_bytes=args.pack_max,
        )
        server.rpc.policy = _connection_policy(args)
        return server

    _serve_bound(start, args, lambda a: f"tectofs chunk server on {a} (data {args.data}, metadata {args.meta})")


def _serve_bound(start: Callable[[], Any], args: argparse.Namespace, describe: Callable[[str], str]) -> None:
    """Run the server ``start()`` makes on ``--host``/``--port`` until SIGINT or SIGTERM. Its
    metrics (``--metrics``) are served first, so a server with a ``metrics_address`` attribute
    (the metadata service, a chunk server) knows their URL before it registers or answers."""
    import asyncio  # not at the top: every ``tectofs --help`` would pay for it

    async def main() -> None:
        server = start()
        metrics_address = None
        if getattr(args, "metrics", None):
            from tectofs import metrics

            metrics_address = metrics.serve(server.metrics.registry, *args.metrics)
            if hasattr(server, "metrics_address"):
                server.metrics_address = metrics_address
        address = await server.start(args.host, args.port)
        _collect_garbage_rarely()
        bound = getattr(getattr(server, "rpc", None), "address", address)
        print(describe(bound) + (f", advertised as {address}" if address != bound else ""), flush=True)
        if metrics_address:
            print(f"metrics: {getattr(server, 'metrics_url', None) or metrics.url(metrics_address)}", flush=True)
            if args.metrics_ready_file:
                _write_atomically(args.metrics_ready_file, metrics_address)
        if args.ready_file:
            _write_atomically(args.ready_file, address)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        diagnostics.dump_tasks_on_sigusr1(loop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.close()

    asyncio.run(main())


def _collect_garbage_rarely() -> None:
    """A server's long-lived objects are made at start, and each request allocates many small
    ones that die young: move everything made so far out of the cyclic collector's sight
    (``gc.freeze``) and run its youngest generation every ``limits.server_gc_gen0_allocations``
    allocations rather than every 700. perf put 9% of the metadata service's CPU in a create
    storm in the collector; cycles are still collected, less often."""
    import gc

    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(limits.server_gc_gen0_allocations, older, oldest)


def cmd_up(args: argparse.Namespace) -> None:
    import tempfile

    from tectofs.errors import TectofsError
    from tectofs.policy import parse as parse_policy
    from tectofs.server.cluster import LocalCluster

    try:
        policy = parse_policy(args.policy)
    except TectofsError as exc:
        raise UsageError(str(exc)) from None
    if args.servers < policy.write_min:
        raise UsageError(f"{args.servers} chunk servers cannot take a write under {policy} (a block needs at"
                         f" least {policy.write_min} of its {policy.width} chunks stored): use --servers"
                         f" {policy.width} or more, or a policy such as --policy rep({max(1, args.servers)})")
    temporary = args.check and args.root is None  # a smoke test never touches a real cluster's state
    if temporary:
        args.root = tempfile.mkdtemp(prefix="tectofs-check-")
    cluster = LocalCluster(args.root or os.path.join(os.getcwd(), "tectofs-data"), args.servers, args.port,
                           args.policy, args.block_size, args.host,
                           meta_args=["--repair-after", str(args.repair_after)],
                           chunk_args=["--scrub-rate", str(args.scrub_rate), "--pack-max", str(args.pack_max)],
                           tls=args.tls, s3_port=args.s3, metrics=not args.no_metrics, advertise=args.advertise)
    print(f"starting a local cluster under {cluster.root}: 1 metadata service + {args.servers} chunk servers ...",
          flush=True)
    stop = {"now": False}

    def request_stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    mount = agent = None
    try:
        address = cluster.start()
        print(f"cluster is up: export TECTOFS_META={address}" + (
            f" TECTOFS_TLS_CA={cluster.tls_files['ca']}" if cluster.tls_files else ""), flush=True)
        print(f"  cluster key {cluster.key_file}; root's credential {cluster.credential_file}, also where this user's"
              " client commands find it (other users and hosts: tectofs user add, --credentials FILE)", flush=True)
        print(f"  try: tectofs put FILE /  |  tectofs ls /  |  tectofs status   (logs in {cluster.root}/logs)", flush=True)
        for name, url in cluster.metrics_urls.items():
            print(f"  metrics of {name}: {url}", flush=True)
        if cluster.s3_address:
            print(f"S3 gateway: http://{cluster.s3_address}  (root's keys: {cluster.s3_env_file}; try:"
                  f" set -a; . {cluster.s3_env_file}; aws --endpoint-url http://{cluster.s3_address} s3 ls); other users:"
                  " tectofs s3 keys", flush=True)
        if args.agent:
            from .agent import start_agent

            agent, agent_address = start_agent(cluster.root, "--cluster", cluster.address, "--memory-bytes",
                                               str(args.agent_memory))
            print(f"checkpoint memory agent: export TECTOFS_AGENT={agent_address}  (CheckpointWriter(tier='memory'))",
                  flush=True)
        if args.mount:
            from tectofs.client.fuse import start_mount_process

            mount = start_mount_process(address, args.mount)
            print(f"mounted at {args.mount}", flush=True)
        if args.check:
            _self_check(address)
            return
        print("press Ctrl-C to stop", flush=True)
        while not stop["now"]:
            time.sleep(0.5)
            for event in cluster.supervise():  # children that died are reported and restarted
                print(f"tectofs up: {event}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if mount is not None:
            mount.stop()
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=30)
        cluster.stop()
        if temporary:
            shutil.rmtree(args.root, ignore_errors=True)
        print("cluster stopped", flush=True)


def _self_check(address: str) -> None:
    """Write a file, read it back and compare: the quick proof that a fresh install works."""
    import hashlib

    from tectofs.client import connect

    data = os.urandom(3 * limits.MiB + 12345)
    with connect(address) as fs:
        fs.mkdir("/selfcheck", exist_ok=True)
        fs.write_bytes("/selfcheck/data.bin", data)
        back = fs.read_bytes("/selfcheck/data.bin")
        servers = fs.servers()
    ok = hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    print(f"self-check: wrote and read {_human(len(data))} through {len(servers)} chunk servers: "
          + ("OK" if ok else "MISMATCH"), flush=True)
    if not ok:
        raise SystemExit(1)


def cmd_mount(args: argparse.Namespace) -> None:
    from tectofs.client.fuse.mount import mount

    address = _meta_address(args)
    if args.metrics:  # the mount's client metrics (tectofs_client_*)
        from tectofs import metrics

        if args.daemon:  # no thread before the fork: the daemon's first connection serves them
            if not args.metrics[1]:
                raise SystemExit("tectofs mount: --daemon needs a fixed --metrics port (the daemon cannot tell you"
                                 " which free one it took)")
            metrics.serve_client_on_connect(*args.metrics)
            print(f"metrics: {metrics.url('%s:%d' % args.metrics)} (once mounted)", flush=True)
        else:
            print(f"metrics: {metrics.url(metrics.serve_client(*args.metrics))}", flush=True)
    log_path = mount(address, args.mountpoint, foreground=not args.daemon, threads=not args.single_thread,
          attr_timeout_s=args.attr_timeout, debug=args.debug, credentials=args.credentials,
          multi_user=args.multi_user, default_permissions=args.default_permissions,
          negative_cache_s=args.negative_entry_cache, leases=args.leases, xattrs=args.xattrs,
          async_creates=args.async_creates, kernel_opens_directories=args.kernel_opens_directories)
    if log_path is not None:
        print(f"tectofs mount: {args.mountpoint} mounted in the background; log: {log_path}", file=sys.stderr)


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("up", help="run a local cluster (1 metadata service + N chunk servers) in the foreground",
                       description="Run a whole cluster on this machine until Ctrl-C. All state lives under --root; "
                       "running it again with the same root brings the same files back.")
    p.add_argument("--root", default=None,
                   help="state directory (default ./tectofs-data; with --check a new temporary one)")
    p.add_argument("--port", type=numbers.PORT, default=DEFAULT_PORT, help=f"metadata service port (default {DEFAULT_PORT}; 0 = any)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 needs"
                   " --advertise)")
    p.add_argument("--advertise", metavar="HOST", type=_advertise_host,
                   help="the host others reach every server at (each keeps its own port)")
    p.add_argument("--servers", type=numbers.count(1, limits.servers_max), default=6, help="chunk servers to start (default 6)")
    p.add_argument("--policy", default="rs(4,2)", help="durability policy of / (default rs(4,2); or rep(n))")
    p.add_argument("--block-size", type=numbers.BLOCK_SIZE, default=limits.block_size_default_bytes, help="block size (default 64M)")
    p.add_argument("--mount", metavar="MOUNTPOINT", help="also mount the cluster there with FUSE")
    p.add_argument("--check", action="store_true", help="start, write and verify a file, then stop (a smoke test)")
    p.add_argument("--agent", action="store_true", help="also run this host's checkpoint memory agent (tectofs agent)")
    p.add_argument("--agent-memory", type=numbers.size(limits.MiB), default=8 * limits.GiB, metavar="SIZE",
                   help="the agent's --memory-bytes (default 8G)")
    p.add_argument("--repair-after", type=_SECONDS, default=limits.repair_after_s, metavar="SECONDS",
                   help=f"rebuild the chunks of a server dead this long (default {limits.repair_after_s:.0f})")
    p.add_argument("--pack-max", type=_PACK_MAX, default=limits.chunk_pack_max_bytes_default, metavar="SIZE",
                   help="chunk servers pack chunks up to SIZE into shared segment files (tectofs chunk --pack-max;"
                   f" 0: a file per chunk; default {limits.chunk_pack_max_bytes_default // limits.MiB}M)")
    p.add_argument("--scrub-rate", type=numbers.rate(), default=limits.scrub_rate_bytes_per_s / limits.MiB, metavar="MIB_S",
                   help="background checksum verification per chunk server, MiB/s (0: off; default %(default)s)")
    p.add_argument("--s3", type=numbers.PORT, metavar="PORT",
                   help="also serve S3 on this port (0: any); root's keys go to ROOT/credentials/s3.env")
    p.add_argument("--tls", action="store_true",
                   help="TLS on every connection, with a CA and certificate made under --root (clients then need"
                   " TECTOFS_TLS_CA=ROOT/tls/ca.pem)")
    p.add_argument("--no-metrics", action="store_true",
                   help="no Prometheus endpoints (default: one per server, on a free port, URLs printed)")
    p.set_defaults(fn=cmd_up)

    p = sub.add_parser("meta", help="run the metadata service",
                       description="Run the metadata service: the namespace, the layouts (which chunk servers hold"
                       " which chunks), users, leases and the rebuild schedule. Data never passes through it. Its"
                       " state is one SQLite file (one host) or a PostgreSQL database (several services over one"
                       " store, for failover). Runs until SIGINT/SIGTERM.")
    p.add_argument("--store", default="meta.db", help="SQLite file or postgresql:// URL (default meta.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: every one)")
    p.add_argument("--port", type=numbers.PORT, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT}; 0: any)")
    p.add_argument("--advertise", metavar="HOST[:PORT]", type=_advertise,
                   help="the address other hosts reach this service at (PORT: the bound one by default), reported by"
                   " 'tectofs status' with the metrics URL; needed with --metrics on a wildcard and --host 0.0.0.0")
    p.add_argument("--policy", default="rs(4,2)", help="policy of / on a new store")
    p.add_argument("--block-size", type=numbers.BLOCK_SIZE, default=limits.block_size_default_bytes,
                   help="block size of / on a new store (default 64M; directories can set their own)")
    p.add_argument("--inline-max", type=numbers.INLINE_SIZE, default=limits.inline_bytes_default, metavar="SIZE",
                   help="files up to this size are kept in the metadata store with their inode, not in chunks:"
                   " a small file is written and read in one metadata call (default 64K; at most"
                   f" {limits.inline_bytes_max // limits.KiB}K; 0: every file in chunks)")
    p.add_argument("--lease", type=numbers.seconds(0.5, 3600.0), default=limits.lease_s, metavar="SECONDS",
                   help="life of a client's metadata leases after its last keepalive: while it holds them, a mount"
                   " answers names and attributes from its cache; a change waits at most this long for a client"
                   f" that stopped answering (default {limits.lease_s:g})")
    p.add_argument("--dead-after", type=_POSITIVE_SECONDS, default=limits.server_dead_after_s,
                   help="seconds without heartbeat before a chunk server counts as dead")
    p.add_argument("--gc-delay", type=_SECONDS, default=30.0, help="seconds before deleted chunks are removed")
    p.add_argument("--allocation-grace", type=_POSITIVE_SECONDS, default=limits.allocation_grace_s,
                   help="seconds before blocks allocated but never committed (a crashed writer) are collected")
    p.add_argument("--repair-after", type=_SECONDS, default=limits.repair_after_s, metavar="SECONDS",
                   help="rebuild elsewhere the chunks of a chunk server dead this long (default %(default)s, like"
                   " Ceph's down-out interval: a reboot does not trigger a rebuild)")
    p.add_argument("--repair-interval", type=_POSITIVE_SECONDS, default=limits.repair_interval_s, metavar="SECONDS",
                   help="how often to look for chunks to rebuild (default %(default)s)")
    p.add_argument("--orphan-grace", type=_SECONDS, default=limits.orphan_grace_s, metavar="SECONDS",
                   help="collect chunks no file refers to this long after an inventory found them (default %(default)s)")
    p.add_argument("--ready-file", help="write the listening address here once serving")
    p.add_argument("--key-file", help=KEY_HELP)
    add_tls_flags(p, serves=True)
    p.add_argument("--capability-ttl", type=_POSITIVE_SECONDS, default=limits.capability_ttl_s, metavar="SECONDS",
                   help="how long the chunk capabilities in layouts and allocations are valid (default %(default)s)")
    _add_connections_max(p, users_share=True)
    add_metrics_flags(p)
    p.set_defaults(fn=cmd_meta)

    p = sub.add_parser("chunk", help="run a chunk server",
                       description="Run a chunk server: it stores chunks (erasure-coded or replicated pieces of"
                       " blocks) with their checksums under --data, registers with the metadata service,"
                       " scrubs in the background and rebuilds chunks the service orders. One per disk. Runs"
                       " until SIGINT/SIGTERM.")
    p.add_argument("--data", required=True, help="directory for chunk files (local flash)")
    p.add_argument("--meta", required=not os.environ.get("TECTOFS_META"), default=os.environ.get("TECTOFS_META"),
                   help="metadata service HOST:PORT, or several over one store (HOST:PORT,HOST:PORT: failover)"
                   " (default: $TECTOFS_META)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 needs"
                   " --advertise)")
    p.add_argument("--port", type=numbers.PORT, default=0, help="port (default: any free one)")
    p.add_argument("--advertise", metavar="HOST[:PORT]", type=_advertise,
                   help="the address registered with the metadata service, which clients and other chunk servers"
                   " connect to (PORT: the bound one by default; default: --host:--port, refused for a wildcard)")
    p.add_argument("--inflight-max", type=numbers.size(), default=limits.chunk_inflight_bytes_max,
                   help="bytes being received at once before answering BUSY (default 512M)")
    p.add_argument("--heartbeat", type=_POSITIVE_SECONDS, default=limits.heartbeat_interval_s, help="heartbeat interval, seconds")
    p.add_argument("--sync", choices=["each", "group"], default="each",
                   help="durability before acknowledging a chunk: fdatasync + directory fsync per chunk "
                   "(each, default) or one syncfs shared by concurrent writes (group: for a dedicated data device)")
    p.add_argument("--no-sync", action="store_true", help="acknowledge before data is durable (network benchmarks only)")
    p.add_argument("--pack-max", type=_PACK_MAX, default=limits.chunk_pack_max_bytes_default, metavar="SIZE",
                   help="pack chunks up to SIZE (e.g. 1M) into shared segment files, made durable by one fdatasync"
                   " per batch of writes instead of a file, a sync and a directory fsync each: for bursts of small"
                   f" shards (0: a file per chunk; default {limits.chunk_pack_max_bytes_default // limits.MiB}M,"
                   f" at most {limits.chunk_pack_max_bytes_max // limits.MiB}M)")
    p.add_argument("--scrub-rate", type=numbers.rate(), default=limits.scrub_rate_bytes_per_s / limits.MiB, metavar="MIB_S",
                   help="re-verify every chunk's checksums in the background at this rate (0: off; default %(default)s)")
    p.add_argument("--scrub-interval", type=_POSITIVE_SECONDS, default=limits.scrub_pass_interval_s, metavar="SECONDS",
                   help="start a scrub pass at most this often (default %(default)s; a pass over a large disk"
                   " takes longer at the rate)")
    p.add_argument("--repair-rate", type=numbers.rate(), default=limits.repair_rate_bytes_per_s / limits.MiB, metavar="MIB_S",
                   help="bytes pulled from peers to rebuild chunks, per second (0: unlimited; default %(default)s)")
    p.add_argument("--repair-concurrency", type=numbers.count(1, limits.repair_concurrency_per_server_max),
                   default=limits.repair_concurrency_per_server, metavar="N",
                   help="chunks rebuilt at once (default %(default)s)")
    p.add_argument("--inventory-interval", type=_POSITIVE_SECONDS, default=limits.inventory_interval_s, metavar="SECONDS",
                   help="full report of the chunks on disk to the metadata service, after the one at start"
                   " (default %(default)s)")
    p.add_argument("--ready-file", help="write the listening address here once serving")
    p.add_argument("--key-file", help=KEY_HELP)
    add_tls_flags(p, serves=True)
    _add_connections_max(p, users_share=False)
    add_metrics_flags(p)
    p.set_defaults(fn=cmd_chunk)

    p = client_command(sub, "mount", cmd_mount, "mount tectofs with FUSE (unmount with fusermount3 -u or Ctrl-C)")
    p.add_argument("mountpoint", help="an existing empty directory")
    p.add_argument("--daemon", action="store_true",
                   help="detach into the background; it logs to --log-file, else ~/.local/state/tectofs/")
    p.add_argument("--single-thread", action="store_true", help="serve one kernel request at a time")
    p.add_argument("--attr-timeout", type=_SECONDS, default=1.0,
                   help="with --no-leases: how long the kernel keeps names and attributes (default 1 s)")
    p.add_argument("--no-leases", dest="leases", action="store_false",
                   help="hold no metadata leases: the kernel keeps names and attributes --attr-timeout seconds and"
                   " absent names not at all (with leases, the default, it keeps them as long as the lease lasts and"
                   " another client's change drops them before it returns)")
    p.add_argument("--negative-entry-cache", type=_SECONDS, default=0.0, metavar="SECONDS",
                   help="in directories made through this mount, answer lookups of absent names without asking the"
                   " metadata service for this long after the mount's last change there: creates take one call"
                   " instead of two, but another client's new file there may read as absent that long (default 0:"
                   " off; at most --attr-timeout is sensible)")
    p.add_argument("--no-async-creates", dest="async_creates", action="store_false",
                   help="with leases: every create, unlink and close of a written file waits for the metadata service"
                   " (by default a burst of creates in one directory claims it, and the next ones there, with the"
                   " bytes of small files written whole, are sent in batches: other clients still see each at their"
                   " next call, and one is durable once this mount's next call, an fsync for one, reached the"
                   " service, or 50 ms later, as on a local disk)")
    p.add_argument("--mount-opens-directories", dest="kernel_opens_directories", action="store_false",
                   help="every opendir(3) asks the mount (OPENDIR, then RELEASEDIR); by default, with leases, the"
                   " kernel opens directories by itself and keeps each listing it read until a change or a recall"
                   " drops it (not in a multi-user mount run with another credential than root's)")
    p.add_argument("--no-xattrs", dest="xattrs", action="store_false",
                   help="no extended attributes through this mount (getfattr/setfattr: 'Operation not supported'):"
                   " the kernel then stops asking for them, which ls -l does for every file and a write before"
                   " every write(2); faster listings and writes where nobody needs them (JuiceFS's default)")
    p.add_argument("--debug", action="store_true", help="libfuse's debug output: every kernel request (very verbose)")
    add_metrics_flags(p)
    sharing = p.add_mutually_exclusive_group()
    sharing.add_argument("--allow-other", dest="multi_user", action="store_true", default=None,
                         help="every local user may use the mount, as themselves (the default when run by root"
                         " with a proxy credential; a non-root mount needs user_allow_other in /etc/fuse.conf)")
    sharing.add_argument("--single-user", dest="multi_user", action="store_false",
                         help="only the user running the mount may use it, as the credential's user")
    p.add_argument("--no-default-permissions", dest="default_permissions", action="store_false",
                   help="multi-user: leave permission checks to the metadata service alone (no kernel check first)")
    p.set_defaults(fn=cmd_mount)
