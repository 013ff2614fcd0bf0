"""The steps one agent holds, in this host's memory: each file of a step is a file in a
shared-memory directory (``/dev/shm`` by default: tmpfs, host memory that outlives the trainer
that wrote it and can be read in place by a trainer on the same host, without a copy through
a socket).

A step goes through these states; only the store changes them, on the agent's event loop:

* *receiving*: puts of one save add bytes to its files. Never visible to readers. Dropped when
  a newer save of the step begins, or once idle for ``abandon_s`` (a trainer that died mid-save).
* *sealed*: every file named by the seal is there, with the size and crc32c the writer
  recorded (checked). Readers may use it.
* *persisted*: committed to the cluster (by this agent or another holding it). Only sealed and
  persisted steps, and abandoned receiving ones, are ever evicted: the only copy of a step not
  yet persisted is never dropped.

Bounds: ``memory_bytes_max`` over every held byte (a put that would exceed it evicts what may
be evicted, oldest first, or is refused, and the service waits for persistence to free some);
``keep_steps``: at most that many sealed steps are kept once persisted (the newest).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Callable

from tectofs import errors
from tectofs.checksum import crc
from tectofs.wire.messages import ActAs

from . import messages
from .messages import HeldFileInfo

DIRECTORY_PREFIX = "tectofs-agent-"
# room under LOCAL_PATH_BYTES_MAX for "/<step digest>-<save token>/<file name>"
_DIRECTORY_BYTES_MAX = messages.LOCAL_PATH_BYTES_MAX - 2 - 20 - 1 - 64 - messages.FILE_NAME_BYTES_MAX


@dataclass
class HeldFile:
    name: str
    path: str
    size: int = 0  # the end of the bytes received so far
    crc32c: int | None = None  # once verified: the writer's crc32c of all of it, checked


@dataclass
class HeldStep:
    step: str
    save: str
    directory: str
    primary: bool  # sealed here by a trainer; else a replica sent by ``origin``
    origin: str | None
    touched: float
    owner: ActAs  # the user who saved it (tectofs.agent.identity)
    files: dict[str, HeldFile] = field(default_factory=dict)
    nbytes: int = 0
    sealed: bool = False
    sealed_at: float = 0.0
    persisted: bool = False
    persisting: bool = False
    persist_error: str = ""
    infos: list[HeldFileInfo] = field(default_factory=list)  # once sealed: the files as the seal named them


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale(root: str) -> list[str]:
    """Delete the shared-memory directories of agents that are no longer running (killed ones
    leave theirs behind); returns their paths."""
    removed = []
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    for name in names:
        pid = name.removeprefix(DIRECTORY_PREFIX)
        if name.startswith(DIRECTORY_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            removed.append(os.path.join(root, name))
    return removed


def file_crc(path: str) -> int:
    """crc32c of a whole file, read through a mapping (no copy)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return crc(b"")
        with mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as mapped:
            view = memoryview(mapped)
            try:
                return crc(view)
            finally:
                view.release()


