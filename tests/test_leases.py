"""Metadata leases and recalls (server/meta/leases.py, client/lease_session.py).

The table alone, in process: grants, recalls answered or run out, no renewal while a recall is
outstanding, bounds. Then end to end on a real cluster: every kind of change made by one client
recalls what another client holds before the change's call returns."""

from __future__ import annotations

import ast
import asyncio
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from tectofs.errors import NoAttribute
from tectofs.server.meta.leases import LeaseTable
from tectofs.store import lease_keys
from tectofs.wire.leases import ATTRS, ENTRY, LISTING

A, B = b"a" * 16, b"b" * 16


def attrs(*inos):
    return [(ATTRS, ino) for ino in inos]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


@dataclass(frozen=True)
class St:
    """What the library cache needs of attributes (tectofs.client.Stat's fields it reads)."""

    ino: int
    kind: str = "file"
    nlink: int = 1
    xattrs: int | None = None

    @classmethod
    def of(cls, attrs) -> "St":
        return cls(attrs.ino)


def test_a_change_waits_for_the_holders_acknowledgement_and_not_for_its_own_session():
    async def scenario():
        table = LeaseTable(lease_s=5.0)
        await table.keepalive(A, 0, [], 0)
        await table.keepalive(B, 0, [], 0)
        table.grant(A, [*attrs(1, 7), (ENTRY, 1, "x")])
        table.grant(B, attrs(7))
        recall = asyncio.create_task(table.recall([*attrs(7), (ENTRY, 1, "x"), (LISTING, 1)], changed_by=B))
        await asyncio.sleep(0.05)
        assert not recall.done()  # A has not acknowledged
        reply = await table.keepalive(A, 0, [], 1.0)
        [sent] = reply.recalls
        assert (sent.inos, [(e.parent, e.name) for e in sent.entries], sent.listings) == ([7], [(1, "x")], [])
        assert not recall.done()
        await table.keepalive(A, 0, [sent.id], 0)
        await asyncio.wait_for(recall, 1)
        assert table.holders((ATTRS, 7)) == {B} and table.holders((ATTRS, 1)) == {A}  # A's 7 ended with the recall
        assert table.recalls_expired == 0
    run(scenario())


def test_a_restored_claim_lasts_while_its_returning_holder_still_has_creates_to_send():
    """A restarted service holds the claims its predecessor granted: past the grace period for
    a holder that came back in it, until that holder's second keepalive, or a later one if it
    says it still holds unsent creates (its sending failed and is tried again); a holder that
    did not come back loses them when the grace period ends."""
    async def scenario():
        clock = Clock()
        table = LeaseTable(lease_s=10.0, clock=clock)
        table.grace_until = clock.now + 5.0
        table.restore_claims([(100, 32, 7, A), (200, 32, 8, B)])
        await table.keepalive(A, 0, [], 0)  # A comes back (told the service restarted); B does not
        clock.now += 6.0  # past the grace period, within A's lease
        table.end_restored()  # (what the grace period's end runs)
        assert table.claim_covers(A, 7, [100, 131]) and not table.claim_covers(A, 7, [132])
        assert not table.claim_covers(B, 8, [200])
        await table.keepalive(A, 0, [], 0, unsent=True)  # its first sending failed
        assert table.claim_covers(A, 7, [105])
        await table.keepalive(A, 0, [], 0, unsent=True)
        assert table.claim_covers(A, 7, [105])
        await table.keepalive(A, 0, [], 0)  # all sent
        assert not table.claim_covers(A, 7, [105])
        table.restore_claims([(300, 32, 9, A)])
        clock.now += 11.0  # A's session ran out: its claims with it
        assert not table.claim_covers(A, 9, [300])
    run(scenario())


def test_a_silent_holder_costs_a_change_at_most_its_lease_and_is_then_forgotten():
    async def scenario():
        table = LeaseTable(lease_s=0.3)
        await table.keepalive(A, 0, [], 0)
        table.grant(A, attrs(9))
        started = time.monotonic()
        await table.recall(attrs(9))
        waited = time.monotonic() - started
        assert 0.2 < waited < 1.0
        assert table.recalls_expired == 1 and table.holders((ATTRS, 9)) == set()
        reply = await table.keepalive(A, 0, [], 0)  # it comes back: told to drop everything
        assert reply.restarted
    run(scenario())


def test_no_renewal_while_a_recall_is_outstanding():
    async def scenario():
        clock = Clock()
        table = LeaseTable(lease_s=10.0, clock=clock)
        await table.keepalive(A, 0, [], 0)
        table.grant(A, attrs(3))
        recall = asyncio.create_task(table.recall(attrs(3)))
        await asyncio.sleep(0)
        clock.now += 5
        reply = await table.keepalive(A, 0, [], 0)  # never acknowledges
        assert reply.recalls and not reply.renewed
        clock.now += 6  # past the expiry the recall started under
        table._expire_overdue()
        await asyncio.wait_for(recall, 1)
        assert (await table.keepalive(A, 0, [], 0)).restarted
    run(scenario())


