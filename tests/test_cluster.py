"""End-to-end tests of the core cluster: real metadata service and chunk servers on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import socket
import struct
import threading
import time

import pytest

from tectofs import errors, limits
from tectofs.client import connect
from tectofs.wire import messages
from tectofs.wire.framing import FrameDecoder, FrameKind, encode_frame

MiB = 1 << 20
SIZES = [0, 1, 4095, MiB - 1, MiB, MiB + 1, 3 * MiB, 5 * MiB + 12345]


@pytest.mark.parametrize("size", SIZES)
def test_round_trip_sizes(cluster, size):
    data = os.urandom(size)
    cluster.fs.write_bytes(f"/size-{size}", data)
    assert cluster.fs.stat(f"/size-{size}").size == size
    assert cluster.fs.read_bytes(f"/size-{size}") == data


def test_streaming_write_in_small_pieces_and_ranged_reads(cluster, rng):
    data = rng.randbytes(3 * MiB + 777)
    with cluster.fs.open("/stream.bin", "wb") as f:
        view = memoryview(data)
        while view:
            n = rng.randint(1, 300_000)
            f.write(view[:n])
            view = view[n:]
    with cluster.fs.open("/stream.bin", "rb") as f:
        for _ in range(20):
            offset = rng.randrange(len(data))
            length = rng.randrange(2 * MiB)
            f.seek(offset)
            assert f.read(length) == data[offset : offset + length]


def test_replicated_policy_directory(cluster):
    cluster.fs.mkdir("/rep3", policy="rep(3)")
    assert cluster.fs.stat("/rep3").policy == "rep(3)"
    data = os.urandom(2 * MiB + 5)
    cluster.fs.write_bytes("/rep3/f", data)
    assert cluster.fs.stat("/rep3/f").policy == "rep(3)"
    assert cluster.fs.read_bytes("/rep3/f") == data


def test_nothing_visible_before_close(cluster):
    old = os.urandom(MiB + 3)
    cluster.fs.write_bytes("/visible", old)
    other = connect(cluster.address)
    try:
        f = cluster.fs.open("/visible", "wb")
        f.write(os.urandom(3 * MiB))
        f.flush()  # buffered writer flush: data may be sent, but it is not committed
        assert other.stat("/visible").size == len(old)
        assert other.read_bytes("/visible") == old
        f.close()
        assert other.stat("/visible").size == 3 * MiB
        with cluster.fs.open("/new-file", "wb") as g:
            g.write(b"x" * 1000)
            assert other.stat("/new-file").size == 0
        assert other.read_bytes("/new-file") == b"x" * 1000
    finally:
        other.close()


def test_rename_replace_is_atomic_to_readers(cluster):
    a, b = os.urandom(2 * MiB), os.urandom(2 * MiB + 1)
    cluster.fs.write_bytes("/target", a)
    stop = threading.Event()
    seen: list[bytes] = []
    failures: list[BaseException] = []

    def reader() -> None:
        with connect(cluster.address) as fs:
            while not stop.is_set():
                try:
                    seen.append(hashlib.sha256(fs.read_bytes("/target")).digest())
                except BaseException as exc:  # noqa: BLE001 - reported below
                    failures.append(exc)
                    return

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(6):
            cluster.fs.write_bytes("/incoming", b if i % 2 == 0 else a)
            cluster.fs.rename("/incoming", "/target")
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not failures, failures
    assert seen, "the reader never completed a read"
    assert set(seen) <= {hashlib.sha256(a).digest(), hashlib.sha256(b).digest()}


def test_overwrite_append_truncate_and_holes(cluster):
    data = bytearray(os.urandom(3 * MiB))
    cluster.fs.write_bytes("/rw", data)
    with cluster.fs.open("/rw", "r+b") as f:
        f.seek(MiB - 10)
        f.write(b"A" * 20)  # crosses a block boundary
    data[MiB - 10 : MiB + 10] = b"A" * 20
    assert cluster.fs.read_bytes("/rw") == data
    with cluster.fs.open("/rw", "ab") as f:
        f.write(b"tail")
    data += b"tail"
    assert cluster.fs.read_bytes("/rw") == data
    cluster.fs.truncate("/rw", MiB + 100)
    assert cluster.fs.read_bytes("/rw") == data[: MiB + 100]
    cluster.fs.truncate("/rw", 2 * MiB)  # grows: the tail must read as zeros
    assert cluster.fs.read_bytes("/rw") == data[: MiB + 100] + bytes(2 * MiB - MiB - 100)
    with cluster.fs.open("/holes", "wb") as f:
        f.seek(2 * MiB + 5)
        f.write(b"end")
    assert cluster.fs.read_bytes("/holes") == bytes(2 * MiB + 5) + b"end"


def test_namespace_operations(cluster):
    fs = cluster.fs
    fs.mkdir("/ns/a/b", parents=True)
    fs.write_bytes("/ns/a/b/f", b"1")
    assert fs.listdir("/ns/a") == ["b"]
    with pytest.raises(errors.DirectoryNotEmpty):
        fs.rmdir("/ns/a")
    with pytest.raises(FileExistsError):
        fs.mkdir("/ns/a")
    with pytest.raises(FileNotFoundError):
        fs.stat("/ns/missing")
    with pytest.raises(NotADirectoryError):
        fs.listdir("/ns/a/b/f")
    with pytest.raises(errors.InvalidArgument):
        fs.rename("/ns/a", "/ns/a/b/inside")
    fs.rename("/ns/a/b/f", "/ns/g")
    fs.symlink("/ns/g", "/ns/link")
    assert fs.readlink("/ns/link") == "/ns/g"
    fs.chmod("/ns/g", 0o600)
    assert fs.stat("/ns/g").mode & 0o777 == 0o600
    fs.rmtree("/ns")
    assert not fs.exists("/ns")


def test_rmtree_removes_a_wide_and_deep_tree_and_raises_the_failure_itself(cluster) -> None:
    """rmtree removes the files of each listing page in one call (pages of 2,000 entries,
    nested directories): 4,800 files in a handful of calls; a failure comes out as itself,
    stops the walk, and leaves the failing call's names all in place."""
    fs = cluster.fs
    fs.mkdir("/tree")

    async def populate() -> None:
        made = [fs.aio.mkdir(f"/tree/d{i}") for i in range(3)]
        await asyncio.gather(*made)
        await asyncio.gather(*(fs.aio.metadata.create(messages.CreateRequest(path=f"/tree/f{i:05d}", mode=0o644)) for i in range(4500)))
        await asyncio.gather(*(fs.aio.metadata.create(messages.CreateRequest(path=f"/tree/d{i % 3}/g{i}", mode=0o644)) for i in range(300)))
        await fs.aio.mkdir("/tree/d0/deeper/still", parents=True)

    fs.run(populate())
    real_unlink_many = fs.aio.metadata.unlink_many
    calls: list[int] = []

    async def counted(request: messages.UnlinkManyRequest) -> messages.UnlinkReply:
        calls.append(len(request.names))
        if any(name == "f7" for name in request.names):
            raise errors.NotPermitted(f"{request.directory}/f7: refused")
        return await real_unlink_many(request)

    fs.aio.metadata.unlink_many = counted  # type: ignore[method-assign]
    try:
        fs.rmtree("/tree")
        assert not fs.exists("/tree")
        assert sum(calls) == 4800 and len(calls) <= 10, calls
        fs.mkdir("/tree2")
        for i in range(50):
            fs.write_bytes(f"/tree2/f{i}", b"x")
        with pytest.raises(errors.NotPermitted, match="f7: refused"):
            fs.rmtree("/tree2")
    finally:
        del fs.aio.metadata.unlink_many
    assert sorted(fs.listdir("/tree2")) == sorted(f"f{i}" for i in range(50))  # that call removed nothing
    fs.rmtree("/tree2")
    assert not fs.exists("/tree2")


