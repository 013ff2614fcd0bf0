"""ISA-L called directly (``tectofs.isal``) gives exactly what the reference libraries give: its
crc32c equals the crc32c package's, and a block encoded with its parity in place is byte for
byte pyeclib's encode, for any length and any split of the block into buffers (``Regions``).
Without ISA-L (``TECTOFS_ISAL=0``) the reference paths are used."""

from __future__ import annotations

import os
import subprocess
import sys

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectofs import checksum, erasure, isal
from tectofs.regions import Regions

SEGMENT = erasure.SEGMENT_BYTES


def _split(data: bytes, cuts: list[int]) -> list[memoryview]:
    """``data`` cut at the given offsets (sorted, clipped), as writable views."""
    points = sorted({min(len(data), c) for c in cuts} | {0, len(data)})
    return [memoryview(bytearray(data[a:b])) for a, b in zip(points, points[1:])]


def test_isal_is_found_and_agrees_here():
    """On this machine (pyeclib's wheel ships ISA-L) the fast paths are the ones in use."""
    assert isal.available()
    assert erasure._direct_parity(4, 2) is not None


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=200_000), start=st.integers(0, 2**32 - 1), skip=st.integers(0, 7))
def test_crc32c_equals_the_package_for_any_length_offset_and_start(data, start, skip):
    view = memoryview(bytearray(data))[skip:]
    assert isal.crc32c(view, start) == crc32c.crc32c(view, start)
    assert isal.crc32c(bytes(view), start) == crc32c.crc32c(bytes(view), start)  # read-only buffers too


@pytest.mark.parametrize("length", [0, 1, checksum.PIECE - 1, checksum.PIECE, 3 * checksum.PIECE + 5, 9 * checksum.PIECE])
def test_piece_crcs_equal_the_package_per_piece(length):
    data = memoryview(bytearray(os.urandom(length)))
    pieces, whole = isal.crc32c_pieces(data, checksum.PIECE, whole=True)
    expected = [crc32c.crc32c(data[i : i + checksum.PIECE]) for i in range(0, length, checksum.PIECE)]
    assert pieces == expected and whole == crc32c.crc32c(data)
    assert isal.crc32c_pieces(data, checksum.PIECE, whole=False) == (expected, 0)


def _pyeclib_chunks(policy, data: bytes) -> list[bytes]:
    size = erasure.chunk_length(policy, len(data))
    chunks = [memoryview(bytearray(size)) for _ in range(policy.width)]
    erasure._encode_pyeclib(policy.data, policy.redundancy, Regions([memoryview(data)]), chunks)
    return [bytes(c) for c in chunks]


@settings(max_examples=25, deadline=None)
@given(
    length=st.sampled_from([1, 15, 4096, SEGMENT - 1, SEGMENT, SEGMENT + 1, 2 * SEGMENT + 12_345]),
    cuts=st.lists(st.integers(0, 3 * SEGMENT), max_size=6),
    policy_text=st.sampled_from(["rs(4,2)", "rs(2,1)", "rs(6,3)"]),
)
def test_direct_encode_is_pyeclibs_encode_under_any_split(length, cuts, policy_text):
    from tectofs.policy import parse

    policy = parse(policy_text)
    data = os.urandom(length)
    got = erasure.encode(policy, Regions(_split(data, cuts)))
    assert [bytes(c) for c in got] == _pyeclib_chunks(policy, data)
    assert [bytes(c) for c in erasure.encode(policy, data)] == _pyeclib_chunks(policy, data)


@settings(max_examples=40, deadline=None)
@given(length=st.integers(0, 5000), cuts=st.lists(st.integers(0, 5000), max_size=8), start=st.integers(0, 5000),
       n=st.integers(0, 5000))
def test_regions_views_and_writes_address_the_bytes_end_to_end(length, cuts, start, n):
    data = os.urandom(length)
    regions = Regions(_split(data, cuts))
    assert len(regions) == length
    if start + n > length:
        with pytest.raises(ValueError):
            regions.views(start, n)
        return
    assert b"".join(regions.views(start, n)) == data[start : start + n]
    fresh = os.urandom(n)
    regions.write(start, fresh)
    assert b"".join(regions.parts) == data[:start] + fresh + data[start + n :]


@pytest.mark.slow  # starts processes
def test_without_isal_the_reference_paths_give_the_same_bytes(tmp_path):
    """``TECTOFS_ISAL=0``: nothing is loaded, crcs come from the crc32c package and encodes from
    pyeclib, and the chunks are the same bytes."""
    script = (
        "import hashlib, sys\n"
        "from tectofs import checksum, erasure, isal\n"
        "from tectofs.policy import parse\n"
        "data = bytes(range(256)) * 20_000\n"
        "chunks = erasure.encode(parse('rs(4,2)'), data)\n"
        "print(isal.available(), erasure._direct_parity(4, 2) is not None, checksum.crc(data),"
        " hashlib.sha256(b''.join(bytes(c) for c in chunks)).hexdigest())\n"
    )
    answers = {}
    for flag in ("0", "1"):
        env = {**os.environ, "TECTOFS_ISAL": flag}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        answers[flag] = out.stdout.split()
    assert answers["0"][:2] == ["False", "False"] and answers["1"][:2] == ["True", "True"]
    assert answers["0"][2:] == answers["1"][2:]  # same crc, same chunks


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=50_000), piece=st.sampled_from([1, 7, 4096, 65536]))
def test_whole_crc_folded_from_piece_crcs_equals_the_package(data, piece):
    """The whole-chunk crc folded from the pieces' (crc32_combine) is the crc of the bytes."""
    pieces, whole = isal.crc32c_pieces(memoryview(bytearray(data)), piece, whole=True)
    assert whole == crc32c.crc32c(data)
    assert pieces == [crc32c.crc32c(data[i : i + piece]) for i in range(0, len(data), piece)]
