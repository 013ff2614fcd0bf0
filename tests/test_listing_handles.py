"""A listing hands out only what a lookup would (issue 51, part 2): ``readdir`` needs read
permission on a directory, a lookup in it search permission. Alice may read but not search
root's ``/rx`` (0744): she gets the names (with inode numbers and types, as ``getdents``), and
no file handle nor attribute of any entry, so she can read neither ``/rx/in.bin`` (chunks) nor
``/rx/small.bin`` (inline) by inode number, as she can read neither by path.

Real processes: the cluster fixture's metadata service and chunk servers, a user made with
``tectofs user add``, calls through the client library (with and without leases), through
fsspec and through a bare authenticated ``RpcClient`` (frames from plain dicts).
"""

from __future__ import annotations

import asyncio
import os
import stat as statmod
import subprocess
import sys
import time
from typing import Any, Iterator

import fsspec
import pytest

from tectofs.client import Stat, connect
from tectofs.client.files import AsyncFile
from tectofs.client.sync import FileSystem
from tectofs.errors import PermissionDenied, TectofsError
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient

MiB = 1 << 20
ALICE = 1000


@pytest.fixture(scope="module")
def alice_credentials(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("alice") / "alice.credentials")
    subprocess.run([sys.executable, "-m", "tectofs.cli", "user", "add", "alice", "--uid", str(ALICE), "--gid",
                    str(ALICE), "--out", path], env={**os.environ, "TECTOFS_META": cluster.address}, check=True,
                   capture_output=True, timeout=60)
    return path


@pytest.fixture(scope="module")
def tree(cluster: Any) -> dict[str, bytes]:
    """Root's /rx (0744: alice reads it, may not search it) with in.bin (chunks) and
    small.bin (inline), both 0644; and /pub (0755) with open.bin, which alice may reach."""
    return make_tree(cluster.fs)


def make_tree(fs: Any) -> dict[str, bytes]:
    """Make the tree of :func:`tree` through ``fs`` (root's); return the victims' bytes by name."""
    victims = {"in.bin": os.urandom(MiB + 4321), "small.bin": os.urandom(3000)}
    fs.mkdir("/rx", mode=0o744)
    fs.chmod("/rx", 0o744)
    for name, data in victims.items():
        fs.write_bytes(f"/rx/{name}", data)
        fs.chmod(f"/rx/{name}", 0o644)
    fs.mkdir("/pub", mode=0o755)
    fs.write_bytes("/pub/open.bin", b"anyone may read this")
    fs.chmod("/pub/open.bin", 0o644)
    return victims


@pytest.fixture(params=[False, True], ids=["no-leases", "leases"])
def alice(cluster: Any, alice_credentials: str, request: pytest.FixtureRequest) -> Iterator[FileSystem]:
    with connect(cluster.address, credentials=alice_credentials, leases=request.param) as fs:
        if request.param:  # a service just started grants no lease for a while: wait until it caches
            deadline = time.monotonic() + 30
            while not isinstance((cache := fs.aio._cached()) and cache.lookup("/"), Stat):
                assert time.monotonic() < deadline, "alice's client never held a lease"
                fs.stat("/")
                time.sleep(0.05)
        yield fs


def _steal(fs: FileSystem, ino: int, handle: bytes) -> bytes | str:
    """Inode ``ino``'s bytes read by number with ``handle``, as an attacker would: its layout,
    then its blocks (inline, or chunks with the layout's capabilities); or the refusal."""
    async def read() -> bytes:
        layout = await fs.aio.metadata.layout(messages.LayoutRequest(ino=ino, handle=handle))
        file = AsyncFile(fs.aio._file_context(), f"inode {ino}", layout, True, False, False)
        try:
            return await file.read(0, layout.attrs.size)
        finally:
            await file.close()

    try:
        return fs.run(read())  # type: ignore[no-any-return]
    except TectofsError as exc:
        return f"{type(exc).__name__}: {exc}"


