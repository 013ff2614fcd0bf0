"""Packed chunks (``server/chunk/packs.py``, ``tectofs chunk --pack-max``): small chunks in
segment files, one fdatasync per batch; as durable, verified and healable as chunk files."""

from __future__ import annotations

import errno
import glob
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tectofs import checksum
from tectofs.errors import AlreadyExists, ChecksumMismatch, ChunkMissing
from tectofs.server.chunk import packs
from tectofs.server.chunk.packs import ALIGN, HEADER, PackStore
from tectofs.server.chunk.storage import ChunkStore
from tectofs.wire import messages
from tests.test_cluster import flip_byte
from tests.test_self_healing import _server_id, _wait_clean

KiB, MiB = 1 << 10, 1 << 20


def _chunk(n: int, seed: int = 0) -> tuple[memoryview, list[int], int]:
    data = memoryview(os.urandom(n) if seed == 0 else bytes((seed + i) % 251 for i in range(n)))
    return data, checksum.piece_crcs(data), checksum.crc(data)


def _put(store: ChunkStore, block_id: int, position: int, data: memoryview, overwrite: bool = False) -> None:
    store.write(block_id, position, data, checksum.piece_crcs(data), checksum.crc(data), overwrite)


def _records(data_dir: str) -> dict[int, tuple[str, int]]:
    """Live records on disk: block id -> (segment path, offset), read as the store's start does."""
    return {info.block_id: (path, offset)
            for path, offset, info, live in packs.records(os.path.join(data_dir, "packs")) if live}


def _number(segment_path: str) -> int:
    return int(os.path.basename(segment_path)[: -len(packs.SUFFIX)], 16)


def test_round_trip_ranges_verify_and_restart(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    chunks = {block_id: _chunk(n)[0] for block_id, n in enumerate([1, 65536, 65537, 300_000, 1 * MiB], start=1)}
    for block_id, data in chunks.items():
        _put(store, block_id, block_id % 6, data)
    assert not glob.glob(os.path.join(tmp_path, "chunks", "*", "*.chunk"))  # all packed
    assert sorted(store.block_ids()) == sorted(chunks) and store.chunk_count == len(chunks)
    for block_id, data in chunks.items():
        assert bytes(store.read(block_id)[0]) == bytes(data)
        assert store.verify(block_id).position == block_id % 6
    whole, crcs, info = store.read(4, 65536, 10)  # whole pieces covering the range
    assert bytes(whole) == bytes(chunks[4][65536 : 2 * 65536]) and crcs == info.piece_crcs[1:2]
    used = store.used_bytes
    assert used >= sum(len(d) for d in chunks.values()) and used % ALIGN == 0
    _put(store, 2, 2, chunks[2])  # the same chunk again: a retry, nothing new stored
    assert store.used_bytes == used
    with pytest.raises(AlreadyExists):
        _put(store, 2, 2, _chunk(65536)[0])
    assert store.delete(3) and not store.delete(3) and not store.exists(3)
    with pytest.raises(ChunkMissing):
        store.read(3)

    again = ChunkStore(str(tmp_path), pack_max_bytes=0)  # restarted without packing: still readable
    assert sorted(again.block_ids()) == sorted(set(chunks) - {3}) and again.used_bytes == used - packs._record_size(65537)
    for block_id in set(chunks) - {3}:
        assert bytes(again.read(block_id)[0]) == bytes(chunks[block_id])
    _put(again, 9, 0, _chunk(1000)[0])  # new chunks go to files again
    assert glob.glob(os.path.join(tmp_path, "chunks", "*", "*.chunk"))


def _append(store: PackStore, block_id: int, data: memoryview) -> None:
    store.append(block_id, 0, data, checksum.piece_crcs(data), checksum.crc(data))


def test_a_segment_gone_from_disk_is_lost_not_deleted(tmp_path: Any) -> None:
    """Segment files removed behind the store's back (by someone else): the inventory's
    listing forgets their chunks (so they are reported missing and rebuilt), reads say
    missing, their space is no longer counted, a write that went into a removed segment fails
    instead of being acknowledged, and new records go to a new segment."""
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=128 * KiB)  # 30,000-byte chunks: 4 per segment
    chunks = {block_id: _chunk(30_000, seed=block_id)[0] for block_id in range(1, 7)}
    for block_id, data in chunks.items():
        _append(store, block_id, data)
    retired, active = sorted(glob.glob(os.path.join(tmp_path, "*.pack")))  # blocks 1-4, blocks 5-6
    record = packs._record_size(30_000)
    os.unlink(retired)
    assert sorted(store.block_ids()) == [5, 6]  # the inventory's listing: 1-4 are missing now
    assert store.used_bytes == 2 * record and store.chunk_count == 2 and not store.holds(1)
    assert store.dead_bytes == os.path.getsize(active) - 2 * record
    with pytest.raises(ChunkMissing):
        store.read(1)
    os.unlink(active)
    with pytest.raises(OSError, match="gone from disk"):
        _append(store, 7, chunks[1])  # synced into an unlinked file: not acknowledged
    assert store.block_ids() == [] and store.used_bytes == 0 and not store.holds(7)
    with pytest.raises(ChunkMissing):
        store.verify(5)  # the scrubber's read
    _append(store, 8, chunks[2])  # rebuilt or new: into a new segment, on disk
    assert store.block_ids() == [8] and bytes(store.read(8)[0]) == bytes(chunks[2])
    assert [os.path.basename(p) for p in glob.glob(os.path.join(tmp_path, "*.pack"))] == ["00000003.pack"]
    store.close()
    again = PackStore(str(tmp_path), 64 * KiB, segment_bytes=128 * KiB)
    assert again.block_ids() == [8] and again.dead_bytes == 0


