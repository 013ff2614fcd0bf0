"""The chunk store alone: file format, verification, idempotence, group commit."""

from __future__ import annotations

import errno
import fcntl
import os
import threading

import pytest

from tectofs import checksum, errors
from tectofs.server.chunk.storage import ChunkStore, syncfs_group


def _put(store: ChunkStore, block_id: int, data: bytes, position: int = 0, **kw) -> None:
    store.write(block_id, position, memoryview(data), checksum.piece_crcs(data), checksum.crc(data), **kw)


@pytest.mark.parametrize("mode", ["group", "each", "none"])
def test_round_trip_and_ranged_reads(tmp_path, mode):
    store = ChunkStore(str(tmp_path), sync=mode)
    data = os.urandom(300_000)
    _put(store, 7, data, position=3)
    back, crcs, info = store.read(7)
    assert bytes(back) == data and info.position == 3 and info.whole_crc == checksum.crc(data)
    part, crcs, _ = store.read(7, offset=65536, length=70000)  # extended to whole pieces
    assert bytes(part) == data[65536 : 3 * 65536] and len(crcs) == 2
    with pytest.raises(errors.InvalidArgument):
        store.read(7, offset=100)
    assert store.chunk_count == 1 and store.used_bytes > len(data)


def test_received_damage_is_refused(tmp_path):
    store = ChunkStore(str(tmp_path))
    data = bytearray(os.urandom(200_000))
    crcs = checksum.piece_crcs(data)
    data[70_000] ^= 1
    with pytest.raises(errors.ChecksumMismatch, match="as received"):
        store.write(1, 0, memoryview(data), crcs, 0)
    assert not store.exists(1)


def test_idempotent_put_and_conflicts(tmp_path):
    store = ChunkStore(str(tmp_path))
    data = os.urandom(1000)
    _put(store, 5, data)
    _put(store, 5, data)  # the same chunk again: fine
    with pytest.raises(errors.AlreadyExists):
        _put(store, 5, os.urandom(1000))
    _put(store, 5, b"repaired", overwrite=True)
    assert bytes(store.read(5)[0]) == b"repaired"
    assert store.chunk_count == 1


def test_torn_chunk_is_rewritten_by_a_retry(tmp_path):
    store = ChunkStore(str(tmp_path))
    data = os.urandom(100_000)
    _put(store, 9, data)
    with open(store.path(9), "r+b") as f:
        f.truncate(5000)  # what a crash before the group sync can leave behind
    with pytest.raises(errors.ChecksumMismatch):
        store.read(9)
    _put(store, 9, data)  # the writer's retry
    assert bytes(store.read(9)[0]) == data


def test_bit_flip_on_disk_is_never_served(tmp_path):
    store = ChunkStore(str(tmp_path))
    data = os.urandom(200_000)
    _put(store, 3, data)
    with open(store.path(3), "r+b") as f:
        f.seek(150_000)
        byte = f.read(1)
        f.seek(150_000)
        f.write(bytes([byte[0] ^ 0x10]))
    with pytest.raises(errors.ChecksumMismatch, match="offset 131072"):
        store.read(3)
    assert bytes(store.read(3, 0, 65536)[0]) == data[:65536]  # undamaged pieces still served


