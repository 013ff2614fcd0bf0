"""The history checker: is a whole history explained by one order of its operations?

:func:`check` decides whether every operation of a :class:`~tectofs.testing.history.History`
can be placed at one instant inside its own ``[invoke, complete]`` interval so that, done one
after another in that order by the sequential model (``tectofs.testing.namespace_model``),
each answers what its client recorded (as far as that client kind can see). That is
linearizability of every call, which is what README.md promises for the namespace (metadata
leases are recalled before a change returns) and, at the granularity of whole calls (a write
is open-write-close, a read open-read-close), close-to-open for file contents.

Per-client rules from the history's :class:`~tectofs.testing.history.Client` records:

- **Unknown results.** A call that never completed (crash, timeout, EIO) may take effect at
  any time after its invoke, or never; its answer is not checked.
- **Crash loss.** A change acknowledged by a client killed at ``crashed_at`` may be lost
  (never take effect) if it completed within ``durability_window_s`` before the crash and no
  ``fsync`` of that client was called after it and completed before the crash. With a window
  of 0 (library, S3, fsspec, a mount with ``--no-async-creates``) nothing acknowledged is lost.
- **Caches.** A read-only call (read, stat, list, getxattr) of a client with
  ``stale_window_s`` (a mount with ``--no-leases``: its ``--attr-timeout``) may see the tree
  as it was up to that long before its invoke, never before the client's own previous call
  completed (a client always sees its own changes).
- **Clocks.** Each interval is widened by its client's ``clock_error_s`` on both sides.

The search is Wing & Gong's, with Lowe's memoization as in Knossos and Porcupine: calls and
returns in real-time order, the first pending call tried next, a visited set of (operations
done, model state) pruning repeats; a return reached before its operation is placed means
backtracking (or, for a change that may be lost, dropping it). Histories whose operations touch
disjoint top-level names are checked part by part (sound: such operations commute and no
answer depends on the other part; any call on ``/`` itself joins every part).

On a violation the operations are shrunk to a minimal core: those invoked after the last
instant the search reached are removed (they were never tried), then delta debugging frees
operations of their recorded answers (a freed operation may still take effect within its
interval, or not, with any answer: so the rest still has every prerequisite it had) while the
rest still cannot be ordered. The report lists the clients involved, each core operation with
its ``[invoke, complete]`` and answer, marks the answer no order explains with what the model
answered instead, and gives the seed and replay line the history carries.

``python3 -m tectofs.testing.linearize FILE.json``: exit 0 explained, 1 violation (the report on
stdout), 2 not a valid history, 3 undecided (the search hit its step budget).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from tectofs.testing.history import READ_KINDS, BadHistory, Client, History, Operation
from tectofs.testing.namespace_model import OPEN_CREATE, PROFILES, Outcome, Profile, StateKey, Tree, apply, observe

_PASSIVE_KINDS = READ_KINDS | {"fsync"}
STEP_BUDGET = 2_000_000  # search steps for a whole history before it is called undecided
SHRINK_STEP_BUDGET = 30_000  # per trial while shrinking (a trial over budget keeps its operations)
SHRINK_TOTAL_STEPS = 400_000  # for all trials of one shrinking


@dataclass(frozen=True)
class _Op:
    op: Operation
    profile: Profile
    lo: float  # earliest instant it may take effect
    hi: float | None  # latest (None: any time later)
    required: bool  # must take effect (else: it may never)
    checked: bool  # its answer must match the model's
    expected: Outcome
    note: str = ""


@dataclass
class _Search:
    ok: bool | None  # None: over budget
    failed: int | None = None  # index of the operation whose answer the deepest branch could not meet
    model_said: Outcome | None = None  # what the model answered it there
    reach: float = float("-inf")  # latest return the search ever reached
    steps: int = 0


@dataclass
class Verdict:
    ok: bool
    decided: bool = True
    core: list[Operation] = field(default_factory=list)
    impossible: Operation | None = None
    model_said: str = ""
    clients: list[Client] = field(default_factory=list)
    notes: dict[int, str] = field(default_factory=dict)
    explanation: str = ""
    seed: int | None = None
    replay: str = ""

    @property
    def violation(self) -> bool:
        return self.decided and not self.ok

    def report(self) -> str:
        if self.ok:
            return self.explanation
        lines = [self.explanation]
        if self.clients:
            lines.append("clients: " + "; ".join(_describe_client(c) for c in self.clients))
        for op in self.core:
            done = "?" if op.complete is None else f"{op.complete:.6f}"
            line = f"  #{op.id} [{op.invoke:.6f}, {done}] {op.client}: {op.describe()} -> {op.outcome()}"
            if op is self.impossible:
                line += f"   <-- impossible (the model: {self.model_said})"
            if op.id in self.notes:
                line += f"   ({self.notes[op.id]})"
            lines.append(line)
        if self.seed is not None or self.replay:
            lines.append(f"seed {self.seed}: {self.replay or '(no replay line recorded)'}")
        return "\n".join(lines)


def _describe_client(client: Client) -> str:
    text = f"{client.id} ({client.kind} on {client.host}"
    if client.crashed_at is not None:
        text += f", killed at {client.crashed_at:.6f}"
    if client.durability_window_s:
        text += f", may lose {client.durability_window_s:g} s of changes"
    if client.stale_window_s:
        text += f", caches {client.stale_window_s:g} s"
    return text + ")"


def _prepare(history: History) -> list[_Op]:
    history.validate()
    prepared: dict[int, _Op] = {}
    helpers: list[_Op] = []  # each write's open: a new name shows, empty, until the close
    by_client: dict[str, list[Operation]] = {}
    for op in history.operations:
        by_client.setdefault(op.client, []).append(op)
    for client_id, ops in by_client.items():
        client = history.clients[client_id]
        profile = PROFILES[client.kind]
        ops.sort(key=lambda o: o.invoke)
        fsyncs = [o for o in ops if o.kind == "fsync" and o.error is None and o.complete is not None]
        previous_complete: float | None = None
        for op in ops:
            if op.kind not in profile.kinds:
                raise BadHistory(f"operation {op.id}: a {client.kind} client cannot {op.kind}")
            lo = op.invoke - client.clock_error_s
            hi = None if op.complete is None else op.complete + client.clock_error_s
            note = ""
            if op.kind in READ_KINDS and client.stale_window_s:
                lo = op.invoke - client.stale_window_s - client.clock_error_s
                if previous_complete is not None and previous_complete <= op.invoke:  # strictly after: its own changes are seen
                    lo = max(lo, math.nextafter(previous_complete, math.inf))
                note = f"may answer from a cache up to {client.stale_window_s:g} s old"
            at_risk = False
            if op.complete is not None and client.crashed_at is not None and op.kind not in READ_KINDS \
                    and op.error is None and op.complete >= client.crashed_at - client.durability_window_s:
                at_risk = not any(f.invoke >= op.complete and f.complete is not None and f.complete <= client.crashed_at
                                  for f in fsyncs)
                if at_risk:
                    note = "acknowledged within the durability window before its client was killed: may be lost"
            expected = observe(profile, op.kind, (op.value, op.error))
            prepared[op.id] = _Op(op, profile, lo, hi, required=hi is not None and not at_risk,
                                  checked=op.complete is not None, expected=expected, note=note)
            if op.kind in ("write", "append") and op.error is None and profile.empty_while_writing:
                opened = Operation(op.id, op.client, OPEN_CREATE, {"path": op.args["path"]}, op.invoke, op.complete)
                helpers.append(_Op(opened, profile, lo, hi, required=prepared[op.id].required, checked=False,
                                   expected=(None, None)))
            if op.complete is not None:
                previous_complete = op.complete if previous_complete is None else max(previous_complete, op.complete)
    in_order = [prepared[op.id] for op in history.operations]
    return in_order + _seen_opens(in_order, helpers)


def _seen_opens(ops: list[_Op], opens: list[_Op]) -> list[_Op]:
    """The writes' opens some other call could see: one on a related path overlapping the
    write in time, other than a write or append (which ends the same whether the open made the
    name empty before it or not). Any other open is placed right before its write in some
    order: no call can tell it apart from the write."""
    by_top: dict[str, list[_Op]] = {}
    for item in ops:
        if item.op.kind in ("write", "append"):
            continue
        for top in {path.strip("/").split("/", 1)[0] for path in _touches(item)}:
            by_top.setdefault(top, []).append(item)
    seen = []
    for opened in opens:
        path = opened.op.paths()[0]
        hi = math.inf if opened.hi is None else opened.hi
        nearby = by_top.get(path.strip("/").split("/", 1)[0], []) + by_top.get("", [])
        if any(other.op.id != opened.op.id and other.lo <= hi and (other.hi is None or other.hi >= opened.lo)
               and any(_related(path, p) for p in _touches(other)) for other in nearby):
            seen.append(opened)
    return seen


def _related(a: str, b: str) -> bool:
    """Whether one path is the other or lies below it (``/`` is related to every path)."""
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")


def _touches(item: _Op) -> list[str]:
    """The paths whose entries an operation may read or change: its arguments' paths, and the
    parents a write of a client kind that makes parent directories may make."""
    paths = item.op.paths()
    if item.profile.makes_parents and item.op.kind in ("write", "append", "create", "mkdir"):
        parts = paths[0].strip("/").split("/")
        paths = paths + ["/" + "/".join(parts[:depth]) for depth in range(1, len(parts))]
    return paths


def _partition(ops: list[_Op]) -> list[list[_Op]]:
    """Groups of operations no two of which touch related paths across groups. Sound: an
    operation's answer depends only on the entries at, above and below its paths, which no
    other group's operation touches (``/`` relates to everything, so a call on it is one group)."""
    parent: dict[str, str] = {}

    def find(name: str) -> str:
        while parent.setdefault(name, name) != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    touched = [_touches(item) for item in ops]
    paths = sorted({path for group in touched for path in group})
    for index, path in enumerate(paths):
        for other in paths[index + 1:]:
            if _related(path, other):
                parent[find(other)] = find(path)
    for group in touched:
        for path in group[1:]:
            parent[find(path)] = find(group[0])
    groups: dict[str, list[_Op]] = {}
    for item, group in zip(ops, touched):
        groups.setdefault(find(group[0]), []).append(item)
    return list(groups.values())


