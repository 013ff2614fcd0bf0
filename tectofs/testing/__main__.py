"""``python3 -m tectofs.testing --seed N``: replay one schedule with its trace;
``--seeds A..B``: run many, print each failure with the command that replays it."""

from __future__ import annotations

import argparse
import collections
import sys
import time

from tectofs.testing.schedule import SimulationFailed, run


def _range(text: str) -> range:
    first, sep, last = text.partition("..")
    if not sep:
        raise argparse.ArgumentTypeError(f"expected A..B, got {text!r}")
    return range(int(first), int(last) + 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tectofs.testing", description=__doc__)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--seed", type=int, help="replay one schedule, printing its trace")
    which.add_argument("--seeds", type=_range, help="run schedules A..B (inclusive); print failures")
    args = parser.parse_args(argv)
    if args.seed is not None:
        try:
            sim = run(args.seed, echo=print)
        except SimulationFailed as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"seed {args.seed}: all invariants held; {dict(sorted(sim.stats.items()))}")
        return 0
    started = time.perf_counter()
    failures = 0
    totals: collections.Counter[str] = collections.Counter()
    for seed in args.seeds:
        try:
            totals.update(run(seed).stats)
        except SimulationFailed as exc:
            failures += 1
            print(exc, file=sys.stderr)
    print(f"{len(args.seeds)} schedules, {failures} failed, {time.perf_counter() - started:.1f} s;"
          f" {dict(sorted(totals.items()))}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
