"""The attacks of the security issue, each refused with the right error, on a real cluster:
unauthenticated operations, chunk deletes from clients, forged, mismatched and expired
capabilities, rogue server registration and identity takeover, a crc-forged overwrite,
another uid's 0600 file and 0700 directory, non-owner chmod/chown, impostor servers, stale
and borrowed credentials. After every attack the victim's file still reads back bit-exact.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest

from tectofs import checksum, limits, private_files
from tectofs.client import connect
from tectofs.errors import (
    AlreadyExists,
    AuthenticationFailed,
    CapabilityExpired,
    CapabilityRefused,
    InvalidArgument,
    NotPermitted,
    PermissionDenied,
)
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient
from tectofs.wire.server import RpcServer
from tests.rpc_doubles import answering

MiB = 1 << 20


def _run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _call(address: str, op: str, fields: dict[str, Any], client_auth: auth.ClientAuth | None = None,
                payload: bytes = b"") -> Any:
    rpc = RpcClient(retries_max=0, timeout_s=10)
    if client_auth is not None:
        rpc.authenticate(address, client_auth)
    try:
        return await rpc.call_raw(address, op, fields, payload, idempotent=True)
    finally:
        await rpc.close()


@pytest.fixture(scope="module")
def victim(cluster: Any) -> dict[str, Any]:
    """A root-owned 0600 file of 3 blocks in a 0700 directory, a 0644 file, a 01777 directory,
    and the layout of the 0644 one (what an attacker allowed to read it holds)."""
    fs = cluster.fs
    data = os.urandom(3 * MiB - 1000)
    fs.mkdir("/secret", mode=0o700)
    fs.write_bytes("/secret/weights.pt", data)
    fs.write_bytes("/private.pt", data)
    fs.chmod("/private.pt", 0o600)
    fs.write_bytes("/public.pt", data)
    fs.chmod("/public.pt", 0o644)
    fs.mkdir("/shared", mode=0o1777)
    layout = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path="/public.pt")))
    return {"data": data, "layout": layout}


@pytest.fixture(scope="module")
def alice(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A non-root user's credential file (uid 1000, gid 1000)."""
    path = str(tmp_path_factory.mktemp("alice") / "alice.credentials")
    reply = cluster.fs.run(cluster.fs.aio.metadata.user_add(messages.UserAddRequest(name="alice", uid=1000, gid=1000, groups=[])))
    auth.Credential(user="alice", secret=reply.secret, cluster=cluster.address).save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    return path


def _intact(cluster: Any, victim: dict[str, Any]) -> None:
    for path in ("/secret/weights.pt", "/private.pt", "/public.pt"):
        assert cluster.fs.read_bytes(path) == victim["data"], path


def _chunk_address(layout: messages.LayoutSegment) -> tuple[messages.Block, str]:
    block = layout.blocks[0]
    address = next(c.address for c in block.chunks if c.position == 0)
    assert address is not None, "chunk 0 is on a server no longer registered"
    return block, address


# ---------------------------------------------------------------------- no credential


def test_anonymous_peer_gets_nothing_from_the_metadata_service(cluster: Any, victim: dict[str, Any]) -> None:
    for op, fields in (("lookup", {"path": "/private.pt"}), ("layout", {"path": "/public.pt"}),
                       ("unlink", {"path": "/public.pt"}), ("servers", {}), ("readdir", {"path": "/"})):
        with pytest.raises(PermissionDenied, match="not authenticated"):
            _run(_call(cluster.address, op, fields))
    header, _ = _run(_call(cluster.address, "ping", {}))  # liveness stays public
    assert header == {"ok": True}
    _intact(cluster, victim)


