"""POSIX permissions in the metadata store (``tectofs/store/access.py``) and its users table:
the store alone, no processes. Every operation takes ``caller``; ``None`` is trusted."""

from __future__ import annotations

import errno
import stat

import msgspec
import pytest

from tectofs.errors import AlreadyExists, InvalidArgument, NotFound, NotPermitted, PermissionDenied
from tectofs.store import SqlStore
from tectofs.store.access import ROOT, Caller
from tectofs.store.dialect import PostgresDialect, SqliteDialect
from tectofs.wire.messages import CreateReply, WrittenBlock, convert

ALICE = Caller(1000, 1000)
BOB = Caller(1001, 1001)
CAROL = Caller(1002, 1002)
NOBODY = Caller(65534, 65534)
SECRET = "ab" * 32


@pytest.fixture
def store(tmp_path):
    s = SqlStore(SqliteDialect(str(tmp_path / "meta.db")), "rep(2)", 1 << 20)
    for i in range(2):
        s.register_server(f"uuid-{i}", f"127.0.0.1:{1000 + i}", 1 << 40, 0)
    yield s
    s.close()


def _dir(store, parts, mode, uid=0, gid=0):
    """A directory made by a trusted caller, with exactly ``mode`` (sticky, setgid bits too)."""
    store.mkdir(parts, mode, uid, gid)
    return store.setattr(parts, mode=mode)


def _write(store, ino, caller, writer=5):
    """Allocate a block and commit it as ``caller`` (the write path's store calls)."""
    (b,) = store.allocate(ino, 1, writer=writer, caller=caller)
    chunks = [{"position": p, "server_id": s.server_id, "length": 10, "crc": 1}
              for p, s in enumerate(b.servers[:2])]
    block = {"idx": 0, "block_id": b.block_id, "length": 10, "chunks": chunks}
    store.stage(ino, writer, [convert(block, WrittenBlock)], caller=caller)
    store.renew(ino, writer=writer, caller=caller)
    return store.commit(ino, 10, [], replace=False, writer=writer, caller=caller)


# ---------------------------------------------------------------------------- reading


def test_nobody_cannot_read_roots_private_file(store):
    f = store.create(["secret"], 0o600)
    with pytest.raises(PermissionDenied) as e:
        store.layout(["secret"], reader=7, caller=NOBODY)
    assert str(e.value) == "/secret: permission denied (uid 65534 needs read permission)"
    assert e.value.errno == errno.EACCES and not isinstance(e.value, NotPermitted)
    with pytest.raises(PermissionDenied, match=f"inode {f.ino}: permission denied .*needs read permission"):
        store.layout(ino=f.ino, reader=7, caller=NOBODY)
    with pytest.raises(PermissionDenied, match="needs read or write permission"):
        store.layout(ino=f.ino, caller=NOBODY)  # no reader: read or write permission
    with pytest.raises(PermissionDenied):
        store.renew(f.ino, reader=7, caller=NOBODY)
    assert store._one("SELECT COUNT(*) FROM read_leases")[0] == 0  # the refused layout took no lease
    assert store.layout(["secret"], reader=7, caller=ROOT).attrs.ino == f.ino
    assert store.getattr_ino(f.ino, caller=NOBODY).mode & 0o777 == 0o600  # getattr needs nothing


def test_layout_without_reader_accepts_write_permission(store):
    f = store.create(["drop"], 0o622)  # others may write, not read
    assert store.layout(ino=f.ino, caller=NOBODY).attrs.ino == f.ino
    with pytest.raises(PermissionDenied):
        store.layout(ino=f.ino, reader=3, caller=NOBODY)


def test_readdir_needs_read_permission(store):
    _dir(store, ["d"], 0o711)
    store.create(["d", "f"])
    with pytest.raises(PermissionDenied, match=r"^/d: permission denied \(uid 1000 needs read permission\)$"):
        store.readdir(["d"], caller=ALICE)
    assert store.lookup(["d", "f"], caller=ALICE).kind == "file"  # x without r: names known still resolve
    assert [e.name for e in store.readdir([], caller=ALICE).entries] == ["d"]