def test_a_listing_of_a_directory_alice_may_not_search_gives_her_names_and_no_handles(
        cluster: Any, tree: dict[str, bytes], alice: FileSystem) -> None:
    assert alice.stat("/rx").mode & 0o777 == 0o744  # (a lease-holding client's cache now resolves /rx)
    assert alice.listdir("/rx") == ["in.bin", "small.bin"]
    reply = alice.run(alice.aio.metadata.readdir(messages.ReaddirRequest(path="/rx")))
    entries = {e.name: e.attrs for e in reply.entries}
    assert sorted(entries) == ["in.bin", "small.bin"]
    for name, data in tree.items():
        attrs = entries[name]
        for handle in (attrs.handle, os.urandom(16)):
            stolen = _steal(alice, attrs.ino, handle)
            assert stolen != data, f"alice read {name} by inode number with a handle from the listing"
            assert isinstance(stolen, str) and stolen.startswith("PermissionDenied: inode"), stolen
        owner = cluster.fs.stat(f"/rx/{name}")
        assert (attrs.ino, attrs.kind, attrs.mode) == (owner.ino, "file", statmod.S_IFREG)  # getdents' d_ino, d_type
        assert (attrs.handle, attrs.size, attrs.uid, attrs.nlink, attrs.mtime) == (b"", 0, 0, 0, 0.0)
    for name in tree:
        with pytest.raises(PermissionDenied, match="needs search permission on /rx"):
            alice.read_bytes(f"/rx/{name}")
        with pytest.raises(PermissionDenied, match="needs search permission on /rx"):
            alice.stat(f"/rx/{name}")  # a lease-holding client's cached listing answers no lookup there
    # The bytes are intact and root, the owner, lists everything.
    for name, data in tree.items():
        assert cluster.fs.read_bytes(f"/rx/{name}") == data
    assert {name: st.size for name, st in cluster.fs.scandir("/rx")} == {n: len(d) for n, d in tree.items()}


def test_a_listing_of_a_directory_alice_may_search_still_gives_handles(tree: dict[str, bytes], alice: FileSystem) -> None:
    """The rule takes nothing from a searchable directory: attributes and a working handle."""
    alice.stat("/pub")
    [(name, listed)] = alice.scandir("/pub")
    assert (name, listed.size, listed.mode & 0o777, listed.nlink) == ("open.bin", 20, 0o644, 1)
    cache = alice.aio._cached()
    if cache is not None:  # a lease-holding client keeps this listing, and answers from it
        assert isinstance(cache.listing("/pub"), list) and cache.lookup("/pub/open.bin") == listed
    reply = alice.run(alice.aio.metadata.readdir(messages.ReaddirRequest(path="/pub")))
    [entry] = reply.entries
    assert entry.attrs.handle
    assert _steal(alice, entry.attrs.ino, entry.attrs.handle) == b"anyone may read this"


def test_raw_frames_get_no_handles_from_the_listing(cluster: Any, tree: dict[str, bytes], alice_credentials: str) -> None:
    """The same readdir, then getattr and layout by number, as plain dicts on a bare
    authenticated connection: no client library in between."""
    async def attack() -> tuple[list[dict[str, Any]], list[str]]:
        rpc = RpcClient(retries_max=0, timeout_s=10)
        rpc.authenticate(cluster.address, auth.ClientAuth(credential=auth.Credential.load(alice_credentials)))
        try:
            header, _ = await rpc.call_raw(cluster.address, "readdir", {"path": "/rx"}, idempotent=True)
            entries = header["entries"]
            answers = []
            for entry in entries:
                fields = {"ino": entry["attrs"]["ino"], "handle": entry["attrs"].get("handle", b"")}
                for op in ("getattr", "layout"):
                    try:
                        reply, payload = await rpc.call_raw(cluster.address, op, fields, idempotent=True)
                        leaked = [n for n, data in tree.items() if data in bytes(payload) or data in repr(reply).encode()]
                        answers.append(f"LEAKED {op}: {leaked or reply}")
                    except PermissionDenied as exc:
                        answers.append(str(exc))
            return entries, answers
        finally:
            await rpc.close()

    entries, answers = asyncio.run(asyncio.wait_for(attack(), 60))
    assert sorted(e["name"] for e in entries) == ["in.bin", "small.bin"]
    assert all(not e["attrs"].get("handle") for e in entries)
    assert len(answers) == 4 and all("no valid file handle for uid 1000" in a for a in answers), answers


def test_fsspec_lists_names_and_refuses_the_entries(cluster: Any, tree: dict[str, bytes], alice_credentials: str) -> None:
    alice = fsspec.filesystem("tectofs", meta=cluster.address, credentials=alice_credentials, skip_instance_cache=True)
    assert sorted(alice.ls("/rx", detail=False)) == ["/rx/in.bin", "/rx/small.bin"]
    assert {entry["size"] for entry in alice.ls("/rx", detail=True)} == {0}  # nothing of the files told
    for name in tree:
        with pytest.raises(PermissionError):
            alice.cat_file(f"/rx/{name}")
        with pytest.raises(PermissionError):
            alice.info(f"/rx/{name}")
