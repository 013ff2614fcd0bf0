"""The history checker (``tectofs.testing.linearize``) with its model and record: the model's
POSIX rules; one hand-made bad history per rule, caught, beside its good twin, accepted; valid
random concurrent histories accepted; injected bugs found with small minimal cores; the JSON
record; the command line's exit codes; and its speed. All in-process, about 10 s."""

from __future__ import annotations

import errno
import json
import os
import pathlib
import statistics
import time
from collections.abc import Callable

import pytest

from tectofs.testing import history_synthetic, linearize
from tectofs.testing.history import BadHistory, History, Recorder, stat_summary
from tectofs.testing.namespace_model import PROFILES, Tree, apply

# ---------------------------------------------------------------------- the model's POSIX rules

START = {"/d": None, "/d/f": b"abc", "/d/s": None, "/d/s/g": b"x", "/e": None, "/file": b"12345"}

# (steps done first, then the call and what it must answer: a value, or an errno name)
MODEL_CASES: list[tuple[str, list[tuple[str, dict[str, object]]], str, dict[str, object], object]] = [
    ("create over a name", [], "create", {"path": "/d/f"}, "EEXIST"),
    ("create below a missing directory", [], "create", {"path": "/nope/x"}, "ENOENT"),
    ("create below a file", [], "create", {"path": "/file/x"}, "ENOTDIR"),
    ("ENOTDIR before ENOENT", [], "stat", {"path": "/file/nope/x"}, "ENOTDIR"),
    ("write a directory", [], "write", {"path": "/d", "data": b"x"}, "EISDIR"),
    ("read a directory", [], "read", {"path": "/d"}, "EISDIR"),
    ("list a file", [], "list", {"path": "/file"}, "ENOTDIR"),
    ("list sorted", [("create", {"path": "/d/a"})], "list", {"path": "/d"}, ["a", "f", "s"]),
    ("write replaces", [("write", {"path": "/d/f", "data": b"new"})], "read", {"path": "/d/f"}, b"new"),
    ("append appends", [("append", {"path": "/d/f", "data": b"de"})], "read", {"path": "/d/f"}, b"abcde"),
    ("append creates", [("append", {"path": "/d/n", "data": b"z"})], "read", {"path": "/d/n"}, b"z"),
    ("rename into its own subtree", [], "rename", {"path": "/d", "dest": "/d/s/x"}, "EINVAL"),
    ("rename onto its ancestor", [], "rename", {"path": "/d/s/g", "dest": "/d"}, "ENOTEMPTY"),
    ("rename a directory over a file", [], "rename", {"path": "/d/s", "dest": "/file"}, "ENOTDIR"),
    ("rename a file over a directory", [], "rename", {"path": "/file", "dest": "/e"}, "EISDIR"),
    ("rename over a non-empty directory", [], "rename", {"path": "/e", "dest": "/d/s"}, "ENOTEMPTY"),
    ("rename of a missing name", [], "rename", {"path": "/d/nope", "dest": "/e/x"}, "ENOENT"),
    ("rename: the target's parent before the source", [], "rename", {"path": "/nope", "dest": "/file/x"}, "ENOTDIR"),
    ("rename replaces", [("rename", {"path": "/file", "dest": "/d/f"})], "read", {"path": "/d/f"}, b"12345"),
    ("rename moves what is below", [("rename", {"path": "/d", "dest": "/e/d"})], "read", {"path": "/e/d/s/g"},
     b"x"),
    ("rename of the old name", [("rename", {"path": "/file", "dest": "/e/x"})], "stat", {"path": "/file"}, "ENOENT"),
    ("rename between links is nothing", [("link", {"path": "/file", "dest": "/e/l"})], "rename",
     {"path": "/file", "dest": "/e/l"}, None),
    ("link a directory", [], "link", {"path": "/d/s", "dest": "/e/s"}, "EPERM"),
    ("link over a name", [], "link", {"path": "/file", "dest": "/d/f"}, "EEXIST"),
    ("link counts", [("link", {"path": "/file", "dest": "/e/l"})], "stat", {"path": "/file"},
     {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "nlink": 2, "size": 5}),
    ("links share bytes", [("link", {"path": "/file", "dest": "/e/l"}), ("write", {"path": "/e/l", "data": b"q"}),
                           ("unlink", {"path": "/e/l"})], "read", {"path": "/file"}, b"q"),
    ("unlink a directory", [], "unlink", {"path": "/d/s"}, "EISDIR"),
    ("rmdir a file", [], "rmdir", {"path": "/file"}, "ENOTDIR"),
    ("rmdir non-empty", [], "rmdir", {"path": "/d"}, "ENOTEMPTY"),
    ("rmdir /", [], "rmdir", {"path": "/"}, "EBUSY"),
    ("mkdir over a name", [], "mkdir", {"path": "/e"}, "EEXIST"),
    ("directory links", [("mkdir", {"path": "/e/x"})], "stat", {"path": "/e"},
     {"kind": "dir", "mode": 0o755, "uid": 0, "gid": 0, "nlink": 3}),
    ("truncate extends with zeros", [("truncate", {"path": "/d/f", "size": 5})], "read", {"path": "/d/f"},
     b"abc\0\0"),
    ("truncate cuts", [("truncate", {"path": "/d/f", "size": 1})], "read", {"path": "/d/f"}, b"a"),
    ("truncate negative", [], "truncate", {"path": "/d/f", "size": -1}, "EINVAL"),
    ("truncate a directory", [], "truncate", {"path": "/d", "size": 0}, "EISDIR"),
    ("chmod and chown", [("chmod", {"path": "/d/f", "mode": 0o600}), ("chown", {"path": "/d/f", "uid": 7, "gid": 8})],
     "stat", {"path": "/d/f"}, {"kind": "file", "mode": 0o600, "uid": 7, "gid": 8, "nlink": 1, "size": 3}),
    ("setxattr then getxattr", [("setxattr", {"path": "/d", "name": "user.a", "value": b"v"})], "getxattr",
     {"path": "/d", "name": "user.a"}, b"v"),
    ("getxattr of none", [], "getxattr", {"path": "/d", "name": "user.a"}, "ENODATA"),
    ("fsync of a missing file", [], "fsync", {"path": "/d/nope"}, "ENOENT"),
    ("fsync", [], "fsync", {"path": "/d/f"}, None),
]