def test_client_without_credential_is_told_what_to_do(cluster: Any, tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("TECTOFS_CONFIG_DIR", str(tmp_path))  # no root credential there
    monkeypatch.delenv("TECTOFS_CREDENTIALS", raising=False)
    with connect(cluster.address) as fs:
        with pytest.raises(PermissionDenied, match="--credentials"):
            fs.stat("/")


def test_chunk_deletes_come_only_from_the_metadata_service(cluster: Any, victim: dict[str, Any], alice: str) -> None:
    block, address = _chunk_address(victim["layout"])
    with pytest.raises(PermissionDenied, match="only on the metadata service's orders"):
        _run(_call(address, "delete_chunks", {"block_ids": [block.block_id]}))
    # A user credential does not open a chunk server either: only the cluster key does.
    with pytest.raises(AuthenticationFailed):
        _run(_call(address, "delete_chunks", {"block_ids": [block.block_id]},
                   auth.ClientAuth(credential=auth.Credential.load(alice))))
    _intact(cluster, victim)


# ---------------------------------------------------------------------- capabilities


def test_gets_need_a_genuine_capability_for_that_block(cluster: Any, victim: dict[str, Any]) -> None:
    block, address = _chunk_address(victim["layout"])
    other = victim["layout"].blocks[1]
    assert block.cap is not None and other.cap is not None
    with pytest.raises(CapabilityRefused, match="no capability"):
        _run(_call(address, "get_chunk", {"block_id": block.block_id}))
    forged = {"mac": os.urandom(16), "expiry": block.cap.expiry, "key": block.cap.key}
    with pytest.raises(CapabilityRefused, match="forged"):
        _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": forged}))
    stretched = {**messages.to_plain(block.cap), "expiry": block.cap.expiry + 10**6}  # a later expiry: not signed
    with pytest.raises(CapabilityRefused, match="forged"):
        _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": stretched}))
    borrowed = messages.to_plain(other.cap)  # genuine, but for another block
    with pytest.raises(CapabilityRefused):
        _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": borrowed}))
    unknown_key = {**messages.to_plain(block.cap), "key": "k-not-ours"}
    with pytest.raises(CapabilityRefused, match="unknown key"):
        _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": unknown_key}))
    header, payload = _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": messages.to_plain(block.cap)}))
    assert header["position"] == 0 and len(payload) == header["chunk_length"]


def test_crc_forged_overwrite_is_refused(cluster: Any, victim: dict[str, Any], alice: str) -> None:
    """The attack of the issue: read a data chunk, change bytes, fix the crc32c to the value
    the metadata service recorded, put it back with overwrite. Refused: a read capability is
    not a write one, and nobody but a rebuild (a cluster member) replaces a stored chunk."""
    block, address = _chunk_address(victim["layout"])
    header, payload = _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": messages.to_plain(block.cap)}))
    forged = bytearray(payload)
    forged[:5] = b"EVIL!"
    fields = {"block_id": block.block_id, "position": 0, "crcs": checksum.piece_crcs(forged),
              "crc": header["crc"], "overwrite": True}
    with pytest.raises(CapabilityRefused, match="without a valid capability"):  # refused before its bytes are kept
        _run(_call(address, "put_chunk", fields, payload=bytes(forged)))
    with pytest.raises(CapabilityRefused, match="forged or mismatched"):  # the read capability, used to write
        _run(_call(address, "put_chunk", {**fields, "cap": messages.to_plain(block.cap)}, payload=bytes(forged)))
    # Even a genuine write capability for that very block (its writer's) cannot replace it.
    with connect(cluster.address, credentials=alice) as fs:
        fs.write_bytes("/shared/alice.bin", b"x" * 1000)
        mine = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path="/shared/alice.bin")))
    ring = auth.KeyRing(cluster.key_file)
    expiry = auth.capability_expiry(60)
    key_id, tag = auth.sign_capability(ring, block.block_id, "w", expiry)
    with pytest.raises(AlreadyExists, match="already stored with other content"):
        _run(_call(address, "put_chunk", {**fields, "cap": {"mac": tag, "expiry": expiry, "key": key_id}},
                   payload=bytes(forged)))
    with pytest.raises(CapabilityRefused):  # alice's own block's capability does not reach root's block
        _run(_call(address, "put_chunk", {**fields, "cap": messages.to_plain(mine.blocks[0].cap)}, payload=bytes(forged)))
    _intact(cluster, victim)


def test_expired_capabilities_are_refused_and_open_readers_renew_them(make_cluster: Any) -> None:
    c = make_cluster(servers=6, meta_args=["--capability-ttl", "2"])
    data = os.urandom(2 * MiB + 17)
    c.fs.write_bytes("/f", data)
    layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path="/f")))
    block, address = _chunk_address(layout)
    with c.fs.open("/f", "rb") as f:
        assert f.read(MiB) == data[:MiB]
        time.sleep(3.5)
        with pytest.raises(CapabilityExpired, match="expired"):
            _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": messages.to_plain(block.cap)}))
        assert f.read() == data[MiB:]  # the open handle fetched fresh capabilities and went on