def _restricted(initial: dict[str, bytes | None], ops: Sequence[_Op]) -> Tree:
    """The initial tree as far as ``ops`` can see it: entries at, above or below their paths."""
    paths = {path for item in ops for path in _touches(item)}
    return Tree.initial({entry: data for entry, data in initial.items() if any(_related(entry, p) for p in paths)})


def _search(ops: Sequence[_Op], initial: Tree, budget: int) -> _Search:
    """Wing & Gong / Lowe over ``ops`` from ``initial``: whether an order exists."""
    events = []
    for index, item in enumerate(ops):
        events.append((item.lo, 0, index))
        if item.hi is not None:
            events.append((item.hi, 1, index))
    events.sort()
    count = len(events)
    head, tail = 0, count + 1
    nxt = list(range(1, count + 2)) + [tail]
    prv = [head] + list(range(0, count + 1))
    call_node = [0] * len(ops)
    return_node = [-1] * len(ops)
    node_op = [0] * (count + 2)
    node_is_call = [False] * (count + 2)
    node_time = [0.0] * (count + 2)
    for position, (when, is_return, index) in enumerate(events, start=1):
        node_op[position] = index
        node_time[position] = when
        if is_return:
            return_node[index] = position
        else:
            call_node[index] = position
            node_is_call[position] = True

    def remove(node: int) -> None:
        nxt[prv[node]] = nxt[node]
        prv[nxt[node]] = prv[node]

    def restore(node: int) -> None:
        nxt[prv[node]] = node
        prv[nxt[node]] = node

    def lift(index: int) -> None:
        remove(call_node[index])
        if return_node[index] >= 0:
            remove(return_node[index])

    def unlift(index: int) -> None:
        if return_node[index] >= 0:
            restore(return_node[index])
        restore(call_node[index])

    steps_cache: dict[tuple[int, StateKey], tuple[Tree, bool, Outcome]] = {}

    def step(state: Tree, index: int) -> tuple[Tree, bool, Outcome]:
        memo = (index, state.key())
        found = steps_cache.get(memo)
        if found is None:
            item = ops[index]
            after, outcome = apply(state, item.op.kind, item.op.args, item.profile)
            seen = observe(item.profile, item.op.kind, outcome)
            found = (after, not item.checked or seen == item.expected, seen)
            steps_cache[memo] = found
        return found

    # A write's open (OPEN_CREATE) goes before the write: placing the write places its open
    # with it (just before: no effect), if the open was not placed already.
    main_of_id = {item.op.id: index for index, item in enumerate(ops) if item.op.kind != OPEN_CREATE}
    opening = [-1] * len(ops)
    for index, item in enumerate(ops):
        if item.op.kind == OPEN_CREATE and item.op.id in main_of_id:
            opening[main_of_id[item.op.id]] = index

    result = _Search(ok=None)
    state = initial
    done = 0
    visited: set[tuple[int, StateKey]] = set()
    stack: list[tuple[int, Tree, bool, int]] = []  # (placed or dropped, state before, no alternative, its open)
    required_left = sum(1 for item in ops if item.required)
    passive = [item.op.kind in _PASSIVE_KINDS or (item.checked and item.expected[1] is not None) for item in ops]
    best_depth = -1
    node = nxt[head]
    while required_left:
        result.steps += 1
        if result.steps > budget:
            return result
        assert node != tail, "a required return is always ahead"
        index = node_op[node]
        if node_is_call[node]:
            after, matches, _ = step(state, index)
            if not matches:
                node = nxt[node]
                continue
            # A call that changes nothing wherever it is placed (a read, or an error it must answer)
            # is never better placed later than now (no other answer changes; every call it must
            # follow is already placed): take it, and never try the others in its stead.
            unchanged = passive[index]
            opened = opening[index]
            if opened >= 0 and done >> opened & 1:
                opened = -1
            placed = done | (1 << index) | (1 << opened if opened >= 0 else 0)
            key = (placed, after.key())
            if key not in visited:
                visited.add(key)
                stack.append((index, state, unchanged, opened))
                state, done = after, placed
                lift(index)
                required_left -= ops[index].required
                if opened >= 0:
                    lift(opened)
                    required_left -= ops[opened].required
                node = nxt[head]
                continue
            if not unchanged:
                node = nxt[node]
                continue
        else:
            result.reach = max(result.reach, node_time[node])
            if not ops[index].required:  # a change that may be lost: drop it
                key = (done | (1 << index), state.key())
                if key not in visited:
                    visited.add(key)
                    stack.append((index, state, True, -1))
                    done |= 1 << index
                    lift(index)
                    node = nxt[head]
                    continue
            if len(stack) > best_depth:
                best_depth = len(stack)
                result.failed, result.model_said = index, step(state, index)[2]
        while True:  # backtrack to the latest choice that has alternatives
            if not stack:
                result.ok = False
                return result
            undone, state, final, opened = stack.pop()
            if opened >= 0:
                done &= ~(1 << opened)
                unlift(opened)
                required_left += ops[opened].required
            done &= ~(1 << undone)
            unlift(undone)
            required_left += ops[undone].required
            if not final:
                node = nxt[call_node[undone]]
                break
    result.ok = True
    return result


