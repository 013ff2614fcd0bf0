"""Issue 29, part 2: a user with genuine write capabilities must not starve the chunk servers.

The attack: a user allocates blocks of a file in its own directory, opens 8 connections to each
chunk server, sends on each a put_chunk header with one of its capabilities declaring a 64 MiB
payload, then trickles the payload a byte at a time. Before the fix every chunk server's whole
in-flight budget was reserved, and every other user's writes failed within a second ("rs(4,2)
needs at least 5 live chunk servers …, 0 are live"). Here the attacker keeps reopening whatever
the servers close, and another user's writes must still complete; the trickles are dropped
within the progress window. Unit tests cover the fair-share accounting and the window alone.
"""

from __future__ import annotations

import concurrent.futures
import os
import select
import socket
import threading
import time
from typing import Any, Iterator

import pytest

from tectofs import limits
from tectofs.client import connect
from tectofs.errors import Busy, NoSpace
from tectofs.server.chunk.admission import MEMBER, WITHOUT_UID, Admission, principal_of
from tectofs.wire import auth, messages
from tectofs.wire.connlimits import ProgressWindow
from tectofs.wire.framing import PROTOCOL_VERSION, FrameDecoder, FrameKind, encode_frame

MiB = 1 << 20
BUDGET = limits.chunk_inflight_bytes_max
WINDOW_S = 2.0  # the progress window, lowered for the test (TECTOFS_FRAME_PROGRESS_WINDOW_S)
HELLO = encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": PROTOCOL_VERSION})


# --------------------------------------------------------------------------- the accounting alone


def test_one_principal_alone_leaves_room_for_a_newcomer() -> None:
    admission = Admission(512, alone_fraction=0.75)
    assert all(admission.admit("uid 1", 64) for _ in range(6))  # 384 of 512
    assert not admission.admit("uid 1", 64)  # its share alone: 3/4
    assert admission.admit("uid 2", 64) and admission.admit("uid 2", 64)  # the newcomer gets in at once
    assert admission.total_bytes == 512
    assert not admission.admit("uid 2", 1)  # the budget is full
    for _ in range(3):
        admission.release("uid 1", 64)
    assert admission.held == {"uid 1": 192, "uid 2": 128}
    assert admission.share_bytes("uid 1") == 256  # two holding: half each
    assert admission.admit("uid 1", 64)
    assert not admission.admit("uid 1", 64)  # 256 of 256 (and the budget has room: 64)
    assert admission.admit("uid 2", 64)


def test_fair_share_follows_how_many_principals_hold_some() -> None:
    admission = Admission(600, alone_fraction=1.0)
    assert admission.admit("a", 600)  # alone, with fraction 1: everything
    admission.release("a", 600)
    assert admission.admit("a", 100) and admission.admit("b", 100) and admission.admit("c", 100)
    assert admission.share_bytes("a") == 200
    assert admission.admit("a", 100)
    assert not admission.admit("a", 1)  # 200 of 600: its third
    assert admission.admit("b", 100) and not admission.admit("b", 1)
    admission.release("c", 100)  # c leaves: two holding, 300 each
    assert admission.share_bytes("a") == 300 and admission.admit("a", 100)
    assert admission.total_bytes == 500 and "c" not in admission.held


def test_nothing_in_flight_admits_any_size_and_zero_is_free() -> None:
    admission = Admission(100)
    assert admission.admit("a", 1000)  # alone and idle: a put larger than the budget still goes
    assert not admission.admit("b", 1)
    admission.release("a", 1000)
    assert admission.total_bytes == 0 and not admission.held
    assert admission.admit("b", 0) and not admission.held  # nothing reserved, nobody counted
    with pytest.raises(AssertionError):
        admission.release("b", 1)


def test_principal_comes_from_the_signed_capability() -> None:
    assert principal_of(None) == MEMBER
    assert principal_of({"mac": b"x" * 16, "expiry": 1, "key": "k"}) == WITHOUT_UID
    assert principal_of({"mac": b"x" * 16, "expiry": 1, "key": "k", "uid": 1000}) == "uid 1000"
    assert principal_of(messages.Capability(mac=b"x" * 16, expiry=1, key="k", uid=7)) == "uid 7"


def test_a_capability_signs_its_uid() -> None:
    ring = auth.KeyRing.from_keys([("k1", os.urandom(32))])
    expiry = auth.capability_expiry(60)
    key, tag = auth.sign_capability(ring, 5, "w", expiry, uid=1000)
    auth.check_capability(ring, 5, "w", expiry, key, tag, uid=1000)
    for uid in (None, 0, 1001):  # another uid, or none, is another capability
        with pytest.raises(auth.CapabilityRefused, match="forged"):
            auth.check_capability(ring, 5, "w", expiry, key, tag, uid=uid)
    key, tag = auth.sign_capability(ring, 5, "w", expiry)  # an older metadata service's: still valid
    auth.check_capability(ring, 5, "w", expiry, key, tag)