# ---------------------------------------------------------------------- cluster membership


def test_rogue_server_cannot_register_or_take_an_identity(cluster: Any, alice: str, tmp_path: Any) -> None:
    servers_before = cluster.fs.servers()
    victim_uuid = servers_before[0].uuid
    register = {"uuid": victim_uuid, "address": "127.0.0.1:9", "capacity": 1 << 50, "used": 0}
    with pytest.raises(PermissionDenied, match="not authenticated"):
        _run(_call(cluster.address, "register_server", register))
    with pytest.raises(PermissionDenied, match="only the cluster's own servers"):
        _run(_call(cluster.address, "register_server", register, auth.ClientAuth(credential=auth.Credential.load(alice))))
    root = auth.ClientAuth(credential=auth.Credential.load(cluster.credential_file))
    with pytest.raises(PermissionDenied, match="only the cluster's own servers"):  # even root is not a server
        _run(_call(cluster.address, "register_server", {**register, "uuid": "new-eavesdropper"}, root))
    for who in (root, auth.ClientAuth(credential=auth.Credential.load(alice))):  # nor may read users' S3 secrets
        with pytest.raises(PermissionDenied, match="only the cluster's own servers"):
            _run(_call(cluster.address, "s3_principal", {"access_key": "root"}, who))
    header, _ = _run(_call(cluster.address, "s3_principal", {"access_key": "root"},
                           auth.ClientAuth(ring=auth.KeyRing(cluster.key_file))))  # a key holder may (the gateway)
    assert header["user"]["uid"] == 0 and len(header["secret_key"]) == 64
    with pytest.raises(PermissionDenied):
        _run(_call(cluster.address, "heartbeat", {"server_id": servers_before[0].server_id, "address": "127.0.0.1:9",
                                                  "capacity": 1 << 50, "used": 0, "inflight": 0, "chunks": 0}, root))
    other_cluster = auth.KeyRing(auth.create_key_file(str(tmp_path / "other.key")))
    with pytest.raises(AuthenticationFailed, match="unknown cluster key"):
        _run(_call(cluster.address, "register_server", register, auth.ClientAuth(ring=other_cluster)))
    # Same key id, other secret: the proof does not check out (the server's proof neither).
    stolen_id = auth.KeyRing(cluster.key_file).signing[0]
    impostor = auth.KeyRing.from_keys([(stolen_id, os.urandom(32))])
    with pytest.raises(AuthenticationFailed):
        _run(_call(cluster.address, "register_server", register, auth.ClientAuth(ring=impostor)))
    after = {s.uuid: s.address for s in cluster.fs.servers()}
    assert after == {s.uuid: s.address for s in servers_before}
    assert "new-eavesdropper" not in after


def test_a_server_that_cannot_prove_the_key_is_not_believed(cluster: Any) -> None:
    """Mutual authentication: a chunk server (or client) talking to an impostor metadata
    service that does not hold the key stops at the hello (it would obey its GC orders)."""

    class Impostor:
        async def resolve(self, claim: messages.HelloAuth) -> tuple[bytes, auth.Peer]:
            return os.urandom(32), auth.MEMBER  # pretends to know the key

        async def rpc_ping(self, request: Any, payload: Any) -> Any:
            return messages.PingReply(), b""

    async def attempt() -> None:
        impostor = Impostor()
        ops = {"hello": messages.HELLO, "ping": messages.META_OPERATIONS["ping"]}
        server = RpcServer(impostor, "impostor", ops, "meta", answering(impostor.rpc_ping, ops), authenticator=impostor)
        address = await server.start("127.0.0.1", 0)
        try:
            await _call(address, "ping", {}, auth.ClientAuth(ring=auth.KeyRing(cluster.key_file)))
        finally:
            await server.close()

    with pytest.raises(AuthenticationFailed, match="could not prove"):
        _run(attempt())


# ---------------------------------------------------------------------- users and permissions


