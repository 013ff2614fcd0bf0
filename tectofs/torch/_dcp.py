"""DCP ``StorageWriter`` / ``StorageReader`` over the native tectofs client.

Layout of a checkpoint ``/run/step_100``::

    /run/.step_100.pending-<token>/     while ranks write (hidden; never read by loaders)
        __0_0.distcp __0_1.distcp ...   rank 0's items, packed into a few large files
        __1_0.distcp ...
        .metadata                       written last, by the coordinator
    /run/step_100/                      after the commit: one atomic rename of the above

Commit protocol
  * ``prepare_global_plan`` (coordinator) draws a random token, creates the pending
    directory ``<parent>/.<name>.pending-<token>`` and sends its path to every rank inside
    the plan's ``storage_data`` (with the rank's file prefix). Every rank therefore writes
    into the same directory, and two attempts at the same step never share one.
  * ``write_data`` (all ranks) writes ``__<rank>_<i>.distcp`` files in parallel; each item
    is recorded with its file, offset, length, format and crc32c.
  * ``finish`` (coordinator) writes ``.metadata`` into the pending directory, then renames
    the directory onto the final name: one metadata transaction. Until that rename the
    checkpoint does not exist; after it, it is complete. A crash anywhere leaves a hidden
    ``.pending-`` directory that :func:`tectofs.torch.gc_pending` removes.
  * An existing non-empty checkpoint at the final path is an error unless the writer was
    built with ``overwrite=True``; then the new directory and the old one swap names in
    one atomic ``exchange`` (readers see the old checkpoint or the new one, never a gap),
    and the old one, now under the hidden ``.pending-`` name, is deleted.
  * Then, best effort, the coordinator removes leftovers of interrupted saves in the same
    parent directory (hidden ``.pending-``/``.replaced-`` entries untouched for
    ``pending_grace_s``, default 24 h); a failure there never fails the save.

Tensors are written as their raw bytes (no pickle) whenever they are plain strided CPU
tensors after ``.cpu()``; anything else falls back to ``torch.save`` bytes. Non-tensor
objects are the planner's pickled ``BytesIO``.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import io
import os
import pickle
import threading
import uuid
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from .. import errors
from ..checksum import crc
from . import _uri
from ._staging import StagingPool

METADATA_NAME = ".metadata"
DATA_SUFFIX = ".distcp"
PENDING_MARK = ".pending-"
REPLACED_MARK = ".replaced-"
FORMAT_VERSION = 1

MiB = 1024 * 1024


def pending_name(name: str, token: str) -> str:
    return f".{name}{PENDING_MARK}{token}"


@dataclass
class _ItemInfo:
    """Where one saved item lives, and how to check and decode it (``storage_data``)."""

    relative_path: str
    offset: int
    length: int
    crc32c: int
    fmt: str  # "raw" (tensor bytes), "torch" (torch.save of a tensor), "bytes" (planner BytesIO)
    dtype: str | None = None
    shape: tuple[int, ...] | None = None


@dataclass
class _PlanData:
    """What the coordinator tells each rank: its file prefix and the pending directory."""

    prefix: str
    pending: str
    token: str


def _item_nbytes(item: WriteItem) -> int:
    if item.type == WriteItemType.BYTE_IO:
        return item.bytes_io_data.nbytes if item.bytes_io_data is not None else 0
    return item.tensor_storage_size() or 0


def _split_items(items: list[WriteItem], bins: int, max_file_bytes: int | None) -> list[list[WriteItem]]:
    """Pack items into at most ``bins`` files of balanced size (largest first), opening
    more files only when ``max_file_bytes`` would be exceeded."""
    if not items:
        return []
    ordered = sorted(items, key=_item_nbytes, reverse=True)
    total = sum(_item_nbytes(i) for i in ordered)
    count = max(1, min(bins, len(ordered)))
    if max_file_bytes:
        count = max(count, -(-total // max_file_bytes))
    buckets: list[list[WriteItem]] = [[] for _ in range(count)]
    sizes = [0] * count
    for item in ordered:
        i = min(range(count), key=sizes.__getitem__)
        buckets[i].append(item)
        sizes[i] += _item_nbytes(item)
    return [b for b in buckets if b]


def _raw_view(t: torch.Tensor) -> memoryview | None:
    """The bytes of ``t`` (a CPU tensor) without a pickle; None if it has no plain layout."""
    if t.layout != torch.strided or t.is_quantized or t.is_nested or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    t = t.contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    try:
        return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")
    except (RuntimeError, TypeError):
        return None


def _minimal(t: torch.Tensor) -> torch.Tensor:
    """``t`` with a storage no bigger than itself (torch.save writes whole storages)."""
    try:
        if t.layout == torch.strided and t.untyped_storage().nbytes() != t.nbytes:
            return t.clone()
    except (RuntimeError, NotImplementedError):
        pass
    return t


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise errors.CheckpointError(f"checkpoint uses dtype {name!r}, unknown to this torch {torch.__version__}")
    return dtype


class _CountingWriter:
    """Tracks the offset of a write-only stream (``tell`` without asking the server)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self.offset = 0

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n:
            self.raw.write(data)
            self.offset += n
        return n


