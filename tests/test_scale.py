"""Checkpoint scale: a file of 20,000 blocks (on chunk servers that pack small chunks) and a
directory of 30,000 entries, through the client library, the CLI (``tectofs ls``, ``tectofs
rm -r``) and the mount.

Replies are bounded by construction (readdir pages, layout segments, staged commits), so
these work at any size; before, a 7,000-entry directory or a ~2,300-block file broke the frame
limit. A reply the metadata service could not send would be logged as "not sent": the tests
check the log for it.
"""

from __future__ import annotations

import asyncio
import os
import random
import stat
import subprocess
import sys
from typing import Any

import pytest

from tectofs import limits
from tectofs.wire import messages

KiB, MiB = 1 << 10, 1 << 20
BLOCKS = 20_000
ENTRIES = 30_000


def _no_unsent_replies(cluster: Any) -> None:
    with open(os.path.join(cluster.root, "logs", "meta.log"), errors="replace") as f:
        text = f.read()
    assert "not sent" not in text and "Traceback" not in text, text[-3000:]


def test_file_of_20000_blocks_round_trip(make_cluster: Any, rng: random.Random) -> None:
    # chunk servers that pack small chunks (--pack-max): 20,000 chunk files, each with its own
    # fdatasync, would make this test disk-bound (40 s of writing here, against 26 s)
    cluster = make_cluster(chunk_args=["--pack-max", "1M"])
    fs = cluster.fs
    fs.mkdir("/wide", policy="rep(1)", block_size=64 * KiB)
    path = "/wide/twenty-thousand-blocks"
    # A few random bytes somewhere in each block (the rest of it reads as zeros and is not
    # stored), so the test moves 20,000 blocks without moving 1.25 GiB.
    marks = [(idx, rng.randrange(64 * KiB - 16), rng.randbytes(16)) for idx in range(BLOCKS)]
    handle = fs.run(fs.aio.open(path, "wb"))
    async def write_marks() -> None:  # one coroutine: not 20,000 hops into the client's loop
        for idx, within, data in marks:
            await handle.write(idx * 64 * KiB + within, data)

    fs.run(write_marks())
    fs.run(handle.write(BLOCKS * 64 * KiB - 1, b"\x01"))  # the file ends exactly at block 20,000
    fs.run(handle.close())
    assert fs.stat(path).size == BLOCKS * 64 * KiB
    assert fs.run(fs.aio.block_count(path)) == BLOCKS
    segment = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path=path)))
    assert segment.end is not None and 0 < len(segment.blocks) < BLOCKS  # it came in segments
    assert len(_encoded(segment)) < limits.frame_header_max_bytes

    # Read back, sequentially in large pieces, and at random places with a fresh handle.
    expected = {idx: (within, data) for idx, within, data in marks}
    reader = fs.run(fs.aio.open(path, "rb"))
    try:
        piece_blocks = 1000
        for first in range(0, BLOCKS, piece_blocks):
            got = fs.run(reader.read(first * 64 * KiB, piece_blocks * 64 * KiB))
            want = bytearray(piece_blocks * 64 * KiB)
            for idx in range(first, first + piece_blocks):
                within, data = expected[idx]
                base = (idx - first) * 64 * KiB
                want[base + within : base + within + 16] = data
            if first + piece_blocks == BLOCKS:
                want[-1] = 1
            assert got == want, first  # bit-exact, zeros included
    finally:
        fs.run(reader.close())
    for idx in rng.sample(range(BLOCKS), 50):
        within, data = expected[idx]
        assert fs.read_range(path, idx * 64 * KiB + within, 16) == data

    # Rewriting it in place commits once more through staging, and a truncate withdraws blocks.
    with fs.open(path, "r+b") as f:
        f.seek(5 * 64 * KiB)
        f.write(b"rewritten")
        f.truncate(15_000 * 64 * KiB + 10)
    assert fs.stat(path).size == 15_000 * 64 * KiB + 10
    assert fs.read_range(path, 5 * 64 * KiB, 9) == b"rewritten"
    assert fs.run(fs.aio.block_count(path)) == 15_001
    _no_unsent_replies(cluster)


def test_replacing_a_huge_file_is_atomic(cluster: Any) -> None:
    """A ``wb`` writer with more blocks than one commit carries stages them; readers see the
    old content until its single commit, then all of the new."""
    fs = cluster.fs
    fs.mkdir("/atomic-wide", policy="rep(1)", block_size=64 * KiB)
    path = "/atomic-wide/f"
    fs.write_bytes(path, b"old")
    count = limits.commit_blocks_max * 2 + 5
    handle = fs.run(fs.aio.open(path, "wb"))
    for idx in range(count):
        fs.run(handle.write(idx * 64 * KiB, b"new"))
    assert sum(write.staged_at_mds for write in handle._writes) >= limits.commit_blocks_max  # sent ahead, not committed
    assert fs.read_bytes(path) == b"old"
    fs.run(handle.close())
    assert fs.stat(path).size == (count - 1) * 64 * KiB + 3
    assert fs.run(fs.aio.block_count(path)) == count


def _encoded(message: Any) -> bytes:
    import msgspec

    return msgspec.msgpack.encode(message)


def test_directory_of_30000_entries(cluster: Any, tmp_path: Any) -> None:
    fs = cluster.fs
    directory = "/ranks"
    fs.mkdir(directory)
    names = [f"__{rank}_0.distcp" for rank in range(ENTRIES)]

    async def create_all() -> None:
        gate = asyncio.Semaphore(256)

        async def create(name: str) -> None:
            async with gate:
                await fs.aio.metadata.create(messages.CreateRequest(path=f"{directory}/{name}", mode=0o644))

        await asyncio.gather(*(create(name) for name in names))

    fs.run(create_all())

    # the client library
    listed = fs.listdir(directory)
    assert sorted(listed) == sorted(names)
    assert listed == sorted(listed)
    # tectofs ls
    ls = subprocess.run([sys.executable, "-m", "tectofs.cli", "ls", "--meta", cluster.address, directory],
                        capture_output=True, text=True, timeout=300)
    assert ls.returncode == 0, ls.stderr
    assert sorted(line.split()[-1] for line in ls.stdout.splitlines()) == sorted(names)
    # the mount
    _list_through_mount(cluster, directory, names, tmp_path)
    # tectofs rm -r
    rm = subprocess.run([sys.executable, "-m", "tectofs.cli", "rm", "-r", "--meta", cluster.address, directory],
                        capture_output=True, text=True, timeout=600)
    assert rm.returncode == 0, rm.stderr
    assert not fs.exists(directory)
    _no_unsent_replies(cluster)


def _list_through_mount(cluster: Any, directory: str, names: list[str], tmp_path: Any) -> None:
    from tests.test_fuse import _REASON

    if _REASON is not None:
        pytest.skip(_REASON)
    from tectofs.client.fuse import start_mount_process

    where = str(tmp_path / "mnt")
    os.mkdir(where)
    with start_mount_process(cluster.address, where, log_path=str(tmp_path / "mount.log")):
        # the kernel pages the listing (READDIRPLUS, offsets) over some thousand requests
        with os.scandir(where + directory) as listing:
            entries = {entry.name: entry.inode() for entry in listing}
        assert sorted(entries) == sorted(names)
        # every 30th name stat'ed (ls -l of all 30,000 takes a minute here: two calls per file)
        for name in names[::30]:
            st = os.lstat(f"{where}{directory}/{name}")
            assert st.st_ino == entries[name] and stat.S_ISREG(st.st_mode) and st.st_mode & 0o777 == 0o644
