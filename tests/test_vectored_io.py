"""Vectored reads and writes (``preadv``/``pwritev`` on a file): consecutive bytes to or from
several buffers. Blocks the buffers cover whole are decoded straight into them or encoded
straight from them; everything else goes through block buffers. The bytes must be the same
either way, under any split."""

from __future__ import annotations

import os
import random
import time

import pytest

from tectofs import erasure
from tectofs.client import files
from tectofs.regions import Regions

MiB = 1 << 20


def _cut(data: bytes, rng: random.Random, pieces: int) -> list[memoryview]:
    points = sorted({0, len(data), *(rng.randrange(len(data) + 1) for _ in range(pieces))})
    return [memoryview(bytearray(data[a:b])) for a, b in zip(points, points[1:])]


@pytest.fixture
def paths_taken(monkeypatch):
    """Counts the blocks sent and read whole from several buffers (``Regions``)."""
    taken = {"sent": 0, "read": 0}
    real_send_whole, real_read_whole = files.AsyncFile._send_whole, files.AsyncFile._read_whole_blocks

    async def send_whole(self, idx, data):
        sent = await real_send_whole(self, idx, data)
        taken["sent"] += sent and isinstance(data, Regions)
        return sent

    async def read_whole(self, reads):
        taken["read"] += sum(isinstance(into, Regions) for _, into in reads)
        return await real_read_whole(self, reads)

    monkeypatch.setattr(files.AsyncFile, "_send_whole", send_whole)
    monkeypatch.setattr(files.AsyncFile, "_read_whole_blocks", read_whole)
    return taken


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pwritev_then_preadv_under_random_splits(cluster, paths_taken, seed):
    rng = random.Random(seed)
    block = MiB  # the test cluster's block size
    data = os.urandom(5 * block + 300_000)
    path = f"/vectored-{seed}"
    start = rng.choice([0, 123_457])  # from a block boundary, and from inside a block
    with cluster.fs.open(path, "wb", buffering=0) as f:
        if start:
            f.write(b"h" * start)
        assert f.pwritev(_cut(data, rng, 12), start) == len(data)
    assert cluster.fs.read_bytes(path) == b"h" * start + data
    with cluster.fs.open(path, "rb", buffering=0) as f:
        for _ in range(3):
            offset = rng.randrange(0, start + 2 * block)
            parts = _cut(bytes(rng.randrange(1, 4 * block)), rng, 10)
            got = f.preadv(parts, offset)
            expected = (b"h" * start + data)[offset : offset + sum(len(p) for p in parts)]
            assert got == len(expected) and b"".join(parts)[:got] == expected
        tail = [memoryview(bytearray(MiB)), memoryview(bytearray(MiB))]
        assert f.preadv(tail, start + len(data) - 1000) == 1000  # short only at the end of the file
        assert bytes(tail[0][:1000]) == data[-1000:]
    assert paths_taken["sent"] >= 3 and paths_taken["read"] >= 1  # whole blocks took the vectored paths


def test_pwritev_buffers_may_be_reused_when_it_returns(cluster, monkeypatch, paths_taken):
    """The encode of a block covered by several buffers reads them before pwritev returns."""
    real_encode = erasure.encode

    def slow_encode(*args, **kwargs):  # an encode reading its input late would see the reuse
        time.sleep(0.05)
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(erasure, "encode", slow_encode)
    rng = random.Random(9)
    data = os.urandom(4 * MiB)
    parts = _cut(data, rng, 9)
    with cluster.fs.open("/vectored-reuse", "wb", buffering=0) as f:
        f.pwritev(parts, 0)
        for part in parts:
            part[:] = os.urandom(len(part))  # reused at once
    assert cluster.fs.read_bytes("/vectored-reuse") == data
    assert paths_taken["sent"] == 4


def test_blocks_with_zeros_at_an_end_are_buffered_and_stay_sparse(cluster, paths_taken):
    """A block whose first piece or last byte is zero is not sent whole (its stored span is
    trimmed, ``sparse``); a block of zeros stays a hole. Read back, all the same bytes."""
    block = MiB
    data = bytearray(os.urandom(4 * block))
    data[:block] = bytes(block)  # a hole
    data[2 * block - 1] = 0  # block 1 ends in a zero byte
    data[2 * block : 2 * block + 70_000] = bytes(70_000)  # block 2 starts with a zero piece
    parts = _cut(bytes(data), random.Random(4), 7)
    with cluster.fs.open("/vectored-sparse", "wb", buffering=0) as f:
        f.pwritev(parts, 0)
    assert cluster.fs.read_bytes("/vectored-sparse") == bytes(data)
    assert paths_taken["sent"] <= 1  # only block 3 may be sent whole
    assert cluster.fs.stat("/vectored-sparse").size == len(data)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_plugin_writes_and_reads_items_across_blocks_without_block_copies(cluster, paths_taken):
    """Tensors of 0.7 MiB each: most 1 MiB blocks hold parts of two of them. The writer sends
    such blocks whole from the tensors, the reader decodes them whole into the tensors."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt

    torch.manual_seed(3)
    sd = {f"t{i}": torch.randn(180_000 + i) for i in range(12)}
    ckpt = f"tectofs://{cluster.address}/vectored-plugin/step_1"
    dcp.save(sd, storage_writer=tt.CheckpointWriter(ckpt, thread_count=1))
    assert paths_taken["sent"] >= 5
    out = {k: torch.full_like(v, -1) for k, v in sd.items()}
    dcp.load(out, storage_reader=tt.CheckpointReader(ckpt))
    assert all(torch.equal(sd[k], out[k]) for k in sd)
    assert paths_taken["read"] >= 5


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_the_plugin_holds_few_copies_made_for_the_save(cluster, monkeypatch):
    """Items the save made (compressed frames) are written once they add up to the temporary
    limit; the caller's own tensors are held up to the larger batch limit."""
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt
    from tectofs.client import sync
    from tectofs.torch import _dcp

    monkeypatch.setattr(_dcp, "_WRITE_BATCH_TEMPORARY_BYTES", 1 * MiB)
    writes = []
    real = sync.RawFile.pwritev

    def counted(self, buffers, offset):
        writes.append(len(buffers))
        return real(self, buffers, offset)

    monkeypatch.setattr(sync.RawFile, "pwritev", counted)
    torch.manual_seed(5)
    sd = {f"t{i}": torch.randn(300_000).to(torch.bfloat16) for i in range(8)}  # 0.6 MB each, 0.4 MB compressed
    for compress, most in ((False, 1), (True, 8)):
        writes.clear()
        ckpt = f"tectofs://{cluster.address}/vectored-temporary-{compress}/step_1"
        dcp.save(sd, storage_writer=tt.CheckpointWriter(ckpt, thread_count=1, compress=compress))
        assert 1 <= len(writes) <= most and (len(writes) > 1) == compress, (compress, writes)
        out = {k: torch.empty_like(v) for k, v in sd.items()}
        dcp.load(out, storage_reader=tt.CheckpointReader(ckpt))
        assert all(torch.equal(sd[k], out[k]) for k in sd)