@pytest.mark.parametrize("name,steps,kind,args,expected", MODEL_CASES, ids=[case[0] for case in MODEL_CASES])
def test_the_model_follows_posix(name: str, steps: list[tuple[str, dict[str, object]]], kind: str,
                                 args: dict[str, object], expected: object) -> None:
    tree = Tree.initial(START)
    for step_kind, step_args in steps:
        tree, (_, error) = apply(tree, step_kind, step_args)  # type: ignore[arg-type]
        assert error is None, (step_kind, step_args, error)
    before = tree.key()
    after, (value, error) = apply(tree, kind, args)  # type: ignore[arg-type]
    assert (error if error is not None else value) == expected
    if error is not None:
        assert after.key() == before  # an error changes nothing (the checker relies on it)


def test_client_kinds_make_their_own_calls() -> None:
    tree = Tree.initial(START)
    s3, fsspec = PROFILES["s3"], PROFILES["fsspec"]
    assert apply(tree, "unlink", {"path": "/d/nope"}, s3)[1] == (None, None)  # DELETE of a missing key
    assert apply(tree, "list", {"path": "/nope"}, s3)[1] == ([], None)
    after, outcome = apply(tree, "write", {"path": "/new/a/b", "data": b"x"}, s3)  # PUT makes parents
    assert outcome == (None, None) and after.inode("/new/a") is not None
    assert apply(tree, "write", {"path": "/n/x", "data": b"x"}, fsspec)[1] == (None, None)  # auto_mkdir
    assert apply(tree, "write", {"path": "/n/x", "data": b"x"}, PROFILES["mount"])[1] == (None, "ENOENT")
    assert "rename" not in s3.kinds and "nlink" not in fsspec.stat_fields


