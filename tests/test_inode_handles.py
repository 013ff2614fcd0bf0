"""Inode numbers are not capabilities (issue 29, part 1): a user who scans them learns nothing
about an inode it could not reach by path, and cannot read, allocate, stage, commit, renew,
release or grade one; calls naming an inode carry the file handle (``tectofs.wire.auth``) that a
checked lookup issued to that uid. What a handle does grant keeps working as an open
descriptor does on Linux: after a chmod or rename of a parent, and after an unlink. And a user
may hard-link only what Linux's ``fs.protected_hardlinks = 1`` lets it.

Real processes: the cluster fixture's metadata service and chunk servers, users made with
``user_add``, calls through the client library (``fs.aio.meta``) and through a bare
authenticated ``RpcClient`` (frames built from plain dicts, no library in between).
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any, Iterator

import pytest

from tectofs.client import connect
from tectofs.client.sync import FileSystem
from tectofs.errors import NotPermitted, PermissionDenied, StaleFile, TectofsError
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient

MiB = 1 << 20
SCAN_TO = 64  # inode numbers scanned: every inode this module's cluster has, and some it has not


def _user(cluster: Any, tmp_path_factory: pytest.TempPathFactory, name: str, uid: int, proxy: bool = False) -> str:
    path = str(tmp_path_factory.mktemp(name) / f"{name}.credentials")
    reply = cluster.fs.run(cluster.fs.aio.metadata.user_add(
        messages.UserAddRequest(name=name, uid=uid, gid=uid, groups=[], proxy=proxy)))
    auth.Credential(user=name, secret=reply.secret, cluster=cluster.address).save(path)
    return path


@pytest.fixture(scope="module")
def users(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return {"eve": _user(cluster, tmp_path_factory, "eve", 1000),
            "dan": _user(cluster, tmp_path_factory, "dan", 1001),
            "node": _user(cluster, tmp_path_factory, "node", 500, proxy=True)}


@pytest.fixture(scope="module")
def tree(cluster: Any) -> dict[str, Any]:
    """Root's /rootdir (0700) holding inner.bin (0644) and inner-rw.bin (0666), and a 0777
    /pub that users may work in."""
    fs = cluster.fs
    data = os.urandom(MiB + 4321)
    fs.mkdir("/rootdir", mode=0o700)
    fs.write_bytes("/rootdir/inner.bin", data)
    fs.chmod("/rootdir/inner.bin", 0o644)
    fs.write_bytes("/rootdir/inner-rw.bin", data)
    fs.chmod("/rootdir/inner-rw.bin", 0o666)
    fs.mkdir("/pub", mode=0o777)
    fs.chmod("/pub", 0o777)
    return {"data": data, "inner": fs.stat("/rootdir/inner.bin").ino, "inner_rw": fs.stat("/rootdir/inner-rw.bin").ino}


@pytest.fixture
def eve(cluster: Any, users: dict[str, str]) -> Iterator[FileSystem]:
    with connect(cluster.address, credentials=users["eve"]) as fs:
        yield fs


def _intact(cluster: Any, tree: dict[str, Any]) -> None:
    for path in ("/rootdir/inner.bin", "/rootdir/inner-rw.bin"):
        assert cluster.fs.read_bytes(path) == tree["data"], path
        assert cluster.fs.stat(path).size == len(tree["data"]), path


def _by_number(ino: int, handle: bytes = b"") -> list[tuple[str, dict[str, Any]]]:
    """Every metadata call that names an inode by number, as an attacker would send it."""
    return [
        ("getattr", {"ino": ino, "handle": handle}),
        ("layout", {"ino": ino, "handle": handle}),
        ("layout", {"ino": ino, "handle": handle, "reader": 7}),
        ("allocate", {"ino": ino, "handle": handle, "count": 1, "writer": 7}),
        ("stage", {"ino": ino, "handle": handle, "writer": 7, "cut_from": 0}),
        ("commit", {"ino": ino, "handle": handle, "size": 0, "replace": True}),
        ("renew", {"ino": ino, "handle": handle, "writer": 7, "reader": 7}),
        ("release", {"ino": ino, "handle": handle, "reader": 7}),
        ("release_leases", {"leases": [[ino, 7, handle]]}),
        ("block_health", {"files": [[ino, handle]]}),
    ]


def _refusals(fs: FileSystem, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Each call's refusal, with the inode number masked: what the caller learns from it."""
    async def one(op: str, fields: dict[str, Any]) -> str:
        try:
            operation = messages.META_OPERATIONS[op]  # each operation of the table, as a caller sends it
            reply = await fs.aio.metadata.call(operation, operation.request(**{k: _typed(op, k, v) for k, v in fields.items()}))
        except PermissionDenied as exc:
            return re.sub(r"inode \d+", "inode N", f"{type(exc).__name__}: {exc}")
        except TectofsError as exc:  # anything but the handle refusal tells the caller something
            return f"LEAKED {type(exc).__name__}: {exc}"
        return f"LEAKED a reply: {reply}"

    async def every() -> list[str]:
        return list(await asyncio.gather(*(one(op, fields) for op, fields in calls)))

    return fs.run(every())  # type: ignore[no-any-return]


