"""The kernel keeps directory listings while the mount holds leases (``client/fuse/kernel_listings.py``):
where it opens directories by itself (``client/fuse/kernel_opendir.py``, the default) a listing
read again does not reach the mount at all, where the mount opens them
(``--mount-opens-directories``, ``client/fuse/opendir_reply.py``) only to open the directory;
either way a listing changed anywhere is read afresh at the next open, every time."""

from __future__ import annotations

import asyncio
import os
import random
import re
import time
from typing import Any

import pytest

from tectofs.client import connect
from tectofs.client.fuse import kernel_listings, opendir_reply
from tectofs.client.fuse.kernel_cache import KernelCache
from tectofs.client.fuse.kernel_listings import KernelListings
from tectofs.wire.leases import Recall
from tests.test_fuse import _REASON


def _requests(log_path: str, opcode: str, nodeid: int) -> int:
    """How many ``opcode`` requests for ``nodeid`` the mount's ``--debug`` log shows."""
    with open(log_path, errors="replace") as f:
        return len(re.findall(rf"opcode: {opcode} \(\d+\), nodeid: {nodeid},", f.read()))


@pytest.fixture(params=["kernel-opens", "mount-opens"])
def mount_and_library(make_cluster: Any, tmp_path: Any, request: Any) -> Any:
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster(meta_args=["--lease", "5"])
    log_path = str(tmp_path / "mount.log")
    mount = start_mount_process(cluster.address, str(tmp_path / "mnt"), log_path=log_path, debug=True,
                                kernel_opens_directories=request.param == "kernel-opens")
    fs = connect(cluster.address, credentials=cluster.credential_file, leases=True)
    try:
        deadline = time.monotonic() + 10
        while not (fs.aio.lease_session and fs.aio.lease_session.remaining()):
            assert time.monotonic() < deadline, "no lease within 10 s"
            time.sleep(0.05)
        yield mount.mountpoint, log_path, fs, request.param == "kernel-opens"
    finally:
        fs.close()
        mount.stop()


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_a_listing_read_again_reaches_the_mount_at_most_to_open(mount_and_library: Any) -> None:
    mountpoint, log_path, fs, kernel_opens = mount_and_library
    where = f"{mountpoint}/kept"
    os.mkdir(where)
    names = {f"file-{i:04d}" for i in range(600)}  # several READDIRPLUS pages
    for name in names:
        fs.write_bytes(f"/kept/{name}", b"")
    nodeid = os.stat(where).st_ino
    assert set(os.listdir(where)) == names
    time.sleep(0.2)  # (the log is written by the mount process)
    first = _requests(log_path, "READDIRPLUS", nodeid)
    assert first >= 2, first
    for _ in range(5):
        assert set(os.listdir(where)) == names
        assert len(list(os.scandir(where))) == len(names)
    time.sleep(0.2)
    assert _requests(log_path, "READDIRPLUS", nodeid) == first  # the kernel answered ten listings
    opens = _requests(log_path, "OPENDIR", nodeid)
    if kernel_opens:  # the mount's first OPENDIR, answered ENOSYS, may have been this directory's
        assert opens <= 1 and _requests(log_path, "RELEASEDIR", nodeid) == 0, opens
    else:
        assert opens >= 11, opens
    with open(f"{where}/new", "wb"):  # this mount's own change: the kernel reads the listing again
        pass
    assert set(os.listdir(where)) == names | {"new"}
    os.rename(f"{where}/new", f"{where}/renamed")
    assert set(os.listdir(where)) == names | {"renamed"}
    time.sleep(0.2)
    assert _requests(log_path, "READDIRPLUS", nodeid) > first


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_a_kept_listing_follows_every_change_elsewhere_even_with_the_mtime_put_back(mount_and_library: Any) -> None:
    """The kernel would notice a changed mtime by itself; a change whose directory mtime is put
    back (``tar``, ``rsync -t`` restoring it) it would not: the recall drops the listing."""
    mountpoint, _, fs, _ = mount_and_library
    fs.mkdir("/elsewhere")
    where = f"{mountpoint}/elsewhere"
    stamp = (1_700_000_000.0, 1_700_000_000.0)
    fs.utime("/elsewhere", stamp)
    rng = random.Random(5)
    expected: set[str] = set()
    for step in range(60):
        for _ in range(2):  # listed twice: the second from the kernel's copy
            assert set(os.listdir(where)) == expected, step
        present = sorted(expected)
        kind = rng.choice(["create", "mkdir", "rename", "unlink"] if present else ["create", "mkdir"])
        name = f"n{step}"
        if kind == "create":
            fs.write_bytes(f"/elsewhere/{name}", b"x")
            expected.add(name)
        elif kind == "mkdir":
            fs.mkdir(f"/elsewhere/{name}")
            expected.add(name)
        elif kind == "rename":
            old = rng.choice(present)
            fs.rename(f"/elsewhere/{old}", f"/elsewhere/{name}")
            expected = (expected - {old}) | {name}
        else:
            old = rng.choice(present)
            if fs.stat(f"/elsewhere/{old}").is_dir:
                fs.rmdir(f"/elsewhere/{old}")
            else:
                fs.remove(f"/elsewhere/{old}")
            expected.discard(old)
        fs.utime("/elsewhere", stamp)  # the directory's mtime as it was
        assert os.stat(where).st_mtime == stamp[1], step
        assert set(os.listdir(where)) == expected, (step, kind)


