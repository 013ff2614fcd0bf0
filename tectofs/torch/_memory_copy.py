"""Loading from the memory tier: which source a :class:`tectofs.torch.CheckpointReader` reads a
step from, and the sources themselves.

``find_copy`` asks the agents (``HOST:PORT,...``: this host's first, then its peers, and the
peers this host's agent names) for a *sealed* save of the step — complete, each file checked
against the writer's crc32c when it arrived — and returns the first found: this host's agent's
copy read in place from shared memory (:class:`LocalCopy`, no copy through a socket; through
its socket if its files are not this process's to open), else a peer's read over the wire
(:class:`PeerCopy`); None sends the reader to the chunk servers. A
step is read from one source: if that source fails mid-load (a peer dies, a copy is evicted, an
item fails its crc32c), :func:`read_with_failover` reads the whole load again from the next one.
Every source of a step holds the same bytes (a persisted step is the sealed one committed), so
the metadata read first stays valid.

The sources offer the little of ``tectofs.client.FileSystem`` the reader uses: ``read_bytes``,
``stat(path).block_size`` and ``open(path, "rb")`` with ``preadv``/``seek``/``readinto``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Callable

from .. import errors
from ..agent import messages
from ..agent.client import agent_client, lookup_client

WINDOW_BYTES = 64 * 1024 * 1024  # what the reader takes for a block size: its read windows


@dataclass
class _Stat:
    size: int
    block_size: int = WINDOW_BYTES
    kind: str = "file"


class Source:
    """A sealed copy of one step held by ``agent``."""

    def __init__(self, agent: str, step: str, reply: messages.LocateReply) -> None:
        assert reply.found and reply.save is not None
        self.agent, self.step, self.save = agent, step, reply.save
        self.files = {f.name: f for f in reply.files}
        self.tier = "memory"

    def _name(self, path: str) -> str:
        name = path.rsplit("/", 1)[-1]
        if name not in self.files:
            raise errors.NotFound(f"{self.step} (in memory agent {self.agent}) has no file {name}")
        return name

    def stat(self, path: str) -> _Stat:
        return _Stat(self.files[self._name(path)].size)

    def read_bytes(self, path: str) -> bytes:
        name = self._name(path)
        buf = bytearray(self.files[name].size)
        self.read_into(name, 0, memoryview(buf))
        return bytes(buf)

    def open(self, path: str, mode: str = "rb", buffering: int = -1) -> _OpenFile:
        assert mode == "rb"
        return _OpenFile(self, self._name(path))

    def read_into(self, name: str, offset: int, into: memoryview) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class LocalCopy(Source):
    """This host's agent's copy, its files in shared memory read in place (``preadv`` straight
    into the destination: one copy, by the kernel, without the GIL). The files are opened when
    the copy is found: an eviction after that unlinks them, and the open files keep the bytes."""

    def __init__(self, agent: str, step: str, reply: messages.LocateReply) -> None:
        super().__init__(agent, step, reply)
        self._fds: dict[str, int] = {}
        try:
            for info, path in zip(reply.files, reply.paths):
                fd = self._fds[info.name] = os.open(path, os.O_RDONLY)
                if os.fstat(fd).st_size != info.size:
                    raise errors.NotFound(f"{path}: not the size sealed")
        except BaseException:
            self.close()
            raise

    def read_into(self, name: str, offset: int, into: memoryview) -> int:
        n = max(0, min(into.nbytes, self.files[name].size - offset))
        done = 0
        while done < n:
            got = os.preadv(self._fds[name], [into[done:n]], offset + done)
            if got <= 0:
                raise errors.CheckpointError(f"{self.step}: {name} in shared memory ends at {offset + done}")
            done += got
        return n

    def close(self) -> None:
        fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


class PeerCopy(Source):
    """Another agent's copy, read over the wire (``tier`` "peer"; "memory": this host's agent,
    whose files this process may not open, read through its socket)."""

    def __init__(self, agent: str, step: str, reply: messages.LocateReply, tier: str = "peer") -> None:
        super().__init__(agent, step, reply)
        self.tier = tier

    def read_into(self, name: str, offset: int, into: memoryview) -> int:
        n = max(0, min(into.nbytes, self.files[name].size - offset))
        if n:
            agent_client(self.step).read(self.agent, self.step, self.save, name, offset, into[:n])
        return n


class _OpenFile:
    """A file of a source, as the reader reads it."""

    def __init__(self, source: Source, name: str) -> None:
        self.source, self.name, self.position = source, name, 0

    def preadv(self, views: list[memoryview], offset: int) -> int:
        total = 0
        for view in views:
            got = self.source.read_into(self.name, offset + total, view)
            total += got
            if got < view.nbytes:
                break
        return total

    def seek(self, offset: int) -> int:
        self.position = offset
        return offset

    def readinto(self, into: memoryview) -> int:
        got = self.source.read_into(self.name, self.position, memoryview(into).cast("B"))
        self.position += got
        return got

    def close(self) -> None:
        pass


def find_copy(step: str, agent_list: list[str], skip: frozenset[str] = frozenset()) -> Source | None:
    """The first sealed copy of ``step`` among ``agent_list`` (the first: this host's, read in
    place; then peers, and the peers this host's agent names), agents in ``skip`` left out;
    None if no agent that answers holds one."""
    client = lookup_client(step)
    if client is None:
        return None
    candidates = list(agent_list)
    for position, agent in enumerate(candidates):
        if agent in skip:
            continue
        reply = client.locate(agent, step)
        if reply is None:
            continue
        if position == 0:
            candidates.extend(p for p in reply.peers if p not in candidates)
        if not reply.found:
            continue
        try:
            return LocalCopy(agent, step, reply) if position == 0 else PeerCopy(agent, step, reply)
        except PermissionError:  # this host's agent runs as another user (its unit's): read it over loopback
            return PeerCopy(agent, step, reply, tier="memory")
        except (OSError, errors.TectofsError):  # evicted between the answer and the opening
            continue
    return None


def read_with_failover(read: Callable[[], None], source: Source | None, step: str, agent_list: list[str],
                       switch: Callable[[Source | None], None]) -> None:
    """Run ``read`` (a whole load) from ``source``; if a memory source fails it, run it again
    from the next source holding the step (``switch`` installs it; None: the chunk servers)."""
    tried: set[str] = set()
    while True:
        try:
            read()
            return
        except Exception as exc:
            if source is None:
                raise
            failed = source.agent
            tried.add(failed)
            source.close()
            source = find_copy(step, agent_list, frozenset(tried))
            where = f"memory agent {source.agent}" if source is not None else "the chunk servers"
            warnings.warn(f"tectofs: loading {step} from memory agent {failed} failed ({exc}); reading it again"
                          f" from {where}", stacklevel=2)
            switch(source)