def test_path_search_needs_x_on_every_directory(store):
    _dir(store, ["a"], 0o755, uid=1000, gid=1000)
    _dir(store, ["a", "d"], 0o600, uid=1000, gid=1000)
    store.create(["a", "d", "f"], 0o644, 1000, 1000)
    store.create(["a", "h"], 0o644, 1000, 1000)
    with pytest.raises(PermissionDenied) as e:
        store.lookup(["a", "d", "f"], caller=ALICE)
    assert str(e.value) == "/a/d/f: permission denied (uid 1000 needs search permission on /a/d)"
    assert store.lookup(["a", "d"], caller=ALICE).ino  # the directory itself is reached
    assert [e.name for e in store.readdir(["a", "d"], caller=ALICE).entries] == ["f"]  # r without x lists names
    for op, args in ((store.layout, (["a", "d", "f"],)), (store.create, (["a", "d", "g"],)),
                     (store.mkdir, (["a", "d", "e"],)), (store.unlink, (["a", "d", "f"],)),
                     (store.readdir, (["a", "d", "e"],)), (store.truncate, (["a", "d", "f"], 0)),
                     (store.setattr, (["a", "d", "f"], 0o600)), (store.symlink, (["a", "d", "l"], "f")),
                     (store.rename, (["a", "d", "f"], ["a", "g"])), (store.rename, (["a", "h"], ["a", "d", "g"])),
                     (store.exchange, (["a"], ["a", "d", "f"]))):
        with pytest.raises(PermissionDenied, match="search permission on /a/d"):
            op(*args, caller=ALICE)
    assert store.lookup(["a", "d", "f"], caller=ROOT).kind == "file"


# ---------------------------------------------------------------------------- names


def test_creating_needs_write_and_search_on_the_parent(store):
    _dir(store, ["private"], 0o700)
    _dir(store, ["pub"], 0o755)
    with pytest.raises(PermissionDenied, match=r"^/private/f: .*needs search permission on /private\)$"):
        store.create(["private", "f"], caller=NOBODY)
    with pytest.raises(PermissionDenied, match=r"^/pub/f: .*needs write and search permission on /pub\)$"):
        store.create(["pub", "f"], caller=NOBODY)
    with pytest.raises(PermissionDenied):
        store.mkdir(["pub", "d"], caller=NOBODY)
    with pytest.raises(PermissionDenied):
        store.symlink(["pub", "l"], "/x", caller=NOBODY)
    assert store._one("SELECT COUNT(*) FROM inodes")[0] == 3
    # An existing name: EEXIST before EACCES (Linux), and opening it needs no write permission.
    existing = store.create(["pub", "f"], 0o644)
    with pytest.raises(AlreadyExists):
        store.create(["pub", "f"], exclusive=True, caller=NOBODY)
    with pytest.raises(AlreadyExists):
        store.mkdir(["pub"], caller=NOBODY)
    assert store.mkdir(["pub"], exist_ok=True, caller=NOBODY).kind == "dir"
    directory = store.lookup(["pub"])
    assert store.create_file(["pub", "f"], caller=NOBODY) == CreateReply(
        attrs=existing, created=False, directory=directory, directory_ctime_before=directory.ctime,
        inline_max=store.inline_max)


def test_new_inodes_belong_to_the_caller(store):
    _dir(store, ["home"], 0o777)
    f = store.create(["home", "f"], 0o640, 0, 0, caller=ALICE)  # the request's uid/gid are ignored
    d = store.mkdir(["home", "d"], 0o750, 5, 5, caller=ALICE)
    s = store.symlink(["home", "l"], "f", 5, 5, caller=Caller(1000, 77, frozenset({1, 2})))
    assert (f.uid, f.gid, f.mode) == (1000, 1000, stat.S_IFREG | 0o640)
    assert (d.uid, d.gid, d.mode) == (1000, 1000, stat.S_IFDIR | 0o750)
    assert (s.uid, s.gid) == (1000, 77)