def test_a_removed_packs_directory_is_made_again_for_new_chunks(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    _put(store, 1, 0, _chunk(70_000)[0])
    shutil.rmtree(os.path.join(tmp_path, "packs"))
    assert store.block_ids() == []
    data = _chunk(70_000)[0]
    _put(store, 2, 0, data)
    assert store.block_ids() == [2] and bytes(store.read(2)[0]) == bytes(data)


def test_a_rebuild_replaces_the_chunk_between_files_and_packs(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=64 * KiB)
    big, small = _chunk(100_000)[0], _chunk(50_000)[0]
    _put(store, 7, 1, big)  # too big to pack: a file
    assert store.chunk_count == 1 and os.path.exists(store.path(7))
    _put(store, 7, 1, small, overwrite=True)  # rebuilt smaller: packed, the file removed
    assert not os.path.exists(store.path(7)) and store.block_ids() == [7] and store.chunk_count == 1
    assert bytes(store.read(7)[0]) == bytes(small)
    _put(store, 7, 1, big, overwrite=True)  # and back
    assert os.path.exists(store.path(7)) and not store.packs.holds(7)  # type: ignore[union-attr]
    assert bytes(store.read(7)[0]) == bytes(big) and store.chunk_count == 1
    assert store.packs.used_bytes == 0  # type: ignore[union-attr]
    ChunkStore(str(tmp_path))  # a restart removes the segment with nothing live in it
    assert not glob.glob(os.path.join(tmp_path, "packs", "*.pack"))
    with pytest.raises(AlreadyExists):  # a rebuild never replaces a sound chunk of another position
        _put(store, 7, 2, big, overwrite=True)


def test_damage_is_detected_and_a_damaged_header_skips_only_its_record(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    chunks = {block_id: _chunk(200_000)[0] for block_id in range(1, 6)}
    for block_id, data in chunks.items():
        _put(store, block_id, 0, data)
    records = _records(str(tmp_path))
    path, offset = records[2]
    flip_byte(path, offset + HEADER.size + 4 * 4 + 150_000)  # a data byte of block 2
    with pytest.raises(ChecksumMismatch):
        store.read(2)
    with pytest.raises(ChecksumMismatch):
        store.verify(2)
    assert bytes(store.read(2, 0, 65536)[0]) == bytes(chunks[2][:65536])  # undamaged pieces still serve
    path, offset = records[3]
    flip_byte(path, offset + 12)  # block 3's header
    with pytest.raises(ChecksumMismatch):
        store.info(3)
    again = ChunkStore(str(tmp_path))
    assert sorted(again.block_ids()) == [1, 2, 4, 5]  # 3 lost its header; the records after it are found
    for block_id in (1, 4, 5):
        assert bytes(again.read(block_id)[0]) == bytes(chunks[block_id])


def test_a_torn_tail_loses_only_unacknowledged_records(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    chunks = {block_id: _chunk(100_000)[0] for block_id in range(1, 5)}
    for block_id, data in chunks.items():
        _put(store, block_id, 0, data)
    path, offset = _records(str(tmp_path))[4]
    os.truncate(path, offset + HEADER.size + 1000)  # the last record cut off mid-way, as by a crash
    again = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    for block_id in (1, 2, 3):
        assert bytes(again.read(block_id)[0]) == bytes(chunks[block_id])
    with pytest.raises(ChecksumMismatch):
        again.read(4)  # indexed by its header, but its pieces fail: reported, rewritten by a retry
    _put(again, 4, 0, chunks[4])  # the writer's retry (a damaged chunk may be replaced)
    assert bytes(again.read(4)[0]) == bytes(chunks[4])
    assert bytes(ChunkStore(str(tmp_path)).read(4)[0]) == bytes(chunks[4])  # the newer record wins at start


def test_concurrent_writers_share_syncs_and_segments_roll_and_go(tmp_path: Any) -> None:
    synced: list[float] = []
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB, on_sync=synced.append)
    chunks = {block_id: _chunk(40_000, seed=block_id)[0] for block_id in range(1, 401)}

    def put(block_id: int) -> None:
        data = chunks[block_id]
        store.append(block_id, 0, data, checksum.piece_crcs(data), checksum.crc(data))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, chunks))
    segments = glob.glob(os.path.join(tmp_path, "*.pack"))
    assert len(segments) >= 400 * packs._record_size(40_000) // MiB
    assert len(synced) < len(chunks), "every write synced alone"
    for block_id, data in chunks.items():
        assert bytes(store.read(block_id)[0]) == bytes(data)
    for block_id in range(1, 301):
        store.delete(block_id)
    left = glob.glob(os.path.join(tmp_path, "*.pack"))
    assert len(left) < len(segments)  # segments whose records were all deleted are gone
    reopened = PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB)
    assert sorted(reopened.block_ids()) == list(range(301, 401))
    assert reopened.used_bytes == 100 * packs._record_size(40_000)


