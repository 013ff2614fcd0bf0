"""Run many short histories against a real cluster, under faults, and check each.

:func:`run` starts a local cluster (three chunk servers, ``rs(2,1)``; the S3 gateway when S3
clients take part; the metadata service on SQLite, or on PostgreSQL with a second service to
fail over to), then ``hosts`` worker processes (:mod:`.hosts`: each in its own network
namespace when possible) with ``clients`` clients each, their kinds taken in turn from
``kinds`` (mount, library, s3, fsspec). Each history gets a fresh subtree ``/check-SEED/hN``
with the initial tree of :mod:`.plan`; every client makes ``calls`` calls on it at once, all
recorded; one fault of :data:`FAULT_KINDS` (in turn, with fault-free histories between) hits
while they run; the merged history is checked by :func:`tectofs.testing.linearize.check`.

Faults: ``meta-restart`` (SIGKILL the metadata service and start it again; with PostgreSQL
the clients fail over to the second service meanwhile), ``mount-kill`` (SIGKILL a mount; it
is mounted again during the next history: a client joining while others write),
``net-cut`` (a host's link down for :data:`NET_CUT_S`, then up; needs namespaces),
``chunk-kill`` (SIGKILL a chunk server; restarted after the history), ``pause`` (SIGSTOP a
mount for longer than its leases last, then SIGCONT).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from tectofs import limits
from tectofs.check import plan
from tectofs.check.hosts import Host, Network, why_no_namespaces
from tectofs.testing import linearize
from tectofs.testing.history import CLIENT_KINDS, KINDS, History

log = logging.getLogger(__name__)

FAULT_KINDS = ("meta-restart", "mount-kill", "net-cut", "chunk-kill", "pause")
FAULT_AT_S = 0.03  # after the history's start
NET_CUT_S = 2.0
LEASE_S = 1.0  # the metadata service's --lease: a paused mount's leases expire within it
PAUSE_S = LEASE_S + 1.0
HISTORY_TIMEOUT_S = 20.0  # a call still running after this is recorded as never completed
START_DELAY_S = 0.05
STEP_BUDGET = linearize.STEP_BUDGET


@dataclass
class Options:
    hosts: int = 3
    clients: int = 4
    calls: int = 4
    histories: int = 10
    faults: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    start: int = 0  # index of the first history (a replay of one: --start N --histories 1)
    metadata: str = "sqlite"
    kinds: tuple[str, ...] = CLIENT_KINDS
    leave_out: tuple[str, ...] = ()  # call kinds no client makes
    quiet: int = 1  # fault-free histories between two with a fault
    namespaces: bool | None = None  # None: when they can be made
    work: str | None = None  # a directory for the cluster, logs and violating histories
    step_budget: int = linearize.STEP_BUDGET  # the checker's, per history

    def replay(self, index: int) -> str:
        return (f"tectofs check --seed {self.seed} --start {index} --histories 1 --hosts {self.hosts}"
                f" --clients {self.clients} --calls {self.calls} --faults {','.join(self.faults) or 'none'}"
                f" --quiet-histories {self.quiet} --kinds {','.join(self.kinds)} --metadata {self.metadata}"
                + (f" --leave-out {','.join(self.leave_out)}" if self.leave_out else ""))


@dataclass
class Violation:
    index: int
    seed: int
    replay: str
    report: str
    saved: str


@dataclass
class Result:
    histories: int = 0
    operations: int = 0
    violations: list[Violation] = field(default_factory=list)
    undecided: list[int] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    calls: Counter[tuple[str, str]] = field(default_factory=Counter)  # (client kind, operation kind) -> completed
    joins: int = 0
    unknown: int = 0  # calls with no answer (timed out, cut off, their mount killed): fate unknown
    notes: list[str] = field(default_factory=list)  # what was left out, and why
    work: str = ""


def history_seed(seed: int, index: int) -> int:
    return seed * 1_000_003 + index


def mount_missing() -> str | None:
    """Why FUSE mounts cannot run here (None: they can)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3"
    return None