# ---------------------------------------------------------------------- one bad history per rule, and its good twin


def _history(**clients: dict[str, object]) -> History:
    history = History(initial={"/d": None, "/d/f": b"v0", "/d/s": None}, seed=1234, replay="replay-line 1234")
    for name, rules in clients.items():
        rules = dict(rules)
        history.client(name, str(rules.pop("kind", "library")), str(rules.pop("host", name)),
                       **{k: float(v) for k, v in rules.items()})  # type: ignore[arg-type]
    return history


def lost_write(bad: bool) -> History:  # linearizable: a read after a completed write sees it
    h = _history(a={}, b={"kind": "mount"})
    h.add("a", "write", 1.0, 1.1, path="/d/f", data=b"v1")
    h.add("b", "read", 1.2, 1.3, b"v0" if bad else b"v1", path="/d/f")
    return h


def concurrent_read(bad: bool) -> History:  # a read overlapping a write sees the old or the new bytes, nothing else
    h = _history(a={}, b={"kind": "mount"})
    h.add("a", "write", 1.0, 1.5, path="/d/f", data=b"v1")
    h.add("b", "read", 1.1, 1.2, b"v0", path="/d/f")
    h.add("b", "read", 1.3, 1.4, b"v0v1" if bad else b"v1", path="/d/f")
    return h


def no_going_back(bad: bool) -> History:  # once a read saw the new bytes, later reads do too
    h = _history(a={}, b={"kind": "mount"}, c={})
    h.add("a", "write", 1.0, 1.5, path="/d/f", data=b"v1")
    h.add("b", "read", 1.1, 1.2, b"v1", path="/d/f")
    h.add("c", "read", 1.3, 1.4, b"v0" if bad else b"v1", path="/d/f")
    return h


def stale_after_rename(bad: bool) -> History:
    h = _history(a={}, b={"kind": "fsspec"})
    h.add("a", "rename", 1.0, 1.1, path="/d/f", dest="/d/s/g")
    h.add("b", "read", 1.2, 1.3, b"v0" if bad else None, None if bad else "ENOENT", path="/d/f")
    h.add("b", "read", 1.4, 1.5, b"v0", path="/d/s/g")
    return h


def listed_after_unlink(bad: bool) -> History:
    h = _history(a={"kind": "mount"}, b={"kind": "s3"})
    h.add("a", "unlink", 1.0, 1.1, path="/d/f")
    h.add("b", "list", 1.2, 1.3, ["f", "s"] if bad else ["s"], path="/d")
    return h


def resurrected(bad: bool) -> History:
    h = _history(a={}, b={})
    h.add("a", "unlink", 1.0, 1.1, path="/d/f")
    h.add("b", "stat", 1.2, 1.3, None, "ENOENT", path="/d/f")
    h.add("b", "read", 1.4, 1.5, b"v0" if bad else None, None if bad else "ENOENT", path="/d/f")
    return h


def errno_order(bad: bool) -> History:  # Linux's errno for a directory renamed into itself
    h = _history(a={})
    h.add("a", "rename", 1.0, 1.1, None, "ENOTEMPTY" if bad else "EINVAL", path="/d", dest="/d/s/x")
    return h


def one_of_two_mkdirs(bad: bool) -> History:  # concurrent mkdirs of one name: exactly one wins
    h = _history(a={}, b={"kind": "mount"})
    h.add("a", "mkdir", 1.0, 1.2, path="/d/n")
    h.add("b", "mkdir", 1.1, 1.3, None, None if bad else "EEXIST", path="/d/n")
    return h


