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
from typing import Any, Callable, Iterator, TypeVar

import msgspec
import pytest

from tectofs import errors, fsck, limits
from tectofs.benchmarks import burst
from tectofs.client import connect
from tectofs.store import SqlStore, StoreRunner, requests
from tectofs.store.dialect import dialect_for
from tectofs.store.users import MAYBE_USER, StoredUser
from tectofs.wire import messages
from tectofs.wire.client import RpcClient
from tectofs.wire.server import Call
from tectofs.wire.transport import parse_group
from tests import conftest

KiB = 1 << 10
MiB = 1 << 20
ResultT = TypeVar("ResultT")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "meta.db")
    from tectofs.testing.postgres import new_database

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
    attrs = messages.Attrs(ino=2, kind="file", mode=0o100644, uid=0, gid=0, size=0, atime=1.0, mtime=1.0, ctime=1.0,
                           nlink=1, policy="rep(3)", block_size=1 << 20, parent=1)
    made = messages.CreateReply(attrs=attrs, created=True, directory=attrs, directory_ctime_before=0.5)
    cases: list[tuple[Any, Any]] = [(made, messages.CreateReply), ([attrs], list[messages.Attrs]), (None, type(None)),
                                    (7, int), (b"x", bytes), (StoredUser(name="u", uid=1, gid=1, groups=[2]), MAYBE_USER)]
    for value, returns in cases:
        assert requests.decode(requests.encode(value), returns) == value


def _legacy(value: Any) -> bytes:
    """``value`` as a release before typed results recorded it: tuples as msgpack extension 1."""
    def wrap(v: Any) -> Any:
        if isinstance(v, tuple):
            return msgspec.msgpack.Ext(1, msgspec.msgpack.encode([wrap(x) for x in v]))
        if isinstance(v, list):
            return [wrap(x) for x in v]
        if isinstance(v, dict):
            return {k: wrap(x) for k, x in v.items()}
        return v
    return msgspec.msgpack.encode(wrap(value))


def test_records_of_a_release_before_typed_results_read_back_compatibly():
    """A retry that straddles the upgrade gets the reply the old release recorded, typed."""
    attrs = {"ino": 5, "kind": "file", "mode": 0o100644, "uid": 0, "gid": 0, "size": 0, "atime": 1.0, "mtime": 1.0,
             "ctime": 1.0, "nlink": 1, "policy": "rep(3)", "block_size": 1 << 20, "target": None, "parent": 1,
             "stored": 0, "write_min": 0, "rdev": 0}
    root = {**attrs, "ino": 1, "kind": "dir", "mode": 0o40755, "nlink": 2}
    assert requests.decode(_legacy(attrs), messages.Attrs).ino == 5  # mkdir, rename, link...
    made = requests.decode(_legacy((attrs, True, root, 0.5)), messages.CreateReply)
    assert (made.attrs.ino, made.created, made.directory and made.directory.ino, made.directory_ctime_before) == (
        5, True, 1, 0.5)
    older = requests.decode(_legacy((attrs, False)), messages.CreateReply)  # an older release's create: less
    assert older.attrs.ino == 5 and older.directory is None
    removed = requests.decode(_legacy((root, 0.5)), messages.UnlinkReply)
    assert removed.directory is not None and removed.directory.ino == 1 and removed.directory_ctime_before == 0.5
    layout = {"attrs": attrs, "first": 0, "end": None, "blocks": [
        {"idx": 0, "block_id": 9, "policy": "rep(3)", "start": 0, "length": 10, "valid": 10,
         "chunks": [{"position": 0, "server_id": 1, "address": "127.0.0.1:1", "length": 10, "crc": 1}]}]}
    assert requests.decode(_legacy(layout), messages.LayoutSegment).blocks[0].chunks[0].server_id == 1
    allocations = [{"block_id": 9, "policy": "rep(3)", "write_min": 2,
                    "servers": [{"server_id": 1, "address": "127.0.0.1:1"}]}]
    assert requests.decode(_legacy(allocations), list[messages.Allocation])[0].servers[0].server_id == 1
    # What cannot be read is never taken as absent (the operation would run twice): an error.
    with pytest.raises(errors.TectofsError, match="recorded by an earlier release"):
        requests.decode(_legacy(("not", "attrs")), messages.Attrs)


# --------------------------------------------------------------------------- exactly once


def _runner(url: str) -> StoreRunner:
    return StoreRunner(lambda: SqlStore(dialect_for(url)))


