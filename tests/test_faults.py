"""Real faults: killed metadata service, full disks, crashed writers, damaged chunk files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tectofs import errors
from tectofs.client import connect
from tests.conftest import FILE_PER_CHUNK

MiB = 1 << 20


def test_metadata_service_killed_and_restarted_loses_nothing_committed(make_cluster):
    c = make_cluster()
    files = {f"/m{i}": os.urandom(MiB * i + i) for i in range(4)}
    for path, data in files.items():
        c.fs.write_bytes(path, data)
    c.fs.mkdir("/dir/sub", parents=True)
    c.kill_meta()
    with pytest.raises((errors.ConnectionLost, errors.Timeout)):
        c.fs.stat("/m1")
    c.restart_meta()
    with connect(c.address) as fs:
        for path, data in files.items():
            assert fs.read_bytes(path) == data
        assert fs.stat("/dir/sub").is_dir
        fs.write_bytes("/after-restart", b"still writable")  # chunk servers re-registered or still known
        assert fs.read_bytes("/after-restart") == b"still writable"


def test_full_disk_on_one_server_goes_to_a_spare(make_cluster, tmp_path):
    c = make_cluster(servers=8)
    tiny = c.chunk_data_dirs[0]
    c.kill_chunk_server(0)
    os.makedirs(tiny, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", tiny], check=True)
    try:
        c.restart_chunk(0)
        written = {}
        for i in range(6):
            data = os.urandom(MiB)
            c.fs.write_bytes(f"/full-{i}", data)
            written[f"/full-{i}"] = data
        for path, data in written.items():
            assert c.fs.read_bytes(path) == data
        stats = c.fs.aio.blocks.stats
        assert stats["spare_writes"] >= 1, stats
    finally:
        c.kill_chunk_server(0)
        subprocess.run(["umount", "-l", tiny], check=False)


def test_all_disks_full_is_no_space(make_cluster):
    c = make_cluster(servers=6)
    mounted = []
    try:
        for i in range(6):
            c.kill_chunk_server(i)
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", c.chunk_data_dirs[i]], check=True)
            mounted.append(c.chunk_data_dirs[i])
            c.restart_chunk(i)
        c.fs.write_bytes("/small", b"fits")
        with pytest.raises(errors.NoSpace):
            c.fs.write_bytes("/big", os.urandom(8 * MiB))
        assert c.fs.read_bytes("/small") == b"fits"
        assert not c.fs.exists("/big")  # nothing half-committed, and no empty leftover
    finally:
        for i in range(6):
            c.kill_chunk_server(i)
        for path in mounted:
            subprocess.run(["umount", "-l", path], check=False)


def test_crashed_writer_leaves_old_content_and_orphans_are_collected(make_cluster):
    c = make_cluster(allocation_grace_s=2.0)
    old = os.urandom(MiB + 5)
    c.fs.write_bytes("/victim", old)
    before = c.chunk_count()
    script = textwrap.dedent(f"""
        import os, sys, time
        import tectofs.client
        fs = tectofs.client.connect({c.address!r})
        f = fs.open("/victim", "wb")
        f.write(os.urandom(4 * {MiB}))
        f.raw.handle and fs.run(f.raw.handle._reap(wait=True))
        print("written", flush=True)
        time.sleep(60)
    """)
    writer = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "written"
        assert c.chunk_count() > before  # chunks of uncommitted blocks exist
    finally:
        writer.kill()
        writer.wait(timeout=10)
    assert c.fs.read_bytes("/victim") == old
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and c.chunk_count() > before:
        time.sleep(0.3)
    assert c.chunk_count() == before, "orphan chunks of the crashed writer were not collected"
    assert c.fs.read_bytes("/victim") == old


def test_truncated_and_missing_chunk_files_are_read_around(make_cluster):
    c = make_cluster(chunk_args=FILE_PER_CHUNK)
    data = os.urandom(MiB)
    c.fs.write_bytes("/damaged", data)
    with open(c.chunk_file("/damaged", 0, 0), "r+b") as f:
        f.truncate(1000)
    os.unlink(c.chunk_file("/damaged", 0, 1))
    assert c.fs.read_bytes("/damaged") == data
    assert c.fs.aio.blocks.stats["degraded_reads"] >= 1


def test_leftover_tmp_files_are_removed_at_start(make_cluster):
    c = make_cluster()
    leftover = os.path.join(c.chunk_data_dirs[2], "chunks", "ab", "00000000000000ab.chunk.tmp")
    os.makedirs(os.path.dirname(leftover), exist_ok=True)
    with open(leftover, "wb") as f:
        f.write(b"half written")
    c.kill_chunk_server(2)
    c.restart_chunk(2)
    assert not os.path.exists(leftover)


def test_busy_server_answers_busy_and_client_retries(make_cluster):
    c = make_cluster(servers=6, chunk_inflight_bytes_max=300_000)
    files = {f"/busy-{i}": os.urandom(2 * MiB) for i in range(6)}

    def write(path: str) -> None:
        with connect(c.address) as fs:
            fs.write_bytes(path, files[path])

    import threading

    threads = [threading.Thread(target=write, args=(p,)) for p in files]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    busy = sum(c.fs.run(c.fs.aio.rpc.call_raw(s.address, "stat"))[0]["stats"]["busy"] for s in c.servers())
    assert busy > 0, "no server ever answered BUSY: the test did not exercise admission control"
    for path, data in files.items():
        assert c.fs.read_bytes(path) == data


def test_failed_block_write_is_never_committed_as_a_hole(make_cluster):
    c = make_cluster()
    old = os.urandom(MiB)
    c.fs.write_bytes("/poisoned", old)
    f = c.fs.open("/poisoned", "wb", buffering=0)
    f.write(os.urandom(2 * MiB))  # two full blocks, sent in the background
    for i in range(3):
        c.kill_chunk_server(i)  # beyond what rs(4,2) tolerates
    lost = (errors.NoSpace, errors.DataUnavailable)
    with pytest.raises(lost):
        f.write(os.urandom(2 * MiB))
        f.fsync()  # commit: must fail, a block is lost
    with pytest.raises(lost):
        f.fsync()  # and keep failing: nothing later commits the lost block as zeros
    with pytest.raises(lost):
        f.close()
    for i in range(3):
        c.restart_chunk(i)
    assert c.fs.read_bytes("/poisoned") == old


def test_hung_server_is_hedged_around_for_reads_and_writes(make_cluster):
    import signal

    c = make_cluster(servers=8)
    before = {f"/hung-{i}": os.urandom(2 * MiB + i) for i in range(3)}
    for path, data in before.items():
        c.fs.write_bytes(path, data)
    victim = c.chunk_processes[0]
    victim.send_signal(signal.SIGSTOP)  # alive to the kernel, silent to everyone: a hung server
    try:
        started = time.monotonic()
        for path, data in before.items():
            assert c.fs.read_bytes(path) == data
        fresh = os.urandom(4 * MiB)
        c.fs.write_bytes("/hung-new", fresh)
        assert c.fs.read_bytes("/hung-new") == fresh
        elapsed = time.monotonic() - started
        stats = c.fs.aio.blocks.stats
        # Around the hung server: a chunk hedged to a spare, or (when the block's hedge deadline
        # comes first, as on a loaded machine) the block stored degraded without it.
        went_around = stats["hedged_reads"] + stats["hedged_writes"] + stats["degraded_reads"] + stats["degraded_writes"]
        assert went_around >= 1, stats
        assert elapsed < 30, f"took {elapsed:.1f}s: waited for timeouts instead of hedging"
    finally:
        victim.send_signal(signal.SIGCONT)


def test_reads_go_around_a_server_found_down_without_asking_it_again(make_cluster):
    c = make_cluster()
    data = os.urandom(16 * MiB)  # 16 blocks of rs(4,2) over 6 servers: every block has a chunk on each
    c.fs.write_bytes("/around", data)
    c.kill_chunk_server(0)
    stats = c.fs.aio.blocks.stats
    assert c.fs.read_bytes("/around") == data  # finds server 0 down (and reports it)
    reports, skipped, degraded = stats["bad_chunks"], stats["skipped_down_servers"], stats["degraded_reads"]
    assert reports >= 1
    assert c.fs.read_bytes("/around") == data
    assert stats["bad_chunks"] == reports, "asked the server it had just found down again"
    assert stats["skipped_down_servers"] - skipped == stats["degraded_reads"] - degraded >= 1, stats
    c.restart_chunk(0)
    later = time.monotonic() + 3600
    c.fs.aio.blocks.down.clock = lambda: later  # the memo has run out: the restarted server is asked again
    skipped, degraded = stats["skipped_down_servers"], stats["degraded_reads"]
    assert c.fs.read_bytes("/around") == data
    assert (stats["skipped_down_servers"], stats["degraded_reads"]) == (skipped, degraded)


def test_down_server_memo_expires_and_clears_on_an_answer():
    from tectofs.client.blocks import DownServers

    now = [100.0]
    down = DownServers(memo_s=10.0, clock=lambda: now[0])
    down.mark("127.0.0.1:1")
    down.mark("")  # a chunk without an address is not a server
    assert down.is_down("127.0.0.1:1") and not down.is_down("127.0.0.1:2") and not down.is_down("")
    now[0] = 109.9
    assert down.is_down("127.0.0.1:1")
    now[0] = 110.0
    assert not down.is_down("127.0.0.1:1")
    down.mark("127.0.0.1:1")
    down.answered("127.0.0.1:1")
    assert not down.is_down("127.0.0.1:1")
