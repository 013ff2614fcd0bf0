"""Truncate and sparse files: bytes cut off by a truncate never come back, growing works with
unflushed writes, and holes (never-written blocks, zero heads and tails) are not stored.

Each of the first three was a silent-corruption or EIO bug found through the mount; each is
checked through the client library and, where the kernel path differs, through the mount.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Iterator

import pytest

from tectofs.wire import messages

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def _name(prefix: str) -> str:
    return f"/{prefix}-{uuid.uuid4().hex[:8]}"


def _chunk_bytes(cluster: Any) -> int:
    """Bytes of chunk files and packed-chunk segments on every chunk server's disk."""
    total = 0
    for data_dir in cluster.chunk_data_dirs:
        for directory, _, files in os.walk(data_dir):
            total += sum(os.path.getsize(os.path.join(directory, f)) for f in files if f.endswith((".chunk", ".pack")))
    return total


# ---------------------------------------------------------------------- through the library


@pytest.mark.parametrize("commit_with", ["read", "flush"])
def test_shrink_to_zero_then_grow_reads_zeros(cluster: Any, commit_with: str) -> None:
    fs, path = cluster.fs, _name("trunc0")
    fs.write_bytes(path, b"")
    handle = fs.run(fs.aio.open(path, "r+b"))
    fs.run(handle.write(0, b"A" * 4096))
    if commit_with == "read":
        assert fs.run(handle.read(0, 4096)) == b"A" * 4096  # reads flush: the block is committed
    else:
        fs.run(handle.flush())
    fs.run(handle.truncate(0))
    fs.run(handle.truncate(4096))
    assert fs.run(handle.read(0, 4096)) == bytes(4096)
    fs.run(handle.close())
    assert fs.read_bytes(path) == bytes(4096)  # and after close and reopen


def test_shrink_to_a_block_boundary_then_grow_reads_zeros(cluster: Any) -> None:
    fs, path = cluster.fs, _name("trunc-boundary")
    data = os.urandom(3 * MiB)  # three 1 MiB blocks
    fs.write_bytes(path, data)
    handle = fs.run(fs.aio.open(path, "r+b"))
    fs.run(handle.truncate(MiB))
    fs.run(handle.truncate(3 * MiB))
    assert fs.run(handle.read(0, 3 * MiB)) == data[:MiB] + bytes(2 * MiB)
    fs.run(handle.truncate(MiB // 2))
    fs.run(handle.flush())
    fs.run(handle.truncate(2 * MiB))  # grow past the clipped block, then commit again
    fs.run(handle.close())
    assert fs.read_bytes(path) == data[: MiB // 2] + bytes(MiB * 3 // 2)


def test_shrink_drops_blocks_still_in_flight(cluster: Any) -> None:
    """Blocks sent but not yet committed must not be committed after a shrink and a grow."""
    fs, path = cluster.fs, _name("trunc-inflight")
    fs.write_bytes(path, b"")
    handle = fs.run(fs.aio.open(path, "r+b"))
    data = os.urandom(4 * MiB + 100)
    fs.run(handle.write(0, data))  # whole blocks are sent while the caller goes on
    fs.run(handle.truncate(MiB + 10))
    fs.run(handle.truncate(4 * MiB + 100))
    fs.run(handle.close())
    assert fs.read_bytes(path) == data[: MiB + 10] + bytes(3 * MiB + 90)


def test_growing_truncate_with_unflushed_writes(cluster: Any) -> None:
    fs, path = cluster.fs, _name("grow")
    fs.write_bytes(path, b"")
    handle = fs.run(fs.aio.open(path, "r+b"))
    fs.run(handle.write(0, b"x" * 100))
    fs.run(handle.truncate(300_000))  # inside the block, past its 64 KiB buffer: was ValueError: negative count
    assert fs.run(handle.read(0, 300_000)) == b"x" * 100 + bytes(300_000 - 100)
    fs.run(handle.write(200, b"x"))
    fs.run(handle.truncate(2 * MiB + 5))
    fs.run(handle.close())
    assert fs.read_bytes(path) == b"x" * 100 + bytes(100) + b"x" + bytes(2 * MiB + 5 - 201)


def test_one_byte_at_10_gib_stores_one_small_block(cluster: Any) -> None:
    fs, path = cluster.fs, _name("sparse")
    before = _chunk_bytes(cluster)
    handle = fs.run(fs.aio.open(path, "wb"))
    fs.run(handle.write(10 * GiB, b"z"))
    fs.run(handle.close())
    layout = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path=path)))
    assert [b.idx for b in layout.blocks] == [10 * GiB // MiB]
    assert layout.blocks[0].length == 1
    assert layout.attrs.size == 10 * GiB + 1
    assert fs.stat(path).stored == 1
    stored = _chunk_bytes(cluster) - before
    assert 0 < stored < 64 * KiB, stored  # six tiny chunks, not 10 GiB x 1.5 of zeros
    assert fs.read_range(path, 0, 4096) == bytes(4096)
    assert fs.read_range(path, 5 * GiB + 12345, 3 * MiB) == bytes(3 * MiB)
    assert fs.read_range(path, 10 * GiB - 10, 100) == bytes(10) + b"z"


def test_grown_file_and_zero_blocks_store_nothing(cluster: Any) -> None:
    fs, path = cluster.fs, _name("zeros")
    data = bytearray(os.urandom(3 * MiB))
    fs.write_bytes(path, bytes(data))
    blocks_before = len(fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path=path))).blocks)
    handle = fs.run(fs.aio.open(path, "r+b"))
    fs.run(handle.write(MiB, bytes(MiB)))  # the middle block zeroed whole: a hole now
    fs.run(handle.truncate(1 * GiB))  # grown by truncate: nothing to store
    fs.run(handle.close())
    data[MiB : 2 * MiB] = bytes(MiB)
    layout = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path=path)))
    assert blocks_before == 3
    assert [b.idx for b in layout.blocks] == [0, 2]
    assert fs.stat(path).stored == 2 * MiB
    assert fs.read_range(path, 0, 3 * MiB) == bytes(data)
    assert fs.read_range(path, GiB - MiB, 2 * MiB) == bytes(MiB)