def test_grants_to_unknown_sessions_are_not_recorded_and_holdings_are_bounded():
    async def scenario():
        table = LeaseTable(lease_s=5.0, holding_max=3)
        table.grant(A, attrs(1, 2))  # no keepalive yet: no session, no grant
        assert table.holders((ATTRS, 1)) == set()
        await table.keepalive(A, 0, [], 0)
        table.grant(A, attrs(1, 2, 3, 4, 5))
        assert {i for i in range(1, 6) if table.holders((ATTRS, i))} == {3, 4, 5}
        reply = await table.keepalive(A, 0, [], 0)
        assert [r.inos for r in reply.recalls] == [[1, 2]]  # the oldest, recalled at once
    run(scenario())


def test_a_session_id_is_bound_to_its_user():
    async def scenario():
        table = LeaseTable(lease_s=5.0)
        await table.keepalive(A, 1000, [], 0)
        with pytest.raises(PermissionError):
            await table.keepalive(A, 1001, [], 0)
        table.end(A, 1001)  # another user cannot end it either
        assert table.active
        table.end(A, 1000)
        assert not table.active
    run(scenario())


def test_every_statement_that_changes_a_name_or_an_inode_has_a_shape_lease_keys_reads():
    """``lease_keys.changed_by`` reads what a statement changed from its parameters, by the
    statement's shape: every statement of the store that changes ``names`` or ``inodes`` must
    have one of those shapes, or a change would not recall what clients hold."""
    store = Path(__file__).parent.parent / "tectofs" / "store"
    shapes = {lease_keys.INODE_UPDATE: r"WHERE ino = \?( AND [^?]*)?$", lease_keys.NAME_INSERT: r"VALUES \(\?, \?, \?\)$",
              lease_keys.NAME_DELETE: r"name = \?$", lease_keys.NAME_REPOINT: r"name = \?$"}
    found = 0
    for path in store.glob("*.py"):
        if path.name == "schema.py":  # migrations run before any lease exists
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_x"):
                continue
            sql = node.args[0]
            text = ast.unparse(sql)
            changes = re.search(r"(UPDATE|INSERT INTO|DELETE FROM) (inodes|names)\b", text)
            if not changes or (changes.group(1) in ("INSERT INTO", "DELETE FROM") and changes.group(2) == "inodes"):
                continue  # a new inode is nobody's yet; a removed one went with its last name
            assert isinstance(sql, ast.Constant), f"{path.name}: {text}: a statement changing {changes.group(2)} must be a literal"
            statement = str(sql.value)
            shape = next((s for s in shapes if statement.startswith(s)), None)
            assert shape is not None, f"{path.name}: {statement}: a shape lease_keys.changed_by does not know"
            assert re.search(shapes[shape], statement), f"{path.name}: {statement}"
            found += 1
    assert found >= 15


def test_what_statements_change_as_lease_keys():
    assert lease_keys.changed_by("UPDATE inodes SET mode = ? WHERE ino = ?", (0o600, 7)) == [(ATTRS, 7)]
    assert lease_keys.changed_by("UPDATE inodes SET atime = ? WHERE ino = ?", (1.0, 7)) == []
    assert lease_keys.changed_by("INSERT INTO names (parent, name, ino) VALUES (?, ?, ?)", (2, "x", 9)) == [
        (ENTRY, 2, "x"), (LISTING, 2)]
    assert lease_keys.changed_by("DELETE FROM names WHERE parent = ? AND name = ?", (2, "x")) == [
        (ENTRY, 2, "x"), (LISTING, 2)]
    assert lease_keys.changed_by("UPDATE names SET ino = ? WHERE parent = ? AND name = ?", (9, 2, "x")) == [
        (ENTRY, 2, "x"), (LISTING, 2)]
    assert lease_keys.changed_by("SELECT 1 FROM names", ()) == []


# ---------------------------------------------------------------------- end to end






async def _holder_and_changer(address):
    from tectofs.client.core import AsyncFileSystem
    holder, changer = AsyncFileSystem(address, leases=True), AsyncFileSystem(address)
    recalled: list = []
    assert holder.lease_session is not None

    async def on_recall(recall):
        if recall is not None:
            recalled.extend((ATTRS, ino) for ino in recall.inos)
            recalled.extend((ENTRY, e.parent, e.name) for e in recall.entries)
            recalled.extend((LISTING, ino) for ino in recall.listings)
    holder.lease_session.listeners.append(on_recall)
    for _ in range(100):
        if holder.lease_session.remaining():
            break
        await asyncio.sleep(0.02)
    assert holder.lease_session.remaining() > 0
    return holder, changer, recalled


