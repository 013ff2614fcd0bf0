"""``tectofs check`` (tectofs/check): real clients on several hosts run random calls on a shared
tree, every history recorded and checked for one order that explains it (issue 52).

The fast tests check the plan (which calls each client kind makes) and that a recorded history
with a wrong answer is caught; the slow one runs real histories on a real cluster."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tectofs.check import plan, runner
from tectofs.testing import linearize
from tectofs.testing.history import KINDS, History
from tectofs.testing.namespace_model import PROFILES


def test_every_client_kind_draws_every_call_it_can_make() -> None:
    for kind in ("mount", "library", "s3", "fsspec"):
        drawn = Counter(call for call, _ in plan.draw_calls(7, kind, "c0", 2000))
        expected = PROFILES[kind].kinds - plan.LEFT_OUT.get(kind, frozenset())
        assert set(drawn) == expected, kind
    assert set(plan.WEIGHTS) == set(KINDS)


def test_a_name_keeps_its_kind_and_s3_never_empties_a_directory() -> None:
    rng = random.Random(3)
    for _ in range(3000):
        kind, args = plan.draw_call(rng, rng.choice(("mount", "library", "s3", "fsspec")), "x")
        if kind in ("rename", "link"):
            assert (args["path"] in plan.DIR_NAMES) == (args["dest"] in plan.DIR_NAMES), args
    for _ in range(500):
        kind, args = plan.draw_call(rng, "s3", "x")
        if kind == "unlink":
            assert str(args["path"]).count("/") == 2


def test_the_checker_catches_a_lost_write_in_a_recorded_history() -> None:
    history = History(initial=dict(plan.INITIAL), seed=1, replay="tectofs check --seed 1")
    history.client("h0c0", "mount", "h0")
    history.client("h1c0", "s3", "h1")
    history.add("h0c0", "write", 1.0, 1.1, path="/a/f", data=b"new")
    history.add("h1c0", "read", 1.2, 1.3, value=b"first", path="/a/f")  # after the write completed
    verdict = linearize.check(history)
    assert verdict.violation
    assert "seed 1" in verdict.report()


HISTORIES = 200


@pytest.mark.slow  # starts a cluster and three hosts (network namespaces where they can be made)
@pytest.mark.timeout(240)
def test_real_histories_under_faults_are_linearizable(tmp_path) -> None:
    """200 histories of 3 hosts x 4 clients (library and fsspec), 2 calls each, with a fault in
    one history of 16 (metadata restart, a host's network cut, a chunk server killed). Left out
    until their findings are fixed (/work/notes/check-findings.md): mounts (finding 1:
    open(O_CREAT) answers ENOENT in a directory that exists), S3 clients (findings 3 and 4: a GET
    returns a file's old bytes after a PUT, or its old size with the new bytes), and appends
    (finding 5: an append's handle may see an empty file and publish its data over the file's
    bytes). Renames too: a write's handle follows its file across a rename made while it is
    open (as POSIX says), which the checker's model (a write takes effect at one instant, by
    path) cannot express yet: about 1 history in 300 with renames is reported for it."""
    options = runner.Options(hosts=3, clients=4, calls=2, histories=HISTORIES, seed=52, quiet=15,
                             faults=("meta-restart", "net-cut", "chunk-kill"), kinds=("library", "fsspec"),
                             leave_out=("append", "rename"), work=str(tmp_path))
    lines: list[str] = []
    result = runner.run(options, lines.append)
    assert result.histories == HISTORIES
    assert not result.violations, "\n\n".join(v.report for v in result.violations)
    assert len(result.undecided) <= 2, result.undecided
    assert {client for client, _ in result.calls} == {"library", "fsspec"}
    if any("plain processes" in note for note in result.notes):  # no namespaces here: no net-cut
        assert set(result.faults) == {"meta-restart", "chunk-kill"}, result.faults
    else:
        assert set(result.faults) == {"meta-restart", "net-cut", "chunk-kill"}, result.faults


@pytest.mark.slow  # starts a cluster, two hosts and their mounts
@pytest.mark.timeout(180)
def test_mounts_killed_and_paused_rejoin_and_their_histories_are_linearizable(tmp_path) -> None:
    """A mount SIGKILLed in a history (its calls then have no answer: their fate is unknown) and
    mounted again during the next (a client joining while others write), and a mount SIGSTOPped
    past its leases, next to a library client on another host. Mounts make no renames, links,
    unlinks or rmdirs here: a name changed by another client can still answer ESTALE on a mount
    (issue 52, the failures its part 1 fixes; check-findings.md 6), and appends are left out
    (finding 5)."""
    if runner.mount_missing():
        pytest.skip(f"mounts cannot run here: {runner.mount_missing()}")
    options = runner.Options(hosts=2, clients=2, calls=2, histories=8, seed=52, quiet=0, faults=("mount-kill", "pause"),
                             kinds=("mount", "library"), leave_out=("append", "rename", "link", "unlink", "rmdir"),
                             work=str(tmp_path))
    result = runner.run(options, lambda line: None)
    assert result.histories == 8
    assert not result.violations, "\n\n".join(v.report for v in result.violations)
    assert result.faults == {"mount-kill": 4, "pause": 4}
    assert result.joins == 4  # each killed mount mounted again during the next history
    assert {client for client, _ in result.calls} == {"mount", "library"}