def test_setgid_directory_gives_its_group(store):
    _dir(store, ["proj"], 0o2777, gid=500)
    member = Caller(1000, 1000, frozenset({500}))
    f = store.create(["proj", "f"], 0o2755, caller=member)
    d = store.mkdir(["proj", "d"], 0o755, caller=member)
    assert (f.uid, f.gid, f.mode) == (1000, 500, stat.S_IFREG | 0o2755)
    assert (d.uid, d.gid, d.mode) == (1000, 500, stat.S_IFDIR | stat.S_ISGID | 0o755)
    inner = store.create(["proj", "d", "g"], 0o644, caller=member)  # inherited again
    assert inner.gid == 500
    # Outside the group: the group is still the directory's, but no setgid executable for it.
    g = store.create(["proj", "g"], 0o2755, caller=BOB)
    assert (g.uid, g.gid, g.mode) == (1001, 500, stat.S_IFREG | 0o755)
    plain = store.mkdir(["plain"], 0o777)
    assert plain.mode & stat.S_ISGID == 0
    assert store.create(["plain", "h"], caller=member).gid == 1000


def test_unlinking_needs_write_on_the_directory(store):
    _dir(store, ["pub"], 0o755)
    store.create(["pub", "f"])
    with pytest.raises(PermissionDenied, match=r"^/pub/f: .*needs write and search permission on /pub\)$"):
        store.unlink(["pub", "f"], caller=NOBODY)
    store.mkdir(["pub", "d"])
    with pytest.raises(PermissionDenied):
        store.rmdir(["pub", "d"], caller=NOBODY)
    with pytest.raises(PermissionDenied):
        store.rename(["pub", "f"], ["g"], caller=NOBODY)
    assert [e.name for e in store.readdir(["pub"]).entries] == ["d", "f"]
    store.unlink(["pub", "f"], caller=ROOT)
    store.rmdir(["pub", "d"], caller=ROOT)
    assert store.readdir(["pub"]).entries == []


def test_sticky_directory(store):
    _dir(store, ["tmp"], 0o1777, uid=1002, gid=1002)  # owned by CAROL
    store.create(["tmp", "a"], caller=ALICE)
    store.create(["tmp", "b"], caller=BOB)
    store.create(["tmp", "c"], caller=BOB)
    with pytest.raises(NotPermitted) as e:
        store.unlink(["tmp", "b"], caller=ALICE)
    assert e.value.errno == errno.EPERM
    assert "/tmp is sticky" in str(e.value) and "uid 1001" in str(e.value)
    with pytest.raises(NotPermitted):
        store.rename(["tmp", "a"], ["tmp", "b"], caller=ALICE)  # replacing B's file
    with pytest.raises(NotPermitted):
        store.rename(["tmp", "b"], ["tmp", "z"], caller=ALICE)  # moving B's file
    with pytest.raises(NotPermitted):
        store.exchange(["tmp", "a"], ["tmp", "b"], caller=ALICE)
    assert store.lookup(["tmp", "b"]).uid == 1001
    store.rename(["tmp", "a"], ["tmp", "a2"], caller=ALICE)  # its own
    store.unlink(["tmp", "a2"], caller=ALICE)
    store.unlink(["tmp", "b"], caller=CAROL)  # the directory's owner
    store.unlink(["tmp", "c"], caller=ROOT)
    assert store.readdir(["tmp"]).entries == []


def test_renaming_a_directory_to_another_parent_needs_write_on_it(store):
    _dir(store, ["x"], 0o777)
    _dir(store, ["y"], 0o777)
    _dir(store, ["x", "ro"], 0o555, uid=1000, gid=1000)
    store.rename(["x", "ro"], ["x", "ro2"], caller=BOB)  # same parent: its '..' is unchanged
    for who in (BOB, ALICE):  # its owner too: r-x (Linux)
        with pytest.raises(PermissionDenied, match=r"^/x/ro2: permission denied \(uid 10\d\d needs write\b"):
            store.rename(["x", "ro2"], ["y", "ro"], caller=who)
    store.create(["x", "f"], 0o444, 1000, 1000)
    store.rename(["x", "f"], ["y", "f"], caller=BOB)  # a file has no '..'
    store.setattr(["x", "ro2"], mode=0o755, caller=ALICE)
    store.rename(["x", "ro2"], ["y", "ro"], caller=ALICE)
    store.rename(["y", "ro"], ["x", "ro"], caller=ROOT)
    assert store.lookup(["x", "ro"]).parent == store.lookup(["x"]).ino


