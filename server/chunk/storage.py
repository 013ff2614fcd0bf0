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
writer retries (``.tmp`` leftovers are removed at start). ``read`` verifies the crc of each piece it
returns, so a flipped bit on disk is reported and never served; ``serve`` may instead hand back
a large range unread, for sendfile, whose reader checks it end to end.

With ``pack_max_bytes`` (``tectofs chunk --pack-max``), chunks up to that size are instead
records in segment files under ``<data dir>/packs`` (``packs.py``): one fdatasync per batch
of concurrent writes, no file to create, rename and fsync its directory for. A block's chunk
is in one place or the other; a rebuild that changes its size moves it, and the old copy is
removed once the new one is durable.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import threading
import time
from typing import Any, Callable

from tectofs import checksum, limits
from tectofs.errors import AlreadyExists, ChecksumMismatch, ChunkMissing, InvalidArgument, NoSpace
from tectofs.wire import sendfile

from . import pieces
from .chunkinfo import ChunkInfo
from .disk import REAL_DISK, Disk
from .fileio import direct_prefix, write_direct_then_rest
from .groupsync import GroupSync
from .packs import PackStore

SYNC_MODES = ("each", "group", "none")
FOOTER = struct.Struct("<8sQQIII")
MAGIC = b"TFSCHNK1"
PIECE = checksum.PIECE


__all__ = ["ChunkInfo", "ChunkStore", "GroupSync", "SYNC_MODES", "syncfs_group"]


