"""Random and type-confused requests for every operation of both services, while well-formed
clients work: no server exception, every well-formed operation succeeds, every fuzz request is
answered, and afterwards every entry in the namespace has valid attributes.

Each fuzz request starts from a plausible request of its operation and is mutated: wrong types,
missing fields, negative and huge integers, NaN and infinities, oversized strings and lists,
unknown fields, payloads where none belong. Operations that could damage other clients' data
if they were valid (commit, stage, allocate, register_server, heartbeat, put_chunk,
delete_chunks, user_add) always get at least one invalidating mutation. The fuzzers
authenticate (root on the metadata service, the cluster key on chunk servers) so that their
requests reach validation; who may do what is ``test_security.py``'s business.
"""

from __future__ import annotations

import math
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from typing import Any, Callable

import pytest

from tectofs import limits
from tectofs.wire import auth, messages
from tectofs.wire.framing import PROTOCOL_VERSION, FrameDecoder, FrameKind, encode_frame

# About 160,000 frames in all with today's 52 operations (about 45 s on 2 cores; new seeds every run); more with
# TECTOFS_FUZZ_FRAMES_PER_OPERATION for a long soak.
FRAMES_PER_OPERATION = int(os.environ.get("TECTOFS_FUZZ_FRAMES_PER_OPERATION", "2000"))
MiB = 1 << 20
DANGEROUS = {"commit", "stage", "allocate", "register_server", "heartbeat", "put_chunk", "delete_chunks",
             "repair_done", "inventory_begin", "inventory", "drain", "user_add", "user_remove"}


