"""Small chunks packed into segment files, made durable by one fdatasync per batch.

A chunk file costs the kernel about 1 ms of CPU to create, sync, rename and fsync its
directory, whatever its size: 1,024 ranks saving 1 MiB each write 6,144 chunks of 256 KiB,
and the file work, not the bytes, is what the chunk servers spend their time on. Packed,
the same chunks are appended to one open file, and concurrent writers share each fdatasync
(``bench/chunk_put.py``, ``bench/burst.py --pack-max``).

Layout, under ``<data dir>/packs/``::

    <segment number, 8 hex digits>.pack     records, each at a 4 KiB-aligned offset:
        header       magic "TFSPACK1" (live) or "TFSPDEAD" (deleted), block_id u64,
                     length u64, position u32, whole crc32c u32, crc32c u32 of the header so far
                     and of where it lies (segment number u32, offset u64: not stored), so
                     header-shaped bytes anywhere else, e.g. in a chunk's data, never parse
        piece crcs   uint32 little endian, one per 64 KiB piece of data
        data         length bytes, then zeros to the next 4 KiB boundary

Appends are written in order under one lock, so records never leave holes: a record is
acknowledged only after an fdatasync that started after it was written, which also covers
every record before it. After a crash, an unacknowledged record may be torn: its pieces
fail their checks when read or scrubbed, as a torn chunk file does. A damaged header is
skipped by probing the following 4 KiB boundaries for the next valid one.

The index (block id -> segment, offset, header) lives in memory and is rebuilt at start by
reading every header; a later record of a block supersedes an earlier one (a rebuild, a
retry, a compaction's copy) if it verifies whole, else the earlier sound one is kept. A
delete rewrites the record's magic to dead (not synced: a delete lost in a crash brings the
chunk back as an orphan, which the inventory reports and the metadata service deletes
again). A segment is removed once it holds no live record. Each start appends to a new
segment. ``compact`` moves the live records of mostly dead segments (at most half live) to
the active one, so their space returns too; the chunk server runs it every
``limits.chunk_pack_compact_interval_s`` while no client writes to it.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tectofs import checksum
from tectofs.errors import ChecksumMismatch, ChunkMissing, InvalidArgument

from . import pieces
from .chunkinfo import ChunkInfo
from .fileio import fsync_dir, write_all
from .groupsync import GroupSync

HEADER = struct.Struct("<8sQQIII")
LIVE = b"TFSPACK1"
DEAD = b"TFSPDEAD"
ALIGN = 4096
PIECE = checksum.PIECE
SUFFIX = ".pack"
COMPACT_BATCH_BYTES = 32 << 20  # records a compaction copies, then makes durable with one sync

log = logging.getLogger("tectofs.chunk.packs")


@dataclass(eq=False)  # compared and hashed by identity
class _Segment:
    number: int
    path: str
    end: int = 0  # where the next record goes: the segment's size (what dead_bytes and compaction count)
    live_bytes: int = 0  # the space its live records take (0: none left)
    pending: int = 0  # records written, not yet durable and indexed
    fd: int = -1  # open for appends and syncs while it is the active one, else -1
    group: GroupSync | None = None  # its fdatasyncs, shared by the writers waiting for one
    broken: OSError | None = None  # an fdatasync failed: nothing written to it since is durable
    vanished: bool = False  # its file was removed behind the store's back: never unlinked by path again

    def fdatasync(self) -> None:
        """Sync for ``group``. After a failure every later sync fails too: Linux may mark the
        lost pages clean, so a later success would not mean the data reached the disk."""
        if self.broken is not None:
            raise OSError(self.broken.errno, f"segment {self.path} failed to sync before: {self.broken}")
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            self.broken = exc
            raise


@dataclass(slots=True)  # one per packed chunk, in memory: see PackStore
class _Entry:
    segment: _Segment
    offset: int
    info: ChunkInfo = field(repr=False)

    @property
    def size(self) -> int:
        return _record_size(self.info.length)


def _pieces(length: int) -> int:
    return (length + PIECE - 1) // PIECE


def _record_size(length: int) -> int:
    raw = HEADER.size + 4 * _pieces(length) + length
    return -(-raw // ALIGN) * ALIGN


_PLACE = struct.Struct("<IQ")  # segment number, offset: covered by the header crc, not stored


def _header(magic: bytes, block_id: int, length: int, position: int, whole_crc: int, segment: int, offset: int) -> bytes:
    """A record header whose crc also covers where it lies, so a header-shaped run of bytes
    anywhere else (inside a chunk's data, which clients choose) never parses as one."""
    head = HEADER.pack(magic, block_id, length, position, whole_crc, 0)[:-4]
    return head + struct.pack("<I", checksum.crc(_PLACE.pack(segment, offset), checksum.crc(head)))


class PackStore:
    """Chunks of at most ``max_chunk_bytes`` in segment files under ``root``. Thread-safe;
    blocking (the chunk server calls it from I/O threads). ``sync``: whether appends wait for
    an fdatasync (False only for benchmarks of the network path)."""

    def __init__(self, root: str, max_chunk_bytes: int, segment_bytes: int = 256 << 20, sync: bool = True,
                 on_sync: Callable[[float], None] | None = None) -> None:
        if max_chunk_bytes <= 0 or segment_bytes < _record_size(max_chunk_bytes):
            raise InvalidArgument(f"packed chunks of up to {max_chunk_bytes} bytes need segments of at least"
                                  f" {_record_size(max(max_chunk_bytes, 1))} bytes, not {segment_bytes}")
        self.root = root
        self.max_chunk_bytes = max_chunk_bytes
        self.segment_bytes = segment_bytes
        self.sync = sync
        self._on_sync = on_sync
        self._lock = threading.Lock()
        self._index: dict[int, _Entry] = {}
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._next_number = 1  # segment numbers are never reused: a reader may still name a removed one
        self._unmovable: set[int] = set()  # segments compaction failed to empty (a damaged header)
        self.used_bytes = 0
        os.makedirs(root, exist_ok=True)
        self._loading = True
        self._load()
        self._loading = False

    # ------------------------------------------------------------------ start

    def _load(self) -> None:
        """Rebuild the index from every segment's headers, oldest first; remove empty ones."""
        numbers = _segment_numbers(self.root)
        self._next_number = max(numbers, default=0) + 1
        for number in numbers:
            segment = _Segment(number, self._segment_path(number))
            self._segments[number] = segment
            fd = os.open(segment.path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                for offset, info, live in _scan(fd, number, size):
                    if live:
                        self._load_record(_Entry(segment, offset, info))
                segment.end = size
            finally:
                os.close(fd)
        for segment in list(self._segments.values()):
            if not segment.live_bytes:
                self._remove(segment)

    def _segment_path(self, number: int) -> str:
        return _segment_path(self.root, number)

    def _load_record(self, entry: _Entry) -> None:
        """At start: a later record of a block supersedes an earlier one only if it verifies.
        The later one may be a copy whose data never became durable (a crash during a
        compaction's or a retry's sync): it must not cost the sound earlier copy."""
        block_id = entry.info.block_id
        old = self._index.get(block_id)
        if old is not None and not self._sound(entry) and self._sound(old):
            log.warning("chunk %x: keeping its record in segment %d, the later copy in segment %d is damaged",
                        block_id, old.segment.number, entry.segment.number)
            self._mark_dead(entry)
            return
        self._place(block_id, entry)

    def _sound(self, entry: _Entry) -> bool:
        try:
            fd = os.open(entry.segment.path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            pieces.verify_all(fd, self._checked(fd, entry), self._data_at(entry), 16 * PIECE)
            return True
        except (ChecksumMismatch, _Superseded):
            return False
        finally:
            os.close(fd)

    def _place(self, block_id: int, entry: _Entry) -> None:
        """Index ``entry`` as the block's chunk; the one it supersedes is marked dead. Under the lock."""
        old = self._index.get(block_id)
        self._index[block_id] = entry
        entry.segment.live_bytes += entry.size
        self.used_bytes += entry.size
        if old is not None:
            self._unplace(old)

    def _unplace(self, entry: _Entry, durable: bool = False) -> None:
        """Take an indexed record out of the counts and mark it dead. Under the lock."""
        entry.segment.live_bytes -= entry.size
        self.used_bytes -= entry.size
        self._mark_dead(entry, durable)

    def _mark_dead(self, entry: _Entry, durable: bool = False) -> None:
        """Rewrite the record's header as dead (``durable``: synced); remove its segment if
        nothing live is left in it. Under the lock."""
        info = entry.info
        try:
            fd = os.open(entry.segment.path, os.O_WRONLY)
            try:
                os.pwrite(fd, _header(DEAD, info.block_id, info.length, info.position, info.whole_crc,
                                      entry.segment.number, entry.offset), entry.offset)
                if durable:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
        except FileNotFoundError:
            pass
        except OSError as exc:  # the index is right; at a restart the record is back: an orphan, or superseded
            log.warning("could not mark chunk %x dead in %s: %s", info.block_id, entry.segment.path, exc)
        self._remove_if_empty(entry.segment)

    def _remove_if_empty(self, segment: _Segment) -> None:
        """Remove a segment no longer appended to, with no live record and no writer waiting. Under the lock."""
        if segment.live_bytes or segment.pending or segment is self._active or self._loading:
            return
        if segment.fd >= 0:
            os.close(segment.fd)
            segment.fd = -1
        self._remove(segment)

    def _remove(self, segment: _Segment) -> None:
        self._segments.pop(segment.number, None)
        self._unmovable.discard(segment.number)
        if segment.vanished:
            return  # whatever is at its path now is not this segment
        try:
            os.unlink(segment.path)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ writes

    def append(self, block_id: int, position: int, data: memoryview, piece_crcs: list[int], whole_crc: int) -> None:
        """Store a chunk (already verified against ``piece_crcs``) durably; it supersedes
        any chunk of the block stored here before."""
        if len(data) > self.max_chunk_bytes:
            raise InvalidArgument(f"chunk of {len(data)} bytes is larger than packed chunks ({self.max_chunk_bytes})")
        info = ChunkInfo(block_id, position, len(data), whole_crc, [])  # the index keeps the header only
        crcs = struct.pack(f"<{len(piece_crcs)}I", *piece_crcs)
        padding = bytes(_record_size(len(data)) - HEADER.size - len(crcs) - len(data))
        segment, offset = self._durable(_record_size(len(data)), lambda number, at: [
            _header(LIVE, block_id, len(data), position, whole_crc, number, at), crcs, data, padding])
        with self._lock:
            try:
                self._place(block_id, _Entry(segment, offset, info))
            finally:
                self._written(segment)

    def _durable(self, size: int, record: Callable[[int, int], list[Any]]) -> tuple[_Segment, int]:
        """Append one record (``_write``) and wait until it is durable. Returns where it
        went; the caller indexes it, then calls ``_written``."""
        segment, offset = self._write(size, record)
        self._wait_durable([segment])
        return segment, offset

    def _write(self, size: int, record: Callable[[int, int], list[Any]]) -> tuple[_Segment, int]:
        """Append one record of ``size`` bytes (a multiple of ``ALIGN``; ``record(segment
        number, offset)`` gives its buffers for where it goes), not yet durable. The caller
        counts in the segment's ``pending`` until it calls ``_written``."""
        with self._lock:
            segment = self._writable(size)
            offset = segment.end
            write_all(segment.fd, record(segment.number, offset), offset)  # in order: no holes
            segment.end += size
            segment.pending += 1
        return segment, offset

    def _wait_durable(self, written: list[_Segment]) -> None:
        """Wait until everything written so far to these segments is durable (one shared
        fdatasync each). On failure the writers' ``pending`` is released and the error raised."""
        try:
            for segment in dict.fromkeys(written):
                if self.sync:
                    assert segment.group is not None  # appends go to segments this process made
                    segment.group.wait_durable()  # the fd stays open: its writers count in pending
                if os.fstat(segment.fd).st_nlink == 0:  # synced, but into a file removed from disk
                    segment.broken = segment.broken or OSError(errno.EIO, f"segment {segment.path} is gone from disk")
                    raise segment.broken
        except BaseException:
            with self._lock:
                for segment in written:
                    if segment.broken is not None and segment is self._active:
                        self._retire(segment)  # new chunks go to a new segment
                    self._written(segment)
                self._forget([segment for segment in dict.fromkeys(written) if segment.broken is not None])
            raise

    def _written(self, segment: _Segment) -> None:
        """A writer is done with ``segment``: the last one of a retired segment closes it. Under the lock."""
        segment.pending -= 1
        if segment.pending == 0 and segment is not self._active and segment.fd >= 0:
            os.close(segment.fd)  # no writer syncs it any more
            segment.fd = -1
            self._remove_if_empty(segment)

    def _writable(self, size: int) -> _Segment:
        """The active segment, with room for ``size`` bytes (a new one if not). Under the lock."""
        active = self._active
        if active is not None and active.end + size <= self.segment_bytes:
            return active
        if active is not None:
            self._retire(active)
        number = self._next_number
        self._next_number += 1
        segment = _Segment(number, self._segment_path(number))
        try:
            segment.fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileNotFoundError:  # the directory itself was removed behind the store's back
            os.makedirs(self.root, exist_ok=True)
            segment.fd = os.open(segment.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        segment.group = GroupSync(segment.fdatasync, self._on_sync)
        try:
            fsync_dir(self.root)  # the new segment's name is durable before any record in it is acknowledged
        except OSError:
            os.close(segment.fd)
            os.unlink(segment.path)
            raise
        self._segments[number] = segment
        self._active = segment
        return segment

    def _retire(self, segment: _Segment) -> None:
        """Stop appending to ``segment``; its fd closes once no writer waits on it. Under the lock."""
        self._active = None
        if segment.pending == 0:
            os.close(segment.fd)
            segment.fd = -1
            self._remove_if_empty(segment)

    # ------------------------------------------------------------------ compaction

    def compact(self, live_fraction_max: float = 0.5, segments_max: int = 1) -> int:
        """Move the live records of up to ``segments_max`` segments that are no longer
        appended to and whose live records fill at most ``live_fraction_max`` of them (the
        emptiest first) to the active segment; each is removed once its last record moved.
        Returns the bytes moved. A record deleted or rebuilt meanwhile is not moved (its copy
        is marked dead). Records are copied as stored: a damaged one stays damaged (and is
        found by reads and the scrubber), never repaired or hidden here."""
        with self._lock:
            candidates = sorted(
                (s for s in self._segments.values()
                 if s is not self._active and s.pending == 0 and s.end and s.number not in self._unmovable
                 and s.live_bytes <= live_fraction_max * s.end),
                key=lambda s: s.live_bytes / s.end)[:segments_max]
            moves = [(s, [e for e in self._index.values() if e.segment is s]) for s in candidates]
        moved = 0
        for segment, entries in moves:
            batch: list[_Entry] = []
            batch_bytes = moved_here = 0
            for entry in sorted(entries, key=lambda e: e.offset):
                if batch and batch_bytes + entry.size > COMPACT_BATCH_BYTES:
                    moved_here += self._move(batch)
                    batch, batch_bytes = [], 0
                batch.append(entry)
                batch_bytes += entry.size
            moved_here += self._move(batch) if batch else 0
            with self._lock:
                if segment.number in self._segments:  # a record could not be moved: not picked again
                    self._unmovable.add(segment.number)
            moved += moved_here
        return moved

    def _move(self, entries: list[_Entry]) -> int:
        """Copy these live records to the active segment, make the copies durable with one
        sync, then index them (or mark a copy dead if its record was deleted or rebuilt
        meanwhile). Returns the bytes moved."""
        copies: list[tuple[_Entry, _Segment, int]] = []
        try:
            for entry in entries:
                record = self._live_record(entry)
                if record is not None:
                    copies.append((entry, *self._write(entry.size, _relocated(entry.info, record))))
        except BaseException:
            with self._lock:
                for _, segment, _ in copies:
                    self._written(segment)
            raise
        self._wait_durable([segment for _, segment, _ in copies])
        with self._lock:
            for entry, segment, offset in copies:
                try:
                    copy = _Entry(segment, offset, entry.info)
                    if self._index.get(entry.info.block_id) is entry:
                        self._place(entry.info.block_id, copy)
                    else:  # deleted or rebuilt while it was copied: the copy must not come back at a restart
                        self._mark_dead(copy)
                finally:
                    self._written(segment)
        return sum(entry.size for entry, _, _ in copies)

    def _live_record(self, entry: _Entry) -> bytes | None:
        """The record as stored, if it is still live and its header intact; else None (deleted
        or superseded since, or a damaged header: left where it is)."""
        try:
            fd = os.open(entry.segment.path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # everything in it was deleted meanwhile
        try:
            record = os.pread(fd, entry.size, entry.offset)
        finally:
            os.close(fd)
        found, live = _parse_header(record, entry.segment.number, entry.offset)
        if len(record) != entry.size or found is None or not live or found.block_id != entry.info.block_id:
            return None
        return record

    # ------------------------------------------------------------------ reads

    def holds(self, block_id: int) -> bool:
        return block_id in self._index

    def block_ids(self) -> list[int]:
        """Every chunk held, for an inventory: chunks whose segment file has gone from disk
        are forgotten first, so the inventory reports them missing (and they are rebuilt)."""
        gone = self._vanished_segments()  # stat()s outside the lock: appends go on meanwhile
        with self._lock:
            self._forget(gone)
            return list(self._index)

    def _vanished_segments(self) -> list[_Segment]:
        """Segments whose file is no longer on disk (only a missing file counts: any other
        stat error says nothing about the records). The store removes its own segments only
        after they leave ``_segments``, under the lock."""
        return [segment for segment in list(self._segments.values()) if _missing(segment.path)]  # list(): one C-level copy

    def _forget(self, gone: list[_Segment]) -> None:
        """Forget the records of segments found gone from disk (removed by someone else):
        their chunks are lost, not deleted, and the inventory must report them missing. Each
        is checked again here, under the lock; its path is never unlinked."""
        for segment in gone:
            if self._segments.get(segment.number) is not segment or not _missing(segment.path):
                continue  # removed by the store meanwhile, or found again
            segment.vanished = True
            lost = [block_id for block_id, entry in self._index.items() if entry.segment is segment]
            for block_id in lost:
                entry = self._index.pop(block_id)
                segment.live_bytes -= entry.size
                self.used_bytes -= entry.size
            log.error("packed-chunk segment %s is gone from disk: %d chunks lost; the inventory reports them"
                      " missing", segment.path, len(lost))
            if segment is self._active:
                self._retire(segment)  # the next record goes to a new segment, not to an unlinked file
            else:
                self._remove_if_empty(segment)

    @property
    def chunk_count(self) -> int:
        return len(self._index)

    @property
    def dead_bytes(self) -> int:
        """Disk space segments take beyond their live records: deleted or superseded records,
        returned when a segment empties or is compacted. Without the lock (heartbeats read it
        on the event loop, and appends hold the lock while they write): a figure for display,
        possibly a write behind."""
        segments = list(self._segments.values())  # one C-level copy under the GIL
        return max(0, sum(segment.end for segment in segments) - self.used_bytes)

    def stored_bytes(self, block_id: int) -> int:
        """The disk space the chunk's record takes (from the index: no I/O)."""
        return self._entry(block_id).size

    def info(self, block_id: int) -> ChunkInfo:
        """The chunk's header and piece crcs as on disk (ChecksumMismatch if damaged)."""
        _, fd, info = self._open(block_id)
        os.close(fd)
        return info

    def _entry(self, block_id: int) -> _Entry:
        entry = self._index.get(block_id)
        if entry is None:
            raise ChunkMissing(f"chunk {block_id:x} is not stored here")
        return entry

    def read(self, block_id: int, offset: int = 0, length: int = -1,
             allocate: Callable[[int], Any] = bytearray) -> tuple[Any, list[int], ChunkInfo]:
        """As ``ChunkStore.read``: whole 64 KiB pieces covering ``[offset, offset + length)``,
        verified (ChecksumMismatch, never damaged data)."""
        entry, fd, info = self._open(block_id)
        try:
            buffer, crcs = pieces.read_range(fd, info, self._data_at(entry), offset, length, allocate)
        finally:
            os.close(fd)
        return buffer, crcs, info

    def verify(self, block_id: int, step_bytes: int = 16 * PIECE) -> ChunkInfo:
        """Re-read a whole chunk: its header, every piece crc and the whole-chunk crc (the
        scrubber); raises ChecksumMismatch or ChunkMissing."""
        entry, fd, info = self._open(block_id)
        try:
            pieces.verify_all(fd, info, self._data_at(entry), step_bytes)
            os.posix_fadvise(fd, entry.offset, entry.size, os.POSIX_FADV_DONTNEED)  # a scrub must not evict what clients read
        finally:
            os.close(fd)
        return info

    def _open(self, block_id: int) -> tuple[_Entry, int, ChunkInfo]:
        """The block's record: its entry, an open fd on its segment and its checked header.
        A record deleted or superseded (a rebuild) since it was looked up is looked up again."""
        for _ in range(3):
            entry = self._entry(block_id)
            try:
                fd = os.open(entry.segment.path, os.O_RDONLY)
            except FileNotFoundError:  # its segment was removed: the chunk was deleted meanwhile ...
                with self._lock:
                    if self._index.get(block_id) is entry:  # ... or, still indexed, lost from disk
                        self._forget([entry.segment])
                continue
            try:
                return entry, fd, self._checked(fd, entry)
            except _Superseded:
                os.close(fd)
            except BaseException:
                os.close(fd)
                raise
        raise ChunkMissing(f"chunk {block_id:x} is not stored here (deleted while being read)")

    @staticmethod
    def _data_at(entry: _Entry) -> int:
        return data_offset(entry.offset, entry.info.length)

    @staticmethod
    def _checked(fd: int, entry: _Entry) -> ChunkInfo:
        """The record's header, as on disk now and as indexed, with its piece crcs (which the
        data read is verified against)."""
        indexed = entry.info
        count = _pieces(indexed.length)
        raw = os.pread(fd, HEADER.size + 4 * count, entry.offset)
        found, live = _parse_header(raw, entry.segment.number, entry.offset)
        if found is None:  # maybe read while a delete rewrote it: look again before calling it damaged
            raw = os.pread(fd, HEADER.size + 4 * count, entry.offset)
            found, live = _parse_header(raw, entry.segment.number, entry.offset)
        if found is not None and not live:
            raise _Superseded()
        if found is None or len(raw) != HEADER.size + 4 * count or (
                found.block_id, found.length, found.position, found.whole_crc) != (
                indexed.block_id, indexed.length, indexed.position, indexed.whole_crc):
            raise ChecksumMismatch(f"chunk {indexed.block_id:x}: packed record header damaged")
        found.piece_crcs = list(struct.unpack(f"<{count}I", raw[HEADER.size :]))
        return found

    # ------------------------------------------------------------------ deletes

    def delete(self, block_id: int, durable: bool = False) -> bool:
        """Forget a chunk and mark its record dead; a segment left with no live record is
        removed. ``durable``: the dead mark is synced (the block now lives elsewhere, and this
        record back after a crash would shadow it)."""
        with self._lock:
            entry = self._index.pop(block_id, None)
            if entry is None:
                return False
            self._unplace(entry, durable)
            return True

    def close(self) -> None:
        with self._lock:
            if self._active is not None:
                self._retire(self._active)


def _relocated(info: ChunkInfo, record: bytes) -> Callable[[int, int], list[Any]]:
    """A stored record's buffers for a new place: its header made for there, the rest as is."""
    return lambda number, at: [_header(LIVE, info.block_id, info.length, info.position, info.whole_crc, number, at),
                               memoryview(record)[HEADER.size :]]


class _Superseded(Exception):
    """The record was marked dead (deleted, or a newer record of the block written) after it was looked up."""


def data_offset(record_offset: int, length: int) -> int:
    """Where the data of a record of ``length`` bytes at ``record_offset`` starts."""
    return record_offset + HEADER.size + 4 * _pieces(length)


def _scan(fd: int, number: int, size: int) -> Iterator[tuple[int, ChunkInfo, bool]]:
    """``(offset, header, live)`` of every record of segment ``number`` (open at ``fd``,
    ``size`` bytes), in order; damaged or torn headers are skipped by probing the following
    4 KiB boundaries."""
    offset = 0
    while offset + HEADER.size <= size:
        info, live = _parse_header(os.pread(fd, HEADER.size, offset), number, offset)
        if info is None:
            offset += ALIGN  # damaged or torn: the next record starts at a later boundary
            continue
        yield offset, info, live
        offset += _record_size(info.length)


def records(root: str) -> Iterator[tuple[str, int, ChunkInfo, bool]]:
    """``(segment path, record offset, header, live)`` of every record under a pack store's
    ``root``, read from disk without opening the store (offline inspection: tools, tests).
    A block may have several records; the store's index holds the last sound live one."""
    try:
        numbers = _segment_numbers(root)
    except FileNotFoundError:
        return
    for number in numbers:
        path = _segment_path(root, number)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # removed meanwhile (emptied)
        try:
            for offset, info, live in _scan(fd, number, os.fstat(fd).st_size):
                yield path, offset, info, live
        finally:
            os.close(fd)


def _missing(path: str) -> bool:
    """Whether ``path`` is gone: only a missing file counts (any other stat error says
    nothing about the records in it, and is logged)."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError as exc:
        log.warning("cannot stat packed-chunk segment %s: %s", path, exc)
    return False


def _segment_path(root: str, number: int) -> str:
    return os.path.join(root, f"{number:08x}{SUFFIX}")


def _segment_numbers(root: str) -> list[int]:
    """The numbers of the segment files under ``root``, in order; any other name is logged
    and ignored (only names ``_segment_path`` makes count)."""
    numbers = []
    for name in os.listdir(root):
        try:
            number = int(name[: -len(SUFFIX)], 16) if name.endswith(SUFFIX) else None
        except ValueError:
            number = None
        if number is None or name != f"{number:08x}{SUFFIX}":
            log.warning("ignoring %s in %s: not a segment name", name, root)
        else:
            numbers.append(number)
    return sorted(numbers)


def _parse_header(raw: bytes, segment: int, offset: int) -> tuple[ChunkInfo | None, bool]:
    """``(info, live)`` from the record header at ``offset`` of segment ``segment``, or
    ``(None, False)`` if it is not a valid one there."""
    if len(raw) < HEADER.size:
        return None, False
    magic, block_id, length, position, whole_crc, header_crc = HEADER.unpack(raw[: HEADER.size])
    if magic not in (LIVE, DEAD) or checksum.crc(_PLACE.pack(segment, offset), checksum.crc(raw[: HEADER.size - 4])) != header_crc:
        return None, False
    return ChunkInfo(block_id, position, length, whole_crc, []), magic == LIVE
