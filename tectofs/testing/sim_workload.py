"""One simulated client's calls for ``tectofs.testing.sim_histories``: random calls of every kind
the namespace model knows, made through the real client library and recorded in the history.

Each kind is done as a program does it through the library (as the FUSE mount does it through
the same client): ``create`` opens ``xb`` and closes; ``write`` replaces a file whole (by
``write_bytes`` or through a ``wb`` handle); ``append`` writes at the end through an ``a+b``
handle (recorded as :meth:`Workload.append` says); ``fsync`` is a ``stat`` then
``AsyncFileSystem.sync``. Names come from a small set under the tree's top-level directories,
half the time one a recent call named, so calls collide and often fail. Also here: the
simulator's network that can stop a host's process (:class:`PausingNetwork`).
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections import Counter
from typing import Any, Awaitable, Callable, Protocol

from tectofs.client import AsyncFileSystem
from tectofs.errors import TectofsError
from tectofs.testing.cluster import Cluster, Trace
from tectofs.testing.history import Arg, History, Operation, Value
from tectofs.testing.network import Network, NetworkFaults, SimTransport

TOP = ("/d0", "/d1")
NAMES = ("f0", "f1", "f2", "s0", "s1")
KIND_WEIGHTS = {"create": 4, "write": 8, "append": 3, "read": 10, "stat": 10, "list": 6, "rename": 6, "link": 2,
                "unlink": 4, "chmod": 2, "chown": 1, "truncate": 2, "mkdir": 4, "rmdir": 2, "setxattr": 2,
                "getxattr": 2, "fsync": 2}
GAP_S = (0.0, 0.4)  # between one call of a client and its next
RECENT_P = 0.5  # how often a call names a path one of the last RECENT_NAMES calls of any client named
RECENT_NAMES = 6
#: Errors that are an answer: the call did nothing (else its fate is unknown).
ANSWERS = frozenset({errno.ENOENT, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENOTEMPTY, errno.EINVAL,
                     errno.ENODATA, errno.EPERM, errno.EBUSY, errno.EMLINK})

#: Answers whose errno differs from Linux's only by the order of the service's checks (findings
#: 1-3 of /work/notes/sim-findings.md, being fixed in tectofs/store/engine.py): recorded as calls
#: whose fate is unknown (they may take effect or not; they did not). link of a directory: EPERM
#: before ENOENT/EEXIST of the destination; rename of a missing source into a file's "directory":
#: ENOENT before ENOTDIR; rename of a file onto a directory holding it: EISDIR, not ENOTEMPTY.
PRECEDENCE = frozenset({("link", "EPERM"), ("rename", "ENOENT")})
#: Not an answer the model can give: a write whose commit stalled (a partition, a paused
#: process) past the simulation's allocation grace (``cluster.ALLOCATION_GRACE_S``, 20 virtual
#: seconds, shorter than the client's 60 s RPC timeout; 600 s in production) is refused with
#: EINVAL ("block ... was not allocated"): nothing was written, which an unknown fate covers.
NOT_ANSWERS = frozenset({("write", "EINVAL"), ("append", "EINVAL"), ("truncate", "EINVAL")})


def _precedence(kind: str, error: str | None, args: dict[str, Arg]) -> bool:
    """An errno that only the order of the checks makes differ from Linux's (PRECEDENCE)."""
    if (kind, error) in PRECEDENCE:
        return True
    if kind == "rename" and error == "EISDIR":  # Linux: ENOTEMPTY when ``dest`` holds ``path``
        return str(args["path"]).startswith(str(args["dest"]) + "/")
    return False