def test_exchange_checks_both_sides(store):
    _dir(store, ["mine"], 0o755, uid=1000, gid=1000)
    _dir(store, ["theirs"], 0o755, uid=1001, gid=1001)
    store.create(["mine", "a"], caller=ALICE)
    store.create(["theirs", "b"], caller=BOB)
    with pytest.raises(PermissionDenied, match=r"^/theirs/b: .*on /theirs\)$"):
        store.exchange(["mine", "a"], ["theirs", "b"], caller=ALICE)
    store.setattr(["theirs"], mode=0o777, caller=BOB)
    store.exchange(["mine", "a"], ["theirs", "b"], caller=ALICE)
    assert store.lookup(["mine", "a"]).uid == 1001


# ---------------------------------------------------------------------------- attributes


def test_chmod_only_by_owner_or_root(store):
    store.create(["f"], 0o644, 1000, 1000)
    with pytest.raises(NotPermitted) as e:
        store.setattr(["f"], mode=0o777, caller=BOB)
    assert e.value.errno == errno.EPERM and "only its owner, uid 1000, or root may chmod" in str(e.value)
    assert store.setattr(["f"], mode=0o600, caller=ALICE).mode == stat.S_IFREG | 0o600
    assert store.setattr(["f"], mode=0o640, caller=ROOT).mode == stat.S_IFREG | 0o640
    # A non-root owner outside the file's group cannot make it setgid.
    store.create(["g"], 0o644, 1000, 500)
    assert store.setattr(["g"], mode=0o2755, caller=ALICE).mode == stat.S_IFREG | 0o755
    assert store.setattr(["g"], mode=0o2755, caller=Caller(1000, 1000, frozenset({500}))).mode == (
        stat.S_IFREG | 0o2755)


def test_chown_and_chgrp(store):
    store.create(["f"], 0o6755, 1000, 1000)
    with pytest.raises(NotPermitted, match="only root may change the owner"):
        store.setattr(["f"], uid=1001, caller=ALICE)
    with pytest.raises(NotPermitted, match="uid 1000 is not in group 42"):
        store.setattr(["f"], gid=42, caller=ALICE)
    with pytest.raises(NotPermitted):
        store.setattr(["f"], gid=1001, caller=BOB)  # not the owner, even to its own group
    member = Caller(1000, 1000, frozenset({42}))
    after = store.setattr(["f"], gid=42, caller=member)
    assert (after.uid, after.gid, after.mode) == (1000, 42, stat.S_IFREG | 0o755)  # suid/sgid cleared
    assert store.setattr(["f"], uid=1000, caller=ALICE).uid == 1000  # "changing" to itself
    store.setattr(["f"], mode=0o6755)
    after = store.setattr(["f"], uid=7, gid=8, caller=ROOT)
    assert (after.uid, after.gid, after.mode) == (7, 8, stat.S_IFREG | 0o6755)
    # A directory keeps its setgid bit through a chgrp (new entries inherit the new group).
    _dir(store, ["d"], 0o2775, uid=1000, gid=1000)
    assert store.setattr(["d"], gid=42, caller=member).mode == stat.S_IFDIR | 0o2775


def test_times_by_owner_or_writer(store):
    store.create(["f"], 0o664, 1000, 500)
    assert store.setattr(["f"], atime=1.0, mtime=2.0, caller=ALICE).mtime == 2.0
    assert store.setattr(["f"], mtime=3.0, caller=Caller(1001, 1001, frozenset({500}))).mtime == 3.0
    with pytest.raises(PermissionDenied, match="needs write permission"):
        store.setattr(["f"], mtime=4.0, caller=BOB)
    assert store.lookup(["f"]).mtime == 3.0


