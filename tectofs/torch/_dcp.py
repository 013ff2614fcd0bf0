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
    checkpoint does not exist; after it, it is complete. A failed save's pending directory
    is deleted (:meth:`CheckpointWriter.abandon`, best effort); a crash anywhere leaves a
    hidden ``.pending-`` directory that :func:`tectofs.torch.gc_pending` removes.
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

import collections
import concurrent.futures as cf
import dataclasses
import io
import os
import pickle
import threading
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from .. import errors, limits, tensor_codec
from .. import uri as _uri
from ..checkpoint_gc import METADATA_NAME, PENDING_GRACE_S, REPLACED_MARK, gc_pending, pending_name
from ..checksum import crc
from . import _incremental, _timing
from ._directory import directory_compresses
from ._failures import step
from ._staging import Lease, StagedStateDict, StagingPool

if TYPE_CHECKING:
    from ..client import FileSystem

TIER_WRITERS: dict[str, type[CheckpointWriter]] = {}  # tier -> the writer class CheckpointWriter(tier=...) makes
DATA_SUFFIX = ".distcp"
FORMAT_VERSION = 1

MiB = 1024 * 1024


@dataclass
class _ItemInfo:
    """Where one saved item lives, and how to check and decode it (``storage_data``)."""

    relative_path: str
    offset: int
    length: int
    crc32c: int
    fmt: str  # "raw" (tensor bytes), "zraw" (tensor bytes, compressed: tensor_codec), "torch" (torch.save of a
    # tensor), "bytes" (planner BytesIO); crc32c is of the bytes stored (a zraw item's frame)
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    pieces: list[bytes] | None = None  # incremental checkpoints: digest of each block of the item (_incremental)


@dataclass
class _PlanData:
    """What the coordinator tells each rank: its file prefix and the pending directory."""

    prefix: str
    pending: str
    token: str
    compress: bool = False  # store raw tensors through tectofs.tensor_codec (the writer's option or the directory's)
    block_size: int = 0  # incremental (CheckpointWriter(incremental=True)): the files' block size, else 0
    previous: str | None = None  # incremental: the committed checkpoint to share unchanged pieces with


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
        return memoryview(t.reshape(-1).view(torch.uint8).numpy()).cast("B")  # type: ignore[arg-type]  # ndarray is a buffer
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


@dataclass
class _Item:
    """One item's bytes as they will be stored, and what records them."""

    index: MetadataIndex
    view: memoryview
    fmt: str
    dtype: str | None
    shape: Any
    temporary: bool  # the bytes were made for this save (a copy, a pickle, a frame), not the caller's own


