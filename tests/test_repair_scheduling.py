"""Repair scheduling, inventories and drains in the store alone, on a virtual clock: what
gets rebuilt, in which order, where, and that no chunk a block still places is ever deleted."""

from __future__ import annotations

import pytest

from tectofs.store import SqlStore
from tectofs.store.dialect import SqliteDialect
from tectofs.wire import messages


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    s = SqlStore(SqliteDialect(str(tmp_path / "meta.db")), "rs(4,2)", 1 << 20, gc_delay_s=5.0, clock=clock)
    s.server_dead_after_s = 5.0
    yield s
    s.close()


def _servers(store, n):
    return [store.register_server(f"uuid-{i}", f"127.0.0.1:{1000 + i}", 1 << 40, 0) for i in range(n)]


def _beat(store, ids):
    delivered = {}
    for sid in ids:
        delivered[sid] = store.heartbeat(sid, 1 << 40, 0, 0, 0)
    return delivered


def _file(store, name, servers_per_block):
    """A one-block file per entry of ``servers_per_block`` (positions in order); returns its block ids."""
    f = store.create([name])
    block_ids = []
    for idx, servers in enumerate(servers_per_block):
        (b,) = store.allocate(f.ino, 1)
        chunks = [{"position": p, "server_id": sid, "length": 100, "crc": 7 + p} for p, sid in enumerate(servers)]
        block = messages.convert({"idx": idx, "block_id": b.block_id, "length": 400, "chunks": chunks},
                                 messages.WrittenBlock)
        store.commit(f.ino, (idx + 1) * (1 << 20), [block], replace=False)
        block_ids.append(b.block_id)
    return block_ids


def _queued(store):
    return store._all("SELECT block_id, position, target, priority FROM repairs ORDER BY priority, block_id, position")


def test_nothing_is_rebuilt_before_repair_after_then_the_most_endangered_block_first(store, clock):
    ids = _servers(store, 10)
    calm, endangered = _file(store, "f", [[ids[i] for i in (0, 1, 4, 5, 6, 7)], ids[2:8]])
    # ids[0] dies: block `calm` loses one chunk; ids[2] and ids[3] die: `endangered` loses two
    live = [ids[i] for i in (1, 4, 5, 6, 7, 8, 9)]
    clock.now += 3
    _beat(store, live)
    clock.now += 3  # ids[0], ids[2], ids[3] dead (no heartbeat for 6 s), not out yet
    _beat(store, live)
    assert store.schedule_repairs(repair_after_s=60) == 0
    assert store.health_summary()["under_redundant"] == 2
    clock.now += 61
    _beat(store, live)
    store.schedule_repairs(repair_after_s=60, per_server_max=1)  # one rebuild per target at a time
    queued = _queued(store)
    assert [(b, p) for b, p, _, _ in queued[:2]] == [(endangered, 0), (endangered, 1)]  # margin 0 first
    assert queued[0][3] < queued[-1][3]
    # targets never hold another chunk of the block
    for block_id, position, target, _ in queued:
        holders = {r[0] for r in store._all("SELECT server_id FROM chunks WHERE block_id = ?", (block_id,))}
        assert target not in holders


def _first_server_out(store, clock):
    """Seven servers, one block on the first six; the first stays away past repair-after."""
    ids = _servers(store, 7)
    (block,) = _file(store, "f", [ids[0:6]])
    clock.now += 20
    _beat(store, ids[1:])
    store.schedule_repairs(repair_after_s=10)
    return ids, block


def test_repair_done_moves_the_chunk_and_the_stale_copy_is_collected_when_its_server_returns(store, clock):
    ids, block = _first_server_out(store, clock)
    ((block_id, position, target, _),) = _queued(store)
    assert (block_id, position, target) == (block, 0, ids[6])
    (order,) = store.repair_orders(target, 10)
    assert order.crc == 7 and {s.position for s in order.sources} == {1, 2, 3, 4, 5}
    assert store.repair_orders(target, 10) == []  # sent once
    assert store.repair_done(block, 0, target, 100, 7)
    assert store.health_summary()["healthy"] == 1
    clock.now += 6  # past the GC delay: the old server returns and is told to delete its stale copy
    assert _beat(store, [ids[0]])[ids[0]] == [block]


