"""Erasure coding alone: the systematic fast path agrees with pyeclib's decoder, any k of
k+m chunks rebuild a block, and repair rebuilds the exact chunks that were lost."""

from __future__ import annotations

import itertools
import os
import random

import pytest

from tectofs import erasure
from tectofs.errors import DataUnavailable
from tectofs.policy import parse

SEGMENT = erasure.SEGMENT_BYTES
LENGTHS = [1, 15, 4096, SEGMENT - 1, SEGMENT, SEGMENT + 1, 3 * SEGMENT + 12345]


def _decode(policy, chunks, length):
    out = memoryview(bytearray(length))
    erasure.decode_into(policy, chunks, out)
    return bytes(out)


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("policy_text", ["rs(4,2)", "rs(2,1)", "rs(6,3)"])
def test_any_k_chunks_rebuild_the_block(policy_text, length):
    policy = parse(policy_text)
    data = os.urandom(length)
    chunks = erasure.encode(policy, data)
    assert len(chunks) == policy.width
    assert all(len(c) == erasure.chunk_length(policy, length) for c in chunks)
    subsets = list(itertools.combinations(range(policy.width), policy.data))
    for subset in subsets[:: max(1, len(subsets) // 8)] + [tuple(range(policy.data))]:
        assert _decode(policy, {p: chunks[p] for p in subset}, length) == data, subset


@pytest.mark.parametrize("length", [SEGMENT + 7, 3 * SEGMENT])
def test_reconstruct_rebuilds_the_lost_chunks_exactly(length):
    policy = parse("rs(4,2)")
    chunks = erasure.encode(policy, os.urandom(length))
    survivors = {p: chunks[p] for p in (1, 3, 4, 5)}
    rebuilt = erasure.reconstruct(policy, survivors, [0, 2], length)
    assert bytes(rebuilt[0]) == bytes(chunks[0]) and bytes(rebuilt[2]) == bytes(chunks[2])


@pytest.mark.parametrize("length", [1, SEGMENT - 1, 3 * SEGMENT + 12345])
def test_every_subset_of_k_chunks_decodes_and_rebuilds_in_any_order(length):
    """Every way of losing two chunks of rs(4,2), whichever order the survivors and the
    losses are named in (pyeclib answers in sorted order)."""
    policy = parse("rs(4,2)")
    data = os.urandom(length)
    chunks = erasure.encode(policy, data)
    for subset in itertools.combinations(range(policy.width), policy.data):
        survivors = {p: chunks[p] for p in reversed(subset)}
        assert _decode(policy, survivors, length) == data, subset
        lost = sorted(set(range(policy.width)) - set(subset), reverse=True)
        rebuilt = erasure.reconstruct(policy, survivors, lost, length)
        assert {p: bytes(c) for p, c in rebuilt.items()} == {p: bytes(chunks[p]) for p in lost}, subset


def test_replication_and_too_few_chunks():
    rep = parse("rep(3)")
    data = os.urandom(1000)
    chunks = erasure.encode(rep, data)
    assert _decode(rep, {2: chunks[2]}, len(data)) == data
    rs = parse("rs(4,2)")
    chunks = erasure.encode(rs, data)
    with pytest.raises(DataUnavailable):
        _decode(rs, {0: chunks[0], 1: chunks[1], 5: chunks[5]}, len(data))
    with pytest.raises(DataUnavailable):
        _decode(rs, {p: chunks[p][:-1] for p in range(4)}, len(data))  # truncated chunks


def _received_in_place(policy, chunk, position, out):
    """What a scattered receive does: chunk ``position``'s bytes, in order, into its pieces."""
    placed = erasure.InPlaceChunk(policy, position, out)
    assert sum(len(p) for p in placed.pieces) == len(chunk)
    at = 0
    for piece in placed.pieces:
        piece[:] = memoryview(chunk)[at : at + len(piece)]
        at += len(piece)
    return placed


def _parity(chunk, direct, monkeypatch, policy, length):
    """A parity chunk as the client holds it: in a writable buffer, which ISA-L decodes from
    directly (``direct``: pyeclib's reconstruct then must not be called), or as ``bytes``, which
    go through pyeclib."""
    if not direct:
        return bytes(chunk)
    if length:
        def refuse(*args, **kwargs):
            raise AssertionError("pyeclib's reconstruct was called: ISA-L's direct decode was not taken")

        monkeypatch.setattr(erasure._driver(policy.data, policy.redundancy), "reconstruct", refuse)
    return memoryview(bytearray(chunk))


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("length", [0, 1, 15, SEGMENT - 1, SEGMENT, 3 * SEGMENT + 12345])
def test_data_chunks_received_in_place_decode_with_any_survivors(length, direct, monkeypatch):
    """Every subset of 4 of rs(4,2), its data chunks received straight into the block's buffer:
    nothing to copy with all four, and the lost ones rebuilt around those in place (by ISA-L
    directly, or by pyeclib)."""
    policy = parse("rs(4,2)")
    data = os.urandom(length)
    chunks = erasure.encode(policy, data)
    for subset in itertools.combinations(range(policy.width), policy.data):
        out = memoryview(bytearray(os.urandom(length)))  # garbage where lost chunks belong
        survivors = {p: (_received_in_place(policy, chunks[p], p, out) if p < policy.data
                         else _parity(chunks[p], direct, monkeypatch, policy, length))
                     for p in subset}
        erasure.decode_into(policy, survivors, out)
        assert bytes(out) == data, subset


def test_only_data_chunks_of_rs_are_placed_and_only_in_their_own_buffer():
    policy = parse("rs(4,2)")
    out = memoryview(bytearray(4096))
    with pytest.raises(ValueError):
        erasure.InPlaceChunk(policy, 4, out)
    with pytest.raises(ValueError):
        erasure.InPlaceChunk(parse("rep(3)"), 0, out)
    chunks = erasure.encode(policy, os.urandom(4096))
    elsewhere = _received_in_place(policy, chunks[0], 0, memoryview(bytearray(4096)))
    with pytest.raises(ValueError):
        erasure.decode_into(policy, {0: elsewhere, 1: chunks[1], 2: chunks[2], 3: chunks[3]}, out)


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("length", [1, SEGMENT + 1, 3 * SEGMENT + 12345])
def test_a_block_split_over_several_buffers_decodes_in_place_with_any_survivors(length, direct, monkeypatch):
    """A vectored read's destination (``Regions``: the block cut at odd places, one cut inside a
    fragment header's span): data chunks received into it, lost ones rebuilt around them."""
    from tectofs.regions import Regions

    policy = parse("rs(4,2)")
    data = os.urandom(length)
    chunks = erasure.encode(policy, data)
    cuts = sorted({0, length, min(length, 7), length // 3, length // 2 + 1})
    for subset in itertools.combinations(range(policy.width), policy.data):
        parts = [memoryview(bytearray(os.urandom(b - a))) for a, b in zip(cuts, cuts[1:])]
        out = Regions(parts)
        survivors = {p: (_received_in_place(policy, chunks[p], p, out) if p < policy.data
                         else _parity(chunks[p], direct, monkeypatch, policy, length))
                     for p in subset}
        erasure.decode_into(policy, survivors, out)
        assert b"".join(parts) == data, subset


@pytest.mark.parametrize("policy_text", ["rs(4,2)", "rs(2,1)", "rep(3)"])
def test_data_extents_say_where_every_byte_of_a_block_lies(policy_text: str) -> None:
    """Every range of a block, gathered from its data chunks where ``data_extents`` says, is
    the block's bytes: across segments, fragment headers and the last fragment's padding."""
    policy = parse(policy_text)
    rng = random.Random(policy_text)
    for length in (1, 1000, erasure.SEGMENT_BYTES, erasure.SEGMENT_BYTES + 12345, 3 * erasure.SEGMENT_BYTES + 7):
        block = rng.randbytes(length)
        chunks = erasure.encode(policy, block)
        for _ in range(40):
            start = rng.randrange(length)
            n = rng.randrange(1, length - start + 1)
            runs = erasure.data_extents(policy, length, start, n)
            gathered = b"".join(bytes(memoryview(chunks[p])[at : at + k]) for p, at, _, k in runs)
            assert gathered == block[start : start + n], (length, start, n)
            assert all(p < policy.data for p, *_ in runs) and sum(k for *_, k in runs) == n
    assert erasure.data_extents(policy, 100, 100, 5) == [] and erasure.data_extents(policy, 100, 90, 50)[-1][3] <= 10