def test_partial_block_stores_only_its_data(cluster: Any) -> None:
    """A write into the middle of a new block stores from the piece it starts in, not the
    zeros before it; its head reads as zeros."""
    fs, path = cluster.fs, _name("head")
    handle = fs.run(fs.aio.open(path, "wb"))
    fs.run(handle.write(MiB - 1000, b"tail of the block"))
    fs.run(handle.close())
    (block,) = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path=path))).blocks
    assert block.start == MiB - 64 * KiB
    assert block.length == 64 * KiB - 1000 + len(b"tail of the block")
    assert fs.read_bytes(path) == bytes(MiB - 1000) + b"tail of the block"
    # rewriting inside it, before its head, reads the head back as zeros
    with fs.open(path, "r+b") as f:
        f.seek(10)
        f.write(b"head")
    assert fs.read_bytes(path) == bytes(10) + b"head" + bytes(MiB - 1014) + b"tail of the block"


# ---------------------------------------------------------------------- through the mount


@pytest.fixture(scope="module")
def mountpoint(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.test_fuse import _REASON

    if _REASON is not None:
        pytest.skip(_REASON)
    from tectofs.client.fuse import start_mount_process

    where = str(tmp_path_factory.mktemp("trunc-mnt"))
    process = start_mount_process(cluster.address, where, log_path=str(tmp_path_factory.mktemp("log") / "mount.log"))
    try:
        yield where
    finally:
        process.stop()


def _aligned_write(fd: int, data: bytes, offset: int) -> None:
    import mmap

    with mmap.mmap(-1, max(4096, len(data))) as buffer:
        buffer[: len(data)] = data
        assert os.pwritev(fd, [memoryview(buffer)[: len(data)]], offset) == len(data)


def _aligned_read(fd: int, length: int, offset: int) -> bytes:
    import mmap

    with mmap.mmap(-1, max(4096, length)) as buffer:
        n = os.preadv(fd, [memoryview(buffer)[:length]], offset)
        return bytes(buffer[:n])


@pytest.mark.fuse
@pytest.mark.parametrize("commit_with", ["read", "fsync"])
def test_mount_odirect_truncate_to_zero_then_up_reads_zeros(mountpoint: str, commit_with: str) -> None:
    """The reproduction from the bug report, step by step."""
    path = mountpoint + _name("odirect")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o644)
    try:
        _aligned_write(fd, b"A" * 4096, 0)
        if commit_with == "read":
            assert _aligned_read(fd, 4096, 0) == b"A" * 4096
        else:
            os.fsync(fd)
        os.ftruncate(fd, 0)
        os.ftruncate(fd, 4096)
        assert _aligned_read(fd, 4096, 0) == bytes(4096)
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == bytes(4096)


@pytest.mark.fuse
def test_mount_growing_ftruncate_with_unflushed_writes(mountpoint: str) -> None:
    path = mountpoint + _name("grow")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"y" * 100)
        os.ftruncate(fd, 300_000)  # inside the block, past its write buffer: was EIO
        assert os.fstat(fd).st_size == 300_000
    finally:
        os.close(fd)
    with open(path, "rb") as f:
        assert f.read() == b"y" * 100 + bytes(300_000 - 100)


@pytest.mark.fuse
def test_mount_sparse_file_reports_what_it_stores(mountpoint: str) -> None:
    path = mountpoint + _name("sparse")
    with open(path, "wb") as f:
        f.seek(10 * GiB)
        f.write(b"z")
    with open(path, "r+b") as f:
        f.truncate(20 * GiB)
    st = os.stat(path)
    assert st.st_size == 20 * GiB
    assert st.st_blocks * 512 <= 4096  # du sees one byte, not 20 GiB
    with open(path, "rb") as f:
        f.seek(10 * GiB - 4)
        assert f.read(8) == bytes(4) + b"z" + bytes(3)
