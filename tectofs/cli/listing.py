"""Client commands that show the namespace: ls, stat, du, df (each with ``--json`` for scripts).

Text output is for people (permission strings, octal modes, local times, ``-h`` sizes); the
JSON output carries every field of the entry (``tectofs.client.Stat``) plus ``path``,
``mode_octal``, ``permissions`` and ``*_iso`` UTC times, so scripts never parse text. Names
and paths in text output go through ``output.shown`` (no control characters on a terminal).
"""

from __future__ import annotations

import argparse
import posixpath
from typing import Any, Iterator

from tectofs.wire import messages

from . import output
from .common import UsageError, _client, client_command
from .transfer import parse


def _path(argument: str) -> str:
    """``/a`` or ``tectofs:/a`` (this command's cluster) -> ``/a``."""
    parsed = parse(argument)
    if parsed and parsed[0]:
        from .common import UsageError

        raise UsageError(f"{argument!r}: give the cluster with --meta, not in the path")
    return parsed[1] if parsed else argument


def _entries(fs: Any, path: str, show_all: bool) -> Iterator[tuple[str, str, Any]]:
    """``(name, full path, Stat)`` of a directory's entries (hidden ones with ``show_all``), or of the file itself."""
    st = fs.stat(path)
    if not st.is_dir:
        yield path, path, st
        return
    for name, entry in fs.iter_scandir(path):
        if show_all or not name.startswith("."):
            yield name, posixpath.join(path, name), entry


def _long_line(name: str, st: Any, human: bool) -> str:
    size = output.short_human(st.size) if human else str(st.size)
    suffix = f" -> {output.shown(st.target)}" if st.kind == "symlink" else ""
    return (f"{output.permissions(st.kind, st.mode)} {st.nlink:>3} {st.uid:>5} {st.gid:>5} {size:>{6 if human else 13}}"
            f" {output.local_time(st.mtime)} {st.policy:<8} {output.shown(name)}{suffix}")


def _walk(fs: Any, path: str, args: argparse.Namespace) -> Iterator[tuple[str, list[tuple[str, str, Any]]]]:
    """``(directory, entries)`` for ``path`` and, with ``-R``, every directory below it (depth first, by name)."""
    entries = list(_entries(fs, path, args.all))
    yield path, entries
    if args.recursive:
        for name, full, st in entries:
            if st.is_dir and full != path:
                yield from _walk(fs, full, args)


def cmd_ls(args: argparse.Namespace) -> None:
    paths = [_path(p) for p in args.paths]
    with _client(args) as fs:
        if args.json:
            output.print_json_array(output.stat_dict(st, name=name, path=full)
                                    for path in paths for _, entries in _walk(fs, path, args)
                                    for name, full, st in entries)
            return
        headers = len(paths) > 1 or args.recursive
        first = True
        for path in paths:
            for directory, entries in _walk(fs, path, args):
                if headers:
                    print(("" if first else "\n") + f"{output.shown(directory)}:")
                first = False
                for name, _, st in entries:
                    print(_long_line(name, st, args.human_readable) if args.long else output.shown(name))


def cmd_stat(args: argparse.Namespace) -> None:
    path = _path(args.path)
    with _client(args) as fs:
        st = fs.stat(path)
        blocks = fs.run(fs.aio.block_count(path)) if st.is_file else None
    if args.json:
        output.print_json(output.stat_dict(st, path=path, blocks=blocks))
        return
    rows = [("path", output.shown(path)), ("kind", st.kind),
            ("size", f"{st.size} ({output.human(st.size)})"),
            ("stored", f"{st.stored} ({output.human(st.stored)}; holes and zero ends not stored)"),
            ("mode", f"{output.octal(st.mode)} ({output.permissions(st.kind, st.mode)})"),
            ("owner", f"uid {st.uid}, gid {st.gid}"), ("links", st.nlink), ("inode", st.ino),
            ("policy", st.policy), ("block size", f"{st.block_size} ({output.human(st.block_size)})"),
            ("write min", st.write_min or "the policy's")]
    if st.kind == "symlink":
        rows.append(("target", output.shown(st.target)))
    if st.kind in ("char", "block"):
        rows.append(("device", f"{st.rdev >> 8},{st.rdev & 0xFF}"))
    rows += [("accessed", output.local_time(st.atime, precise=True)),
             ("modified", output.local_time(st.mtime, precise=True)),
             ("changed", output.local_time(st.ctime, precise=True))]
    if blocks is not None:
        rows.append(("blocks", blocks))
    for key, value in rows:
        print(f"{key:>10}: {value}")