def test_reads_and_deletes_during_writes(tmp_path: Any) -> None:
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=512 * KiB)
    stop = threading.Event()
    errors: list[BaseException] = []
    data = _chunk(30_000, seed=3)[0]
    crcs, whole = checksum.piece_crcs(data), checksum.crc(data)

    def writer(first: int) -> None:
        for block_id in range(first, first + 150):
            store.append(block_id, 0, data, crcs, whole)

    def reader() -> None:
        while not stop.is_set():
            for block_id in store.block_ids():
                try:
                    assert bytes(store.read(block_id)[0]) == bytes(data)
                    if block_id % 3 == 0:
                        store.delete(block_id)
                except ChunkMissing:
                    pass  # deleted meanwhile
                except BaseException as exc:
                    errors.append(exc)
                    return

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(writer, [1, 1001, 2001, 3001]))
    stop.set()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors[:3]
    kept = store.block_ids()
    assert len(kept) >= 400 and all(bytes(store.read(b)[0]) == bytes(data) for b in kept)
    assert sorted(PackStore(str(tmp_path), 64 * KiB, segment_bytes=512 * KiB).block_ids()) == sorted(kept)


def test_pack_max_out_of_range_is_refused(tmp_path: Any) -> None:
    from tectofs.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="packed chunks"):
        ChunkStore(str(tmp_path), pack_max_bytes=64 * MiB)