def test_other_users_get_what_posix_gives_them(cluster: Any, victim: dict[str, Any], alice: str) -> None:
    with connect(cluster.address, credentials=alice) as fs:
        me = fs.run(fs.aio.metadata.whoami())
        assert (me.name, me.uid, me.gid, me.admin) == ("alice", 1000, 1000, False)
        with pytest.raises(PermissionDenied):
            fs.read_bytes("/private.pt")  # root's 0600 file
        with pytest.raises(PermissionDenied):
            fs.read_bytes("/secret/weights.pt")  # inside root's 0700 directory
        with pytest.raises(PermissionDenied):
            fs.write_bytes("/secret/mine.bin", b"x")
        with pytest.raises(PermissionDenied):
            fs.listdir("/secret")
        with pytest.raises(PermissionDenied):
            fs.remove("/public.pt")  # root's file in root's 0755 directory
        with pytest.raises(PermissionDenied):
            fs.write_bytes("/public.pt", b"overwritten")  # 0644: others read, never write
        with pytest.raises(PermissionDenied):
            with fs.open("/public.pt", "r+b") as f:  # an empty commit would truncate it
                f.truncate(0)
        with pytest.raises(PermissionDenied):
            fs.mkdir("/alice-was-here")  # root's 0755 directory
        with pytest.raises(PermissionDenied):
            fs.mkdir("/secret/deeper/still", parents=True)
        with pytest.raises(NotPermitted):
            fs.chmod("/public.pt", 0o666)
        with pytest.raises(NotPermitted):
            fs.run(fs.aio.metadata.setattr(messages.SetattrRequest(path="/public.pt", uid=1000)))
        public = cluster.fs.stat("/public.pt").ino
        with pytest.raises(PermissionDenied, match="no valid file handle"):  # by number: only with its handle
            fs.run(fs.aio.metadata.setattr(messages.SetattrRequest(ino=public, mode=0o666)))
        with pytest.raises(InvalidArgument, match="names a path, or an inode"):
            fs.run(fs.aio.metadata.setattr(messages.SetattrRequest(mode=0o666)))
        with pytest.raises(PermissionDenied):
            fs.run(fs.aio.metadata.user_add(messages.UserAddRequest(name="mallory", uid=0, gid=0, groups=[])))
        with pytest.raises(PermissionDenied):
            fs.run(fs.aio.metadata.drain(messages.DrainRequest(server="1")))
        assert fs.read_bytes("/public.pt") == victim["data"]  # what others may read, they read
        fs.write_bytes("/shared/alice.txt", b"hello")
        st = fs.stat("/shared/alice.txt")
        assert (st.uid, st.gid) == (1000, 1000)
        fs.mkdir("/shared/alice-dir/sub", parents=True)
        assert (fs.stat("/shared/alice-dir/sub").uid, fs.stat("/shared/alice-dir").uid) == (1000, 1000)
        fs.chmod("/shared/alice.txt", 0o600)
    assert cluster.fs.read_bytes("/shared/alice.txt") == b"hello"  # root overrides
    _intact(cluster, victim)


def test_stale_wrong_and_borrowed_credentials(cluster: Any, alice: str, tmp_path: Any) -> None:
    good = auth.Credential.load(alice)
    wrong = auth.Credential(user="alice", secret=os.urandom(32), cluster=cluster.address)
    with pytest.raises(AuthenticationFailed, match="could not prove it shares the credential of user alice"):
        _run(_call(cluster.address, "whoami", {}, auth.ClientAuth(credential=wrong)))
    with pytest.raises(AuthenticationFailed, match="unknown user"):
        _run(_call(cluster.address, "whoami", {},
                   auth.ClientAuth(credential=auth.Credential(user="nosuch", secret=os.urandom(32)))))
    with pytest.raises(AuthenticationFailed, match="may not act for other users"):
        _run(_call(cluster.address, "whoami", {}, auth.ClientAuth(credential=good, act_as=(0, 0, ()))))
    reply = cluster.fs.run(cluster.fs.aio.metadata.user_add(messages.UserAddRequest(name="bob", uid=1001, gid=1001, groups=[])))
    bob = auth.Credential(user="bob", secret=reply.secret)
    header, _ = _run(_call(cluster.address, "whoami", {}, auth.ClientAuth(credential=bob)))
    assert header["uid"] == 1001
    cluster.fs.run(cluster.fs.aio.metadata.user_remove(messages.UserNameRequest(name="bob")))
    with pytest.raises(AuthenticationFailed, match="unknown user"):
        _run(_call(cluster.address, "whoami", {}, auth.ClientAuth(credential=bob)))
    # root's proxy credential may act for a local user; that connection has the user's rights.
    root = auth.Credential.load(cluster.credential_file)
    header, _ = _run(_call(cluster.address, "whoami", {}, auth.ClientAuth(credential=root, act_as=(1000, 1000, (5,)))))
    assert (header["uid"], header["gid"], header["groups"], header["admin"]) == (1000, 1000, [5], False)
    with pytest.raises(PermissionDenied):
        _run(_call(cluster.address, "layout", {"path": "/private.pt"},
                   auth.ClientAuth(credential=root, act_as=(1000, 1000, ()))))