class _ItemWriter:
    """Writes a file's items end to end through ``RawFile.pwritev``, in vectored writes: a
    block the items cover whole is encoded straight from their memory rather than copied into a
    block buffer first. Each item's crc32c is computed meanwhile (those of ``_CRC_OVERLAP_BYTES``
    or more on the crc threads, beside the upload). Items are held, not copied, until their
    batch is written: a batch is written once it holds ``batch_bytes``, or ``temporary_bytes``
    of items made for the save (copies, compressed frames, pickles: memory the caller does not
    already hold). ``results`` records each item written."""

    def __init__(self, raw: Any, name: str, batch_bytes: int, temporary_bytes: int) -> None:
        self.raw = raw
        self.name = name
        self.batch_bytes = batch_bytes
        self.temporary_bytes = temporary_bytes
        self.offset = 0  # where the next item goes
        self.results: list[WriteResult] = []
        self._items: list[tuple[_Item, int, "cf.Future[int] | int"]] = []  # (item, its offset, its crc)
        self._batched = self._temporary = 0

    def add(self, item: _Item) -> None:
        view, n = item.view, item.view.nbytes
        checksum: cf.Future[int] | int = _pool("crc", 2).submit(crc, view) if n >= _CRC_OVERLAP_BYTES else crc(view)
        self._items.append((item, self.offset, checksum))
        self.offset += n
        self._batched += n
        self._temporary += n if item.temporary else 0
        if self._batched >= self.batch_bytes or self._temporary >= self.temporary_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the items added since the last flush; raise if the file took fewer bytes."""
        items, total = self._items, self._batched
        self._items, self._batched, self._temporary = [], 0, 0
        try:
            if total:
                start = items[0][1]
                written = self.raw.pwritev([item.view for item, _, _ in items if item.view.nbytes], start)
                if written != total:
                    raise errors.CheckpointError(f"{self.name}: wrote {written} of {total} bytes at offset {start}")
        finally:  # the crc threads read the items: done with them before the caller may reuse them
            cf.wait([c for _, _, c in items if isinstance(c, cf.Future)])
        for item, offset, checksum in items:
            value = checksum.result() if isinstance(checksum, cf.Future) else checksum
            n = item.view.nbytes
            info = _ItemInfo(self.name, offset, n, value, item.fmt, item.dtype, item.shape)
            self.results.append(WriteResult(index=item.index, size_in_bytes=n, storage_data=info))


_CRC_OVERLAP_BYTES = 4 * MiB
_WRITE_BATCH_BYTES = 1024 * MiB  # items held for one vectored write (a block astride two batches is copied)
_WRITE_BATCH_TEMPORARY_BYTES = 128 * MiB  # ... of which copies made for the save (what a batch costs in memory)
_COMPRESS_AHEAD_BYTES = 256 * MiB  # raw bytes of items being compressed ahead of the upload
_pools: dict[str, tuple[int, cf.ThreadPoolExecutor]] = {}
_pools_lock = threading.Lock()


def _pool(kind: str, workers: int) -> cf.ThreadPoolExecutor:
    """A process-wide pool of ``workers`` threads for ``kind`` of work beside the uploads
    (crcs, compression); a forked child makes its own, never inheriting its parent's dead workers."""
    with _pools_lock:
        entry = _pools.get(kind)
        if entry is None or entry[0] != os.getpid():
            entry = _pools[kind] = (os.getpid(), cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"tectofs-{kind}"))
        return entry[1]


def _add_compressed(out: _ItemWriter, item: _Item, job: "cf.Future[Any] | None") -> int:
    """Hand ``item`` to ``out``, as its compressed frame if ``job`` (its ``tensor_codec.encode``)
    made one (None: it saves too little, the item stays raw); returns the raw bytes it had
    ahead (0 without a job)."""
    encoded = job.result() if job is not None else None
    out.add(item if encoded is None else dataclasses.replace(item, view=memoryview(encoded.frame), fmt="zraw", temporary=True))
    return item.view.nbytes if job is not None else 0