@pytest.mark.slow
def test_every_kind_of_change_recalls_what_another_client_holds_before_it_returns(leased_cluster):
    async def scenario():
        holder, changer, recalled = await _holder_and_changer(leased_cluster)
        base = f"/recalls-{os.getpid()}"
        await changer.mkdir(base)
        await changer.write_bytes(f"{base}/f", b"x" * 10)
        directory = (await holder.stat(base)).ino

        async def check(what, change, expect):
            recalled.clear()
            for path in (base, f"{base}/f", f"{base}/absent"):  # names, attributes, an absent name
                try:
                    await holder.stat(path)
                except Exception:
                    pass
            inos = expect()
            await change()
            assert set(inos) <= set(recalled), (what, inos, recalled)

        file_ino = (await holder.stat(f"{base}/f")).ino
        await check("chmod", lambda: changer.setattr(f"{base}/f", mode=0o600), lambda: [(ATTRS, file_ino)])
        await check("write", lambda: changer.write_bytes(f"{base}/f", b"y" * 20), lambda: [(ATTRS, file_ino)])
        file_ino = (await changer.stat(f"{base}/f")).ino
        await check("setxattr", lambda: changer.setxattr(f"{base}/f", "user.k", b"v"), lambda: [(ATTRS, file_ino)])
        await check("create", lambda: changer.write_bytes(f"{base}/absent", b""),
                    lambda: [(ENTRY, directory, "absent"), (ATTRS, directory)])
        await check("rename", lambda: changer.rename(f"{base}/absent", f"{base}/moved"),
                    lambda: [(ENTRY, directory, "absent"), (ATTRS, directory)])
        await check("unlink", lambda: changer.remove(f"{base}/moved"), lambda: [(ATTRS, directory)])
        await check("truncate", lambda: changer.truncate(f"{base}/f", 3), lambda: [(ATTRS, file_ino)])
        await holder.scandir(base)
        await check("create in a listed directory", lambda: changer.write_bytes(f"{base}/new", b""),
                    lambda: [(LISTING, directory)])
        # Walking through a directory leases the names walked, not the directory: creates of
        # other names in it recall nothing from a client that only walked through.
        await changer.mkdir(f"{base}/sub/deep", parents=True)
        recalled.clear()
        await holder.stat(f"{base}/sub/deep")
        await changer.write_bytes(f"{base}/sub/other", b"")
        await changer.write_bytes(f"{base}/other", b"")
        assert recalled == []
        await changer.rename(f"{base}/sub", f"{base}/sub2")  # but renaming one walked recalls it
        assert (ENTRY, directory, "sub") in recalled
        await holder.close()
        started = time.monotonic()
        await changer.setattr(f"{base}/f", mode=0o644)  # the holder ended its session: no wait
        assert time.monotonic() - started < 1.0
        await changer.close()
    run(scenario())


@pytest.mark.slow
def test_a_client_that_stopped_answering_holds_a_change_back_at_most_its_lease(leased_cluster):
    async def scenario():
        holder, changer, recalled = await _holder_and_changer(leased_cluster)
        path = f"/silent-{os.getpid()}"
        await changer.write_bytes(path, b"1")
        await holder.stat(path)
        holder.lease_session._task.cancel()  # the keepalives stop, as when its host hangs
        started = time.monotonic()
        await changer.setattr(path, mode=0o600)
        waited = time.monotonic() - started
        assert 0.5 < waited < 2.0 + 1.0, waited  # at most its lease (2 s), counted from its last keepalive
        await changer.close()
        await holder.close()
    run(scenario())


@pytest.mark.slow
def test_a_change_through_one_service_recalls_what_clients_of_another_hold(make_cluster, postgres_server):
    """Two metadata services over one PostgreSQL store: the recall crosses from the service
    that made the change to the one holding the client's session (LISTEN/NOTIFY), before the
    change's call returns; a peer that is killed holds changes back at most 2 leases."""
    from tectofs.client.core import AsyncFileSystem
    from tectofs.testing.postgres import new_database

    c = make_cluster(store=new_database(postgres_server), meta_args=["--lease", "2"])
    address_b, process_b = c.start_extra_meta()
    try:
        async def scenario():
            holder = AsyncFileSystem(address_b, c.credential_file, leases=True)
            changer = AsyncFileSystem(c.address, c.credential_file)
            recalled: list = []

            async def on_recall(recall):
                if recall is not None:
                    recalled.extend((ATTRS, ino) for ino in recall.inos)
                    recalled.extend((ENTRY, e.parent, e.name) for e in recall.entries)
            assert holder.lease_session is not None
            holder.lease_session.listeners.append(on_recall)
            deadline = time.monotonic() + 10
            while not holder.lease_session.remaining():  # service b renews once its peers know it
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            await changer.write_bytes("/peer-f", b"1")
            ino = (await holder.stat("/peer-f")).ino
            with pytest.raises(FileNotFoundError):
                await holder.stat("/peer-absent")
            await changer.setattr("/peer-f", mode=0o600)
            assert (ATTRS, ino) in recalled
            await changer.write_bytes("/peer-absent", b"")
            assert (ENTRY, 1, "peer-absent") in recalled
            await holder.stat("/peer-f")
            process_b.kill()  # the holder's service dies: its sessions die with it
            process_b.wait(timeout=10)
            started = time.monotonic()
            await changer.setattr("/peer-f", mode=0o644)
            assert time.monotonic() - started < 2 * 2 + 1.5
            await holder.close()
            await changer.close()
        run(scenario())
    finally:
        if process_b.poll() is None:
            process_b.terminate()
            process_b.wait(timeout=20)


