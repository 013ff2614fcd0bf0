"""Small files stored inline (their block 0 kept by the metadata store with the inode): what
they cost in calls, every size around the threshold, a file crossing it under concurrent
readers, damaged inline data, and the faults: a metadata service SIGKILLed after ``close``
returned (through the library and through the mount, whose ``fsync`` also outlives a SIGKILL of
the mount), and a failover to a second service over PostgreSQL in the middle of an untar."""

from __future__ import annotations

import io
import os
import random
import signal
import sqlite3
import subprocess
import tarfile
import threading
import time
from typing import Any

import msgspec
import pytest

from tectofs import errors, limits
from tectofs.checksum import crc
from tectofs.client import connect
from tectofs.wire import inline_echo, messages
from tests.test_client_metrics import local, moved
from tests.test_failover import TwoMetaCluster

KiB = 1 << 10
INLINE = limits.inline_bytes_default


def _content(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def test_a_small_file_costs_a_create_and_a_commit_and_no_chunk_request(cluster: Any) -> None:
    fs = cluster.fs
    data = _content(26 * KiB, 1)
    before = local()
    fs.write_bytes("/small-costs", data)
    written = local()
    assert fs.read_bytes("/small-costs") == data
    read = local()
    assert moved(before, written, "tectofs_client_meta_requests_total", op="create", outcome="ok") == 1
    assert moved(before, written, "tectofs_client_meta_requests_total", op="commit", outcome="ok") == 1
    assert moved(before, written, "tectofs_client_meta_requests_total", op="allocate", outcome="ok") == 0
    assert moved(before, read, "tectofs_client_chunk_requests_total", op="put_chunk", outcome="ok") == 0
    assert moved(written, read, "tectofs_client_chunk_requests_total", op="get_chunk", outcome="ok") == 0
    assert moved(written, read, "tectofs_client_meta_requests_total", op="layout", outcome="ok") == 1
    assert moved(before, written, "tectofs_client_inline_writes_total") == 1
    assert moved(written, read, "tectofs_client_inline_reads_total") == 1
    # one byte over the threshold: a chunk block as before
    fs.write_bytes("/small-costs", _content(INLINE + 1, 2))
    assert moved(read, local(), "tectofs_client_chunk_requests_total", op="put_chunk", outcome="ok") >= 4


@pytest.mark.parametrize("size", [1, 4095, INLINE - 1, INLINE, INLINE + 1, 3 * INLINE])
def test_sizes_around_the_threshold_round_trip_through_every_kind_of_write(cluster: Any, size: int) -> None:
    """Whole writes, zero heads and tails (a trimmed stored span), a patch in the middle of
    an inline file, appends across the threshold and back, truncations: each read equals a
    model kept in memory."""
    fs = cluster.fs
    path = f"/sizes-{size}"
    model = bytearray(bytes(100) + _content(max(0, size - 200), size) + bytes(min(size, 100)))[:size]
    fs.write_bytes(path, bytes(model))
    assert fs.read_bytes(path) == model
    with fs.open(path, "r+b") as f:  # patch the middle
        f.seek(size // 2)
        f.write(b"PATCH")
    model[size // 2 : size // 2 + 5] = b"PATCH"
    assert fs.read_bytes(path) == model
    with fs.open(path, "ab") as f:  # grow past the threshold
        f.write(b"A" * INLINE)
    model += b"A" * INLINE
    assert fs.read_bytes(path) == model
    fs.truncate(path, min(size, 1000))  # back below it (the block stays in chunks until rewritten)
    del model[min(size, 1000):]
    assert fs.read_bytes(path) == model
    with fs.open(path, "r+b") as f:  # rewritten small: inline again
        f.write(b"B")
    model[0:1] = b"B"
    assert fs.read_bytes(path) == model
    fs.truncate(path, size + 10)  # extended: zeros past the stored bytes
    model += bytes(size + 10 - len(model))
    assert fs.read_bytes(path) == model and fs.stat(path).size == size + 10


def test_a_file_crossing_the_threshold_under_concurrent_readers_reads_back_bit_exact(cluster: Any) -> None:
    """One writer replaces and appends a file so that it crosses the threshold both ways many
    times; two readers on their own clients read it whole all the while, and one keeps a
    handle open across versions. Every read is exactly one version the writer committed (or
    was committing), and a handle reads the version it opened every time."""
    path = "/crossing"
    versions: set[bytes] = {b""}
    cluster.fs.write_bytes(path, b"")
    stop = threading.Event()
    failures: list[str] = []
    counts = [0, 0]

    def read_whole(index: int) -> None:
        with connect(cluster.address, credentials=cluster.credential_file) as fs:
            while not stop.is_set():
                data = fs.read_bytes(path)
                if data not in versions:
                    failures.append(f"reader {index}: {len(data)} bytes that no version had")
                    return
                counts[index] += 1

    def hold_open() -> None:
        with connect(cluster.address, credentials=cluster.credential_file) as fs:
            while not stop.is_set():
                with fs.open(path, "rb") as f:
                    first = f.read()
                    time.sleep(0.02)
                    f.seek(0)
                    if f.read() != first:
                        failures.append("an open handle read two versions")
                        return

    readers = [threading.Thread(target=read_whole, args=(i,)) for i in range(2)] + [threading.Thread(target=hold_open)]
    for thread in readers:
        thread.start()
    try:
        rng = random.Random(7)
        current = b""
        for step in range(60):
            if step % 3 == 2:
                piece = rng.randbytes(rng.choice([100, INLINE // 2, INLINE]))
                versions.add(current + piece)
                with cluster.fs.open(path, "ab") as f:
                    f.write(piece)
                current += piece
            else:
                current = rng.randbytes(rng.choice([1, INLINE - 1, INLINE, INLINE + 1, 3 * INLINE]))
                versions.add(current)
                cluster.fs.write_bytes(path, current)
            assert cluster.fs.read_bytes(path) == current
    finally:
        stop.set()
        for thread in readers:
            thread.join(timeout=60)
    assert not failures, failures
    assert min(counts) > 0, counts


def test_damaged_inline_data_is_an_error_never_bytes(make_cluster: Any) -> None:
    """Inline data is checked end to end: bytes damaged in the store (a bad disk under the
    database) fail the reader's crc32c check with a clear error."""
    c = make_cluster(servers=6)
    data = _content(5000, 3)
    c.fs.write_bytes("/damaged", data)
    ino = c.fs.stat("/damaged").ino
    with sqlite3.connect(os.path.join(c.root, "meta.db"), timeout=10) as db:
        (stored,) = db.execute("SELECT data FROM inline_blocks WHERE ino = ?", (ino,)).fetchone()
        flipped = bytes([stored[0] ^ 1]) + bytes(stored[1:])
        db.execute("UPDATE inline_blocks SET data = ? WHERE ino = ?", (flipped, ino))
    with pytest.raises(errors.ChecksumMismatch, match="inline data"):
        c.fs.read_bytes("/damaged")


def test_a_commit_answers_without_echoing_the_small_file_it_carried(cluster: Any) -> None:
    """The service neither sends an inline file's bytes back to the writer that committed
    them nor records them a second time in its journal of answers (``tectofs.wire.inline_echo``):
    every recorded answer stays far smaller than the file. The writer's handle, a fresh
    open and an older client that asks for the echo all read the file bit-exact."""
    fs = cluster.fs
    data = _content(40 * KiB, 7)
    with fs.open("/no-echo", "w+b") as f:
        f.write(data)
        f.flush()  # committed: the handle's layout is the commit's answer, made whole again
        f.seek(0)
        assert f.read() == data
    with fs.open("/no-echo", "rb") as f:
        assert f.read() == data
    with sqlite3.connect(os.path.join(cluster.root, "meta.db"), timeout=10) as db:
        (largest,) = db.execute("SELECT max(length(reply)) FROM requests").fetchone()
    assert largest < 4 * KiB, largest
    # An older client (its request without echo_inline) gets the bytes echoed, as before.
    st, again = fs.stat("/no-echo"), _content(30 * KiB, 8)
    block = messages.WrittenBlock(idx=0, block_id=0, length=len(again), chunks=[],
                                  inline=messages.InlineData(data=again, crc=crc(again)))
    request = messages.CommitRequest(ino=st.ino, handle=st.handle, size=len(again), blocks=[block], replace=True)
    echoed, _ = fs.run(fs.aio.metadata.rpc.call(fs.aio.metadata.address, messages.COMMIT, request))
    assert not echoed.inline_omitted and echoed.blocks[0].inline.data == again
    assert fs.read_bytes("/no-echo") == again


def test_an_omitted_inline_block_is_put_back_only_from_the_bytes_sent_with_its_crc() -> None:
    data = b"small file" * 100
    sent = [messages.WrittenBlock(idx=0, block_id=0, length=len(data), chunks=[],
                                  inline=messages.InlineData(data=data, crc=crc(data)))]
    attrs = messages.Attrs(ino=5, kind="file", mode=0o100644, uid=0, gid=0, size=len(data), atime=1.0, mtime=1.0,
                           ctime=1.0, nlink=1, policy="rs(4,2)", block_size=1 << 20, parent=1)
    stored = messages.Block(idx=0, block_id=0, policy="rs(4,2)", length=len(data), valid=len(data), chunks=[],
                            inline=messages.InlineData(data=data, crc=crc(data)))
    whole = messages.LayoutSegment(attrs=attrs, blocks=[stored], inline_max=INLINE)
    answer = inline_echo.omit(whole, sent)
    omitted = answer.blocks[0].inline
    assert answer.inline_omitted and omitted is not None and omitted.data == b"" and omitted.crc == crc(data)
    assert len(msgspec.msgpack.encode(answer)) < 400  # what goes on the wire and into the journal
    assert inline_echo.restore(answer, sent) == whole
    assert inline_echo.omit(whole, []) is whole  # nothing carried inline: nothing left out
    other = b"other bytes" * 90
    with pytest.raises(errors.ChecksumMismatch, match="does not match"):
        inline_echo.restore(answer, [messages.WrittenBlock(idx=0, block_id=0, length=len(other), chunks=[],
                                                           inline=messages.InlineData(data=other, crc=crc(other)))])


def test_a_sigkilled_metadata_service_loses_no_small_file_whose_close_returned(make_cluster: Any) -> None:
    c = make_cluster(servers=6)
    rng = random.Random(11)
    written = {f"/k/{i:03d}": rng.randbytes(rng.randrange(1, INLINE + 1)) for i in range(300)}
    c.fs.mkdir("/k")
    for path, data in written.items():
        c.fs.write_bytes(path, data)  # returned: committed
    c.kill_meta(signal.SIGKILL)
    c.restart_meta()
    with connect(c.address, credentials=c.credential_file) as fs:
        assert sorted(fs.listdir("/k")) == sorted(p.rsplit("/", 1)[1] for p in written)
        for path, data in written.items():
            assert fs.read_bytes(path) == data, path


@pytest.mark.slow
def test_through_the_mount_closed_small_files_survive_a_killed_service_and_fsync_survives_a_killed_mount(
        make_cluster: Any, tmp_path: Any) -> None:
    """The mount answers the close of a small new file before sending it (its bytes go with the
    create, in a batch: ``client/claims.py``). A metadata service SIGKILLed right after 200 such
    closes returned loses none of them: the mount sends them to its successor. An ``fsync`` waits
    for the sending: a mount SIGKILLed as soon as one returned loses nothing closed before it."""
    from tectofs.client.fuse import start_mount_process

    c = make_cluster(servers=6, meta_args=["--lease", "2"])
    mnt = tmp_path / "mnt"
    rng = random.Random(12)
    closed = {f"c{i:03d}": rng.randbytes(rng.randrange(1, INLINE + 1)) for i in range(200)}
    synced = {f"s{i:03d}": rng.randbytes(rng.randrange(1, INLINE + 1)) for i in range(50)}
    mount = start_mount_process(c.address, str(mnt), log_path=str(tmp_path / "mount.log"),
                                credentials=c.credential_file)
    try:
        os.mkdir(mnt / "k")
        for name, data in closed.items():
            (mnt / "k" / name).write_bytes(data)
        c.kill_meta(signal.SIGKILL)
        c.restart_meta()
        os.mkdir(mnt / "f")
        for name, data in synced.items():
            with open(mnt / "f" / name, "wb") as out:
                out.write(data)
                if name == "s049":
                    out.flush()
                    os.fsync(out.fileno())
        mount.process.kill()  # no unmount, no last sending: what fsync made durable is all there is
        mount.process.wait(timeout=30)
    finally:
        mount.stop()
    with connect(c.address, credentials=c.credential_file) as fs:
        assert sorted(fs.listdir("/k")) == sorted(closed)
        for name, data in closed.items():
            assert fs.read_bytes(f"/k/{name}") == data, name
        assert sorted(fs.listdir("/f")) == sorted(synced)
        for name, data in synced.items():
            assert fs.read_bytes(f"/f/{name}") == data, name


def _files_below(fs: Any, directory: str) -> set[str]:
    """Every file below ``directory``, as a path without the leading ``/``."""
    found: set[str] = set()
    for name, st in fs.scandir(directory):
        path = f"{directory}/{name}"
        found |= _files_below(fs, path) if st.is_dir else {path[1:]}
    return found


def _small_tree_tar(files: int, seed: int) -> tuple[bytes, dict[str, bytes]]:
    """A tarball of ``files`` small files in nested directories (sizes as in a package tree)."""
    rng = random.Random(seed)
    contents: dict[str, bytes] = {}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(files):
            name = f"pkg/m{i % 7}/s{i % 31}/f{i:05d}.py"
            data = rng.randbytes(min(INLINE, int(rng.lognormvariate(8, 1.2))))
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
            contents[name] = data
    return buffer.getvalue(), contents


@pytest.mark.slow
def test_failover_to_a_second_metadata_service_mid_untar_loses_and_duplicates_nothing(
        make_cluster: Any, postgres_server: str, tmp_path: Any) -> None:
    """``tar -x`` of 800 small files onto a mount of the group "A,B" over PostgreSQL; A is
    SIGKILLed once a third of them exist. tar succeeds; the tree read back through B alone
    is the tarball's, bit-exact, every file once and nothing else. (Leases of 5 s: B's changes
    wait one lease after it takes over, the grace period, as any restarted service's.)"""
    from tectofs.client.fuse import start_mount_process
    from tectofs.testing.postgres import new_database

    c = make_cluster(cluster_class=TwoMetaCluster, store=new_database(postgres_server), meta_args=["--lease", "5"])
    assert isinstance(c, TwoMetaCluster)
    archive, contents = _small_tree_tar(800, seed=5)
    (tmp_path / "tree.tar").write_bytes(archive)
    mount = start_mount_process(c.address, str(tmp_path / "mnt"), log_path=str(tmp_path / "mount.log"),
                                credentials=c.credential_file)
    killed: list[float] = []

    def kill_a_third_of_the_way() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            made = sum(len(names) for _, _, names in os.walk(tmp_path / "mnt" / "pkg"))
            if made >= len(contents) // 3:
                c.kill_meta(signal.SIGKILL)
                killed.append(time.monotonic())
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_a_third_of_the_way)
    killer.start()
    try:
        untar = subprocess.run(["tar", "-xf", str(tmp_path / "tree.tar"), "-C", str(tmp_path / "mnt")],
                               capture_output=True, text=True, timeout=600)
        ended = time.monotonic()
        killer.join(timeout=130)
        assert untar.returncode == 0, untar.stderr
        assert killed and killed[0] < ended, "A was not killed while tar ran"
    finally:
        mount.stop()
    with connect(c.second_address, credentials=c.credential_file) as fs:
        found = _files_below(fs, "/pkg")
        assert found == set(contents), (sorted(found - set(contents))[:5], sorted(set(contents) - found)[:5])
        for name, data in contents.items():
            assert fs.read_bytes("/" + name) == data, name


def _meta_calls(cluster: Any) -> dict[str, float]:
    """Requests the metadata service answered so far, by operation (its own metrics)."""
    from tests.test_metrics import scrape

    found: dict[str, float] = {}
    for (name, labels), count in scrape(cluster.metrics_urls["meta"]).items():
        if name == "tectofs_meta_requests_total":
            op = dict(labels)["op"]
            found[op] = found.get(op, 0.0) + count
    return found


def _calls_during(cluster: Any, action: Any) -> dict[str, float]:
    """Metadata requests (heartbeats and repairs left out) while ``action()`` ran."""
    background = {"heartbeat", "inventory", "inventory_begin", "repair_done", "repair_failed", "register_server",
                  "release_leases", "renew"}
    before = _meta_calls(cluster)
    action()
    after = _meta_calls(cluster)
    return {op: n - before.get(op, 0.0) for op, n in after.items() if op not in background and n > before.get(op, 0.0)}


def test_a_small_object_is_one_round_trip_through_the_library_fsspec_and_s3(make_cluster: Any) -> None:
    """A small file written (library ``write_bytes``, fsspec ``pipe``, S3 PUT) is one metadata
    call and no chunk request; read (``read_bytes``, ``cat``) one call as well, an S3 GET three
    (the object's attributes, its record, the open). The counts are the metadata service's
    own, so every path is measured the same way."""
    import boto3
    import fsspec
    from botocore.config import Config

    c = make_cluster(servers=6, metrics=True, s3_port=0)
    data = _content(20 * KiB, 4)
    c.fs.write_bytes("/warm", b"x")  # the client learns how large a file the service keeps inline
    assert _calls_during(c, lambda: c.fs.write_bytes("/lib", data)) == {"create": 1}
    assert _calls_during(c, lambda: c.fs.read_bytes("/lib") == data) == {"layout": 1}

    fs = fsspec.filesystem("tectofs", meta=c.address, credentials=c.credential_file, skip_instance_cache=True)
    fs.pipe_file("/warm2", b"x")
    assert _calls_during(c, lambda: fs.pipe_file("/viafsspec", data)) == {"create": 1}
    assert _calls_during(c, lambda: fs.cat_file("/viafsspec")) == {"layout": 1}
    assert fs.cat_file("/viafsspec") == data

    with open(c.s3_env_file) as f:
        env = dict(line.split("=", 1) for line in f.read().split())
    s3 = boto3.client("s3", endpoint_url=f"http://{c.s3_address}", aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1",
                      config=Config(retries={"max_attempts": 1}))
    s3.create_bucket(Bucket="small")
    s3.put_object(Bucket="small", Key="warm/x", Body=b"x")
    put = _calls_during(c, lambda: s3.put_object(Bucket="small", Key="warm/obj", Body=data))
    assert put == {"create": 1}, put  # the bucket is looked at only if the create finds no directory
    got: list[bytes] = []
    get = _calls_during(c, lambda: got.append(s3.get_object(Bucket="small", Key="warm/obj")["Body"].read()))
    assert got == [data] and get == {"lookup": 1, "getxattr": 1, "layout": 1}, get
    head = s3.head_object(Bucket="small", Key="warm/obj")
    assert head["ContentLength"] == len(data) and head["ETag"].strip('"') == __import__("hashlib").md5(data).hexdigest()