def test_a_cluster_with_packed_chunks_heals_and_reads_back(make_cluster: Any) -> None:
    """End to end with every chunk packed: a lost server is rebuilt (into packs), a flipped
    byte in a packed record is found by the scrubber and rebuilt, and files read back."""
    c = make_cluster(servers=7, block_size=256 * KiB, chunk_args=["--pack-max", "1M", "--scrub-rate", "64",
                                                                   "--scrub-interval", "1"],
                     meta_args=["--repair-after", "2", "--repair-interval", "0.5"])
    files = {f"/p/f{i}": os.urandom(n) for i, n in enumerate([3 * MiB + 17, 700 * KiB, 1, 64 * KiB])}
    c.fs.mkdir("/p")
    for path, data in files.items():
        c.fs.write_bytes(path, data)
    assert not glob.glob(os.path.join(c.root, "chunk-*", "chunks", "*", "*.chunk"))
    assert glob.glob(os.path.join(c.root, "chunk-*", "packs", "*.pack"))
    layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path="/p/f0")))
    block_id = layout.blocks[0].block_id
    flipped = [d for d in c.chunk_data_dirs if block_id in _records(d)][0]
    path, offset = _records(flipped)[block_id]
    flip_byte(path, offset + ALIGN + 100)  # inside the record's data
    deadline = time.monotonic() + 60
    while not any(s.stats.get("scrub_corrupt") for s in c.fs.servers()):
        assert time.monotonic() < deadline, "the scrubber did not report the flipped byte in a packed chunk"
        time.sleep(0.3)
    _wait_clean(c, timeout_s=60)  # the damaged chunk rebuilt
    lost = _server_id(c, 0)
    c.kill_chunk_server(0)
    shutil.rmtree(c.chunk_data_dirs[0])  # lost for good: its chunks are rebuilt into the others' packs
    deadline = time.monotonic() + 60
    while any(s.server_id == lost and s.live for s in c.fs.servers()):
        assert time.monotonic() < deadline, "the metadata service did not notice the lost server"
        time.sleep(0.2)
    _wait_clean(c, timeout_s=120)
    assert lost not in {chunk.server_id for path in files
                        for block in c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path=path))).blocks for chunk in block.chunks}
    c.kill_chunk_server(1)
    c.kill_chunk_server(2)
    for path, data in files.items():
        assert c.fs.read_bytes(path) == data, path


def test_a_failed_sync_fails_its_writers_and_new_chunks_go_to_a_new_segment(tmp_path: Any,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """After an fdatasync error, Linux may mark the lost pages clean: a later sync of the same
    file succeeding would not mean the data is on disk. The segment is never trusted again."""
    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    first = _chunk(10_000)[0]
    _put(store, 1, 0, first)
    real = os.fdatasync
    calls = {"n": 0}

    def failing_once(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fdatasync", failing_once)
    with pytest.raises(OSError, match="Input/output"):
        _put(store, 2, 0, _chunk(10_000)[0])
    assert not store.exists(2)
    second = _chunk(10_000)[0]
    _put(store, 3, 0, second)  # a new segment, synced for real
    assert len(glob.glob(os.path.join(tmp_path, "packs", "*.pack"))) == 2
    assert bytes(store.read(1)[0]) == bytes(first) and bytes(store.read(3)[0]) == bytes(second)


def test_a_full_disk_is_no_space(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from tectofs.errors import NoSpace

    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)

    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packs, "write_all", full)
    with pytest.raises(NoSpace, match="disk is full"):
        _put(store, 1, 0, _chunk(1000)[0])
    assert not store.exists(1) and store.chunk_count == 0


def test_a_chunk_server_killed_mid_burst_keeps_every_acknowledged_packed_chunk(make_cluster: Any) -> None:
    """SIGKILL a packing chunk server while clients write, start it again: its index is
    rebuilt from the segments, every committed file reads back bit-exact, including with two
    other servers down afterwards (so reads need the restarted server's packed chunks)."""
    c = make_cluster(servers=7, block_size=256 * KiB, chunk_args=["--pack-max", "1M"],
                     meta_args=["--repair-after", "2", "--repair-interval", "0.5"])
    c.fs.mkdir("/burst")
    written: dict[str, bytes] = {}
    failures: list[str] = []
    stop = threading.Event()

    def writer(worker: int) -> None:
        i = 0
        while not stop.is_set():
            path, data = f"/burst/w{worker}-{i}", os.urandom(600 * KiB + i)
            try:
                c.fs.write_bytes(path, data)
                written[path] = data
            except Exception as exc:  # a write may fail while the server dies; it is then not committed
                failures.append(f"{path}: {exc}")
            i += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(written) < 12:
            assert time.monotonic() < deadline, f"writes did not start: {failures[:3]}"
            time.sleep(0.05)
        c.kill_chunk_server(0)  # SIGKILL, mid-write
        time.sleep(1.0)
        c.restart_chunk(0)
        while len(written) < 40:
            assert time.monotonic() < deadline + 60, f"writes stalled: {failures[:3]}"
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    _wait_clean(c, timeout_s=120)
    c.kill_chunk_server(1)
    c.kill_chunk_server(2)
    for path, data in written.items():
        assert c.fs.read_bytes(path) == data, path


def _segment_bytes(root: str) -> int:
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(root, "*.pack")))


