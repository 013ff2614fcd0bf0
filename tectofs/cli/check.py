"""``tectofs check``: record histories of many clients on several hosts under faults, and
check each for one order of its calls that explains every answer (tectofs.check)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tectofs.arguments import numbers
from tectofs.check import runner
from tectofs.testing.history import CLIENT_KINDS, KINDS

from .common import UsageError

DESCRIPTION = """\
Start a local cluster (metadata service, three chunk servers, the S3 gateway) and HOSTS client
hosts, each in its own network namespace (as root where namespaces can be made; else plain
processes), with CLIENTS clients each: FUSE mounts, client-library clients, S3 clients (boto3)
and fsspec clients, in turn. Each history gives them a fresh small tree; every client makes
CALLS random calls on it at once (create, write, append, read, stat, list, rename, link,
unlink, chmod, chown, truncate, mkdir, rmdir, setxattr, getxattr, fsync: those its kind can
make), each call's start, end and answer recorded, while one fault hits (in turn, with
fault-free histories between). Each history is then checked: is it explained by one order of
its calls, each taking effect at one instant between its start and its end
(linearizability)? A violation prints the smallest set of calls that cannot be ordered, the
seed and a command that replays that history; the history is saved as JSON
(python3 -m tectofs.testing.linearize FILE checks it again)."""

EPILOG = """\
faults (--faults, comma-separated; 'none' for none):
  meta-restart  SIGKILL the metadata service and start it again
  mount-kill    SIGKILL a mount; it is mounted again during the next history (a joining client)
  net-cut       take a host's network down for 2 s, then up (needs namespaces)
  chunk-kill    SIGKILL a chunk server (started again after the history)
  pause         SIGSTOP a mount until its metadata leases have expired, then SIGCONT

exit status: 0 no violation (histories the checker could not decide within --step-budget are
  counted and listed, not failed), 1 violations (printed, minimized), 2 bad usage.

examples:
  sudo tectofs check                              # 3 hosts x 4 clients, 10 histories, every fault
  sudo tectofs check --histories 10000 --work /var/tmp/check   # a long run; violations saved there
  tectofs check --kinds library,fsspec --faults none --hosts 1"""


class NameList:
    """An option's type: comma-separated names, each one of ``choices`` (``none`` for none,
    where ``none_ok``); takes no number."""

    def __init__(self, choices: tuple[str, ...], none_ok: bool) -> None:
        self.choices, self.none_ok = choices, none_ok

    def __call__(self, text: str) -> tuple[str, ...]:
        if self.none_ok and text == "none":
            return ()
        chosen = tuple(part.strip() for part in text.split(",") if part.strip())
        wrong = [part for part in chosen if part not in self.choices]
        if wrong or not chosen:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(self.choices)}" +
                                             (" or none" if self.none_ok else ""))
        return chosen


def add_parser(sub: Any) -> None:
    p = sub.add_parser("check", help="run many clients on several hosts under faults and check every history"
                       " for one order that explains it", description=DESCRIPTION, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hosts", type=numbers.count(1), default=3, help="client hosts (default 3)")
    p.add_argument("--clients", type=numbers.count(1), default=4, help="clients on each host (default 4)")
    p.add_argument("--calls", type=numbers.count(1), default=4, help="calls each client makes in each history (default 4)")
    p.add_argument("--histories", type=numbers.count(0), default=10, help="histories to run (default 10)")
    p.add_argument("--start", type=numbers.count(0), default=0, help="index of the first history (replays: --start N"
                   " --histories 1)")
    p.add_argument("--faults", type=NameList(runner.FAULT_KINDS, True), default=runner.FAULT_KINDS,
                   help=f"faults to inject, in turn (default all: {','.join(runner.FAULT_KINDS)}; none: none)")
    p.add_argument("--kinds", type=NameList(CLIENT_KINDS, False), default=CLIENT_KINDS,
                   help=f"client kinds, taken in turn on each host (default {','.join(CLIENT_KINDS)})")
    p.add_argument("--quiet-histories", dest="quiet_histories", type=numbers.count(0), default=1,
                   help="fault-free histories between two with a fault (default 1)")
    p.add_argument("--leave-out", type=NameList(KINDS, True), default=(),
                   help="call kinds no client makes (comma-separated; default none)")
    p.add_argument("--seed", type=numbers.count(0), default=0, help="seed of every random choice (default 0)")
    p.add_argument("--metadata", choices=("sqlite",), default="sqlite",
                   help="the metadata store (sqlite; postgresql failover is not in this command yet)")
    p.add_argument("--namespaces", dest="namespaces", action="store_true", default=None,
                   help="require network namespaces (default: use them when they can be made)")
    p.add_argument("--no-namespaces", dest="namespaces", action="store_false",
                   help="hosts are plain processes on 127.0.0.1")
    p.add_argument("--step-budget", type=numbers.count(1000), default=runner.STEP_BUDGET,
                   help=f"the checker's search steps per history before it is undecided (default {runner.STEP_BUDGET})")
    p.add_argument("--work", help="directory for the cluster, the hosts' logs and violating histories"
                   " (default: a new one under $TMPDIR)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    p.set_defaults(fn=cmd_check)


def cmd_check(args: argparse.Namespace) -> None:
    options = runner.Options(hosts=args.hosts, clients=args.clients, calls=args.calls, histories=args.histories,
                             faults=args.faults, seed=args.seed, start=args.start, metadata=args.metadata,
                             kinds=args.kinds, leave_out=args.leave_out, quiet=args.quiet_histories,
                             namespaces=args.namespaces, work=args.work,
                             step_budget=args.step_budget)

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    try:
        result = runner.run(options, progress)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for note in result.notes:
        print(f"note: {note}")
    for violation in result.violations:
        print(f"\nhistory {violation.index} (seed {violation.seed}), saved as {violation.saved}:")
        print(violation.report)
    print(f"\n{result.histories} histories, {result.operations} operations ({result.unknown} with no answer),"
          f" {len(result.violations)} violations,"
          f" {len(result.undecided)} undecided; faults: "
          f"{', '.join(f'{k} {v}' for k, v in sorted(result.faults.items())) or 'none'}; joins: {result.joins};"
          f" work directory: {result.work}")
    if result.undecided:
        print(f"undecided (search over --step-budget): histories {', '.join(map(str, result.undecided))}")
    if result.violations:
        raise SystemExit(1)
