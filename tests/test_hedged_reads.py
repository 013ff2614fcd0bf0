"""Hedged, deadline-driven block reads (issue 53 part 1, reads): the deadline a client learns
from each chunk server's recent answers, the budget that bounds the hedges, the servers a
client sets aside when they stop answering (``client/server_health.py``), a block read that
hedges a vanished server and the next one that does not ask it (in process, fake chunk
servers), and one cross-host test: six chunk hosts, a metadata host and a client host in
network namespaces on a bridge, one chunk host's link cut (no RST, no FIN: its peers just
hear nothing) while a new client process reads a file, which must cost little more than a
read with every host reachable."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tectofs import checksum, erasure, limits
from tectofs.buffers import BufferPool
from tectofs.client import partial_reads, server_health
from tectofs.client.block_reads import BlockRead
from tectofs.client.server_health import DownServers, HedgeBudget, ServerLatencies
from tectofs.errors import NoSpace
from tectofs.server.cluster import wait_for_file
from tectofs.server.meta.set_aside import SetAside
from tectofs.testing import netns
from tectofs.wire import auth, messages
from tests.test_block_machines import DATA, HANG, POLICY, _block, _Chunks, _read

# ---------------------------------------------------------------------- the deadline


def test_the_deadline_is_learned_from_each_servers_answers_with_a_floor_and_a_cap():
    latencies = ServerLatencies()
    assert latencies.deadline("a") == server_health.HEDGE_CAP_S  # nothing timed yet: the cap
    assert latencies.deadline("a", [0.1, 0.1, 0.1]) == pytest.approx(0.2)  # the block's siblings: 2x their median
    assert latencies.deadline("a", [0.1, 0.1, 0.3]) == pytest.approx(0.3)  # ... or their p95
    assert latencies.deadline("a", [0.001]) == server_health.HEDGE_FLOOR_S
    for s in [0.05] * 19 + [0.3]:
        latencies.record("a", s)
    assert latencies.deadline("a") == pytest.approx(0.3)  # its p95 beats 2x its median
    for s in [0.2] * 3:
        latencies.record("b", s)
    assert latencies.deadline("b") == pytest.approx(0.4)  # its own (2x median), not a's
    assert latencies.deadline("c") == pytest.approx(0.2)  # unknown: every server's answers (their p95)
    for s in [5.0] * 40:
        latencies.record("slow", s)
    assert latencies.deadline("slow") == server_health.HEDGE_CAP_S
    assert latencies.set_aside_after(0.01) == server_health.SET_ASIDE_MIN_S
    assert latencies.set_aside_after(1.0) == server_health.SET_ASIDE_FACTOR


def test_the_budget_bounds_hedges_to_a_share_of_gets_plus_a_burst():
    budget = HedgeBudget()
    hedges = 0
    for _ in range(1000):  # every get wants a hedge: a worst case
        budget.requested()
        hedges += budget.take()
    assert hedges <= server_health.HEDGE_BURST + server_health.HEDGE_FRACTION * 1000
    assert hedges >= server_health.HEDGE_FRACTION * 1000


def test_a_late_server_is_set_aside_for_longer_each_time_in_a_row_until_it_answers():
    now = [0.0]
    down = DownServers(memo_s=10.0, clock=lambda: now[0])
    down.late("a")
    assert down.is_down("a")
    now[0] = server_health.LATE_SET_ASIDE_S + 0.01
    assert not down.is_down("a")  # retried after a while
    down.late("a")
    now[0] += server_health.LATE_SET_ASIDE_S + 0.01
    assert down.is_down("a")  # twice in a row: twice as long
    for _ in range(20):
        down.late("a")
    now[0] += 10.01
    assert not down.is_down("a")  # never longer than the memo of a server found down
    down.late("a")
    down.answered("a")
    assert not down.is_down("a")
    down.late("a")
    now[0] += server_health.LATE_SET_ASIDE_S + 0.01
    assert not down.is_down("a")  # an answer forgave the strikes


# ---------------------------------------------------------------------- block reads, in process


def test_a_vanished_server_is_hedged_once_then_set_aside_for_the_next_blocks():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={2: HANG}, delays={p: 0.01 for p in range(6)})
    source.down.clock = lambda: 0.0  # (a loaded machine: the set-aside must not run out in this test)
    data, machine = _read(source, block)
    assert data == DATA
    assert source.events["hedged_reads"] == 1 and source.events["servers_set_aside"] == 1
    assert source.down.is_down(block.chunks[2].address) and not source.reports  # late is not bad
    source.asked.clear()
    for _ in range(3):  # later blocks: straight to parity, no hedge, no wait
        assert _read(source, block)[0] == DATA
    assert 2 not in source.asked and source.events["hedged_reads"] == 1


def test_a_refused_hedge_still_goes_out_once_the_server_is_set_aside(monkeypatch):
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={1: HANG})
    source.down.budget = HedgeBudget(burst=0.0)  # the budget is spent
    started = time.monotonic()
    data, _ = _read(source, block)
    took = time.monotonic() - started
    assert data == DATA
    assert source.events["hedges_refused"] == 1 and source.events["hedged_reads"] == 1
    assert server_health.SET_ASIDE_MIN_S <= took < 10  # (not the RPC timeout)


def test_a_healthy_read_sends_no_hedge_and_learns_each_servers_latency():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, delays={p: 0.005 for p in range(6)})
    for _ in range(5):
        assert _read(source, block)[0] == DATA
    assert source.events["hedged_reads"] == 0 and sorted(set(source.asked)) == [0, 1, 2, 3]
    assert len(source.down.latencies.samples(block.chunks[0].address)) == 5


def test_a_get_to_a_server_set_aside_by_another_read_is_hedged_at_once():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={0: HANG})
    machine = BlockRead(source, block, None)

    async def go() -> bytes:
        reading = asyncio.ensure_future(machine.run())
        await asyncio.sleep(0.01)  # the get to chunk 0 is in flight, not late yet (nothing timed: the cap)
        source.down.mark(block.chunks[0].address)  # another read found its server down
        out = await asyncio.wait_for(reading, 0.5)
        assert isinstance(out, memoryview)
        data = bytes(out)
        source.buffers.put(out)
        return data

    assert asyncio.run(go()) == DATA and source.events["hedged_reads"] == 1


def test_two_vanished_servers_of_an_rs_4_2_block_are_each_hedged_with_parity():
    block, chunks = _block(POLICY, DATA)
    source = _Chunks(chunks, faults={0: HANG, 3: HANG}, delays={p: 0.01 for p in range(6)})
    source.down.clock = lambda: 0.0  # (a loaded machine: the set-aside must not run out in this test)
    started = time.monotonic()
    data, _ = _read(source, block)
    assert data == DATA and time.monotonic() - started < 5  # (not the RPC timeout)
    assert source.events["hedged_reads"] == 2 and source.events["servers_set_aside"] == 2
    source.asked.clear()
    assert _read(source, block)[0] == DATA  # the next block: both parity chunks at once, no hedge
    assert sorted(source.asked) == [1, 2, 4, 5] and source.events["hedged_reads"] == 2


class _RangeServers:
    """What ``partial_reads.read_part`` needs of a ``BlockIO``: range gets answered from
    ``chunks``, or never by the servers in ``hung``."""

    def __init__(self, chunks: list[bytes], hung: set[str]) -> None:
        self.chunks = {f"127.0.0.1:{1000 + p}": c for p, c in enumerate(chunks)}
        self.hung = hung
        self.down = DownServers()
        self.buffers = BufferPool(1 << 24)
        self.events: Counter[str] = Counter()
        self.rpc, self.metrics = self, self

    async def call(self, address: str, op: Any, request: Any, retries_max: int = 0) -> Any:
        if address in self.hung:
            await asyncio.Event().wait()
        data = self.chunks[address]
        pieces = data[request.offset : request.offset - -request.length // checksum.PIECE * checksum.PIECE]  # whole ones
        return (messages.GetChunkReply(crcs=checksum.piece_crcs(pieces), chunk_length=len(data), position=0, crc=0),
                bytearray(pieces))

    def event(self, name: str) -> None:
        self.events[name] += 1

    note = event


def test_a_partial_read_from_a_vanished_server_gives_up_at_its_deadline_and_sets_it_aside():
    data = os.urandom(8 << 20)
    block, chunks = _block(POLICY, data)
    servers = _RangeServers(chunks, hung={block.chunks[0].address or ""})
    for address in servers.chunks:
        for _ in range(3):
            servers.down.latencies.record(address, 0.01)  # a warm client: deadlines of 20 ms
    blocks: Any = servers

    async def part(start: int) -> tuple[bytes | None, float]:
        began = time.monotonic()
        got = await partial_reads.read_part(blocks, block, start, 100)
        return got, time.monotonic() - began

    def on(position: int) -> int:  # an offset in the block whose 100 bytes are all in data chunk `position`
        start = next(at for at in range(0, len(data), 4096)
                     if [e[0] for e in erasure.data_extents(POLICY, len(data), at, 100)] == [position])
        return start

    assert asyncio.run(part(on(1)))[0] == data[on(1) : on(1) + 100]  # chunk 1: read in part
    got, took = asyncio.run(part(on(0)))  # chunk 0: its server never answers
    assert got is None and took < 0.5 < limits.partial_read_timeout_s  # the whole block is read instead
    assert servers.down.is_down(block.chunks[0].address) and servers.events["servers_set_aside"] == 1
    assert servers.events["partial_reads"] == 1


def test_chunks_the_metadata_service_flags_are_read_last():
    block, chunks = _block(POLICY, DATA)
    flagged = msgspec.structs.replace(block, chunks=[msgspec.structs.replace(c, set_aside=c.position == 1)
                                                     for c in block.chunks])
    source = _Chunks(chunks, faults={1: HANG})
    data, _ = _read(source, flagged)
    assert data == DATA and sorted(source.asked) == [0, 2, 3, 4] and source.events["hedged_reads"] == 0


def test_a_server_set_aside_is_told_once_until_it_answers():
    told: list[str] = []
    down = DownServers(on_set_aside=told.append)
    down.late("a")
    down.late("a")  # already set aside: not told again
    down.answered("a")
    down.late("a")
    assert told == ["a", "a"]


def test_the_metadata_service_flags_a_reported_server_until_its_next_heartbeat():
    now = [100.0]
    heard: dict[int, float] = {2: 99.5}
    aside = SetAside(heard, clock=lambda: now[0], hold_s=20.0)
    block, _ = _block(POLICY, DATA)
    layout = messages.LayoutSegment(attrs=messages.Attrs(ino=5, kind="file", mode=0o644, uid=0, gid=0, size=len(DATA), atime=0, mtime=0,
                                                       ctime=0, nlink=1, policy=str(POLICY), block_size=1 << 20, parent=1), blocks=[block])
    assert aside.flag(layout) is layout  # nothing reported: as the store made it
    aside.report(2)
    flags = [c.set_aside for c in aside.flag(layout).blocks[0].chunks]
    assert flags == [c.server_id == 2 for c in block.chunks] and sum(flags) == 1

    async def allocate(exclude: list[int]) -> list[int]:
        if len(exclude) > 1:
            raise NoSpace("too few left")
        return exclude

    assert asyncio.run(aside.allocate(allocate, [])) == [2]  # new writes leave it out ...
    assert asyncio.run(aside.allocate(allocate, [4])) == [4]  # ... unless too few are left then
    now[0] += 1
    heard[2] = now[0]  # its heartbeat: it answers again
    assert aside.current() == set() and aside.flag(layout) is layout
    aside.report(2)
    aside.heard_from(2)  # restarted: registered again
    assert aside.current() == set()
    aside.report(2)
    now[0] += 20
    assert aside.current() == set()  # a report holds hold_s at most


# ---------------------------------------------------------------------- across hosts

REPO = Path(__file__).resolve().parent.parent
SUBNET = "10.78.0"
META = f"{SUBNET}.1"
CHUNK_HOSTS = [f"{SUBNET}.{11 + i}" for i in range(6)]
CLIENT = f"{SUBNET}.100"
BLOCK = 1 << 20
FILE_BYTES = 12 * BLOCK

READ_SCRIPT = textwrap.dedent("""
    import hashlib, json, sys, time
    from tectofs.client import connect

    meta, credentials, path, block = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    started = time.monotonic()
    digest = hashlib.sha256()
    marks = []
    with connect(meta, credentials=credentials) as fs:
        with fs.open(path, "rb", buffering=0) as f:  # block by block, as a job's rank reads a shard
            while True:
                marks.append(round(time.monotonic() - started, 3))
                piece = f.read(block)
                if not piece:
                    break
                digest.update(piece)
        stats = dict(fs.aio.blocks.stats)
    marks.append(round(time.monotonic() - started, 3))
    print(json.dumps({"seconds": time.monotonic() - started, "sha256": digest.hexdigest(), "stats": stats,
                      "marks": marks}))