@pytest.mark.slow
def test_a_leasing_clients_cache_answers_without_calls_and_sees_every_change_at_its_next_call(leased_cluster):
    """The library's cache (client/metadata_cache.py): repeated stats, absent names and extended
    attributes cost no call while leases are held; a change by another client, or by itself, is
    seen at its next call."""
    async def scenario():
        holder, changer, _ = await _holder_and_changer(leased_cluster)
        cache = holder.metadata_cache
        assert cache is not None
        base = f"/cached-{os.getpid()}"
        await changer.mkdir(f"{base}/d", parents=True)
        await changer.write_bytes(f"{base}/d/f", b"1234")
        await changer.setxattr(f"{base}/d/f", "user.k", b"v1")

        first = await holder.stat(f"{base}/d/f")
        hits = cache.hits
        for _ in range(50):
            assert (await holder.stat(f"{base}/d/f")).mode == first.mode
        assert cache.hits == hits + 50  # no call
        with pytest.raises(FileNotFoundError):
            await holder.stat(f"{base}/d/absent")
        with pytest.raises(FileNotFoundError):
            await holder.stat(f"{base}/d/absent")
        assert await holder.getxattr(f"{base}/d/f", "user.k") == b"v1"
        assert await holder.getxattr(f"{base}/d/f", "user.k") == b"v1"
        assert cache.hits >= hits + 52
        # A file without extended attributes: the kernel's security.* probes cost no call.
        await changer.write_bytes(f"{base}/d/plain", b"x")
        assert (await holder.stat(f"{base}/d/plain")).xattrs == 0
        hits = cache.hits
        for _ in range(3):
            with pytest.raises(NoAttribute):
                await holder.getxattr(f"{base}/d/plain", "security.capability")
            assert await holder.listxattr(f"{base}/d/plain") == []
        assert cache.hits == hits + 6
        await changer.setxattr(f"{base}/d/plain", "security.label", b"l")
        assert await holder.getxattr(f"{base}/d/plain", "security.label") == b"l"
        assert await holder.listxattr(f"{base}/d/plain") == ["security.label"]

        await changer.setattr(f"{base}/d/f", mode=0o600)
        assert (await holder.stat(f"{base}/d/f")).mode & 0o777 == 0o600
        await changer.write_bytes(f"{base}/d/absent", b"now")
        assert (await holder.stat(f"{base}/d/absent")).size == 3
        await changer.setxattr(f"{base}/d/f", "user.k", b"v2")
        assert await holder.getxattr(f"{base}/d/f", "user.k") == b"v2"
        await changer.write_bytes(f"{base}/d/f", b"123456789")
        assert (await holder.stat(f"{base}/d/f")).size == 9
        await holder.stat(f"{base}/d/f")
        await changer.rename(f"{base}/d", f"{base}/e")
        with pytest.raises(FileNotFoundError):
            await holder.stat(f"{base}/d/f")
        assert (await holder.stat(f"{base}/e/f")).size == 9
        await changer.remove(f"{base}/e/f")
        with pytest.raises(FileNotFoundError):
            await holder.stat(f"{base}/e/f")

        # Its own changes: seen at once, though the service recalls nothing from it.
        await holder.write_bytes(f"{base}/mine", b"a")
        assert (await holder.stat(f"{base}/mine")).size == 1
        await holder.write_bytes(f"{base}/mine", b"abc")
        assert (await holder.stat(f"{base}/mine")).size == 3
        await holder.setattr(f"{base}/mine", mode=0o640)
        assert (await holder.stat(f"{base}/mine")).mode & 0o777 == 0o640
        await holder.remove(f"{base}/mine")
        with pytest.raises(FileNotFoundError):
            await holder.stat(f"{base}/mine")
        await holder.close()
        await changer.close()
    run(scenario())


def test_every_metadata_operation_is_known_to_change_or_not():
    """A cache over the client forgets what its own changes made stale: an operation missing
    from both lists would be one whose changes it keeps serving."""
    from tectofs.client.metadata import CHANGING, READING
    from tectofs.wire import messages

    assert CHANGING | READING == set(messages.META_OPERATIONS)
    assert not CHANGING & READING


def test_a_peer_notification_carries_every_key_in_parts_postgresql_accepts():
    import json

    from tectofs.server.meta.lease_peers import PART_BYTES_MAX, _parts

    keys = [(ENTRY, 7, "é" * 255), *((ATTRS, i) for i in range(500)), (LISTING, 7)]
    parts = _parts(keys, "ab")
    assert len(parts) > 1 and all(len(json.dumps(p["keys"])) <= PART_BYTES_MAX for p in parts)
    assert [tuple(k) for p in parts for k in p["keys"]] == keys and {p["by"] for p in parts} == {"ab"}
    assert _parts([], "ab") == [{"by": "ab", "keys": []}]