def test_unlink_many_is_all_or_nothing(cluster) -> None:
    """A name that cannot be removed (absent, a directory, not a single name) fails the whole
    call: every other name of it is still there."""
    fs = cluster.fs
    fs.mkdir("/many")
    for name in ("a", "b", "c"):
        fs.write_bytes(f"/many/{name}", name.encode())
    fs.mkdir("/many/sub")
    for bad, error in (("nope", errors.NotFound), ("sub", errors.IsADirectory), ("x/y", errors.InvalidPath),
                       ("..", errors.InvalidPath)):
        with pytest.raises(error):
            fs.run(fs.aio.remove_many("/many", ["a", bad, "b"]))
        assert sorted(fs.listdir("/many")) == ["a", "b", "c", "sub"], bad
    fs.run(fs.aio.remove_many("/many", ["a", "b", "c"]))
    assert fs.listdir("/many") == ["sub"]


@pytest.mark.parametrize(
    "path",
    ["/a/../b", "/a/./b", "relative", "/nul\x00byte", "/" + "n" * 256, "", "/a//" + "x" * 300],
)
def test_bad_paths_get_clear_errors(cluster, path):
    with pytest.raises(errors.InvalidPath) as info:
        cluster.fs.write_bytes(path, b"x")
    assert str(info.value)
    assert cluster.fs.stat("/").is_dir  # still serving


