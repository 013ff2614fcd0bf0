"""``tectofs.benchmarks.loopback``: the bytes it times arrive whole, over every connection."""

from __future__ import annotations

import os

from tectofs.benchmarks.loopback import transfer_gbps


def test_a_transfer_delivers_every_byte_over_each_stream_count(tmp_path: os.PathLike[str]) -> None:
    data = os.urandom(4 << 20)
    path = os.path.join(tmp_path, "source")
    with open(path, "wb") as f:
        f.write(data)
    for streams in (1, 2, 4):
        into = memoryview(bytearray(len(data)))
        assert transfer_gbps(path, into, streams) > 0
        assert bytes(into) == data, streams