def test_a_malformed_recall_on_the_channel_is_ignored_and_nothing_is_sent():
    from tectofs.server.meta.lease_peers import LeasePeers

    sent: list = []

    async def scenario():
        peers = LeasePeers("postgresql://unused", LeaseTable(lease_s=5.0))
        peers.table.renewing = True

        async def notify(message, channel="tectofs_leases"):
            sent.append((channel, message))
        peers._notify = notify  # type: ignore[method-assign]
        for bad in ({"from": "not-an-id", "changes": []},
                    {"from": "0123456789abcdef", "changes": [{"change": "c", "keys": [], "by": "zz"}]},
                    {"from": "0123456789abcdef", "changes": [{"keys": []}]}):
            await peers._recall_for_peer(bad)
        assert sent == [] and peers.table.renewing  # ignored: still renewing
        await peers._recall_for_peer({"from": "0123456789abcdef",
                                      "changes": [{"change": "c1", "keys": [["a", 5]], "by": "ab"}]})
        assert sent == [("tectofs_leases_0123456789abcdef",
                         {"kind": "ack", "to": "0123456789abcdef", "from": peers.id, "changes": ["c1"]})]
    run(scenario())


def test_the_store_counts_an_inodes_extended_attributes_and_counts_them_in_an_older_store(tmp_path):
    import sqlite3

    from tectofs.store import SqlStore
    from tectofs.store.dialect import SqliteDialect

    db = tmp_path / "meta.db"
    store = SqlStore(SqliteDialect(str(db)))
    store.tx_begin()
    ino = store.create(["f"]).ino
    assert store.lookup(["f"]).xattrs == 0
    store.setxattr(["f"], "user.a", b"1")
    store.setxattr(["f"], "user.a", b"2")  # replaced: still one
    store.setxattr(["f"], "security.b", b"3")
    assert store.lookup(["f"]).xattrs == 2
    store.removexattr(["f"], "user.a")
    assert store.lookup(["f"]).xattrs == 1
    store.tx_commit()
    store.conn.close()
    with sqlite3.connect(db) as conn:  # a store made before the count: the column is added and filled
        conn.execute("ALTER TABLE inodes DROP COLUMN xattrs")
    store = SqlStore(SqliteDialect(str(db)))
    store.tx_begin()
    assert store.lookup(["f"]).xattrs == 1 and store.lookup(["f"]).ino == ino
    assert store.lookup([]).xattrs == 0
    store.tx_commit()


def test_the_library_cache_keys_what_it_learned_and_forgets_what_changes_could_touch():
    from tectofs.client.metadata_cache import ABSENT, MISS, MetadataCache
    from tectofs.wire.leases import Entry, Recall

    cache = MetadataCache[St](entries_max=100)
    cache.learned("/a/b/f", [1, 10, 11], St(20))
    assert cache.lookup("/a/b/f") == St(20)
    assert cache.lookup("/a/b/g") is MISS
    cache.learned_absent("/a/b/g")
    assert cache.lookup("/a/b/g") is ABSENT and cache.lookup("/a/b/g/h") is ABSENT
    cache.forget(Recall(id=1, entries=[Entry(parent=10, name="b")]))  # a rename of b: everything below misses
    assert cache.lookup("/a/b/f") is MISS
    cache.learned("/a/b/f", [1, 10, 11], St(20))
    cache.forget(Recall(id=2, inos=[20]))  # its attributes changed: the name stays, the attributes go
    assert cache.lookup("/a/b/f") is MISS
    # A hard link: its own change through a name this cache never saw drops linked inodes' attributes.
    cache.learned("/a/b/f", [1, 10, 11], St(20, nlink=2))
    cache.learned("/a/b/plain", [1, 10, 11], St(21))
    cache.forget_path("/a/b/unseen-link")
    assert cache.lookup("/a/b/f") is MISS and cache.lookup("/a/b/plain") == St(21)
    # A change below a directory this cache cannot resolve: all goes.
    cache.forget_path("/elsewhere/x/y")
    assert cache.lookup("/a/b/plain") is MISS
    # Bounded: least recently used names go first.
    small = MetadataCache[St](entries_max=3)
    for i in range(5):
        small.learned(f"/f{i}", [1], St(100 + i))
    assert small.lookup("/f0") is MISS and small.lookup("/f4") == St(104)
    # Extended attributes: attributes that say "none" answer security.* probes and listings;
    # user.* (whose permissions the service checks) and an unknown count still ask.
    cache.learned("/x0", [1], St(30, xattrs=0))
    cache.learned("/x1", [1], St(31, xattrs=1))
    cache.learned("/xu", [1], St(32))
    assert cache.xattr("/x0", "security.selinux") is None and cache.xattr_names("/x0") == []
    assert cache.xattr("/x0", "user.a") is MISS
    assert cache.xattr("/x1", "security.selinux") is MISS and cache.xattr_names("/x1") is MISS
    assert cache.xattr("/xu", "security.capability") is MISS and cache.xattr_names("/xu") is MISS
    cache.forget_path("/x0")  # an own setxattr: the count is stale
    assert cache.xattr("/x0", "security.selinux") is MISS


