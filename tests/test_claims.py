"""Asynchronous creates (``client/claims.py``, ``server/meta/claims.py``): a client that creates
a burst of files in one directory claims it and creates there without calls; every other client
sees each of those files at its next call, and nobody can create under a claim not theirs."""

from __future__ import annotations

import asyncio
import os
import stat as statmod

import pytest

from tectofs.errors import AlreadyExists, PermissionDenied
from tectofs.wire import messages
from tectofs.wire.claims import ClaimRequest, CreateManyRequest, PendingCreate

pytestmark = pytest.mark.slow


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def _leasing(address, count=2):
    from tectofs.client.core import AsyncFileSystem
    clients = [AsyncFileSystem(address, leases=True) for _ in range(count)]
    for _ in range(200):
        if all(c.lease_session is not None and c.lease_session.remaining() for c in clients):
            return clients
        await asyncio.sleep(0.02)
    raise AssertionError("no lease within 4 s")


async def _create(fs, path):
    handle = await fs.open(path, "xb")
    await handle.close()
    return handle.ino


def test_a_burst_of_creates_costs_no_calls_and_every_other_client_sees_each_file_at_its_next_call(leased_cluster):
    async def scenario():
        from tectofs.client.core import AsyncFileSystem
        creator, reader = await _leasing(leased_cluster)
        plain = AsyncFileSystem(leased_cluster)  # holds no leases
        base = f"/burst-{os.getpid()}"
        await creator.mkdir(base)
        inos = [await _create(creator, f"{base}/f{i}") for i in range(40)]
        claims = creator.claims
        assert claims is not None and claims.claims == 1
        # A directory it made: claimed at its first create there. The first claim hands out 32
        # numbers, and more are asked for after 16 creates; this burst never yields to the event
        # loop, so the 33rd create finds that claim still on its way and is made by a call.
        assert claims.created == 39
        assert claims.pending > 0  # not sent yet: the reader's call must wait for them
        st = await reader.stat(f"{base}/f39")  # recalls the claim: the creator sends, then the stat runs
        assert (st.ino, st.size, st.kind, st.uid) == (inos[39], 0, "file", os.getuid())
        assert statmod.S_IMODE(st.mode) == 0o644
        assert claims.pending == 0 and claims.sent == 39 and claims.lost == 0
        assert sorted(await plain.listdir(base)) == sorted(f"f{i}" for i in range(40))
        assert len(set(inos)) == 40
        with pytest.raises(AlreadyExists):  # the name is taken, for every other client
            await reader.open(f"{base}/f20", "xb")

        # Another burst: the claim was recalled a moment ago, so these are calls for a while,
        # and the reader's changes there stay in order with them.
        more = [await _create(creator, f"{base}/g{i}") for i in range(5)]
        await reader.rename(f"{base}/g4", f"{base}/moved")
        assert (await creator.stat(f"{base}/moved")).ino == more[4]
        await reader.remove(f"{base}/f0")
        assert "f0" not in await creator.listdir(base)

        # The creator's own calls come after its creates: unlink of a file not sent yet.
        other = f"{base}/own"
        await creator.mkdir(other)
        for i in range(10):
            await _create(creator, f"{other}/h{i}")
        assert claims.pending > 0
        await creator.remove(f"{other}/h9")  # sends the creates first, then unlinks
        assert sorted(await plain.listdir(other)) == sorted(f"h{i}" for i in range(9))
        for fs in (creator, reader, plain):
            await fs.close()
    run(scenario())


def test_nobody_creates_under_a_claim_not_theirs_nor_with_numbers_not_handed_to_them(leased_cluster):
    async def scenario():
        from tectofs.client.core import AsyncFileSystem
        holder, other = await _leasing(leased_cluster)
        plain = AsyncFileSystem(leased_cluster)
        base = f"/guarded-{os.getpid()}"
        await holder.mkdir(base)
        directory = (await holder.stat(base)).ino
        claim = await holder.metadata.claim_directory(ClaimRequest(path=base, count=4))
        assert claim.granted and claim.first > directory

        def batch(ino, name="x"):
            return CreateManyRequest(path=base, directory=directory,
                                     creates=[PendingCreate(name=name, ino=ino, mode=0o644, time=1.0)])
        with pytest.raises(PermissionDenied):  # numbers not handed out with this claim
            await holder.metadata.create_many(batch(claim.first + 4))
        with pytest.raises(PermissionDenied):  # another session, the right numbers
            await other.metadata.create_many(batch(claim.first))
        with pytest.raises(PermissionDenied):  # no session at all
            await plain.metadata.create_many(batch(claim.first))
        await holder.metadata.create_many(batch(claim.first, "made"))
        assert (await plain.stat(f"{base}/made")).ino == claim.first  # recalled the claim first
        with pytest.raises(PermissionDenied):  # the claim is over: its numbers with it
            await holder.metadata.create_many(batch(claim.first + 1, "late"))

        assert not (await plain.metadata.claim_directory(ClaimRequest(path=base))).granted  # no session
        shared = f"{base}/setgid"
        await plain.mkdir(shared)
        await plain.metadata.setattr(messages.SetattrRequest(path=shared, mode=0o2775))
        assert not (await holder.metadata.claim_directory(ClaimRequest(path=shared))).granted
        for fs in (holder, other, plain):
            await fs.close()
    run(scenario())


