"""The piece crcs and the whole-chunk crc folded from them agree with computing them apart."""

from __future__ import annotations

import os

import crc32c
import pytest

from tectofs import checksum


@pytest.mark.parametrize("length", [0, 1, checksum.PIECE - 1, checksum.PIECE, checksum.PIECE + 1, 5 * checksum.PIECE + 77])
def test_piece_and_whole_crcs_match_separate_passes(length):
    data = memoryview(bytearray(os.urandom(length)))
    pieces, whole = checksum.piece_and_whole_crcs(data)
    assert pieces == checksum.piece_crcs(data)
    assert whole == checksum.crc(data) == crc32c.crc32c(bytes(data))
    a, b = length // 3, 2 * length // 3
    assert checksum.crc_joined([data[:a], data[a:b], data[b:]]) == whole
