"""Synthetic histories for testing the checker: valid ones made by the model itself, and one
injected bug at a time.

:func:`generate` runs ``clients`` clients (kinds in turn: mount, library, fsspec, S3; on a few
hosts) for ``operations`` random calls on a small tree (top-level directories ``/d0``...,
with subdirectories and a few names each, so calls collide and fail often). Each client's calls
follow one another with random gaps and durations, so intervals of different clients overlap;
each call takes effect at a random instant inside its interval, and the model's answer there is
what is recorded. ``crash=True`` kills one mount (with a durability window) part way: its call
in flight becomes unknown (taking effect or not), and acknowledged changes within its window
may be lost (never take effect). The result is valid by construction: the checker must accept
it. Everything is decided by ``seed``.

:func:`inject` adds one bug of a kind in :data:`BUGS` to a history, as a few extra calls by two
extra clients under a fresh top-level directory, placed in time among the others' calls: the
returned ids are the calls a minimal core must come from.
"""

from __future__ import annotations

import copy
import random
from dataclasses import replace

from tectofs.testing.history import READ_KINDS, History, Operation, Value
from tectofs.testing.namespace_model import PROFILES, Tree, apply, observe

TOP_DIRECTORIES = 3
_KIND_WEIGHTS = {"create": 4, "write": 8, "append": 4, "read": 10, "stat": 8, "list": 6, "rename": 6, "link": 2,
                 "unlink": 4, "chmod": 2, "chown": 1, "truncate": 2, "mkdir": 4, "rmdir": 2, "setxattr": 2,
                 "getxattr": 2, "fsync": 2}
_CLIENT_KINDS = ("mount", "library", "fsspec", "s3")


def _initial() -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = {}
    for top in range(TOP_DIRECTORIES):
        tree[f"/d{top}"] = None
        tree[f"/d{top}/s0"] = None
        tree[f"/d{top}/f0"] = b"initial"
    return tree


def _path(rng: random.Random, top: int) -> str:
    base = f"/d{top}" if rng.random() < 0.6 else f"/d{top}/s{rng.randrange(2)}"
    return f"{base}/{rng.choice(['f0', 'f1', 'f2', 's0', 's1'])}"


def _args(rng: random.Random, kind: str, label: str, cross_top: float) -> dict[str, str | int | bytes]:
    top = rng.randrange(TOP_DIRECTORIES)
    args: dict[str, str | int | bytes] = {"path": _path(rng, top)}
    if kind in ("rename", "link"):
        other = rng.randrange(TOP_DIRECTORIES) if rng.random() < cross_top else top
        args["dest"] = _path(rng, other)
    elif kind in ("write", "append"):
        args["data"] = label.encode()
    elif kind == "chmod":
        args["mode"] = rng.choice([0o600, 0o644, 0o755])
    elif kind == "chown":
        args["uid"], args["gid"] = rng.choice([(0, 0), (1000, 1000)])
    elif kind == "truncate":
        args["size"] = rng.choice([0, 3, 10])
    elif kind in ("setxattr", "getxattr"):
        args["name"] = rng.choice(["user.a", "user.b"])
        if kind == "setxattr":
            args["value"] = label.encode()
    return args


