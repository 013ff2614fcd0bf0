"""Small files' first commits in the background (``CreateClaims.commits_in_background``, the
mount's): the ``close`` of a small file created without a call answers at once, with the layout
the service then stores; the bytes go with the create, in a batch. Every other client sees the
file whole at its next call, ``sync`` (the mount's ``fsync``) waits for them, and a service
SIGKILLed before they were sent takes them back from the client."""

from __future__ import annotations

import asyncio
import os
import stat as statmod

import pytest

from tectofs.wire import messages
from tests.test_claims import _leasing as _leasing_clients
from tests.test_claims import run

pytestmark = pytest.mark.slow


async def _leasing(address, count=2):
    """``count`` leasing clients whose mount-style small-file commits go in the background."""
    clients = await _leasing_clients(address, count)
    for client in clients:
        assert client.claims is not None
        client.claims.commits_in_background = True
    return clients


async def _write(fs, path, data, atime_mtime=None, mode=None):
    handle = await fs.open(path, "xb", write_only=True)
    if data:
        await handle.write(0, data)
    if atime_mtime is not None:
        handle.stamp_times(*atime_mtime)
    if mode is not None:
        handle.stamp_mode(mode)
    await handle.close()
    return handle.committed_layout


def _count_calls(fs):
    """The names of the metadata calls ``fs`` sends from now on."""
    sent: list[str] = []
    call = fs.metadata.rpc.call

    async def counted(address, operation, request, *args, **kwargs):
        sent.append(operation.name)
        return await call(address, operation, request, *args, **kwargs)
    fs.metadata.rpc.call = counted
    return sent


def test_a_small_files_close_sends_nothing_and_the_service_stores_what_it_answered(leased_cluster, monkeypatch):
    from tectofs import limits
    monkeypatch.setattr(limits, "create_flush_delay_s", 30.0)  # nothing is sent by the timer meanwhile

    async def scenario():
        creator, reader = await _leasing(leased_cluster)
        base = f"/background-{os.getpid()}"
        await creator.mkdir(base)
        sizes = [0, 1, 100, 4096, 20_000, 65_536]
        contents = {f"f{size}": os.urandom(size) for size in sizes}
        await _write(creator, f"{base}/first", b"claims the directory")
        sent = _count_calls(creator)
        answered = {}
        for name, data in contents.items():
            answered[name] = await _write(creator, f"{base}/{name}", data, atime_mtime=(None, 1_700_000_000.25))
        claims = creator.claims
        assert claims.background_commits == 1 + len(sizes)
        assert not [name for name in sent if name != "keepalive"]  # no call at all
        assert claims.pending == 1 + len(sizes)
        # The creator reads its own files back at once, from what it answered.
        for name, data in contents.items():
            assert await creator.read_bytes(f"{base}/{name}") == data
        # Another client's call recalls the claim: the batch is stored first, as answered.
        for name, data in contents.items():
            stored = await reader.metadata.layout(messages.LayoutRequest(path=f"{base}/{name}"))
            mine = answered[name]
            assert mine is not None
            for field in ("ino", "size", "mtime", "ctime", "atime", "mode", "stored", "uid", "gid", "nlink", "policy"):
                assert getattr(stored.attrs, field) == getattr(mine.attrs, field), (name, field)
            assert stored.attrs.mtime == 1_700_000_000.25
            assert [(b.idx, b.block_id, b.start, b.length, b.valid, b.policy, b.inline) for b in stored.blocks] == [
                (b.idx, b.block_id, b.start, b.length, b.valid, b.policy, b.inline) for b in mine.blocks], name
            assert (stored.first, stored.end, stored.inline_max) == (mine.first, mine.end, mine.inline_max)
            assert await reader.read_bytes(f"{base}/{name}") == data
        assert claims.pending == 0 and claims.lost == 0
        for fs in (creator, reader):
            await fs.close()
    run(scenario())


