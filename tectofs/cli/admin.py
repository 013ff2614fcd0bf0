"""Cluster commands: status, fsck, admin drain, gc, init, users, keys, whoami, bench."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from . import numbers, output
from .common import _client, _human, _meta_address, add_client_flags, client_command


def cmd_status(args: argparse.Namespace) -> None:
    from tectofs.wire import messages

    with _client(args) as fs:
        servers = messages.to_plain(fs.servers())
        statfs = messages.to_plain(fs.statfs())
        stats = messages.to_plain(fs.run(fs.aio.metadata.stats()))
    if args.json:  # every field the service sends, as it sends them: nothing added, nothing dropped
        output.print_json({"meta": {"address": fs.meta_address, **stats}, "statfs": statfs, "servers": servers})
        return
    now = time.time()
    live = sum(1 for s in servers if s["live"])
    print(f"metadata service {output.shown(fs.meta_address)}: {statfs['files']} inodes, "
          f"{stats['store']['operations']} operations in {stats['store']['commits']} commits")
    c = stats["counts"]
    print(f"blocks: {c.get('healthy', 0)} healthy, {c.get('under_redundant', 0)} under-redundant,"
          f" {c.get('unreadable', 0)} unreadable; rebuilds: {c.get('repairs_queued', 0)} queued,"
          f" {c.get('repairs_running', 0)} running, {c.get('repairs_done', 0)} done since start")
    if any(s.get("state") == "draining" for s in servers):
        print(f"draining: {c.get('draining_chunks', 0)} chunks still to move off draining servers")
    print(f"chunk servers: {live} live of {len(servers)}; capacity {_human(statfs['capacity'])}, used {_human(statfs['used'])}")
    print(f"{'id':>3} {'address':<22} {'state':<9} {'used':>10} {'capacity':>10} {'dead':>10} {'chunks':>8} {'heartbeat':>9}"
          f"  scrub (pass: checked/chunks, corrupt found)  rebuilt")
    for s in servers:
        state = ("live" if s["live"] else "DEAD") + (" drain" if s.get("state") == "draining" else "")
        p = s.get("stats", {})
        scrub = (f"{p.get('scrub_passes', 0) + 1}: {p.get('scrub_pass_checked', 0)}/{p.get('scrub_pass_chunks', 0)},"
                 f" {p.get('scrub_corrupt', 0)}") if p else "-"
        print(f"{s['server_id']:>3} {output.shown(s['address']):<22} {state:<9} {_human(s['used']):>10} "
              f"{_human(s['capacity']):>10} {_dead(p):>10} {s['chunks']:>8}"
              f" {now - s['last_heartbeat']:>8.1f}s  {scrub:<43}"
              f"  {p.get('repairs_done', 0)}")


def _dead(progress: dict[str, int]) -> str:
    """Space dead packed records hold on a server; "-" for a server that does not say (an
    older one)."""
    return _human(progress["pack_dead_bytes"]) if "pack_dead_bytes" in progress else "-"


def cmd_fsck(args: argparse.Namespace) -> None:
    from tectofs.fsck import check

    with _client(args) as fs:
        report = fs.run(check(fs.aio, args.path))
    if args.json:
        output.print_json(report.as_dict())
    else:
        for f in report.damaged:
            print(f"{output.shown(f['path'])}: {f['unreadable']} unreadable, {f['under_redundant']} under-redundant"
                  f" of {f['blocks']} blocks")
        print(f"{report.files} files, {report.blocks} blocks: {report.healthy} healthy,"
              f" {report.under_redundant} under-redundant, {report.unreadable} unreadable"
              + ("" if report.exit_code else " - clean"))
    raise SystemExit(report.exit_code)


def cmd_drain(args: argparse.Namespace) -> None:
    from tectofs.wire import messages

    with _client(args) as fs:
        reply = fs.run(fs.aio.metadata.drain(messages.DrainRequest(server=args.server, cancel=args.cancel)))
        if args.cancel:
            print(f"chunk server {reply.server_id} takes new chunks again ({reply.chunks} chunks on it)")
            return
        print(f"draining chunk server {reply.server_id}: {reply.chunks} chunks to move"
              + ("" if args.wait else "; 'tectofs status' shows progress, or use --wait"), flush=True)
        if args.wait:
            _wait_drained(fs, reply, args.timeout)


def _wait_drained(fs: Any, reply: Any, timeout: float) -> None:
    """Until the server holds no chunk; SystemExit (status 1) once no chunk moved for ``timeout`` s."""
    from tectofs.wire import messages

    moved = shown = time.monotonic()
    least = printed = reply.chunks
    while reply.chunks:
        if time.monotonic() - moved > timeout:
            raise SystemExit(
                f"tectofs admin drain: no chunk moved off chunk server {reply.server_id} in {timeout:.0f}s"
                f" ({reply.chunks} chunks still on it; --timeout sets how long to wait): 'tectofs status' shows whether"
                f" servers are missing. It is still draining; 'tectofs admin drain {reply.server_id} --cancel' takes it"
                " back")
        time.sleep(1.0)
        reply = fs.run(fs.aio.metadata.drain(messages.DrainRequest(server=str(reply.server_id))))
        now = time.monotonic()
        if reply.chunks < least:
            least, moved = reply.chunks, now
        if reply.chunks != printed or now - shown >= 10:  # a line per change, else one every 10 s
            print(f"  {reply.chunks} chunks left", file=sys.stderr, flush=True)
            shown, printed = now, reply.chunks
    print(f"chunk server {reply.server_id} holds no chunk the cluster needs: it can be stopped")


def cmd_gc(args: argparse.Namespace) -> None:
    from tectofs.checkpoint_gc import gc_pending

    address = _meta_address(args)
    if args.credentials:
        os.environ["TECTOFS_CREDENTIALS"] = args.credentials  # the torch helpers connect by URI
    removed = gc_pending(f"tectofs://{address}{args.path}", args.older_than, recursive=True, dry_run=args.dry_run)
    for uri in removed:
        print(f"{'would remove' if args.dry_run else 'removed'} {output.shown(uri)}")
    print(f"{len(removed)} leftovers of interrupted checkpoint saves {'found' if args.dry_run else 'removed'}")


def cmd_init(args: argparse.Namespace) -> None:
    from tectofs.wire import auth

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
    from tectofs.wire import auth, messages

    address = _meta_address(args)
    groups = args.groups
    with _client(args) as fs:
        reply = fs.run(fs.aio.metadata.user_add(messages.UserAddRequest(
            name=args.name, uid=args.uid, gid=args.gid, groups=list(groups), admin=args.admin, proxy=args.proxy)))
    out = args.out or f"{args.name}.credentials"
    auth.Credential(user=args.name, secret=reply.secret, cluster=address, s3_access_key=reply.user.s3_access_key or "",
                    s3_secret_key=reply.s3_secret_key).save(out)
    print(f"user {args.name} (uid {args.uid}, gid {args.gid}{', groups ' + ','.join(map(str, groups)) if groups else ''})"
          f" added; credential written to {out} (mode 0600): give it to the user, who passes --credentials FILE,"
          f" sets TECTOFS_CREDENTIALS, or copies it to {auth.default_credential_path(address)} in their home")
    print(f"S3 access key: {reply.user.s3_access_key} (its secret is in the credential file)")


def cmd_user_list(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        reply = fs.run(fs.aio.metadata.user_list())
    print(f"{'name':<24} {'uid':>8} {'gid':>8}  groups  flags")
    for u in reply.users:
        flags = ",".join(f for f, on in (("admin", u.admin), ("proxy", u.proxy)) if on) or "-"
        print(f"{output.shown(u.name):<24} {u.uid:>8} {u.gid:>8}  {','.join(map(str, u.groups)) or '-'}  {flags}")
    if reply.more:
        print("(more users than one reply holds)")


def cmd_user_remove(args: argparse.Namespace) -> None:
    from tectofs.wire import messages

    with _client(args) as fs:
        fs.run(fs.aio.metadata.user_remove(messages.UserNameRequest(name=args.name)))
    print(f"user {args.name} removed: its credential no longer opens connections (open ones live on until closed)")


def cmd_whoami(args: argparse.Namespace) -> None:
    with _client(args) as fs:
        me = fs.run(fs.aio.metadata.whoami())
    print(f"{output.shown(me.name)} (uid {me.uid}, gid {me.gid}, groups {','.join(map(str, me.groups)) or '-'})"
          + (" admin" if me.admin else "") + (" proxy" if me.proxy else ""))


def cmd_key(args: argparse.Namespace) -> None:
    from tectofs.wire import auth

    ids = auth.edit_key_file(args.key_file, add=args.key_command == "add",
                             use=args.id if args.key_command == "use" else None,
                             remove=args.id if args.key_command == "remove" else None)
    print(f"{args.key_file}: keys {', '.join(ids)} ({ids[0]} signs). Running services re-read the file within a"
          " second; copy it to every server host.")


def cmd_bench(args: argparse.Namespace) -> None:
    from tectofs.benchmarks.run import main as bench_main

    raise SystemExit(bench_main(args.bench_args))


def add_parsers(sub: Any) -> None:
    client_command(sub, "status", cmd_status, "show chunk servers, block health, rebuilds, scrub progress",
                   json_output=True)
    p = client_command(sub, "fsck", cmd_fsck, "check every block below PATH: healthy, under-redundant or unreadable;"
                       " exit 0 only if all are fully redundant (1: some under-redundant, 2: some unreadable)",
                       json_output=True)
    p.add_argument("path", nargs="?", default="/", help="where to check, recursively (default /)")
    admin = sub.add_parser("admin", help="cluster administration (drain)", description="Cluster administration.")
    admin_sub = admin.add_subparsers(dest="admin_command", required=True, metavar="ADMIN_COMMAND")
    p = admin_sub.add_parser("drain", help="move every chunk off a chunk server so it can be stopped safely",
                             description="Move every chunk off a chunk server (it takes no new ones); when done it"
                             " can be stopped with no loss of redundancy. Progress: tectofs status.")
    p.add_argument("server", help="the server's id, uuid or address (tectofs status lists them)")
    add_client_flags(p)
    p.add_argument("--cancel", action="store_true", help="stop draining: the server takes new chunks again")
    p.add_argument("--wait", action="store_true", help="wait until the server holds no chunk, showing progress")
    p.add_argument("--timeout", type=numbers.seconds(), default=600.0,
                   help="with --wait, give up once no chunk has moved off the server for this many seconds"
                   " (default 600; the server goes on draining)")
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
    p.add_argument("name", help="user name (what 'whoami' and 'user list' show)")
    p.add_argument("--uid", type=numbers.OWNER_ID, required=True, help="the user's uid in the cluster")
    p.add_argument("--gid", type=numbers.OWNER_ID, required=True, help="the user's primary gid")
    p.add_argument("--groups", type=numbers.ListOf(numbers.OWNER_ID), default=[], help="supplementary gids, comma-separated")
    p.add_argument("--admin", action="store_true", help="may add and remove users and drain servers")
    p.add_argument("--proxy", action="store_true",
                   help="may act for other uids (the credential of a multi-user FUSE mount on a node)")
    p.add_argument("--out", help="credential file to write (default ./NAME.credentials)")
    add_client_flags(p)
    p.set_defaults(fn=cmd_user_add)
    p = users_sub.add_parser("list", help="list users", description="List users: name, uid, gid, groups, flags.")
    add_client_flags(p)
    p.set_defaults(fn=cmd_user_list)
    p = users_sub.add_parser("remove", help="remove a user (its credential stops working)",
                             description="Remove a user: new connections with its credential are refused (open ones"
                             " live until closed).")
    p.add_argument("name", help="user name")
    add_client_flags(p)
    p.set_defaults(fn=cmd_user_remove)
    client_command(sub, "whoami", cmd_whoami, "show who the credential in use makes you")
    keys = sub.add_parser("key", help="rotate the cluster key (add, use, remove)",
                          description="Key rotation, with two valid keys at a time: 'add' a new key, copy the file to"
                          " every server host, 'use' it (it signs from then on), wait for the capability lifetime"
                          " (1 h by default), then 'remove' the old one. Running services re-read the file.")
    keys_sub = keys.add_subparsers(dest="key_command", required=True, metavar="KEY_COMMAND")
    for name, text in (("add", "add a new key (accepted, not yet signing)"), ("use", "make key ID the signing key"),
                       ("remove", "remove key ID")):
        p = keys_sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        if name != "add":
            p.add_argument("id", help="key id (the file lists them: 'tectofs-key ID HEX')")
        p.add_argument("--key-file", required=True, help="the cluster key file to edit")
        p.set_defaults(fn=cmd_key)
    p = client_command(sub, "gc", cmd_gc, "remove leftovers of interrupted checkpoint saves (pending directories)")
    p.add_argument("path", nargs="?", default="/", help="where to look, recursively (default /)")
    # Same default as the writer's own clean-up (tectofs.checkpoint_gc.PENDING_GRACE_S, not
    # imported for every command's --help; test_cli_options checks they agree). A failed save
    # deletes its pending directory itself; only crashed saves leave one.
    p.add_argument("--older-than", type=numbers.seconds(), default=24 * 3600.0,
                   help="only leftovers untouched for this many seconds (default 86400 = 24 h, as the "
                        "automatic clean-up after each checkpoint commit; use less only when no save is running)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed")
    p = sub.add_parser("bench", help="run benchmarks (client-io, checkpoint, fuse, burst, all); 'tectofs bench --help'",
                       add_help=False)
    p.add_argument("bench_args", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