def test_which_listings_a_recall_or_a_lost_lease_drops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernel_listings, "kept_listings_max", 3)
    listings = KernelListings(enabled=True)
    assert listings.opened(10, leased=True) == (True, []) and listings.may_hold(10)
    assert listings.opened(11, leased=False) == (False, []) and not listings.may_hold(11)  # no lease: not kept
    for inode in (12, 13):
        assert listings.opened(inode, leased=True) == (True, [])
    assert listings.opened(14, leased=True) == (True, [10])  # past the bound: the oldest goes
    assert listings.recalled(Recall(id=1, listings=[12, 99])) == [12]
    assert not listings.may_hold(12)
    assert listings.opened(13, leased=False) == (False, []) and not listings.may_hold(13)  # an open without: dropped
    assert listings.recalled(None) == [14]
    assert listings.recalled(None) == []
    off = KernelListings(enabled=False)
    assert off.opened(20, leased=True) == (False, []) and not off.may_hold(20)


class _Session:
    """A lease session as the kernel cache sees it: its epoch, and whether a lease is held."""

    def __init__(self) -> None:
        self.epoch, self.held, self.left = 3, True, 10.0

    def remaining(self) -> float:
        return self.left if self.held else 0.0

    def still(self, epoch: int) -> bool:
        return epoch == self.epoch and self.held


def _dropped_in(monkeypatch: pytest.MonkeyPatch, scenario: Any) -> list[list[int]]:
    """The directory listings the kernel was told to drop while ``scenario(cache, session)`` ran."""
    dropped: list[list[int]] = []
    monkeypatch.setattr(kernel_listings, "drop", lambda directories: dropped.append(list(directories)))
    session = _Session()

    async def run() -> None:
        cache = KernelCache(1.0, leases=session)  # type: ignore[arg-type]
        try:
            await scenario(cache, session)
            await asyncio.sleep(0.05)  # (drops run on the notification thread)
        finally:
            cache.close()

    asyncio.run(run())
    return dropped


def test_a_page_no_lease_covers_is_dropped_after_its_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(cache: KernelCache, session: _Session) -> None:
        assert cache.keep_listing(7)
        cache.listing_replied(7, epoch=3)  # fetched at the current epoch: kept
        cache.listing_replied(7, epoch=2)  # a recall came since it was fetched

    assert _dropped_in(monkeypatch, scenario) == [[7]]