def _typed(op: str, key: str, value: Any) -> Any:
    if op == "release_leases" and key == "leases":
        return [messages.HeldLease(ino=ino, reader=reader, handle=handle) for ino, reader, handle in value]
    if op == "block_health" and key == "files":
        return [messages.FileRef(ino=ino, handle=handle) for ino, handle in value]
    return value


def test_scanning_inode_numbers_learns_and_changes_nothing(cluster: Any, tree: dict[str, Any], eve: FileSystem) -> None:
    with pytest.raises(PermissionDenied, match="search permission on /rootdir"):
        eve.read_bytes("/rootdir/inner.bin")
    answers = set()
    for ino in range(1, SCAN_TO + 1):
        answers.update(_refusals(eve, _by_number(ino)))
        answers.update(_refusals(eve, _by_number(ino, handle=os.urandom(16))))
    # One answer, the same for every number, whether an inode has it or not: nothing learnt.
    assert answers == {"PermissionDenied: inode N: no valid file handle for uid 1000 (an inode is named by number"
                       " only with the handle that came with its attributes from a lookup, create, open or listing)"}
    _intact(cluster, tree)


def test_raw_frames_naming_inodes_are_refused(cluster: Any, tree: dict[str, Any], users: dict[str, str]) -> None:
    """The same calls as plain dicts on a bare authenticated connection: no client library."""
    async def attack() -> list[str]:
        rpc = RpcClient(retries_max=0, timeout_s=10)
        rpc.authenticate(cluster.address, auth.ClientAuth(credential=auth.Credential.load(users["eve"])))
        answers = []
        try:
            for ino in (1, tree["inner"], tree["inner_rw"], 10**9):
                for op, fields in _by_number(ino) + _by_number(ino, handle=b"\0" * 16):
                    try:
                        header, _ = await rpc.call_raw(cluster.address, op, fields, idempotent=True)
                        answers.append(f"LEAKED {op}: {header}")
                    except PermissionDenied as exc:
                        answers.append(re.sub(r"inode \d+", "inode N", str(exc)))
                    except TectofsError as exc:
                        answers.append(f"LEAKED {op}: {type(exc).__name__}: {exc}")
        finally:
            await rpc.close()
        return answers

    answers = asyncio.run(asyncio.wait_for(attack(), 60))
    assert len(set(answers)) == 1 and "no valid file handle for uid 1000" in answers[0], set(answers)
    _intact(cluster, tree)


def test_a_handle_is_bound_to_its_inode_and_its_uid(cluster: Any, tree: dict[str, Any], users: dict[str, str],
                                                    eve: FileSystem) -> None:
    eve.write_bytes("/pub/eve.bin", b"eve's own")
    mine = eve.stat("/pub/eve.bin")
    assert len(mine.handle) == auth.HANDLE_BYTES
    reply = eve.run(eve.aio.metadata.getattr(messages.InoRequest(ino=mine.ino, handle=mine.handle)))
    assert (reply.attrs.ino, reply.attrs.size) == (mine.ino, 9)  # it works for its owner
    assert dict(eve.scandir("/pub"))["eve.bin"].handle == mine.handle  # a listing issues the same handle
    # A genuine handle does not name another inode ...
    assert set(_refusals(eve, _by_number(tree["inner_rw"], mine.handle))) == {
        next(iter(_refusals(eve, _by_number(tree["inner_rw"]))))}
    # ... nor serve another uid, even for the inode it was issued for.
    with connect(cluster.address, credentials=users["dan"]) as dan:
        refused = _refusals(dan, _by_number(mine.ino, mine.handle))
        assert all("no valid file handle for uid 1001" in answer for answer in refused), refused
        theirs = dan.stat("/pub/eve.bin")  # dan reaches it by path: a handle of its own
        assert theirs.handle != mine.handle
        reply = dan.run(dan.aio.metadata.getattr(messages.InoRequest(ino=theirs.ino, handle=theirs.handle)))
        assert reply.attrs.ino == mine.ino
    # Root (and cluster members) reach every inode by path anyway: none is asked of them.
    reply = cluster.fs.run(cluster.fs.aio.metadata.getattr(messages.InoRequest(ino=tree["inner"])))
    assert reply.attrs.size == len(tree["data"])
    eve.remove("/pub/eve.bin")


