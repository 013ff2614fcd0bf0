"""DCP ``StorageReader`` over the native tectofs client: block-aligned reads straight into
destination tensors, every item's crc32c checked before DCP sees it. The writer side and the
checkpoint layout are described in :mod:`tectofs.torch._dcp`."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import io
import math
import os
import pickle
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.storage import StorageReader
from torch.futures import Future

from .. import errors, tensor_codec
from .. import uri as _uri
from ..agent.client import agents
from ..checksum import crc
from . import _memory_copy, _share, _timing
from ._dcp import METADATA_NAME, CheckpointWriter, MiB, _describe, _dtype_from_name, _dtype_name, _ItemInfo
from ._failures import step

if TYPE_CHECKING:
    from ..client import FileSystem


class CheckpointReader(StorageReader):
    """DCP storage reader for ``tectofs://HOST:PORT/path/to/step``.

    Files are read in block-aligned windows of up to ``max_read_bytes`` (the client fetches
    and decodes a block whole: with ``max_read_bytes`` at least the file's block size, the
    default, no block is fetched twice) on ``thread_count`` threads
    with at most ``inflight_bytes`` in flight. A tensor stored whole is read straight into
    its destination tensor (one copy from the decoded block); small neighbouring items
    less than ``coalesce_gap_bytes`` apart share one read. Every item is checked against
    the crc32c recorded at save (in the thread that completes it) before it reaches the
    planner; planner calls stay on the calling thread.

    ``share_metadata``: the checkpoint's ``.metadata``, which every rank reads, is read from
    storage by one rank and broadcast to the others over ``torch.distributed``
    (:mod:`tectofs.torch._share`): ``True`` for the default process group, or the
    ``ProcessGroup`` that ``dcp.load`` is given. It is a collective, so it is off by default:
    turn it on only when every rank of that group loads with this reader (as ``dcp.load``
    does on every rank of its group); a subgroup's load must pass its group.

    ``agent``: memory agents, ``HOST:PORT[,peer,...]`` with this host's first (default
    ``$TECTOFS_AGENT``; none: the chunk servers only). A load then reads the step from the first
    source holding a sealed copy: this host's agent (in place, from shared memory), a peer agent,
    else the chunk servers; one source for the whole load, the next one if it fails mid-load
    (:mod:`tectofs.torch._memory_copy`). ``loaded_from`` says which tier the last load read
    (``"memory"``, ``"peer"`` or ``"storage"``). Items read from this host's agent are not
    checked again unless ``verify_memory``: that copy was checked against the writer's crc32c
    when the agent sealed it and has stayed in this host's memory since (as ZFS checks blocks
    read from disk but not hits in its memory cache, the ARC); it saves a pass over every byte,
    a third of a restore's time. A peer's copy and the chunk servers' are always checked.

    ``share_reads`` (``True`` or the load's ``ProcessGroup``, the same rule): a tensor item that
    several ranks load (data-parallel replicas of the same shards) is read from storage by one
    of them, chosen by the coordinator to balance the bytes each rank reads
    (:func:`tectofs.torch._share.assign_readers`), and sent to the others point to point over
    ``torch.distributed`` as soon as it is read and checked (:class:`tectofs.torch._share.Exchange`),
    while the reads go on; every receiver checks its crc32c again. A rank that cannot read an
    item tells the ranks waiting for it, which fail naming it.
    """

    def __init__(
        self,
        checkpoint_id: str | os.PathLike | None = None,
        *,
        thread_count: int = 4,
        inflight_bytes: int = 256 * MiB,
        coalesce_gap_bytes: int = 1 * MiB,
        max_read_bytes: int = 64 * MiB,
        share_metadata: Any = False,
        share_reads: Any = False,
        agent: str | None = None,
        verify_memory: bool = False,
    ) -> None:
        super().__init__()
        self.agents = agents(agent)
        self.verify_memory = verify_memory
        self.source: _memory_copy.Source | None = None  # the memory copy this load reads; None: the chunk servers
        self._looked_up = False
        self.loaded_from = ""
        self.share_metadata = share_metadata
        self.share_reads = share_reads
        self.received_bytes = 0  # share_reads: bytes of this rank's last load received from other ranks
        self._loc: _uri.Location | None = _uri.parse(checkpoint_id) if checkpoint_id else None
        self.thread_count = thread_count
        self.inflight_bytes = inflight_bytes
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_read_bytes = max_read_bytes
        self.storage_data: dict[MetadataIndex, _ItemInfo] = {}
        self.load_id = uuid.uuid4().hex
        self.rank = 0
        self.last_failure: BaseException | None = None  # the last labelled storage failure
        self._verify_s: list[float] = []  # crc checks of this load, one entry per item (any thread)

    @property
    def checkpoint_id(self) -> str | None:
        return self._loc.uri() if self._loc else None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return CheckpointWriter.validate_checkpoint_id(checkpoint_id)

    def _location(self) -> _uri.Location:
        if self._loc is None:
            raise errors.CheckpointError("no checkpoint_id: pass tectofs://HOST:PORT/path to the reader or to dcp.load")
        return self._loc

    def _step(self, operation: str, path: str) -> Any:
        """Label a failure of this storage step (see :mod:`tectofs.torch._failures`)."""
        return step(self.rank, operation, path, self._loc.address if self._loc else None, record=self)

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self._switch(None)
        self._looked_up = False
        self.storage_data = {}
        self.last_failure = None
        if checkpoint_id:
            self._loc = _uri.parse(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise errors.CheckpointError("tectofs checkpoints have no per-rank metadata")
        metadata = pickle.loads(self.metadata_bytes())
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def metadata_bytes(self) -> bytes:
        """The checkpoint's ``.metadata`` as stored: read from storage, or with
        ``share_metadata`` read by the group's first rank and received from it (a collective)."""
        loc = self._location()
        group = _share.group_of(self.share_metadata)
        if group is None:
            return self._fetch_metadata(loc)
        try:
            return _share.read_once(group, lambda: self._fetch_metadata(loc))
        except Exception as exc:  # rank 0's failure, received: DCP reports it only as text
            self.last_failure = exc
            raise

    def _fetch_metadata(self, loc: _uri.Location) -> bytes:
        """The checkpoint's ``.metadata`` bytes, read from storage."""
        with self._step("read file", f"{loc.path}/{METADATA_NAME}"):
            try:
                return self._filesystem(loc).read_bytes(f"{loc.path}/{METADATA_NAME}")
            except FileNotFoundError:
                raise errors.NotFound(
                    f"no complete checkpoint at {loc.uri()} (no {METADATA_NAME}; an interrupted save leaves nothing here)"
                ) from None

    def _filesystem(self, loc: _uri.Location) -> FileSystem:
        """Where this load reads: the memory copy found for it (looked for once per load), or the cluster."""
        if not self._looked_up:
            self._looked_up = True
            self.source = _memory_copy.find_copy(loc.uri(), self.agents) if self.agents else None
        return cast("FileSystem", self.source) if self.source is not None else _uri.filesystem(loc.address)

    def _switch(self, source: _memory_copy.Source | None) -> None:
        if self.source is not None:
            self.source.close()
        self.source = source

    def _read_from_source(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        loc = self._location()
        self._filesystem(loc)
        try:
            _memory_copy.read_with_failover(lambda: self._read_all(plan, planner), self.source, loc.uri(), self.agents,
                                            self._switch)
            self.loaded_from = self.source.tier if self.source is not None else "storage"
        finally:
            self._switch(None)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.rank = kwargs.get("rank") or 0
        if not metadata.storage_data:
            self.storage_data = {}
        else:
            self.storage_data = metadata.storage_data
        for info in list(self.storage_data.values())[:1]:
            if not isinstance(info, _ItemInfo):
                raise errors.CheckpointError(
                    f"{self.checkpoint_id} was not written by tectofs.torch.CheckpointWriter "
                    f"(storage data is {type(info).__name__})"
                )

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """With ``share_reads``: each rank's part in reading shared items once, in its plan."""
        if _share.group_of(self.share_reads) is None:
            return plans
        needs = [{req.storage_index: self.storage_data[req.storage_index].length
                  for req in plan.items if req.type == LoadItemType.TENSOR and req.storage_index in self.storage_data}
                 for plan in plans]
        shares = _share.assign_readers(needs)
        return [dataclasses.replace(plan, storage_data=share) for plan, share in zip(plans, shares)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        fut: Future[None] = Future()
        phases: dict[str, float] = {}
        self._verify_s = []
        try:
            with self._step("read checkpoint", self._loc.path if self._loc else "(no checkpoint_id)"), \
                    _timing.timed(phases, "read"):
                self._read_from_source(plan, planner)
            phases["verify"] = sum(self._verify_s)
            nbytes = sum(self.storage_data[i].length for i in {req.storage_index for req in plan.items})
            _timing.loaded(self.checkpoint_id, self.rank, phases, nbytes)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)  # type: ignore[arg-type]  # torch's Future stub types it as the result
        return fut

    def _read_all(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        """``_read_stored``, and with ``share_reads`` the items other ranks read for this one
        received beside it (each checked, then handed to the planner as if read here)."""
        share = plan.storage_data if isinstance(plan.storage_data, _share.ReadShare) else None
        group = _share.group_of(self.share_reads) if share is not None else None
        self.received_bytes = 0
        if share is None or group is None:
            self._read_stored(plan, planner, None)
            return
        lengths = {index: self.storage_data[index].length for index in share.tags}
        exchange = _share.Exchange(group, share, lengths)
        try:
            self._read_stored(plan, planner, exchange)
            loc = self._location()
            reqs: dict[MetadataIndex, list[ReadItem]] = {}
            for req in plan.items:
                reqs.setdefault(req.storage_index, []).append(req)
            for index, data in exchange.received():
                load = _Load(index, self.storage_data[index])
                load.reqs = reqs[index]
                load.dest = data
                self._check(loc, index, load.info, data)
                if load.info.fmt == "zraw":
                    self._decode(loc, load)
                self._finish(load, planner)
            self.received_bytes = exchange.received_bytes
        finally:
            exchange.close()

    def _read_stored(self, plan: LoadPlan, planner: LoadPlanner, exchange: _share.Exchange | None) -> None:
        """Fetch every needed item (but those ``exchange`` receives) with block-aligned ranged
        reads on ``thread_count`` threads, straight into the destination tensor whenever the
        stored bytes are the tensor as-is; check each item's crc32c in the thread that
        completes it; send those ``exchange`` sends; hand items to the planner from this thread
        (planners are not thread-safe)."""
        loc = self._location()
        fs = self._filesystem(loc)
        loads: dict[MetadataIndex, _Load] = {}
        sends = exchange.share.send if exchange is not None else {}
        for req in plan.items:
            if exchange is not None and req.storage_index in exchange.share.receive:
                continue
            load = loads.get(req.storage_index)
            if load is None:
                info = self.storage_data.get(req.storage_index)
                if info is None:
                    raise errors.CheckpointError(f"{self.checkpoint_id}: no stored data for {_describe(req.storage_index)}")
                load = loads[req.storage_index] = _Load(req.storage_index, info)
            load.reqs.append(req)
        if not loads:
            return
        ordered = sorted(loads.values(), key=lambda ld: (ld.info.relative_path, ld.info.offset))
        files = sorted({ld.info.relative_path for ld in ordered})
        with cf.ThreadPoolExecutor(max_workers=max(1, self.thread_count), thread_name_prefix="tectofs-load") as pool:
            block_sizes = dict(zip(files, pool.map(lambda f: self._block_size(fs, f"{loc.path}/{f}"), files)))
            tasks = _plan_tasks(ordered, block_sizes, self.max_read_bytes, self.coalesce_gap_bytes)
            lock = threading.Lock()

            def run(task: _Task) -> list[_Load]:
                return self._run_task(fs, loc, task, lock)

            pending: dict[cf.Future, _Task] = {}
            inflight = 0
            position = 0
            try:
                while position < len(tasks) or pending:
                    while position < len(tasks) and (not pending or inflight + tasks[position].length <= self.inflight_bytes):
                        task = tasks[position]
                        position += 1
                        for load in task.loads:  # destinations are resolved just in time, here
                            if load.dest is None:
                                self._prepare(load, planner)
                        pending[pool.submit(run, task)] = task
                        inflight += task.length
                    done, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    for f in done:
                        inflight -= pending.pop(f).length
                        for load in f.result():
                            if exchange is not None and load.index in sends:
                                assert load.stored is not None
                                exchange.send(load.index, load.stored)
                            self._finish(load, planner)
            except BaseException:
                for f in pending:
                    f.cancel()
                raise

    def _prepare(self, load: "_Load", planner: LoadPlanner) -> None:
        info = load.info
        if info.fmt == "raw" and len(load.reqs) == 1 and load.reqs[0].type == LoadItemType.TENSOR:
            target = planner.resolve_tensor(load.reqs[0]).detach()
            if _fits_whole(load.reqs[0], info, target):
                load.target = target
                load.dest = _bytes_of(target) if info.length else memoryview(b"")
                return
        load.dest = memoryview(bytearray(info.length))

    def _run_task(self, fs: FileSystem, loc: _uri.Location, task: "_Task", lock: threading.Lock) -> list["_Load"]:
        """One block-aligned piece of one file: read its spans, then check the items it completed."""
        with self._step("read file", f"{loc.path}/{task.path}"):
            return self._read_task(fs, loc, task, lock)

    def _read_task(self, fs: FileSystem, loc: _uri.Location, task: "_Task", lock: threading.Lock) -> list["_Load"]:
        completed: list[_Load] = []
        if task.spans:
            raw = fs.open(f"{loc.path}/{task.path}", "rb", buffering=0)
            try:
                in_order = [part for _, _, parts in task.spans for part in parts]
                if len(in_order) > 1 and _contiguous(in_order):
                    # The items fill the window end to end: one vectored read, and a block they
                    # cover whole is decoded straight into their destinations (no block copy).
                    self._preadv_exact(raw, loc, task.path, in_order)
                else:
                    self._read_spans(raw, loc, task)
            finally:
                raw.close()
        for load in task.loads:
            with lock:
                load.remaining -= 1
                last = load.remaining == 0
            if last:
                assert load.dest is not None
                if self.verify_memory or not isinstance(self.source, _memory_copy.LocalCopy):
                    self._check(loc, load.index, load.info, load.dest)
                load.stored = load.dest  # (the bytes as stored: what share_reads sends)
                if load.info.fmt == "zraw":
                    self._decode(loc, load)  # here, in the reading thread: zstd runs beside the others
                completed.append(load)
        return completed

    def _read_spans(self, raw: Any, loc: _uri.Location, task: "_Task") -> None:
        for start, length, parts in task.spans:
            if len(parts) == 1 and parts[0][0] == start and parts[0][2] == length:
                _, load, _ = parts[0]
                lo = start - load.info.offset
                assert load.dest is not None  # resolved before the task is read
                self._read_exact(raw, loc, task.path, start, load.dest[lo : lo + length])
            else:  # small neighbours: one read, then copied out
                buf = memoryview(bytearray(length))
                self._read_exact(raw, loc, task.path, start, buf)
                for offset, load, n in parts:
                    lo = offset - load.info.offset
                    assert load.dest is not None
                    load.dest[lo : lo + n] = buf[offset - start : offset - start + n]

    def _block_size(self, fs: FileSystem, path: str) -> int:
        with self._step("stat", path):
            return fs.stat(path).block_size

    @staticmethod
    def _preadv_exact(raw: Any, loc: _uri.Location, path: str, parts: list[tuple[int, "_Load", int]]) -> None:
        """Read consecutive ``parts`` (file offset, load, length) into their loads' destinations."""
        views = []
        for offset, load, n in parts:
            assert load.dest is not None  # resolved before the task is read
            lo = offset - load.info.offset
            views.append(load.dest[lo : lo + n])
        start, total = parts[0][0], sum(n for _, _, n in parts)
        got = raw.preadv(views, start)
        if got != total:
            raise errors.CheckpointError(
                f"{loc.uri()}: file {path} is shorter than recorded (read {got} of {total} bytes at offset {start})"
            )

    @staticmethod
    def _read_exact(raw: Any, loc: _uri.Location, path: str, offset: int, into: memoryview) -> None:
        raw.seek(offset)
        got = 0
        while got < len(into):
            n = raw.readinto(into[got:])
            if not n:
                raise errors.CheckpointError(
                    f"{loc.uri()}: file {path} is shorter than recorded "
                    f"(read {got} of {len(into)} bytes at offset {offset})"
                )
            got += n

    def _finish(self, load: "_Load", planner: LoadPlanner) -> None:
        dest = load.dest
        assert dest is not None
        if load.target is not None:
            planner.commit_tensor(load.reqs[0], load.target)
        else:
            for req in load.reqs:
                self._apply(req, load.info, dest, planner)
        load.dest = load.target = load.stored = None
        load.reqs = []

    def _check(self, loc: _uri.Location, index: MetadataIndex, info: _ItemInfo, item: memoryview) -> None:
        started = time.perf_counter()
        got = crc(item)
        self._verify_s.append(time.perf_counter() - started)
        if got != info.crc32c:
            raise errors.ChecksumMismatch(
                f"checkpoint {loc.uri()}: item {_describe(index)} in file {info.relative_path} "
                f"(offset {info.offset}, {info.length} bytes) fails its crc32c check: "
                f"recorded {info.crc32c:#010x}, read {got:#010x}"
            )

    @staticmethod
    def _decode(loc: _uri.Location, load: "_Load") -> None:
        """A compressed item (checked already): its tensor bytes replace the frame, and it is
        a raw item from here on."""
        info = load.info
        assert load.dest is not None
        where = f"checkpoint {loc.uri()}: item {_describe(load.index)} in file {info.relative_path}"
        try:
            raw = tensor_codec.decode(load.dest)
        except tensor_codec.CorruptPayload as exc:
            raise errors.CheckpointError(f"{where}: {exc}") from None
        expected = math.prod(info.shape or ()) * _dtype_from_name(info.dtype or "").itemsize
        if len(raw) != expected:
            raise errors.CheckpointError(f"{where}: decompressed to {len(raw)} bytes, its shape and dtype make {expected}")
        load.dest = memoryview(raw)
        load.info = dataclasses.replace(info, fmt="raw", length=len(raw))

    @staticmethod
    def _apply(req: ReadItem, info: _ItemInfo, item: memoryview, planner: LoadPlanner) -> None:
        if req.type == LoadItemType.BYTE_IO:
            planner.load_bytes(req, io.BytesIO(item))
            return
        target = planner.resolve_tensor(req).detach()
        if info.fmt == "raw":
            shape = tuple(info.shape or ())
            dtype = _dtype_from_name(info.dtype or "")
            if _fits_whole(req, info, target):
                if item.nbytes:
                    _bytes_of(target)[:] = item  # one copy, straight into the destination
            else:
                tensor = torch.empty(shape, dtype=dtype)
                if item.nbytes:
                    _bytes_of(tensor)[:] = item
                tensor = _narrow(tensor, req.storage_offsets, req.lengths)
                if tuple(target.shape) != tuple(tensor.shape):
                    raise errors.CheckpointError(
                        f"item {_describe(req.storage_index)}: size mismatch {tuple(target.shape)} vs {tuple(tensor.shape)}"
                    )
                target.copy_(tensor)
        elif info.fmt == "torch":
            tensor = torch.load(io.BytesIO(item), map_location="cpu", weights_only=True)
            tensor = _narrow(tensor, req.storage_offsets, req.lengths)
            target.copy_(tensor)
        else:
            raise errors.CheckpointError(f"item {_describe(req.storage_index)}: unknown format {info.fmt!r}")
        planner.commit_tensor(req, target)



class _Load:
    """One stored item being loaded: where its bytes go and how many reads are left."""

    __slots__ = ("index", "info", "reqs", "dest", "target", "remaining", "stored")

    def __init__(self, index: MetadataIndex, info: _ItemInfo) -> None:
        self.index = index
        self.info = info
        self.reqs: list[ReadItem] = []
        self.dest: memoryview | None = None  # the target tensor's bytes, or a private buffer
        self.target: torch.Tensor | None = None  # set when dest is the target tensor itself
        self.remaining = 0  # tasks that still have to deliver part of this item
        self.stored: memoryview | None = None  # once read and checked: its bytes as stored


@dataclass
class _Task:
    """Reads inside one block-aligned window of one file (a block is fetched whole by the
    client, so a window never crosses a block boundary: no block is fetched twice).
    ``spans``: ``(file offset, length, [(offset, load, length), ...])``; a span with one part
    covering it is read straight into that item's destination."""

    path: str
    length: int
    spans: list[tuple[int, int, list[tuple[int, _Load, int]]]]
    loads: list[_Load]


_SMALL_READ_BYTES = 1 << 20


def _contiguous(parts: list[tuple[int, "_Load", int]]) -> bool:
    """Does each part (file offset, load, length) start where the one before it ends?"""
    return all(a[0] + a[2] == b[0] for a, b in zip(parts, parts[1:]))


def _plan_tasks(ordered: list[_Load], block_sizes: dict[str, int], max_read: int, gap: int) -> list[_Task]:
    """Cut the items (sorted by file and offset) into block-aligned windows of at most
    ``max_read`` bytes, in file order; inside a window, neighbouring small pieces less than
    ``gap`` apart share one read."""
    windows: dict[tuple[str, int], list[tuple[int, _Load, int]]] = {}
    tasks: list[_Task] = []
    for load in ordered:
        info = load.info
        if info.length == 0:  # nothing to read; still checked and handed to the planner
            load.remaining = 1
            tasks.append(_Task(info.relative_path, 0, [], [load]))
            continue
        block = block_sizes[info.relative_path]
        piece = max(1, min(max_read, block))
        position, end = info.offset, info.offset + info.length
        while position < end:
            block_start = position - position % block
            window = block_start + (position - block_start) // piece * piece
            n = min(end, window + piece, block_start + block) - position
            windows.setdefault((info.relative_path, window), []).append((position, load, n))
            load.remaining += 1
            position += n
    for (path, _), parts in sorted(windows.items(), key=lambda kv: kv[0]):
        spans: list[tuple[int, int, list[tuple[int, _Load, int]]]] = []
        for offset, load, n in parts:
            last = spans[-1] if spans else None
            if (
                last is not None and n < _SMALL_READ_BYTES and last[1] < _SMALL_READ_BYTES
                and 0 <= offset - (last[0] + last[1]) <= gap
            ):
                spans[-1] = (last[0], offset + n - last[0], last[2] + [(offset, load, n)])
            else:
                spans.append((offset, n, [(offset, load, n)]))
        loads = list(dict.fromkeys(load for _, load, _ in parts))
        tasks.append(_Task(path, sum(n for _, _, n in parts), spans, loads))
    return tasks


def _fits_whole(req: ReadItem, info: _ItemInfo, target: torch.Tensor) -> bool:
    """Can the stored raw bytes of ``info`` be copied as-is into ``target``?"""
    shape = tuple(info.shape or ())
    return (
        info.fmt == "raw"
        and all(o == 0 for o in req.storage_offsets)
        and tuple(req.lengths) == shape
        and tuple(target.shape) == shape
        and _dtype_name(target.dtype) == info.dtype
        and target.device.type == "cpu"
        and type(target) is torch.Tensor
        and target.layout == torch.strided
        and target.is_contiguous()
    )


def _bytes_of(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, lengths)):
        if start != 0 or length != tensor.size(dim):
            tensor = torch.narrow(tensor, dim, start, length)
    return tensor