def run(options: Options, progress: Callable[[str], None] = lambda line: None) -> Result:
    """Run ``options.histories`` histories and check each; every process started is stopped."""
    if options.hosts < 1 or options.clients < 1 or options.calls < 1 or options.histories < 0:
        raise ValueError("--hosts, --clients and --calls must be at least 1, --histories at least 0")
    if options.quiet < 0 or set(options.leave_out) - set(KINDS):
        raise ValueError("--quiet-histories must be at least 0; --leave-out names call kinds")
    unknown = set(options.faults) - set(FAULT_KINDS)
    if unknown:
        raise ValueError(f"unknown fault {', '.join(sorted(unknown))}: choose from {', '.join(FAULT_KINDS)}")
    result = Result()
    kinds = list(options.kinds)
    faults = list(options.faults)
    if "mount" in kinds and mount_missing():
        result.notes.append(f"no mount clients: {mount_missing()}")
        kinds.remove("mount")
    if not kinds:
        raise ValueError("no client kind can run here")
    reason = why_no_namespaces() if options.namespaces is not False else "--no-namespaces"
    if options.namespaces and reason:
        raise ValueError(f"hosts need network namespaces: {reason}")
    if reason:
        result.notes.append(f"hosts are plain processes on 127.0.0.1 ({reason})")
        if "net-cut" in faults:
            result.notes.append("no net-cut faults: they need namespaces")
            faults.remove("net-cut")
    if "mount" not in kinds:
        for fault in ("mount-kill", "pause"):
            if fault in faults:
                result.notes.append(f"no {fault} faults: they need mounts")
                faults.remove(fault)
    work = options.work or tempfile.mkdtemp(prefix="tectofs-check-")
    os.makedirs(work, exist_ok=True)
    result.work = work
    with _layout(options, kinds, reason is None, work, progress) as (cluster, hosts, network, fs):
        session = _Session(options, cluster, hosts, network, fs, work, result, progress)
        schedule = [kind for fault in faults for kind in ["none"] * options.quiet + [fault]] or ["none"]
        for index in range(options.start, options.start + options.histories):
            session.history(index, schedule[index % len(schedule)])
    return result


@contextlib.contextmanager
def _layout(options: Options, kinds: list[str], namespaces: bool, work: str,
            progress: Callable[[str], None]) -> Iterator[tuple[Any, list[Host], Network | None, Any]]:
    from tectofs.client import connect
    from tectofs.server.cluster import LocalCluster

    network = Network(options.hosts) if namespaces else None
    hosts: list[Host] = []
    cluster: LocalCluster | None = None
    fs = None
    extra: Any = None
    try:
        if network is not None:
            network.build()
        address = network.server_address if network is not None else "127.0.0.1"
        store = None
        if options.metadata == "postgresql":
            from tectofs.testing import postgres

            extra = postgres.Server(os.path.join(work, "postgres")) if hasattr(postgres, "Server") else None
            if extra is None:
                raise ValueError("--metadata postgresql: tectofs.testing.postgres has no Server to start")
            store = extra.start()
        cluster = LocalCluster(os.path.join(work, "cluster"), servers=3, policy="rs(2,1)",
                               block_size=limits.block_size_min_bytes, host=address, server_dead_after_s=2.0,
                               heartbeat_interval_s=0.3, gc_delay_s=1.0, store=store,
                               s3_port=0 if "s3" in kinds else None, meta_args=["--lease", str(LEASE_S)])
        progress(f"starting a cluster on {address} (metadata: {options.metadata})")
        cluster.start()
        fs = connect(cluster.address, credentials=cluster.credential_file)
        s3: dict[str, str] = {}
        if "s3" in kinds:
            with open(cluster.s3_env_file) as file:
                env = dict(line.split("=", 1) for line in file.read().split())
            s3 = {"endpoint": f"http://{cluster.s3_address}", "access": env["AWS_ACCESS_KEY_ID"],
                  "secret": env["AWS_SECRET_ACCESS_KEY"]}
        progress(f"starting {options.hosts} hosts" + (" (network namespaces)" if network else ""))
        asked = []
        for k in range(options.hosts):
            host = Host(f"h{k}", network.namespace(f"h{k}") if network else None, os.path.join(work, f"h{k}.log"),
                        env=cluster.env)
            hosts.append(host)
            clients = [{"id": f"h{k}c{j}", "kind": kinds[(k + j) % len(kinds)]} for j in range(options.clients)]
            asked.append((host, host.send("setup", meta=cluster.address, credentials=cluster.credential_file,
                                          clients=clients, host=f"h{k}", s3=s3,
                                          mount_root=os.path.join(work, "mnt", f"h{k}"))))
        for host, answer in asked:
            reply = answer.get(timeout=60)
            if "error" in reply:
                raise RuntimeError(f"host {host.name}: setup: {reply['error']}")
        yield cluster, hosts, network, fs
    finally:
        for host in hosts:
            host.stop()
        if fs is not None:
            fs.close()
        if cluster is not None:
            cluster.stop()
        if extra is not None:
            extra.stop()
        if network is not None:
            network.delete()


