"""crc32c checksums of chunk data: one per 64 KiB piece and one for the whole chunk.

Computed by the writer, verified by the chunk server on receipt and on every read, and
verified again by the reader (end to end). ``crc32c`` releases the GIL and reads
memoryview slices without copying.
"""

from __future__ import annotations

import crc32c as _crc32c

from . import limits
from .errors import ChecksumMismatch

PIECE = limits.checksum_piece_bytes


def crc(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    return _crc32c.crc32c(data, value)


def crc_joined(pieces: list[memoryview]) -> int:
    """crc32c of the pieces' concatenation, without joining them."""
    value = 0
    for piece in pieces:
        value = _crc32c.crc32c(piece, value)
    return value


def piece_crcs(data: bytes | bytearray | memoryview, piece_bytes: int = PIECE) -> list[int]:
    """crc32c of each ``piece_bytes`` slice of ``data`` (the last may be shorter)."""
    view = memoryview(data)
    return [_crc32c.crc32c(view[i : i + piece_bytes]) for i in range(0, len(view), piece_bytes)]


def piece_and_whole_crcs(data: bytes | bytearray | memoryview, piece_bytes: int = PIECE) -> tuple[list[int], int]:
    """``piece_crcs(data)`` and ``crc(data)`` in one pass: each piece is read again for the
    whole-chunk crc while it is still in the CPU's cache."""
    view = memoryview(data)
    pieces: list[int] = []
    whole = 0
    for i in range(0, len(view), piece_bytes):
        piece = view[i : i + piece_bytes]
        pieces.append(_crc32c.crc32c(piece))
        whole = _crc32c.crc32c(piece, whole)
    return pieces, whole


def verify_pieces(
    data: bytes | bytearray | memoryview,
    expected: list[int],
    what: str,
    first_piece: int = 0,
    piece_bytes: int = PIECE,
) -> None:
    """Raise ChecksumMismatch naming ``what`` and the bad piece if ``data`` (which starts at
    piece ``first_piece``) does not match ``expected[first_piece:]``."""
    view = memoryview(data)
    count = (len(view) + piece_bytes - 1) // piece_bytes
    if first_piece + count > len(expected):
        raise ChecksumMismatch(f"{what}: {count} pieces but only {len(expected) - first_piece} checksums")
    for i in range(count):
        got = _crc32c.crc32c(view[i * piece_bytes : (i + 1) * piece_bytes])
        if got != expected[first_piece + i]:
            offset = (first_piece + i) * piece_bytes
            raise ChecksumMismatch(f"{what}: checksum mismatch in the 64 KiB piece at offset {offset}")