def test_set_policy_by_owner_or_root(store):
    _dir(store, ["d"], 0o777, uid=1000, gid=1000)
    with pytest.raises(NotPermitted, match="set its policy"):
        store.set_policy(["d"], "rep(1)", None, caller=BOB)
    assert store.set_policy(["d"], "rep(1)", None, caller=ALICE).policy == "rep(1)"
    assert store.set_policy(["d"], "rep(2)", None, caller=ROOT).policy == "rep(2)"


# ---------------------------------------------------------------------------- data


def test_owner_writes_a_read_only_file_it_created(store):
    _dir(store, ["home"], 0o777)
    f = store.create(["home", "f"], 0o444, caller=ALICE)  # open(O_CREAT | O_WRONLY, 0o444)
    assert _write(store, f.ino, ALICE).attrs.size == 10
    with pytest.raises(PermissionDenied):
        store.truncate(["home", "f"], 0, caller=ALICE)  # but truncate(2) needs the w bit (Linux)


def test_others_need_write_permission_to_write(store):
    f = store.create(["f"], 0o644, 1000, 1000)
    with pytest.raises(PermissionDenied, match=rf"^inode {f.ino}: permission denied \(uid 1001 needs write"):
        store.allocate(f.ino, 1, caller=BOB)
    for op in (lambda: store.stage(f.ino, 5, [], caller=BOB),
               lambda: store.commit(f.ino, 0, [], replace=True, caller=BOB),
               lambda: store.renew(f.ino, writer=5, caller=BOB)):
        with pytest.raises(PermissionDenied):
            op()
    assert store._one("SELECT COUNT(*) FROM allocations")[0] == 0
    assert store.renew(f.ino, reader=9, caller=BOB) == 1  # reading is allowed
    store.setattr(["f"], mode=0o666)
    assert _write(store, f.ino, BOB).attrs.size == 10
    assert store.renew(10**9, reader=9, caller=BOB) == 1  # a file gone (open-unlinked): nothing to check


def test_truncate_needs_write(store):
    store.create(["f"], 0o644, 1000, 1000)
    with pytest.raises(PermissionDenied, match=r"^/f: permission denied \(uid 1001 needs write permission\)$"):
        store.truncate(["f"], 5, caller=BOB)
    assert store.truncate(["f"], 5, caller=ALICE).size == 5
    assert store.truncate(["f"], 6, caller=ROOT).size == 6


# ---------------------------------------------------------------------------- classes, root, None


def test_group_bits_via_supplementary_groups(store):
    store.create(["f"], 0o640, 0, 500)
    with pytest.raises(PermissionDenied):
        store.layout(["f"], reader=1, caller=ALICE)
    assert store.layout(["f"], reader=1, caller=Caller(1000, 1000, frozenset({500}))).attrs.gid == 500
    assert store.layout(["f"], reader=1, caller=Caller(1000, 500)).attrs.gid == 500  # primary group
    with pytest.raises(PermissionDenied):  # read, not write
        store.allocate(store.lookup(["f"]).ino, 1, caller=Caller(1000, 500))
    # Only the first class that matches counts: an owner without owner bits is refused.
    store.create(["g"], 0o077, 1000, 500)
    with pytest.raises(PermissionDenied):
        store.layout(["g"], reader=1, caller=Caller(1000, 500))
    assert store.layout(["g"], reader=1, caller=Caller(1001, 500)).attrs.ino


def test_caller_groups_may_be_any_iterable():
    assert Caller(1, 2, [3, 3]).groups == frozenset({3})  # type: ignore[arg-type]
    assert ROOT.is_root and not ALICE.is_root and ROOT == Caller(0, 0)