def generate(seed: int, clients: int = 12, operations: int = 300, crash: bool = False,
             cross_top: float = 0.1) -> History:
    """A valid history (module docstring); ``cross_top``: the share of renames and links
    between top-level directories (which join their parts of the check)."""
    rng = random.Random(seed)
    history = History(initial=_initial(), seed=seed,
                      replay=f"tectofs.testing.history_synthetic.generate({seed}, clients={clients},"
                             f" operations={operations}, crash={crash})")
    names = [f"c{n}" for n in range(clients)]
    for n, name in enumerate(names):
        kind = _CLIENT_KINDS[n % len(_CLIENT_KINDS)]
        history.client(name, kind, f"h{n % 4}", durability_window_s=0.05 if kind == "mount" else 0.0)
    clocks = {name: rng.uniform(0, 0.01) for name in names}
    planned: list[tuple[float, Operation]] = []  # (the instant it takes effect, the call without its answer)
    kinds = list(_KIND_WEIGHTS)
    weights = [_KIND_WEIGHTS[k] for k in kinds]
    for number in range(operations):
        name = rng.choice(names)
        profile = PROFILES[history.clients[name].kind]
        kind = rng.choices(kinds, weights)[0]
        while kind not in profile.kinds:
            kind = rng.choices(kinds, weights)[0]
        invoke = clocks[name] + rng.uniform(0.0, 0.004)
        complete = invoke + rng.uniform(0.0005, 0.02)
        clocks[name] = complete
        op = Operation(number, name, kind, _args(rng, kind, f"{name}-{number}", cross_top), invoke, complete)
        planned.append((rng.uniform(invoke, complete), op))
    lost: set[int] = set()
    if crash:
        victim = next(n for n in names if history.clients[n].kind == "mount")
        ends = sorted(op.complete for _, op in planned if op.client == victim and op.complete is not None)
        at = ends[len(ends) // 2] + 0.001 if ends else 0.0
        history.crash(victim, at)
        window = history.clients[victim].durability_window_s
        kept: list[tuple[float, Operation]] = []
        for instant, op in planned:
            if op.client == victim and op.invoke > at:
                continue  # never called: its client was dead
            if op.client == victim and op.complete is not None and op.complete > at:
                op = replace(op, complete=None)  # in flight at the crash
                if rng.random() < 0.5:
                    lost.add(op.id)
                else:
                    instant = rng.uniform(op.invoke, op.invoke + 0.05)
            elif op.client == victim and op.kind not in READ_KINDS and op.complete is not None \
                    and op.complete >= at - window and rng.random() < 0.5:
                lost.add(op.id)
            kept.append((instant, op))
        planned = kept
    tree = Tree.initial(history.initial)
    answered: dict[int, Operation] = {}
    for _, op in sorted(planned, key=lambda pair: pair[0]):
        profile = PROFILES[history.clients[op.client].kind]
        after, outcome = apply(tree, op.kind, op.args, profile)
        if op.id not in lost:
            tree = after
        value, error = observe(profile, op.kind, outcome)
        answered[op.id] = op if op.complete is None else replace(op, value=value, error=error)
    ops = sorted(answered.values(), key=lambda op: op.invoke)
    history.operations = [replace(op, id=n) for n, op in enumerate(ops)]
    if crash and lost:  # a lost change must be one the checker's crash rule allows losing (no fsync after it)
        history.operations = [op for op in history.operations
                              if not (op.client == victim and op.kind == "fsync")]
        history.operations = [replace(op, id=n) for n, op in enumerate(history.operations)]
    return history


# ---------------------------------------------------------------------- injected bugs

BUGS = ("stale_read_after_rename", "lost_write", "visible_after_unlink", "resurrected_file", "wrong_errno",
        "phantom_bytes", "lost_after_crash", "read_from_the_future", "stale_stat_after_chmod")


def inject(history: History, bug: str, seed: int = 0) -> tuple[History, set[int]]:
    """A copy of ``history`` with one bug of kind ``bug`` (:data:`BUGS`) added, and the ids of
    the added calls (a minimal core is a subset of them)."""
    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}: one of {', '.join(BUGS)}")
    rng = random.Random(seed)
    bad = copy.deepcopy(history)
    top = f"/bug{len([p for p in bad.initial if p.startswith('/bug')])}"
    bad.initial[top] = None
    ends = [op.complete for op in bad.operations if op.complete is not None] or [0.0]
    clock = [rng.uniform(0.0, max(ends))]
    writer, reader = f"{top[1:]}-w", f"{top[1:]}-r"
    bad.client(writer, "library", "hx")
    bad.client(reader, "mount", "hy")
    added: set[int] = set()

    def call(client: str, kind: str, result: Value = None, error: str | None = None, **args: str | int | bytes) -> None:
        start = clock[0] + 0.001
        clock[0] = start + 0.002
        added.add(bad.add(client, kind, start, clock[0], result, error, **args).id)

    path, other = f"{top}/a", f"{top}/b"
    if bug == "stale_read_after_rename":
        call(writer, "write", path=path, data=b"v1")
        call(writer, "rename", path=path, dest=other)
        call(reader, "read", b"v1", path=path)
    elif bug == "lost_write":
        call(writer, "write", path=path, data=b"v1")
        call(writer, "write", path=path, data=b"v2")
        call(reader, "read", b"v1", path=path)
    elif bug == "visible_after_unlink":
        call(writer, "write", path=path, data=b"v1")
        call(writer, "unlink", path=path)
        call(reader, "list", ["a"], path=top)
    elif bug == "resurrected_file":
        call(writer, "write", path=path, data=b"v1")
        call(writer, "unlink", path=path)
        call(reader, "read", None, "ENOENT", path=path)
        call(reader, "read", b"v1", path=path)
    elif bug == "wrong_errno":
        call(writer, "mkdir", path=path)
        call(writer, "write", path=f"{path}/x", data=b"v1")
        call(reader, "rmdir", None, "ENOENT", path=path)
    elif bug == "phantom_bytes":
        call(writer, "write", path=path, data=b"v1")
        call(reader, "read", b"never written", path=path)
    elif bug == "lost_after_crash":  # a library client's acknowledged write is never lost
        call(writer, "write", path=path, data=b"v1")
        bad.crash(writer, clock[0] + 0.0001)
        call(reader, "read", None, "ENOENT", path=path)
    elif bug == "read_from_the_future":  # a read that completed before the write was called saw it
        call(reader, "read", b"v1", path=path)
        call(writer, "write", path=path, data=b"v1")
    elif bug == "stale_stat_after_chmod":
        call(writer, "write", path=path, data=b"v1")
        call(writer, "chmod", path=path, mode=0o600)
        call(reader, "stat", {"kind": "file", "mode": 0o644, "uid": 0, "gid": 0, "nlink": 1, "size": 2}, path=path)
    return bad, added
