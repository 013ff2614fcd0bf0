"""Saving to the memory tier: ``CheckpointWriter(tier="memory")`` (Gemini, SOSP'23).

A save lands in a host's memory agent (``tectofs agent``, :mod:`tectofs.agent`) instead of the
chunk servers: every rank streams its files (the same ``__<rank>_<i>.distcp`` files, item for
item, as a storage save) to the coordinator's agent, then has it check their sizes and crc32cs;
the coordinator sends ``.metadata`` and seals the step. The agent answers the seal once
``replicas`` peer agents hold the step too (or, if they cannot, once it is persisted), and
``dcp.save`` returns: the step is saved in memory. The agent then persists it to the cluster
behind the training, with the storage writer's atomic commit, so a persisted step is exactly
what a storage save makes (:mod:`tectofs.agent.persist`).

What a reader sees (:class:`tectofs.torch.CheckpointReader`, :mod:`tectofs.torch._memory_copy`):
a sealed step, from this host's agent, a peer's or the cluster, whole; never a save that was
not sealed (a trainer killed mid-save leaves a save no reader sees, dropped by the agent later).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem
from torch.distributed.checkpoint.storage import WriteResult

from .. import errors
from ..agent import messages
from ..agent.client import AgentClient, agent_client, agents
from ..checkpoint_gc import METADATA_NAME
from ..checksum import crc
from . import _timing
from ._dcp import TIER_WRITERS, CheckpointWriter, _PlanData

if TYPE_CHECKING:
    from ..client import FileSystem


@dataclass
class _MemoryPlanData(_PlanData):
    """``_PlanData`` of a memory-tier save: the agent every rank sends its files to."""

    agent: str = ""


class _AgentFile:
    """A file of the step being written into an agent, through the one call ``_ItemWriter``
    makes (``pwritev``, at consecutive offsets): each batch is sent as it comes, its crc32c
    folded into the file's."""

    def __init__(self, client: AgentClient, agent: str, step: str, save: str, name: str) -> None:
        self.client, self.agent, self.step, self.save, self.name = client, agent, step, save, name
        self.size = 0
        self.crc32c = crc(b"")
        self.sent = False

    def pwritev(self, views: list[memoryview], offset: int) -> int:
        if offset != self.size:
            raise errors.CheckpointError(f"{self.name}: write at {offset}, the file has {self.size} bytes")
        self.client.put(self.agent, self.step, self.save, self.name, offset, views)
        for view in views:
            self.crc32c = crc(view, self.crc32c)
            self.size += view.nbytes
        self.sent = True
        return self.size - offset

    def __enter__(self) -> _AgentFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None and not self.sent:  # an empty file exists too
            self.client.put(self.agent, self.step, self.save, self.name, 0, [])

    def info(self) -> messages.HeldFileInfo:
        return messages.HeldFileInfo(name=self.name, size=self.size, crc32c=self.crc32c)


class _AgentFiles:
    """What ``CheckpointWriter._write_items`` needs of a file system (``open(path, "wb")``),
    making files in an agent."""

    def __init__(self, agent: str, step: str, save: str) -> None:
        self.agent, self.step, self.save = agent, step, save
        self.made: list[_AgentFile] = []

    def open(self, path: str, mode: str, buffering: int = -1) -> _AgentFile:
        assert mode == "wb"
        made = _AgentFile(agent_client(self.step), self.agent, self.step, self.save, path.rsplit("/", 1)[-1])
        self.made.append(made)
        return made


class MemoryTierWriter(CheckpointWriter):
    """A :class:`CheckpointWriter` whose saves land in the memory tier (module docs); made by
    ``CheckpointWriter(..., tier="memory")``. ``agent``: the agents, ``HOST:PORT[,peer,...]``,
    this host's first (default ``$TECTOFS_AGENT``). ``replicas``: peers that must hold a step
    before the save returns (default: the agent's ``--replicas``). ``last_seal``: the agent's
    answer to the coordinator's last seal (copies, persisted). Saves are stored raw (no
    ``compress``, no ``incremental``) and never replace a step (no ``overwrite``)."""

    def __init__(self, checkpoint_id: str | os.PathLike | None = None, *, tier: str = "memory",
                 agent: str | None = None, replicas: int | None = None, **options: Any) -> None:
        for option in ("compress", "incremental", "overwrite"):
            if options.get(option):
                raise ValueError(f"CheckpointWriter(tier='memory') takes no {option}=True")
        super().__init__(checkpoint_id, **options)
        self.agents = agents(agent)
        if not self.agents:
            raise errors.CheckpointError("the memory tier needs this host's agent: CheckpointWriter(tier='memory',"
                                         " agent='HOST:PORT') or TECTOFS_AGENT (start one with `tectofs agent`)")
        self.replicas = replicas
        self.last_seal: messages.SealReply | None = None
        self._sent: list[messages.HeldFileInfo] = []

    def _prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        loc = self._location()
        with self._step("stat", loc.path):
            if self._nonempty(self._fs(), loc.path):
                raise errors.AlreadyExists(f"checkpoint {loc.uri()} already exists; use another path")
        token = uuid.uuid4().hex[:16]
        return [dataclasses.replace(plan, storage_data=_MemoryPlanData(prefix=f"__{i}_", pending="", token=token,
                                                                       agent=self.agents[0]))
                for i, plan in enumerate(plans)]

    def _write_all(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        data = plan.storage_data
        if not isinstance(data, _MemoryPlanData):
            raise errors.CheckpointError(f"plan carries no memory-tier storage data (got {type(data).__name__})")
        self._sent = []
        results = super()._write_all(plan, planner)
        with self._step("verify files in memory agent", data.agent):
            agent_client(self._location().uri()).verify(data.agent, self._location().uri(), data.token, self._sent)
        return results

    def _write_file(self, fs: FileSystem, pending: str, name: str, items: list[WriteItem],
                    planner: SavePlanner) -> list[WriteResult]:
        data = cast(_MemoryPlanData, self._plan_data)
        files = _AgentFiles(data.agent, self._location().uri(), data.token)
        with self._step("write file to memory agent", f"{data.agent}: {name}"):
            results = self._write_items(cast("FileSystem", files), name, name, items, planner)
        with self._pool_lock:
            self._sent.extend(f.info() for f in files.made)
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        loc = self._location()
        data = self._plan_data
        if not isinstance(data, _MemoryPlanData):
            raise errors.CheckpointError("finish() called before write_data()")
        with self._step("seal checkpoint in memory agent", f"{data.agent}: {loc.uri()}"), \
                _timing.timed(self._phases, "commit"):
            self._complete_metadata(metadata, results)
            blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
            client = agent_client(loc.uri())
            client.put(data.agent, loc.uri(), data.token, METADATA_NAME, 0, [memoryview(blob)])
            names = sorted({info.relative_path for info in metadata.storage_data.values()} | {METADATA_NAME})
            if len(names) > messages.FILES_MAX:
                raise errors.CheckpointError(f"{len(names)} files: a memory-tier step holds at most {messages.FILES_MAX}"
                                             " (fewer ranks, or CheckpointWriter(thread_count=1))")
            own = [messages.HeldFileInfo(name=METADATA_NAME, size=len(blob), crc32c=crc(blob))]
            self.last_seal = client.seal(data.agent, loc.uri(), data.token, own, names, self.replicas)
        _timing.saved(self.checkpoint_id, self.rank, self._phases, self._saved_bytes)


TIER_WRITERS["memory"] = MemoryTierWriter