def test_root_overrides(store):
    _dir(store, ["vault"], 0o000, uid=1000, gid=1000)
    store.create(["vault", "f"], 0o000, 1000, 1000)
    _dir(store, ["vault", "tmp"], 0o1000, uid=1000, gid=1000)
    store.create(["vault", "tmp", "x"], 0o000, 1001, 1001)
    f = store.lookup(["vault", "f"], caller=ROOT)
    assert store.readdir(["vault"], caller=ROOT).entries
    assert store.layout(["vault", "f"], reader=1, caller=ROOT).attrs.ino == f.ino
    _write(store, f.ino, ROOT)
    store.truncate(["vault", "f"], 0, caller=ROOT)
    store.setattr(["vault", "f"], mode=0o600, uid=1, gid=2, caller=ROOT)
    store.create(["vault", "g"], caller=ROOT)
    store.unlink(["vault", "tmp", "x"], caller=ROOT)
    store.rename(["vault", "f"], ["vault", "f2"], caller=ROOT)
    store.set_policy(["vault"], "rep(1)", None, caller=ROOT)
    assert store.lookup(["vault", "g"]).uid == 0


def test_no_caller_is_trusted(store):
    _dir(store, ["vault"], 0o000, uid=1000, gid=1000)
    _dir(store, ["vault", "tmp"], 0o1000, uid=1000, gid=1000)
    f = store.create(["vault", "f"], 0o000, 1001, 1002)  # the request's owner is kept
    assert (f.uid, f.gid) == (1001, 1002)
    store.create(["vault", "tmp", "x"], 0o000, 1001, 1001)
    assert store.mkdir(["vault", "d"], 0o2755, 3, 4).mode == stat.S_IFDIR | 0o2755
    sub = store.mkdir(["vault", "d", "e"], 0o755, 5, 6)  # no setgid inheritance without a caller
    assert (sub.uid, sub.gid, sub.mode) == (5, 6, stat.S_IFDIR | 0o755)
    store.readdir(["vault"])
    store.layout(["vault", "f"], reader=1)
    _write(store, f.ino, None)
    store.truncate(["vault", "f"], 0)
    assert store.setattr(["vault", "f"], mode=0o6755, uid=9, gid=9).mode == stat.S_IFREG | 0o6755
    store.unlink(["vault", "tmp", "x"])
    store.rename(["vault", "f"], ["vault", "tmp", "f"])
    store.set_policy(["vault"], "rep(1)", None)


# ---------------------------------------------------------------------------- users


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def user_store(request, tmp_path):
    if request.param == "sqlite":
        s = SqlStore(SqliteDialect(str(tmp_path / "users.db")))
    else:
        from tectofs.testing.postgres import new_database

        s = SqlStore(PostgresDialect(new_database(request.getfixturevalue("postgres_server"))))
    yield s
    s.close()


def test_users_crud(user_store):
    s = user_store
    alice = s.user_add("alice", 1000, 1000, [20, 5, 20], admin=True, secret_hex=SECRET, s3_access_key="TFSAAAA",
                       s3_secret="s3/sec+ret")
    assert alice.name == "alice" and (alice.uid, alice.gid, alice.groups) == (1000, 1000, [5, 20])
    assert (alice.admin, alice.proxy, alice.secret, alice.s3_access_key, alice.s3_secret) == (
        True, False, SECRET, "TFSAAAA", "s3/sec+ret")
    assert isinstance(alice.created, float)
    assert s.user_get("alice") == alice
    assert s.user_by_s3_key("TFSAAAA") == alice
    assert s.user_by_s3_key("TFSBBBB") is None
    bob = s.user_add("bob.b-2_x", 4294967294, 0, [], proxy=True, secret_hex="CD" * 16)
    assert bob.secret == "cd" * 16 and bob.proxy and bob.s3_access_key is None and bob.s3_secret is None
    listed = s.user_list()
    assert [u.name for u in listed] == ["alice", "bob.b-2_x"]
    assert all(u.secret is None and u.s3_secret is None for u in listed)
    assert listed[0] == msgspec.structs.replace(alice, secret=None, s3_secret=None)
    with pytest.raises(AlreadyExists):
        s.user_add("alice", 1, 1, [], secret_hex=SECRET)
    with pytest.raises(AlreadyExists, match="S3 access key"):
        s.user_add("carol", 1, 1, [], secret_hex=SECRET, s3_access_key="TFSAAAA", s3_secret="x")
    s.user_remove("alice")
    assert s.user_get("alice") is None and s.user_by_s3_key("TFSAAAA") is None
    with pytest.raises(NotFound):
        s.user_remove("alice")
    assert [u.name for u in s.user_list()] == ["bob.b-2_x"]
    s.user_add("alice", 1000, 1000, [], secret_hex=SECRET)  # the name is free again


