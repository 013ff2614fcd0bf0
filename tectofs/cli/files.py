"""Client commands on files and directories: put, get, ls, stat, mkdir, set-policy, mv, rm."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from tectofs import paths

from .common import _client, _copy, _human, _size, client_command


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


def add_parsers(sub: Any) -> None:
    p = client_command(sub, "put", cmd_put, "copy a local file into tectofs")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-q", "--quiet", action="store_true")
    p = client_command(sub, "get", cmd_get, "copy a file out of tectofs")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("-q", "--quiet", action="store_true")
    p = client_command(sub, "ls", cmd_ls, "list a directory")
    p.add_argument("path", nargs="?", default="/")
    p = client_command(sub, "stat", cmd_stat, "show a file's attributes")
    p.add_argument("path")
    p = client_command(sub, "mkdir", cmd_mkdir, "create a directory")
    p.add_argument("path")
    p.add_argument("-p", "--parents", action="store_true")
    p.add_argument("--policy", help="durability policy for files below it: rs(k,m) or rep(n)")
    p.add_argument("--block-size", type=_size)
    p = client_command(sub, "set-policy", cmd_set_policy, "change the durability policy or block size new files below a directory get")
    p.add_argument("path")
    p.add_argument("--policy", help="rs(k,m) or rep(n)")
    p.add_argument("--block-size", type=_size)
    p.add_argument("--write-min", type=int, help="chunks a block needs to be accepted while servers are missing"
                   " (default: k+1 for rs(k,m), 2 for rep(n)); the full width refuses degraded writes")
    p = client_command(sub, "mv", cmd_mv, "rename (atomically replacing the target)")
    p.add_argument("src")
    p.add_argument("dst")
    p = client_command(sub, "rm", cmd_rm, "remove files or (with -r) directories")
    p.add_argument("paths", nargs="+")
    p.add_argument("-r", "--recursive", action="store_true")