_CRC_OVERLAP_BYTES = 4 * MiB
_crc_executor: tuple[int, cf.ThreadPoolExecutor] | None = None
_crc_lock = threading.Lock()


def _crc_pool() -> cf.ThreadPoolExecutor:
    """Threads for checksums overlapped with uploads (one pool per process: a forked
    child never inherits its parent's dead workers)."""
    global _crc_executor
    with _crc_lock:
        if _crc_executor is None or _crc_executor[0] != os.getpid():
            _crc_executor = (os.getpid(), cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tectofs-crc"))
        return _crc_executor[1]


def _describe(index: MetadataIndex) -> str:
    s = index.fqn
    if index.offset is not None and any(index.offset):
        s += f" (chunk at offset {list(index.offset)})"
    return s


class CheckpointWriter(StorageWriter, AsyncStager):
    """DCP storage writer for ``tectofs://HOST:PORT/path/to/step``.

    Args:
        checkpoint_id: ``tectofs://HOST:PORT/path`` (may be given later through
            ``dcp.save(checkpoint_id=...)``).
        thread_count: files written in parallel per rank (and files per rank, unless
            ``max_file_bytes`` asks for more). The client already pipelines several
            blocks of each file (``limits.write_inflight_bytes_max``); on the 2-core machine
            this was tuned on, one file per rank saved 12-25% faster than two or three.
            Raise it on hosts with spare cores and network.
        max_file_bytes: optional cap on the size of one data file.
        overwrite: replace an existing checkpoint at the same path (see module docs);
            by default saving onto an existing non-empty checkpoint fails.
        staging_max_bytes: optional hard cap on the staging buffers used by
            ``dcp.async_save`` (a bigger state dict is refused instead of staged).
        staging_timeout_s: how long ``async_save`` may wait for the previous upload
            to release the staging buffers (None: forever).
        pending_grace_s: after each commit the coordinator deletes leftovers of
            interrupted saves (``.<name>.pending-*``/``.replaced-*``) in the checkpoint's
            parent directory that nothing has touched for this long (see
            :func:`tectofs.torch.gc_pending`); None turns that off. Keep it well above the
            longest save: a pending directory is only touched as its files complete.

    One writer runs one save at a time. Keep one writer for all ``dcp.async_save`` calls of
    a job: its staging buffers are reused, and a second ``async_save`` blocks in staging
    until the first upload has finished (successfully or not: failures surface in the
    future ``async_save`` returned). ``dcp.save(checkpoint_id="tectofs://...")`` without a
    writer works too (``import tectofs.torch`` teaches DCP the scheme).
    """

    # dcp.async_save: staging is synchronous (the copy is done when stage() returns).
    _synchronize_after_execute: bool = False

    def __init__(
        self,
        checkpoint_id: str | os.PathLike | None = None,
        *,
        thread_count: int = 1,
        max_file_bytes: int | None = None,
        overwrite: bool = False,
        staging_max_bytes: int | None = None,
        staging_timeout_s: float | None = None,
        pending_grace_s: float | None = 24 * 3600.0,
    ) -> None:
        super().__init__()
        if thread_count < 1:
            raise ValueError("thread_count must be >= 1")
        self.thread_count = thread_count
        self.max_file_bytes = max_file_bytes
        self.overwrite = overwrite
        self.staging_max_bytes = staging_max_bytes
        self.staging_timeout_s = staging_timeout_s
        self.pending_grace_s = pending_grace_s
        self._loc: _uri.Location | None = _uri.parse(checkpoint_id) if checkpoint_id else None
        self.save_id = uuid.uuid4().hex
        self.rank = 0
        self.is_coordinator = True
        self._plan_data: _PlanData | None = None
        self._pool: StagingPool | None = None
        self._pool_lock = threading.Lock()
        self._unclaimed_lease: Any = None

    # -- pickling (AsyncCheckpointerType.PROCESS ships the writer to a subprocess) -------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_pool_lock"] = None
        state["_unclaimed_lease"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pool_lock = threading.Lock()

    # -- identity -------------------------------------------------------------------------
    @property
    def checkpoint_id(self) -> str | None:
        return self._loc.uri() if self._loc else None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        try:
            _uri.parse(checkpoint_id)
        except (errors.TectofsError, TypeError, ValueError):
            return False
        return True

    def _location(self) -> _uri.Location:
        if self._loc is None:
            raise errors.CheckpointError("no checkpoint_id: pass tectofs://HOST:PORT/path to the writer or to dcp.save")
        if not self._loc.name:
            raise errors.CheckpointError("a checkpoint cannot be the root directory")
        return self._loc

    def _fs(self) -> Any:
        return _uri.filesystem(self._location().address)

    # -- StorageWriter --------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self._claim_lease()
        if checkpoint_id:
            self._loc = _uri.parse(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._plan_data = None

    def storage_meta(self) -> StorageMeta | None:
        self._claim_lease()
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self._claim_lease()
        self.is_coordinator = is_coordinator
        self.rank = kwargs.get("rank") or 0
        if not kwargs.get("use_collectives", True):
            raise errors.CheckpointError(
                "tectofs CheckpointWriter needs use_collectives=True: the atomic commit is done by the coordinator"
            )
        self._plan_data = None
        self._location()

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        loc = self._location()
        fs = self._fs()
        if not self.overwrite and self._nonempty(fs, loc.path):
            raise errors.AlreadyExists(
                f"checkpoint {loc.uri()} already exists; use another path or CheckpointWriter(..., overwrite=True)"
            )
        token = f"{uuid.uuid4().hex[:16]}"
        pending = _uri.Location(loc.address, loc.parent).child(pending_name(loc.name, token)).path
        fs.mkdir(loc.parent, parents=True, exist_ok=True)
        fs.mkdir(pending)
        return [
            dataclasses.replace(plan, storage_data=_PlanData(prefix=f"__{i}_", pending=pending, token=token))
            for i, plan in enumerate(plans)
        ]

    @staticmethod
    def _nonempty(fs: Any, path: str) -> bool:
        try:
            st = fs.stat(path)
        except FileNotFoundError:
            return False
        return st.kind != "dir" or bool(fs.listdir(path))

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut: Future[list[WriteResult]] = Future()
        try:
            fut.set_result(self._write_all(plan, planner))
        except BaseException as exc:  # surfaces through DCP on every rank
            fut.set_exception(exc)
        return fut

    def _write_all(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        if getattr(planner, "_enable_plan_caching", False):
            raise errors.CheckpointError(
                "DefaultSavePlanner(enable_plan_caching=True) is not supported by the tectofs writer: "
                "cached plans would reuse an old pending directory"
            )
        data = plan.storage_data
        if not isinstance(data, _PlanData):
            raise errors.CheckpointError(f"plan carries no tectofs storage data (got {type(data).__name__})")
        self._plan_data = data
        fs = self._fs()
        buckets = _split_items(plan.items, self.thread_count, self.max_file_bytes)
        jobs = [(f"{data.prefix}{i}{DATA_SUFFIX}", bucket) for i, bucket in enumerate(buckets)]
        if len(jobs) <= 1:
            return [r for name, bucket in jobs for r in self._write_file(fs, data.pending, name, bucket, planner)]
        results: list[WriteResult] = []
        with cf.ThreadPoolExecutor(max_workers=min(self.thread_count, len(jobs)), thread_name_prefix="tectofs-ckpt") as pool:
            futures = [pool.submit(self._write_file, fs, data.pending, name, bucket, planner) for name, bucket in jobs]
            for f in futures:
                results.extend(f.result())
        return results

    def _write_file(
        self, fs: Any, pending: str, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        results = []
        # Small objects first, then tensors (like FileSystemWriter): cheap items never wait.
        items = sorted(items, key=lambda it: it.type != WriteItemType.BYTE_IO)
        with fs.open(f"{pending}/{name}", "wb") as raw:
            out = _CountingWriter(raw)
            for item in items:
                data = planner.resolve_data(item)
                offset = out.offset
                dtype = shape = None
                if item.type == WriteItemType.BYTE_IO:
                    if not isinstance(data, io.BytesIO):
                        raise errors.CheckpointError(f"item {_describe(item.index)}: expected BytesIO, got {type(data)}")
                    view = data.getbuffer()
                    fmt = "bytes"
                else:
                    tensor = data.detach()
                    if tensor.device.type != "cpu":
                        tensor = tensor.cpu()
                    if tensor.layout != torch.strided:
                        raise errors.CheckpointError(
                            f"item {_describe(item.index)}: {tensor.layout} tensors cannot be checkpointed "
                            "through DCP (its load planner narrows them into copies); save them dense"
                        )
                    view = _raw_view(tensor)
                    if view is not None:
                        fmt, dtype, shape = "raw", _dtype_name(tensor.dtype), tuple(tensor.shape)
                    else:
                        buf = io.BytesIO()
                        torch.save(_minimal(tensor), buf)
                        view, fmt = buf.getbuffer(), "torch"
                if view.nbytes >= _CRC_OVERLAP_BYTES:
                    # crc32c releases the GIL: checksum in a helper thread while the client
                    # copies the same bytes into its block buffers.
                    pending_crc = _crc_pool().submit(crc, view)
                    try:
                        out.write(view)
                    finally:
                        checksum = pending_crc.result()
                else:
                    checksum = crc(view)
                    out.write(view)
                length = out.offset - offset
                del view
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=length,
                        storage_data=_ItemInfo(name, offset, length, checksum, fmt, dtype, shape),
                    )
                )
        return results

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        loc = self._location()
        data = self._plan_data
        if data is None:
            raise errors.CheckpointError("finish() called before write_data()")
        fs = self._fs()
        storage_md = {}
        for per_rank in results:
            for wr in per_rank:
                storage_md[wr.index] = wr.storage_data
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        if metadata.version is None:
            from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

            metadata.version = CURRENT_DCP_VERSION
        fs.write_bytes(f"{data.pending}/{METADATA_NAME}", pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL))
        self._commit(fs, data.pending, loc, data.token)
        self._collect_leftovers(loc)

    def _collect_leftovers(self, loc: _uri.Location) -> list[str]:
        """Best effort: delete stale leftovers of interrupted saves next to ``loc``."""
        if self.pending_grace_s is None:
            return []
        parent = _uri.Location(loc.address, loc.parent).uri()
        try:
            from ._manage import gc_pending

            return gc_pending(parent, older_than_s=self.pending_grace_s)
        except Exception as exc:  # never fails a save that is already committed
            warnings.warn(f"tectofs: could not clean up leftovers of interrupted saves in {parent}: {exc}",
                          stacklevel=2)
            return []

    def _commit(self, fs: Any, pending: str, loc: _uri.Location, token: str) -> None:
        final = loc.path
        try:
            fs.rename(pending, final)  # atomic; replaces nothing or an empty directory
            return
        except (FileExistsError, errors.DirectoryNotEmpty, NotADirectoryError, IsADirectoryError) as exc:
            if not self.overwrite:
                raise errors.AlreadyExists(
                    f"checkpoint {loc.uri()} appeared while saving; the new one is left at "
                    f"{loc.uri(pending)} (use overwrite=True to replace)"
                ) from exc
        exchange = getattr(fs, "exchange", None)
        if exchange is not None:
            exchange(pending, final)  # atomic swap: no moment without a checkpoint
            aside = pending
        else:
            aside = _uri.Location(loc.address, loc.parent).child(f".{loc.name}{REPLACED_MARK}{token}").path
            fs.rename(final, aside)
            fs.rename(pending, final)
        try:
            if fs.stat(aside).kind == "dir":
                fs.rmtree(aside)
            else:
                fs.remove(aside)
        except Exception as exc:  # the new checkpoint is in place; leftovers are gc'd later
            warnings.warn(f"tectofs: could not delete replaced checkpoint {aside}: {exc}", stacklevel=2)

    # -- AsyncStager ----------------------------------------------------------------------
    def _staging_pool(self) -> StagingPool:
        with self._pool_lock:
            if self._pool is None:
                self._pool = StagingPool(self.staging_max_bytes)
            return self._pool

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Copy ``state_dict`` into this writer's reusable staging buffers (blocking).

        Waits first for the previous ``async_save`` through this writer to finish: one
        staged checkpoint in flight per writer, so memory stays bounded and DCP's
        collectives of two saves never interleave."""
        staged, lease = self._staging_pool().stage(state_dict, timeout=self.staging_timeout_s)
        self._unclaimed_lease = lease
        return staged

    def _claim_lease(self) -> None:
        lease = self._unclaimed_lease
        if lease is not None and threading.current_thread() is not lease.stage_thread:
            lease.owner = threading.current_thread()
            self._unclaimed_lease = None

    def synchronize_staging(self) -> None:
        """No-op: :meth:`stage` returns only once the copy is complete."""

    def wait_staging_idle(self, timeout: float | None = None) -> bool:
        """Wait until the staging buffers are free (the last async upload ended)."""
        return self._pool.wait_idle(timeout) if self._pool is not None else True

    def close(self) -> None:
        """Drop the staging buffers (call after the last ``async_save``)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.close()
                self._pool = None


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
    """

    def __init__(
        self,
        checkpoint_id: str | os.PathLike | None = None,
        *,
        thread_count: int = 4,
        inflight_bytes: int = 256 * MiB,
        coalesce_gap_bytes: int = 1 * MiB,
        max_read_bytes: int = 64 * MiB,
    ) -> None:
        super().__init__()
        self._loc: _uri.Location | None = _uri.parse(checkpoint_id) if checkpoint_id else None
        self.thread_count = thread_count
        self.inflight_bytes = inflight_bytes
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_read_bytes = max_read_bytes
        self.storage_data: dict[MetadataIndex, _ItemInfo] = {}
        self.load_id = uuid.uuid4().hex

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

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self.storage_data = {}
        if checkpoint_id:
            self._loc = _uri.parse(checkpoint_id)
        self.load_id = uuid.uuid4().hex

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        loc = self._location()
        if kwargs.get("rank") is not None:
            raise errors.CheckpointError("tectofs checkpoints have no per-rank metadata")
        fs = _uri.filesystem(loc.address)
        try:
            blob = fs.read_bytes(f"{loc.path}/{METADATA_NAME}")
        except FileNotFoundError:
            raise errors.NotFound(
                f"no complete checkpoint at {loc.uri()} (no {METADATA_NAME}; an interrupted save leaves nothing here)"
            ) from None
        metadata = pickle.loads(blob)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
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
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        fut: Future[None] = Future()
        try:
            self._read_all(plan, planner)
            fut.set_result(None)
        except BaseException as exc:
            fut.set_exception(exc)
        return fut

    def _read_all(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        """Fetch every needed item with block-aligned ranged reads on ``thread_count``
        threads, straight into the destination tensor whenever the stored bytes are the
        tensor as-is; check each item's crc32c in the thread that completes it; hand items
        to the planner from this thread (planners are not thread-safe)."""
        loc = self._location()
        fs = _uri.filesystem(loc.address)
        loads: dict[MetadataIndex, _Load] = {}
        for req in plan.items:
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
            block_sizes = dict(zip(files, pool.map(lambda f: fs.stat(f"{loc.path}/{f}").block_size, files)))
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

    def _run_task(self, fs: Any, loc: _uri.Location, task: "_Task", lock: threading.Lock) -> list["_Load"]:
        """One block-aligned piece of one file: read its spans, then check the items it completed."""
        completed: list[_Load] = []
        if task.spans:
            raw = fs.open(f"{loc.path}/{task.path}", "rb", buffering=0)
            try:
                for start, length, parts in task.spans:
                    if len(parts) == 1 and parts[0][0] == start and parts[0][2] == length:
                        _, load, _ = parts[0]
                        lo = start - load.info.offset
                        self._read_exact(raw, loc, task.path, start, load.dest[lo : lo + length])
                    else:  # small neighbours: one read, then copied out
                        buf = memoryview(bytearray(length))
                        self._read_exact(raw, loc, task.path, start, buf)
                        for offset, load, n in parts:
                            lo = offset - load.info.offset
                            load.dest[lo : lo + n] = buf[offset - start : offset - start + n]
            finally:
                raw.close()
        for load in task.loads:
            with lock:
                load.remaining -= 1
                last = load.remaining == 0
            if last:
                self._check(loc, load.index, load.info, load.dest)
                completed.append(load)
        return completed

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
        load.dest = load.target = None
        load.reqs = []

    def _check(self, loc: _uri.Location, index: MetadataIndex, info: _ItemInfo, item: memoryview) -> None:
        got = crc(item)
        if got != info.crc32c:
            raise errors.ChecksumMismatch(
                f"checkpoint {loc.uri()}: item {_describe(index)} in file {info.relative_path} "
                f"(offset {info.offset}, {info.length} bytes) fails its crc32c check: "
                f"recorded {info.crc32c:#010x}, read {got:#010x}"
            )

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

    __slots__ = ("index", "info", "reqs", "dest", "target", "remaining")

    def __init__(self, index: MetadataIndex, info: _ItemInfo) -> None:
        self.index = index
        self.info = info
        self.reqs: list[ReadItem] = []
        self.dest: memoryview | None = None  # the target tensor's bytes, or a private buffer
        self.target: torch.Tensor | None = None  # set when dest is the target tensor itself
        self.remaining = 0  # tasks that still have to deliver part of this item


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
    return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")


def _narrow(tensor: torch.Tensor, offsets: Any, lengths: Any) -> torch.Tensor:
    for dim, (start, length) in enumerate(zip(offsets, lengths)):
        if start != 0 or length != tensor.size(dim):
            tensor = torch.narrow(tensor, dim, start, length)
    return tensor