def test_compaction_returns_the_space_of_deleted_chunks(tmp_path: Any) -> None:
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB)
    chunks = {block_id: _chunk(30_000, seed=block_id)[0] for block_id in range(1, 201)}
    for block_id, data in chunks.items():
        store.append(block_id, block_id % 6, data, checksum.piece_crcs(data), checksum.crc(data))
    for block_id in chunks:
        if block_id % 4:  # three in four deleted, spread over every segment
            store.delete(block_id)
    kept = {b: d for b, d in chunks.items() if b % 4 == 0}
    before = _segment_bytes(str(tmp_path))
    assert store.dead_bytes == before - store.used_bytes > before / 2  # what compaction can return
    moved = 0
    while (step := store.compact(segments_max=2)):
        moved += step
    after = _segment_bytes(str(tmp_path))
    assert moved > 0 and after < before / 2, (before, after)
    assert store.dead_bytes == after - store.used_bytes
    assert store.used_bytes == len(kept) * packs._record_size(30_000)
    for block_id, data in kept.items():
        assert bytes(store.read(block_id)[0]) == bytes(data) and store.verify(block_id).position == block_id % 6
    reopened = PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB)
    assert sorted(reopened.block_ids()) == sorted(kept)  # no moved copy of a deleted chunk comes back
    for block_id, data in kept.items():
        assert bytes(reopened.read(block_id)[0]) == bytes(data)


def test_compaction_races_deletes_and_rebuilds_without_resurrecting_anything(tmp_path: Any) -> None:
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=512 * KiB)
    old, new = _chunk(20_000, seed=1)[0], _chunk(20_000, seed=2)[0]
    for block_id in range(1, 301):
        store.append(block_id, 0, old, checksum.piece_crcs(old), checksum.crc(old))
    for block_id in range(1, 301, 2):
        store.delete(block_id)  # half dead: every segment a candidate
    stop = threading.Event()
    errors: list[BaseException] = []
    moved = [0]

    def compactor() -> None:
        try:
            while not stop.is_set():
                moved[0] += store.compact(live_fraction_max=0.9, segments_max=4)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=compactor)
    thread.start()
    try:
        for block_id in range(2, 301, 2):
            if block_id % 3 == 0:
                store.delete(block_id)
            elif block_id % 3 == 1:  # a rebuild: the newer record must win, now and after a restart
                store.append(block_id, 0, new, checksum.piece_crcs(new), checksum.crc(new))
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors, errors
    assert moved[0] > 0  # compaction ran while chunks were deleted and rebuilt
    expected = {b: (new if b % 3 == 1 else old) for b in range(2, 301, 2) if b % 3}
    for view in (store, PackStore(str(tmp_path), 64 * KiB, segment_bytes=512 * KiB)):
        assert sorted(view.block_ids()) == sorted(expected)
        for block_id, data in expected.items():
            assert bytes(view.read(block_id)[0]) == bytes(data), block_id