def future_read(bad: bool) -> History:  # nothing takes effect before it is called
    h = _history(a={}, b={})
    h.add("b", "read", 1.0, 1.1, b"v1" if bad else b"v0", path="/d/f")
    h.add("a", "write", 1.2, 1.3, path="/d/f", data=b"v1")
    return h


def clock_error(bad: bool) -> History:  # the same, within the clients' clock error: explained
    h = _history(a={"clock_error_s": 0.0 if bad else 0.1}, b={"clock_error_s": 0.0 if bad else 0.1})
    h.add("b", "read", 1.0, 1.1, b"v1", path="/d/f")
    h.add("a", "write", 1.15, 1.3, path="/d/f", data=b"v1")
    return h


def acknowledged_write_lost(bad: bool) -> History:  # library: nothing acknowledged is lost in a crash
    h = _history(a={"crashed_at": 1.15}, b={})
    h.add("a", "write", 1.0, 1.1, path="/d/f", data=b"v1")
    h.add("b", "read", 1.2, 1.3, b"v0" if bad else b"v1", path="/d/f")
    return h


def mount_loses_its_window(bad: bool) -> History:  # an async-creates mount may lose its last 50 ms, no more
    h = _history(a={"kind": "mount", "crashed_at": 1.13, "durability_window_s": 0.05}, b={})
    h.add("a", "write", 1.0, 1.05 if bad else 1.1, path="/d/f", data=b"v1")
    h.add("b", "read", 1.2, 1.3, b"v0", path="/d/f")
    return h


def fsync_makes_durable(bad: bool) -> History:
    h = _history(a={"kind": "mount", "crashed_at": 1.2, "durability_window_s": 0.05}, b={})
    h.add("a", "write", 1.0, 1.16, path="/d/f", data=b"v1")
    h.add("a", "fsync", 1.17, 1.19, None, None if bad else "ENOENT", path="/d/s/none")
    h.add("b", "read", 1.3, 1.4, b"v0", path="/d/f")
    return h


def unknown_outcome(bad: bool) -> History:  # a call with no answer may take effect any time after its invoke, or never
    h = _history(a={"crashed_at": 1.5}, b={})
    h.add("b", "read", 0.5, 0.9, b"v1" if bad else b"v0", path="/d/f")
    h.add("a", "write", 1.0, None, path="/d/f", data=b"v1")
    h.add("b", "read", 2.0, 2.1, b"v1", path="/d/f")
    h.add("b", "read", 3.0, 3.1, b"v1", path="/d/f")
    return h


def cached_stat(bad: bool) -> History:  # --no-leases: stale up to the attr timeout, never longer
    h = _history(a={}, b={"kind": "mount", "stale_window_s": 1.0})
    h.add("a", "chmod", 1.0, 1.1, path="/d/f", mode=0o600)
    h.add("b", "stat", 3.0 if bad else 1.5, 3.1 if bad else 1.6,
          {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "nlink": 1, "size": 2}, path="/d/f")
    return h


def leased_stat(bad: bool) -> History:  # with leases (the default) a change is seen at once
    h = _history(a={}, b={"kind": "mount", "stale_window_s": 0.0 if bad else 1.0})
    h.add("a", "chmod", 1.0, 1.1, path="/d/f", mode=0o600)
    h.add("b", "stat", 1.2, 1.3, {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "nlink": 1, "size": 2},
          path="/d/f")
    return h


def own_changes_seen(bad: bool) -> History:  # even a caching client sees its own changes
    h = _history(b={"kind": "mount", "stale_window_s": 1.0})
    h.add("b", "write", 1.0, 1.1, path="/d/f", data=b"v1")
    h.add("b", "read", 1.2, 1.3, b"v0" if bad else b"v1", path="/d/f")
    return h