def test_key_rotation_keeps_the_cluster_working(make_cluster: Any) -> None:
    """Two valid keys at a time: add a key, make it sign, remove the old one; running
    services follow the file, old capabilities stop working once their key is removed."""
    c = make_cluster(servers=6)
    big = limits.inline_bytes_default + 5000  # kept in chunks (a smaller file is kept inline: no capability)
    c.fs.write_bytes("/before", b"a" * big)
    layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path="/before")))
    old_id = auth.KeyRing(c.key_file).signing[0]
    ids = auth.edit_key_file(c.key_file, add=True)
    new_id = ids[1]
    auth.edit_key_file(c.key_file, use=new_id)
    time.sleep(1.5)  # services re-read the file at most once a second
    c.fs.write_bytes("/during", b"b" * big)  # capabilities now signed with the new key
    fresh = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path="/during")))
    assert fresh.blocks[0].cap.key == new_id and layout.blocks[0].cap.key == old_id
    assert c.fs.read_bytes("/before") == b"a" * big
    auth.edit_key_file(c.key_file, remove=old_id)
    time.sleep(1.5)
    block, address = _chunk_address(layout)
    with pytest.raises(CapabilityRefused, match="unknown key"):
        _run(_call(address, "get_chunk", {"block_id": block.block_id, "cap": messages.to_plain(block.cap)}))
    # root's credential derived from the removed key is refused: make a new one from the file
    with pytest.raises(AuthenticationFailed):
        _run(_call(c.address, "whoami", {}, auth.ClientAuth(credential=auth.Credential.load(c.credential_file))))
    renewed = auth.Credential.root_from_keys(auth.KeyRing(c.key_file), c.address)
    with connect(c.address, credentials=renewed.save(c.credential_file)) as fs:
        assert fs.read_bytes("/before") == b"a" * big and fs.read_bytes("/during") == b"b" * big
    # chunk servers kept heartbeating through the rotation (they authenticate with the file's keys)
    with connect(c.address, credentials=c.credential_file) as fs:
        assert sum(1 for s in fs.servers() if s.live) == 6


def test_key_and_credential_files_are_private(cluster: Any) -> None:
    for path in (cluster.key_file, cluster.credential_file, auth.default_credential_path(cluster.address)):
        assert os.stat(path).st_mode & 0o077 == 0, path


def test_stored_data_is_its_servers_alone(make_cluster: Any) -> None:
    """The metadata store (every small file's bytes, inline) and the chunk servers' directories
    grant other local users nothing, so none can read tectofs users' data past the service's
    checks; a store an earlier release left readable is made private when its server starts."""
    c = make_cluster(servers=6)
    c.fs.write_bytes("/small", b"inline bytes")
    c.fs.write_bytes("/large", os.urandom(limits.inline_bytes_default + 1))
    store = os.path.join(c.root, "meta.db")

    def private() -> list[str]:
        paths = [p for p in (store, f"{store}-wal", f"{store}-shm") if os.path.exists(p)] + c.chunk_data_dirs
        return [p for p in paths if os.stat(p).st_mode & 0o077]

    assert os.path.exists(f"{store}-wal")
    assert private() == []
    for path in (store, f"{store}-wal", f"{store}-shm"):
        os.chmod(path, 0o644)  # as an earlier release left it
    c.kill_meta()
    c.restart_meta()
    assert c.fs.read_bytes("/small") == b"inline bytes"
    assert private() == []


def test_storage_that_cannot_be_made_private_is_named_not_fatal(tmp_path: Any, monkeypatch: Any,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    store = tmp_path / "meta.db"
    store.write_bytes(b"")
    os.chmod(store, 0o644)

    def refused(path: Any, mode: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(private_files.os, "chmod", refused)
    with caplog.at_level("WARNING", logger="tectofs"):
        private_files.owner_only(str(store), private_files.FILE_MODE)
    assert "could not be made private" in caplog.text and str(store) in caplog.text
    assert os.stat(store).st_mode & 0o777 == 0o644