def test_an_open_file_outlives_chmod_and_rename_of_its_parent_and_its_unlink(cluster: Any, eve: FileSystem) -> None:
    """What a descriptor opened legitimately may do, it keeps doing (Linux): its handle was
    issued when the path was walked."""
    eve.mkdir("/pub/work", mode=0o777)
    cluster.fs.chmod("/pub/work", 0o777)
    eve.write_bytes("/pub/work/a.bin", b"a" * 1000)
    eve.write_bytes("/pub/work/b.bin", b"b" * 1000)

    async def hold_open() -> None:
        writer = await eve.aio.open("/pub/work/a.bin", "r+b")
        reader = await eve.aio.open("/pub/work/b.bin", "rb")
        cluster.fs.chown("/pub/work", 0, 0)
        cluster.fs.chmod("/pub/work", 0o700)  # eve may no longer search it ...
        with pytest.raises(PermissionDenied):
            await eve.aio.open("/pub/work/a.bin", "rb")
        await writer.write(0, b"still mine")  # ... but her open handles go on
        await writer.flush()  # allocate, write, commit: by number, with the handle
        assert await writer.read(0, 10) == b"still mine"
        cluster.fs.rename("/pub/work", "/pub/moved")
        await writer.write(100, b"after rename")
        await writer.close()
        cluster.fs.remove("/pub/moved/b.bin")  # open-unlinked: the reader's lease keeps it
        assert await reader.read(0, 1000) == b"b" * 1000
        await reader.close()

    eve.run(hold_open())
    data = cluster.fs.read_bytes("/pub/moved/a.bin")
    assert data[:10] == b"still mine" and data[100:112] == b"after rename" and len(data) == 1000
    assert not cluster.fs.exists("/pub/moved/b.bin")
    cluster.fs.rmtree("/pub/moved")


def test_hard_links_follow_protected_hardlinks(cluster: Any, eve: FileSystem) -> None:
    fs = cluster.fs
    fs.mkdir("/links", mode=0o755)
    for name, mode in (("private", 0o600), ("readable", 0o644), ("shared", 0o666), ("setuid", 0o4666),
                       ("setgid", 0o2676)):
        fs.write_bytes(f"/links/{name}", name.encode())
        fs.chmod(f"/links/{name}", mode)
    eve.mkdir("/pub/mine", mode=0o755)
    for name in ("private", "readable", "setuid", "setgid"):  # not both readable and writable by her, or set-id
        with pytest.raises(NotPermitted, match="may link only files it owns"):
            eve.link(f"/links/{name}", f"/pub/mine/{name}")
    eve.link("/links/shared", "/pub/mine/shared")  # a plain file she may read and write: as Linux allows
    eve.write_bytes("/pub/mine/own", b"own")
    eve.chmod("/pub/mine/own", 0o400)
    eve.link("/pub/mine/own", "/pub/mine/own2")  # her own, whatever its mode
    fs.link("/links/private", "/links/private2")  # root links anything
    # The refused link kept nothing alive: root's file goes when root deletes it.
    fs.remove("/links/private")
    fs.remove("/links/private2")
    assert sorted(fs.listdir("/links")) == ["readable", "setgid", "setuid", "shared"]
    assert sorted(eve.listdir("/pub/mine")) == ["own", "own2", "shared"]
    assert eve.read_bytes("/pub/mine/shared") == b"shared"
    fs.rmtree("/pub/mine")
    fs.rmtree("/links")


def test_a_listing_s_handles_are_the_single_inode_ones() -> None:
    """``file_handles`` (a listing's, made once per reply) gives every inode the handle
    ``file_handle`` gives it, for that uid only."""
    ring = auth.KeyRing.from_keys([("k", os.urandom(32))])
    of_1000 = auth.file_handles(ring, 1000)
    for ino in (1, 2, 77, 2**40, 2**63 - 1):
        assert of_1000(ino) == auth.file_handle(ring, 1000, ino)
        assert auth.check_file_handle(ring, 1000, ino, of_1000(ino))
        assert not auth.check_file_handle(ring, 1001, ino, of_1000(ino))


def test_a_non_root_multi_user_mount_ends_its_users_leases(cluster: Any, tree: dict[str, Any], users: dict[str, str]) -> None:
    """A multi-user mount run with a non-root proxy credential ends the leases of handles its
    users opened on its own connection (``LeaseEndings``): with the handles issued to those
    users, which only a proxy may show for another uid. A file unlinked while open then goes
    at its close, not a lease time later."""
    with connect(cluster.address, credentials=users["node"]) as node:
        async def open_unlink_close() -> int:
            as_eve = node.aio.acting_as(1000, 1000)
            handle = await as_eve.open("/pub/held.bin", "wb")
            await handle.write(0, b"held")
            await handle.flush()
            cluster.fs.remove("/pub/held.bin")  # still open: it lives on, with no name
            await handle.close()
            await node.aio.lease_endings.flush()
            return handle.ino

        ino = node.run(open_unlink_close())
    with pytest.raises(StaleFile):  # gone at its close: its lease was ended
        cluster.fs.run(cluster.fs.aio.metadata.getattr(messages.InoRequest(ino=ino)))
    # The uid a lease names counts for proxies only: eve cannot end dan's leases by naming dan.
    with connect(cluster.address, credentials=users["dan"]) as dan:
        dan.write_bytes("/pub/dan.bin", b"dan")
        theirs = dan.stat("/pub/dan.bin")
    with connect(cluster.address, credentials=users["eve"]) as eve:
        lease = messages.HeldLease(ino=theirs.ino, reader=7, handle=theirs.handle, uid=1001)
        with pytest.raises(PermissionDenied, match="no valid file handle for uid 1000"):
            eve.run(eve.aio.metadata.release_leases(messages.ReleaseLeasesRequest(leases=[lease])))
    cluster.fs.remove("/pub/dan.bin")