def _shrink(ops: list[_Op], initial: dict[str, bytes | None], reach: float,
            failed: Operation) -> tuple[list[_Op], _Search, bool]:
    """A minimal set of operations that, alone, is explained except for ``failed``'s answer
    (delta debugging by removing operations); the search over it; whether every trial finished
    within its budget (else the set may not be minimal).

    A trial set counts as still failing only if it cannot be ordered, *and* it can be once
    ``failed``'s answer is not checked (so removing what another operation needs, the ``mkdir``
    before a ``write`` below it, never makes a core), *and* ``failed``'s answer is possible
    with some of the others taking effect in their intervals (so removing the ``write`` whose
    bytes a read answered never makes one: a read of bytes nobody wrote is its own core)."""
    ops = [item for item in ops if item.lo <= reach]
    target = next(index for index, item in enumerate(ops) if item.op is failed)
    unchecked_target = replace(ops[target], checked=False)
    spent = [0, 1]  # steps; 1 while every trial was decided

    def search(trial: list[_Op]) -> _Search:
        budget = min(SHRINK_STEP_BUDGET, max(1, SHRINK_TOTAL_STEPS - spent[0]))
        found = _search(trial, _restricted(initial, trial), budget)
        spent[0] += found.steps
        if found.ok is None:
            spent[1] = 0
        return found

    def freed(keep: list[int]) -> list[_Op]:
        return [ops[index] if index == target else replace(ops[index], checked=False, required=False) for index in keep]

    # Is the marked answer possible at all, with any of the others taking effect? If not, it is its own core.
    possible = search(freed(list(range(len(ops))))).ok
    sources = possible is True

    def fails(keep: list[int]) -> _Search | None:
        found = search([ops[index] for index in keep])
        if found.ok is not False:
            return None
        if search([unchecked_target if index == target else ops[index] for index in keep]).ok is not True:
            return None  # the rest needs something removed
        if sources and search(freed(keep)).ok is False:
            return None  # what explained the marked answer was removed
        return found

    if possible is False and fails([target]) is not None:
        return [ops[target]], _search([ops[target]], _restricted(initial, [ops[target]]), STEP_BUDGET), True

    others = [index for index in range(len(ops)) if index != target]
    near = [index for index in others if any(_related(a, b) for a in _touches(ops[index]) for b in _touches(ops[target]))]
    if len(near) < len(others) and fails(sorted(near + [target])) is not None:
        others = near  # most cores are calls on the marked call's paths, and above and below them
    chunks = 2
    while others:
        size = -(-len(others) // chunks)
        pieces = [others[start:start + size] for start in range(0, len(others), size)]
        for piece in pieces:
            rest = [index for index in others if index not in piece]
            if fails(sorted(rest + [target])) is not None:
                others, chunks = rest, max(chunks - 1, 2)
                break
        else:
            if chunks >= len(others):
                break
            chunks = min(len(others), chunks * 2)
    core = sorted(others + [target])
    final = fails(core) if len(core) < len(ops) else None
    if final is None:  # nothing could be removed (or a trial over budget)
        core = list(range(len(ops)))
        final = _search(ops, _restricted(initial, ops), STEP_BUDGET)
    return [ops[index] for index in core], final, bool(spent[1])


def check(history: History, budget: int = STEP_BUDGET, shrink: bool = True) -> Verdict:
    """Whether ``history`` is explained by one order of its operations (module docstring);
    on a violation, a minimal core of operations that cannot be ordered. Raises
    :class:`~tectofs.testing.history.BadHistory` for a record that is not a valid history."""
    ops = _prepare(history)
    verdict = Verdict(ok=True, seed=history.seed, replay=history.replay)
    if not ops:
        verdict.explanation = "no operations"
        return verdict
    total_steps = 0
    groups = _partition(ops)
    for group in groups:
        tree = _restricted(history.initial, group)
        try:
            found = _search(group, tree, budget)
        except ValueError as exc:
            raise BadHistory(str(exc)) from exc
        total_steps += found.steps
        if found.ok is None:
            verdict.ok, verdict.decided = False, False
            verdict.explanation = (f"undecided: no order found within {budget} search steps for"
                                   f" {len(group)} operations (raise the budget)")
            return verdict
        if found.ok is False:
            return _violation(verdict, group, history, found, shrink)
    verdict.explanation = (f"ok: {len(history.operations)} operations from {len(history.clients)} clients explained by one order"
                           f" ({len(groups)} independent parts, {total_steps} search steps)")
    return verdict


def _violation(verdict: Verdict, group: list[_Op], history: History, found: _Search, shrink: bool) -> Verdict:
    assert found.failed is not None
    failed = group[found.failed].op
    if shrink:
        core, final, minimal = _shrink(group, history.initial, found.reach, failed)
    else:
        core, final, minimal = group, found, False
    verdict.ok = False
    verdict.core = sorted((item.op for item in core if item.op.kind != OPEN_CREATE), key=lambda op: (op.invoke, op.id))
    verdict.impossible = core[final.failed].op if final.failed is not None else failed
    said = final.model_said
    verdict.model_said = "unknown" if said is None else (said[1] or ("ok" if said[0] is None else repr(said[0])))
    verdict.notes = {item.op.id: item.note for item in core if item.note}
    verdict.clients = [history.clients[c] for c in sorted({op.client for op in verdict.core})]
    verdict.explanation = (
        f"VIOLATION: these {len(verdict.core)} operations (of {len(history.operations)}) cannot be ordered:"
        " without the marked answer they are explained by an order consistent with real time, with it by none"
        + ("" if minimal else " (shrinking ran out of budget: the set may not be minimal)"))
    return verdict


def main(argv: list[str] | None = None) -> int:
    """``python3 -m tectofs.testing.linearize FILE.json``: 0 ok, 1 violation, 2 bad input, 3 undecided."""
    parser = argparse.ArgumentParser(prog="python3 -m tectofs.testing.linearize",
                                     description="Check a recorded history against the namespace model.")
    parser.add_argument("file", help="a history saved by tectofs.testing.history.History.save")
    parser.add_argument("--budget", type=int, default=STEP_BUDGET, help="search steps before giving up (exit 3)")
    args = parser.parse_args(argv)
    try:
        verdict = check(History.load(args.file), budget=args.budget)
    except BadHistory as exc:
        sys.stderr.write(f"linearize: {args.file}: {exc}\n")
        return 2
    sys.stdout.write(verdict.report() + "\n")
    if not verdict.decided:
        return 3
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