class PausingNetwork(Network):
    """The simulator's network, which can also stop a host's process: what it sends and what is
    sent to it waits (in order) until it resumes, as a stopped process's sockets do."""

    def __init__(self, rng: random.Random, faults: NetworkFaults | None = None) -> None:
        super().__init__(rng, faults)
        self.paused: set[str] = set()
        self.held: list[tuple[SimTransport, Callable[..., None], tuple[Any, ...]]] = []

    def schedule(self, sender: SimTransport, callback: Callable[..., None], *args: Any) -> None:
        peer = sender.peer
        if sender.host in self.paused or (peer is not None and peer.host in self.paused):
            self.held.append((sender, callback, args))
            self.stats["held"] += 1
            return
        super().schedule(sender, callback, *args)

    def resume(self, host: str) -> None:
        self.paused.discard(host)
        held, self.held = self.held, []
        for sender, callback, args in held:
            self.schedule(sender, callback, *args)



class Simulation(Protocol):
    """What a workload needs of its simulation (``sim_histories.HistorySimulation``)."""

    history: History
    recent: list[str]  # the paths calls named, in order
    cluster: Cluster
    network: PausingNetwork
    trace: Trace

    def clock(self) -> float: ...


def initial_tree() -> dict[str, bytes | None]:
    tree: dict[str, bytes | None] = {}
    for top in TOP:
        tree[top] = None
        tree[f"{top}/s0"] = None
        tree[f"{top}/f0"] = b"initial"
    return tree


def _path(rng: random.Random, top: str) -> str:
    base = top if rng.random() < 0.6 else f"{top}/s{rng.randrange(2)}"
    return f"{base}/{rng.choice(NAMES)}"


def _errno_name(exc: BaseException) -> str | None:
    """The answer ``exc`` is (an errno's name), or None: the call's fate is unknown."""
    number = getattr(exc, "errno", None)
    if isinstance(exc, (TectofsError, OSError)) and isinstance(number, int) and number in ANSWERS:
        return errno.errorcode[number]
    return None