def test_a_moved_chunk_recalls_the_layouts_leased_with_its_files_attributes(store, clock):
    """A client may keep a file's layout under a lease on its attributes (its parked reader's
    lease): a rebuilt chunk placed on another server changes that layout, so the repair counts
    as a change of the file's attributes and is recalled (simulator seed 3371: a layout kept
    across two repairs read the moved positions from their old servers, one collected since)."""
    from tectofs.wire.leases import ATTRS
    ids, block = _first_server_out(store, clock)
    (ino,) = [int(r[0]) for r in store._all("SELECT ino FROM blocks WHERE block_id = ?", (block,))]
    store.modified = set()
    try:
        assert store.repair_done(block, 0, ids[6], 100, 7)
        assert store.modified == {(ATTRS, ino)}
    finally:
        store.modified = None


def test_a_rebuilt_chunk_with_the_wrong_crc_is_never_placed(store, clock):
    ids, block = _first_server_out(store, clock)
    assert not store.repair_done(block, 0, ids[6], 100, 8)
    assert store._one("SELECT server_id FROM chunks WHERE block_id = ? AND position = 0", (block,))[0] == ids[0]
    clock.now += 1
    assert _beat(store, [ids[6]])[ids[6]] == [block]  # the wrong chunk is collected


def test_no_delete_order_for_a_chunk_a_block_places_on_that_server(store, clock):
    ids = _servers(store, 6)
    (block,) = _file(store, "f", [ids[0:6]])
    store._x("INSERT INTO gc_queue (server_id, block_id, due) VALUES (?, ?, ?)", (ids[2], block, 0.0))
    assert _beat(store, [ids[2]])[ids[2]] == []


def test_inventory_marks_missing_chunks_and_queues_orphans_after_a_grace(store, clock):
    ids = _servers(store, 6)
    a, b = _file(store, "f", [ids[0:6], ids[0:6]])
    clock.now += 1
    report = store.inventory_begin(ids[0])
    clock.now += 1
    (late,) = _file(store, "g", [ids[0:6]])  # committed after the report began: not judged by it
    found = store.inventory(ids[0], report, [b, 999_999], last=True, orphan_grace_s=100)
    assert found == messages.InventoryReply(missing=1, orphans=1)  # a is missing; 999999 belongs to nobody
    assert store._one("SELECT state FROM chunks WHERE block_id = ? AND server_id = ?", (a, ids[0]))[0] == 1
    assert store._one("SELECT state FROM chunks WHERE block_id = ? AND server_id = ?", (late, ids[0]))[0] == 0
    assert store.health_summary()["under_redundant"] == 1
    assert _beat(store, [ids[0]])[ids[0]] == []  # the orphan waits for its grace
    clock.now += 101
    assert _beat(store, [ids[0]])[ids[0]] == [999_999]
    # a corrupt chunk with no other server free is rebuilt in place
    _beat(store, ids)
    store.schedule_repairs(repair_after_s=600)
    assert [(p, t) for _, p, t, _ in _queued(store)] == [(0, ids[0])]


def test_a_draining_server_takes_no_new_chunks_and_its_chunks_are_copied_off(store, clock):
    ids = _servers(store, 7)
    (block,) = _file(store, "f", [ids[0:6]])
    assert store._one("SELECT COUNT(*) FROM gc_queue WHERE server_id = ? AND block_id = ?", (ids[6], block))[0]
    clock.now += 6
    assert _beat(store, ids)[ids[6]] == [block]  # the spare's copy is deleted first: then it can take a rebuild
    assert store.drain(str(ids[0])).chunks == 1
    f = store.create(["g"])
    for b in store.allocate(f.ino, 4, spares=0):
        assert ids[0] not in {s.server_id for s in b.servers}
    store.schedule_repairs()
    ((_, position, target, priority),) = _queued(store)
    assert (position, target) == (0, ids[6]) and priority >= 1000
    (order,) = store.repair_orders(target, 5)
    assert any(s.position == 0 and s.server_id == ids[0] for s in order.sources)  # copied, not rebuilt
    store.repair_done(block, 0, target, 100, 7)
    assert store.drain(str(ids[0])).chunks == 0


def test_an_occupied_target_has_a_stale_copy_deleted_not_a_placed_one(store, clock):
    ids, block = _first_server_out(store, clock)
    ((_, _, target, _),) = _queued(store)
    store.repair_failed(block, 0, target, occupied=True)  # holds a stale chunk of the block: deleted at once
    assert _queued(store) == [] and _beat(store, [target])[target] == [block]
    store.repair_failed(block, 3, ids[3], occupied=True)  # ids[3] holds a placed chunk: kept
    assert _beat(store, [ids[3]])[ids[3]] == []


