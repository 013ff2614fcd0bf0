"""The ``tectofs`` command: servers (``up``, ``meta``, ``chunk``, ``mount``) and client commands.

Client commands find the metadata service through ``--meta HOST:PORT`` or ``$TECTOFS_META``.
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
            allocation_grace_s=args.allocation_grace,
        )

    _serve_bound(start, args, lambda a: f"tectofs metadata service on {a} (store {args.store})")


def cmd_chunk(args: argparse.Namespace) -> None:
    from .server.chunk import ChunkServer

    def start() -> ChunkServer:
        return ChunkServer(args.data, args.meta, args.inflight_max, args.heartbeat, sync="none" if args.no_sync else args.sync)

    _serve_bound(start, args, lambda a: f"tectofs chunk server on {a} (data {args.data}, metadata {args.meta})")


def _serve_bound(start: Callable[[], Any], args: argparse.Namespace, describe: Callable[[str], str]) -> None:
    async def main() -> None:
        server = start()
        address = await server.start(args.host, args.port)
        print(describe(address), flush=True)
        if args.ready_file:
            with open(args.ready_file + ".tmp", "w") as f:
                f.write(address)
            os.rename(args.ready_file + ".tmp", args.ready_file)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        diagnostics.dump_tasks_on_sigusr1(loop)
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.close()

    asyncio.run(main())


def cmd_up(args: argparse.Namespace) -> None:
    import tempfile

    from .server.cluster import LocalCluster

    temporary = args.check and args.root is None  # a smoke test never touches a real cluster's state
    if temporary:
        args.root = tempfile.mkdtemp(prefix="tectofs-check-")
    cluster = LocalCluster(args.root or os.path.join(os.getcwd(), "tectofs-data"), args.servers, args.port,
                           args.policy, args.block_size, args.host)
    print(f"starting a local cluster under {cluster.root}: 1 metadata service + {args.servers} chunk servers ...",
          flush=True)
    stop = {"now": False}

    def request_stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    mount = None
    try:
        address = cluster.start()
        print(f"cluster is up: export TECTOFS_META={address}", flush=True)
        print(f"  try: tectofs put FILE /  |  tectofs ls /  |  tectofs status   (logs in {cluster.root}/logs)", flush=True)
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


def _client(args: argparse.Namespace) -> Any:
    from .client import connect

    address = args.meta or os.environ.get("TECTOFS_META")
    if not address:
        raise SystemExit("tectofs: no metadata service given: use --meta HOST:PORT or set TECTOFS_META")
    return connect(address)


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
            kind = {"dir": "d", "file": "-", "symlink": "l"}[e.kind]
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
    degraded = stats["counts"].get("under_redundant_blocks", 0)
    if degraded:
        print(f"{degraded} blocks under-redundant (written while chunk servers were missing; await repair)")
    print(f"chunk servers: {live} live of {len(servers)}; capacity {_human(statfs['capacity'])}, used {_human(statfs['used'])}")
    print(f"{'id':>3} {'address':<22} {'state':<5} {'used':>12} {'capacity':>12} {'chunks':>8} {'heartbeat':>10}")
    for s in servers:
        print(f"{s['server_id']:>3} {s['address']:<22} {'live' if s['live'] else 'DEAD':<5} {_human(s['used']):>12} "
              f"{_human(s['capacity']):>12} {s['chunks']:>8} {now - s['last_heartbeat']:>8.1f}s")


def cmd_gc(args: argparse.Namespace) -> None:
    from .torch import gc_pending

    address = args.meta or os.environ.get("TECTOFS_META")
    if not address:
        raise SystemExit("tectofs: no metadata service given: use --meta HOST:PORT or set TECTOFS_META")
    removed = gc_pending(f"tectofs://{address}{args.path}", args.older_than, recursive=True, dry_run=args.dry_run)
    for uri in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {uri}")
    print(f"{len(removed)} leftovers of interrupted checkpoint saves {'found' if args.dry_run else 'removed'}")


def cmd_bench(args: argparse.Namespace) -> None:
    from .bench import main as bench_main

    raise SystemExit(bench_main(args.bench_args))


def cmd_mount(args: argparse.Namespace) -> None:
    from .client.fuse import mount

    address = args.meta or os.environ.get("TECTOFS_META")
    if not address:
        raise SystemExit("tectofs: no metadata service given: use --meta HOST:PORT or set TECTOFS_META")
    mount(address, args.mountpoint, foreground=not args.daemon, threads=not args.single_thread,
          attr_timeout_s=args.attr_timeout, debug=args.debug)


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
        p.add_argument("--meta", help="metadata service HOST:PORT (default: $TECTOFS_META)")
        p.set_defaults(fn=fn)
        return p

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
    p.add_argument("--ready-file", help="write the listening address here once serving")
    p.set_defaults(fn=cmd_meta)

    p = sub.add_parser("chunk", help="run a chunk server")
    p.add_argument("--data", required=True, help="directory for chunk files (local flash)")
    p.add_argument("--meta", required=True, help="metadata service HOST:PORT")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    p.add_argument("--inflight-max", type=_size, default=limits.chunk_inflight_bytes_max,
                   help="bytes being received at once before answering BUSY (default 512M)")
    p.add_argument("--heartbeat", type=float, default=limits.heartbeat_interval_s, help="heartbeat interval, seconds")
    p.add_argument("--sync", choices=["each", "group"], default="each",
                   help="durability before acknowledging a chunk: fdatasync + directory fsync per chunk "
                   "(each, default) or one syncfs shared by concurrent writes (group: for a dedicated data device)")
    p.add_argument("--no-sync", action="store_true", help="acknowledge before data is durable (network benchmarks only)")
    p.add_argument("--ready-file")
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
    client_command("status", cmd_status, "show chunk servers, liveness, capacity and use")
    p = client_command("gc", cmd_gc, "remove leftovers of interrupted checkpoint saves (pending directories)")
    p.add_argument("path", nargs="?", default="/", help="where to look, recursively (default /)")
    p.add_argument("--older-than", type=float, default=3600.0,
                   help="only leftovers untouched for this many seconds (default 3600)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p = client_command("mount", cmd_mount, "mount tectofs with FUSE (unmount with fusermount3 -u or Ctrl-C)")
    p.add_argument("mountpoint")
    p.add_argument("--daemon", action="store_true", help="detach into the background")
    p.add_argument("--single-thread", action="store_true", help="serve one kernel request at a time")
    p.add_argument("--attr-timeout", type=float, default=1.0, help="attribute/entry cache seconds (default 1)")
    p.add_argument("--debug", action="store_true")
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