def test_a_larger_files_layout_is_kept_with_the_reader_lease_its_last_handle_parked():
    """``MetadataCache.park_reader`` / ``take_layout``: a layout that is not inline serves an
    open only with a parked lease, taken by one open at a time while it has half its life left;
    whatever drops the layout (a recall, an own change, eviction, the session's loss) ends the
    lease it holds, once."""
    from tectofs.client.metadata_cache import MISS, CachedLayout, MetadataCache
    from tectofs.wire import messages
    from tectofs.wire.leases import Recall

    def layout(ino: int, inline: bool = False) -> messages.LayoutSegment:
        block = messages.Block(idx=0, block_id=0 if inline else ino, policy="rs(4,2)", length=3, valid=3, chunks=[],
                               inline=messages.InlineData(data=b"abc", crc=0) if inline else None)
        attrs = messages.Attrs(ino=ino, kind="file", mode=0o100644, uid=0, gid=0, size=3, atime=0, mtime=0, ctime=0,
                               nlink=1, policy="rs(4,2)", block_size=1 << 20, parent=1, handle=b"h%d" % ino)
        return messages.LayoutSegment(attrs=attrs, blocks=[block])

    ended: list[tuple[int, int]] = []
    cache = MetadataCache[St](entries_max=100, make=St.of, reader_lease_s=60.0,
                              end_reader=lambda ino, reader, handle, uid: ended.append((ino, reader)))
    cache.learned("/big", [1], St(20))
    big = layout(20)
    cache.learned_layout("/big", None, big)
    assert cache.take_layout("/big", None, now=0.0) is MISS  # kept, but no lease to open with yet
    assert cache.park_reader(big, None, reader=7, since=0.0)
    assert not cache.park_reader(big, None, reader=8, since=0.0)  # one lease parked at a time
    assert cache.take_layout("/big", 1000, now=1.0) is MISS  # another user's open asks
    assert cache.take_layout("/big", None, now=1.0) == CachedLayout(big, 7, 0.0)
    assert cache.take_layout("/big", None, now=1.0) is MISS  # taken: a second open at once asks
    assert cache.park_reader(big, None, reader=7, since=10.0)
    assert cache.take_layout("/big", None, now=40.5) is MISS  # less than half its life left: let it lapse
    assert ended == []
    # A small file's layout serves opens with no lease, and parks none.
    cache.learned("/small", [1], St(21))
    small = layout(21, inline=True)
    cache.learned_layout("/small", None, small)
    assert cache.take_layout("/small", None, now=0.0) == CachedLayout(small)
    assert not cache.park_reader(small, None, reader=9, since=0.0)
    # A layout that was replaced (a recall and a new open) takes no lease from the old handle.
    cache.learned_layout("/big", None, big)
    assert cache.park_reader(big, None, reader=11, since=50.0)
    newer = layout(20)
    cache.learned_layout("/big", None, newer)  # replacing it ends what was parked under the old one
    assert ended == [(20, 11)] and not cache.park_reader(big, None, reader=12, since=50.0)
    # Every way a layout goes ends its parked lease.
    assert cache.park_reader(newer, None, reader=13, since=50.0)
    cache.forget(Recall(id=1, inos=[20]))
    assert ended[-1] == (20, 13) and cache.take_layout("/big", None, now=50.0) is MISS
    cache.learned("/big", [1], St(20))
    cache.learned_layout("/big", None, big)
    assert cache.park_reader(big, None, reader=14, since=50.0)
    cache.forget_path("/big")  # an own unlink or rename
    assert ended[-1] == (20, 14)
    cache.learned("/big", [1], St(20))
    cache.learned_layout("/big", None, big)
    assert cache.park_reader(big, None, reader=15, since=50.0)
    cache.forget(None)  # the session is lost
    assert ended[-1] == (20, 15) and len(ended) == 4
    # Bounded: the oldest layout goes first, its lease ended.
    cache.chunk_layouts_max = 2
    for ino in (30, 31, 32):
        cache.learned(f"/f{ino}", [1], St(ino))
        kept = layout(ino)
        cache.learned_layout(f"/f{ino}", None, kept)
        assert cache.park_reader(kept, None, reader=ino, since=0.0)
    assert ended[-1] == (30, 30) and cache.take_layout("/f30", None, now=1.0) is MISS
    assert isinstance(cache.take_layout("/f32", None, now=1.0), CachedLayout)