def test_a_commit_the_service_could_answer_otherwise_waits_for_it(leased_cluster, monkeypatch):
    """A chmod carried by the commit (checked against the caller), an empty file, a file past
    the inline size, and any close once the unsent bytes reach their bound: the caller waits
    for the sending, as without background commits."""
    from tectofs import limits
    monkeypatch.setattr(limits, "create_flush_delay_s", 30.0)
    monkeypatch.setattr(limits, "background_commit_bytes_max", 50_000)

    async def scenario():
        creator, reader = await _leasing(leased_cluster)
        base = f"/waits-{os.getpid()}"
        await creator.mkdir(base)
        claims = creator.claims
        await _write(creator, f"{base}/first", b"a" * 10)  # claims the directory
        assert claims.background_commits == 1 and claims.pending == 1
        await _write(creator, f"{base}/chmod", b"b" * 10, mode=0o600)
        assert claims.background_commits == 1 and claims.pending == 0  # waited: everything before it went too
        await _write(creator, f"{base}/empty", b"", mode=0o640)  # a create; its commit carries the mode
        assert claims.pending == 0
        await _write(creator, f"{base}/large", os.urandom(200_000))  # chunks: allocated by a call
        assert claims.background_commits == 1 and claims.pending == 0
        bounded = f"{base}/bounded"
        await creator.mkdir(bounded)
        for i in range(4):  # 20,000 bytes each: the third would pass the bound of 50,000 unsent
            await _write(creator, f"{bounded}/s{i}", b"c" * 20_000)
        assert claims.background_commits == 1 + 3 and claims.pending == 1  # s3's, sent after s2's wait
        await creator.sync()
        assert claims.pending == 0 and claims.lost == 0
        assert statmod.S_IMODE((await reader.stat(f"{base}/chmod")).mode) == 0o600
        assert sorted(await reader.listdir(base)) == ["bounded", "chmod", "empty", "first", "large"]
        assert sorted(await reader.listdir(bounded)) == ["s0", "s1", "s2", "s3"]
        assert await reader.read_bytes(f"{bounded}/s3") == b"c" * 20_000
        assert (await reader.stat(f"{base}/large")).size == 200_000
        for fs in (creator, reader):
            await fs.close()
    run(scenario())


def test_small_files_closed_before_the_service_was_killed_are_taken_back_by_its_successor(make_cluster, monkeypatch):
    """The service is SIGKILLed after twenty closes returned, none of whose files was sent: the
    restarted service takes the batch back from the client in its grace period, bytes and all."""
    from tectofs import limits
    monkeypatch.setattr(limits, "create_flush_delay_s", 30.0)
    cluster = make_cluster(meta_args=["--lease", "2"])

    async def scenario():
        from tectofs.client.core import AsyncFileSystem
        (creator,) = await _leasing(cluster.address, 1)
        await creator.mkdir("/kept")
        contents = {f"f{i}": os.urandom(100 + 997 * i) for i in range(20)}
        for name, data in contents.items():
            await _write(creator, f"/kept/{name}", data)
        assert creator.claims.background_commits == 20 and creator.claims.pending == 20
        await asyncio.to_thread(cluster.kill_meta)
        await asyncio.to_thread(cluster.restart_meta)
        reader = AsyncFileSystem(cluster.address)
        assert sorted(await reader.listdir("/kept")) == sorted(contents)  # waits for the creator's batch
        for name, data in contents.items():
            assert await reader.read_bytes(f"/kept/{name}") == data
        await creator.sync()
        assert creator.claims.lost == 0 and creator.claims.sent == 20
        for fs in (creator, reader):
            await fs.close()
    run(scenario())


def test_a_new_large_file_is_allocated_for_under_its_claim_before_its_create_is_sent(leased_cluster, monkeypatch):
    """A file past the inline size, created without a call: its allocation goes before the
    creates (``claimed_in``), which are sent while its blocks are put, and its commit after
    them; it reads back whole everywhere. Nobody else allocates for a number of that claim,
    nor for one not handed out."""
    from tectofs import limits
    from tectofs.errors import StaleFile
    monkeypatch.setattr(limits, "create_flush_delay_s", 30.0)

    async def scenario():
        creator, reader = await _leasing(leased_cluster)
        base = f"/ahead-{os.getpid()}"
        await creator.mkdir(base)
        await _write(creator, f"{base}/small", b"s" * 100)  # claims the directory
        sent = _count_calls(creator)
        data = os.urandom(300_000)
        layout = await _write(creator, f"{base}/large", data)
        assert sent[0] == "allocate" and "create_many" in sent and sent.index("create_many") < sent.index("commit")
        assert layout is not None and layout.attrs.size == len(data)
        assert await reader.read_bytes(f"{base}/large") == data
        assert (await reader.stat(f"{base}/small")).size == 100

        other = f"{base}/other"
        await creator.mkdir(other)
        await _write(creator, f"{other}/a", b"a")
        claimed = creator.claims._claims[other]
        directory, (unused, handle) = claimed.directory.ino, claimed.numbers[0]
        for fs, ino in ((reader, unused), (creator, unused + 10_000)):
            with pytest.raises(StaleFile):  # another session's claim; a number never handed out: no such file
                await fs.metadata.call(messages.ALLOCATE, messages.AllocateRequest(
                    ino=ino, handle=handle, claimed_in=directory), ordered=False)
        for fs in (creator, reader):
            await fs.close()
    run(scenario())
