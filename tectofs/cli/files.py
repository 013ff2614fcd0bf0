"""Client commands on files and directories: put, get, cp, cat, mkdir, set-policy, mv, rm."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tectofs import limits, paths

from . import numbers, output, transfer
from .common import UsageError, _client, _human, client_command


def _remote_path(argument: str) -> tuple[str | None, str]:
    """A tectofs path given to put/get/cat: ``/a``, ``tectofs:/a`` or ``tectofs://HOST:PORT/a``."""
    return transfer.parse(argument) or (None, argument)


_LOCAL = transfer.Local()


def _local_or_remote(clusters: transfer.Clusters, argument: str) -> tuple[transfer.Endpoint, str]:
    parsed = transfer.parse(argument)
    if parsed is None:
        return _LOCAL, argument
    return clusters.remote(parsed[0]), parsed[1]


def _one_cluster(arguments: list[str]) -> tuple[str | None, list[str]]:
    parsed = [_remote_path(a) for a in arguments]
    addresses = {address for address, _ in parsed}
    if len(addresses) > 1:
        raise UsageError("all tectofs sources must be on one cluster (use cp for several)")
    return addresses.pop(), [path for _, path in parsed]


def cmd_put(args: argparse.Namespace) -> None:
    address, (target,) = _one_cluster([args.dst])
    with transfer.Clusters(args) as clusters:
        transfer.copy(_LOCAL, args.src, clusters.remote(address), target, args.recursive, args.quiet)


def cmd_get(args: argparse.Namespace) -> None:
    address, sources = _one_cluster(args.src)
    with transfer.Clusters(args) as clusters:
        transfer.copy(clusters.remote(address), sources, _LOCAL, args.dst, args.recursive, args.quiet)


def cmd_cp(args: argparse.Namespace) -> None:
    with transfer.Clusters(args) as clusters:
        sources = [_local_or_remote(clusters, a) for a in args.src]
        if len({id(endpoint) for endpoint, _ in sources}) > 1:
            raise UsageError("all sources must be on one side (all local, or all on one tectofs cluster)")
        dst, target = _local_or_remote(clusters, args.dst)
        transfer.copy(sources[0][0], [path for _, path in sources], dst, target, args.recursive, args.quiet)


def cmd_cat(args: argparse.Namespace) -> None:
    out = sys.stdout.buffer
    buffer = memoryview(bytearray(limits.MiB))
    with transfer.Clusters(args) as clusters:
        for argument in args.paths:
            address, path = _remote_path(argument)
            with clusters.remote(address).fs.open(path, "rb") as f:
                while n := f.readinto(buffer):
                    out.write(buffer[:n])
        out.flush()


