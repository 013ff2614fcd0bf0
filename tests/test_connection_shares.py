"""Issue 51, part 4: one authenticated user must not take every connection slot.

The attack: bob, an ordinary user, opened 19,759 authenticated idle connections from 10
addresses (each under the 2,048-per-address cap); the metadata service reached its limit
(19,744) and root's ping, whoami and writes got Busy. Now users' connections are shared by
principal (``tectofs.wire.connlimits``): users together never take the places reserved for
root and the cluster's servers, a user at its share is refused, and a new user's connection
evicts the longest idle one of the user holding the most. Here the service runs with
``--connections-max 64`` (16 reserved, 48 for users), so the attack takes 48 connections.
"""

from __future__ import annotations

import asyncio
import os
import select
import socket
import subprocess
import time
from typing import Any, Iterator, cast

import pytest

from tectofs.client import connect
from tectofs.wire import auth
from tectofs.wire.connlimits import RESERVED, ConnectionGuard, ConnectionPolicy, principal
from tectofs.wire.framing import PROTOCOL_VERSION, Frame, FrameDecoder, FrameKind, encode_frame
from tectofs.wire.server import RpcServer
from tests.test_connection_pools import _Conn, _Server, _within
from tests.test_exhaustion import _sockets

MiB = 1 << 20
CONNECTIONS_MAX = 64
USERS_MAX = CONNECTIONS_MAX - CONNECTIONS_MAX // 4  # the reserve: 1,024, at most a quarter of the cap
BOB_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 6)]  # bob's hosts


# --------------------------------------------------------------------------- the guard alone


def _guard(**policy: Any) -> Any:
    # _Server and _Conn stand in for the RpcServer and its connections: the guard reads only what they have.
    return ConnectionGuard(cast(RpcServer, _Server(True)), ConnectionPolicy(**policy))


def _connect(guard: Any, ip: str, principal: str, idle_since_s: float = 0.0) -> _Conn:
    conn = _Conn(ip)
    assert guard.admit(conn)
    conn.received_s = conn.quiet_since_s = idle_since_s
    assert guard.authenticated(conn, principal)
    return conn


def test_users_share_their_places_and_root_keeps_its_reserve() -> None:
    async def main() -> None:
        guard = _guard(connections_max=16, anonymous_connections_max=4, connections_reserved=4)
        assert guard.users_max == 12
        bob = [_connect(guard, f"10.0.0.{n % 3}", "uid 1001", idle_since_s=100.0 + n) for n in range(12)]
        bob[0].received_s = 200.0  # the oldest spoke lately: bob[1] is the longest idle
        # Bob at the users' limit, alone: his share is all of it; one more is refused, told why.
        more = _Conn("10.0.0.1")
        assert guard.admit(more) and not guard.authenticated(more, "uid 1001")
        assert "holds 12, at least its share" in FrameDecoder().feed(more.transport.written)[0].header["message"]
        assert more.peer_ip is None and guard.users == 12 and guard.stats["refused"] == 1
        # Root and members take the reserve: nobody evicted.
        root = [_connect(guard, "10.0.0.9", RESERVED) for _ in range(3)]
        assert not any(c.transport.closing for c in bob + root) and guard.admitted == 15
        # Alice (a new user): bob's longest idle goes for her.
        alice = _connect(guard, "10.0.0.8", "uid 1002")
        assert [c.transport.closing for c in bob[:3]] == [False, True, False]
        assert "the longest idle of the user holding the most (12)" in bob[1].said()
        assert guard.users == 12 and len(guard.by_principal["uid 1001"]) == 11
        # The server full (root over its reserve), nothing anonymous: a newcomer evicts for itself.
        root.append(_connect(guard, "10.0.0.9", RESERVED))
        assert guard.admitted == 16 and not guard.anonymous
        newcomer = _Conn("10.0.0.7")
        assert guard.admit(newcomer)
        assert bob[2].transport.closing and not alice.transport.closing
        # ... but if it is bob's, over his share, he does not keep the place it made.
        assert not guard.authenticated(newcomer, "uid 1001") and guard.admitted == 15
        guard.release(root.pop())
        # Two users at the users' limit: each one's share is 12 / 2. Bob, over it, is refused;
        # alice, under it, evicts his longest idle until she holds hers, and is then refused too.
        alice2 = _connect(guard, "10.0.0.8", "uid 1002")
        assert guard.users == 12 and len(guard.by_principal["uid 1001"]) == 10 and alice2.peer_ip
        refused = _Conn("10.0.0.1")
        assert guard.admit(refused) and not guard.authenticated(refused, "uid 1001")
        for n in range(4):
            _connect(guard, "10.0.0.8", "uid 1002")
            assert bob[3 + n].transport.closing
        assert len(guard.by_principal["uid 1001"]) == len(guard.by_principal["uid 1002"]) == 6
        refused = _Conn("10.0.0.8")
        assert guard.admit(refused) and not guard.authenticated(refused, "uid 1002")
        assert guard.stats["refused"] == 4 and guard.users == 12

    asyncio.run(main())


