"""The metadata store alone: namespace rules, block maps, placement and group commit.

Written against the store interface so that another dialect (PostgreSQL) can run the same
suite: subclass ``StoreContract`` and override ``make_store``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

import msgspec
import pytest

from tectofs import checksum, errors
from tectofs.store import SqlStore, StoreRunner
from tectofs.store.dialect import PostgresDialect, SqliteDialect
from tectofs.wire.messages import Attrs, InlineData, WrittenBlock


def written(blocks: list[dict]) -> list[WrittenBlock]:
    """Blocks as a writer commits them, from plain dicts."""
    return msgspec.convert(blocks, list[WrittenBlock])


class StoreContract:
    def make_store(self, tmp_path) -> SqlStore:
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path):
        s = self.make_store(tmp_path)
        yield s
        s.close()

    def _servers(self, store, n, capacity=1 << 40):
        return [store.register_server(f"uuid-{i}", f"127.0.0.1:{1000 + i}", capacity, 0) for i in range(n)]

    def test_namespace_errors(self, store):
        store.mkdir(["a"])
        store.create(["a", "f"])
        with pytest.raises(errors.AlreadyExists):
            store.mkdir(["a"])
        with pytest.raises(errors.AlreadyExists):
            store.create(["a", "f"], exclusive=True)
        with pytest.raises(errors.NotADirectory):
            store.create(["a", "f", "g"])
        with pytest.raises(errors.NotFound):
            store.lookup(["nope"])
        with pytest.raises(errors.DirectoryNotEmpty):
            store.rmdir(["a"])
        with pytest.raises(errors.IsADirectory):
            store.unlink(["a"])
        with pytest.raises(errors.InvalidPath):
            store.mkdir(["a", ".."])

    def test_a_failed_creator_takes_back_its_file_only_if_nobody_else_opened_it(self, store):
        """A writer whose create made a file and then failed removes the file (empty, still that
        inode) — unless another handle opened it meanwhile, which may yet commit to it (an
        acknowledged write must not land in a file removed under it: simulator seed 546912499)."""
        created = store.create_file(["f"], reader=1).attrs
        store.unlink(["f"], created.ino, only_if_empty=True, reader=1)
        with pytest.raises(errors.NotFound):
            store.lookup(["f"])
        created = store.create_file(["g"], reader=1).attrs
        assert store.create_file(["g"], reader=2).attrs.ino == created.ino  # a second writer opens it
        store.unlink(["g"], created.ino, only_if_empty=True, reader=1)
        assert store.lookup(["g"]).ino == created.ino  # still there for the second writer
        store.release(created.ino, 2)
        store.unlink(["g"], created.ino, only_if_empty=True, reader=1)
        with pytest.raises(errors.NotFound):
            store.lookup(["g"])

    def test_what_a_create_answers_is_what_it_stored(self, store):
        """What a create answers (the new inode's attributes, and the directory's after it) is
        exactly what a later read finds: a guard for any change that builds those answers
        instead of reading them back."""
        store.mkdir(["d"], mode=0o750, uid=5, gid=6, policy="rep(2)", block_size=1 << 20)
        made = [
            store.mkdir(["d", "sub"], mode=0o700, uid=7, gid=8),
            store.create(["d", "f"], mode=0o640, uid=7, gid=8),
            store.symlink(["d", "l"], "/some/where", uid=7, gid=8),
            store.mknod(["d", "p"], 0o010644, uid=7, gid=8),
            store.mknod(["d", "c"], 0o020600, rdev=0x0501),
        ]
        for attrs in made:
            assert attrs == store.getattr_ino(attrs.ino)
        assert made[0].policy == "rep(2)" and made[1].block_size == 1 << 20
        before = store.lookup(["d"])
        made_now = store.create_file(["d", "g"], mode=0o600, reader=99)
        assert made_now.created and made_now.attrs == store.lookup(["d", "g"])
        assert made_now.directory == store.lookup(["d"]) and made_now.directory_ctime_before == before.ctime
        again = store.create_file(["d", "g"])  # exists: nothing changes
        assert not again.created and again.directory == store.lookup(["d"])

    def test_rename_rules(self, store):
        store.mkdir(["d"])
        store.mkdir(["d", "e"])
        store.create(["f"])
        store.create(["g"])
        with pytest.raises(errors.InvalidArgument):
            store.rename(["d"], ["d", "e", "x"])
        with pytest.raises(errors.IsADirectory):
            store.rename(["f"], ["d"])
        with pytest.raises(errors.NotADirectory):
            store.rename(["d"], ["f"])
        store.mkdir(["empty"])
        with pytest.raises(errors.DirectoryNotEmpty):
            store.rename(["empty"], ["d"])
        g = store.lookup(["g"])
        store.rename(["g"], ["f"])  # replace a file
        assert store.lookup(["f"]).ino == g.ino
        with pytest.raises(errors.NotFound):
            store.lookup(["g"])
        store.mkdir(["empty2"])
        store.rename(["d", "e"], ["empty2"])  # replace an empty directory
        assert store.lookup(["empty2"]).kind == "dir"
        assert store.lookup([]).nlink == 2 + 3  # ".", "..", d, empty, empty2

    def test_exchange_swaps_non_empty_directories(self, store):
        store.mkdir(["old"])
        store.create(["old", "a"])
        store.mkdir(["x"])
        store.mkdir(["x", "new"])
        store.create(["x", "new", "b"])
        store.exchange(["old"], ["x", "new"])
        assert [e.name for e in store.readdir(["old"]).entries] == ["b"]
        assert [e.name for e in store.readdir(["x", "new"]).entries] == ["a"]
        assert store.lookup(["old"]).parent == 1
        with pytest.raises(errors.InvalidArgument):
            store.exchange(["x"], ["x", "new", "a"])  # x would move into its own subtree
        with pytest.raises(errors.NotFound):
            store.exchange(["old"], ["missing"])

    def test_policy_inheritance(self, store):
        store.mkdir(["rep"], policy="rep(3)", block_size=1 << 20)
        store.mkdir(["rep", "sub"])
        attrs = store.create(["rep", "sub", "f"])
        assert attrs.policy == "rep(3)" and attrs.block_size == 1 << 20
        with pytest.raises(errors.InvalidArgument):
            store.mkdir(["bad"], policy="raid5")

    def test_allocation_spreads_and_commit_publishes(self, store):
        ids = self._servers(store, 8)
        f = store.create(["f"])
        blocks = store.allocate(f.ino, 4)
        assert len(blocks) == 4
        counts = {sid: 0 for sid in ids}
        for b in blocks:
            chosen = [s.server_id for s in b.servers[:6]]
            assert len(set(chosen)) == 6
            for sid in chosen:
                counts[sid] += 1
        assert max(counts.values()) - min(counts.values()) <= 1  # least loaded first, within one call
        committed = [
            {"idx": i, "block_id": b.block_id, "length": 10,
             "chunks": [{"position": p, "server_id": s.server_id, "length": 5, "crc": 1}
                        for p, s in enumerate(b.servers[:6])]}
            for i, b in enumerate(blocks[:2])
        ]
        assert store.lookup(["f"]).size == 0  # nothing visible before the commit
        block_size = f.block_size
        layout = store.commit(f.ino, block_size + 10, written(committed), replace=True)
        assert layout == store.layout(["f"])  # the commit answers with the new layout
        assert layout.attrs.size == block_size + 10
        assert [b.idx for b in layout.blocks] == [0, 1]
        with pytest.raises(errors.InvalidArgument):
            store.commit(f.ino, 10, written(committed[:1]), replace=True)  # already committed

    def _inline(self, data: bytes, start: int = 0) -> WrittenBlock:
        return WrittenBlock(idx=0, block_id=0, start=start, length=len(data), chunks=[],
                            inline=InlineData(data=data, crc=checksum.crc(data)))

    def test_a_small_file_is_committed_and_read_inline(self, store):
        """A small file's bytes go with its commit and come back with its layout: no
        allocation, no chunk; its block reads as a block (start, length, valid), stored counts
        it, a truncation clips it, an unlink removes it."""
        f = store.create_file(["f"])
        assert f.inline_max == min(store.inline_max, f.attrs.block_size) > 0
        layout = store.commit(f.attrs.ino, 4096, [self._inline(b"x" * 1000, start=10)], replace=True)
        (block,) = layout.blocks
        assert block.inline is not None and block.inline.data == b"x" * 1000 and not block.chunks
        assert (block.start, block.length, block.valid) == (10, 1000, 1010)
        assert layout == store.layout(["f"]) and layout.inline_max == f.inline_max
        assert store.lookup(["f"]).stored == 1000 and store.lookup(["f"]).size == 4096
        assert store.servers() == [] and store.health_summary()["healthy"] == 0  # nothing for repair to look at
        store.truncate(["f"], 500)
        (block,) = store.layout(["f"]).blocks
        assert block.valid == 500 and store.lookup(["f"]).stored == 490
        store.truncate(["f"], 5)  # below its start: nothing of it is left
        assert store.layout(["f"]).blocks == [] and store.lookup(["f"]).stored == 0
        store.commit(f.attrs.ino, 3, [self._inline(b"abc")], replace=True)
        store.unlink(["f"])
        assert store._one("SELECT COUNT(*) FROM inline_blocks")[0] == 0

    def test_inline_and_chunk_blocks_replace_each_other(self, store):
        """A file that grows past the threshold moves block 0 to chunks (the chunk block
        replaces the inline one at its index) and back; a commit of another index keeps an
        inline block 0 (a concurrent writer's far block)."""
        self._servers(store, 6)
        f = store.create(["f"])
        store.commit(f.ino, 3, [self._inline(b"abc")], replace=False)
        (b,) = store.allocate(f.ino, 1)
        chunks = [{"position": p, "server_id": s.server_id, "length": 5, "crc": 1} for p, s in enumerate(b.servers[:6])]
        far = f.block_size * 2 + 10
        layout = store.commit(f.ino, far, written([{"idx": 2, "block_id": b.block_id, "length": 10, "chunks": chunks}]),
                              replace=False)
        assert [(x.idx, x.inline is not None) for x in layout.blocks] == [(0, True), (2, False)]
        (b0,) = store.allocate(f.ino, 1)
        chunks0 = [{"position": p, "server_id": s.server_id, "length": 5, "crc": 1} for p, s in enumerate(b0.servers[:6])]
        layout = store.commit(f.ino, far, written([{"idx": 0, "block_id": b0.block_id, "length": 100, "chunks": chunks0}]),
                              replace=False)
        assert [(x.idx, x.inline is not None) for x in layout.blocks] == [(0, False), (2, False)]
        layout = store.commit(f.ino, 3, [self._inline(b"xyz")], replace=True)  # small again: chunks to GC
        assert [(x.idx, x.inline) for x in layout.blocks] == [(0, InlineData(data=b"xyz", crc=checksum.crc(b"xyz")))]
        assert store._one("SELECT COUNT(*) FROM gc_queue WHERE block_id IN (?, ?)", (b.block_id, b0.block_id))[0] == 12

    def test_inline_commits_that_are_refused(self, store):
        f = store.create(["f"])
        limit = min(store.inline_max, f.block_size)
        with pytest.raises(errors.InvalidArgument, match="not stored inline"):
            store.commit(f.ino, limit + 1, [self._inline(b"a")], replace=True)  # the file is too large
        with pytest.raises(errors.InvalidArgument, match="at most"):
            store.commit(f.ino, limit, [self._inline(b"a", start=limit)], replace=True)  # past the threshold
        with pytest.raises(errors.InvalidArgument, match="block 0"):
            store.commit(f.ino, 10, [msgspec.structs.replace(self._inline(b"a"), idx=1)], replace=True)
        with pytest.raises(errors.ChecksumMismatch):
            store.commit(f.ino, 1, [msgspec.structs.replace(self._inline(b"a"), inline=InlineData(data=b"a", crc=7))],
                         replace=True)
        with pytest.raises(errors.InvalidArgument, match="never staged"):
            store.stage(f.ino, 5, [self._inline(b"a")])
        assert store.layout(["f"]).blocks == [] and store.lookup(["f"]).size == 0  # nothing of them stayed

    def test_no_space_without_enough_servers(self, store):
        self._servers(store, 3)
        f = store.create(["f"])
        with pytest.raises(errors.NoSpace, match="at least 5 live chunk servers .*, 3 are live"):
            store.allocate(f.ino, 1)

    def test_a_new_server_at_an_address_replaces_the_one_registered_there(self, store):
        """A chunk server restarted on a fresh disk registers under a new uuid at the old
        address: the old registration is dead at once, so one block can never be given two
        positions on the one process listening there."""
        ids = self._servers(store, 6)
        new = store.register_server("uuid-fresh-disk", "127.0.0.1:1002", 1 << 40, 0)
        live = {s.server_id: s.address for s in store.servers() if s.live}
        assert new not in ids and ids[2] not in live and live[new] == "127.0.0.1:1002"
        assert len(set(live.values())) == len(live) == 6
        f = store.create(["f"])
        (b,) = store.allocate(f.ino, 1)
        assert len({s.address for s in b.servers}) == len(b.servers)
        # the old server re-registering by its uuid at a new address comes back
        assert store.register_server("uuid-2", "127.0.0.1:2002", 1 << 40, 0) == ids[2]
        assert ids[2] in {s.server_id for s in store.servers() if s.live}

    def test_degraded_allocation_and_commit(self, store):
        ids = self._servers(store, 5)  # rs(4,2) writes degraded with 5: k+1
        f = store.create(["f"])
        (b,) = store.allocate(f.ino, 1)
        assert sorted(s.server_id for s in b.servers) == sorted(ids)  # every live server, no spare
        chunks = [{"position": p, "server_id": s.server_id, "length": 5, "crc": 1} for p, s in enumerate(b.servers)]
        with pytest.raises(errors.InvalidArgument, match="at least 5"):
            store.commit(f.ino, 10, written([{"idx": 0, "block_id": b.block_id, "length": 10, "chunks": chunks[:4]}]),
                         replace=True)
        store.commit(f.ino, 10, written([{"idx": 0, "block_id": b.block_id, "length": 10, "chunks": chunks}]),
                     replace=True)
        assert store.health_summary()["under_redundant"] == 1

    def test_unlink_queues_chunks_for_gc(self, store):
        store.gc_delay_s = 0
        ids = self._servers(store, 6)
        f = store.create(["f"])
        (b,) = store.allocate(f.ino, 1)
        store.commit(f.ino, 10, written([{"idx": 0, "block_id": b.block_id, "length": 10, "chunks": [
            {"position": p, "server_id": s.server_id, "length": 5, "crc": 1} for p, s in enumerate(b.servers)]}]),
            replace=True)
        store.unlink(["f"])
        orders = [store.heartbeat(sid, 1 << 40, 0, 0, 0) for sid in ids]
        assert sorted(o for order in orders for o in order) == [b.block_id] * 6

    def _file_with_blocks(self, store, name, count, length=10):
        f = store.create([name])
        allocated = store.allocate(f.ino, count)
        store.commit(f.ino, (count - 1) * f.block_size + length, written([
            {"idx": i, "block_id": b.block_id, "length": length, "chunks": [
                {"position": p, "server_id": s.server_id, "length": 5, "crc": 1} for p, s in enumerate(b.servers[:6])]}
            for i, b in enumerate(allocated)]), replace=True)
        return store.layout([name])

    def test_shared_blocks_live_while_any_file_uses_them(self, store):
        """reference_blocks gives a file another file's blocks (the same chunks); unlinking
        either keeps the chunks; the last user's unlink queues them for deletion."""
        store.gc_delay_s = 0
        ids = self._servers(store, 6)
        a = self._file_with_blocks(store, "a", 2)
        store.create(["b"])
        store.truncate(["b"], a.attrs.size)
        attrs = store.reference_blocks(["b"], ["a"], [(0, 0), (1, 1)])
        assert attrs.stored == a.attrs.stored == 20
        shared = store.layout(["b"])
        assert [(x.idx, x.block_id, x.chunks) for x in shared.blocks] == [(x.idx, x.block_id, x.chunks) for x in a.blocks]
        assert store.shared_blocks([], ["a", "b", "nothing"]) == (
            [(0, x.block_id, 10) for x in a.blocks] + [(1, x.block_id, 10) for x in a.blocks], False)
        assert store.shared_blocks([], ["b", "a"], offset=1, limit=2) == (  # (in inode order: a's, then b's)
            [(1, a.blocks[1].block_id, 10), (0, a.blocks[0].block_id, 10)], True)
        store.unlink(["a"])
        assert [store.heartbeat(sid, 1 << 40, 0, 0, 0) for sid in ids] == [[]] * 6  # b still uses them
        assert store.shared_blocks([], ["b"]) == ([], False)  # ... alone now
        store.truncate(["b"], 5)  # drops block 1, the last use of it
        orders = [o for sid in ids for o in store.heartbeat(sid, 1 << 40, 0, 0, 0)]
        assert orders == [a.blocks[1].block_id] * 6
        store.unlink(["b"])
        orders = [o for sid in ids for o in store.heartbeat(sid, 1 << 40, 0, 0, 0)]
        assert orders == [a.blocks[0].block_id] * 6

    def test_references_that_are_refused(self, store):
        self._servers(store, 6)
        self._file_with_blocks(store, "a", 2)
        store.create(["b"])
        with pytest.raises(errors.InvalidArgument, match="past its size"):
            store.reference_blocks(["b"], ["a"], [(0, 0)])  # b is empty
        store.truncate(["b"], 1 << 30)
        with pytest.raises(errors.InvalidArgument, match="no stored block 5"):
            store.reference_blocks(["b"], ["a"], [(0, 5)])
        with pytest.raises(errors.InvalidArgument, match="twice"):
            store.reference_blocks(["b"], ["a"], [(0, 0), (0, 1)])
        with pytest.raises(errors.InvalidArgument, match="its own blocks"):
            store.reference_blocks(["a"], ["a"], [(3, 0)])
        store.mkdir(["small"])
        store.set_policy(["small"], None, block_size=1 << 20)
        store.create(["small", "c"])
        store.truncate(["small", "c"], 1 << 30)
        with pytest.raises(errors.InvalidArgument, match="same size"):
            store.reference_blocks(["small", "c"], ["a"], [(0, 0)])
        with pytest.raises(FileNotFoundError):
            store.reference_blocks(["b"], ["missing"], [(0, 0)])
        assert store.layout(["b"]).blocks == []  # all or nothing

    def test_expired_allocations_are_collected(self, store):
        ids = self._servers(store, 6)
        f = store.create(["f"])
        (b,) = store.allocate(f.ino, 1)
        assert store.expire_allocations(older_than_s=3600) == 0
        assert store.expire_allocations(older_than_s=-1) == 1
        orders = [store.heartbeat(sid, 1 << 40, 0, 0, 0) for sid in ids]
        assert all(order == [b.block_id] for order in orders)


    def _commit_one_block(self, store, ino, servers):
        (b,) = store.allocate(ino, 1)
        store.commit(ino, 10, written([{"idx": 0, "block_id": b.block_id, "length": 10, "chunks": [
            {"position": p, "server_id": s.server_id, "length": 5, "crc": 1} for p, s in enumerate(b.servers)]}]),
            replace=True)
        return b.block_id

    def test_hard_links_share_one_inode_until_the_last_name_goes(self, store):
        store.gc_delay_s = 0
        ids = self._servers(store, 6)
        store.mkdir(["d"])
        f = store.create(["f"])
        block_id = self._commit_one_block(store, f.ino, ids)
        linked = store.link(["f"], ["d", "g"])
        assert linked.ino == f.ino and linked.nlink == 2 and linked.ctime >= f.ctime
        assert store.lookup(["d", "g"]).size == 10
        with pytest.raises(errors.AlreadyExists):
            store.link(["f"], ["d", "g"])
        with pytest.raises(errors.NotPermitted):
            store.link(["d"], ["e"])
        with pytest.raises(errors.NotFound):
            store.link(["nope"], ["e"])
        store.unlink(["f"])
        assert store.lookup(["d", "g"]).nlink == 1
        assert all(store.heartbeat(sid, 1 << 40, 0, 0, 0) == [] for sid in ids)  # the data stays
        # rename between two names of one inode changes nothing; over another file's last name drops it
        store.link(["d", "g"], ["h"])
        store.rename(["h"], ["d", "g"])
        assert store.lookup(["h"]).nlink == 2 and store.lookup(["d", "g"]).nlink == 2
        other = store.create(["o"])
        store.rename(["o"], ["h"])
        assert store.lookup(["h"]).ino == other.ino and store.lookup(["d", "g"]).nlink == 1
        store.unlink(["d", "g"])
        with pytest.raises(errors.StaleFile):
            store.getattr_ino(f.ino)
        orders = [store.heartbeat(sid, 1 << 40, 0, 0, 0) for sid in ids]
        assert sorted(o for order in orders for o in order) == [block_id] * 6

    def test_a_file_unlinked_while_held_lives_until_released(self, store):
        ids = self._servers(store, 6)
        root_before = store.lookup([])
        made = store.create_file(["f"], reader=7)
        f, directory = made.attrs, made.directory
        assert made.created and directory == store.lookup([])  # the directory after the create
        assert made.directory_ctime_before == root_before.ctime < directory.ctime  # wcc_data: nobody else in between
        removed = store.unlink(["f"])
        after = removed.directory
        assert after == store.lookup([]) and after.mtime >= directory.mtime
        assert removed.directory_ctime_before == directory.ctime < after.ctime
        with pytest.raises(errors.NotFound):
            store.lookup(["f"])
        assert store.getattr_ino(f.ino).nlink == 0
        self._commit_one_block(store, f.ino, ids)  # still writable through its handle
        assert store.layout(ino=f.ino).attrs.size == 10
        assert store.collect_orphans() == 0
        store.release(f.ino, 7)
        with pytest.raises(errors.StaleFile):
            store.getattr_ino(f.ino)

    def test_an_unlinked_file_whose_holder_vanished_is_collected(self, store):
        now = [time.time()]
        store.clock = lambda: now[0]
        g = store.create_file(["g"], reader=9).attrs
        store.rename(["g"], ["h"])
        store.create(["x"])
        store.rename(["x"], ["h"])  # replaced while held
        assert store.getattr_ino(g.ino).nlink == 0
        assert store.collect_orphans() == 0
        now[0] += 3600  # the holder crashed: its lease lapsed
        assert store.collect_orphans() == 1
        with pytest.raises(errors.StaleFile):
            store.getattr_ino(g.ino)


    def test_extended_attributes(self, store):
        from tectofs.store.access import Caller

        alice, bob = Caller(1000, 1000), Caller(1001, 1001)
        store.create(["f"], mode=0o644, uid=1000, gid=1000)
        before = store.lookup(["f"]).ctime
        store.setxattr(["f"], "user.colour", b"\x00blue\xff", caller=alice)
        assert store.getxattr(["f"], "user.colour", caller=bob) == b"\x00blue\xff"
        assert store.lookup(["f"]).ctime >= before
        with pytest.raises(errors.PermissionDenied):
            store.setxattr(["f"], "user.colour", b"red", caller=bob)  # no write permission
        with pytest.raises(errors.AlreadyExists):
            store.setxattr(["f"], "user.colour", b"red", 1, caller=alice)
        with pytest.raises(errors.NoAttribute):
            store.setxattr(["f"], "user.size", b"1", 2, caller=alice)
        store.setxattr(["f"], "user.colour", b"red", 2, caller=alice)
        store.setxattr(["f"], "trusted.secret", b"s")
        with pytest.raises(errors.NotPermitted):
            store.getxattr(["f"], "trusted.secret", caller=alice)
        assert store.listxattr(["f"], caller=alice) == ["user.colour"]
        assert store.listxattr(["f"]) == ["trusted.secret", "user.colour"]
        with pytest.raises(errors.NotSupported):
            store.setxattr(["f"], "system.posix_acl_access", b"", caller=alice)
        with pytest.raises(errors.AttributeTooLarge):
            store.setxattr(["f"], "user.big", b"x" * (64 * 1024 + 1), caller=alice)
        with pytest.raises(errors.AttributeNameTooLong):
            store.getxattr(["f"], "user." + "n" * 300)
        store.symlink(["l"], "f")
        with pytest.raises(errors.NotPermitted):
            store.setxattr(["l"], "user.x", b"1")
        store.removexattr(["f"], "user.colour", caller=alice)
        with pytest.raises(errors.NoAttribute):
            store.getxattr(["f"], "user.colour")
        with pytest.raises(errors.NoAttribute):
            store.removexattr(["f"], "user.colour")
        with pytest.raises(errors.NoSpace):  # the names of one file stay within a listing's bound
            for i in range(300):
                store.setxattr(["f"], f"user.{i:03d}" + "n" * 247, b"")
        assert 250 <= len(store.listxattr(["f"])) < 300
        assert sum(len(n) + 1 for n in store.listxattr(["f"])) <= 64 * 1024
        ino = store.lookup(["f"]).ino
        store.unlink(["f"])
        assert store._all("SELECT name FROM xattrs WHERE ino = ?", (ino,)) == []


    def test_atime_follows_relatime(self, store):
        now = [1_000_000.0]
        store.clock = lambda: now[0]
        f = store.create(["f"])
        store.mkdir(["d"])
        now[0] += 10
        assert store.layout(["f"], reader=1).attrs.atime == now[0]  # not newer than mtime: updated
        opened = now[0]
        now[0] += 10
        assert store.layout(["f"], reader=2).attrs.atime == opened  # newer than mtime and ctime: kept
        store.layout(["f"], reader=3, write_only=True)
        now[0] += 86_400
        assert store.layout(["f"], reader=4).attrs.atime == now[0]  # a day old: updated
        assert store.lookup(["f"]).atime == now[0] and store.lookup(["f"]).mtime == f.mtime
        store.readdir(["d"])
        assert store.lookup(["d"]).atime == now[0]


class TestSqliteStore(StoreContract):
    def make_store(self, tmp_path) -> SqlStore:
        return SqlStore(SqliteDialect(str(tmp_path / "meta.db")))


class TestPostgresStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _server(self, postgres_server):
        self.server_url = postgres_server

    def make_store(self, tmp_path) -> SqlStore:
        from tectofs.testing.postgres import new_database

        return SqlStore(PostgresDialect(new_database(self.server_url)))


def _mkdir(name: str) -> Callable[[SqlStore], Attrs]:
    return lambda store: store.mkdir([name])


def test_group_commit_batches_concurrent_operations(tmp_path):
    runner = StoreRunner(lambda: SqlStore(SqliteDialect(str(tmp_path / "meta.db"))))
    try:
        async def main() -> float:
            started = time.perf_counter()
            await asyncio.gather(*(runner.call(_mkdir(f"d{i}")) for i in range(2000)))
            return time.perf_counter() - started

        elapsed = asyncio.run(main())
        assert runner.stats["operations"] >= 2000
        assert runner.stats["largest_batch"] > 1
        assert runner.stats["commits"] < runner.stats["operations"] / 4
        assert len(runner.call_sync(lambda store: store.readdir([])).entries) == 2000
        print(f"2000 mkdirs in {elapsed:.2f}s, {runner.stats['commits']} commits")
    finally:
        runner.close()


def test_one_failing_operation_does_not_abort_its_batch(tmp_path):
    runner = StoreRunner(lambda: SqlStore(SqliteDialect(str(tmp_path / "meta.db"))))
    try:
        async def main():
            return await asyncio.gather(
                runner.call(lambda store: store.mkdir(["x"])), runner.call(lambda store: store.mkdir(["x"])),
                runner.call(lambda store: store.mkdir(["y"])),
                runner.call(lambda store: store.getattr_ino(2**64)),  # not a TectofsError: OverflowError inside sqlite3
                runner.call(lambda store: store.mkdir(["z"])),
                return_exceptions=True,
            )

        results = asyncio.run(main())
        assert isinstance(results[1], errors.AlreadyExists)
        assert isinstance(results[3], errors.TectofsError)  # answered as an error, alone
        assert results[0].kind == "dir" and results[2].kind == "dir" and results[4].kind == "dir"
        assert [e.name for e in runner.call_sync(lambda store: store.readdir([])).entries] == ["x", "y", "z"]
    finally:
        runner.close()


def test_an_inline_runner_runs_each_call_at_once_on_the_callers_thread(tmp_path):
    """The simulator's runner: no thread, one transaction per call, errors alone, exactly once."""
    import threading

    runner = StoreRunner(lambda: SqlStore(SqliteDialect(str(tmp_path / "meta.db"))), inline=True)
    try:
        assert not any(t.name == "tectofs-store" for t in threading.enumerate())

        async def main():
            made = await runner.call(lambda store: store.mkdir(["x"]), returns=Attrs, request_key="call-1")
            # a retry: the recorded result
            again = await runner.call(lambda store: store.mkdir(["x"]), returns=Attrs, request_key="call-1")
            with pytest.raises(errors.AlreadyExists):
                await runner.call(lambda store: store.mkdir(["x"]))
            return made, again

        made, again = asyncio.run(main())
        assert made == again and made.kind == "dir"
        assert [e.name for e in runner.call_sync(lambda store: store.readdir([])).entries] == ["x"]
        assert runner.stats["operations"] == 4
    finally:
        runner.close()


def test_metadata_service_answers_busy_past_its_queue_limit(tmp_path, monkeypatch):
    from tectofs import limits
    from tectofs.server.meta import MetadataService

    monkeypatch.setattr(limits, "meta_queue_max", 5)

    from tectofs.wire import auth

    key_file = auth.create_key_file(str(tmp_path / "cluster.key"))

    async def main():
        service = MetadataService(str(tmp_path / "meta.db"), key_file=key_file)
        try:
            return await asyncio.gather(*(service._call(_mkdir(f"d{i}"), Attrs) for i in range(300)),
                                        return_exceptions=True), service
        finally:
            await service.close()

    results, service = asyncio.run(main())
    busy = [r for r in results if isinstance(r, errors.Busy)]
    done = [r for r in results if isinstance(r, Attrs)]
    assert busy and done and len(busy) + len(done) == 300
    assert service.busy_answers == len(busy)


class TestMemoryStore(StoreContract):
    """The in-memory store: SQLite in memory, what the cluster simulation runs on."""

    def make_store(self, tmp_path) -> SqlStore:
        from tests.simulation import MemoryDialect

        return SqlStore(MemoryDialect())