def test_a_later_copy_that_never_became_durable_does_not_cost_the_sound_earlier_one(tmp_path: Any) -> None:
    """A crash during a compaction's (or a retry's) sync can leave the later copy of a block
    with its header on disk and its data not: at start the earlier, sound copy is kept."""
    root = str(tmp_path / "packs")  # where a ChunkStore keeps them, as _records reads them
    store = PackStore(root, 256 * KiB, segment_bytes=1 * MiB)
    data = _chunk(100_000)[0]
    crcs, whole = checksum.piece_crcs(data), checksum.crc(data)
    store.append(7, 2, data, crcs, whole)
    (first_path, first_offset), = _records(str(tmp_path)).values()
    store.append(7, 2, data, crcs, whole)  # a second copy supersedes the first (marked dead)...
    store.close()
    with open(first_path, "r+b") as f:  # ...but the crash came before that mark reached the disk
        f.seek(first_offset)
        f.write(packs._header(packs.LIVE, 7, len(data), 2, whole, _number(first_path), first_offset))
    later_path, later_offset = _records(str(tmp_path))[7]
    assert (later_path, later_offset) != (first_path, first_offset)
    flip_byte(later_path, later_offset + ALIGN + 10)  # the later copy's data never made it
    reopened = PackStore(root, 256 * KiB, segment_bytes=1 * MiB)
    assert bytes(reopened.read(7)[0]) == bytes(data) and reopened.verify(7).position == 2
    assert _records(str(tmp_path))[7] == (first_path, first_offset)  # the damaged later copy is the one marked dead


