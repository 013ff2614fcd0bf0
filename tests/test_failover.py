"""Metadata-service failover: an address group ``"A,B"`` of services sharing one store, and
non-idempotent calls applied exactly once across retries and failovers (call ids, recorded
with their results in the store: ``tectofs/store/requests.py``)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from typing import Any, Iterator

import pytest

from tectofs import errors, fsck, limits
from tectofs.benchmarks import burst
from tectofs.client import connect
from tectofs.store import SqlStore, StoreRunner, requests
from tectofs.store.dialect import dialect_for
from tectofs.wire.client import RpcClient
from tectofs.wire.server import Call
from tectofs.wire.transport import parse_group
from tests import conftest

KiB = 1 << 10
MiB = 1 << 20


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "meta.db")
    from tests.postgres import new_database

    return new_database(request.getfixturevalue("postgres_server"))


@pytest.fixture
def dead_address() -> str:
    """A loopback address nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A loopback address whose listener never accepts: connections open, nothing answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield f"127.0.0.1:{s.getsockname()[1]}"


# --------------------------------------------------------------------------- addresses


def test_address_groups_parse_and_bad_ones_are_refused():
    assert parse_group("127.0.0.1:1") == ["127.0.0.1:1"]
    assert parse_group("127.0.0.1:1, [::1]:2") == ["127.0.0.1:1", "[::1]:2"]
    for bad in ("", "127.0.0.1:1,", "a:1,a:1", "a:1,b", ",".join(f"h:{p}" for p in range(1, 18))):
        with pytest.raises(errors.InvalidArgument):
            parse_group(bad)
    with pytest.raises(errors.InvalidArgument):
        connect("127.0.0.1:1,nonsense")


def test_recorded_results_decode_to_what_the_operation_returned():
    for value in [({"ino": 2, "target": None}, True), [1, (2, (3.5, b"x")), {"k": [()]}], None, {7: "int key"}]:
        assert requests.decode(requests.encode(value)) == value
        assert type(requests.decode(requests.encode(value))) is type(value)
    assert isinstance(requests.decode(requests.encode([1, (2,)]))[1], tuple)


# --------------------------------------------------------------------------- exactly once


def _runner(url: str) -> StoreRunner:
    return StoreRunner(lambda: SqlStore(dialect_for(url)))


async def _as_call(runner: StoreRunner, call: Call, method: str, *args: Any, **kwargs: Any) -> Any:
    """Run a store operation as the next step of ``call``, keyed as the metadata service keys it."""
    return await runner.call(method, *args, request_key=call.next_key(), **kwargs)