def s3_sees_less(bad: bool) -> History:  # HEAD has no mode; its size must still be right
    h = _history(a={}, b={"kind": "s3"})
    h.add("a", "append", 1.0, 1.1, path="/d/f", data=b"+")
    h.add("b", "stat", 1.2, 1.3, {"kind": "file", "size": 2 if bad else 3}, path="/d/f")
    h.add("b", "read", 1.4, 1.5, None, "ENOENT", path="/d/s")  # GET of a "directory": NoSuchKey
    return h


def appends_both_land(bad: bool) -> History:
    h = _history(a={}, b={}, c={})
    h.add("a", "append", 1.0, 1.2, path="/d/f", data=b"a")
    h.add("b", "append", 1.0, 1.2, path="/d/f", data=b"b")
    h.add("c", "read", 1.3, 1.4, b"v0a" if bad else b"v0ba", path="/d/f")
    return h


def link_survives_unlink(bad: bool) -> History:
    h = _history(a={}, b={})
    h.add("a", "link", 1.0, 1.1, path="/d/f", dest="/d/s/l")
    h.add("a", "unlink", 1.2, 1.3, path="/d/f")
    h.add("b", "stat", 1.4, 1.5, {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "nlink": 2 if bad else 1,
                                  "size": 2}, path="/d/s/l")
    h.add("b", "read", 1.6, 1.7, b"v0", path="/d/s/l")
    return h


def xattr_seen(bad: bool) -> History:
    h = _history(a={}, b={"kind": "mount"})
    h.add("a", "setxattr", 1.0, 1.1, path="/d/f", name="user.k", value=b"1")
    h.add("b", "getxattr", 1.2, 1.3, None if bad else b"1", "ENODATA" if bad else None, path="/d/f", name="user.k")
    return h


def truncate_seen(bad: bool) -> History:
    h = _history(a={}, b={})
    h.add("a", "truncate", 1.0, 1.1, path="/d/f", size=1)
    h.add("b", "read", 1.2, 1.3, b"v0" if bad else b"v", path="/d/f")
    return h


def chown_seen(bad: bool) -> History:
    h = _history(a={}, b={"kind": "fsspec"})
    h.add("a", "chown", 1.0, 1.1, path="/d/s", uid=1000, gid=1000)
    h.add("b", "stat", 1.2, 1.3, {"kind": "dir", "mode": 0o755, "uid": 0 if bad else 1000, "gid": 1000},
          path="/d/s")
    return h


def exclusive_create(bad: bool) -> History:
    h = _history(a={}, b={})
    h.add("a", "create", 1.0, 1.2, path="/d/n")
    h.add("b", "create", 1.1, 1.3, None, None if bad else "EEXIST", path="/d/n")
    return h


def rename_replaces_atomically(bad: bool) -> History:  # the target never goes missing while it is replaced
    h = _history(a={}, b={})
    h.add("a", "write", 0.5, 0.6, path="/d/s/t", data=b"new")
    h.add("a", "rename", 1.0, 2.0, path="/d/s/t", dest="/d/f")
    h.add("b", "read", 1.1, 1.2, b"v0", path="/d/f")
    h.add("b", "read", 1.3, 1.4, None if bad else b"new", "ENOENT" if bad else None, path="/d/f")
    return h


def new_name_shows_empty(bad: bool) -> History:  # a new name exists, empty, from the open on; a PUT shows nothing
    h = _history(a={"kind": "s3" if bad else "library"}, b={})
    h.add("a", "write", 1.0, 2.0, path="/d/n", data=b"v1")
    h.add("b", "stat", 1.2, 1.3, {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "nlink": 1, "size": 0}, path="/d/n")
    h.add("b", "read", 2.5, 2.6, b"v1", path="/d/n")
    return h


def rmdir_nonempty(bad: bool) -> History:
    h = _history(a={}, b={})
    h.add("a", "mkdir", 1.0, 1.1, path="/d/n")
    h.add("a", "create", 1.2, 1.3, path="/d/n/x")
    h.add("b", "rmdir", 1.4, 1.5, None, None if bad else "ENOTEMPTY", path="/d/n")
    return h