def test_progress_window_slides() -> None:
    window = ProgressWindow()
    rate = 1000.0
    assert not window.too_slow(0.0, 0, 2.0, rate)
    assert not window.too_slow(1.0, 5000, 2.0, rate)  # watched for less than a window
    assert not window.too_slow(2.0, 5000, 2.0, rate)  # 5,000 bytes in the last 2 s: enough
    assert window.too_slow(3.0, 5001, 2.0, rate)  # the window slid to [1, 3]: 1 byte in it
    burst = ProgressWindow()
    assert not burst.too_slow(0.0, 0, 2.0, rate)
    assert not burst.too_slow(1.9, 0, 2.0, rate)  # nothing yet, but not watched for a window
    assert not burst.too_slow(2.5, 2500, 2.0, rate)  # [0, 2.5]: 2,500 bytes, at least 2 s x 1,000 B/s
    fast = ProgressWindow()
    for step in range(10):
        assert not fast.too_slow(step * 0.5, step * 10_000, 2.0, rate)  # 20 kB/s, sampled every 0.5 s
    assert len(fast.samples) <= 6  # bounded: only what the window needs


# --------------------------------------------------------------------------- the attack


def _chunk_addresses(cluster: Any) -> list[str]:
    out = []
    for i in range(len(cluster.chunk_processes)):
        with open(os.path.join(cluster.root, f"chunk-{i}.address")) as f:
            out.append(f.read().strip())
    return out


def _user(cluster: Any, name: str, uid: int, directory: str, tmp_path: Any) -> str:
    """A user made the way `tectofs user add` does, owning ``directory``; its credential file."""
    reply = cluster.fs.run(cluster.fs.aio.metadata.user_add(messages.UserAddRequest(name=name, uid=uid, gid=uid, groups=[])))
    path = str(tmp_path / f"{name}.credentials")
    auth.Credential(user=name, secret=reply.secret, cluster=cluster.address).save(path)
    cluster.fs.mkdir(directory, mode=0o755)
    cluster.fs.chown(directory, uid, uid)
    return path


class _Trickler:
    """The attacker: ``per_server`` connections to each chunk server, each a put_chunk header with
    one of its genuine write capabilities declaring ``declared`` bytes, then one payload byte per
    ``trickle_s``. Whatever a server closes is reopened at once (a persistent attacker)."""

    def __init__(self, addresses: list[str], allocations: list[messages.Allocation], per_server: int,
                 declared: int, trickle_s: float) -> None:
        self.slots = [(address, allocations[j % len(allocations)]) for address in addresses for j in range(per_server)]
        self.declared, self.trickle_s = declared, trickle_s
        self.socks: list[socket.socket | None] = [None] * len(self.slots)
        self.closed_errors: list[tuple[str, str]] = []  # what the servers said when they closed a put
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trickler", daemon=True)

    def _open(self, i: int) -> None:
        address, allocation = self.slots[i]
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        header = {"op": "put_chunk", "block_id": allocation.block_id, "position": 0, "crcs": [], "crc": 0,
                  "cap": messages.to_plain(allocation.cap)}
        sock.sendall(HELLO + encode_frame(FrameKind.REQUEST, 2, header, self.declared))
        self.socks[i] = sock
        self.opened += 1

    def _closed_by_server(self, sock: socket.socket) -> bool:
        """Read what the server sent; True if it closed the connection (its errors recorded)."""
        try:
            data = sock.recv(65536)
        except OSError:
            return True
        if not data:
            return True
        for frame in FrameDecoder().feed(data[data.find(b"TFS1"):]) if b"TFS1" in data else []:
            if frame.kind == FrameKind.ERROR:
                self.closed_errors.append((frame.header["code"], frame.header["message"]))
        return False

    def start(self) -> None:
        for i in range(len(self.slots)):
            self._open(i)
        self._thread.start()

    def _run(self) -> None:
        next_byte = time.monotonic() + self.trickle_s
        while not self._stop.is_set():
            poller = select.poll()
            by_fd = {}
            for i, sock in enumerate(self.socks):
                if sock is not None:
                    poller.register(sock, select.POLLIN)
                    by_fd[sock.fileno()] = i
            for fd, _ in poller.poll(100):
                i = by_fd[fd]
                sock = self.socks[i]
                assert sock is not None
                if self._closed_by_server(sock) or self._peer_gone(sock):
                    sock.close()
                    self.socks[i] = None
            for i, sock in enumerate(self.socks):
                if sock is None and not self._stop.is_set():
                    try:
                        self._open(i)
                    except OSError:
                        pass
            if time.monotonic() >= next_byte:
                next_byte += self.trickle_s
                for i, sock in enumerate(self.socks):
                    try:
                        if sock is not None:
                            sock.send(b"\0")
                    except OSError:
                        sock.close()  # type: ignore[union-attr]
                        self.socks[i] = None

    @staticmethod
    def _peer_gone(sock: socket.socket) -> bool:
        try:
            return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.socks:
            if sock is not None:
                sock.close()


@pytest.fixture
def attack_cluster(make_cluster: Any) -> Iterator[Any]:
    yield make_cluster(servers=6, policy="rs(4,2)", extra_env={"TECTOFS_FRAME_PROGRESS_WINDOW_S": str(WINDOW_S)})