def test_each_store_operation_of_a_retried_call_runs_once(store_url):
    runner = _runner(store_url)
    try:
        servers = [runner.call_sync("register_server", f"uuid-{i}", f"127.0.0.1:{1000 + i}", 1 << 40, 0)
                   for i in range(6)]
        assert len(set(servers)) == 6

        async def twice(method: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            """The original and a retry of one call (same call id)."""
            call_id = uuid.uuid4().bytes
            first = await _as_call(runner, Call(call_id), method, *args, **kwargs)
            return first, await _as_call(runner, Call(call_id), method, *args, **kwargs)

        async def main() -> None:
            first, again = await twice("mkdir", ["d"])
            assert first == again and first["kind"] == "dir"
            first, again = await twice("create_file", ["d", "f"], exclusive=True)
            assert first == again and isinstance(again, tuple) and again[1] is True
            with pytest.raises(errors.AlreadyExists):  # a new call is a new call
                await _as_call(runner, Call(uuid.uuid4().bytes), "create_file", ["d", "f"], exclusive=True)
            ino, block_size = first[0]["ino"], first[0]["block_size"]
            first, again = await twice("allocate", ino, 2)
            assert first == again  # the same block ids: not a second allocation
            committed = [{"idx": i, "block_id": b["block_id"], "length": 10,
                          "chunks": [{"position": p, "server_id": s["server_id"], "length": 5, "crc": 1}
                                     for p, s in enumerate(b["servers"][:6])]} for i, b in enumerate(first)]
            first, again = await twice("commit", ino, block_size + 10, committed, replace=True)
            assert first == again and [b["idx"] for b in again["blocks"]] == [0, 1]
            first, again = await twice("rename", ["d", "f"], ["d", "g"])  # a rerun would be NotFound
            assert first == again and first["ino"] == ino
            first, again = await twice("unlink", ["d", "g"])  # a rerun would be NotFound
            assert first == again and first[0]["kind"] == "dir"  # the directory after the unlink, its ctime before
            # One call running several operations (makedirs): each step has its own record.
            call_id = uuid.uuid4().bytes
            for call in (Call(call_id), Call(call_id)):
                a = await _as_call(runner, call, "mkdir", ["a"], exist_ok=True)
                b = await _as_call(runner, call, "mkdir", ["a", "b"])
                assert (a["kind"], b["kind"]) == ("dir", "dir") and a["ino"] != b["ino"]
            # A failed operation changed nothing and is not recorded: its retry runs again.
            call_id = uuid.uuid4().bytes
            with pytest.raises(errors.NotFound):
                await _as_call(runner, Call(call_id), "unlink", ["later"])
            runner.call_sync("create", ["later"])
            assert (await _as_call(runner, Call(call_id), "unlink", ["later"]))[0]["ino"] == 1  # ran: the root after it

        asyncio.run(main())
        assert runner.call_sync("readdir", ["d"])[0] == []
        assert sorted(name for name, _ in runner.call_sync("readdir", [])[0]) == ["a", "d"]
        assert runner.call_sync("lookup", ["d"])["nlink"] == 2
    finally:
        runner.close()


def test_records_are_pruned_after_their_retention(store_url):
    store = SqlStore(dialect_for(store_url))
    try:
        requests.create_schema(store)
        store.tx_begin()
        requests.record(store, "old:1", [1], now=100.0)
        requests.record(store, "new:1", (2,), now=time.time())
        assert requests.prune(store, before=time.time() - limits.request_dedupe_retention_s) == 1
        store.tx_commit()
        assert requests.lookup(store, "old:1") is requests.ABSENT
        assert requests.lookup(store, "new:1") == (2,)
    finally:
        store.close()


def test_a_call_retried_on_another_metadata_service_is_applied_once(store_url, tmp_path):
    """The failover case in one process: the original reaches service A, its retry (same call
    id) service B over the same store; B answers with A's reply."""
    from tectofs.server.meta import MetadataService
    from tectofs.wire import auth

    key_file = auth.create_key_file(str(tmp_path / "cluster.key"))

    async def main() -> None:
        a, b = MetadataService(store_url, key_file=key_file), MetadataService(store_url, key_file=key_file)
        rpc = RpcClient(retries_max=0, default_auth=auth.ClientAuth(ring=auth.KeyRing(key_file)))
        try:
            address_a, address_b = await a.start(), await b.start()
            rpc.expect_role(f"{address_a},{address_b}", "meta")
            calls: list[tuple[str, dict[str, Any]]] = [
                ("mkdir", {"path": "/d"}), ("create", {"path": "/d/f", "exclusive": True}),
                ("rename", {"src": "/d/f", "dst": "/d/g"}), ("makedirs", {"path": "/x/y/z"}), ("unlink", {"path": "/d/g"})]
            for op, fields in calls:
                call_id = uuid.uuid4().bytes
                first, _ = await rpc.call_raw(address_a, op, fields, call_id=call_id)
                again, _ = await rpc.call_raw(address_b, op, fields, call_id=call_id)
                assert first == again, op
            with pytest.raises(errors.AlreadyExists):  # the same request without the call id
                await rpc.call_raw(address_b, "mkdir", {"path": "/d"})
            listing, _ = await rpc.call_raw(address_b, "readdir", {"path": "/d"}, idempotent=True)
            assert listing["entries"] == []
            with pytest.raises(errors.InvalidArgument, match="call_id"):
                await rpc.call_raw(address_a, "mkdir", {"path": "/e", "call_id": b"short"}, idempotent=True)
        finally:
            await rpc.close()
            await a.close()
            await b.close()

    asyncio.run(main())


# --------------------------------------------------------------------------- groups


def test_a_group_whose_first_member_is_dead_works(cluster, dead_address):
    data = os.urandom(2 * MiB + 3)
    started = time.monotonic()
    with connect(f"{dead_address},{cluster.address}") as fs:
        fs.write_bytes("/via-group", data)
        assert fs.read_bytes("/via-group") == data
    assert time.monotonic() - started < 20


def test_a_silent_first_member_costs_one_hello_timeout(cluster, silent_address):
    started = time.monotonic()
    with connect(f"{silent_address},{cluster.address}") as fs:
        assert fs.stat("/").is_dir
        took = time.monotonic() - started
        assert limits.hello_timeout_s <= took < 3 * limits.hello_timeout_s + 5
        started = time.monotonic()
        fs.listdir("/")  # sticks to the member that answered
        assert time.monotonic() - started < limits.hello_timeout_s


def test_a_group_that_is_down_names_every_member(dead_address):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        other = f"127.0.0.1:{s.getsockname()[1]}"
    started = time.monotonic()
    with pytest.raises(errors.ConnectionLost) as failed:
        connect(f"{dead_address},{other}")
    assert dead_address in str(failed.value) and other in str(failed.value)
    assert time.monotonic() - started < 30


# --------------------------------------------------------------------------- the burst


class TwoMetaCluster(conftest.TestCluster):
    """Two metadata services over one store; chunk servers and clients are given the group
    ``"A,B"`` (``address``). ``kill_meta`` kills A."""

    second: subprocess.Popen[bytes] | None = None
    second_address = ""

    def _start_meta(self, port: int, timeout_s: float) -> str:
        first = super()._start_meta(port, timeout_s)
        if self.second is None:
            self.second_address, self.second = self.start_extra_meta(timeout_s)
        return f"{first},{self.second_address}"

    def stop(self) -> None:
        super().stop()
        if self.second is not None and self.second.poll() is None:
            self.second.terminate()
            self.second.wait(timeout=20)


def _kill_during_save(c: TwoMetaCluster, watcher_address: str, events: dict[str, float]) -> threading.Thread:
    """A thread that SIGKILLs metadata service A once 32 ranks' files exist in the pending
    checkpoint directory (seen through B), i.e. while the other ranks are still saving."""

    def run() -> None:
        deadline = time.monotonic() + 120
        with connect(watcher_address, credentials=c.credential_file) as fs:
            while time.monotonic() < deadline:
                try:
                    pending = [e for e in fs.listdir("/burst") if e.startswith(".pending-")]
                    if pending and len(fs.listdir(f"/burst/{pending[0]}")) >= 32:
                        c.kill_meta(signal.SIGKILL)
                        events["killed"] = time.monotonic()
                        return
                except errors.NotFound:
                    pass
                time.sleep(0.02)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_sigkilled_metadata_service_during_a_128_rank_burst(make_cluster, postgres_server, tmp_path, rng):
    from tests.postgres import new_database

    c = make_cluster(cluster_class=TwoMetaCluster, store=new_database(postgres_server))
    assert isinstance(c, TwoMetaCluster) and len(parse_group(c.address)) == 2
    events: dict[str, float] = {}
    killer: list[threading.Thread] = []
    ticks = [0]

    def progress(n: int) -> None:
        ticks[0] += n
        if ticks[0] == 2:  # setup done: the save starts now
            killer.append(_kill_during_save(c, c.second_address, events))
        if ticks[0] == 3:
            events["saved"] = time.monotonic()

    result = burst.run(
        str(tmp_path / "out"), ranks=128, shard_bytes=48 * KiB + 7, processes=2, meta_address=c.address,
        baseline_bytes=1 << 20, phase_timeout_s=90, seed=rng.randrange(1 << 31), progress=progress,
    )
    for thread in killer:
        thread.join(timeout=30)
    assert result["error_count"] == 0, result["errors"]
    assert "killed" in events, "metadata service A was never killed"
    assert events["killed"] < events["saved"], "A was killed after the save: nothing failed over"
    print(f"A killed {events['saved'] - events['killed']:.2f} s before the save ended")
    assert c.meta_process is not None and c.meta_process.returncode == -signal.SIGKILL
    save, load = result["phases"]["save"], result["phases"]["load"]
    assert save["ranks_ok"] == 128 and load["ranks_ok"] == 128 and load["verified"] == 128
    # Every rank's file exactly once, readable through B alone; every chunk server live there.
    with connect(c.second_address, credentials=c.credential_file) as fs:
        step = next(e for e in fs.listdir("/burst") if e.startswith("step-"))
        assert len(fs.listdir(f"/burst/{step}")) == 128 + 1
        assert not [e for e in fs.listdir("/burst") if e.startswith(".pending")]
        deadline = time.monotonic() + 10
        while sum(1 for s in fs.servers() if s["live"]) < 6:
            assert time.monotonic() < deadline, fs.servers()
            time.sleep(0.2)
        time.sleep(c.server_dead_after_s + 1)  # and they stay live: they heartbeat B now
        assert sum(1 for s in fs.servers() if s["live"]) == 6, fs.servers()
        report = fs.run(fsck.check(fs.aio, "/burst"))
        assert report.exit_code == 0 and report.files >= 128 and report.healthy == report.blocks, report.as_dict()
    assert all(p is not None and p.poll() is None for p in c.chunk_processes)