def _usage(fs: Any, path: str, apparent: bool, report: list[dict[str, Any]], every_dir: bool,
           unique: bool = False) -> dict[str, Any]:
    """Bytes, files and directories at and below ``path``; appends each directory's total to
    ``report`` after its children's (as du prints them) when ``every_dir``. With ``unique``
    (stored bytes only), also ``unique``: the bytes stored once however many files below
    ``path`` share them (an incremental checkpoint shares blocks with the previous one)."""
    st = fs.stat(path)
    total = {"path": path, "bytes": st.size if apparent else st.stored, "files": int(not st.is_dir),
             "dirs": int(st.is_dir)}
    shared: dict[int, int] = {}  # block id -> bytes, of the shared blocks used below path
    uses = [0]  # bytes of every use of those blocks

    def count(directory: str, names: list[str]) -> None:
        for _, block_id, nbytes in fs.shared_blocks(directory, names) if unique and names else []:
            shared[block_id] = nbytes
            uses[0] += nbytes

    if st.is_dir:
        files = []
        for name, entry in fs.iter_scandir(path):
            if entry.is_dir:
                below = _usage(fs, posixpath.join(path, name), apparent, report, every_dir, unique)
                shared.update(below.pop("_shared", {}))
                uses[0] += below.pop("_uses", 0)
            else:
                below = {"bytes": entry.size if apparent else entry.stored, "files": 1, "dirs": 0}
                files.append(name)
            for key in ("bytes", "files", "dirs"):
                total[key] += below[key]
        count(path, files)
    else:
        directory, name = posixpath.split(path)
        count(directory, [name])
    if unique:
        total["unique"] = total["bytes"] - uses[0] + sum(shared.values())
    if every_dir and st.is_dir:
        report.append(dict(total))
    return {**total, "_shared": shared, "_uses": uses[0]} if unique else total


def cmd_du(args: argparse.Namespace) -> None:
    if args.unique and args.apparent_size:
        raise UsageError("--unique counts stored bytes; it does not go with --apparent-size")
    report: list[dict[str, Any]] = []
    with _client(args) as fs:
        for path in [_path(p) for p in args.paths]:
            total = _usage(fs, path, args.apparent_size, report, not args.summarize, args.unique)
            total.pop("_shared", None)
            total.pop("_uses", None)
            if args.summarize or not fs.stat(path).is_dir:
                report.append(total)
    if args.json:
        output.print_json(report)
        return
    size = output.short_human if args.human_readable else str
    for row in report:
        unique = f"{size(row['unique'])}\t" if args.unique else ""
        print(f"{size(row['bytes'])}\t{unique}{output.shown(row['path'])}")


def cmd_df(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        statfs = messages.to_plain(fs.statfs())
        address = fs.meta_address
    if args.json:
        output.print_json({"meta": address, **statfs, "free": statfs["capacity"] - statfs["used"]})
        return
    size = output.short_human if args.human_readable else str
    capacity, used = statfs["capacity"], statfs["used"]
    percent = f"{100 * used // capacity}%" if capacity else "-"
    rows = [("Cluster", "Size", "Used", "Avail", "Use%", "Usable", "Usable-avail", "Policy", "Inodes"),
            (output.shown(address), size(capacity), size(used), size(capacity - used), percent, size(statfs.get("usable", 0)),
             size(statfs.get("usable_free", 0)), statfs.get("policy", ""), str(statfs["files"]))]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(str(v).ljust(w) if i == 0 else str(v).rjust(w) for i, (v, w) in enumerate(zip(r, widths))))


def add_parsers(sub: Any) -> None:
    path_help = "tectofs path (/path or tectofs:/path)"
    p = client_command(sub, "ls", cmd_ls, "list directories (names; -l: details)", json_output=True,
                       short_help_flag=False)
    p.add_argument("paths", nargs="*", default=["/"], metavar="PATH", help=f"{path_help} (default /)")
    p.add_argument("-l", dest="long", action="store_true",
                   help="long listing: permissions, links, uid, gid, size in bytes, modified (local time), policy, name")
    p.add_argument("-h", "--human-readable", action="store_true", help="with -l: sizes as 1.5K, 12M, 3.0G (powers of 1024)")
    p.add_argument("-R", "--recursive", action="store_true", help="list subdirectories recursively")
    p.add_argument("-a", "--all", action="store_true", help="also names starting with '.'")
    p = client_command(sub, "stat", cmd_stat, "show a file's attributes (mode in octal, times readable)", json_output=True)
    p.add_argument("path", help=path_help)
    p = client_command(sub, "du", cmd_du, "bytes stored at and below paths, per directory", json_output=True,
                       short_help_flag=False)
    p.description = ("Bytes stored at and below each PATH, one line per directory (after its subdirectories), in"
                     " bytes: the data the files store (holes and zero ends excluded; before redundancy).")
    p.add_argument("paths", nargs="*", default=["/"], metavar="PATH", help=f"{path_help} (default /)")
    p.add_argument("-s", "--summarize", action="store_true", help="only a total for each PATH")
    p.add_argument("-h", "--human-readable", action="store_true", help="sizes as 1.5K, 12M, 3.0G (powers of 1024)")
    p.add_argument("--apparent-size", action="store_true", help="file sizes instead of the bytes they store")
    p.add_argument("--unique", action="store_true",
                   help="also the unique bytes (second column; JSON: unique): blocks that several files share,"
                        " as incremental checkpoints do, counted once")
    p = client_command(sub, "df", cmd_df, "cluster capacity, use and free space", json_output=True,
                       short_help_flag=False)
    p.description = ("Raw capacity and use of the live chunk servers, and what files can use of it under the root"
                     " directory's policy (Usable: raw times the data share of a stripe, e.g. 4/6 for rs(4,2)).")
    p.add_argument("-h", "--human-readable", action="store_true", help="sizes as 1.5K, 12M, 3.0G (powers of 1024)")