def test_a_user_trickling_genuine_puts_does_not_starve_other_users(attack_cluster: Any, tmp_path: Any) -> None:
    cluster = attack_cluster
    addresses = _chunk_addresses(cluster)
    mallory = connect(cluster.address, credentials=_user(cluster, "mallory", 1000, "/mallory", tmp_path))
    bob = connect(cluster.address, credentials=_user(cluster, "bob", 1001, "/bob", tmp_path))
    pool = concurrent.futures.ThreadPoolExecutor(1)
    attacker: _Trickler | None = None

    def stat(address: str) -> Any:
        return cluster.fs.run(cluster.fs.aio.rpc.call_raw(address, "stat", {}, idempotent=True))[0]

    try:
        created = mallory.run(mallory.aio.metadata.create(messages.CreateRequest(path="/mallory/f", mode=0o644)))
        allocated = mallory.run(mallory.aio.metadata.allocate(
            messages.AllocateRequest(ino=created.attrs.ino, handle=created.attrs.handle, count=8)))
        assert all(a.cap is not None and a.cap.uid == 1000 for a in allocated.blocks)  # genuine, and whose
        attacker = _Trickler(addresses, allocated.blocks, per_server=8, declared=64 * MiB, trickle_s=1.0)
        attacker.start()
        deadline = time.monotonic() + 5
        while sum(stat(a)["inflight"] for a in addresses) < 6 * 6 * 64 * MiB and time.monotonic() < deadline:
            time.sleep(0.1)
        held = [stat(a)["inflight"] for a in addresses]
        print(f"in flight per chunk server under attack: {[h // MiB for h in held]} MiB of {BUDGET // MiB}")
        assert all(h >= 6 * 64 * MiB for h in held), held  # the attack did take what it may ...
        assert all(h <= BUDGET * limits.chunk_inflight_alone_fraction for h in held), held  # ... and no more

        for n in range(3):  # another user's writes complete, each within 10 s, while the attack goes on
            data = os.urandom(6 * MiB + n)
            started = time.monotonic()
            try:
                pool.submit(bob.write_bytes, f"/bob/ckpt-{n}", data).result(timeout=10)
            except (Busy, NoSpace) as exc:
                pytest.fail(f"bob's write {n} failed under the attack: {exc}")
            assert bob.read_bytes(f"/bob/ckpt-{n}") == data
            print(f"bob's write {n} took {time.monotonic() - started:.2f} s")

        # The trickled puts are dropped within the progress window (and a sweep), their
        # reservations returned; the attacker had to reopen them.
        opened_before = attacker.opened
        deadline = time.monotonic() + WINDOW_S * 3 + 3
        while attacker.opened < opened_before + len(addresses) * 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        slow = [m for code, m in attacker.closed_errors if code == "timeout" and "slower than" in m]
        assert slow, attacker.closed_errors[:3]
        assert attacker.opened >= opened_before + len(addresses) * 6, (opened_before, attacker.opened)
    finally:
        if attacker is not None:
            attacker.stop()
        pool.shutdown(wait=False, cancel_futures=True)
        mallory.close()
        bob.close()
    deadline = time.monotonic() + WINDOW_S * 2 + 5
    while any(stat(a)["inflight"] for a in addresses) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(stat(a)["inflight"] for a in addresses)  # every reservation went back with its connection


def test_busy_chunk_servers_are_named_busy_not_dead(make_cluster: Any, tmp_path: Any) -> None:
    """With every chunk server's budget taken (here: a tiny budget and another user holding it), a
    write fails naming admission, not "0 are live"."""
    cluster = make_cluster(servers=6, policy="rs(4,2)", chunk_inflight_bytes_max=2 * MiB,
                           extra_env={"TECTOFS_FRAME_PROGRESS_WINDOW_S": "30"})
    addresses = _chunk_addresses(cluster)
    mallory = connect(cluster.address, credentials=_user(cluster, "mallory", 1000, "/mallory", tmp_path))
    bob = connect(cluster.address, credentials=_user(cluster, "bob", 1001, "/bob", tmp_path))
    attacker: _Trickler | None = None
    try:
        created = mallory.run(mallory.aio.metadata.create(messages.CreateRequest(path="/mallory/f", mode=0o644)))
        allocated = mallory.run(mallory.aio.metadata.allocate(
            messages.AllocateRequest(ino=created.attrs.ino, handle=created.attrs.handle, count=2)))
        # 2 MiB declared per put: one fills a server's budget (admitted alone, nothing else in flight).
        attacker = _Trickler(addresses, allocated.blocks, per_server=1, declared=2 * MiB, trickle_s=1.0)
        attacker.start()
        time.sleep(0.5)
        with pytest.raises(Busy, match="busy .*in-flight admission budget"):
            pool = concurrent.futures.ThreadPoolExecutor(1)
            try:
                pool.submit(bob.write_bytes, "/bob/f", os.urandom(4 * MiB)).result(timeout=30)
            finally:
                pool.shutdown(wait=False)
    finally:
        if attacker is not None:
            attacker.stop()
        mallory.close()
        bob.close()