class StepStore:
    """The held steps of one agent (see the module docstring for states and bounds). Not
    thread-safe: the service calls it from its event loop (``verify`` alone may run on a thread)."""

    def __init__(self, root: str, memory_bytes_max: int, keep_steps: int, abandon_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert memory_bytes_max > 0
        assert keep_steps >= 1
        self.directory = os.path.join(os.path.abspath(root), f"{DIRECTORY_PREFIX}{os.getpid()}")
        if len(self.directory) > _DIRECTORY_BYTES_MAX:
            raise ValueError(f"the shared-memory directory {root!r} is too long a path (a file's path is at most"
                             f" {messages.LOCAL_PATH_BYTES_MAX} bytes)")
        remove_stale(root)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)  # its files are 0600 too: only this user reads in place
        self.memory_bytes_max = memory_bytes_max
        self.keep_steps = keep_steps
        self.abandon_s = abandon_s
        self.clock = clock
        self.steps: dict[str, HeldStep] = {}

    @property
    def held_bytes(self) -> int:
        return sum(s.nbytes for s in self.steps.values())

    def sealed(self, step: str, save: str | None = None) -> HeldStep | None:
        held = self.steps.get(step)
        if held is None or not held.sealed or (save is not None and held.save != save):
            return None
        return held

    def begin(self, step: str, save: str, primary: bool, origin: str | None, owner: ActAs) -> HeldStep:
        """The held save ``save`` of ``step``, made if new (for ``owner``). A new save replaces
        an older one of the same step unless that one is sealed and not persisted (AlreadyExists:
        it is the only copy of a saved step); whether the caller may is the service's to check."""
        held = self.steps.get(step)
        if held is not None and held.save == save:
            held.touched = self.clock()
            return held
        if held is not None:
            if held.sealed and not held.persisted:
                raise errors.AlreadyExists(
                    f"{step} is held in memory (save {held.save}) and not persisted yet: a new save of the same"
                    " step waits until it is (or save under another name)")
            self.drop(step)
        digest = hashlib.sha256(step.encode()).hexdigest()[:20]
        directory = os.path.join(self.directory, f"{digest}-{save}")
        os.makedirs(directory, exist_ok=True)
        held = self.steps[step] = HeldStep(step, save, directory, primary, origin, self.clock(), owner)
        return held

    def room_for(self, nbytes: int) -> bool:
        """Make ``nbytes`` more fit under the bound and in the shared-memory file system
        (``free_bytes``: a tmpfs others fill too, or smaller than the bound), evicting (oldest
        first) what may be evicted; False if they cannot fit without dropping an unpersisted step."""
        if nbytes > self.memory_bytes_max:
            raise errors.NoSpace(f"{nbytes} bytes cannot fit in the agent's memory ({self.memory_bytes_max} bytes,"
                                 " --memory-bytes)")
        for held in self.evictable():
            if self._fits(nbytes):
                break
            self.drop(held.step)
        return self._fits(nbytes)

    def _fits(self, nbytes: int) -> bool:
        return self.held_bytes + nbytes <= self.memory_bytes_max and nbytes <= self.free_bytes()

    def free_bytes(self) -> int:
        """What the shared-memory file system can still take (``statvfs``)."""
        st = os.statvfs(self.directory)
        return st.f_bavail * st.f_frsize

    def growth(self, held: HeldStep, name: str, offset: int, length: int) -> int:
        """How many more bytes a put of ``length`` at ``offset`` into ``name`` holds."""
        current = held.files[name].size if name in held.files else 0
        return max(0, offset + length - current)

    def write(self, held: HeldStep, name: str, offset: int, data: memoryview) -> None:
        """Write ``data`` at ``offset`` of ``name`` (the caller made room for its growth);
        NoSpace if the file system takes less (the caller drops the torn save)."""
        if held.sealed:
            raise errors.InvalidArgument(f"{held.step} (save {held.save}) is sealed: its files no longer change")
        file = held.files.get(name)
        if file is None:
            file = held.files[name] = HeldFile(name, os.path.join(held.directory, name))
        grown = self.growth(held, name, offset, data.nbytes)
        try:
            fd = os.open(file.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                written = os.pwrite(fd, data, offset) if data.nbytes else 0
            finally:
                os.close(fd)
        except OSError as exc:
            written, why = -1, exc.strerror
        else:
            why = "file system full"
        if written != data.nbytes:
            raise errors.NoSpace(
                f"shared memory {self.directory} took {max(written, 0)} of {data.nbytes} bytes of {name} of"
                f" {held.step} ({why}; {self.free_bytes()} bytes free there)")
        file.size = max(file.size, offset + data.nbytes)
        held.nbytes += grown
        held.touched = self.clock()

    @staticmethod
    def check(held: HeldStep, files: list[HeldFileInfo]) -> str:
        """Why ``held`` does not hold ``files`` as the writer made them (size and crc32c of
        each), or "" if it does. Reads the files: run it off the event loop."""
        for info in files:
            got = held.files.get(info.name)
            if got is None:
                return f"{info.name}: never received"
            if got.size != info.size:
                return f"{info.name}: {got.size} bytes received, the writer wrote {info.size}"
            actual = file_crc(got.path)
            if actual != info.crc32c:
                return f"{info.name}: crc32c {actual:#010x} received, the writer's is {info.crc32c:#010x}"
        return ""

    @staticmethod
    def verified(held: HeldStep, files: list[HeldFileInfo]) -> None:
        """Record ``files`` as checked (``check`` found them whole)."""
        for info in files:
            held.files[info.name].crc32c = info.crc32c

    def seal(self, held: HeldStep, names: list[str]) -> None:
        """Mark ``held`` sealed as exactly the files ``names``, each verified; then trim to
        ``keep_steps``. InvalidArgument naming what is missing, extra or unverified otherwise."""
        missing = sorted(set(names) - held.files.keys())
        extra = sorted(held.files.keys() - set(names))
        unchecked = sorted(n for n in names if n in held.files and held.files[n].crc32c is None)
        if missing or extra or unchecked:
            raise errors.InvalidArgument(f"cannot seal {held.step}: files never received {missing[:5]}, received but"
                                         f" not in the checkpoint {extra[:5]}, not verified {unchecked[:5]}")
        held.infos = [HeldFileInfo(name=n, size=held.files[n].size, crc32c=held.files[n].crc32c or 0)
                      for n in sorted(names)]
        held.sealed, held.sealed_at = True, self.clock()
        self.trim()

    def mark_persisted(self, step: str, save: str) -> bool:
        held = self.steps.get(step)
        if held is None or held.save != save or not held.sealed:
            return False
        held.persisted, held.persisting, held.persist_error = True, False, ""
        self.trim()
        return True

    def trim(self) -> None:
        """Drop persisted sealed steps beyond the newest ``keep_steps`` sealed ones."""
        sealed = sorted((s for s in self.steps.values() if s.sealed), key=lambda s: s.sealed_at, reverse=True)
        for held in sealed[self.keep_steps:]:
            if held.persisted:
                self.drop(held.step)

    def evictable(self) -> list[HeldStep]:
        """What may be dropped to make room, first to go first: receiving steps idle for
        ``abandon_s``, then persisted sealed steps, oldest first."""
        now = self.clock()
        abandoned = [s for s in self.steps.values() if not s.sealed and now - s.touched >= self.abandon_s]
        persisted = sorted((s for s in self.steps.values() if s.sealed and s.persisted), key=lambda s: s.sealed_at)
        return sorted(abandoned, key=lambda s: s.touched) + persisted

    def collect_abandoned(self) -> list[str]:
        """Drop receiving steps idle for ``abandon_s``; returns their ids."""
        now = self.clock()
        gone = [s.step for s in self.steps.values() if not s.sealed and now - s.touched >= self.abandon_s]
        for step in gone:
            self.drop(step)
        return gone

    def drop(self, step: str) -> None:
        held = self.steps.pop(step, None)
        if held is not None:
            shutil.rmtree(held.directory, ignore_errors=True)

    def close(self) -> None:
        """Drop everything held (the agent is stopping: its memory goes with it)."""
        self.steps.clear()
        shutil.rmtree(self.directory, ignore_errors=True)
