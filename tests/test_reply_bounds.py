"""Every reply (and every request a client builds) fits in a frame, by construction: the
worst cases are built here for real — longest names and symlink targets, the widest policy,
the longest server addresses, the most entries — and encoded."""

from __future__ import annotations

import uuid
from typing import Any

import msgspec
import pytest

from tectofs import limits
from tectofs.server.meta.service import capability, layout_segment
from tectofs.server.meta.users import USER_ENTRY_BYTES_MAX
from tectofs.store import SqlStore
from tectofs.store.dialect import SqliteDialect
from tectofs.store.registry import SERVER_STATS_KEPT
from tectofs.wire import auth, claims, messages, shared_blocks
from tectofs.wire.leases import Entry, KeepaliveReply, Recall

WIDEST = "rs(32,16)"
# The largest capabilities: the longest key id, the latest expiry.
LONGEST_KEYS = auth.KeyRing.from_keys([("k" * 64, bytes(32))])


def _segment(layout: messages.LayoutSegment) -> messages.LayoutSegment:
    return layout_segment(layout, LONGEST_KEYS, 1e10, handle=bytes(auth.HANDLE_BYTES))
KiB = 1 << 10


def _fits(message: Any) -> int:
    size = len(msgspec.msgpack.encode(message))
    assert size <= limits.frame_header_max_bytes, size
    return size


@pytest.fixture
def store(tmp_path: Any) -> SqlStore:
    s = SqlStore(SqliteDialect(str(tmp_path / "meta.db")), gc_delay_s=0)
    s.tx_begin()
    return s


def _long_address(i: int) -> str:
    port = f":{10000 + i}"
    return "h" * (limits.address_length_max_bytes - len(port)) + port


def _register(store: SqlStore, n: int) -> list[int]:
    return [store.register_server(str(uuid.uuid4()), _long_address(i), 1 << 50, 0) for i in range(n)]


def test_readdir_pages_fit(store: SqlStore) -> None:
    store.mkdir(["d"])
    n = limits.readdir_page_entries_max + 50
    for i in range(n):
        name = f"{i:06d}" + "n" * (limits.name_length_max_bytes - 6)
        if i % 2:
            store.symlink(["d", name], "t" * limits.symlink_target_max_bytes)
        else:
            store.create(["d", name])
    after: str | None = ""
    seen, pages = 0, 0
    while after is not None:
        page = store.readdir(["d"], after)
        after = page.next
        reply = msgspec.structs.replace(page, entries=[
            msgspec.structs.replace(e, attrs=msgspec.structs.replace(e.attrs, handle=bytes(auth.HANDLE_BYTES)))
            for e in page.entries])
        _fits(reply)
        seen += len(page.entries)
        pages += 1
    assert seen == n and pages > 1


def test_layout_segments_and_commit_replies_fit(store: SqlStore) -> None:
    ids = _register(store, 48)
    store.mkdir(["wide"], policy=WIDEST, block_size=64 * KiB)
    f = store.create(["wide", "f"])
    blocks = []
    per_call = messages.blocks_per_call(48)
    for idx in range(per_call):
        (allocation,) = store.allocate(f.ino, 1)
        blocks.append({"idx": idx, "block_id": allocation.block_id, "start": 0, "length": 64 * KiB,
                       "chunks": [{"position": p, "server_id": ids[p], "length": 4096, "crc": 0xFFFFFFFF}
                                  for p in range(48)]})
    request = messages.CommitRequest(ino=f.ino, size=per_call * 64 * KiB, blocks=[
        messages.convert(b, messages.WrittenBlock) for b in blocks], mtime=1e10, shrunk_to=2**62, writer=2**62)
    _fits(request)  # what a client sends fits too
    layout = store.commit(f.ino, per_call * 64 * KiB, request.blocks, replace=True)
    _fits(_segment(layout))
    first, total = 0, 0
    while True:
        segment = _segment(store.layout(ino=f.ino, first=first))
        _fits(segment)
        total += len(segment.blocks)
        if segment.end is None:
            break
        first = segment.end
    assert total == per_call and first > 0


def test_allocate_and_servers_replies_fit(store: SqlStore) -> None:
    _register(store, limits.servers_max)
    store.mkdir(["wide"], policy=WIDEST)
    f = store.create(["wide", "f"])
    allocations = store.allocate(f.ino, limits.allocate_blocks_max)
    assert 1 <= len(allocations) <= limits.allocate_blocks_max
    _fits(messages.AllocateReply(blocks=[
        messages.Allocation(block_id=a.block_id, policy=a.policy,
                            servers=a.servers,
                            cap=capability(LONGEST_KEYS, a.block_id, "w", 2**62)) for a in allocations]))
    for server_id in range(1, limits.servers_max + 1):  # every server reporting all it may
        store.heartbeat(server_id, 2**62, 2**62, 2**62, 2**62, _long_address(server_id),
                        stats={f"key{i:060d}": 2**62 for i in range(64)} | dict.fromkeys(SERVER_STATS_KEPT, 2**62))
    _fits(messages.ServersReply(servers=store.servers()))
    with pytest.raises(Exception, match="already has"):
        _register(store, 1)


