"""Chunk files on local flash: format, durable writes, verified reads. Blocking I/O; the
service calls it from worker threads.

One file per chunk, named after its block (a server holds at most one chunk of a block)::

    chunks/<last 2 hex digits>/<block_id as 16 hex digits>.chunk
        data          length bytes
        piece crcs    uint32 little endian, one per 64 KiB piece of data
        footer        magic "TFSCHNK1", block_id u64, length u64, position u32,
                      whole crc32c u32, crc32c of the footer so far u32

A chunk is written to ``<name>.tmp`` and renamed into place; it is acknowledged only once
durable. ``sync="each"`` (the default) does an fdatasync of the chunk and an fsync of its
directory, from up to ``io_threads`` writes at once. ``sync="group"`` is a group commit:
concurrent writers share one ``syncfs`` of the data filesystem (a leader syncs, followers
whose renames it covers wait for it). Measured here (``bench/chunk_put.py``) group was not
faster on a disk shared with other writers (syncfs flushes their data too: 0.97x at 16 MiB,
0.48x at 256 KiB chunks); it is meant for a dedicated data device. ``sync="none"`` skips
both (benchmarks of the network path only). A crash leaves no acknowledged chunk behind; an
unacknowledged one may be torn, fails its footer or piece checks, and is overwritten if the
writer retries (``.tmp`` leftovers are removed at start). Every read verifies the crc of each piece it
returns, so a flipped bit on disk is reported and never served.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from tectofs import checksum
from tectofs.errors import AlreadyExists, ChecksumMismatch, ChunkMissing, InvalidArgument, NoSpace

SYNC_MODES = ("each", "group", "none")
FOOTER = struct.Struct("<8sQQIII")
MAGIC = b"TFSCHNK1"
PIECE = checksum.PIECE


@dataclass
class ChunkInfo:
    block_id: int
    position: int
    length: int
    whole_crc: int
    piece_crcs: list[int]


class ChunkStore:
    """The chunk files under one data directory."""

    def __init__(self, data_dir: str, sync: str = "each", on_sync: Callable[[float], None] | None = None) -> None:
        """``on_sync(seconds)``: told how long each write waited to be durable (metrics)."""
        if sync not in SYNC_MODES:
            raise InvalidArgument(f"sync mode {sync!r}: use one of {', '.join(SYNC_MODES)}")
        self.root = os.path.join(data_dir, "chunks")
        self.sync = sync
        self._on_sync = on_sync
        os.makedirs(self.root, exist_ok=True)
        self._group = GroupSync(self.root) if sync == "group" else None
        self.used_bytes = 0
        self.chunk_count = 0
        self._counts_lock = threading.Lock()  # writes and deletes run on several threads
        self._scan()

    def _scan(self) -> None:
        """Remove half-written leftovers and count what is stored."""
        for sub in os.listdir(self.root):
            directory = os.path.join(self.root, sub)
            if not os.path.isdir(directory):
                continue
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if name.endswith(".tmp"):
                    os.unlink(path)
                elif name.endswith(".chunk"):
                    self.used_bytes += os.path.getsize(path)
                    self.chunk_count += 1

    def path(self, block_id: int) -> str:
        name = f"{block_id:016x}"
        return os.path.join(self.root, name[-2:], name + ".chunk")

    def exists(self, block_id: int) -> bool:
        return os.path.exists(self.path(block_id))

    def write(
        self, block_id: int, position: int, data: memoryview, piece_crcs: list[int], whole_crc: int, overwrite: bool = False
    ) -> None:
        """Verify ``data`` against the writer's checksums, then store it durably.

        Idempotent: writing the same chunk again succeeds. A different chunk under the same
        block id is refused (``AlreadyExists``) unless ``overwrite`` (a rebuild), which still
        never replaces a sound chunk of another position: only the same position's, or a
        damaged one."""
        # The piece crcs cover every byte; the whole-chunk crc is checked end to end by
        # readers against the value the metadata service recorded at commit.
        checksum.verify_pieces(data, piece_crcs, f"chunk {block_id:x} as received")
        final = self.path(block_id)
        if os.path.exists(final):
            try:
                existing = self.info(block_id)
            except (ChecksumMismatch, ChunkMissing):
                existing = None  # torn by a crash before it was acknowledged (or gone): write it again
            if existing is not None and not overwrite:
                if (existing.whole_crc, existing.length, existing.position, existing.piece_crcs) == (
                        whole_crc, len(data), position, list(piece_crcs)):
                    return  # the same bytes again (a retry): every piece's crc matches, not only the claimed whole one
                raise AlreadyExists(f"chunk {block_id:x} already stored with other content")
            if existing is not None and existing.position != position and self._sound(block_id):
                raise AlreadyExists(
                    f"chunk {block_id:x}: this server holds position {existing.position} of the block, not {position}"
                )
        os.makedirs(os.path.dirname(final), exist_ok=True)
        crc_bytes = struct.pack(f"<{len(piece_crcs)}I", *piece_crcs)
        head = FOOTER.pack(MAGIC, block_id, len(data), position, whole_crc, 0)[:-4]
        footer = head + struct.pack("<I", checksum.crc(head))
        tmp = final + ".tmp"
        replaced = os.path.getsize(final) if os.path.exists(final) else 0
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, [data, crc_bytes, footer])
                if self.sync == "each":
                    synced = time.perf_counter()
                    os.fdatasync(fd)
                    # Clean pages of a chunk just written are unlikely to be read soon, and
                    # copying into fresh page-cache pages is what this VM is slowest at:
                    # dropping them lets the next writes reuse warm pages.
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
            os.rename(tmp, final)
            if self.sync == "each":
                _fsync_dir(os.path.dirname(final))
                self._synced(synced)
            elif self._group is not None:
                synced = time.perf_counter()
                self._group.wait_durable()
                self._synced(synced)
        except OSError as exc:
            _unlink_quietly(tmp)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpace(f"chunk server disk is full ({self.root})") from None
            raise
        with self._counts_lock:
            self.used_bytes += len(data) + len(crc_bytes) + FOOTER.size - replaced
            if not replaced:
                self.chunk_count += 1

    def _synced(self, started: float) -> None:
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - started)

    def _sound(self, block_id: int) -> bool:
        try:
            self.verify(block_id)
            return True
        except (ChecksumMismatch, ChunkMissing):
            return False

    def info(self, block_id: int) -> ChunkInfo:
        """Read and check the footer and piece checksums of a stored chunk."""
        fd = self._open(block_id)
        try:
            return self._info(fd, block_id)
        finally:
            os.close(fd)

    def _open(self, block_id: int) -> int:
        try:
            return os.open(self.path(block_id), os.O_RDONLY)
        except FileNotFoundError:
            raise ChunkMissing(f"chunk {block_id:x} is not stored here") from None

    def _info(self, fd: int, block_id: int) -> ChunkInfo:
        size = os.fstat(fd).st_size
        if size < FOOTER.size:
            raise ChecksumMismatch(f"chunk {block_id:x}: file truncated to {size} bytes")
        footer = os.pread(fd, FOOTER.size, size - FOOTER.size)
        magic, stored_id, length, position, whole_crc, footer_crc = FOOTER.unpack(footer)
        if magic != MAGIC or checksum.crc(footer[:-4]) != footer_crc or stored_id != block_id:
            raise ChecksumMismatch(f"chunk {block_id:x}: footer damaged")
        pieces = (length + PIECE - 1) // PIECE
        if size != length + 4 * pieces + FOOTER.size:
            raise ChecksumMismatch(f"chunk {block_id:x}: file size {size} does not match its footer")
        crcs = list(struct.unpack(f"<{pieces}I", os.pread(fd, 4 * pieces, length)))
        return ChunkInfo(block_id, position, length, whole_crc, crcs)

    def read(
        self, block_id: int, offset: int = 0, length: int = -1, allocate: Callable[[int], Any] = bytearray
    ) -> tuple[Any, list[int], ChunkInfo]:
        """Return ``(data, piece_crcs, info)`` for whole 64 KiB pieces covering
        ``[offset, offset + length)``, verified; ``data`` comes from ``allocate(n)``.

        ``offset`` must be a multiple of 64 KiB; the range returned is extended to the end of
        its last piece (or of the chunk); ``length=-1`` reads to the end. Raises
        ChecksumMismatch (never returns data) if any returned piece is damaged."""
        if offset % PIECE:
            raise InvalidArgument(f"read offset {offset} is not a multiple of {PIECE}")
        fd = self._open(block_id)
        try:
            info = self._info(fd, block_id)
            if offset > info.length:
                raise InvalidArgument(f"read offset {offset} past the chunk's {info.length} bytes")
            # Whole pieces only: a piece's crc can only be checked over all of it.
            end = info.length if length < 0 else min(info.length, -(-(offset + length) // PIECE) * PIECE)
            buffer = allocate(end - offset)
            view = memoryview(buffer)
            done = 0
            while done < len(buffer):
                n = os.preadv(fd, [view[done:]], offset + done)
                if n == 0:
                    raise ChecksumMismatch(f"chunk {block_id:x}: short read")
                done += n
        finally:
            os.close(fd)
        first = offset // PIECE
        crcs = info.piece_crcs[first : first + (len(buffer) + PIECE - 1) // PIECE]
        checksum.verify_pieces(buffer, info.piece_crcs, f"chunk {block_id:x} on disk", first_piece=first)
        return buffer, crcs, info

    def block_ids(self) -> list[int]:
        """Every chunk on disk now, by block id (a directory listing: what an inventory reports)."""
        out: list[int] = []
        for sub in os.listdir(self.root):
            directory = os.path.join(self.root, sub)
            if os.path.isdir(directory):
                out.extend(int(name[:-6], 16) for name in os.listdir(directory)
                           if name.endswith(".chunk") and len(name) == 22)
        return out

    def verify(self, block_id: int, step_bytes: int = 16 * PIECE) -> ChunkInfo:
        """Re-read a whole chunk and check its footer, every piece crc and the whole-chunk crc
        (the scrubber); raises ChecksumMismatch or ChunkMissing. Reads ``step_bytes`` at a time."""
        fd = self._open(block_id)
        try:
            info = self._info(fd, block_id)
            buffer = bytearray(step_bytes)
            whole = 0
            for offset in range(0, info.length, step_bytes):
                n = os.preadv(fd, [memoryview(buffer)[: min(step_bytes, info.length - offset)]], offset)
                view = memoryview(buffer)[:n]
                if n < min(step_bytes, info.length - offset):
                    raise ChecksumMismatch(f"chunk {block_id:x}: short read")
                checksum.verify_pieces(view, info.piece_crcs, f"chunk {block_id:x} on disk", first_piece=offset // PIECE)
                whole = checksum.crc(view, whole)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # a scrub must not evict what clients read
        finally:
            os.close(fd)
        if whole != info.whole_crc:
            raise ChecksumMismatch(f"chunk {block_id:x}: whole-chunk crc differs from its footer")
        return info

    def delete(self, block_id: int) -> bool:
        path = self.path(block_id)
        try:
            size = os.path.getsize(path)
            os.unlink(path)
        except FileNotFoundError:
            return False
        with self._counts_lock:
            self.used_bytes -= size
            self.chunk_count -= 1
        return True

    def disk_free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize


class GroupSync:
    """Group commit of chunk writes: one ``syncfs`` makes every write before it durable.

    ``wait_durable()`` returns once a sync that *started after the call* has finished. The
    first waiter becomes the leader and syncs; waiters arriving meanwhile are covered by the
    leader's next round. Thread-safe; blocking (the chunk server calls it from I/O threads)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        self._cond = threading.Condition()
        self._requested = 0
        self._done = 0
        self._syncing = False
        self.syncs = 0

    def wait_durable(self) -> None:
        with self._cond:
            self._requested += 1
            ticket = self._requested
            while self._done < ticket:
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                target = self._requested
                self._cond.release()
                try:
                    _syncfs(self._fd)
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                self._done = max(self._done, target)
                self.syncs += 1


_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs failed: {os.strerror(err)}")


def _write_all(fd: int, buffers: list[bytes | bytearray | memoryview]) -> None:
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        n = os.writev(fd, views)
        while n and views:
            if n >= len(views[0]):
                n -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][n:]
                n = 0


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