def test_a_listing_read_after_a_recall_that_came_before_it_is_tracked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recall between an OPENDIR that asked to keep and its first page untracks the directory;
    the page, read after the recall under the lease, is kept by the kernel all the same: the
    next recall must drop it."""
    async def scenario(cache: KernelCache, session: _Session) -> None:
        assert cache.keep_listing(7)
        session.epoch = 4
        await cache.recalled(Recall(id=1, listings=[7]), [], [])
        cache.listing_replied(7, epoch=4)
        session.epoch = 5
        await cache.recalled(Recall(id=2, listings=[7]), [], [])

    assert _dropped_in(monkeypatch, scenario)[-1] == [7]


def test_a_page_read_after_the_leases_were_lost_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario(cache: KernelCache, session: _Session) -> None:
        assert cache.keep_listing(7)
        session.epoch, session.held = 4, False
        await cache.recalled(None, [], [])  # the leases were lost: every kept listing goes
        cache.listing_replied(7, epoch=4)  # read with no lease, through the handle opened to keep

    assert _dropped_in(monkeypatch, scenario) == [[7], [7]]


def test_kept_listings_are_dropped_when_the_lease_runs_out_unrenewed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hung metadata service sends no recall and fails no keepalive for a while: where the
    kernel opens directories by itself, only the end of the lease drops what it keeps."""
    async def scenario(cache: KernelCache, session: _Session) -> None:
        session.left = 0.1
        cache.listing_replied(7, epoch=3)
        cache.listing_replied(8, epoch=3)
        await asyncio.sleep(0.05)
        session.left = 0.1  # renewed: nothing goes at the first end
        await asyncio.sleep(0.1)
        session.held = False  # then it runs out
        await asyncio.sleep(0.15)

    assert _dropped_in(monkeypatch, scenario) == [[7, 8]]


def test_a_kernel_opened_directory_is_paged_from_one_listing_until_its_end() -> None:
    from tectofs.client.fuse.readdir import OpenListings

    fetched: list[int] = []

    async def run() -> None:
        listings = OpenListings(attributes_fresh_s=10.0, kernel_opened_max=2)

        async def fetch() -> list[Any]:
            fetched.append(1)
            return [(".", 1), ("..", 1), ("a", 5), ("b", 6)]

        for fh in (101, 102):
            listings.kernel_opened(fh)
            entries, fresh, _ = await listings.page(fh, 0, fetch)
            assert [name for name, _ in entries] == [".", "..", "a", "b"] and fresh
        listings.kernel_opened(101)
        await listings.page(101, 2, fetch)  # the next page of the same listing: not fetched again
        assert len(fetched) == 2
        listings.kernel_opened(103)  # a third: the one read least recently (102) goes
        listings.kernel_opened(102)
        await listings.page(102, 2, fetch)
        assert len(fetched) == 3
        listings.kernel_opened(102)
        entries, _, _ = await listings.page(102, 4, fetch)  # the kernel's read past the last entry
        assert entries[4:] == [] and len(fetched) == 3  # answered from the listing, not fetched again
        listings.kernel_opened(102)
        await listings.page(102, 2, fetch)  # that read let the listing go
        assert len(fetched) == 4

        bounded = OpenListings(attributes_fresh_s=10.0, kernel_opened_entries_max=6)  # 4 entries each
        for fh in (201, 202):
            bounded.kernel_opened(fh)
            await bounded.page(fh, 0, fetch)  # the second's 4 entries put the first's out (8 > 6)
        for fh, fetches in ((202, 6), (201, 7)):
            bounded.kernel_opened(fh)
            await bounded.page(fh, 2, fetch)
            assert len(fetched) == fetches, fh  # 202 was kept, 201 was not

    asyncio.run(run())


class _FakeContainer:
    """Stands for pyfuse3's _Container in the layout checks (the wrong type and size)."""


def test_an_unexpected_pyfuse3_layout_sets_nothing_and_pyfuse3_still_replies(monkeypatch: pytest.MonkeyPatch) -> None:
    """If pyfuse3 changed what it passes, the mount marks nothing (and says so) but every OPENDIR
    still reaches pyfuse3's own function, which replies."""
    import pyfuse3

    handed: list[object] = []
    asked: list[int] = []

    def pyfuse3_own(container: object) -> str:
        handed.append(container)
        return "reply"

    def keep(inode: int) -> bool:
        asked.append(inode)
        return True

    def dispatch(container: object) -> Any:  # as pyfuse3 does: through its module's globals
        return pyfuse3.fuse_opendir_async(container)  # type: ignore[attr-defined]

    monkeypatch.setattr(pyfuse3, "fuse_opendir_async", pyfuse3_own, raising=False)
    monkeypatch.setattr(opendir_reply, "_broken", None)
    assert opendir_reply.install(keep)
    try:
        assert not opendir_reply.install(keep)  # once only
        c = _FakeContainer()
        assert dispatch(c) == "reply" and handed == [c]
        assert not opendir_reply.working() and asked == []  # found wrong: never asked, never written
        assert dispatch(c) == "reply" and handed == [c, c]
    finally:
        opendir_reply.uninstall()
    assert dispatch(c) == "reply" and handed == [c, c, c]
