"""Reading part of a large block fetches only the pieces that hold the bytes asked
(``client/partial_reads.py``), checked; anything unusual reads the whole block instead."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from tectofs import erasure, limits
from tectofs.client import connect
from tectofs.policy import parse
from tests.test_client_metrics import local, moved

MiB = 1 << 20


@pytest.mark.parametrize("policy", ["rs(4,2)", "rep(3)"])
def test_a_small_read_of_a_large_block_fetches_only_its_pieces(make_cluster: Any, policy: str) -> None:
    c = make_cluster(servers=6, block_size=16 * MiB, policy=policy)
    data = random.Random(policy).randbytes(16 * MiB - 1000)
    c.fs.write_bytes("/big", data)
    rng = random.Random(3)
    with connect(c.address, credentials=c.credential_file) as fs:
        for _ in range(20):
            offset, n = rng.randrange(1, len(data) - 70_000), rng.choice([1, 4096, 65_536, 70_000])
            before = local()
            assert fs.read_range("/big", offset, n) == data[offset : offset + n]
            after = local()
            fetched = moved(before, after, "tectofs_client_chunk_bytes_total", op="get_chunk")
            # the pieces (64 KiB) holding the range, on at most two chunks: never the 16 MiB block
            assert 0 < fetched <= 4 * limits.checksum_piece_bytes, (offset, n, fetched)
            assert moved(before, after, "tectofs_client_partial_reads_total") == 1
        with fs.open("/big", "rb") as f:  # read through from the start: whole blocks, as before
            assert f.read() == data


def test_a_partial_read_around_a_dead_or_damaged_chunk_reads_the_block(make_cluster: Any) -> None:
    """A chunk server down, or a damaged piece: the partial read gives up and the whole
    block is read around it, bit-exact."""
    c = make_cluster(servers=6, block_size=16 * MiB)
    data = os.urandom(16 * MiB)
    c.fs.write_bytes("/big", data)
    offset = 5 * MiB + 12345
    ((position, at, _, _),) = erasure.data_extents(parse("rs(4,2)"), len(data), offset, 1)
    file, data_at = c.chunk_place("/big", 0, position)
    with open(file, "r+b") as chunk:  # damage the piece holding it
        chunk.seek(data_at + at)
        byte = chunk.read(1)
        chunk.seek(data_at + at)
        chunk.write(bytes([byte[0] ^ 0xFF]))
    with connect(c.address, credentials=c.credential_file) as fs:
        before = local()
        assert fs.read_range("/big", offset, 4096) == data[offset : offset + 4096]
        assert moved(before, local(), "tectofs_client_partial_reads_total") == 0
        c.kill_chunk_server(2)
        assert fs.read_range("/big", 9 * MiB, 100) == data[9 * MiB : 9 * MiB + 100]