def _plausible(op: str, rng: random.Random, fuzz_dir: str) -> dict[str, Any]:
    """A request of ``op`` that is (usually) valid, aimed at the fuzz directory."""
    def path() -> str:
        return f"{fuzz_dir}/{rng.choice(['a', 'b', 'c', 'd', 'sub', 'sub/x', 'f' + str(rng.randrange(20))])}"

    def ino() -> int:
        return rng.randrange(1, 200)

    names: dict[str, Callable[[], dict[str, Any]]] = {
        "lookup": lambda: {"path": path()},
        "getattr": lambda: {"ino": ino()},
        "mkdir": lambda: {"path": path(), "mode": rng.randrange(0o10000), "uid": rng.choice([0, 1000, 2**32 - 2]),
                          "gid": rng.randrange(2**16), "policy": rng.choice([None, "rep(1)", "rs(4,2)"]),
                          "block_size": rng.choice([None, 65536, MiB]), "exist_ok": rng.random() < 0.5},
        "makedirs": lambda: {"path": path() + "/deep/er", "mode": 0o755, "exist_ok": True},
        "create": lambda: {"path": path(), "mode": rng.randrange(0o10000), "uid": rng.randrange(2**32 - 1),
                           "gid": rng.randrange(2**32 - 1), "exclusive": rng.random() < 0.5},
        "symlink": lambda: {"path": path(), "target": rng.choice(["a", "../x", "/" + "t" * 300])},
        "mknod": lambda: {"path": path(), "mode": rng.choice([0o10644, 0o140600, 0o20666, 0o60600, 0o100644, 0]),
                          "rdev": rng.randrange(2**20)},
        "readdir": lambda: {"path": rng.choice([fuzz_dir, "/"]), "after": rng.choice(["", "b"]),
                            "limit": rng.randrange(1, 3000)},
        "setattr": lambda: {**rng.choice([{"path": path()},  # or by inode, with a handle (forged or none)
                                          {"path": None, "ino": ino(), "handle": rng.choice([b"", rng.randbytes(48)])}]),
                            "mode": rng.choice([None, rng.randrange(0o10000)]),
                            "uid": rng.choice([None, rng.randrange(2**32 - 1)]),
                            "atime": rng.choice([None, rng.uniform(-1e11, 1e11)]),
                            "mtime": rng.choice([None, rng.uniform(-1e11, 1e11), 0.0])},
        "truncate": lambda: {"path": path(), "size": rng.choice([0, 1, MiB + 7])},
        "set_policy": lambda: {"path": path(), "policy": rng.choice([None, "rep(2)", "rs(2,1)"]),
                               "block_size": rng.choice([None, 65536])},
        "rename": lambda: {"src": path(), "dst": path(), "noreplace": rng.random() < 0.5},
        "exchange": lambda: {"a": path(), "b": path()},
        "link": lambda: {"src": path(), "dst": path()},
        "release": lambda: {"ino": ino(), "reader": rng.randrange(2**63)},
        "release_leases": lambda: {"leases": [[ino(), rng.randrange(2**63)] for _ in range(rng.randrange(0, 600))]},
        "getxattr": lambda: {"path": path(), "name": rng.choice(["user.a", "trusted.b", "system.x", "bad"])},
        "listxattr": lambda: {"path": path()},
        "setxattr": lambda: {"path": path(), "name": rng.choice(["user.a", "security.s", "user." + "n" * 300]),
                             "value": rng.randbytes(rng.choice([0, 10, 65536])), "flags": rng.randrange(4)},
        "removexattr": lambda: {"path": path(), "name": rng.choice(["user.a", "trusted.b"])},
        "unlink": lambda: {"path": path()},
        "unlink_many": lambda: {"directory": path(), "names": [rng.choice(["a", "b", "..", "x/y", "c" * 300])
                                                              for _ in range(rng.randrange(1, 5))]},
        "rmdir": lambda: {"path": path()},
        "statfs": dict, "servers": dict, "stats": dict, "ping": dict, "stat": dict,
        "layout": lambda: {"ino": ino(), "first": rng.randrange(10)},
        "allocate": lambda: {"ino": ino(), "count": rng.randrange(1, 5), "exclude": []},
        "renew": lambda: {"ino": ino(), "writer": rng.randrange(2**63)},
        "stage": lambda: {"ino": ino(), "writer": 1, "blocks": [], "holes": [1, 2], "cut_from": None},
        "commit": lambda: {"ino": ino(), "size": rng.randrange(10**9), "blocks": [], "replace": rng.random() < 0.5},
        "report_bad_chunk": lambda: {"block_id": rng.randrange(10**6), "position": 0, "server_id": 1, "reason": "fuzz",
                                     "kind": rng.choice(["", "unreachable", "corrupt", "missing"])},
        "repair_done": lambda: {"block_id": rng.randrange(10**6), "position": rng.randrange(6), "server_id": 1,
                                "length": 10, "crc": 1},
        "repair_failed": lambda: {"block_id": rng.randrange(10**6), "position": 0, "server_id": 1, "reason": "fuzz"},
        "inventory_begin": lambda: {"server_id": rng.randrange(1, 10)},
        "inventory": lambda: {"server_id": rng.randrange(1, 10), "report": rng.randrange(5),
                              "block_ids": [rng.randrange(10**6)], "last": True},
        "drain": lambda: {"server": str(rng.randrange(1, 10)), "cancel": rng.random() < 0.5},
        "block_health": lambda: {"inos": [ino() for _ in range(rng.randrange(1, 20))]},
        "register_server": lambda: {"uuid": str(uuid.uuid4()), "address": "127.0.0.1:1", "capacity": 1, "used": 0},
        "heartbeat": lambda: {"server_id": rng.randrange(1, 10), "capacity": 1, "used": 0},
        "put_chunk": lambda: {"block_id": rng.randrange(10**6), "position": 0, "crcs": [1], "crc": 1},
        "get_chunk": lambda: {"block_id": rng.randrange(10**6), "offset": 0, "length": -1},
        "delete_chunks": lambda: {"block_ids": [rng.randrange(10**6)]},
        "user_add": lambda: {"name": rng.choice(["fuzz", "a b", "", "root"]), "uid": rng.randrange(2**32 - 1),
                             "gid": 1, "groups": [1, 2]},
        "user_remove": lambda: {"name": rng.choice(["fuzz", "nobody-here"])},
        "user_list": dict, "whoami": dict,
        "s3_principal": lambda: {"access_key": rng.choice(["root", "nobody", "", "k" * 200])},
        "ticket": lambda: {"issuer": rng.choice(["127.0.0.1:1", "", "h" * 300])},
        "ticket_secret": lambda: {"uid": rng.randrange(2**32 - 1), "gid": 1, "groups": [rng.randrange(5)],
                                  "proxy": rng.random() < 0.5, "expiry": rng.choice([0, 2**40, 2**64 - 1]),
                                  "key_id": rng.choice(["", "k1", "x" * 100]), "issuer": "127.0.0.1:1"},
        "reference_blocks": lambda: {"path": path(), "source": path(),
                                     "pairs": [[rng.randrange(4), rng.randrange(4)] for _ in range(rng.randrange(1, 4))]},
        "shared_blocks": lambda: {"directory": rng.choice([fuzz_dir, "/"]), "names": [rng.choice(["a", "b", "f1"])],
                                  "offset": rng.randrange(3)},
        "claim_directory": lambda: {"path": rng.choice([fuzz_dir, "/", path()]), "count": rng.choice([1, 256, 0, 10**6])},
        "create_many": lambda: {"path": rng.choice([fuzz_dir, "/", path()]), "directory": ino(),
                                "creates": [[rng.choice(["a", "b", "", "x/y"]), ino(), 0o644, 0.0, 0]
                                            for _ in range(rng.randrange(0, 3))]},
        "keepalive": lambda: {"acked": [rng.randrange(10**6) for _ in range(rng.randrange(3))],
                              "wait_s": rng.choice([0.0, 0.5]), "end": rng.random() < 0.2},
    }
    return names[op]()