def test_creates_not_sent_when_the_service_was_killed_are_taken_back_by_its_successor(make_cluster, monkeypatch):
    """The service is SIGKILLed while the creator holds creates it answered and had not sent
    (all ten: it made the directory, so claimed it at once):
    the restarted service knows the claim from its store, holds the directory through its grace
    period, and takes the creator's batch back; another client's listing waits for it."""
    from tectofs import limits
    monkeypatch.setattr(limits, "create_flush_delay_s", 30.0)  # nothing is sent before the kill
    cluster = make_cluster(meta_args=["--lease", "2"])

    async def before_the_kill():
        (creator,) = await _leasing(cluster.address, 1)
        await creator.mkdir("/kept")
        for i in range(10):
            await _create(creator, f"/kept/f{i}")
        assert creator.claims is not None and creator.claims.pending == 10
        return creator

    async def scenario():
        from tectofs.client.core import AsyncFileSystem
        creator = await before_the_kill()
        await asyncio.to_thread(cluster.kill_meta)
        await asyncio.to_thread(cluster.restart_meta)
        reader = AsyncFileSystem(cluster.address)
        started = asyncio.get_running_loop().time()
        names = await reader.listdir("/kept")  # waits until the creator took its creates back
        assert sorted(names) == sorted(f"f{i}" for i in range(10)), names
        assert asyncio.get_running_loop().time() - started < 8  # within the grace period (2 s) and a keepalive
        await creator.claims.flush()  # (its answer may still be on its way to the creator)
        assert creator.claims.lost == 0 and creator.claims.sent == 10
        for fs in (creator, reader):
            await fs.close()
    run(scenario())


def test_an_unlink_without_a_call_is_seen_by_every_other_clients_next_call_by_name_or_by_inode(leased_cluster):
    """``rm`` of many files in one directory claims it too: the unlinks cost no call, and
    another client that held the files' names and attributes sees each gone at its next call,
    whether it asks by name or by inode number (the claim recalled the attributes of the
    directory's files, and a call on one of them waits for the holder to send its unlinks)."""
    from tectofs.errors import NotFound, StaleFile

    async def scenario():
        remover, other = await _leasing(leased_cluster)
        base = f"/unlinked-{os.getpid()}"
        await other.mkdir(base)
        for i in range(30):
            await other.write_bytes(f"{base}/f{i}", b"z" * i)
        kept = {i: await other.stat(f"{base}/f{i}") for i in range(30)}  # names and attributes held
        for i in range(30):
            await remover.stat(f"{base}/f{i}")  # (as the kernel looks a name up before it unlinks it)
            await remover.remove(f"{base}/f{i}")
        claims = remover.claims
        assert claims is not None and claims.unlinked == 30 - 3 and claims.pending > 0
        with pytest.raises(StaleFile):  # by inode: waits for the unlinks, then finds the file gone
            await other.metadata.getattr(messages.InoRequest(ino=kept[29].ino, handle=kept[29].handle))
        assert claims.pending == 0 and claims.lost == 0
        for i in (3, 17, 29):
            with pytest.raises(NotFound):  # by name: its cache let go of them when the directory was claimed
                await other.stat(f"{base}/f{i}")
        assert await other.listdir(base) == []
        await other.rmdir(base)
        for fs in (remover, other):
            await fs.close()
    run(scenario())


