"""The ``tectofs`` command: servers (``up``, ``meta``, ``chunk``, ``mount``) and client commands.

Client commands find the metadata service through ``--meta HOST:PORT[,HOST:PORT...]`` (a failover group) or ``$TECTOFS_META``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import sys
import time
from typing import Any, Callable

from . import diagnostics, limits, messages, paths
from .errors import TectofsError

DEFAULT_PORT = 7420


def _size(text: str) -> int:
    """``"64M"`` / ``"1GiB"`` / ``"4096"`` -> bytes."""
    units = {"": 1, "K": limits.KiB, "M": limits.MiB, "G": limits.GiB}
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1] if value and value[-1] in "KMG" else ""
    number = value[: len(value) - len(unit)]
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4096, 64M, 1G") from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


# ---------------------------------------------------------------------- server commands


def cmd_meta(args: argparse.Namespace) -> None:
    from .server.meta import MetadataService

    def start() -> MetadataService:
        return MetadataService(
            args.store, args.policy, args.block_size, server_dead_after_s=args.dead_after, gc_delay_s=args.gc_delay,
            allocation_grace_s=args.allocation_grace, repair_after_s=args.repair_after,
            repair_interval_s=args.repair_interval, orphan_grace_s=args.orphan_grace, key_file=args.key_file,
            capability_ttl_s=args.capability_ttl,
        )

    _serve_bound(start, args, lambda a: f"tectofs metadata service on {a} (store {args.store})")


def cmd_chunk(args: argparse.Namespace) -> None:
    from .server.chunk import ChunkServer

    def start() -> ChunkServer:
        return ChunkServer(
            args.data, args.meta, args.inflight_max, args.heartbeat, sync="none" if args.no_sync else args.sync,
            scrub_rate_bytes_per_s=args.scrub_rate * limits.MiB, repair_concurrency=args.repair_concurrency,
            repair_rate_bytes_per_s=args.repair_rate * limits.MiB, inventory_interval_s=args.inventory_interval,
            scrub_interval_s=args.scrub_interval, key_file=args.key_file,
        )

    _serve_bound(start, args, lambda a: f"tectofs chunk server on {a} (data {args.data}, metadata {args.meta})")


def _serve_bound(start: Callable[[], Any], args: argparse.Namespace, describe: Callable[[str], str]) -> None:
    async def main() -> None:
        server = start()
        address = await server.start(args.host, args.port)
        print(describe(address), flush=True)
        if getattr(args, "metrics", None):
            from . import metrics

            metrics_address = metrics.serve(server.metrics.registry, *args.metrics)
            print(f"metrics: {metrics.url(metrics_address)}", flush=True)
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


def _metrics_listen(text: str) -> tuple[str, int]:
    from .metrics import parse_listen  # prometheus_client only for servers that export

    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _write_atomically(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def cmd_up(args: argparse.Namespace) -> None:
    import tempfile

    from .server.cluster import LocalCluster

    temporary = args.check and args.root is None  # a smoke test never touches a real cluster's state
    if temporary:
        args.root = tempfile.mkdtemp(prefix="tectofs-check-")
    cluster = LocalCluster(args.root or os.path.join(os.getcwd(), "tectofs-data"), args.servers, args.port,
                           args.policy, args.block_size, args.host,
                           meta_args=["--repair-after", str(args.repair_after)],
                           chunk_args=["--scrub-rate", str(args.scrub_rate)], tls=args.tls, s3_port=args.s3,
                           metrics=not args.no_metrics)
    print(f"starting a local cluster under {cluster.root}: 1 metadata service + {args.servers} chunk servers ...",
          flush=True)
    stop = {"now": False}

    def request_stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    mount = None
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
        if args.mount:
            from .client.fuse import start_mount_process

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
        cluster.stop()
        if temporary:
            shutil.rmtree(args.root, ignore_errors=True)
        print("cluster stopped", flush=True)


def _self_check(address: str) -> None:
    """Write a file, read it back and compare: the quick proof that a fresh install works."""
    import hashlib

    from .client import connect

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


# ---------------------------------------------------------------------- client commands


def _meta_address(args: argparse.Namespace) -> str:
    address = args.meta or os.environ.get("TECTOFS_META")
    if not address:
        raise SystemExit("tectofs: no metadata service given: use --meta HOST:PORT[,HOST:PORT...] or set TECTOFS_META")
    return str(address)


def _client(args: argparse.Namespace) -> Any:
    from .client import connect

    return connect(_meta_address(args), getattr(args, "credentials", None))


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not enabled,
                file=sys.stderr, leave=False)


def _copy(src: Any, dst: Any, total: int, desc: str, show: bool) -> int:
    buffer = bytearray(8 * limits.MiB)
    view = memoryview(buffer)
    done = 0
    with _progress(total, desc, show) as bar:
        while True:
            n = src.readinto(view)
            if not n:
                break
            dst.write(view[:n])
            done += n
            bar.update(n)
    return done


def cmd_put(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        target = args.dst
        try:
            if fs.stat(target).is_dir:
                target = target.rstrip("/") + "/" + os.path.basename(args.src)
        except FileNotFoundError:
            if target.endswith("/"):
                raise SystemExit(f"tectofs put: {target} is not a directory (no such directory)") from None
        started = time.monotonic()
        with open(args.src, "rb") as src, fs.open(target, "wb") as dst:
            n = _copy(src, dst, os.fstat(src.fileno()).st_size, os.path.basename(args.src), not args.quiet)
        elapsed = time.monotonic() - started
        print(f"{args.src} -> {target}: {_human(n)} in {elapsed:.2f}s ({_human(n / max(elapsed, 1e-9))}/s)")


def cmd_get(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        target = os.path.join(args.dst, os.path.basename(args.src)) if os.path.isdir(args.dst) else args.dst
        started = time.monotonic()
        with fs.open(args.src, "rb") as src, open(target, "wb") as dst:
            n = _copy(src, dst, fs.stat(args.src).size, os.path.basename(args.src), not args.quiet)
        elapsed = time.monotonic() - started
        print(f"{args.src} -> {target}: {_human(n)} in {elapsed:.2f}s ({_human(n / max(elapsed, 1e-9))}/s)")


def cmd_ls(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        st = fs.stat(args.path)
        entries = fs.iter_scandir(args.path) if st.is_dir else iter([(os.path.basename(args.path), st)])
        for name, e in entries:
            kind = {"dir": "d", "file": "-", "symlink": "l", "fifo": "p", "socket": "s", "char": "c", "block": "b"}[e.kind]
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.mtime))
            suffix = "/" if e.is_dir else (f" -> {e.target}" if e.kind == "symlink" else "")
            print(f"{kind}{oct(e.mode & 0o777)[2:]:>4} {e.size:>14} {when} {e.policy:>8}  {name}{suffix}")


def cmd_stat(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        st = fs.stat(args.path)
        for key, value in st.__dict__.items():
            print(f"{key:>10}: {value}")
        if st.is_file:
            print(f"{'blocks':>10}: {fs.run(fs.aio.block_count(args.path))}")


def cmd_mkdir(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        fs.mkdir(args.path, policy=args.policy, block_size=args.block_size, parents=args.parents, exist_ok=args.parents)


def cmd_set_policy(args: argparse.Namespace) -> None:
    if args.policy is None and args.block_size is None and args.write_min is None:
        raise SystemExit("tectofs set-policy: give --policy, --block-size, --write-min or several")
    with _client(args) as fs:
        st = fs.set_policy(args.path, policy=args.policy, block_size=args.block_size, write_min=args.write_min)
        minimum = f"write minimum {st.write_min}" if st.write_min else "the policy's write minimum"
        print(f"{args.path}: new files below it get {st.policy}, {_human(st.block_size)} blocks, {minimum}"
              " (existing files keep theirs)")


def cmd_mv(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        fs.rename(args.src, args.dst)


def cmd_rm(args: argparse.Namespace) -> None:
    for path in args.paths:  # before anything is deleted, like GNU rm's --preserve-root
        if args.recursive and not paths.split(path):
            raise SystemExit(f"tectofs rm: refusing to remove {path!r} (the root directory); remove what is in it by name")
    with _client(args) as fs:
        for path in args.paths:
            st = fs.stat(path)
            if st.is_dir:
                if not args.recursive:
                    raise SystemExit(f"tectofs: {path} is a directory (use -r)")
                fs.rmtree(path)
            else:
                fs.remove(path)


def cmd_status(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        servers = fs.servers()
        statfs = fs.statfs()
        stats = messages.to_plain(fs.run(fs.aio.meta("stats"))[0])
    now = time.time()
    live = sum(1 for s in servers if s["live"])
    print(f"metadata service {fs.meta_address}: {statfs['files']} inodes, "
          f"{stats['store']['operations']} operations in {stats['store']['commits']} commits")
    c = stats["counts"]
    print(f"blocks: {c.get('healthy', 0)} healthy, {c.get('under_redundant', 0)} under-redundant,"
          f" {c.get('unreadable', 0)} unreadable; rebuilds: {c.get('repairs_queued', 0)} queued,"
          f" {c.get('repairs_running', 0)} running, {c.get('repairs_done', 0)} done since start")
    if any(s.get("state") == "draining" for s in servers):
        print(f"draining: {c.get('draining_chunks', 0)} chunks still to move off draining servers")
    print(f"chunk servers: {live} live of {len(servers)}; capacity {_human(statfs['capacity'])}, used {_human(statfs['used'])}")
    print(f"{'id':>3} {'address':<22} {'state':<9} {'used':>10} {'capacity':>10} {'chunks':>8} {'heartbeat':>9}"
          f"  scrub (pass: checked/chunks, corrupt found)  rebuilt")
    for s in servers:
        state = ("live" if s["live"] else "DEAD") + (" drain" if s.get("state") == "draining" else "")
        p = s.get("stats", {})
        scrub = (f"{p.get('scrub_passes', 0) + 1}: {p.get('scrub_pass_checked', 0)}/{p.get('scrub_pass_chunks', 0)},"
                 f" {p.get('scrub_corrupt', 0)}") if p else "-"
        print(f"{s['server_id']:>3} {s['address']:<22} {state:<9} {_human(s['used']):>10} "
              f"{_human(s['capacity']):>10} {s['chunks']:>8} {now - s['last_heartbeat']:>8.1f}s  {scrub:<43}"
              f"  {p.get('repairs_done', 0)}")


def cmd_fsck(args: argparse.Namespace) -> None:
    import json

    from .fsck import check

    with _client(args) as fs:
        report = fs.run(check(fs.aio, args.path))
    if args.json:
        print(json.dumps(report.as_dict(), indent=1))
    else:
        for f in report.damaged:
            print(f"{f['path']}: {f['unreadable']} unreadable, {f['under_redundant']} under-redundant"
                  f" of {f['blocks']} blocks")
        print(f"{report.files} files, {report.blocks} blocks: {report.healthy} healthy,"
              f" {report.under_redundant} under-redundant, {report.unreadable} unreadable"
              + ("" if report.exit_code else " - clean"))
    raise SystemExit(report.exit_code)


def cmd_drain(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        reply, _ = fs.run(fs.aio.meta("drain", server=args.server, cancel=args.cancel))
        if args.cancel:
            print(f"chunk server {reply.server_id} takes new chunks again ({reply.chunks} chunks on it)")
            return
        print(f"draining chunk server {reply.server_id}: {reply.chunks} chunks to move"
              + ("" if args.wait else "; 'tectofs status' shows progress, or use --wait"), flush=True)
        deadline = time.monotonic() + args.timeout
        while args.wait and reply.chunks:
            if time.monotonic() > deadline:
                raise SystemExit(f"tectofs admin drain: {reply.chunks} chunks still on server {reply.server_id}"
                                 f" after {args.timeout:.0f}s")
            time.sleep(1.0)
            reply, _ = fs.run(fs.aio.meta("drain", server=str(reply.server_id)))
            print(f"  {reply.chunks} chunks left", file=sys.stderr, flush=True)
        if args.wait:
            print(f"chunk server {reply.server_id} holds no chunk the cluster needs: it can be stopped")


def cmd_gc(args: argparse.Namespace) -> None:
    from .torch import gc_pending

    address = _meta_address(args)
    if args.credentials:
        os.environ["TECTOFS_CREDENTIALS"] = args.credentials  # the torch helpers connect by URI
    removed = gc_pending(f"tectofs://{address}{args.path}", args.older_than, recursive=True, dry_run=args.dry_run)
    for uri in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {uri}")
    print(f"{len(removed)} leftovers of interrupted checkpoint saves {'found' if args.dry_run else 'removed'}")


def cmd_init(args: argparse.Namespace) -> None:
    from . import auth

    os.makedirs(args.root, exist_ok=True)
    key_file = os.path.join(args.root, "cluster.key")
    existed = os.path.exists(key_file)
    auth.create_key_file(key_file)
    cred_file = os.path.join(args.root, "root.credentials")
    auth.Credential.root_from_keys(auth.KeyRing(key_file), args.meta or "").save(cred_file)
    print(f"cluster key: {key_file} ({'kept' if existed else 'new'}; mode 0600). Copy it to every metadata service"
          " and chunk server host (--key-file or $TECTOFS_KEY_FILE); never to clients.")
    print(f"root credential: {cred_file} (mode 0600). Clients acting as root: --credentials {cred_file};"
          " add users with 'tectofs user add'.")


def cmd_user_add(args: argparse.Namespace) -> None:
    from . import auth

    address = _meta_address(args)
    groups = [int(g) for g in args.groups.split(",") if g.strip()] if args.groups else []
    with _client(args) as fs:
        reply, _ = fs.run(fs.aio.meta("user_add", name=args.name, uid=args.uid, gid=args.gid, groups=groups,
                                      admin=args.admin, proxy=args.proxy))
    out = args.out or f"{args.name}.credentials"
    auth.Credential(user=args.name, secret=reply.secret, cluster=address, s3_access_key=reply.user.s3_access_key or "",
                    s3_secret_key=reply.s3_secret_key).save(out)
    print(f"user {args.name} (uid {args.uid}, gid {args.gid}{', groups ' + ','.join(map(str, groups)) if groups else ''})"
          f" added; credential written to {out} (mode 0600): give it to the user, who passes --credentials FILE,"
          f" sets TECTOFS_CREDENTIALS, or copies it to {auth.default_credential_path(address)} in their home")
    print(f"S3 access key: {reply.user.s3_access_key} (its secret is in the credential file)")


def cmd_user_list(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        reply, _ = fs.run(fs.aio.meta("user_list"))
    print(f"{'name':<24} {'uid':>8} {'gid':>8}  groups  flags")
    for u in reply.users:
        flags = ",".join(f for f, on in (("admin", u.admin), ("proxy", u.proxy)) if on) or "-"
        print(f"{u.name:<24} {u.uid:>8} {u.gid:>8}  {','.join(map(str, u.groups)) or '-'}  {flags}")
    if reply.more:
        print("(more users than one reply holds)")


def cmd_user_remove(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        fs.run(fs.aio.meta("user_remove", name=args.name))
    print(f"user {args.name} removed: its credential no longer opens connections (open ones live on until closed)")


def cmd_whoami(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        me, _ = fs.run(fs.aio.meta("whoami"))
    print(f"{me.name} (uid {me.uid}, gid {me.gid}, groups {','.join(map(str, me.groups)) or '-'})"
          + (" admin" if me.admin else "") + (" proxy" if me.proxy else ""))


def cmd_key(args: argparse.Namespace) -> None:
    from . import auth

    ids = auth.edit_key_file(args.key_file, add=args.key_command == "add",
                             use=args.id if args.key_command == "use" else None,
                             remove=args.id if args.key_command == "remove" else None)
    print(f"{args.key_file}: keys {', '.join(ids)} ({ids[0]} signs). Running services re-read the file within a"
          " second; copy it to every server host.")


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import main as bench_main

    raise SystemExit(bench_main(args.bench_args))


def cmd_mount(args: argparse.Namespace) -> None:
    from .client.fuse import mount

    address = _meta_address(args)
    mount(address, args.mountpoint, foreground=not args.daemon, threads=not args.single_thread,
          attr_timeout_s=args.attr_timeout, debug=args.debug, credentials=args.credentials,
          multi_user=args.multi_user, default_permissions=args.default_permissions)


# ---------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tectofs",
        description="Distributed checkpoint storage: erasure-coded chunk servers, a metadata service, "
        "a client library, a FUSE mount and a PyTorch plugin.",
        epilog="Start here: 'tectofs up --root /tmp/tectofs' runs a local cluster; then "
        "'export TECTOFS_META=127.0.0.1:7420' and use put/get/ls.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def client_command(name: str, fn: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_client_flags(p)
        p.set_defaults(fn=fn)
        return p

    def add_tls_flags(p: argparse.ArgumentParser, serves: bool) -> None:
        if serves:
            p.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (default: $TECTOFS_TLS_CERT)")
            p.add_argument("--tls-key", metavar="FILE", help="... and this private key (default: $TECTOFS_TLS_KEY)")
        p.add_argument("--tls-ca", metavar="FILE",
                       help="connect with TLS, trusting servers this CA signed (default: $TECTOFS_TLS_CA)")

    def add_metrics_flags(p: argparse.ArgumentParser) -> None:
        p.add_argument("--metrics", metavar="HOST:PORT", type=_metrics_listen,
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free one; default: off)")
        p.add_argument("--metrics-ready-file", metavar="FILE", help="write the metrics HOST:PORT here once serving")

    def add_client_flags(p: argparse.ArgumentParser) -> None:
        add_tls_flags(p, serves=False)
        p.add_argument("--meta", help="metadata service HOST:PORT, or several (HOST:PORT,HOST:PORT: failover) (default: $TECTOFS_META)")
        p.add_argument("--credentials", metavar="FILE",
                       help="credential file of the user to act as (default: $TECTOFS_CREDENTIALS, else the one"
                       " 'tectofs up' wrote for this address under ~/.config/tectofs/credentials/)")

    key_help = "cluster key file (default: $TECTOFS_KEY_FILE; 'tectofs init' or 'tectofs up' makes one)"

    p = sub.add_parser("up", help="run a local cluster (1 metadata service + N chunk servers) in the foreground",
                       description="Run a whole cluster on this machine until Ctrl-C. All state lives under --root; "
                       "running it again with the same root brings the same files back.")
    p.add_argument("--root", default=None,
                   help="state directory (default ./tectofs-data; with --check a new temporary one)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"metadata service port (default {DEFAULT_PORT}; 0 = any)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--servers", type=int, default=6, help="chunk servers to start (default 6)")
    p.add_argument("--policy", default="rs(4,2)", help="durability policy of / (default rs(4,2); or rep(n))")
    p.add_argument("--block-size", type=_size, default=limits.block_size_default_bytes, help="block size (default 64M)")
    p.add_argument("--mount", metavar="MOUNTPOINT", help="also mount the cluster there with FUSE")
    p.add_argument("--check", action="store_true", help="start, write and verify a file, then stop (a smoke test)")
    p.add_argument("--repair-after", type=float, default=limits.repair_after_s, metavar="SECONDS",
                   help=f"rebuild the chunks of a server dead this long (default {limits.repair_after_s:.0f})")
    p.add_argument("--scrub-rate", type=float, default=limits.scrub_rate_bytes_per_s / limits.MiB, metavar="MIB_S",
                   help="background checksum verification per chunk server, MiB/s (0: off; default %(default)s)")
    p.add_argument("--s3", type=int, metavar="PORT",
                   help="also serve S3 on this port (0: any); root's keys go to ROOT/credentials/s3.env")
    p.add_argument("--tls", action="store_true",
                   help="TLS on every connection, with a CA and certificate made under --root (clients then need"
                   " TECTOFS_TLS_CA=ROOT/tls/ca.pem)")
    p.add_argument("--no-metrics", action="store_true",
                   help="no Prometheus endpoints (default: one per server, on a free port, URLs printed)")
    p.set_defaults(fn=cmd_up)

    p = sub.add_parser("meta", help="run the metadata service")
    p.add_argument("--store", default="meta.db", help="SQLite file or postgresql:// URL (default meta.db)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--policy", default="rs(4,2)", help="policy of / on a new store")
    p.add_argument("--block-size", type=_size, default=limits.block_size_default_bytes)
    p.add_argument("--dead-after", type=float, default=limits.server_dead_after_s,
                   help="seconds without heartbeat before a chunk server counts as dead")
    p.add_argument("--gc-delay", type=float, default=30.0, help="seconds before deleted chunks are removed")
    p.add_argument("--allocation-grace", type=float, default=limits.allocation_grace_s,
                   help="seconds before blocks allocated but never committed (a crashed writer) are collected")
    p.add_argument("--repair-after", type=float, default=limits.repair_after_s, metavar="SECONDS",
                   help="rebuild elsewhere the chunks of a chunk server dead this long (default %(default)s, like"
                   " Ceph's down-out interval: a reboot does not trigger a rebuild)")
    p.add_argument("--repair-interval", type=float, default=limits.repair_interval_s, metavar="SECONDS",
                   help="how often to look for chunks to rebuild (default %(default)s)")
    p.add_argument("--orphan-grace", type=float, default=limits.orphan_grace_s, metavar="SECONDS",
                   help="collect chunks no file refers to this long after an inventory found them (default %(default)s)")
    p.add_argument("--ready-file", help="write the listening address here once serving")
    p.add_argument("--key-file", help=key_help)
    add_tls_flags(p, serves=True)
    p.add_argument("--capability-ttl", type=float, default=limits.capability_ttl_s, metavar="SECONDS",
                   help="how long the chunk capabilities in layouts and allocations are valid (default %(default)s)")
    add_metrics_flags(p)
    p.set_defaults(fn=cmd_meta)

    p = sub.add_parser("chunk", help="run a chunk server")
    p.add_argument("--data", required=True, help="directory for chunk files (local flash)")
    p.add_argument("--meta", required=True, help="metadata service HOST:PORT, or several over one store (HOST:PORT,HOST:PORT: failover)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    p.add_argument("--inflight-max", type=_size, default=limits.chunk_inflight_bytes_max,
                   help="bytes being received at once before answering BUSY (default 512M)")
    p.add_argument("--heartbeat", type=float, default=limits.heartbeat_interval_s, help="heartbeat interval, seconds")
    p.add_argument("--sync", choices=["each", "group"], default="each",
                   help="durability before acknowledging a chunk: fdatasync + directory fsync per chunk "
                   "(each, default) or one syncfs shared by concurrent writes (group: for a dedicated data device)")
    p.add_argument("--no-sync", action="store_true", help="acknowledge before data is durable (network benchmarks only)")
    p.add_argument("--scrub-rate", type=float, default=limits.scrub_rate_bytes_per_s / limits.MiB, metavar="MIB_S",
                   help="re-verify every chunk's checksums in the background at this rate (0: off; default %(default)s)")
    p.add_argument("--scrub-interval", type=float, default=limits.scrub_pass_interval_s, metavar="SECONDS",
                   help="start a scrub pass at most this often (default %(default)s; a pass over a large disk"
                   " takes longer at the rate)")
    p.add_argument("--repair-rate", type=float, default=limits.repair_rate_bytes_per_s / limits.MiB, metavar="MIB_S",
                   help="bytes pulled from peers to rebuild chunks, per second (0: unlimited; default %(default)s)")
    p.add_argument("--repair-concurrency", type=int, default=limits.repair_concurrency_per_server, metavar="N",
                   help="chunks rebuilt at once (default %(default)s)")
    p.add_argument("--inventory-interval", type=float, default=limits.inventory_interval_s, metavar="SECONDS",
                   help="full report of the chunks on disk to the metadata service, after the one at start"
                   " (default %(default)s)")
    p.add_argument("--ready-file")
    p.add_argument("--key-file", help=key_help)
    add_tls_flags(p, serves=True)
    add_metrics_flags(p)
    p.set_defaults(fn=cmd_chunk)

    p = client_command("put", cmd_put, "copy a local file into tectofs")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-q", "--quiet", action="store_true")
    p = client_command("get", cmd_get, "copy a file out of tectofs")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-q", "--quiet", action="store_true")
    p = client_command("ls", cmd_ls, "list a directory")
    p.add_argument("path", nargs="?", default="/")
    p = client_command("stat", cmd_stat, "show a file's attributes")
    p.add_argument("path")
    p = client_command("mkdir", cmd_mkdir, "create a directory")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true")
    p.add_argument("--policy", help="durability policy for files below it: rs(k,m) or rep(n)")
    p.add_argument("--block-size", type=_size)
    p = client_command("set-policy", cmd_set_policy, "change the durability policy or block size new files below a directory get")
    p.add_argument("path")
    p.add_argument("--policy", help="rs(k,m) or rep(n)")
    p.add_argument("--block-size", type=_size)
    p.add_argument("--write-min", type=int, help="chunks a block needs to be accepted while servers are missing"
                   " (default: k+1 for rs(k,m), 2 for rep(n)); the full width refuses degraded writes")
    p = client_command("mv", cmd_mv, "rename (atomically replacing the target)")
    p.add_argument("src")
    p.add_argument("dst")
    p = client_command("rm", cmd_rm, "remove files or (with -r) directories")
    p.add_argument("paths", nargs="+")
    p.add_argument("-r", "--recursive", action="store_true")
    client_command("status", cmd_status, "show chunk servers, block health, rebuilds, scrub progress")
    p = client_command("fsck", cmd_fsck, "check every block below PATH: healthy, under-redundant or unreadable;"
                       " exit 0 only if all are fully redundant (1: some under-redundant, 2: some unreadable)")
    p.add_argument("path", nargs="?", default="/")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    admin = sub.add_parser("admin", help="cluster administration (drain)", description="Cluster administration.")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="ADMIN_COMMAND")
    p = admin_sub.add_parser("drain", help="move every chunk off a chunk server so it can be stopped safely",
                             description="Move every chunk off a chunk server (it takes no new ones); when done it"
                             " can be stopped with no loss of redundancy. Progress: tectofs status.")
    p.add_argument("server", help="the server's id, uuid or address (tectofs status lists them)")
    add_client_flags(p)
    p.add_argument("--cancel", action="store_true", help="stop draining: the server takes new chunks again")
    p.add_argument("--wait", action="store_true", help="wait until the server holds no chunk, showing progress")
    p.add_argument("--timeout", type=float, default=24 * 3600.0, help="with --wait, give up after this many seconds")
    p.set_defaults(fn=cmd_drain)
    p = sub.add_parser("init", help="make a cluster key and root's credential for a multi-host cluster",
                       description="Make the cluster key (ROOT/cluster.key, mode 0600: copy it to every metadata"
                       " service and chunk server host) and root's credential (ROOT/root.credentials). 'tectofs up'"
                       " does this itself for a local cluster.")
    p.add_argument("--root", required=True, help="directory for the key and credential")
    p.add_argument("--meta", help="the metadata service address the credential is for (informational)")
    p.set_defaults(fn=cmd_init)
    users = sub.add_parser("user", help="users and their credentials (add, list, remove)",
                           description="Users of the cluster: each gets a uid, gid, groups and a credential file.")
    users_sub = users.add_subparsers(dest="user_command", required=True, metavar="USER_COMMAND")
    p = users_sub.add_parser("add", help="add a user and write its credential file",
                             description="Add a user (administrators only) and write its credential (and S3 key"
                             " pair) to --out, mode 0600.")
    p.add_argument("name")
    p.add_argument("--uid", type=int, required=True)
    p.add_argument("--gid", type=int, required=True)
    p.add_argument("--groups", default="", help="supplementary gids, comma-separated")
    p.add_argument("--admin", action="store_true", help="may add and remove users and drain servers")
    p.add_argument("--proxy", action="store_true",
                   help="may act for other uids (the credential of a multi-user FUSE mount on a node)")
    p.add_argument("--out", help="credential file to write (default ./NAME.credentials)")
    add_client_flags(p)
    p.set_defaults(fn=cmd_user_add)
    p = users_sub.add_parser("list", help="list users")
    add_client_flags(p)
    p.set_defaults(fn=cmd_user_list)
    p = users_sub.add_parser("remove", help="remove a user (its credential stops working)")
    p.add_argument("name")
    add_client_flags(p)
    p.set_defaults(fn=cmd_user_remove)
    client_command("whoami", cmd_whoami, "show who the credential in use makes you")
    keys = sub.add_parser("key", help="rotate the cluster key (add, use, remove)",
                          description="Key rotation, with two valid keys at a time: 'add' a new key, copy the file to"
                          " every server host, 'use' it (it signs from then on), wait for the capability lifetime"
                          " (1 h by default), then 'remove' the old one. Running services re-read the file.")
    keys_sub = keys.add_subparsers(dest="key_command", required=True, metavar="KEY_COMMAND")
    for name, text in (("add", "add a new key (accepted, not yet signing)"), ("use", "make key ID the signing key"),
                       ("remove", "remove key ID")):
        p = keys_sub.add_parser(name, help=text)
        if name != "add":
            p.add_argument("id")
        p.add_argument("--key-file", required=True)
        p.set_defaults(fn=cmd_key)
    p = client_command("gc", cmd_gc, "remove leftovers of interrupted checkpoint saves (pending directories)")
    p.add_argument("path", nargs="?", default="/", help="where to look, recursively (default /)")
    # Same default as the writer's own clean-up (tectofs.torch.PENDING_GRACE_S; not imported
    # here: that would load torch for every command). A failed save deletes its pending
    # directory itself; only crashed saves leave one.
    p.add_argument("--older-than", type=float, default=24 * 3600.0,
                   help="only leftovers untouched for this many seconds (default 86400 = 24 h, as the "
                        "automatic clean-up after each checkpoint commit; use less only when no save is running)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p = client_command("mount", cmd_mount, "mount tectofs with FUSE (unmount with fusermount3 -u or Ctrl-C)")
    p.add_argument("mountpoint")
    p.add_argument("--daemon", action="store_true", help="detach into the background")
    p.add_argument("--single-thread", action="store_true", help="serve one kernel request at a time")
    p.add_argument("--attr-timeout", type=float, default=1.0, help="attribute/entry cache seconds (default 1)")
    p.add_argument("--debug", action="store_true")
    sharing = p.add_mutually_exclusive_group()
    sharing.add_argument("--allow-other", dest="multi_user", action="store_true", default=None,
                         help="every local user may use the mount, as themselves (the default when run by root"
                         " with a proxy credential; a non-root mount needs user_allow_other in /etc/fuse.conf)")
    sharing.add_argument("--single-user", dest="multi_user", action="store_false",
                         help="only the user running the mount may use it, as the credential's user")
    p.add_argument("--no-default-permissions", dest="default_permissions", action="store_false",
                   help="multi-user: leave permission checks to the metadata service alone (no kernel check first)")
    from .s3 import cli as s3_cli

    s3_cli.add_parser(sub, _serve_bound)
    p = sub.add_parser("bench", help="run benchmarks (client-io, checkpoint, fuse, burst, all); 'tectofs bench --help'",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its own parser, options and --help included
        from .bench import main as bench_main

        raise SystemExit(bench_main(argv[1:]))
    args = build_parser().parse_args(argv)
    for flag, env in (("tls_cert", "TECTOFS_TLS_CERT"), ("tls_key", "TECTOFS_TLS_KEY"), ("tls_ca", "TECTOFS_TLS_CA")):
        if getattr(args, flag, None):
            os.environ[env] = getattr(args, flag)  # every connection this process makes or serves
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        args.fn(args)
    except TectofsError as exc:
        raise SystemExit(f"tectofs {args.command}: {exc}") from None
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise SystemExit(f"tectofs {args.command}: {exc}") from None
    except KeyboardInterrupt:
        # What was being written was aborted on the way out (nothing half-written is published).
        print(f"\ntectofs {args.command}: interrupted; nothing it was writing was published", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