def test_a_block_in_both_layouts_after_a_crash_keeps_the_copy_that_verifies(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    sound, damaged = _chunk(50_000)[0], _chunk(50_000)[0]
    _put(store, 1, 0, sound)
    _put(store, 2, 0, damaged)
    for block_id, data in ((1, sound), (2, damaged)):  # the file copy a rebuild wrote before the crash
        store._write_file(block_id, 0, data, checksum.piece_crcs(data), checksum.crc(data))
    path, offset = _records(str(tmp_path))[2]
    flip_byte(path, offset + ALIGN + 5)  # block 2's packed copy is damaged
    again = ChunkStore(str(tmp_path), pack_max_bytes=1 * MiB)
    assert again.packs is not None and again.packs.holds(1) and not os.path.exists(again.path(1))
    assert not again.packs.holds(2) and os.path.exists(again.path(2))
    assert bytes(again.read(1)[0]) == bytes(sound) and bytes(again.read(2)[0]) == bytes(damaged)
    assert again.chunk_count == 2 and sorted(again.block_ids()) == [1, 2]


def test_a_dead_mark_that_cannot_be_written_leaves_the_store_consistent(tmp_path: Any,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB)
    data = _chunk(1000)[0]
    crcs, whole = checksum.piece_crcs(data), checksum.crc(data)
    store.append(1, 0, data, crcs, whole)
    real = os.pwrite

    def failing_pwrite(fd: int, buffer: Any, offset: int) -> int:
        if bytes(buffer[:8]) == packs.DEAD:
            raise OSError(errno.EIO, "Input/output error")
        return real(fd, buffer, offset)

    monkeypatch.setattr(os, "pwrite", failing_pwrite)
    store.append(1, 0, data, crcs, whole)  # supersedes: the dead mark fails, the write does not
    assert store.delete(1) and not store.holds(1) and store.used_bytes == 0
    store.append(2, 0, data, crcs, whole)
    assert bytes(store.read(2)[0]) == bytes(data)
    assert all(s.pending == 0 for s in store._segments.values())


def test_reads_never_miss_a_chunk_a_rebuild_moves_between_files_and_packs(tmp_path: Any) -> None:
    store = ChunkStore(str(tmp_path), pack_max_bytes=64 * KiB)
    small, big = _chunk(60_000, seed=5)[0], _chunk(70_000, seed=6)[0]  # packed / a file
    _put(store, 9, 1, small)
    stop = threading.Event()
    problems: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                got = bytes(store.read(9)[0])
                if got not in (bytes(small), bytes(big)):
                    problems.append("read bytes of neither version")
                if 9 not in store.block_ids():
                    problems.append("the listing missed the block")
            except (ChunkMissing, ChecksumMismatch) as exc:
                problems.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(150):  # rebuilds of position 1, alternately into a file and into a pack
            _put(store, 9, 1, big if i % 2 == 0 else small, overwrite=True)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not problems, problems[:5]
    assert store.chunk_count == 1


def test_a_header_shaped_run_of_client_bytes_is_never_taken_for_a_record(tmp_path: Any) -> None:
    """Start-up probes 4 KiB boundaries after a damaged header, inside the damaged record's
    data too, which a client chose. A header is valid only where it was written (its crc
    covers its segment and offset), so a forged one inside data is skipped."""
    root = str(tmp_path / "packs")
    store = PackStore(root, 256 * KiB, segment_bytes=1 * MiB)
    victim = _chunk(10_000)[0]
    store.append(1, 0, victim, checksum.piece_crcs(victim), checksum.crc(victim))
    (path, victim_at), = _records(str(tmp_path)).values()
    forged_data = _chunk(5_000)[0]
    payload = bytearray(3 * ALIGN)
    data_at = HEADER.size + 4 * 1  # where the attacker's data starts in its record (one piece of crcs)
    boundary = ALIGN - data_at  # its data at the segment's next 4 KiB boundary: a whole record for block 1,
    head = HEADER.pack(packs.LIVE, 1, len(forged_data), 0, checksum.crc(forged_data), 0)[:-4]
    forged = head + checksum.crc(head).to_bytes(4, "little")  # with the crc a header not bound to its place has
    forged += checksum.crc(forged_data).to_bytes(4, "little") + bytes(forged_data)
    payload[boundary : boundary + len(forged)] = forged
    attacker = memoryview(bytes(payload))
    store.append(2, 0, attacker, checksum.piece_crcs(attacker), checksum.crc(attacker))
    store.close()
    _, attacker_at = _records(str(tmp_path))[2]
    with open(path, "r+b") as f:  # the attacker's own header torn: start-up probes into its data
        f.seek(attacker_at)
        f.write(bytes(HEADER.size))
    reopened = PackStore(root, 256 * KiB, segment_bytes=1 * MiB)
    assert reopened.block_ids() == [1]
    assert bytes(reopened.read(1)[0]) == bytes(victim)


def test_compaction_makes_a_batch_of_copies_durable_with_one_sync(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(packs, "COMPACT_BATCH_BYTES", 5 * packs._record_size(20_000))  # several batches
    synced: list[float] = []
    store = PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB, on_sync=synced.append)
    chunks = {b: _chunk(20_000, seed=b)[0] for b in range(1, 81)}
    for block_id, data in chunks.items():
        store.append(block_id, 0, data, checksum.piece_crcs(data), checksum.crc(data))
    for block_id in range(1, 81, 2):
        store.delete(block_id)
    kept = {b: d for b, d in chunks.items() if b % 2 == 0}
    synced.clear()
    moved = store.compact(live_fraction_max=0.6, segments_max=10)
    records = moved // packs._record_size(20_000)
    assert records >= 10 and len(synced) <= -(-records // 5) + 1, (records, len(synced))
    for view in (store, PackStore(str(tmp_path), 64 * KiB, segment_bytes=1 * MiB)):
        assert sorted(view.block_ids()) == sorted(kept)
        assert all(bytes(view.read(b)[0]) == bytes(d) for b, d in kept.items())


def test_by_default_small_chunks_are_packed_and_large_ones_get_files(make_cluster: Any) -> None:
    """With no --pack-max, chunks up to 1 MiB are records (one sync per batch), larger ones
    files (O_DIRECT, sendfile); the suite's own clusters (1 MiB blocks) pack every chunk."""
    c = make_cluster(block_size=4 * MiB)
    small, large = os.urandom(3 * MiB), os.urandom(4 * MiB)  # rs(4,2): chunks of 768 KiB + 160 B and 1 MiB + 160 B
    c.fs.write_bytes("/small", small)
    c.fs.write_bytes("/large", large)
    for path, packed in (("/small", True), ("/large", False)):
        layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path=path)))
        for chunk in layout.blocks[0].chunks:
            where, offset = c.chunk_place(path, 0, chunk.position)
            assert where.endswith(".pack" if packed else ".chunk") and (offset > 0) == packed, (path, where, offset)
    assert c.chunk_count() == 12
    assert c.fs.read_bytes("/small") == small and c.fs.read_bytes("/large") == large