def test_a_hundred_thousand_files_created_in_one_directory_under_one_claim(leased_cluster):
    """The scale a shared directory reaches: 100,000 creates without calls (the claim takes more
    inode numbers as it goes, without looking at the directory's files again), all seen by
    another client's listing, none lost."""
    count = 100_000

    async def scenario():
        creator, reader = await _leasing(leased_cluster)
        base = f"/wide-{os.getpid()}"
        await creator.mkdir(base)
        for i in range(count):
            handle = await creator.open(f"{base}/f{i:06d}", "xb")
            await handle.close()
        claims = creator.claims
        assert claims is not None and claims.claims == 1
        assert claims.created >= count * 0.99  # (a create whose numbers ran out, the next ones not in yet, is a call)
        names = await reader.listdir(base)
        assert len(names) == count and names[0] == "f000000" and names[-1] == f"f{count - 1:06d}"
        assert claims.lost == 0 and claims.sent == claims.created
        for fs in (creator, reader):
            await fs.close()
    asyncio.run(asyncio.wait_for(scenario(), 300))


def test_walking_through_a_claimed_directory_recalls_nothing_and_nested_claims_do_not_wait_on_each_other(
        leased_cluster):
    """A claim's holder only adds and removes files, so a path walked through a claimed directory
    to one below does not recall the claim; and holders of claims nested in each other's
    directories send their creates without waiting for one another (each sending changes only
    its own directory), while a third client lists all three."""
    async def scenario():
        a, c, reader = await _leasing(leased_cluster, 3)
        base = f"/nested-{os.getpid()}"
        for path in (base, f"{base}/p", f"{base}/p/d", f"{base}/p/q"):
            await reader.mkdir(path)

        async def claim(fs, path):
            reply = await fs.metadata.claim_directory(ClaimRequest(path=path, count=8))
            assert reply.granted and reply.directory is not None
            return reply

        def batch(path, reply, name, i):
            return CreateManyRequest(path=path, directory=reply.directory.ino, creates=[
                PendingCreate(name=name, ino=reply.first + i, mode=0o644, time=1.0)])
        outer, inner, middle = await claim(a, base), await claim(a, f"{base}/p/d"), await claim(c, f"{base}/p")
        await reader.stat(f"{base}/p/q")  # walks through base and base/p (both claimed): recalls neither
        await a.metadata.create_many(batch(base, outer, "a0", 0))  # a's claim on base still stands
        await c.metadata.create_many(batch(f"{base}/p", middle, "c0", 0))  # and c's on base/p
        await asyncio.wait_for(asyncio.gather(  # all at once: no holder's sending waits on another's claim
            a.metadata.create_many(batch(base, outer, "a1", 1)),
            a.metadata.create_many(batch(f"{base}/p/d", inner, "d1", 1)),
            c.metadata.create_many(batch(f"{base}/p", middle, "c1", 1))), 10)
        listed = await asyncio.wait_for(asyncio.gather(  # each recalls one claim
            reader.listdir(f"{base}/p/d"), reader.listdir(f"{base}/p"), reader.listdir(base)), 10)
        assert [sorted(names) for names in listed] == [["d1"], ["c0", "c1", "d", "q"], ["a0", "a1", "p"]]
        for fs in (a, c, reader):
            await fs.close()
    run(scenario())


def test_a_caller_cancelled_while_its_creates_are_sent_loses_none_of_them(leased_cluster):
    """The caller waiting for a sending (here the claims' own ``flush``, as any call of the
    client waits first) is cancelled as the batch leaves the queue: the sending goes on, so
    every file it answered for exists for everyone, and nothing is counted lost."""
    async def scenario():
        from tectofs.client.core import AsyncFileSystem
        (creator,) = await _leasing(leased_cluster, count=1)
        plain = AsyncFileSystem(leased_cluster)
        base = f"/cancelled-{os.getpid()}"
        await creator.mkdir(base)
        for i in range(20):
            await _create(creator, f"{base}/f{i}")
        claims = creator.claims
        assert claims is not None and claims.pending == 20
        waiting = asyncio.get_running_loop().create_task(claims.flush())
        for _ in range(100):  # until the batch is off the queue, its create_many on its way
            if not claims.pending:
                break
            await asyncio.sleep(0)
        assert claims.pending == 0 and claims.sent == 0
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for _ in range(100):  # the sending ends on its own
            if claims.sent == 20:
                break
            await asyncio.sleep(0.05)
        assert (claims.sent, claims.lost) == (20, 0)
        assert sorted(await plain.listdir(base)) == sorted(f"f{i}" for i in range(20))
        for fs in (creator, plain):
            await fs.close()
    run(scenario())