def _done(job: "cf.Future[Any] | None") -> bool:
    return job is None or job.done()


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
        async_staging: ``dcp.async_save`` returns at once and copies the state into the staging
            buffers on a background thread, beside the next training step, instead of
            blocking for the copy. ``async_save`` then returns DCP's ``AsyncSaveResponse``
            (``staging_completion``, ``upload_completion``) rather than a future: the caller
            may modify the state again once ``staging_completion`` is done. Every
            ``torch.optim`` optimizer's ``step()`` waits for that by itself; other in-place
            changes (a forward pass that updates BatchNorm statistics) must wait for it, and
            a tensor changed before its copy is finished fails the save
            (``CheckpointError``) instead of saving a torn state
            (:meth:`tectofs.torch._staging.StagingPool.stage_beside`).
        staging_timeout_s: how long ``async_save`` may wait for the previous upload
            to release the staging buffers (default ``limits.staging_timeout_s``, 300 s:
            training never freezes behind a stuck upload; None: forever).
        compress: store tensors compressed (``tectofs.tensor_codec``: zstd on floats split into
            planes; bf16 weights to about 0.66 of their bytes; incompressible items stay raw).
            None (default): as the checkpoint's directory says: the extended attribute
            ``user.tectofs.compress`` (``zstd`` or ``off``) on the nearest ancestor that has it
            (``tectofs set-policy DIR --compress zstd``), else off. Loads need no option.
        incremental: share unchanged pieces with the previous checkpoint instead of writing them
            again (``tectofs.torch._incremental``): each tensor of 1 MiB or more starts on a
            block boundary, each of its blocks is hashed (SHA-256), and a block equal to the
            same item's block in the newest committed checkpoint next to this one (other than
            itself) is referenced, not rewritten: the same chunks, counted by the metadata
            store, so deleting either checkpoint keeps what the other uses. Loads need no
            option and verify every item's crc32c as always. Tensors are stored raw (no
            ``compress``). ``referenced_bytes`` says how many bytes the last save shared.
        tier: ``"memory"`` makes a :class:`tectofs.torch._memory.MemoryTierWriter`: saves land in this
            host's memory agent (``tectofs agent``), replicated to its peers, persisted behind.
        agent: with ``tier="memory"``: the agent list ``HOST:PORT[,peer,...]`` (default ``$TECTOFS_AGENT``).
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

    def __new__(cls, *args: Any, tier: str = "storage", **kwargs: Any) -> CheckpointWriter:
        if tier not in ("storage", "memory"):
            raise ValueError(f"tier must be 'storage' or 'memory', not {tier!r}")
        if cls is CheckpointWriter:
            cls = TIER_WRITERS.get(tier, cls)  # tectofs.torch._memory registers the memory tier's
        return super().__new__(cls)

    def __init__(
        self,
        checkpoint_id: str | os.PathLike | None = None,
        *,
        thread_count: int = 1,
        max_file_bytes: int | None = None,
        overwrite: bool = False,
        staging_max_bytes: int | None = None,
        staging_timeout_s: float | None = limits.staging_timeout_s,
        pending_grace_s: float | None = PENDING_GRACE_S,
        compress: bool | None = None,
        async_staging: bool = False,
        incremental: bool = False,
        tier: str = "storage",
        agent: str | None = None,
    ) -> None:
        super().__init__()
        if thread_count < 1:
            raise ValueError("thread_count must be >= 1")
        if incremental and compress:
            raise ValueError("an incremental checkpoint stores tensors raw (its pieces are shared as stored):"
                             " CheckpointWriter(incremental=True) takes no compress=True")
        self.incremental = incremental
        self.referenced_bytes = 0  # incremental: bytes of this rank's last save taken from the previous checkpoint
        self._previous_items: dict[MetadataIndex, _ItemInfo] = {}
        self.thread_count = thread_count
        self.max_file_bytes = max_file_bytes
        self.overwrite = overwrite
        self.staging_max_bytes = staging_max_bytes
        self.staging_timeout_s = staging_timeout_s
        self.pending_grace_s = pending_grace_s
        self.compress = compress
        self.async_staging = async_staging
        self._loc: _uri.Location | None = _uri.parse(checkpoint_id) if checkpoint_id else None
        self.save_id = uuid.uuid4().hex
        self.rank = 0
        self.last_failure: BaseException | None = None  # the last labelled storage failure
        self.is_coordinator = True
        self._plan_data: _PlanData | None = None
        self._pool: StagingPool | None = None
        self._pool_lock = threading.Lock()
        self._unclaimed_lease: Lease | None = None
        self._pending_owned: str | None = None  # coordinator: a pending directory not yet committed
        self._staged_s: float | None = None  # the last stage()'s copy time, for the save that follows it
        self._phases: dict[str, float] = {}  # this save's timings (tectofs.torch._timing)
        self._saved_bytes = 0

    # -- pickling (AsyncCheckpointerType.PROCESS ships the writer to a subprocess) -------
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_pool_lock"] = None
        state["_unclaimed_lease"] = None
        state["last_failure"] = None
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

    def _fs(self) -> FileSystem:
        return _uri.filesystem(self._location().address)

    def _step(self, operation: str, path: str) -> Any:
        """Label a failure of this storage step (see :mod:`tectofs.torch._failures`)."""
        return step(self.rank, operation, path, self._loc.address if self._loc else None, record=self)

    # -- StorageWriter --------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        self._claim_lease()
        self.abandon()  # a previous save through this writer failed and was not cleaned up
        if checkpoint_id:
            self._loc = _uri.parse(checkpoint_id)
        self.save_id = uuid.uuid4().hex
        self._plan_data = None
        self.last_failure = None
        self._phases = {} if self._staged_s is None else {"stage": self._staged_s}
        self._staged_s = None
        self._saved_bytes = 0

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
        with self._step("create checkpoint", self._loc.path if self._loc else "(no checkpoint_id)"):
            return self._prepare_global_plan(plans)

    def _prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        loc = self._location()
        fs = self._fs()
        with self._step("stat", loc.path):
            exists = not self.overwrite and self._nonempty(fs, loc.path)
        if exists:
            raise errors.AlreadyExists(
                f"checkpoint {loc.uri()} already exists; use another path or CheckpointWriter(..., overwrite=True)"
            )
        token = f"{uuid.uuid4().hex[:16]}"
        pending = _uri.Location(loc.address, loc.parent).child(pending_name(loc.name, token)).path
        with self._step("create directory", loc.parent):
            fs.mkdir(loc.parent, parents=True, exist_ok=True)
        with self._step("create directory", pending):
            fs.mkdir(pending)
        self._pending_owned = pending
        compress = self.compress if self.compress is not None else directory_compresses(fs, loc.parent)
        block_size, previous = 0, None
        if self.incremental:
            compress, block_size = False, fs.stat(pending).block_size
            previous = _incremental.previous_checkpoint(fs, loc.parent, loc.name)
        return [
            dataclasses.replace(plan, storage_data=_PlanData(prefix=f"__{i}_", pending=pending, token=token,
                                                             compress=compress, block_size=block_size,
                                                             previous=previous))
            for i, plan in enumerate(plans)
        ]

    @staticmethod
    def _nonempty(fs: FileSystem, path: str) -> bool:
        try:
            st = fs.stat(path)
        except FileNotFoundError:
            return False
        return st.kind != "dir" or bool(fs.listdir(path))

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut: Future[list[WriteResult]] = Future()
        try:
            with self._step("write checkpoint", self._loc.path if self._loc else "(no checkpoint_id)"), \
                    _timing.timed(self._phases, "upload"):
                results = self._write_all(plan, planner)
            self._saved_bytes = sum(r.size_in_bytes for r in results)
            if not self.is_coordinator:  # its part of the save is over (the coordinator's ends in finish)
                _timing.saved(self.checkpoint_id, self.rank, self._phases, self._saved_bytes)
            fut.set_result(results)
        except BaseException as exc:  # surfaces through DCP on every rank
            fut.set_exception(exc)  # type: ignore[arg-type]  # torch's Future stub types it as the result
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
        self.referenced_bytes = 0
        self._previous_items = _incremental.previous_items(fs, data.previous) if data.previous else {}
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
        self, fs: FileSystem, pending: str, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        with self._step("write file", f"{pending}/{name}"):
            if self._plan_data is not None and self._plan_data.block_size:
                return self._write_items_incremental(fs, f"{pending}/{name}", name, items, planner)
            return self._write_items(fs, f"{pending}/{name}", name, items, planner)

    def _write_items_incremental(
        self, fs: FileSystem, path: str, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        """``_write_items`` for an incremental checkpoint (``_incremental``): tensors of
        ``ALIGN_MIN_BYTES`` or more each from a block boundary, only their pieces that differ
        from the previous checkpoint's written, the others referenced; then the rest packed."""
        data = self._plan_data
        assert data is not None and data.block_size
        bs, previous_dir = data.block_size, data.previous
        big = [i for i in items if i.type != WriteItemType.BYTE_IO and _item_nbytes(i) >= _incremental.ALIGN_MIN_BYTES]
        rest = sorted((i for i in items if not any(i is b for b in big)), key=lambda it: it.type != WriteItemType.BYTE_IO)
        references = _incremental.References(fs, path, bs)
        results: list[WriteResult] = []
        offset = end = 0

        def write(item: WriteItem, prepared: _Item, checksum: cf.Future[int], hashed: cf.Future[list[bytes]] | None) -> None:
            nonlocal offset, end
            n, pieces = prepared.view.nbytes, hashed.result() if hashed is not None else None
            references.write(raw, name, offset, prepared.view, pieces, self._previous_items.get(item.index), previous_dir)
            info = _ItemInfo(name, offset, n, checksum.result(), prepared.fmt, prepared.dtype, prepared.shape, pieces)
            results.append(WriteResult(index=item.index, size_in_bytes=n, storage_data=info))
            end, offset = offset + n, _incremental.aligned(offset + n, bs)

        with fs.open(path, "wb", buffering=0) as raw:
            # Items are hashed on a pool, up to _COMPRESS_AHEAD_BYTES ahead of the upload.
            ahead: collections.deque[tuple[WriteItem, _Item, cf.Future[int], cf.Future[list[bytes]] | None]]
            ahead, ahead_bytes = collections.deque(), 0
            try:
                for item in big:
                    prepared = self._prepare_item(item, planner)
                    hashing = (_pool("digest", 2).submit(_incremental.digests, prepared.view, bs)
                               if prepared.fmt == "raw" else None)
                    ahead.append((item, prepared, _pool("crc", 2).submit(crc, prepared.view), hashing))
                    ahead_bytes += prepared.view.nbytes
                    while ahead and (ahead_bytes > _COMPRESS_AHEAD_BYTES or _done(ahead[0][3])):
                        ahead_bytes -= ahead[0][1].view.nbytes
                        write(*ahead.popleft())
                while ahead:
                    write(*ahead.popleft())
            finally:  # (after a failure: the pools still read the caller's tensors)
                cf.wait([f for _, _, c, h in ahead for f in (c, h) if f is not None])  # type: ignore[misc]
            out = _ItemWriter(raw, name, _WRITE_BATCH_BYTES, _WRITE_BATCH_TEMPORARY_BYTES)
            out.offset = offset
            for item in rest:
                out.add(self._prepare_item(item, planner))
            out.flush()
        references.apply(out.offset if rest else end)
        with self._pool_lock:
            self.referenced_bytes += references.referenced_bytes
        return results + out.results

    def _write_items(
        self, fs: FileSystem, path: str, name: str, items: list[WriteItem], planner: SavePlanner
    ) -> list[WriteResult]:
        """Write ``items`` into the new file ``path`` (``name`` in the checkpoint), each
        recorded with its offset, length, format and crc32c."""
        compress = self._plan_data is not None and self._plan_data.compress
        # Small objects first, then tensors (like FileSystemWriter): cheap items never wait.
        items = sorted(items, key=lambda it: it.type != WriteItemType.BYTE_IO)
        with fs.open(path, "wb", buffering=0) as raw:
            out = _ItemWriter(raw, name, _WRITE_BATCH_BYTES, _WRITE_BATCH_TEMPORARY_BYTES)
            # Compression runs on a pool, up to _COMPRESS_AHEAD_BYTES ahead of the upload;
            # items are written in their order all the same.
            ahead: collections.deque[tuple[_Item, cf.Future[Any] | None]] = collections.deque()
            ahead_bytes = 0
            try:
                for item in items:
                    prepared = self._prepare_item(item, planner)
                    job = None
                    if compress and prepared.fmt == "raw" and prepared.dtype and prepared.view.nbytes:
                        job = _pool("codec", os.cpu_count() or 1).submit(tensor_codec.encode, prepared.view, prepared.dtype)
                        ahead_bytes += prepared.view.nbytes
                    ahead.append((prepared, job))
                    while ahead and (ahead_bytes > _COMPRESS_AHEAD_BYTES or ahead[0][1] is None or ahead[0][1].done()):
                        ahead_bytes -= _add_compressed(out, *ahead.popleft())
                while ahead:
                    ahead_bytes -= _add_compressed(out, *ahead.popleft())
            finally:  # (after a failure: the jobs still read the caller's tensors)
                cf.wait([job for _, job in ahead if job is not None])
            out.flush()
        return out.results

    @staticmethod
    def _prepare_item(item: WriteItem, planner: SavePlanner) -> _Item:
        """The item's bytes: a tensor's own (``raw``), a pickle of it (``torch``) or DCP's
        ``bytes``."""
        data = planner.resolve_data(item)
        if item.type == WriteItemType.BYTE_IO:
            if not isinstance(data, io.BytesIO):
                raise errors.CheckpointError(f"item {_describe(item.index)}: expected BytesIO, got {type(data)}")
            return _Item(item.index, data.getbuffer(), "bytes", None, None, temporary=True)
        tensor = cast(torch.Tensor, data).detach()
        temporary = True
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        else:  # (``_raw_view`` copies these too)
            temporary = not tensor.is_contiguous() or tensor.is_conj() or tensor.is_neg()
        if tensor.layout != torch.strided:
            raise errors.CheckpointError(
                f"item {_describe(item.index)}: {tensor.layout} tensors cannot be checkpointed "
                "through DCP (its load planner narrows them into copies); save them dense"
            )
        view = _raw_view(tensor)
        if view is not None:
            return _Item(item.index, view, "raw", _dtype_name(tensor.dtype), tuple(tensor.shape), temporary)
        buf = io.BytesIO()
        torch.save(_minimal(tensor), buf)
        return _Item(item.index, buf.getbuffer(), "torch", None, None, temporary=True)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        with self._step("commit checkpoint", self._loc.path if self._loc else "(no checkpoint_id)"), \
                _timing.timed(self._phases, "commit"):
            self._finish(metadata, results)
        _timing.saved(self.checkpoint_id, self.rank, self._phases, self._saved_bytes)

    def _finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        loc = self._location()
        data = self._plan_data
        if data is None:
            raise errors.CheckpointError("finish() called before write_data()")
        fs = self._fs()
        self._complete_metadata(metadata, results)
        with self._step("write file", f"{data.pending}/{METADATA_NAME}"):
            fs.write_bytes(f"{data.pending}/{METADATA_NAME}", pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL))
        with self._step("commit (rename onto)", loc.path):
            self._commit(fs, data.pending, loc, data.token)
        self._pending_owned = None
        self._collect_leftovers(loc)

    def _complete_metadata(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        storage_md = {}
        for per_rank in results:
            for wr in per_rank:
                storage_md[wr.index] = wr.storage_data
        metadata.storage_data = storage_md
        metadata.storage_meta = self.storage_meta()
        if metadata.version is None:
            from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION

            metadata.version = CURRENT_DCP_VERSION

    def abandon(self) -> bool:
        """After a failed save: delete this coordinator's pending directory (best effort;
        anything left is collected later by :func:`tectofs.torch.gc_pending`). Call it only
        once every rank is done writing (DCP raises a save's failure on all ranks after its
        collective, so the ``dcp.save`` wrapper of :mod:`tectofs.torch._hook` can).
        Returns whether a directory was deleted."""
        pending, self._pending_owned = self._pending_owned, None
        if pending is None or self._loc is None:
            return False
        try:
            self._fs().rmtree(pending)
        except FileNotFoundError:
            return False
        except Exception as exc:
            warnings.warn(f"tectofs: could not delete the pending directory {self._loc.uri(pending)} of a failed "
                          f"save ({exc}); `tectofs gc` removes it later", stacklevel=2)
            return False
        return True

    def _collect_leftovers(self, loc: _uri.Location) -> list[str]:
        """Best effort: delete stale leftovers of interrupted saves next to ``loc``."""
        if self.pending_grace_s is None:
            return []
        parent = _uri.Location(loc.address, loc.parent).uri()
        try:
            return gc_pending(parent, older_than_s=self.pending_grace_s)
        except Exception as exc:  # never fails a save that is already committed
            warnings.warn(f"tectofs: could not clean up leftovers of interrupted saves in {parent}: {exc}",
                          stacklevel=2)
            return []

    def _commit(self, fs: FileSystem, pending: str, loc: _uri.Location, token: str) -> None:
        final = loc.path
        try:
            fs.rename(pending, final)  # atomic; replaces nothing or an empty directory
            return
        except (FileExistsError, errors.DirectoryNotEmpty, NotADirectoryError, IsADirectoryError) as exc:
            if not self.overwrite:
                self._pending_owned = None  # kept on purpose: the message below points at it
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

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | cf.Future[dict[str, Any]]:
        """Copy ``state_dict`` into this writer's reusable staging buffers: blocking, or with
        ``async_staging`` on a background thread (a future of the staged copy; DCP's
        upload thread waits for it).

        Waits first for the previous ``async_save`` through this writer to finish: one
        staged checkpoint in flight per writer, so memory stays bounded and DCP's
        collectives of two saves never interleave."""
        started = time.perf_counter()
        if not self.async_staging:
            staged, lease = self._staging_pool().stage(state_dict, timeout=self.staging_timeout_s)
            return self._keep_staged(staged, lease, time.perf_counter() - started)
        staging = self._staging_pool().stage_beside(state_dict, timeout=self.staging_timeout_s)
        out: cf.Future[dict[str, Any]] = cf.Future()

        def hand_over(done: cf.Future[tuple[StagedStateDict, Lease]]) -> None:
            try:
                out.set_result(self._keep_staged(*done.result(), time.perf_counter() - started))
            except BaseException as exc:
                out.set_exception(exc)

        staging.add_done_callback(hand_over)
        return out

    def _keep_staged(self, staged: StagedStateDict, lease: Lease, seconds: float) -> dict[str, Any]:
        """Hand ``lease`` to the upload that follows (it claims it) and keep the copy's time."""
        self._staged_s = seconds
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