def test_a_spare_copy_waiting_for_its_gc_delay_does_not_keep_a_server_out_of_rebuilds(store, clock):
    ids = _servers(store, 7)
    (block,) = _file(store, "f", [ids[0:6]])  # ids[6] was the spare: its copy is queued for deletion
    clock.now += 3  # within the 5 s GC delay
    store._x("UPDATE servers SET last_heartbeat = 0 WHERE server_id = ?", (ids[0],))
    _beat(store, ids[1:])
    store.schedule_repairs(repair_after_s=1)
    assert [(p, t) for _, p, t, _ in _queued(store)] == [(0, ids[6])]
    assert _beat(store, [ids[6]])[ids[6]] == []  # the delete would have removed the rebuilt chunk
    store.repair_failed(block, 0, ids[6], occupied=True)  # it held a stale chunk of another position
    store.schedule_repairs(repair_after_s=1)
    assert _queued(store) == []  # not there again until that copy is deleted
    assert _beat(store, [ids[6]])[ids[6]] == [block]
    store.schedule_repairs(repair_after_s=1)
    assert [(p, t) for _, p, t, _ in _queued(store)] == [(0, ids[6])]


def test_a_position_a_degraded_write_left_out_is_rebuilt(store, clock):
    ids = _servers(store, 6)
    (block,) = _file(store, "f", [ids[0:5]])  # rs(4,2) accepted with 5 chunks: position 5 never stored
    assert store.health_summary()["under_redundant"] == 1
    store.schedule_repairs(repair_after_s=600)  # nobody died: the missing position needs no waiting
    assert [(p, t) for _, p, t, _ in _queued(store)] == [(5, ids[5])]
    (order,) = store.repair_orders(ids[5], 5)
    assert order.crc is None and len(order.sources) == 5  # no crc was ever recorded for it
    assert store.repair_done(block, 5, ids[5], 100, 12345)
    assert store.health_summary()["healthy"] == 1
    assert store._one("SELECT missing FROM blocks WHERE block_id = ?", (block,))[0] == 0


def test_a_late_report_of_a_rebuild_is_placed_while_the_chunk_still_fits(store, clock):
    """The metadata service was away when the rebuild finished and withdrew the order: the
    chunk server's report, sent again later, still places the chunk (else a block whose other
    chunks fail meanwhile looks unreadable while it is not)."""
    ids, block = _first_server_out(store, clock)
    ((_, _, target, _),) = _queued(store)
    store.repair_orders(target, 10)
    clock.now += 200  # past the repair timeout: withdrawn
    _beat(store, ids[1:])
    store.schedule_repairs(repair_after_s=10, timeout_s=120, per_server_max=0)
    assert _queued(store) == []
    assert store.repair_done(block, 0, target, 100, 7)
    assert store.health_summary()["healthy"] == 1
    assert _beat(store, [target])[target] == []  # never deleted: it is placed


def test_a_late_report_is_an_orphan_once_another_server_rebuilt_the_chunk(store, clock):
    ids = _servers(store, 8)
    (block,) = _file(store, "f", [ids[0:6]])
    clock.now += 20
    _beat(store, ids[1:])
    store.schedule_repairs(repair_after_s=10, per_server_max=1)
    ((_, _, first, _),) = _queued(store)
    store.repair_orders(first, 10)
    clock.now += 200
    _beat(store, ids[1:])
    store._x("DELETE FROM repairs")  # withdrawn; a second rebuild elsewhere placed the chunk
    second = next(s for s in ids[6:] if s != first)
    store._x("INSERT INTO repairs (block_id, position, target, priority, created) VALUES (?, 0, ?, 0, ?)",
             (block, second, clock.now))
    assert store.repair_done(block, 0, second, 100, 7)
    assert not store.repair_done(block, 0, first, 100, 7)  # late, and the position is held: an orphan
    assert store._one("SELECT server_id FROM chunks WHERE block_id = ? AND position = 0", (block,))[0] == second
    clock.now += 1
    assert _beat(store, [first])[first] == [block]
    assert not store.repair_done(block, 1, ids[7], 100, 999)  # wrong crc: never placed
