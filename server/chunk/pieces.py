"""Verified reads of a chunk's data from an open file, wherever in it the data starts (a
chunk file: at 0; a packed record: after its header). Used by ``storage`` and ``packs``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from tectofs import checksum
from tectofs.errors import ChecksumMismatch, InvalidArgument

from .chunkinfo import ChunkInfo
from .disk import REAL_DISK

if TYPE_CHECKING:
    from .disk import Disk

PIECE = checksum.PIECE


def read_range(fd: int, info: ChunkInfo, data_at: int, offset: int, length: int,
               allocate: Callable[[int], Any], *, disk: Disk = REAL_DISK) -> tuple[Any, list[int]]:
    """``(data, piece_crcs)`` for whole 64 KiB pieces covering ``[offset, offset + length)``
    of the chunk (``length=-1``: to its end), every piece verified against ``info``;
    ``data`` comes from ``allocate(n)``. InvalidArgument for an offset that is not a piece
    boundary or is past the end; ChecksumMismatch (never data) for a damaged piece."""
    end = range_end(info, offset, length)
    buffer = allocate(end - offset)
    read_exactly(fd, memoryview(buffer).cast("B"), data_at + offset, info.block_id, disk=disk)
    first = offset // PIECE
    checksum.verify_pieces(buffer, info.piece_crcs, f"chunk {info.block_id:x} on disk", first_piece=first)
    return buffer, range_crcs(info, offset, end)


def range_end(info: ChunkInfo, offset: int, length: int) -> int:
    """Where the whole pieces covering ``[offset, offset + length)`` of the chunk end
    (``length=-1``: its end). InvalidArgument for an offset that is not a piece boundary or
    is past the end."""
    if offset % PIECE:
        raise InvalidArgument(f"read offset {offset} is not a multiple of {PIECE}")
    if offset > info.length:
        raise InvalidArgument(f"read offset {offset} past the chunk's {info.length} bytes")
    # Whole pieces only: a piece's crc can only be checked over all of it.
    return info.length if length < 0 else min(info.length, -(-(offset + length) // PIECE) * PIECE)


def range_crcs(info: ChunkInfo, offset: int, end: int) -> list[int]:
    """The piece crcs of ``[offset, end)``, a range ``range_end`` gave."""
    first = offset // PIECE
    return info.piece_crcs[first : first + (end - offset + PIECE - 1) // PIECE]


def verify_all(fd: int, info: ChunkInfo, data_at: int, step_bytes: int, *, disk: Disk = REAL_DISK) -> None:
    """Re-read the whole chunk ``step_bytes`` at a time: every piece crc and the whole-chunk
    crc (the scrubber). ChecksumMismatch if anything differs."""
    buffer = bytearray(step_bytes)
    whole = 0
    for offset in range(0, info.length, step_bytes):
        view = memoryview(buffer)[: min(step_bytes, info.length - offset)]
        read_exactly(fd, view, data_at + offset, info.block_id, disk=disk)
        checksum.verify_pieces(view, info.piece_crcs, f"chunk {info.block_id:x} on disk", first_piece=offset // PIECE)
        whole = checksum.crc(view, whole)
    if whole != info.whole_crc:
        raise ChecksumMismatch(f"chunk {info.block_id:x}: whole-chunk crc differs from the one recorded with it")


def read_exactly(fd: int, view: memoryview, offset: int, block_id: int, *, disk: Disk = REAL_DISK) -> None:
    """Fill ``view`` from ``offset``; a file that ends first is a damaged chunk."""
    done = 0
    while done < len(view):
        n = disk.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise ChecksumMismatch(f"chunk {block_id:x}: short read (cut off at {offset + done})")
        done += n