def test_group_sync_covers_concurrent_writers_with_fewer_syncs(tmp_path):
    group = syncfs_group(str(tmp_path))
    barrier = threading.Barrier(32)

    def waiter() -> None:
        barrier.wait(timeout=10)
        for _ in range(5):
            group.wait_durable()

    threads = [threading.Thread(target=waiter) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert 1 <= group.syncs < 32 * 5


def test_restart_counts_what_is_stored(tmp_path):
    store = ChunkStore(str(tmp_path))
    for i in range(5):
        _put(store, 100 + i, os.urandom(1000 * (i + 1)))
    store.delete(101)
    again = ChunkStore(str(tmp_path))
    assert again.chunk_count == 4 and again.used_bytes == store.used_bytes


def test_a_rebuild_never_replaces_a_sound_chunk_of_another_position(tmp_path):
    store = ChunkStore(str(tmp_path))
    placed, rebuilt = os.urandom(70_000), os.urandom(70_000)
    _put(store, 9, placed, position=2)
    with pytest.raises(errors.AlreadyExists, match="holds position 2"):
        _put(store, 9, rebuilt, position=4, overwrite=True)  # a stale rebuild order
    assert bytes(store.read(9)[0]) == placed
    _put(store, 9, rebuilt, position=2, overwrite=True)  # the same position: a rebuild in place
    assert bytes(store.read(9)[0]) == rebuilt
    with open(store.path(9), "r+b") as f:  # damaged: whatever position it was, it may be replaced
        f.write(b"\xff" * 10)
    _put(store, 9, placed, position=4, overwrite=True)
    assert store.info(9).position == 4 and store.verify(9).whole_crc == checksum.crc(placed)


def test_verify_reads_every_byte_and_the_block_ids_are_listed(tmp_path):
    store = ChunkStore(str(tmp_path))
    data = os.urandom(3 * 65536 + 5)
    _put(store, 0x1234, data)
    _put(store, 0x99, b"x")
    assert sorted(store.block_ids()) == [0x99, 0x1234]
    store.verify(0x1234)
    with open(store.path(0x1234), "r+b") as f:
        f.seek(2 * 65536 + 3)
        f.write(b"\x00" if data[2 * 65536 + 3] else b"\x01")
    with pytest.raises(errors.ChecksumMismatch, match="piece at offset 131072"):
        store.verify(0x1234)


def _aligned(data: bytes):
    from tectofs.buffers import BufferPool

    view = BufferPool(1 << 30, aligned=True).get(len(data))  # as a chunk server receives it
    view[:] = data
    return view


@pytest.mark.parametrize("extra", [0, 100, 4095])
def test_large_chunks_are_written_with_o_direct_and_read_back_whole(tmp_path, monkeypatch, extra):
    from tectofs.server.chunk import fileio, storage

    direct_writes: list[int] = []
    real = fileio.write_direct_then_rest

    def counting(fd, data, prefix, rest):
        assert os.O_DIRECT & fcntl.fcntl(fd, fcntl.F_GETFL)
        direct_writes.append(prefix)
        return real(fd, data, prefix, rest)

    monkeypatch.setattr(storage, "write_direct_then_rest", counting)
    store = ChunkStore(str(tmp_path))
    data = os.urandom((1 << 20) + extra)  # an unaligned tail goes through the page cache
    store.write(9, 2, _aligned(data), checksum.piece_crcs(data), checksum.crc(data))
    assert direct_writes == [1 << 20] and store.direct_io
    back, _, info = store.read(9)
    assert bytes(back) == data and info.position == 2
    store.verify(9)  # footer, every piece, the whole crc
    # Small chunks, unaligned buffers and read-only bytes go through the page cache.
    _put(store, 10, data)
    store.write(11, 0, _aligned(data[:4096]), checksum.piece_crcs(data[:4096]), checksum.crc(data[:4096]))
    assert direct_writes == [1 << 20]
    assert bytes(store.read(10)[0]) == data and bytes(store.read(11)[0]) == data[:4096]


@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_a_file_system_that_refuses_o_direct_gets_buffered_writes(tmp_path, monkeypatch, refused_at):
    from tectofs.server.chunk import fileio

    real_open, real_pwritev = os.open, os.pwritev
    refused: list[str] = []

    def open_(path, flags, *args):
        if refused_at == "open" and flags & os.O_DIRECT:
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def pwritev(fd, buffers, offset):
        if refused_at == "write" and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            refused.append(str(fd))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(fileio.os, "pwritev", pwritev)
    store = ChunkStore(str(tmp_path))
    data = os.urandom(3 << 20)
    store.write(4, 0, _aligned(data), checksum.piece_crcs(data), checksum.crc(data))
    assert len(refused) == 1 and not store.direct_io  # tried once, then never again
    assert bytes(store.read(4)[0]) == data
    store.verify(4)
    store.write(5, 0, _aligned(data), checksum.piece_crcs(data), checksum.crc(data))
    assert len(refused) == 1 and bytes(store.read(5)[0]) == data


def test_a_write_goes_by_how_its_own_file_was_opened(tmp_path, monkeypatch):
    """Another I/O thread turning O_DIRECT off between this write's open and its write
    must not send unaligned footers through a direct descriptor (EINVAL)."""
    store = ChunkStore(str(tmp_path))
    real_create = store._create

    def create_then_other_thread_turns_it_off(path, direct):
        opened = real_create(path, direct)
        store.direct_io = False
        return opened

    monkeypatch.setattr(store, "_create", create_then_other_thread_turns_it_off)
    data = os.urandom((1 << 20) + 100)
    store.write(3, 0, _aligned(data), checksum.piece_crcs(data), checksum.crc(data))
    assert bytes(store.read(3)[0]) == data and not store.direct_io
    store.verify(3)