RULES: dict[str, Callable[[bool], History]] = {f.__name__: f for f in (
    lost_write, concurrent_read, no_going_back, stale_after_rename, listed_after_unlink, resurrected, errno_order,
    one_of_two_mkdirs, future_read, clock_error, acknowledged_write_lost, mount_loses_its_window,
    fsync_makes_durable, unknown_outcome, cached_stat, leased_stat, own_changes_seen, s3_sees_less,
    appends_both_land, link_survives_unlink, xattr_seen, truncate_seen, chown_seen, exclusive_create,
    rename_replaces_atomically, new_name_shows_empty, rmdir_nonempty)}


@pytest.mark.parametrize("rule", RULES)
def test_each_rule_catches_its_bad_history_and_accepts_its_twin(rule: str) -> None:
    good = linearize.check(RULES[rule](False))
    assert good.ok, good.report()
    bad = linearize.check(RULES[rule](True))
    assert bad.violation, rule
    report = bad.report()
    assert "<-- impossible" in report and "replay-line 1234" in report and "seed 1234" in report
    assert bad.impossible is not None and bad.impossible in bad.core


def test_every_kind_is_modelled_and_exercised() -> None:
    from tectofs.testing.history import KINDS
    used = {op.kind for make in RULES.values() for op in make(True).operations}
    used |= {kind for _, steps, kind, _, _ in MODEL_CASES for kind in [kind] + [s[0] for s in steps]}
    assert set(KINDS) <= used


def test_a_client_kind_cannot_make_calls_it_has_not() -> None:
    h = _history(b={"kind": "s3"})
    h.add("b", "rename", 1.0, 1.1, path="/d/f", dest="/d/g")  # S3 has no rename: copy + delete are two calls
    with pytest.raises(BadHistory, match="s3 client cannot rename"):
        linearize.check(h)


def test_the_report_names_clients_times_and_the_impossible_answer() -> None:
    verdict = linearize.check(acknowledged_write_lost(True))
    report = verdict.report()
    assert "a (library on a, killed at 1.150000)" in report
    assert "[1.200000, 1.300000] b: read(/d/f) -> b'v0'   <-- impossible (the model: b'v1')" in report
    assert [op.id for op in verdict.core] == [0, 1]


# ---------------------------------------------------------------------- random histories, injected bugs

def test_random_concurrent_histories_are_accepted() -> None:
    for seed in range(12):
        for crash in (False, True):
            history = history_synthetic.generate(seed, crash=crash)
            verdict = linearize.check(history)
            assert verdict.ok, f"seed {seed} crash {crash}: {verdict.report()}"
    for seed in range(100, 140):  # small ones, many
        history = history_synthetic.generate(seed, clients=4, operations=40, crash=seed % 2 == 0, cross_top=0.5)
        verdict = linearize.check(history)
        assert verdict.ok, f"seed {seed}: {verdict.report()}"


CORE_SIZES = {"stale_read_after_rename": 3, "lost_write": 3, "visible_after_unlink": 3, "resurrected_file": 3,
              "wrong_errno": 2, "phantom_bytes": 1, "lost_after_crash": 2, "read_from_the_future": 1,
              "stale_stat_after_chmod": 3}


@pytest.mark.parametrize("bug", history_synthetic.BUGS)
def test_injected_bugs_are_found_with_minimal_cores(bug: str) -> None:
    assert set(CORE_SIZES) == set(history_synthetic.BUGS)
    for seed in (3, 8):
        bad, added = history_synthetic.inject(history_synthetic.generate(seed), bug, seed)
        verdict = linearize.check(bad)
        assert verdict.violation, bug
        core = {op.id for op in verdict.core}
        assert core <= added and len(core) == CORE_SIZES[bug], verdict.report()
        # The core alone still fails; without the marked answer it is explained.
        alone = History(clients=bad.clients, initial=bad.initial, operations=list(verdict.core))
        assert linearize.check(alone).violation
        assert verdict.impossible is not None
        alone.operations.remove(verdict.impossible)
        assert linearize.check(alone).ok