def test_fixed_size_replies_fit() -> None:
    attrs = messages.Attrs(ino=2**63 - 1, kind="symlink", mode=0o177777, uid=2**32 - 2, gid=2**32 - 2, size=2**63 - 1,
                           atime=-1e11, mtime=1e11, ctime=1e11, nlink=2**63 - 1, policy="x" * 32,
                           block_size=limits.block_size_max_bytes, target="t" * limits.symlink_target_max_bytes,
                           parent=2**63 - 1, stored=2**63 - 1)
    _fits(messages.AttrsReply(attrs=attrs, walk=[2**63 - 1] * (limits.path_length_max_bytes // 2)))
    _fits(claims.ClaimReply(granted=True, directory=attrs, template=attrs, first=2**63 - 1,
                            handles=[b"h" * 16] * limits.claim_inodes, inline_max=2**63 - 1))
    # create_many: a new small file's layout per create, its inline bytes left out (inline_echo)
    inline = messages.Block(idx=0, block_id=0, policy="x" * 32, length=limits.inline_bytes_max,
                            valid=limits.inline_bytes_max, chunks=[], inline=messages.InlineData(data=b"", crc=2**32 - 1))
    file_attrs = msgspec.structs.replace(attrs, kind="file", target=None)
    written = messages.LayoutSegment(attrs=file_attrs, blocks=[inline], inline_max=2**63 - 1, inline_omitted=True)
    _fits(claims.CreateManyReply(directory=attrs, layouts=[written] * limits.create_batch_max))
    source = messages.ChunkRef(position=47, server_id=2**63 - 1, address=_long_address(1), length=2**26, crc=2**32 - 1)
    order = messages.RepairOrder(block_id=2**63 - 1, position=47, policy="x" * 32, length=2**26, crc=2**32 - 1,
                                 sources=[source] * limits.policy_width_max)
    _fits(messages.HeartbeatReply(delete=[2**63 - 1] * limits.gc_orders_per_heartbeat_max,
                                  repairs=[order] * limits.repair_orders_per_heartbeat_max))
    _fits(messages.BlockHealthReply(files=[messages.FileHealth(
        ino=2**63 - 1, blocks=2**63 - 1, healthy=2**63 - 1, under_redundant=2**63 - 1, unreadable=2**63 - 1,
    )] * limits.health_inos_per_call_max))
    user = messages.UserInfo(name="u" * 64, uid=2**32 - 2, gid=2**32 - 2, groups=[2**32 - 2] * 64, admin=True,
                             proxy=True, s3_access_key="A" * 64)
    _fits(messages.UserListReply(users=[user] * (limits.reply_header_budget_bytes // USER_ENTRY_BYTES_MAX), more=True))
    _fits(messages.WhoamiReply(kind="user", name="u" * 64, uid=1, gid=1, groups=[2**32 - 2] * 256, admin=True,
                               proxy=True))
    name = "user." + "n" * (limits.xattr_name_max_bytes - 5)
    _fits(messages.ListxattrReply(names=[name] * (limits.xattr_names_max_bytes // (len(name) + 1))))
    _fits(messages.ListxattrReply(names=["user.x"] * (limits.xattr_names_max_bytes // 7)))
    _fits(messages.XattrReply(value=b"v" * limits.xattr_value_max_bytes))
    keys = limits.lease_recall_keys_max
    recall = Recall(id=2**63 - 1, inos=[2**63 - 1] * keys, listings=[2**63 - 1] * keys, claims=[2**63 - 1] * keys,
                    entries=[Entry(parent=2**63 - 1, name="n" * limits.name_length_max_bytes)] * keys)
    _fits(KeepaliveReply(lease_s=1e9, renewed=True, restarted=True, recalls=[recall] * limits.lease_recalls_per_reply_max))
    _fits(messages.GetChunkReply(crcs=[0xFFFFFFFF] * (limits.block_size_max_bytes // limits.checksum_piece_bytes),
                                 chunk_length=2**40, position=47, crc=0xFFFFFFFF))
    widest = shared_blocks.SharedBlock(name=limits.health_inos_per_call_max, block_id=2**63 - 1, nbytes=2**63 - 1)
    _fits(shared_blocks.SharedBlocksReply(blocks=[widest] * shared_blocks.SHARED_BLOCKS_PER_REPLY_MAX, more=True))


def test_every_reply_type_is_covered() -> None:
    """Replies with lists are the ones a bound can fail on; each has a test above."""
    covered = {messages.ReaddirReply, messages.LayoutSegment, messages.AllocateReply, messages.ServersReply,
               messages.HeartbeatReply, messages.GetChunkReply, messages.AttrsReply, messages.BlockHealthReply,
               messages.UserListReply, messages.WhoamiReply, messages.ListxattrReply, shared_blocks.SharedBlocksReply,
               KeepaliveReply, claims.ClaimReply, claims.CreateManyReply}
    for table in (messages.META_OPERATIONS, messages.CHUNK_OPERATIONS):
        for operation in table.values():
            has_list = any("list" in str(field.type) for field in msgspec.structs.fields(operation.reply))
            assert not has_list or operation.reply in covered, operation.name