def test_chunk_servers_share_by_peer_address_so_one_user_from_many_cannot_lock_others_out() -> None:
    """Chunk servers do not learn a connection's principal (clients are anonymous there: each
    put carries a capability, and admission shares the in-flight budget by its uid), so their
    connections are shared by peer address: bob filling a server from ten addresses still
    leaves a newcomer from an eleventh its place, at the cost of his longest idle connection."""

    async def main() -> None:
        guard: Any = ConnectionGuard(cast(RpcServer, _Server(False)), ConnectionPolicy(connections_max=100))
        bob = [_Conn(f"10.0.0.{n % 10}") for n in range(100)]
        for n, conn in enumerate(bob):
            assert guard.admit(conn)
            conn.received_s = conn.quiet_since_s = 100.0 + n
        for root_or_alice in (_Conn("10.0.1.1"), _Conn("10.0.1.2")):
            assert guard.admit(root_or_alice)
        assert [n for n, conn in enumerate(bob) if conn.transport.closing] == [0, 1]
        assert guard.admitted == 100

    asyncio.run(main())


def test_principals() -> None:
    assert principal(auth.MEMBER) == RESERVED
    assert principal(auth.Peer(kind="user", name="root", uid=0, gid=0, admin=True, proxy=True)) == RESERVED
    assert principal(auth.Peer(kind="user", name="bob", uid=1001, gid=1001)) == "uid 1001"
    assert principal(auth.Peer(kind="user", name="mount:uid1001", uid=1001, gid=1001)) == "uid 1001"  # acting for bob
    assert principal(auth.Peer(kind="user", name="root:uid0", uid=0, gid=0)) == "uid 0"  # a proxy acting for uid 0


# --------------------------------------------------------------------------- the attack


def _frame(sock: socket.socket) -> Frame | None:
    """The next frame on ``sock``; None once the server closed (or reset) it."""
    decoder = FrameDecoder()
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        data += chunk
        frames = decoder.feed(chunk)
        if frames:
            return frames[0]


def _open(address: str, credential: auth.Credential, source: str) -> tuple[socket.socket, str]:
    """A connection from ``source`` authenticated as ``credential``'s user, pinged once: ``(socket,
    "")`` if served, else what the server said (``(socket, message)``)."""
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.bind((source, 0))
    sock.connect((host, int(port)))
    nonce = os.urandom(auth.NONCE_BYTES)
    fields, secret = auth.ClientAuth(credential=credential).hello(nonce)
    sock.sendall(encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": PROTOCOL_VERSION,
                                                     "auth": fields}))
    answer = _frame(sock)
    if answer is None or answer.kind == FrameKind.ERROR:
        return sock, answer.header["message"] if answer else "closed"
    proof = auth.client_proof(secret, nonce, answer.header["nonce"])
    sock.sendall(encode_frame(FrameKind.REQUEST, 2, {"op": "auth", "proof": proof})
                 + encode_frame(FrameKind.REQUEST, 3, {"op": "ping"}))
    answer = _frame(sock)
    if answer is None or answer.kind == FrameKind.ERROR:
        return sock, answer.header["message"] if answer else "closed"
    return sock, ""