def test_a_wrong_answer_deep_in_one_large_part_is_shrunk_to_itself() -> None:
    from dataclasses import replace
    history = history_synthetic.generate(0)
    reads = [i for i, op in enumerate(history.operations) if op.kind == "read" and op.error is None]
    index = reads[len(reads) // 2]
    history.operations[index] = replace(history.operations[index], value=b"bytes nobody wrote")
    verdict = linearize.check(history)
    assert verdict.violation and [op.id for op in verdict.core] == [history.operations[index].id]


# ---------------------------------------------------------------------- the record and the command line

def test_json_round_trip(tmp_path: pathlib.Path) -> None:
    history = history_synthetic.generate(5, clients=6, operations=80, crash=True)
    history.add("c1", "stat", 9.0, 9.1, {"kind": "dir", "mode": 0o755, "uid": 0, "gid": 0, "nlink": 3}, path="/d0")
    path = tmp_path / "h.json"
    history.save(path)
    loaded = History.load(path)
    assert loaded.to_json() == history.to_json()
    assert any(op.unknown for op in loaded.operations) and any(c.crashed_at for c in loaded.clients.values())
    assert linearize.check(loaded).ok == linearize.check(history).ok


def test_command_line_exit_codes(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, bad, broken, unknown = (tmp_path / name for name in ("good.json", "bad.json", "broken.json", "kind.json"))
    lost_write(False).save(good)
    lost_write(True).save(bad)
    broken.write_text("{not json")
    data = lost_write(False).to_json()
    data["operations"][0]["kind"] = "teleport"  # type: ignore[index]
    unknown.write_text(json.dumps(data))
    assert linearize.main([str(good)]) == 0
    assert linearize.main([str(bad)]) == 1
    assert "VIOLATION" in capsys.readouterr().out
    assert linearize.main([str(broken)]) == 2
    assert linearize.main([str(unknown)]) == 2
    assert "teleport" in capsys.readouterr().err
    assert linearize.main([str(tmp_path / "missing.json")]) == 2
    history_synthetic.generate(0).save(good)
    assert linearize.main([str(good), "--budget", "1"]) == 3


def test_the_recorder(tmp_path: pathlib.Path) -> None:
    ticks = iter(range(100))
    history = History()
    history.client("me", "mount")
    recorder = Recorder(history, clock=lambda: float(next(ticks)))
    target = tmp_path / "f"
    target.write_bytes(b"hi")

    def timeout() -> None:
        raise TimeoutError(errno.ETIMEDOUT, "no answer")

    read = recorder.call("me", "read", target.read_bytes, path="/f")
    missing = recorder.call("me", "read", (tmp_path / "nope").read_bytes, path="/nope")
    stat = recorder.call("me", "stat", lambda: os.stat(target), lambda raw: stat_summary(raw), path="/f")  # type: ignore[arg-type]
    lost = recorder.call("me", "write", timeout, path="/f", data=b"x")
    assert (read.invoke, read.complete, read.value) == (0.0, 1.0, b"hi")
    assert missing.error == "ENOENT" and missing.value is None
    assert isinstance(stat.value, dict) and stat.value["size"] == 2 and stat.value["kind"] == "file"
    assert lost.unknown and lost.error is None
    assert [op.id for op in history.operations] == [0, 1, 2, 3]


# ---------------------------------------------------------------------- speed

def test_a_few_hundred_operations_from_twelve_clients_check_fast() -> None:
    """The bar is well under a second per history; the bounds leave room for a loaded 2-core CI machine."""
    times = []
    for seed in range(5):
        history = history_synthetic.generate(seed, clients=12, operations=300)
        started = time.perf_counter()
        assert linearize.check(history).ok
        times.append(time.perf_counter() - started)
    assert statistics.median(times) < 0.5, times
    assert max(times) < 2.0, times