_WRONG = [None, "x", 1.5, True, [1, "a"], {"k": 1}, b"\x00\xff", -1, 2**63, 2**64 - 1, -(2**63),
          math.nan, math.inf, -math.inf, "é" * 3000, list(range(5000)), "/" + "n" * 20000, 0, {}]


def _mutate(op: str, request: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Apply 0-3 mutations; dangerous operations always get an invalid required field."""
    request = dict(request)
    fields = list(request)
    if op in DANGEROUS:
        victim = {"register_server": "uuid", "put_chunk": "block_id", "delete_chunks": "block_ids",
                  "repair_done": "block_id", "drain": "server", "user_add": "name", "user_remove": "name"}.get(op, "ino")
        if op in ("heartbeat", "inventory_begin", "inventory"):
            victim = "server_id"
        choice = rng.random()
        if choice < 0.3:
            del request[victim]
        else:
            request[victim] = rng.choice([None, "x", 1.5, [1], {"k": 1}, math.nan, -1] if victim != "uuid"
                                         else [None, 7, "", "u" * 100, [1], math.inf])
    for _ in range(rng.choice([0, 1, 1, 2, 3])):
        roll = rng.random()
        if roll < 0.15:
            request[rng.choice(["zzz", "op2", "", "_discarded", "_refused"])] = rng.choice(_WRONG)
        elif fields and roll < 0.3:
            request.pop(rng.choice(fields), None)
        elif fields:
            request[rng.choice(fields)] = rng.choice(_WRONG)
    return request


class Fuzzer:
    """One raw connection to one server: an authenticating hello (as ``client_auth``: root's
    credential on the metadata service, the cluster key on chunk servers, so requests get past
    the door and reach validation), then pipelined fuzz frames, every reply read."""

    def __init__(self, address: str, table: dict[str, messages.Operation], rng: random.Random, fuzz_dir: str,
                 client_auth: auth.ClientAuth) -> None:
        self.address = address
        self.client_auth = client_auth
        self.ops = [name for name in table if name != "hello"] + ["no_such_op"]
        self.rng = rng
        self.fuzz_dir = fuzz_dir
        self.sent = 0
        self.sent_at_frame = 0
        self.answered: dict[str, int] = {}

    def _frame(self, request_id: int) -> bytes:
        op = self.ops[self.sent_at_frame % len(self.ops)]  # round robin: every operation as often
        self.sent_at_frame += 1
        header = _mutate(op, _plausible(op, self.rng, self.fuzz_dir) if op != "no_such_op" else {}, self.rng)
        header["op"] = op if self.rng.random() > 0.02 else self.rng.choice([7, None, "", "hello", "rpc_ping", [1], {"a": 1}])
        payload = b""
        if op == "put_chunk" or self.rng.random() < 0.03:
            payload = self.rng.randbytes(self.rng.randrange(1, 5000))
        return encode_frame(FrameKind.REQUEST, request_id, header, len(payload)) + payload

    def run(self, frames: int, batch: int = 100, timeout_s: float = 60.0) -> None:
        host, port = self.address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        decoder = FrameDecoder()
        try:
            nonce = os.urandom(auth.NONCE_BYTES)
            claim, secret = self.client_auth.hello(nonce)
            hello = {"op": "hello", "role": "tool", "version": PROTOCOL_VERSION, "auth": claim}
            sock.sendall(encode_frame(FrameKind.REQUEST, 1, hello))
            reply = self._read(sock, decoder, 1)
            assert self.answered == {"ok": 1}, self.answered
            self.answered.clear()
            proof = auth.client_proof(secret, nonce, reply.header["nonce"])
            sock.sendall(encode_frame(FrameKind.REQUEST, 2, {"op": "auth", "proof": proof}))  # not answered
            next_id = 3
            while self.sent < frames:
                n = min(batch, frames - self.sent)
                sock.sendall(b"".join(self._frame(next_id + i) for i in range(n)))
                next_id += n
                self.sent += n
                self._read(sock, decoder, n)
        finally:
            sock.close()

    def _read(self, sock: socket.socket, decoder: FrameDecoder, count: int) -> Any:
        got, frame = 0, None
        while got < count:
            data = sock.recv(1 << 20)
            assert data, f"{self.address} closed the connection after {self.sent} fuzz frames"
            for frame in decoder.feed(data):
                assert frame.request_id != 0, f"{self.address} rejected the stream: {frame.header}"
                key = frame.header.get("code", "ok") if frame.kind == FrameKind.ERROR else "ok"
                self.answered[key] = self.answered.get(key, 0) + 1
                got += 1
        return frame


def _well_formed_client(fs: Any, stop: threading.Event, failures: list[str], done: list[int]) -> None:
    rng = random.Random(1)
    fs.makedirs("/wellformed")
    i = 0
    while not stop.is_set():
        try:
            data = rng.randbytes(rng.randrange(1, 3 * MiB))
            path = f"/wellformed/f{i % 10}"
            fs.write_bytes(path, data)
            assert fs.read_bytes(path) == data
            assert f"f{i % 10}" in fs.listdir("/wellformed")
            assert fs.stat(path).size == len(data)
            done[0] += 1
        except Exception as exc:  # recorded, the test fails on it
            failures.append(f"{type(exc).__name__}: {exc}")
        i += 1


def _walk(fs: Any, path: str = "/") -> list[tuple[str, Any]]:
    out = []
    for name, st in fs.scandir(path):
        child = path.rstrip("/") + "/" + name
        out.append((child, st))
        if st.is_dir:
            out.extend(_walk(fs, child))
    return out


def test_fuzzed_requests_hurt_nobody(make_cluster: Callable[..., Any], rng: random.Random, tmp_path: Any) -> None:
    cluster = make_cluster()
    fs = cluster.fs
    fuzz_dir = "/fuzz"
    fs.mkdir(fuzz_dir)
    chunk_addresses = [s.address for s in cluster.servers()]
    stop, done = threading.Event(), [0]
    failures: list[str] = []
    worker = threading.Thread(target=_well_formed_client, args=(fs, stop, failures, done), daemon=True)
    worker.start()
    started = time.monotonic()
    root = auth.ClientAuth(credential=auth.Credential.load(cluster.credential_file))
    member = auth.ClientAuth(ring=auth.KeyRing(cluster.key_file))
    fuzzers = [Fuzzer(cluster.address, messages.META_OPERATIONS, random.Random(rng.random()), fuzz_dir, root)] + [
        Fuzzer(address, messages.CHUNK_OPERATIONS, random.Random(rng.random()), fuzz_dir, member)
        for address in chunk_addresses[:2]
    ]
    shares = [FRAMES_PER_OPERATION * len(f.ops) // (1 if i == 0 else 2) + len(f.ops) for i, f in enumerate(fuzzers)]
    errors: list[BaseException] = []

    def drive(fuzzer: Fuzzer, frames: int) -> None:
        try:
            fuzzer.run(frames)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(f, n)) for f, n in zip(fuzzers, shares)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    stop.set()
    worker.join(timeout=120)
    elapsed = time.monotonic() - started
    assert not errors, errors
    meta_ops, chunk_ops = len(fuzzers[0].ops), len(fuzzers[1].ops)
    assert fuzzers[0].sent >= FRAMES_PER_OPERATION * meta_ops  # round robin: so many of each operation
    assert fuzzers[1].sent + fuzzers[2].sent >= FRAMES_PER_OPERATION * chunk_ops
    answered: dict[str, int] = {}
    for f in fuzzers:
        for key, n in f.answered.items():
            answered[key] = answered.get(key, 0) + n
    print(f"{sum(f.sent for f in fuzzers)} fuzz frames in {elapsed:.1f}s, answers {answered}; "
          f"{done[0]} well-formed write/read/list rounds")
    assert sum(answered.values()) == sum(f.sent for f in fuzzers)  # every request answered
    assert answered.get("invalid_argument", 0) > sum(f.sent for f in fuzzers) // 2
    assert not failures, failures[:5]
    assert done[0] >= 3

    # No server logged an exception; the damage, if any, is visible in the namespace.
    for log in ["meta.log"] + [f"chunk-{i}.log" for i in range(len(cluster.chunk_data_dirs))]:
        with open(os.path.join(cluster.root, "logs", log), errors="replace") as log_file:
            text = log_file.read()
        assert "Traceback" not in text, f"{log}:\n{text[text.index('Traceback') - 300:][:3000]}"
        assert " ERROR " not in text, f"{log}:\n" + "\n".join(line for line in text.splitlines() if " ERROR " in line)[:3000]
        if log == "meta.log":  # clients' mistakes: one line each, rate-limited
            lines = text.count("invalid request from")
            assert 0 < lines <= limits.peer_log_lines_per_s * (elapsed + 60), lines

    entries = _walk(fs)
    assert len(entries) > 3
    for path, st in entries:  # typed replies: every attribute decoded and in range
        assert st.kind in ("file", "dir", "symlink", "fifo", "socket", "char", "block")
        assert math.isfinite(st.mtime) and math.isfinite(st.atime)
        assert 0 <= st.uid < 2**32 - 1 and 0 <= st.gid < 2**32 - 1
        fs.stat(path)
    ls = subprocess.run([sys.executable, "-m", "tectofs.cli", "ls", "--meta", cluster.address, fuzz_dir],
                        capture_output=True, text=True, timeout=60)
    assert ls.returncode == 0, ls.stderr
    _check_through_mount(cluster, entries, tmp_path)


def _check_through_mount(cluster: Any, entries: list[tuple[str, Any]], tmp_path: Any) -> None:
    from tests.test_fuse import _REASON

    if _REASON is not None:
        return
    from tectofs.client.fuse import start_mount_process

    where = str(tmp_path / "mnt")
    os.mkdir(where)
    with start_mount_process(cluster.address, where, log_path=str(tmp_path / "mount.log")):
        for path, st in entries:
            seen = os.lstat(where + path)
            assert seen.st_ino == st.ino
            assert seen.st_uid == st.uid and seen.st_gid == st.gid
        listing = subprocess.run(["ls", "-laR", where], capture_output=True, text=True, timeout=120)
        assert listing.returncode == 0, listing.stderr
        assert "?" not in "".join(line.split()[0] for line in listing.stdout.splitlines() if line and line[0] in "-dl")


def test_requests_never_reach_the_store_invalid() -> None:
    """The request types refuse what the issue saw stored or crash the store."""
    bad = [
        ("getattr", {"ino": 2**63}),
        ("commit", {"ino": 5, "size": 1, "blocks": [{"idx": 0, "length": 1, "chunks": []}]}),  # no block_id
        ("setattr", {"path": "/f", "mtime": "garbage"}),
        ("setattr", {"path": "/f", "uid": 2**40}),
        ("setattr", {"path": "/f", "atime": math.nan}),
        ("mkdir", {"path": "/d", "mode": 0o170000}),
        ("readdir", {"path": "/", "limit": 10**9}),
        ("allocate", {"ino": 3, "count": -1}),
        ("truncate", {"path": "/f", "size": -5}),
    ]
    import msgspec

    for op, header in bad:
        with pytest.raises(msgspec.ValidationError) as info:
            messages.convert(header, messages.META_OPERATIONS[op].request)
        assert "$." in str(info.value) or "missing" in str(info.value), (op, str(info.value))