class ChunkStore:
    """The chunks under one data directory: one file each, or, for chunks of at most
    ``pack_max_bytes``, records in segment files (``packs.PackStore``)."""

    def __init__(self, data_dir: str, sync: str = "each", on_sync: Callable[[float], None] | None = None,
                 pack_max_bytes: int = 0, *, disk: Disk = REAL_DISK) -> None:
        """``on_sync(seconds)``: told how long each write waited to be durable (metrics).
        ``pack_max_bytes``: new chunks up to this size are packed (0: none). Chunks packed
        before stay readable whatever it is now. ``disk``: what chunk files are read from and
        written to (``disk.py``; the simulator's fails and lies)."""
        if sync not in SYNC_MODES:
            raise InvalidArgument(f"sync mode {sync!r}: use one of {', '.join(SYNC_MODES)}")
        if pack_max_bytes < 0 or pack_max_bytes > limits.chunk_pack_max_bytes_max:
            raise InvalidArgument(f"packed chunks of up to {pack_max_bytes} bytes: use 0 (none) to"
                                  f" {limits.chunk_pack_max_bytes_max}")
        self.root = os.path.join(data_dir, "chunks")
        self.disk = disk
        self.sync = sync
        # Chunks of at least limits.chunk_direct_io_min_bytes received into aligned buffers
        # are written with O_DIRECT (fileio); off for good once the file system refuses it.
        self.direct_io = True
        self._on_sync = on_sync
        disk.makedirs(self.root)
        self._group = syncfs_group(self.root) if sync == "group" else None
        self._file_bytes = 0
        self._file_count = 0
        self._counts_lock = threading.Lock()  # writes and deletes run on several threads
        # Held by a write that replaces a chunk already here (a rebuild, which may move it
        # between a file and a pack) and by listings, which would otherwise miss it mid-move.
        self._replacing = threading.Lock()
        self._scan()
        self.pack_max_bytes = pack_max_bytes
        packs_dir = os.path.join(data_dir, "packs")
        self.packs = PackStore(
            packs_dir, pack_max_bytes or limits.chunk_pack_max_bytes_max, limits.chunk_pack_segment_bytes,
            sync=sync != "none", on_sync=on_sync,
        ) if pack_max_bytes or os.path.isdir(packs_dir) else None
        if self.packs is not None:
            self._settle_duplicates()

    def _settle_duplicates(self) -> None:
        """A crash between a rebuild's new copy becoming durable and its old copy's removal
        leaves a block both packed and in a file (blocks never change: sound copies are the
        same chunk). Keep the packed one if it verifies, else the file."""
        assert self.packs is not None
        for block_id in set(self.packs.block_ids()).intersection(self._file_ids()):
            try:
                self.packs.verify(block_id)
                self._delete_file(block_id, durable=True)
            except (ChecksumMismatch, ChunkMissing):
                self.packs.delete(block_id, durable=True)

    @property
    def used_bytes(self) -> int:
        """Bytes the chunks take on disk (files, and packed records with their alignment)."""
        return self._file_bytes + (self.packs.used_bytes if self.packs is not None else 0)

    @property
    def chunk_count(self) -> int:
        return self._file_count + (self.packs.chunk_count if self.packs is not None else 0)

    @property
    def pack_dead_bytes(self) -> int:
        """Disk space held by dead packed records, not in ``used_bytes`` (``PackStore.dead_bytes``)."""
        return self.packs.dead_bytes if self.packs is not None else 0

    def _packed(self, block_id: int) -> PackStore | None:
        """The pack store if it holds the block's chunk."""
        return self.packs if self.packs is not None and self.packs.holds(block_id) else None

    def _scan(self) -> None:
        """Remove half-written leftovers and count what is stored."""
        disk = self.disk
        for sub in disk.listdir(self.root):
            directory = os.path.join(self.root, sub)
            if not disk.isdir(directory):
                continue
            for name in disk.listdir(directory):
                path = os.path.join(directory, name)
                if name.endswith(".tmp"):
                    disk.unlink(path)
                elif name.endswith(".chunk"):
                    self._file_bytes += disk.getsize(path)
                    self._file_count += 1

    def path(self, block_id: int) -> str:
        name = f"{block_id:016x}"
        return os.path.join(self.root, name[-2:], name + ".chunk")

    def exists(self, block_id: int) -> bool:
        return self._packed(block_id) is not None or self.disk.exists(self.path(block_id))

    def stored_bytes(self, block_id: int) -> int:
        """How many bytes of disk the chunk takes (ChunkMissing if it is not here)."""
        packed = self._packed(block_id)
        if packed is not None:
            return packed.stored_bytes(block_id)
        try:
            return self.disk.getsize(self.path(block_id))
        except FileNotFoundError:
            raise ChunkMissing(f"chunk {block_id:x} is not stored here") from None

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
        if not self.exists(block_id):
            self._store(block_id, position, data, piece_crcs, whole_crc)
            return
        with self._replacing:
            try:
                existing = self.info(block_id)
            except (ChecksumMismatch, ChunkMissing):
                existing = None  # torn by a crash before it was acknowledged (or gone): write it again
            same = existing is not None and (existing.whole_crc, existing.length, existing.position,
                                             existing.piece_crcs) == (whole_crc, len(data), position, list(piece_crcs))
            if same and not overwrite and self._sound(block_id):
                return  # the same bytes again (a retry): every piece's crc matches, and the stored ones are intact
            if existing is not None and not overwrite and not same:
                raise AlreadyExists(f"chunk {block_id:x} already stored with other content")
            if existing is not None and existing.position != position and self._sound(block_id):
                raise AlreadyExists(
                    f"chunk {block_id:x}: this server holds position {existing.position} of the block, not {position}"
                )
            self._store(block_id, position, data, piece_crcs, whole_crc)

    def _store(self, block_id: int, position: int, data: memoryview, piece_crcs: list[int], whole_crc: int) -> None:
        """Write the chunk in its layout (by size), then remove a copy in the other one."""
        if self.packs is not None and len(data) <= self.pack_max_bytes:
            try:
                self.packs.append(block_id, position, data, piece_crcs, whole_crc)
            except OSError as exc:
                self._raise_no_space_for(exc)
                raise
            self._delete_file(block_id, durable=True)  # the block's chunk file a rebuild replaced, if any
            return
        self._write_file(block_id, position, data, piece_crcs, whole_crc)
        if self.packs is not None:
            self.packs.delete(block_id, durable=True)  # the packed chunk a rebuild replaced, if any

    def _write_file(self, block_id: int, position: int, data: memoryview, piece_crcs: list[int], whole_crc: int) -> None:
        final = self.path(block_id)
        disk = self.disk
        disk.makedirs(os.path.dirname(final))
        crc_bytes = struct.pack(f"<{len(piece_crcs)}I", *piece_crcs)
        head = FOOTER.pack(MAGIC, block_id, len(data), position, whole_crc, 0)[:-4]
        footer = head + struct.pack("<I", checksum.crc(head))
        tmp = final + ".tmp"
        replaced = disk.getsize(final) if disk.exists(final) else 0
        # O_DIRECT only where the chunk must be durable before it is acknowledged
        # (--sync none wants the page cache's speed, not the disk's).
        prefix = direct_prefix(data, limits.chunk_direct_io_min_bytes) if self.direct_io and self.sync != "none" else 0
        try:
            fd, direct = self._create(tmp, direct=prefix > 0)
            try:
                if direct:
                    if not write_direct_then_rest(fd, data, prefix, [crc_bytes, footer]):
                        self.direct_io = False
                else:
                    disk.write_all(fd, [data, crc_bytes, footer])
                if self.sync == "each":
                    synced = time.perf_counter()
                    disk.fdatasync(fd)
                    # Clean pages of a chunk just written are unlikely to be read soon, and
                    # copying into fresh page-cache pages is what this VM is slowest at:
                    # dropping them lets the next writes reuse warm pages.
                    disk.drop_cache(fd)
            finally:
                disk.close(fd)
            disk.rename(tmp, final)
            if self.sync == "each":
                disk.fsync_dir(os.path.dirname(final))
                self._synced(synced)
            elif self._group is not None:
                synced = time.perf_counter()
                self._group.wait_durable()
                self._synced(synced)
        except OSError as exc:
            _unlink_quietly(tmp, disk)
            self._raise_no_space_for(exc)
            raise
        with self._counts_lock:
            self._file_bytes += len(data) + len(crc_bytes) + FOOTER.size - replaced
            if not replaced:
                self._file_count += 1

    def _create(self, path: str, direct: bool) -> tuple[int, bool]:
        """A new file for writing and whether it is open with ``O_DIRECT``: it is if ``direct``
        and the file system takes it (if it refuses, this store writes through the page cache
        from then on). ``direct_io`` is only ever turned off, by any I/O thread: each write
        goes by how its own file was opened."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        if direct:
            try:
                return self.disk.open(path, flags | os.O_DIRECT, 0o644), True
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct_io = False
        return self.disk.open(path, flags, 0o644), False

    def _raise_no_space_for(self, exc: OSError) -> None:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpace(f"chunk server disk is full ({self.root})") from None

    def _synced(self, started: float) -> None:
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - started)

    def _sound(self, block_id: int) -> bool:
        try:
            self.verify(block_id)
            return True
        except (ChecksumMismatch, ChunkMissing):
            return False

    def _either(self, block_id: int, packed: Callable[[PackStore], Any], in_file: Callable[[], Any]) -> Any:
        """``packed(pack store)`` if the block is packed, else ``in_file()``; a chunk a rebuild
        moved from one layout to the other meanwhile is looked for in the other once."""
        for attempt in range(3):
            store = self._packed(block_id)
            try:
                return packed(store) if store is not None else in_file()
            except ChunkMissing:
                if attempt == 2 or (self._packed(block_id) is None) == (store is None):
                    raise
        raise AssertionError("unreachable")

    def info(self, block_id: int) -> ChunkInfo:
        """Read and check the footer and piece checksums of a stored chunk."""
        def in_file() -> ChunkInfo:
            fd = self._open(block_id)
            try:
                return self._info(fd, block_id)
            finally:
                self.disk.close(fd)

        return self._either(block_id, lambda packs: packs.info(block_id), in_file)  # type: ignore[no-any-return]

    def _open(self, block_id: int) -> int:
        try:
            return self.disk.open(self.path(block_id), os.O_RDONLY)
        except FileNotFoundError:
            raise ChunkMissing(f"chunk {block_id:x} is not stored here") from None

    def _info(self, fd: int, block_id: int) -> ChunkInfo:
        size = self.disk.size(fd)
        if size < FOOTER.size:
            raise ChecksumMismatch(f"chunk {block_id:x}: file truncated to {size} bytes")
        footer = self.disk.pread(fd, FOOTER.size, size - FOOTER.size)
        magic, stored_id, length, position, whole_crc, footer_crc = FOOTER.unpack(footer)
        if magic != MAGIC or checksum.crc(footer[:-4]) != footer_crc or stored_id != block_id:
            raise ChecksumMismatch(f"chunk {block_id:x}: footer damaged")
        pieces = (length + PIECE - 1) // PIECE
        if size != length + 4 * pieces + FOOTER.size:
            raise ChecksumMismatch(f"chunk {block_id:x}: file size {size} does not match its footer")
        crcs = list(struct.unpack(f"<{pieces}I", self.disk.pread(fd, 4 * pieces, length)))
        return ChunkInfo(block_id, position, length, whole_crc, crcs)

    def read(
        self, block_id: int, offset: int = 0, length: int = -1, allocate: Callable[[int], Any] = bytearray
    ) -> tuple[Any, list[int], ChunkInfo]:
        """Return ``(data, piece_crcs, info)`` for whole 64 KiB pieces covering
        ``[offset, offset + length)``, verified; ``data`` comes from ``allocate(n)``.

        ``offset`` must be a multiple of 64 KiB; the range returned is extended to the end of
        its last piece (or of the chunk); ``length=-1`` reads to the end. Raises
        ChecksumMismatch (never returns data) if any returned piece is damaged."""
        return self.serve(block_id, offset, length, allocate, None)  # type: ignore[return-value]

    def serve(
        self, block_id: int, offset: int, length: int, allocate: Callable[[int], Any], region_min_bytes: int | None,
    ) -> tuple[Any, list[int], ChunkInfo]:
        """``read``, except that a range of a chunk file of at least ``region_min_bytes`` comes
        back unread, as a :class:`~tectofs.wire.sendfile.FileRegion` the caller owns (and closes)
        instead of data: its footer is checked, its data not (every reader of a chunk checks
        it end to end against the crc recorded at write). Packed chunks, smaller ranges, and
        any range while ``limits.send_file_regions_max`` regions are open are read and
        verified as by ``read``."""
        def in_file() -> tuple[Any, list[int], ChunkInfo]:
            fd = self._open(block_id)
            try:
                info = self._info(fd, block_id)
                end = pieces.range_end(info, offset, length)
                if region_min_bytes is not None and end - offset >= region_min_bytes:
                    region = sendfile.try_open(fd, offset, end - offset)
                    if region is not None:  # it owns fd now (None: too many open; read it here)
                        fd = -1
                        return region, pieces.range_crcs(info, offset, end), info
                buffer, crcs = pieces.read_range(fd, info, 0, offset, length, allocate, disk=self.disk)
            finally:
                if fd >= 0:
                    self.disk.close(fd)
            return buffer, crcs, info

        return self._either(  # type: ignore[no-any-return]
            block_id, lambda packs: packs.read(block_id, offset, length, allocate), in_file)

    def block_ids(self) -> list[int]:
        """Every chunk on disk now, by block id (a directory listing and the packed index:
        what an inventory reports); not while a rebuild moves a chunk between the layouts."""
        if self.packs is None:
            return self._file_ids()
        with self._replacing:
            return list(dict.fromkeys([*self._file_ids(), *self.packs.block_ids()]))

    def _file_ids(self) -> list[int]:
        out: list[int] = []
        disk = self.disk
        for sub in disk.listdir(self.root):
            directory = os.path.join(self.root, sub)
            if disk.isdir(directory):
                out.extend(int(name[:-6], 16) for name in disk.listdir(directory)
                           if name.endswith(".chunk") and len(name) == 22)
        return out

    def verify(self, block_id: int, step_bytes: int = 16 * PIECE) -> ChunkInfo:
        """Re-read a whole chunk and check its footer, every piece crc and the whole-chunk crc
        (the scrubber); raises ChecksumMismatch or ChunkMissing. Reads ``step_bytes`` at a time."""
        def in_file() -> ChunkInfo:
            fd = self._open(block_id)
            try:
                info = self._info(fd, block_id)
                pieces.verify_all(fd, info, 0, step_bytes, disk=self.disk)
                self.disk.drop_cache(fd)  # a scrub must not evict what clients read
            finally:
                self.disk.close(fd)
            return info

        return self._either(block_id, lambda packs: packs.verify(block_id, step_bytes), in_file)  # type: ignore[no-any-return]

    def delete(self, block_id: int) -> bool:
        """Remove the block's chunk (packed or a file); False if none was here."""
        packed = self.packs is not None and self.packs.delete(block_id)
        return self._delete_file(block_id) or packed

    def _delete_file(self, block_id: int, durable: bool = False) -> bool:
        """Remove the block's chunk file; ``durable``: and its directory entry for good (the
        other layout now holds the block: a file back after a crash would shadow it)."""
        path = self.path(block_id)
        try:
            size = self.disk.getsize(path)
            self.disk.unlink(path)
        except FileNotFoundError:
            return False
        if durable:
            self.disk.fsync_dir(os.path.dirname(path))
        with self._counts_lock:
            self._file_bytes -= size
            self._file_count -= 1
        return True

    def compact_packs(self) -> int:
        """Compact one mostly dead segment of packed chunks (``PackStore.compact``); bytes moved."""
        return self.packs.compact() if self.packs is not None else 0

    def disk_free_bytes(self) -> int:
        st = os.statvfs(self.root)
        return st.f_bavail * st.f_frsize


def syncfs_group(path: str) -> GroupSync:
    """Group commit of chunk writes (``--sync group``): one ``syncfs`` of the filesystem
    holding ``path`` makes every write before it durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    return GroupSync(lambda: _syncfs(fd))


_libc = ctypes.CDLL(None, use_errno=True)


def _syncfs(fd: int) -> None:
    if _libc.syncfs(fd) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"syncfs failed: {os.strerror(err)}")


def _unlink_quietly(path: str, disk: Disk = REAL_DISK) -> None:
    try:
        disk.unlink(path)
    except FileNotFoundError:
        pass