class _Session:
    def __init__(self, options: Options, cluster: Any, hosts: list[Host], network: Network | None, fs: Any,
                 work: str, result: Result, progress: Callable[[str], None]) -> None:
        self.options = options
        self.cluster = cluster
        self.hosts = hosts
        self.network = network
        self.fs = fs
        self.work = work
        self.result = result
        self.progress = progress
        self.bucket = f"check-{options.seed}"
        self.fs.mkdir("/" + self.bucket) if not self.fs.exists("/" + self.bucket) else None
        self.mounts = [(host, client) for host in hosts for client in self._clients(host, "mount")]
        self.killed: list[tuple[Host, str]] = []  # mounts to mount again in the next history
        self.kinds_of: dict[str, str] = {}

    def _clients(self, host: Host, kind: str) -> list[str]:
        kinds = list(self.options.kinds)
        if "mount" in kinds and mount_missing():
            kinds.remove("mount")
        k = int(host.name[1:])
        return [f"h{k}c{j}" for j in range(self.options.clients) if kinds[(k + j) % len(kinds)] == kind]

    def history(self, index: int, fault: str) -> None:
        seed = history_seed(self.options.seed, index)
        base = f"/{self.bucket}/h{index}"
        self.fs.mkdir(base)
        for path, data in plan.INITIAL.items():
            if data is None:
                self.fs.mkdir(base + path)
            else:
                self.fs.write_bytes(base + path, data)
        start = time.time() + START_DELAY_S
        answers = [host.send("run", base=base, seed=seed, calls=self.options.calls, start=start,
                             timeout_s=HISTORY_TIMEOUT_S, leave_out=list(self.options.leave_out))
                   for host in self.hosts]
        joining, self.killed = self.killed, []
        for host, client in joining:  # mounted again while the others already write: a join
            host.send("start_mount", client=client)
            self.result.joins += 1
        undo = self._fault(index, fault, start)
        merged = History(initial=dict(plan.INITIAL), seed=seed, replay=self.options.replay(index))
        for host, answer in zip(self.hosts, answers):
            reply = answer.get(timeout=HISTORY_TIMEOUT_S + 30)
            if "error" in reply:
                raise RuntimeError(f"host {host.name}: history {index}: {reply['error']}")
            part = History.from_json(reply["history"])
            for declared in part.clients.values():
                merged.clients[declared.id] = declared
            for op in part.operations:
                merged.add(op.client, op.kind, op.invoke, op.complete, op.value, op.error, **op.args)
        if undo is not None:
            undo()
        self._account(merged, fault)
        verdict = linearize.check(merged, budget=self.options.step_budget)
        outcome = "ok"
        if not verdict.decided:
            self.result.undecided.append(index)
            outcome = "undecided"
        elif verdict.violation:
            saved = os.path.join(self.work, "violations", f"h{index}.json")
            os.makedirs(os.path.dirname(saved), exist_ok=True)
            merged.save(saved)
            self.result.violations.append(Violation(index, seed, merged.replay, verdict.report(), saved))
            outcome = "VIOLATION"
        self.progress(f"history {index}: {len(merged.operations)} operations, {len(merged.clients)} clients,"
                      f" fault {fault}: {outcome}")

    def _account(self, history: History, fault: str) -> None:
        self.result.histories += 1
        self.result.operations += len(history.operations)
        if fault != "none":
            self.result.faults[fault] += 1
        for op in history.operations:
            if op.complete is not None:
                self.result.calls[(history.clients[op.client].kind, op.kind)] += 1
            else:
                self.result.unknown += 1

    def _fault(self, index: int, fault: str, start: float) -> Callable[[], None] | None:
        """Start ``fault`` at ``start + FAULT_AT_S`` on a thread; returns what undoes it after the history."""
        if fault == "none":
            return None
        done = threading.Event()
        errors: list[BaseException] = []
        after: list[Callable[[], None]] = []

        def hit() -> None:
            try:
                time.sleep(max(0.0, start + FAULT_AT_S - time.time()))
                after.extend(self._hit(index, fault))
            except BaseException as exc:  # noqa: BLE001 - raised by undo(), on the runner's thread
                errors.append(exc)
            finally:
                done.set()

        threading.Thread(target=hit, daemon=True).start()

        def undo() -> None:
            done.wait(timeout=60)
            for step in after:
                step()
            if errors:
                raise RuntimeError(f"fault {fault} in history {index}: {errors[0]!r}")

        return undo

    def _hit(self, index: int, fault: str) -> list[Callable[[], None]]:
        if fault == "meta-restart":
            self.cluster.kill_meta(signal.SIGKILL)
            self.cluster.restart_meta()
            return []
        if fault == "chunk-kill":
            which = index % self.cluster.server_count
            self.cluster.kill_chunk_server(which)
            return [lambda: self.cluster.restart_chunk(which)]
        if fault == "net-cut":
            assert self.network is not None
            host = self.hosts[index % len(self.hosts)]
            self.network.cut(host.name)
            time.sleep(NET_CUT_S)
            self.network.restore(host.name)
            return []
        host, client = self.mounts[index % len(self.mounts)]
        if fault == "mount-kill":
            host.ask("kill_mount", client=client)
            self.killed.append((host, client))
            return []
        host.ask("pause_mount", client=client)  # pause
        time.sleep(PAUSE_S)
        host.ask("resume_mount", client=client)
        return []
