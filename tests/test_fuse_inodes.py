"""The mount's inode table (``client/fuse/inodes.py``) and kernel cache policy
(``client/fuse/kernel_cache.py``), in process; then, through a real mount, that paths follow
a renamed directory and that any name of a hard link serves once another is gone."""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

from tectofs.errors import StaleFile
from tests.test_fuse import _fuse_unavailable

pyfuse3 = pytest.importorskip("pyfuse3")

from tectofs.client.fuse import kernel_cache  # noqa: E402
from tectofs.client.fuse.inodes import ROOT_INODE, InodeTable  # noqa: E402
from tectofs.client.fuse.kernel_cache import KernelCache  # noqa: E402


def test_paths_walk_parents_so_a_renamed_directory_moves_everything_below_it() -> None:
    table = InodeTable()
    assert table.path(ROOT_INODE) == "/"
    table.looked_up(ROOT_INODE, "a", 2)
    table.looked_up(2, "b", 3)
    table.looked_up(3, "f", 4)
    assert table.path(4) == "/a/b/f" and table.child_path(3, "g") == "/a/b/g" and table.child_path(1, "x") == "/x"
    table.moved(ROOT_INODE, "a", ROOT_INODE, "z")
    assert table.path(4) == "/z/b/f" and table.path(3) == "/z/b"
    table.moved(2, "b", ROOT_INODE, "top")  # a subdirectory moves up: its files follow
    assert table.path(4) == "/top/f" and table.ino_of(ROOT_INODE, "top") == 3 and table.ino_of(2, "b") is None


def test_a_rename_over_a_name_and_an_unlink_make_that_name_stale() -> None:
    table = InodeTable()
    table.looked_up(ROOT_INODE, "old", 5)
    table.looked_up(ROOT_INODE, "new", 6)
    table.moved(ROOT_INODE, "old", ROOT_INODE, "new")
    assert table.path(5) == "/new"
    with pytest.raises(StaleFile) as replaced:
        table.path(6)  # the kernel still holds it (lookup count 1), but it has no name
    assert replaced.value.errno == errno.ESTALE
    table.removed(ROOT_INODE, "new")
    with pytest.raises(StaleFile):
        table.path(5)
    table.exchanged(ROOT_INODE, "nothing", ROOT_INODE, "either")  # unknown names: nothing to do
    assert len(table) == 3  # root and the two inodes the kernel still holds


def test_hard_links_are_one_inode_and_any_name_left_serves() -> None:
    table = InodeTable()
    table.looked_up(ROOT_INODE, "d", 2)
    table.looked_up(2, "x", 7)
    table.looked_up(ROOT_INODE, "y", 7)  # a second name of the same file
    assert table.path(7) == "/y"  # the one confirmed last
    table.looked_up(2, "x", 7)
    assert table.path(7) == "/d/x"
    table.removed(2, "x")
    assert table.path(7) == "/y"
    table.looked_up(ROOT_INODE, "y", 8)  # another client replaced /y: that name is 8's now
    with pytest.raises(StaleFile):
        table.path(7)
    assert table.path(8) == "/y"


def test_forget_drops_an_inode_only_when_the_kernel_holds_nothing_of_it_or_below_it() -> None:
    table = InodeTable()
    table.looked_up(ROOT_INODE, "dir", 2)
    table.looked_up(2, "file", 3, count=2)  # e.g. a lookup and a listing
    table.forget(2, 1)  # the directory's last lookup goes first: it stays for its child's path
    assert 2 in table and table.path(3) == "/dir/file"
    table.forget(3, 1)
    assert 3 in table
    table.forget(3, 1)
    assert 3 not in table and 2 not in table and len(table) == 1
    table.forget(ROOT_INODE, 10)  # the root is never forgotten
    table.forget(99, 1)  # an inode never seen: nothing
    assert table.path(ROOT_INODE) == "/" and len(table) == 1


def test_exchange_swaps_the_inodes_of_two_names() -> None:
    table = InodeTable()
    table.looked_up(ROOT_INODE, "current", 2)
    table.looked_up(ROOT_INODE, "next", 3)
    table.looked_up(3, "weights", 4)
    table.exchanged(ROOT_INODE, "current", ROOT_INODE, "next")
    assert (table.path(2), table.path(3), table.path(4)) == ("/next", "/current", "/current/weights")
    assert table.ino_of(ROOT_INODE, "current") == 3 and len(table) == 4


def test_a_parent_loop_is_stale_not_a_hang() -> None:
    table = InodeTable()
    table.looked_up(ROOT_INODE, "a", 2)
    table.looked_up(2, "b", 3)
    table.looked_up(3, "a", 2)  # what a stale view of another client's renames could say
    with pytest.raises(StaleFile):
        table.path(3)


