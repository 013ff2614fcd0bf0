"""Self-healing on real processes: lost servers are rebuilt, the scrubber finds silent
corruption, a drained server can be stopped, a chunk file deleted behind a server's back is
noticed by its inventory; ``tectofs fsck`` says when everything is fully redundant again."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

from tectofs.wire import messages
from tests.conftest import FILE_PER_CHUNK

KiB = 1 << 10
MiB = 1 << 20
HEAL = ["--repair-after", "2", "--repair-interval", "0.5"]


def _fsck(c: Any, path: str = "/") -> tuple[int, dict[str, Any]]:
    run = subprocess.run([sys.executable, "-m", "tectofs.cli", "fsck", "--json", "--meta", c.address, path],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode in (0, 1, 2), run.stderr
    return run.returncode, json.loads(run.stdout)


def _wait_clean(c: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        code, report = _fsck(c)
        if code == 0:
            assert report["clean"] and report["healthy"] == report["blocks"] > 0
            return report
        assert time.monotonic() < deadline, f"fsck not clean after {timeout_s}s: {report}"
        time.sleep(0.5)


def _write_files(c: Any, count: int, sizes: list[int]) -> dict[str, bytes]:
    files = {}
    for i in range(count):
        data = os.urandom(sizes[i % len(sizes)])
        c.fs.write_bytes(f"/heal/f{i}", data)
        files[f"/heal/f{i}"] = data
    return files


def _server_ids_in_layouts(c: Any, paths: list[str]) -> set[int]:
    ids = set()
    for path in paths:
        layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path=path)))
        ids |= {chunk.server_id for block in layout.blocks for chunk in block.chunks}
    return ids


def _server_id(c: Any, i: int) -> int:
    with open(os.path.join(c.root, f"chunk-{i}.address")) as f:
        address = f.read().strip()
    return next(s.server_id for s in c.fs.servers() if s.address == address)


def test_lost_server_is_rebuilt_then_two_more_losses_read_back(make_cluster):
    # Repair starts 6 s after the loss (not 2): room for fsck, a process of its own, to see the
    # damage first on a loaded machine.
    c = make_cluster(servers=7, block_size=256 * KiB, meta_args=["--repair-after", "6", "--repair-interval", "0.5"])
    c.fs.mkdir("/heal")
    files = _write_files(c, 6, [3 * MiB + 17, 700 * KiB, 1])
    assert _fsck(c)[0] == 0
    lost = _server_id(c, 0)
    assert lost in _server_ids_in_layouts(c, list(files))
    c.kill_chunk_server(0)
    shutil.rmtree(c.chunk_data_dirs[0])  # lost for good
    deadline = time.monotonic() + 20
    code, report = _fsck(c)
    while code == 0 and time.monotonic() < deadline:  # until the metadata service sees it dead
        time.sleep(0.2)
        code, report = _fsck(c)
    assert code == 1 and report["under_redundant"] > 0 and report["unreadable"] == 0, report
    assert report["damaged_files"], report
    started = time.monotonic()
    _wait_clean(c, timeout_s=90)
    rebuilt_in = time.monotonic() - started
    assert lost not in _server_ids_in_layouts(c, list(files))
    c.kill_chunk_server(1)
    c.kill_chunk_server(2)
    for path, data in files.items():
        assert c.fs.read_bytes(path) == data, path
    print(f"rebuilt every chunk of a lost server in {rebuilt_in:.1f}s")


def test_scrubber_finds_a_flipped_parity_byte_and_it_is_rebuilt(make_cluster):
    c = make_cluster(servers=6, chunk_args=["--scrub-rate", "64", "--scrub-interval", "1"], meta_args=HEAL)
    data = os.urandom(3 * MiB)
    c.fs.write_bytes("/scrubbed", data)
    byte = c.flip_chunk_byte("/scrubbed", 0, 4, 1000)  # a parity chunk (packed): only the scrubber reads it
    deadline = time.monotonic() + 60
    while not any(s.stats.get("scrub_corrupt") for s in c.fs.servers()):
        assert time.monotonic() < deadline, "the scrubber did not report the flipped byte"
        time.sleep(0.3)
    _wait_clean(c, timeout_s=60)
    layout = c.fs.run(c.fs.aio.metadata.layout(messages.LayoutRequest(path="/scrubbed")))
    rebuilt, at = c.chunk_place("/scrubbed", 0, 4)
    with open(rebuilt, "rb") as f:
        f.seek(at + 1000)
        assert f.read(1) == byte  # rebuilt on its server (six servers: nowhere else to put it)
    # The case that lost data before: the servers with data chunks 0 and 1 die.
    holders = {chunk.position: chunk.address for chunk in layout.blocks[0].chunks}
    for i in range(6):
        with open(os.path.join(c.root, f"chunk-{i}.address")) as f:
            if f.read().strip() in (holders[0], holders[1]):
                c.kill_chunk_server(i)
    assert c.fs.read_bytes("/scrubbed") == data


def test_drained_server_holds_nothing_and_can_be_stopped(make_cluster):
    c = make_cluster(servers=7, block_size=256 * KiB, meta_args=HEAL)
    c.fs.mkdir("/heal")
    files = _write_files(c, 4, [2 * MiB + 3, 300 * KiB])
    drained = _server_id(c, 3)
    assert drained in _server_ids_in_layouts(c, list(files))
    started = subprocess.run([sys.executable, "-m", "tectofs.cli", "admin", "drain", str(drained), "--meta", c.address],
                             capture_output=True, text=True, timeout=60)
    assert started.returncode == 0 and "chunks to move" in started.stdout, started.stderr
    status = subprocess.run([sys.executable, "-m", "tectofs.cli", "status", "--meta", c.address],
                            capture_output=True, text=True, timeout=60)
    assert re.search(r"draining: \d+ chunks still to move", status.stdout) and " drain " in status.stdout, status.stdout
    run = subprocess.run([sys.executable, "-m", "tectofs.cli", "admin", "drain", str(drained), "--wait",
                          "--timeout", "90", "--meta", c.address], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "can be stopped" in run.stdout
    assert drained not in _server_ids_in_layouts(c, list(files))
    c.fs.write_bytes("/heal/after-drain", os.urandom(MiB))  # new chunks go elsewhere
    assert drained not in _server_ids_in_layouts(c, ["/heal/after-drain"])
    c.kill_chunk_server(3)
    time.sleep(2.5)  # dead to the metadata service
    assert _fsck(c)[0] == 0
    for path, data in files.items():
        assert c.fs.read_bytes(path) == data


def test_chunk_file_deleted_on_disk_is_noticed_by_the_inventory_and_rebuilt(make_cluster):
    c = make_cluster(servers=6, chunk_args=["--inventory-interval", "1", "--scrub-rate", "0", *FILE_PER_CHUNK],
                     meta_args=HEAL)
    data = os.urandom(2 * MiB)
    c.fs.write_bytes("/inventoried", data)
    victim = c.chunk_file("/inventoried", 1, 2)
    os.unlink(victim)
    deadline = time.monotonic() + 60
    while not os.path.exists(c.chunk_file("/inventoried", 1, 2)):
        assert time.monotonic() < deadline, "the deleted chunk was not rebuilt"
        time.sleep(0.3)
    _assert_found_by_the_inventory(c, "/inventoried", data)


def _assert_found_by_the_inventory(c: Any, path: str, data: bytes) -> None:
    """Once rebuilt: the cluster is clean, an inventory reported the loss, and no read did
    (nobody read the file meanwhile), and the file reads back."""
    _wait_clean(c, timeout_s=30)
    assert any(s.stats.get("inventory_missing") for s in c.fs.servers())
    assert c.fs.aio.blocks.stats["degraded_reads"] == 0
    assert c.fs.read_bytes(path) == data


def test_packed_chunks_lost_with_their_segment_are_noticed_by_the_inventory_and_rebuilt(make_cluster):
    c = make_cluster(servers=6, chunk_args=["--inventory-interval", "1", "--scrub-rate", "0"], meta_args=HEAL)
    data = os.urandom(2 * MiB)
    c.fs.write_bytes("/inventoried", data)
    segment, _ = c.chunk_place("/inventoried", 1, 4)  # parity: only a scrub or a degraded read reads it
    assert segment.endswith(".pack")
    os.unlink(segment)  # every chunk that server packed: of both blocks
    deadline = time.monotonic() + 60
    while True:
        try:
            if c.chunk_place("/inventoried", 1, 4)[0] != segment:  # a new record, in a new segment
                break
        except LookupError:
            pass  # not rebuilt yet
        assert time.monotonic() < deadline, "the lost packed chunks were not rebuilt"
        time.sleep(0.3)
    _assert_found_by_the_inventory(c, "/inventoried", data)


def test_a_server_back_after_its_chunks_were_rebuilt_has_its_stale_copies_collected(make_cluster):
    c = make_cluster(servers=7, block_size=256 * KiB, meta_args=HEAL)
    c.fs.mkdir("/heal")
    files = _write_files(c, 3, [MiB + 1])
    assert c.chunk_count(5) > 0
    c.kill_chunk_server(5)
    time.sleep(2.5)
    _wait_clean(c, timeout_s=90)  # rebuilt elsewhere while it was away
    c.restart_chunk(5)
    deadline = time.monotonic() + 60
    while c.chunk_count(5):
        assert time.monotonic() < deadline, f"{c.chunk_count(5)} stale chunks left on the returned server"
        time.sleep(0.3)
    assert _fsck(c)[0] == 0
    for path, data in files.items():
        assert c.fs.read_bytes(path) == data
