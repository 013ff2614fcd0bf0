"""Erasure coding alone: the systematic fast path agrees with pyeclib's decoder, any k of
k+m chunks rebuild a block, and repair rebuilds the exact chunks that were lost."""

from __future__ import annotations

import itertools
import os

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