def _raw_exchange(address: str, data: bytes) -> list:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        decoder = FrameDecoder()
        frames = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break  # the server closed the connection
            frames.extend(decoder.feed(chunk))
        return frames


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(16),  # wrong magic
        struct.pack(">IBBHQIQ", 0x54465331, 99, 1, 0, 1, 2, 0) + bytes(8),  # wrong version
        struct.pack(">IBBHQIQ", 0x54465331, 1, 1, 0, 1, 2, 1 << 40) + bytes(8),  # payload too large
        struct.pack(">IBBHQIQ", 0x54465331, 1, 77, 0, 1, 2, 0) + bytes(8),  # unknown frame kind
        encode_frame(FrameKind.REQUEST, 1, {"op": "ping"})[:-3] + b"\xff\xff\xff",  # header checksum
    ],
)
def test_malformed_frames_get_error_and_close(cluster, garbage):
    targets = [cluster.address, cluster.servers()[0].address]
    for address in targets:
        frames = _raw_exchange(address, garbage)
        assert frames and frames[-1].kind == FrameKind.ERROR
        assert frames[-1].header["code"] == "protocol"
    assert cluster.fs.stat("/").is_dir  # both servers still serve everyone else
    cluster.fs.write_bytes("/after-garbage", b"ok")
    assert cluster.fs.read_bytes("/after-garbage") == b"ok"


def test_unknown_operation_is_an_error_not_a_crash(cluster):
    with pytest.raises(errors.InvalidArgument, match="unknown operation"):
        cluster.fs.run(cluster.fs.aio.rpc.call_raw(cluster.address, "no_such_op"))
    assert cluster.fs.stat("/").is_dir


def test_two_servers_killed_every_file_still_reads(make_cluster):
    c = make_cluster()
    files = {f"/f{i}": os.urandom(size) for i, size in enumerate([0, 1, MiB, 3 * MiB + 7, 2 * MiB - 1])}
    for path, data in files.items():
        c.fs.write_bytes(path, data)
    for pair in [(0, 1), (2, 5)]:
        for i in pair:
            c.kill_chunk_server(i)
        for path, data in files.items():
            assert c.fs.read_bytes(path) == data, f"{path} with servers {pair} down"
        for i in pair:
            c.restart_chunk(i)


def test_any_two_of_six_lost(make_cluster):
    c = make_cluster()
    data = os.urandom(4 * MiB + 99)
    c.fs.write_bytes("/all-pairs", data)
    for pair in itertools.combinations(range(6), 2):
        for i in pair:
            c.kill_chunk_server(i)
        assert c.fs.read_bytes("/all-pairs") == data, f"servers {pair} down"
        for i in pair:
            c.restart_chunk(i)


def test_write_goes_around_a_dead_server(make_cluster):
    c = make_cluster(servers=8)
    c.kill_chunk_server(3)  # still counted live by the MDS for ~2 s: the client uses a spare
    data = os.urandom(3 * MiB)
    c.fs.write_bytes("/around", data)
    assert c.fs.read_bytes("/around") == data


def flip_byte(path: str, offset: int) -> bytes:
    """Damage one byte of a file on disk; returns the byte as it was."""
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    return byte