def test_pages_are_kept_across_opens_only_while_they_hold_the_version_an_open_sees() -> None:
    """``page_cache.py``: keep_cache only for the recorded version, with no writer and no
    handle of another version open or closed since."""
    from types import SimpleNamespace

    from tectofs.client.fuse.page_cache import PageCacheVersions

    def file(ctime: float, writable: bool = False, size: int = 10) -> Any:
        return SimpleNamespace(ino=7, writable=writable, attrs=SimpleNamespace(size=size, mtime=1.0, ctime=ctime))

    pages = PageCacheVersions()
    assert not pages.opened(file(1.0), [])  # nothing recorded: the kernel drops what it has
    assert pages.opened(file(1.0), [])  # the same version again: kept
    assert not pages.opened(file(2.0), [])  # committed since (same size and mtime, new ctime)
    assert pages.opened(file(2.0), [])
    old = file(2.0)
    assert not pages.opened(file(3.0), [old])  # a handle of version 2 still open: no record
    assert not pages.opened(file(3.0), [])
    pages.closed(old)  # it may have read version-2 pages back in after that open
    assert not pages.opened(file(3.0), [])
    assert pages.opened(file(3.0), [])
    assert not pages.opened(file(3.0, writable=True), [])  # a writer of this mount: the record goes
    assert not pages.opened(file(3.0), [])


def test_kernel_cache_policy_and_invalidations(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = KernelCache(attr_timeout_s=1.5)
    entry = cache.timeouts(pyfuse3.EntryAttributes())
    assert (entry.attr_timeout, entry.entry_timeout) == (1.5, 1.5) and cache.caches_names
    stale = cache.timeouts(pyfuse3.EntryAttributes(), fresh=False)
    assert (stale.attr_timeout, stale.entry_timeout) == (0, 0)
    assert cache.absent(1, "missing") is None  # no negative caching: the lookup fails with ENOENT
    service_checks = KernelCache(attr_timeout_s=1.0, entry_timeout_s=0.0)
    assert service_checks.timeouts(pyfuse3.EntryAttributes()).entry_timeout == 0 and not service_checks.caches_names

    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(kernel_cache.pyfuse3, "invalidate_entry_async",
                        lambda parent, name, ignore_enoent=False: calls.append(("entry", parent, name, ignore_enoent)))

    def invalidate_inode(inode: int, attr_only: bool = False) -> None:
        calls.append(("inode", inode, attr_only))
        raise OSError(errno.ENOENT, "not cached")  # the kernel does not hold it: not an error for the mount

    monkeypatch.setattr(kernel_cache.pyfuse3, "invalidate_inode", invalidate_inode)
    cache.invalidate_entry(5, "name\udcff")
    cache.invalidate_inode(9)
    assert calls == [("entry", 5, b"name\xff", True), ("inode", 9, True)]

    assert not cache.changed_since_reported(9, 10, 1.0)  # never reported: nothing to drop
    cache.reported(9, 10, 1.0)
    assert not cache.changed_since_reported(9, 10, 1.0)
    assert cache.changed_since_reported(9, 11, 1.0) and cache.changed_since_reported(9, 10, 2.0)


_REASON = _fuse_unavailable()


@pytest.mark.fuse
@pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
def test_inodes_keep_their_paths_through_renames_and_links(cluster: Any, tmp_path: Any) -> None:
    """A directory held open keeps working after its parent is renamed (its path is walked
    anew); a file keeps answering by its other name once the name it was reached by is gone."""
    from tectofs.client.fuse import start_mount_process

    mnt = str(tmp_path / "mnt")
    with start_mount_process(cluster.address, mnt, log_path=str(tmp_path / "mount.log")):
        os.makedirs(f"{mnt}/inodes/a/b")
        held = os.open(f"{mnt}/inodes/a/b", os.O_DIRECTORY)
        try:
            os.rename(f"{mnt}/inodes/a", f"{mnt}/inodes/z")
            out = os.open("made-after", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=held)
            os.write(out, b"here")
            os.close(out)
            assert cluster.fs.read_bytes("/inodes/z/b/made-after") == b"here"
            assert os.listdir(held) == ["made-after"]
        finally:
            os.close(held)

        with open(f"{mnt}/inodes/x", "wb") as f:
            f.write(b"linked")
        os.link(f"{mnt}/inodes/x", f"{mnt}/inodes/y")  # y: the name the mount confirmed last
        os.unlink(f"{mnt}/inodes/y")
        os.chmod(f"{mnt}/inodes/x", 0o600)  # the inode's path is x again
        assert cluster.fs.stat("/inodes/x").mode & 0o7777 == 0o600 and os.stat(f"{mnt}/inodes/x").st_nlink == 1
        with open(f"{mnt}/inodes/x", "rb") as f:
            assert f.read() == b"linked"


def test_a_write_only_descriptor_of_a_file_without_privileges_bypasses_the_page_cache() -> None:
    from tectofs.client.fuse.file_operations import open_reply, writes_direct
    from tectofs.modes import killed_by_write

    write_only = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    assert writes_direct(write_only, 0o100644, 0)
    assert writes_direct(write_only, 0o102644, 0)  # set-group-ID without group execute: mandatory locking, kept
    for flags, mode, xattrs in ((os.O_RDONLY, 0o644, 0), (os.O_RDWR, 0o644, 0), (write_only, 0o104755, 0),
                                (write_only, 0o102755, 0), (write_only, 0o644, 1),
                                (write_only, 0o644, None)):
        assert not writes_direct(flags, mode, xattrs), (flags, oct(mode), xattrs)
    assert killed_by_write(0o106755) == 0o6000 and killed_by_write(0o102755) == 0o2000
    assert killed_by_write(0o102745) == 0 and killed_by_write(0o100755) == 0
    written = open_reply(5, True, keep_cache=True)
    assert (written.fh, written.direct_io, written.keep_cache) == (5, True, False)
    read = open_reply(6, False, keep_cache=True)
    assert (read.direct_io, read.keep_cache) == (False, True)