def test_each_store_operation_of_a_retried_call_runs_once(store_url):
    runner = _runner(store_url)
    try:
        def register(i: int) -> Callable[[SqlStore], int]:
            return lambda store: store.register_server(f"uuid-{i}", f"127.0.0.1:{1000 + i}", 1 << 40, 0)

        servers = [runner.call_sync(register(i)) for i in range(6)]
        assert len(set(servers)) == 6

        async def as_call(call: Call, operation: Callable[[SqlStore], ResultT], returns: type[ResultT]) -> ResultT:
            """Run a store operation as the next step of ``call``, keyed as the metadata service keys it."""
            return await runner.call(operation, returns=returns, request_key=call.next_key())

        async def twice(operation: Callable[[SqlStore], ResultT], returns: type[ResultT]) -> tuple[ResultT, ResultT]:
            """The original and a retry of one call (same call id)."""
            call_id = uuid.uuid4().bytes
            first = await as_call(Call(call_id), operation, returns)
            return first, await as_call(Call(call_id), operation, returns)

        async def main() -> None:
            made, again = await twice(lambda store: store.mkdir(["d"]), messages.Attrs)
            assert made == again and made.kind == "dir"
            created, created_again = await twice(lambda store: store.create_file(["d", "f"], exclusive=True),
                                                 messages.CreateReply)
            assert created == created_again and created_again.created is True
            with pytest.raises(errors.AlreadyExists):  # a new call is a new call
                await as_call(Call(uuid.uuid4().bytes), lambda store: store.create_file(["d", "f"], exclusive=True),
                              messages.CreateReply)
            ino, block_size = created.attrs.ino, created.attrs.block_size
            allocated, allocated_again = await twice(lambda store: store.allocate(ino, 2), list[messages.Allocation])
            assert allocated == allocated_again  # the same block ids: not a second allocation
            committed = [messages.WrittenBlock(idx=i, block_id=b.block_id, length=10, chunks=[
                messages.WrittenChunk(position=p, server_id=s.server_id, length=5, crc=1)
                for p, s in enumerate(b.servers[:6])]) for i, b in enumerate(allocated)]
            layout, layout_again = await twice(
                lambda store: store.commit(ino, block_size + 10, committed, replace=True), messages.LayoutSegment)
            assert layout == layout_again and [b.idx for b in layout_again.blocks] == [0, 1]
            renamed, renamed_again = await twice(lambda store: store.rename(["d", "f"], ["d", "g"]), messages.Attrs)
            assert renamed == renamed_again and renamed.ino == ino  # a rerun would be NotFound
            removed, removed_again = await twice(lambda store: store.unlink(["d", "g"]), messages.UnlinkReply)
            assert removed == removed_again  # a rerun would be NotFound
            assert removed.directory is not None and removed.directory.kind == "dir"  # the directory after
            # One call running several operations (makedirs): each step has its own record.
            call_id = uuid.uuid4().bytes
            for call in (Call(call_id), Call(call_id)):
                a = await as_call(call, lambda store: store.mkdir(["a"], exist_ok=True), messages.Attrs)
                b = await as_call(call, lambda store: store.mkdir(["a", "b"]), messages.Attrs)
                assert (a.kind, b.kind) == ("dir", "dir") and a.ino != b.ino
            # A failed operation changed nothing and is not recorded: its retry runs again.
            call_id = uuid.uuid4().bytes
            with pytest.raises(errors.NotFound):
                await as_call(Call(call_id), lambda store: store.unlink(["later"]), messages.UnlinkReply)
            runner.call_sync(lambda store: store.create(["later"]))
            ran = await as_call(Call(call_id), lambda store: store.unlink(["later"]), messages.UnlinkReply)
            assert ran.directory is not None and ran.directory.ino == 1  # ran: the root after it

        asyncio.run(main())
        assert runner.call_sync(lambda store: store.readdir(["d"])).entries == []
        assert sorted(e.name for e in runner.call_sync(lambda store: store.readdir([])).entries) == ["a", "d"]
        assert runner.call_sync(lambda store: store.lookup(["d"])).nlink == 2
    finally:
        runner.close()


def test_records_are_pruned_after_their_retention(store_url):
    store = SqlStore(dialect_for(store_url))
    try:
        requests.create_schema(store)
        store.tx_begin()
        requests.record(store, "old:1", [1], now=100.0)
        requests.record(store, "new:1", [2], now=time.time())
        assert requests.prune(store, before=time.time() - limits.request_dedupe_retention_s) == 1
        store.tx_commit()
        assert requests.lookup(store, "old:1", list[int]) is requests.ABSENT
        assert requests.lookup(store, "new:1", list[int]) == [2]
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
    from tectofs.testing.postgres import new_database

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
        while sum(1 for s in fs.servers() if s.live) < 6:
            assert time.monotonic() < deadline, fs.servers()
            time.sleep(0.2)
        time.sleep(c.server_dead_after_s + 1)  # and they stay live: they heartbeat B now
        assert sum(1 for s in fs.servers() if s.live) == 6, fs.servers()
        report = fs.run(fsck.check(fs.aio, "/burst"))
        assert report.exit_code == 0 and report.files >= 128 and report.healthy == report.blocks, report.as_dict()
    assert all(p is not None and p.poll() is None for p in c.chunk_processes)
