"""Simulated histories: several leasing clients on one small shared tree, under the simulator's
faults, their calls recorded and checked by the history checker (``tectofs.testing.linearize``).

``run_history(seed)`` builds a cluster of production roles (``tectofs.testing.cluster``: the real
metadata service, chunk servers and client code on a virtual clock), makes a small tree
(``/d0``, ``/d1``, each with a subdirectory ``s0`` and a file ``f0``), then starts
:data:`CLIENTS` library clients on hosts of their own, each as the FUSE mount sets its client up
(``AsyncFileSystem(leases=True)``: metadata leases, a cache answering under them, claimed
directories creating and unlinking without calls, small files' commits sent in the background).
Each client makes a few random calls of the kinds the namespace model knows
(``tectofs.testing.sim_workload``) on names in that tree, so calls collide and often fail; each
is recorded with its virtual-time invoke and complete (``tectofs.testing.history``). A call whose
fate nobody knows (a timeout, a lost connection, EIO) is recorded as never completed. Histories
are short (a few calls per client) so that many of them fit in a test run.

Meanwhile faults strike (:data:`FAULTS`, :data:`FAULT_COUNT` of them, each chosen by the seed):
the metadata service crashes and restarts, a chunk server is killed (and restarted later), a
client's host is partitioned from the network for less than its lease (its unsent creates would
otherwise be refused, which is a crash's loss in a client that lives on), or a client's process
is paused for longer than its lease (its calls stop; what it sends and what is sent to it waits
in the network, :class:`~tectofs.testing.sim_workload.PausingNetwork`), while the network delays and drops messages as in the
fault schedules. Then faults stop, every client sends what it holds (``sync``) and lists the
tree once more (the first one also reads every file), and the history is checked: a violation
raises :class:`HistoryViolation` with the checker's minimal core and the command replaying the
seed. A seed replays exactly: everything is decided by it (the roles' little chance comes from
the seeded global source, as in the schedules).

Nothing can hang: the virtual run ends at :data:`VIRTUAL_DEADLINE_S`, a loop that spins without
virtual time passing (:data:`STALL_STEPS`) or a run over :data:`WALL_BUDGET_S` of real time raises
:class:`HistoryStuck`, and the checker's search has a step budget (:data:`CHECK_BUDGET`; a
history over it is counted ``undecided``, not failed).

``python3 -m tectofs.testing.sim_histories --histories N --start S`` checks seeds S..S+N-1 and
prints each violation with its replay command; ``--seed S`` replays one with its trace.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import Counter
from collections.abc import Callable

from tectofs.client import AsyncFileSystem
from tectofs.testing.cluster import Cluster, quiet_logs
from tectofs.testing.history import History
from tectofs.testing.linearize import Verdict, check
from tectofs.testing.loop import SimLoop, host_context
from tectofs.testing.network import NetworkFaults
from tectofs.testing.sim_workload import KIND_WEIGHTS, PausingNetwork, Workload, initial_tree
from tectofs.wire import auth

CLIENTS = 3
POLICY = "rep(2)"
OPERATIONS = (3, 7)  # calls per client
FAULTS = ("crash_meta", "crash_chunk", "partition_client", "pause_client")
FAULT_COUNT = (1, 2)
FAULT_GAP_S = (0.0, 1.2)  # before each fault: the clients' calls take about a second or two
PARTITION_S = (0.5, 12.0)  # a client's host off the network (its lease is limits.lease_s = 30 s)
PAUSE_S = (31.0, 50.0)  # a client's process stopped: past its lease
VIRTUAL_DEADLINE_S = 900.0
STALL_STEPS = 50_000  # event-loop steps without virtual time passing: a task spins (a livelock)
WALL_BUDGET_S = 60.0  # real seconds one history may take before it is called stuck
CHECK_BUDGET = 300_000  # the checker's search steps per history (over it: undecided)
CLIENT_HOST = "10.0.9.{}"


def replay_command(seed: int) -> str:
    return f"python3 -m tectofs.testing.sim_histories --seed {seed}"


class HistoryViolation(AssertionError):
    """The checker found no order explaining a simulated history; the message is its report."""

    def __init__(self, message: str, verdict: Verdict | None = None, history: History | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.history = history


class HistoryStuck(AssertionError):
    """A simulated history did not finish: a task spun without virtual time passing, or the run
    took more than its real-time budget. The message names where and the replay command."""


class _StepGuard:
    """Bounds one run of the loop: :data:`STALL_STEPS` steps at one virtual instant (a task that
    re-arms a timer shorter than the clock's resolution, say, spins forever in virtual time),
    and :data:`WALL_BUDGET_S` of real time (checked every 1,024 steps)."""

    def __init__(self, loop: SimLoop, seed: int) -> None:
        self.loop, self.seed = loop, seed
        self.step = loop._run_once  # type: ignore[attr-defined]
        self.instant = -1.0
        self.same = 0
        self.steps = 0
        self.wall_deadline = time.perf_counter() + WALL_BUDGET_S

    def __enter__(self) -> _StepGuard:
        self.loop._run_once = self._guarded  # type: ignore[attr-defined]
        return self

    def __exit__(self, *_: object) -> None:
        del self.loop._run_once  # type: ignore[attr-defined]

    def _guarded(self) -> None:
        now = self.loop.time()
        if now != self.instant:
            self.instant, self.same = now, 0
        else:
            self.same += 1
            if self.same > STALL_STEPS:
                raise HistoryStuck(self._stuck(f"{STALL_STEPS:,} loop steps without virtual time passing"))
        self.steps += 1
        if not self.steps & 1023 and time.perf_counter() > self.wall_deadline:
            raise HistoryStuck(self._stuck(f"over {WALL_BUDGET_S:g} s of real time"))
        self.step()

    def _stuck(self, why: str) -> str:
        ready = []
        for handle in list(self.loop._ready)[:4]:  # type: ignore[attr-defined]
            task = getattr(getattr(handle, "_callback", None), "__self__", None)
            if isinstance(task, asyncio.Task):
                frames = task.get_stack(limit=3)
                ready.append(" <- ".join(f"{f.f_code.co_name} ({f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_lineno})"
                                         for f in frames))
        where = "; ".join(ready) or "no task ready"
        return (f"simulated history seed {self.seed} stuck at virtual {self.loop.time():.6f} s: {why};"
                f" running: {where}\n  replay: {replay_command(self.seed)}")


class HistorySimulation:
    def __init__(self, seed: int, *, kinds: dict[str, int] | None = None, faults: tuple[str, ...] = FAULTS,
                 clients: int = CLIENTS, operations: tuple[int, int] = OPERATIONS,
                 echo: Callable[[str], None] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        net_faults = NetworkFaults(delay_p=self.rng.choice([0.0, 0.01, 0.05]),
                                   drop_p=self.rng.choice([0.0, 0.0, 0.002, 0.01]))
        self.cluster = Cluster(seed, self.rng, net_faults, 3, echo=echo, network_type=PausingNetwork)
        self.network: PausingNetwork = self.cluster.network  # type: ignore[assignment]
        self.trace = self.cluster.trace
        self.kinds = dict(KIND_WEIGHTS if kinds is None else kinds)
        self.fault_kinds = faults
        self.operations = operations
        self.history = History(initial=initial_tree(), seed=seed, replay=replay_command(seed))
        self.clients: list[Workload] = []
        self.recent: list[str] = []  # the paths calls named, in order (the workload names them again)
        self.client_count = clients
        self.stats: Counter[str] = Counter()

    def clock(self) -> float:
        return self.cluster.clock.now

    def start_client(self, number: int) -> AsyncFileSystem:
        credential = auth.Credential.root_from_keys(auth.KeyRing(self.cluster.key_file))
        fs: AsyncFileSystem = host_context(CLIENT_HOST.format(10 + number)).run(
            AsyncFileSystem, self.cluster.meta_address, credential, clock=self.cluster.clock.monotonic, leases=True)
        if fs.claims is not None:  # as the mount sets it (client/fuse/mount.py)
            fs.claims.commits_in_background = True
        return fs

    async def setup(self) -> None:
        cluster = self.cluster
        await cluster.start_meta()
        for chunk in cluster.chunks:
            await cluster.start_chunk(chunk)
        credential = auth.Credential.root_from_keys(auth.KeyRing(cluster.key_file))
        maker_host = CLIENT_HOST.format(9)  # a client without leases (no recorded calls) makes the tree
        maker = host_context(maker_host).run(AsyncFileSystem, cluster.meta_address, credential,
                                             clock=cluster.clock.monotonic)
        for path, data in sorted(self.history.initial.items()):
            if data is None:  # two copies, on two of the three servers: one may be killed
                await cluster.loop.spawn(maker_host, maker.mkdir(path, policy=POLICY))
            else:
                await cluster.loop.spawn(maker_host, maker.write_bytes(path, data))
        await cluster.loop.spawn(maker_host, maker.close())
        for number in range(self.client_count):
            name, host = f"c{number}", CLIENT_HOST.format(10 + number)
            self.history.client(name, "library", host)
            self.clients.append(Workload(name, host, self.start_client(number), self,
                                         random.Random(self.rng.getrandbits(64))))

    async def faults(self) -> None:
        """The faults of this seed, one after another at random instants while the clients work."""
        for _ in range(self.rng.randint(*FAULT_COUNT)):
            await asyncio.sleep(self.rng.uniform(*FAULT_GAP_S))
            if all(w.done for w in self.clients):
                return
            kind = self.rng.choice(self.fault_kinds) if self.fault_kinds else "none"
            self.stats[f"fault_{kind}"] += 1
            cluster = self.cluster
            if kind == "crash_meta" and cluster.meta is not None:
                cluster.crash_meta()
                await asyncio.sleep(self.rng.uniform(0.5, 6.0))
                await cluster.start_meta(cluster.meta_skew_s + self.rng.choice([0.0, 0.0, self.rng.uniform(-2.0, 2.0)]))
            elif kind == "crash_chunk":
                up = [c for c in cluster.chunks if c.up]
                if len(up) == len(cluster.chunks):  # one at a time: rep(2) keeps a copy readable
                    chunk = self.rng.choice(up)
                    cluster.crash_chunk(chunk)
                    await asyncio.sleep(self.rng.uniform(0.5, 10.0))
                    if cluster.meta is not None:
                        await cluster.start_chunk(chunk)
            elif kind == "partition_client":
                workload = self.rng.choice(self.clients)
                self.network.unreachable.add(workload.host)
                self.trace(f"{workload.name}: PARTITIONED")
                await asyncio.sleep(self.rng.uniform(*PARTITION_S))
                self.network.unreachable.discard(workload.host)
                self.trace(f"{workload.name}: reachable again")
            elif kind == "pause_client":
                workload = self.rng.choice(self.clients)
                await workload.pause(self.rng.uniform(*PAUSE_S))

    async def heal(self) -> None:
        cluster = self.cluster
        cluster.network.quiet = True
        for workload in self.clients:
            self.network.resume(workload.host)
            self.network.unreachable.discard(workload.host)
            workload.resumed.set()
        if cluster.meta is None:
            await cluster.start_meta(cluster.meta_skew_s)
        for chunk in cluster.chunks:
            if not chunk.up:
                await cluster.start_chunk(chunk)
        self.trace("faults stop")

    async def main(self) -> None:
        async with asyncio.timeout(VIRTUAL_DEADLINE_S):
            await self.setup()
            loop = asyncio.get_running_loop()
            works = [loop.create_task(w.run(self.rng.randint(*self.operations), self.kinds)) for w in self.clients]
            faults = loop.create_task(self.faults())
            await asyncio.gather(*works)
            faults.cancel()
            await asyncio.gather(faults, return_exceptions=True)
            await self.heal()
            for workload in self.clients:  # each sends what it holds, then every client lists the tree
                await workload.final_sync()
            for workload in self.clients:
                await workload.final_reads()

    def finish(self, budget: int = CHECK_BUDGET) -> Verdict:
        for workload in self.clients:
            self.stats.update(workload.stats)
            cache = workload.fs.metadata_cache
            self.stats["cache_answers"] += cache.hits if cache is not None else 0
        self.stats.update({f"net_{k}": v for k, v in self.network.stats.items() if k in ("held", "dropped", "delayed")})
        self.stats["operations"] += len(self.history.operations)
        self.stats["unknown"] += sum(1 for op in self.history.operations if op.complete is None)
        for op in self.history.operations:
            self.stats[f"kind_{op.kind}"] += 1
        verdict = check(self.history, budget=budget)
        if not verdict.decided:
            self.stats["undecided"] += 1
        return verdict


def run_history(seed: int, *, kinds: dict[str, int] | None = None, faults: tuple[str, ...] = FAULTS,
                operations: tuple[int, int] = OPERATIONS, echo: Callable[[str], None] | None = None,
                budget: int = CHECK_BUDGET) -> HistorySimulation:
    """Play and check the history of ``seed``; raise :class:`HistoryViolation` (the checker's
    report, the seed and its replay command) if no order explains it, :class:`HistoryStuck` if
    it cannot finish."""
    with quiet_logs():
        state = random.getstate()
        random.seed(seed)
        sim = HistorySimulation(seed, kinds=kinds, faults=faults, operations=operations, echo=echo)
        try:
            with _StepGuard(sim.cluster.loop, seed):
                sim.cluster.run(sim.main())
        except TimeoutError as exc:
            raise HistoryStuck(f"simulated history seed {seed} did not finish in {VIRTUAL_DEADLINE_S:g} virtual s\n"
                               f"  replay: {replay_command(seed)}") from exc
        finally:
            sim.cluster.close()
            random.setstate(state)
    verdict = sim.finish(budget)
    if verdict.violation:
        raise HistoryViolation(f"simulated history seed {seed}: {verdict.report()}\n  replay: {replay_command(seed)}",
                               verdict, sim.history)
    return sim


def run_histories(seeds: range) -> tuple[list[str], Counter[str]]:
    """Check every seed of ``seeds``: the failures' reports (violations and stuck runs) and the
    histories' stats summed."""
    failures: list[str] = []
    totals: Counter[str] = Counter()
    for seed in seeds:
        try:
            totals.update(run_history(seed).stats)
            totals["histories_ok"] += 1
        except (HistoryViolation, HistoryStuck) as exc:
            failures.append(str(exc))
    return failures, totals


def main(argv: list[str] | None = None) -> int:
    """``--seed S``: replay one history with its trace; ``--histories N --start S``: check many.
    Exit 0: every history explained; 1: a violation or a run that could not finish."""
    parser = argparse.ArgumentParser(prog="python3 -m tectofs.testing.sim_histories",
                                     description="Check simulated client histories against the namespace model.")
    parser.add_argument("--seed", type=int, help="replay one history, printing its trace and its operations")
    parser.add_argument("--histories", type=int, default=100, help="how many seeds to check (default 100)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    args = parser.parse_args(argv)
    def out(text: str) -> None:
        sys.stdout.write(text)

    if args.seed is not None:
        try:
            sim = run_history(args.seed, echo=lambda line: out(line + "\n"))
        except (HistoryViolation, HistoryStuck) as exc:
            out(f"{exc}\n")
            return 1
        for op in sim.history.operations:
            done = "?" if op.complete is None else f"{op.complete:.6f}"
            out(f"  #{op.id} [{op.invoke:.6f}, {done}] {op.client}: {op.describe()} -> {op.outcome()}\n")
        out(f"seed {args.seed}: explained; {dict(sorted(sim.stats.items()))}\n")
        return 0
    started = time.perf_counter()
    failures, totals = run_histories(range(args.start, args.start + args.histories))
    for failure in failures:
        out(f"{failure}\n\n")
    took = time.perf_counter() - started
    out(f"{args.histories} histories (seeds {args.start}..{args.start + args.histories - 1}), {len(failures)} failed,"
        f" {took:.1f} s ({args.histories / took:.1f} histories/s); {dict(sorted(totals.items()))}\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