def cmd_mkdir(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        fs.mkdir(args.path, policy=args.policy, block_size=args.block_size, parents=args.parents, exist_ok=args.parents)


def cmd_set_policy(args: argparse.Namespace) -> None:
    if args.policy is None and args.block_size is None and args.write_min is None and args.compress is None:
        raise UsageError("give --policy, --block-size, --write-min, --compress or several")
    with _client(args) as fs:
        if args.compress is not None:
            if not fs.stat(args.path).is_dir:
                raise UsageError(f"{args.path} is not a directory")
            from tectofs.checkpoint_gc import COMPRESS_XATTR

            fs.setxattr(args.path, COMPRESS_XATTR, args.compress.encode())
            print(f"{output.shown(args.path)}: checkpoints saved below it through the PyTorch plugin are"
                  f" {'compressed (zstd on tensor planes)' if args.compress == 'zstd' else 'not compressed'}"
                  " unless the writer says otherwise")
        if args.policy is None and args.block_size is None and args.write_min is None:
            return
        st = fs.set_policy(args.path, policy=args.policy, block_size=args.block_size, write_min=args.write_min)
        minimum = f"write minimum {st.write_min}" if st.write_min else "the policy's write minimum"
        print(f"{output.shown(args.path)}: new files below it get {st.policy}, {_human(st.block_size)} blocks, {minimum}"
              " (existing files keep theirs)")


def cmd_mv(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        fs.rename(args.src, args.dst)


def cmd_rm(args: argparse.Namespace) -> None:
    for path in args.paths:  # before anything is deleted, like GNU rm's --preserve-root
        if args.recursive and not paths.split(path):
            raise UsageError(f"refusing to remove {path!r} (the root directory); remove what is in it by name")
    with _client(args) as fs:
        for path in args.paths:
            st = fs.stat(path)
            if st.is_dir:
                if not args.recursive:
                    raise IsADirectoryError(f"{path} is a directory (use -r)")
                fs.rmtree(path)
            else:
                fs.remove(path)


def add_parsers(sub: Any) -> None:
    copying = ("Copies are published whole or not at all: an error or Ctrl-C leaves the previous version (or no"
               " file). Progress on stderr when it is a terminal; -q: none, and no summary.")
    p = client_command(sub, "put", cmd_put, "copy local files (-r: directories) into tectofs")
    p.description = f"Copy local files into tectofs: into DST if it is a directory, else as DST. {copying}"
    p.add_argument("src", nargs="+", metavar="SRC", help="local file (or directory, with -r); '-': standard input")
    p.add_argument("dst", metavar="DST", help="tectofs path (/path, tectofs:/path or tectofs://HOST:PORT/path)")
    p.add_argument("-r", "--recursive", action="store_true", help="copy directories and everything below them")
    p = client_command(sub, "get", cmd_get, "copy files (-r: directories) out of tectofs")
    p.description = f"Copy files out of tectofs: into DST if it is a local directory, else as DST. {copying}"
    p.add_argument("src", nargs="+", metavar="SRC", help="tectofs path (/path, tectofs:/path or tectofs://HOST:PORT/path)")
    p.add_argument("dst", metavar="DST", help="local file or directory; '-': standard output. An existing FIFO or"
                   " device is written into (as cp does), never replaced")
    p.add_argument("-r", "--recursive", action="store_true", help="copy directories and everything below them")
    p = client_command(sub, "cp", cmd_cp, "copy local -> tectofs, tectofs -> local or within tectofs ('tectofs:' paths)")
    p.description = f"Copy files (-r: directories). {transfer.CP_HELP} {copying}"
    p.epilog = ("examples: tectofs cp model.bin tectofs:/ckpt/  |  tectofs cp -r tectofs:/ckpt ./backup  |"
                "  tectofs cp tectofs:/ckpt/a.bin tectofs:/ckpt/b.bin")
    p.add_argument("src", nargs="+", metavar="SRC", help="source: a local path or a tectofs: path")
    p.add_argument("dst", metavar="DST", help="destination: a local path or a tectofs: path")
    p.add_argument("-r", "--recursive", action="store_true", help="copy directories and everything below them")
    p = client_command(sub, "cat", cmd_cat, "write files from tectofs to stdout")
    p.add_argument("paths", nargs="+", metavar="PATH", help="tectofs path (/path or tectofs:/path)")
    p = client_command(sub, "mkdir", cmd_mkdir, "create a directory")
    p.add_argument("path", help="tectofs path of the new directory")
    p.add_argument("-p", "--parents", action="store_true", help="make missing parents too; no error if it exists")
    p.add_argument("--policy", help="durability policy for files below it: rs(k,m) or rep(n) (default: inherited)")
    p.add_argument("--block-size", type=numbers.BLOCK_SIZE,
                   help="block size of new files below it, 64K to 64M, e.g. 4M (default: inherited)")
    p = client_command(sub, "set-policy", cmd_set_policy, "change the durability policy or block size new files below a directory get")
    p.add_argument("path", help="tectofs directory")
    p.add_argument("--policy", help="rs(k,m) or rep(n)")
    p.add_argument("--block-size", type=numbers.BLOCK_SIZE, help="block size of new files below it, 64K to 64M, e.g. 4M")
    p.add_argument("--write-min", type=numbers.count(1, limits.policy_width_max),
                   help="chunks a block needs to be accepted while servers are missing"
                   " (default: k+1 for rs(k,m), 2 for rep(n)); the full width refuses degraded writes")
    p.add_argument("--compress", choices=["zstd", "off"],
                   help="default for PyTorch checkpoints saved below it: tensors compressed (zstd on byte planes:"
                   " bf16 weights to about 2/3) or not; a CheckpointWriter(compress=...) overrides it")
    p = client_command(sub, "mv", cmd_mv, "rename (atomically replacing the target)")
    p.add_argument("src", help="tectofs path to rename")
    p.add_argument("dst", help="new tectofs path (an existing file there is replaced atomically)")
    p = client_command(sub, "rm", cmd_rm, "remove files or (with -r) directories")
    p.add_argument("paths", nargs="+", metavar="PATH", help="tectofs paths")
    p.add_argument("-r", "--recursive", action="store_true", help="remove directories and everything below them")