def _ping(sock: socket.socket) -> None:
    sock.sendall(encode_frame(FrameKind.REQUEST, 4, {"op": "ping"}))
    answer = _frame(sock)
    assert answer is not None and answer.kind == FrameKind.RESPONSE


def _said(sock: socket.socket) -> str | None:
    """What the server said on an idle connection since (None: nothing, it is still served)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return None
    answer = _frame(sock)
    return answer.header["message"] if answer is not None else "closed"


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    with _sockets() as opened:
        yield opened


def _add_user(cluster: Any, name: str, uid: int, tmp_path: Any) -> str:
    path = str(tmp_path / f"{name}.credentials")
    subprocess.run(["tectofs", "user", "add", name, "--uid", str(uid), "--gid", str(uid), "--out", path,
                    "--meta", cluster.address, "--credentials", cluster.credential_file],
                   check=True, capture_output=True, timeout=30, env=cluster.env)
    cluster.fs.mkdir(f"/{name}", mode=0o755)
    cluster.fs.chown(f"/{name}", uid, uid)
    return path


def _works(address: str, credentials: str, name: str) -> None:
    """A new client (new connections) pings, asks who it is, writes and reads back."""
    with connect(address, credentials=credentials) as fs:
        fs.run(fs.aio.metadata.ping())
        assert fs.run(fs.aio.metadata.whoami()).name == name
        data = os.urandom(MiB + 17)
        fs.write_bytes(f"/{name}/while-bob-holds-all", data)
        assert fs.read_bytes(f"/{name}/while-bob-holds-all") == data


def test_one_user_cannot_take_every_connection(make_cluster: Any, sockets: list[socket.socket], tmp_path: Any) -> None:
    cluster = make_cluster(servers=3, policy="rs(2,1)", meta_args=["--connections-max", str(CONNECTIONS_MAX)])
    bob_file = _add_user(cluster, "bob", 1001, tmp_path)
    alice_file = _add_user(cluster, "alice", 1002, tmp_path)
    bob = auth.Credential.load(bob_file)
    cluster.fs.mkdir("/root")
    # Bob fills every place he can, round-robin over his addresses, until refused three times running.
    served: list[socket.socket] = []
    refusals: list[str] = []
    for n in range(2 * CONNECTIONS_MAX):
        sock, said = _open(cluster.address, bob, BOB_ADDRESSES[n % len(BOB_ADDRESSES)])
        sockets.append(sock)
        if said:
            refusals.append(said)
            if len(refusals) == 3:
                break
        else:
            served.append(sock)
    print(f"bob holds {len(served)} authenticated idle connections; refused: {refusals[0]}")
    # His first five speak again: the longest idle is now his sixth.
    time.sleep(0.05)
    for sock in served[:5]:
        _ping(sock)
    started = time.monotonic()
    _within(20, _works, cluster.address, cluster.credential_file, "root")  # root: into the reserve, nobody evicted
    assert all(_said(sock) is None for sock in served)
    assert len(served) == USERS_MAX, (len(served), refusals)
    assert "at least its share" in refusals[0]
    cluster.fs.stat("/")  # root's client connected before the attack too
    _within(20, _works, cluster.address, alice_file, "alice")  # alice: evicts bob's longest idle
    print(f"root and alice worked in {time.monotonic() - started:.2f} s")
    told = [_said(sock) for sock in served]
    evicted = [n for n, what in enumerate(told) if what is not None]
    assert evicted and evicted[0] == 5, told
    assert evicted == list(range(5, 5 + len(evicted)))  # bob's longest idle first, in order
    assert "the longest idle of the user holding the most" in str(told[5])
    # Bob is held to his share: a new connection of his is refused while alice holds hers.
    with connect(cluster.address, credentials=alice_file) as fs:
        assert fs.run(fs.aio.metadata.whoami()).name == "alice"
        sock, refused = _open(cluster.address, bob, BOB_ADDRESSES[0])
        sockets.append(sock)
        assert "at least its share" in refused, refused