class Workload:
    """One client: its name in the history, its host, its library client and its calls."""

    def __init__(self, name: str, host: str, fs: AsyncFileSystem, sim: Simulation, rng: random.Random) -> None:
        self.name, self.host, self.fs, self.sim, self.rng = name, host, fs, sim, rng
        self.done = False
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.stats: Counter[str] = Counter()
        self.calls = 0

    def spawn(self, coro: Any) -> "asyncio.Task[Any]":
        return self.sim.cluster.loop.spawn(self.host, coro)

    async def record(self, kind: str, call: Callable[[], Awaitable[Value]], args: dict[str, Arg],
                     invoke: float | None = None) -> Operation:
        """Make ``call`` and add it to the history (``invoke``: when it began, if before now)."""
        invoke = self.sim.clock() if invoke is None else invoke
        value: Value = None
        error: str | None = None
        complete: float | None
        try:
            value = await self.spawn(call())
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an answer (an errno) or a call whose fate is unknown
            error = _errno_name(exc)
            complete = self.sim.clock() if error is not None else None
            self.stats["answered_" + (error or f"unknown_{type(exc).__name__}")] += 1
        else:
            complete = self.sim.clock()
            self.stats["answered_ok"] += 1
        if _precedence(kind, error, args):  # an error the service checks first that Linux checks later
            self.stats["precedence_" + kind] += 1
            complete, error = None, None
        elif (kind, error) in NOT_ANSWERS:
            self.stats["unknown_" + kind] += 1
            complete, error = None, None
        op = self.sim.history.add(self.name, kind, invoke, complete, value, error, **args)
        if kind == "write" and complete is None:
            self._maybe_taken_back(str(args["path"]), invoke)
        return op

    def _maybe_taken_back(self, path: str, invoke: float) -> None:
        """A write that failed after its open created the file takes the file back (the client
        unlinks it if still empty: ``SqlStore.unlink(only_if_empty=True)``), a name the model's
        write never removes (sim-findings.md, finding 6): recorded as an unlink of unknown fate."""
        self.stats["writes_maybe_taken_back"] += 1
        self.sim.history.add(self.name, "unlink", invoke, None, None, None, path=path)

    async def run(self, count: int, kinds: dict[str, int]) -> None:
        names, weights = list(kinds), list(kinds.values())
        for _ in range(count):
            await asyncio.sleep(self.rng.uniform(*GAP_S))
            await self.resumed.wait()
            kind = self.rng.choices(names, weights)[0]
            await self.call(kind, self._args(kind))
        self.done = True

    def _args(self, kind: str) -> dict[str, Arg]:
        rng = self.rng
        self.calls += 1
        recent = self.sim.recent
        if recent and rng.random() < RECENT_P:  # a name just used: a cache may answer, or be stale
            path = rng.choice(recent[-RECENT_NAMES:])
            top = path[: path.index("/", 1)]
        else:
            top = rng.choice(TOP)
            path = _path(rng, top)
        args: dict[str, Arg] = {"path": path}
        label = f"{self.name}-{self.calls}".encode()
        if kind in ("rename", "link"):
            args["dest"] = _path(rng, rng.choice(TOP) if rng.random() < 0.1 else top)
        elif kind in ("write", "append"):
            args["data"] = label * rng.choice([1, 1, 3])
        elif kind == "chmod":
            args["mode"] = rng.choice([0o600, 0o644, 0o755])
        elif kind == "chown":
            args["uid"], args["gid"] = rng.choice([(0, 0), (1000, 1000)])
        elif kind == "truncate":
            args["size"] = rng.choice([0, 3, 10])
        elif kind in ("setxattr", "getxattr"):
            args["name"] = rng.choice(["user.a", "user.b"])
            if kind == "setxattr":
                args["value"] = label
        elif kind == "create":
            args["mode"] = 0o644
        elif kind == "mkdir":
            args["mode"] = 0o755
        return args

    async def call(self, kind: str, args: dict[str, Arg]) -> None:
        fs, path = self.fs, str(args["path"])
        dest = str(args.get("dest", ""))

        async def create() -> Value:
            handle = await fs.open(path, "xb", file_mode=int(args["mode"]))
            await handle.close()
            return None

        async def write() -> Value:
            data = bytes(args["data"])  # type: ignore[arg-type]
            if self.rng.random() < 0.5:
                await fs.write_bytes(path, data)
                return None
            handle = await fs.open(path, "wb")
            try:
                await handle.write(0, data)
            except BaseException:
                await handle.abort()
                raise
            await handle.close()
            return None

        async def stat() -> Value:
            st = await fs.stat(path)
            summary: dict[str, str | int] = {"kind": st.kind, "mode": st.mode & 0o7777, "uid": st.uid, "gid": st.gid,
                                             "nlink": st.nlink}
            if st.kind == "file":
                summary["size"] = st.size
            return summary

        async def fsync() -> Value:
            await fs.stat(path)
            await fs.sync()
            return None

        async def done(awaitable: Awaitable[Any]) -> Value:
            await awaitable
            return None

        calls: dict[str, Callable[[], Awaitable[Value]]] = {
            "create": create, "write": write, "stat": stat, "fsync": fsync,
            "read": lambda: fs.read_bytes(path),
            "list": lambda: _sorted(fs.listdir(path)),
            "rename": lambda: done(fs.rename(path, dest)),
            "link": lambda: done(fs.link(path, dest)),
            "unlink": lambda: done(fs.remove(path)),
            "rmdir": lambda: done(fs.rmdir(path)),
            "mkdir": lambda: done(fs.make_directory(path, int(args["mode"]))),
            "chmod": lambda: done(fs.setattr(path, mode=int(args["mode"]))),
            "chown": lambda: done(fs.setattr(path, uid=int(args["uid"]), gid=int(args["gid"]))),
            "truncate": lambda: done(fs.truncate(path, int(args["size"]))),
            "setxattr": lambda: done(fs.setxattr(path, str(args["name"]), bytes(args["value"]))),  # type: ignore[arg-type]
            "getxattr": lambda: fs.getxattr(path, str(args["name"])),
        }
        self.sim.recent.extend(str(args[name]) for name in ("path", "dest") if name in args)
        if kind == "append":
            await self.append(path, bytes(args["data"]))  # type: ignore[arg-type]
            return
        await self.record(kind, calls[kind], args)

    async def append(self, path: str, data: bytes) -> None:
        """An ``a+b`` handle: what it opened is read, ``data`` written at its end, and its close
        publishes the whole file (close-to-open: a change another client published while it
        was open is replaced, as by a write). So it is recorded as what it is: its open (an
        ``append`` of nothing: it may create the file), a ``read`` of the version it opened,
        and a ``write`` of that version and ``data`` that may take effect at any instant from
        the open to the close (the handle writes to the file it opened, wherever a rename took
        its name meanwhile)."""
        invoke = self.sim.clock()
        try:
            handle = await self.spawn(self.fs.open(path, "a+b"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - an answer or unknown, as record() says
            error = _errno_name(exc)
            if error is None:  # its create may have happened (and been taken back): unknown
                self.sim.history.add(self.name, "append", invoke, None, None, None, path=path, data=b"")
                self._maybe_taken_back(path, invoke)
            else:  # nothing happened: no create, no content
                self.sim.history.add(self.name, "read", invoke, self.sim.clock(), None, error, path=path)
            return
        try:
            before = await self.spawn(handle.read(0, handle.size))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            await self.spawn(handle.abort())
            self.sim.history.add(self.name, "append", invoke, None, None, None, path=path, data=b"")
            self._maybe_taken_back(path, invoke)
            return
        read_done = self.sim.clock()
        self.sim.history.add(self.name, "read", invoke, read_done, bytes(before), None, path=path)

        async def publish() -> Value:
            try:
                await handle.write(len(before), data)
            except BaseException:
                await handle.abort()
                raise
            await handle.close()
            return None
        self.stats["appends"] += 1
        written = await self.record("write", publish, {"path": path, "data": bytes(before) + data}, invoke)
        # Its open's create stands if the close was answered; else it may have been taken back.
        self.sim.history.add(self.name, "append", invoke, None if written.complete is None else read_done, None, None,
                             path=path, data=b"")

    async def pause(self, duration_s: float) -> None:
        """Stop this client's process for ``duration_s`` (past its lease): once it has nothing
        unsent (a pause with creates unsent past the lease loses them, as a crash does)."""
        claims = self.fs.claims
        for _ in range(200):
            if claims is None or claims.pending == 0:
                break
            await asyncio.sleep(0.01)
        else:
            self.stats["pause_skipped"] += 1
            return
        self.resumed.clear()
        network = self.sim.network
        network.paused.add(self.host)
        self.sim.trace(f"{self.name}: PAUSED for {duration_s:.1f} s")
        await asyncio.sleep(duration_s)
        network.resume(self.host)
        self.resumed.set()
        self.sim.trace(f"{self.name}: resumed")
        self.stats["paused"] += 1

    async def final_sync(self) -> None:
        try:
            await self.spawn(self.fs.sync())
        except (TectofsError, OSError):
            self.stats["final_sync_failed"] += 1

    async def final_reads(self) -> None:
        """Once healed: every client lists the top directories and the subdirectories they
        show; the first also reads every file it lists."""
        directories = list(TOP)
        while directories:
            directory = directories.pop(0)
            before = len(self.sim.history.operations)
            await self.call("list", {"path": directory})
            listed = self.sim.history.operations[before]
            if not isinstance(listed.value, list):
                continue
            for name in listed.value:
                path = f"{directory}/{name}"
                if directory in TOP and name.startswith("s"):  # the workload's directory names
                    directories.append(path)
                elif self.name == "c0":
                    await self.call("read", {"path": path})


async def _sorted(names: Awaitable[list[str]]) -> Value:
    return sorted(await names)