""")

WRITE_SCRIPT = textwrap.dedent("""
    import sys, time
    from tectofs.client import connect

    meta, credentials, path, source = sys.argv[1:5]
    with connect(meta, credentials=credentials) as fs:
        deadline = time.monotonic() + 20
        while sum(s.live for s in fs.servers()) < 6:
            assert time.monotonic() < deadline, fs.servers()
            time.sleep(0.2)
        fs.write_bytes(path, open(source, "rb").read())
""")


@pytest.mark.slow
def test_a_chunk_hosts_link_cut_costs_a_new_client_little(tmp_path: Path) -> None:
    reason = netns.why_not()
    if reason is not None:
        pytest.skip(f"the cross-host test needs network namespaces: {reason}")
    key_file = str(tmp_path / "cluster.key")
    auth.create_key_file(key_file)
    meta_address = f"{META}:7420"
    credentials = str(tmp_path / "root.credentials")
    auth.Credential.root_from_keys(auth.KeyRing(key_file), meta_address).save(credentials)
    data = os.urandom(FILE_BYTES)
    (tmp_path / "source.bin").write_bytes(data)
    net = netns.Network("tfh")
    processes = netns.Processes(tmp_path, cwd=REPO)
    nodes = {"meta": META, **{f"c{i}": a for i, a in enumerate(CHUNK_HOSTS)}, "client": CLIENT}

    def in_client(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", net.ns("client"), sys.executable, *args], capture_output=True,
                              text=True, cwd=REPO, timeout=netns.STEP_TIMEOUT_S)

    def read() -> dict[str, object]:
        done = in_client("-c", READ_SCRIPT, meta_address, credentials, "/f.bin", str(BLOCK))
        assert done.returncode == 0, done.stderr[-3000:]
        out = json.loads(done.stdout.strip().splitlines()[-1])
        assert out["sha256"] == hashlib.sha256(data).hexdigest()  # bit-exact
        return dict(out)

    try:
        net.build(nodes)
        meta = processes.start(
            net.ns("meta"), "meta", "meta", "--store", str(tmp_path / "meta.db"), "--host", META, "--port", "7420",
            "--policy", "rs(4,2)", "--block-size", "1M", "--key-file", key_file,
            "--ready-file", str(tmp_path / "meta.address"))
        assert wait_for_file(str(tmp_path / "meta.address"), netns.STEP_TIMEOUT_S, meta) == meta_address
        chunks = [processes.start(
            net.ns(f"c{i}"), f"chunk-{i}", "chunk", "--data", str(tmp_path / f"chunk-{i}"), "--meta", meta_address,
            "--key-file", key_file, "--host", host, "--port", "7421",
            "--ready-file", str(tmp_path / f"chunk-{i}.address")) for i, host in enumerate(CHUNK_HOSTS)]
        for i, process in enumerate(chunks):
            wait_for_file(str(tmp_path / f"chunk-{i}.address"), netns.STEP_TIMEOUT_S, process)
        done = in_client("-c", WRITE_SCRIPT, meta_address, credentials, "/f.bin", str(tmp_path / "source.bin"))
        assert done.returncode == 0, done.stderr[-3000:]

        whole = min(float(str(read()["seconds"])) for _ in range(2))  # (the first warms the page cache)
        net.link("c1", up=False)
        try:
            cut = read()
            # The metadata service heard of c1 from the first client: a new one reads parity for
            # c1's chunks from its first block, no hedge, no deadline waited out.
            told = read()
        finally:
            net.link("c1", up=True)
        told_stats = told["stats"]
        assert isinstance(told_stats, dict)
        assert told_stats["hedged_reads"] == 0 and told_stats["skipped_down_servers"] >= 1, told_stats
        cut_s = float(str(cut["seconds"]))
        stats = cut["stats"]
        assert isinstance(stats, dict)
        print(f"read of {FILE_BYTES >> 20} MiB: {whole:.2f} s, one chunk host cut: {cut_s:.2f} s; {stats} {cut['marks']}")
        # The old client waited a second or more per block: 12 blocks, over 10x. Now the first
        # block hedges c1's chunks and sets c1 aside; the rest read parity at once.
        assert cut_s < 2 * whole + 0.5, (cut_s, whole, stats)
        assert stats.get("servers_set_aside", 0) >= 1 and stats["hedged_reads"] <= server_health.HEDGE_BURST + 2, stats
        read()  # restored: reads as before
    except BaseException:
        for name in ["meta"] + [f"chunk-{i}" for i in range(6)]:
            print(f"--- {name}.log\n{processes.log(name)}")
        raise
    finally:
        processes.stop()
        net.delete()