def test_a_larger_file_opened_again_takes_the_lease_its_last_reader_left_and_changes_end_it(leased_cluster):
    """A file kept in chunks, read again by a leasing client, opens with no call (the reader's
    lease of the handle that closed last); another client's write is read at the next open; its
    unlink frees the file at once (the parked lease is ended), while a handle that took such a
    lease keeps reading the version it opened; this client's own unlink frees it too."""
    from tectofs.errors import StaleFile
    from tectofs.wire import messages

    async def scenario():
        holder, changer, _ = await _holder_and_changer(leased_cluster)
        base = f"/parked-{os.getpid()}"
        await changer.mkdir(base)
        first, second = os.urandom(300_000), os.urandom(200_000)
        await changer.write_bytes(f"{base}/big", first)
        calls: list[str] = []
        layout_call = holder.metadata.layout

        async def counted(request):
            calls.append(request.path)
            return await layout_call(request)
        holder.metadata.layout = counted  # type: ignore[method-assign]

        async def freed(ino: int, handle: bytes) -> bool:
            await holder.lease_endings.flush()
            await changer.lease_endings.flush()
            try:
                await changer.metadata.getattr(messages.InoRequest(ino=ino, handle=handle))
            except StaleFile:
                return True
            return False

        await holder.stat(f"{base}/big")  # (as the kernel looks a name up before it opens it)
        assert await holder.read_bytes(f"{base}/big") == first
        assert len(calls) == 1
        for _ in range(3):
            assert await holder.read_bytes(f"{base}/big") == first
        assert len(calls) == 1  # opened with the parked lease, no call

        await changer.write_bytes(f"{base}/big", second)  # recalls the layout: the parked lease ends
        await holder.stat(f"{base}/big")
        assert await holder.read_bytes(f"{base}/big") == second
        assert len(calls) == 2
        opened = await holder.open(f"{base}/big", "rb")
        assert len(calls) == 2  # took the lease parked by the read before
        await changer.remove(f"{base}/big")
        assert await opened.read(0, len(second)) == second  # the version it opened, kept by its lease
        assert not await freed(opened.ino, opened.handle)
        await opened.close()  # the layout went with the recall: the lease is ended, not parked
        assert await freed(opened.ino, opened.handle)

        await changer.write_bytes(f"{base}/other", first)
        ino = (await holder.stat(f"{base}/other")).ino
        assert await holder.read_bytes(f"{base}/other") == first
        handle = (await changer.open(f"{base}/other", "rb"))
        await handle.close()
        await changer.remove(f"{base}/other")  # another client's unlink: the parked lease is ended
        assert await freed(ino, handle.handle)

        await changer.write_bytes(f"{base}/mine", first)
        await holder.stat(f"{base}/mine")
        assert await holder.read_bytes(f"{base}/mine") == first
        mine = await changer.open(f"{base}/mine", "rb")
        await mine.close()
        await holder.remove(f"{base}/mine")  # its own unlink ends its parked lease as well
        assert await freed(mine.ino, mine.handle)

        # What this client wrote itself: its writer parks its lease with the layout its commit
        # answered, so reading it back costs no call; another client's unlink frees it at once.
        written = await holder.open(f"{base}/written", "wb")
        await written.write(0, second)
        await written.close()
        before = len(calls)
        for _ in range(2):
            assert await holder.read_bytes(f"{base}/written") == second
        assert len(calls) == before
        await changer.remove(f"{base}/written")
        assert await freed(written.ino, written.handle)
        await holder.close()
        await changer.close()
    run(scenario())