def wait_for_byte(path: str, offset: int, byte: bytes, timeout_s: float = 20.0) -> None:
    """Wait until ``path`` holds ``byte`` at ``offset`` again (a damaged chunk rebuilt)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(path, "rb") as f:
            f.seek(offset)
            if f.read(1) == byte:
                return
        time.sleep(0.1)
    pytest.fail(f"{path} was not repaired within {timeout_s:g} s")


def test_flipped_byte_is_detected_and_repaired(make_cluster):
    c = make_cluster()
    data = os.urandom(2 * MiB + 1)
    c.fs.write_bytes("/flip", data)
    byte = c.flip_chunk_byte("/flip", 1, 2, 100)  # a data chunk (packed): read on every read
    assert c.fs.read_bytes("/flip") == data
    c.wait_chunk_byte("/flip", 1, 2, 100, byte)  # the damaged chunk is rewritten from parity in the background
    assert c.fs.read_bytes("/flip") == data


def test_too_many_losses_is_a_clear_error(make_cluster):
    c = make_cluster()
    data = os.urandom(MiB)
    c.fs.write_bytes("/lost", data)
    for i in range(3):
        c.kill_chunk_server(i)
    with pytest.raises(errors.DataUnavailable, match="needed chunks"):
        c.fs.read_bytes("/lost")


def test_no_live_servers_is_no_space(make_cluster):
    c = make_cluster(servers=6)
    for i in range(6):
        c.kill_chunk_server(i)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(s.live for s in c.servers()):
        time.sleep(0.2)
    with pytest.raises(errors.NoSpace, match="live chunk servers"):
        c.fs.write_bytes("/nowhere", b"x" * (limits.inline_bytes_default + 1))
    c.fs.write_bytes("/small", b"x" * 100)  # a small file is kept by the metadata service: no chunk server needed
    assert c.fs.read_bytes("/small") == b"x" * 100


def test_deleted_file_chunks_are_collected(make_cluster):
    c = make_cluster()
    c.fs.write_bytes("/gc", os.urandom(2 * MiB))
    assert c.chunk_count() == 2 * 6
    c.fs.remove("/gc")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and c.chunk_count():
        time.sleep(0.2)
    assert c.chunk_count() == 0


def test_whole_block_writes_are_encoded_before_write_returns(cluster, monkeypatch):
    """A write covering whole blocks is encoded straight from the caller's memory (no copy into
    a block buffer): the caller may reuse its buffer as soon as write() returns. Mixed with
    partial blocks, rewrites of blocks in flight, a block of zeros and a replicated file."""
    from tectofs import erasure

    real_encode = erasure.encode

    def slow_encode(*args, **kwargs):  # an encode that reads its input late would see the reuse
        time.sleep(0.05)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(erasure, "encode", slow_encode)
    from tectofs.client import files

    whole = []
    real_send_whole = files.AsyncFile._send_whole

    async def counted(self, idx, data):
        sent = await real_send_whole(self, idx, data)
        whole.append(sent)
        return sent

    monkeypatch.setattr(files.AsyncFile, "_send_whole", counted)
    MiB = 1 << 20
    fs = cluster.fs
    fs.mkdir("/whole-rep", policy="rep(3)")
    for path in ("/whole-rs", "/whole-rep/f"):
        expected = bytearray()
        scratch = bytearray(os.urandom(3 * MiB))
        with fs.open(path, "wb", buffering=0) as f:
            for piece in (memoryview(scratch)[: 3 * MiB], memoryview(scratch)[: MiB // 2], memoryview(scratch)[: 2 * MiB]):
                f.write(piece)
                expected += piece
                scratch[:] = os.urandom(len(scratch))  # the caller reuses its buffer at once
            f.seek(MiB)  # rewrite blocks already sent by this handle, whole
            zeros = bytes(2 * MiB)
            f.write(zeros)
            expected[MiB : 3 * MiB] = zeros
        assert fs.read_bytes(path) == bytes(expected), path
    assert True in whole and False in whole  # rs blocks took the path; zeros and rep(3) did not


def test_a_client_made_in_a_forked_child_works(cluster):
    """A child forked after the parent's client encoded and decoded (a DataLoader worker)
    makes its own client, which must not wait on the parent's codec threads (gone in the child)."""
    data = os.urandom(3 << 20)
    cluster.fs.write_bytes("/before-fork", data)  # the parent's codec pool is running
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if its own client reads and writes
        code = 1
        try:
            with connect(cluster.address, credentials=cluster.credential_file) as fs:
                fs.write_bytes("/from-child", data[::-1])
                code = 0 if fs.read_bytes("/before-fork") == data else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child's client hung")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    assert cluster.fs.read_bytes("/from-child") == data[::-1]
