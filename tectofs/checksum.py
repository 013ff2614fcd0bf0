"""crc32c checksums of chunk data: one per 64 KiB piece and one for the whole chunk.

Computed by the writer, verified by the chunk server on receipt and on every read, and
verified again by the reader (end to end). ISA-L's crc32c (``tectofs.isal``) when it is
there and agrees with the ``crc32c`` package, which is used otherwise; both release the GIL
and read memoryview slices without copying.
"""

from __future__ import annotations

from . import isal, limits
from .errors import ChecksumMismatch

PIECE = limits.checksum_piece_bytes


def crc(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    return isal.crc32c(data, value)


def crc_joined(pieces: list[memoryview]) -> int:
    """crc32c of the pieces' concatenation, without joining them."""
    value = 0
    for piece in pieces:
        value = isal.crc32c(piece, value)
    return value


def piece_crcs(data: bytes | bytearray | memoryview, piece_bytes: int = PIECE) -> list[int]:
    """crc32c of each ``piece_bytes`` slice of ``data`` (the last may be shorter)."""
    return isal.crc32c_pieces(data, piece_bytes, whole=False)[0]


def piece_and_whole_crcs(data: bytes | bytearray | memoryview, piece_bytes: int = PIECE) -> tuple[list[int], int]:
    """``piece_crcs(data)`` and ``crc(data)``: the whole-chunk crc is folded from the pieces'
    (``isal.crc32c_pieces``), so only a short last piece is read twice."""
    return isal.crc32c_pieces(data, piece_bytes, whole=True)


def verify_pieces(
    data: bytes | bytearray | memoryview,
    expected: list[int],
    what: str,
    first_piece: int = 0,
    piece_bytes: int = PIECE,
) -> None:
    """Raise ChecksumMismatch naming ``what`` and the bad piece if ``data`` (which starts at
    piece ``first_piece``) does not match ``expected[first_piece:]``."""
    got_crcs = piece_crcs(data, piece_bytes)
    count = len(got_crcs)
    if first_piece + count > len(expected):
        raise ChecksumMismatch(f"{what}: {count} pieces but only {len(expected) - first_piece} checksums")
    for i, got in enumerate(got_crcs):
        if got != expected[first_piece + i]:
            offset = (first_piece + i) * piece_bytes
            raise ChecksumMismatch(f"{what}: checksum mismatch in the 64 KiB piece at offset {offset}")