def test_own_changes_keep_a_cached_listing_in_step_unless_a_recall_crossed_them():
    """A listing held under a lease is changed by this client's own creates, unlinks, commits and
    chmods as their replies say (so ``ls`` after writing into a directory costs no call), with
    the directory's new attributes in its parent's listing; a change across which a recall may
    have come (``fresh_for=False``), or whose reply does not say, drops what it touched."""
    from tectofs.client.core import Stat
    from tectofs.client.metadata_cache import MISS, MetadataCache
    from tectofs.wire import messages

    def attrs(ino: int, kind: Literal["file", "dir"] = "file", size: int = 0, mtime: float = 1.0,
              parent: int = 1) -> messages.Attrs:
        return messages.Attrs(ino=ino, kind=kind, mode=(0o100644 if kind == "file" else 0o040755), uid=0, gid=0,
                              size=size, atime=mtime, mtime=mtime, ctime=mtime, nlink=1 if kind == "file" else 2,
                              policy="rs(4,2)", block_size=1 << 20, parent=parent, xattrs=0)

    cache = MetadataCache[Stat](entries_max=1000, make=Stat.from_attrs)
    cache.learned("/d", [1], Stat.from_attrs(attrs(10, "dir")))
    cache.learned_listing("/", [("d", Stat.from_attrs(attrs(10, "dir")))])
    cache.learned_listing("/d", [("b", Stat.from_attrs(attrs(12))), ("a", Stat.from_attrs(attrs(11)))])

    def listed(path: str) -> list[tuple[str, int, int, float]] | None:
        found = cache.listing(path)
        return None if found is MISS else [(n, st.ino, st.size, st.mtime) for n, st in found]  # type: ignore[union-attr]

    assert listed("/d") == [("a", 11, 0, 1.0), ("b", 12, 0, 1.0)]  # sorted by name
    created = messages.CreateReply(attrs=attrs(13, parent=10), created=True, directory=attrs(10, "dir", mtime=2.0))
    cache.changed_by_self("create", messages.CreateRequest(path="/d/ab"), created, fresh_for=None)
    assert listed("/d") == [("a", 11, 0, 1.0), ("ab", 13, 0, 1.0), ("b", 12, 0, 1.0)]
    assert listed("/") == [("d", 10, 0, 2.0)]  # the directory's new mtime, in its parent's listing
    committed = messages.LayoutSegment(attrs=attrs(13, size=5, mtime=3.0, parent=10), blocks=[])
    cache.changed_by_self("commit", messages.CommitRequest(ino=13, size=5), committed, fresh_for=None)
    assert listed("/d") == [("a", 11, 0, 1.0), ("ab", 13, 5, 3.0), ("b", 12, 0, 1.0)]
    assert cache.lookup("/d/ab").size == 5  # type: ignore[union-attr]
    chmodded = messages.AttrsReply(attrs=attrs(11, mtime=4.0, parent=10))
    cache.changed_by_self("setattr", messages.SetattrRequest(path="/d/a", mode=0o600), chmodded, fresh_for=None)
    assert listed("/d") == [("a", 11, 0, 4.0), ("ab", 13, 5, 3.0), ("b", 12, 0, 1.0)]
    unlinked = messages.UnlinkReply(directory=attrs(10, "dir", mtime=5.0))
    cache.changed_by_self("unlink", messages.UnlinkRequest(path="/d/b"), unlinked, fresh_for=None)
    assert listed("/d") == [("a", 11, 0, 4.0), ("ab", 13, 5, 3.0)] and listed("/") == [("d", 10, 0, 5.0)]
    made = messages.AttrsReply(attrs=attrs(14, "dir", parent=10))
    cache.changed_by_self("mkdir", messages.MkdirRequest(path="/d/sub"), made, fresh_for=None)
    assert listed("/d/sub") == [] and listed("/") is None  # (mkdir's reply does not say /d's new mtime)
    assert [n for n, *_ in listed("/d") or []] == ["a", "ab", "sub"]

    # A recall may have crossed the call: the listing it changed goes, and the lookup misses.
    cache.changed_by_self("create", messages.CreateRequest(path="/d/c"),
                          messages.CreateReply(attrs=attrs(15, parent=10), directory=attrs(10, "dir", mtime=6.0)),
                          fresh_for=False)
    assert listed("/d") is None and cache.lookup("/d/c").ino == 15  # type: ignore[union-attr]
    # A failed (or unseen) change forgets too.
    cache.learned_listing("/d", [("a", Stat.from_attrs(attrs(11)))])
    cache.changed_by_self("create", messages.CreateRequest(path="/d/z"), None, fresh_for=None)
    assert listed("/d") is None


@pytest.mark.slow
def test_a_small_file_read_again_opens_from_the_cache_and_an_own_unlink_keeps_it_alive_while_open(leased_cluster):
    """``MetadataCache.layout``: a small file's second read-only open costs no call; another
    client's write is read at the next open; this client's own unlink of a file it has open
    that way leaves the inode alive (nlink 0) until the handle closes (``client/cached_opens.py``)."""
    from tectofs.client.metadata_cache import MISS
    from tectofs.errors import StaleFile
    from tectofs.wire import messages

    async def scenario():
        holder, changer, _ = await _holder_and_changer(leased_cluster)
        cache = holder.metadata_cache
        assert cache is not None
        base = f"/opens-{os.getpid()}"
        await changer.mkdir(base)
        await changer.write_bytes(f"{base}/small", b"first")
        await holder.stat(f"{base}/small")
        assert await holder.read_bytes(f"{base}/small") == b"first"  # learns the layout
        hits = cache.hits
        assert await holder.read_bytes(f"{base}/small") == b"first"
        assert cache.hits > hits  # from the cache
        await changer.write_bytes(f"{base}/small", b"second, longer")
        assert await holder.read_bytes(f"{base}/small") == b"second, longer"

        # What this client commits itself is kept too (the commit's answer is leased to it).
        writer = await holder.open(f"{base}/mine", "wb")
        await writer.write(0, b"written here")
        await writer.close()
        assert isinstance(cache.layout(f"{base}/mine", None), messages.LayoutSegment)
        assert await holder.read_bytes(f"{base}/mine") == b"written here"
        await changer.write_bytes(f"{base}/mine", b"then there")
        assert cache.layout(f"{base}/mine", None) is MISS
        assert await holder.read_bytes(f"{base}/mine") == b"then there"

        handle = await holder.open(f"{base}/small", "rb")
        assert handle in list(holder.cached_opens._open.get(handle.ino, ()))
        await holder.remove(f"{base}/small")
        assert await handle.read(0, 100) == b"second, longer"
        alive = await holder.metadata.getattr(messages.InoRequest(ino=handle.ino, handle=handle.handle))
        assert alive.attrs.nlink == 0
        await handle.close()
        await holder.lease_endings.flush()
        await changer.lease_endings.flush()  # (its first write went through a handle too)
        with pytest.raises(StaleFile):
            await holder.metadata.getattr(messages.InoRequest(ino=handle.ino, handle=handle.handle))
        await holder.close()
        await changer.close()
    run(scenario())