@pytest.mark.parametrize("args, kwargs", [
    (("root", 0, 0, []), {}),
    (("", 1, 1, []), {}),
    (("a" * 65, 1, 1, []), {}),
    (("a b", 1, 1, []), {}),
    (("a/b", 1, 1, []), {}),
    (("é", 1, 1, []), {}),
    (("a", -1, 1, []), {}),
    (("a", 1, 2**32 - 1, []), {}),
    (("a", True, 1, []), {}),
    (("a", 1, 1, list(range(65))), {}),
    (("a", 1, 1, [2**32]), {}),
    (("a", 1, 1, []), {"secret_hex": ""}),
    (("a", 1, 1, []), {"secret_hex": "ab" * 8}),
    (("a", 1, 1, []), {"secret_hex": "zz" * 16}),
    (("a", 1, 1, []), {"secret_hex": "a" * 33}),
    (("a", 1, 1, []), {"s3_access_key": "K"}),
    (("a", 1, 1, []), {"s3_access_key": "K K", "s3_secret": "x"}),
    (("a", 1, 1, []), {"s3_access_key": "K", "s3_secret": ""}),
])
def test_user_add_refuses(store, args, kwargs):
    with pytest.raises(InvalidArgument):
        store.user_add(*args, **{"secret_hex": SECRET, **kwargs})
    assert store.user_list() == []


def test_user_add_accepts_the_limits(store):
    store.user_add("a" * 64, 0, 2**32 - 2, list(range(64)), secret_hex=SECRET)
    assert store.user_get("a" * 64).groups == list(range(64))


def test_special_files_are_metadata_and_only_root_makes_devices(store):
    import stat as statmod

    from tectofs.errors import InvalidArgument, NotPermitted

    _dir(store, ["open"], 0o1777)
    user = Caller(1000, 1000)
    fifo = store.mknod(["open", "fifo"], statmod.S_IFIFO | 0o640, caller=user)
    sock = store.mknod(["open", "sock"], statmod.S_IFSOCK | 0o600, rdev=99, caller=user)
    assert (fifo.kind, fifo.mode, fifo.uid, fifo.rdev) == ("fifo", statmod.S_IFIFO | 0o640, 1000, 0)
    assert (sock.kind, sock.rdev) == ("socket", 0)  # only device nodes keep a device number
    with pytest.raises(NotPermitted, match="only root"):
        store.mknod(["open", "null"], statmod.S_IFCHR | 0o666, rdev=0x103, caller=user)
    dev = store.mknod(["open", "null"], statmod.S_IFCHR | 0o666, rdev=0x103, caller=ROOT)
    blk = store.mknod(["open", "disk"], statmod.S_IFBLK | 0o660, rdev=0x800)
    assert (dev.kind, dev.rdev, blk.kind, blk.rdev) == ("char", 0x103, "block", 0x800)
    with pytest.raises(InvalidArgument, match="not mode"):
        store.mknod(["open", "reg"], statmod.S_IFREG | 0o644)
    with pytest.raises(PermissionDenied):
        store.mknod(["fifo-at-root"], statmod.S_IFIFO | 0o644, caller=user)  # / is 0755 root's
    store.rename(["open", "fifo"], ["open", "fifo2"], caller=user)
    assert store.lookup(["open", "fifo2"]).kind == "fifo"
    names = {e.name: e.attrs.kind for e in store.readdir(["open"]).entries}
    assert names == {"fifo2": "fifo", "sock": "socket", "null": "char", "disk": "block"}
    store.unlink(["open", "sock"], caller=user)
