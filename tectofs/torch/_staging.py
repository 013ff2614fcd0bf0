"""Staging for ``dcp.async_save``: copy a state dict into reusable CPU buffers.

The training step blocks only while tensors are copied into staging buffers; the upload
then runs on DCP's background thread from the staged copy. Buffers belong to a
:class:`StagingPool`:

* **reused**: a buffer is kept after its checkpoint is uploaded and handed to the next
  checkpoint that needs a buffer of exactly that size (a training loop saves the same
  shapes every time, so steady state allocates nothing);
* **bounded**: at most one staged checkpoint per pool is in flight. A second ``stage()``
  waits until the previous upload is over, and free buffers that the new state dict does
  not need are dropped, so a pool never holds more than one state dict's worth of bytes
  (and never more than ``max_bytes`` when that is set: a bigger state dict is refused).

A *lease* ties a staged checkpoint to its buffers. It ends when the thread that uploads
it (DCP's async executor thread, which "claims" the lease on its first call into the
writer) has exited, when the staged dict is garbage collected, or explicitly.
"""

from __future__ import annotations

import copy
import io
import os
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

import numpy as np
import torch

_PRIMITIVES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
# Large CPU tensors are copied in slices that the staging thread and one helper thread take in
# turn (``_copy_into``); the rest with ``copy_`` on the staging thread.
_SLICE_BYTES = 32 << 20
_SLICED_MIN_BYTES = 4 << 20


class StagedStateDict(dict):
    """A plain ``dict`` that can be weakly referenced (so its lease ends with it)."""

    __slots__ = ("__weakref__",)


class _Lease:
    __slots__ = ("buffers", "nbytes", "stage_thread", "owner", "released", "__weakref__")

    def __init__(self, buffers: list[torch.Tensor], nbytes: int) -> None:
        self.buffers = buffers
        self.nbytes = nbytes
        self.stage_thread = threading.current_thread()
        self.owner: threading.Thread | None = None
        self.released = False

    def expired(self) -> bool:
        return self.released or (self.owner is not None and not self.owner.is_alive())


def _poolable(t: torch.Tensor) -> bool:
    return (
        type(t) is torch.Tensor or type(t) is torch.nn.Parameter
    ) and t.layout == torch.strided and not t.is_quantized and not t.is_nested and t.numel() > 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class StagingPool:
    """Reusable, bounded CPU staging buffers; one staged checkpoint in flight at a time."""

    def __init__(self, max_bytes: int | None = None, poll_s: float = 0.02) -> None:
        self.max_bytes = max_bytes
        self._poll_s = poll_s
        self._cond = threading.Condition()
        self._free: dict[int, list[torch.Tensor]] = {}
        self._lease: _Lease | None = None
        self.allocated_bytes = 0  # bytes of buffers allocated by the pool over its life
        self.reused_bytes = 0  # bytes served from kept buffers
        self._helper: tuple[int, ThreadPoolExecutor] | None = None  # (pid, the copying helper thread)

    def _copy_helper(self) -> ThreadPoolExecutor:
        """The pool's helper thread for copies (made again in a forked child: threads do not
        survive a fork)."""
        if self._helper is None or self._helper[0] != os.getpid():
            self._helper = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="tectofs-stage"))
        return self._helper[1]

    # -- leases -----------------------------------------------------------------------
    def _acquire(self, sizes: list[int], timeout: float | None) -> _Lease:
        total = sum(sizes)
        if self.max_bytes is not None and total > self.max_bytes:
            raise ValueError(
                f"state dict needs {total} bytes of staging buffers, more than the "
                f"staging budget of {self.max_bytes} bytes (staging_max_bytes)"
            )
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._lease is not None and not self._lease.expired():
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError("previous checkpoint still uploading; staging buffers busy")
                self._cond.wait(self._poll_s)
            if self._lease is not None:
                self._release_locked(self._lease)
            wanted: dict[int, int] = {}
            for n in sizes:
                wanted[n] = wanted.get(n, 0) + 1
            # Keep only free buffers this request will use: memory stays <= one state dict.
            for n in list(self._free):
                keep = wanted.get(n, 0)
                del self._free[n][keep:]
                if not self._free[n]:
                    del self._free[n]
            buffers = []
            for n in sizes:
                stack = self._free.get(n)
                if stack:
                    buffers.append(stack.pop())
                    self.reused_bytes += n
                else:
                    buffers.append(torch.empty(n, dtype=torch.uint8))
                    self.allocated_bytes += n
            self._free.clear()
            lease = _Lease(buffers, total)
            self._lease = lease
            return lease

    def _release_locked(self, lease: _Lease) -> None:
        if lease.released:
            return
        lease.released = True
        for buf in lease.buffers:
            self._free.setdefault(buf.numel(), []).append(buf)
        lease.buffers = []
        if self._lease is lease:
            self._lease = None
        self._cond.notify_all()

    def release(self, lease: _Lease) -> None:
        with self._cond:
            self._release_locked(lease)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no staged checkpoint is in flight; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._lease is not None and not self._lease.expired():
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                self._cond.wait(self._poll_s)
            return True

    def close(self) -> None:
        if self._helper is not None:
            self._helper[1].shutdown(wait=False)
            self._helper = None
        with self._cond:
            self._free.clear()
            if self._lease is not None:
                self._lease.buffers = []
                self._lease.released = True
                self._lease = None
            self._cond.notify_all()

    @property
    def held_bytes(self) -> int:
        with self._cond:
            free = sum(n * len(v) for n, v in self._free.items())
            return free + (self._lease.nbytes if self._lease is not None and not self._lease.released else 0)

    # -- staging ----------------------------------------------------------------------
    @torch.no_grad()
    def stage(self, state_dict: dict[str, Any], timeout: float | None = None) -> tuple[StagedStateDict, _Lease]:
        """Copy ``state_dict`` into pool buffers; returns the staged copy and its lease.

        Blocks first until the previous staged checkpoint of this pool is uploaded."""
        sources: list[torch.Tensor] = []
        seen: set[int] = set()

        def collect(t: torch.Tensor) -> None:
            if _poolable(t) and id(t) not in seen:
                seen.add(id(t))
                sources.append(t)

        _walk(state_dict, collect, None)
        lease = self._acquire([_nbytes(t) for t in sources], timeout)
        try:
            memo: dict[int, torch.Tensor] = {}
            pairs = []
            for src, buf in zip(sources, lease.buffers):
                dst = buf.view(src.dtype).view(src.shape)
                pairs.append((src.detach(), dst))
                memo[id(src)] = dst
            _copy_into(pairs, self._copy_helper())
            staged = _walk(state_dict, None, memo)
        except BaseException:
            self.release(lease)
            raise
        out = StagedStateDict(staged)
        weakref.finalize(out, _release_weak, weakref.ref(self), weakref.ref(lease))
        return out, lease


def _copy_into(pairs: list[tuple[torch.Tensor, torch.Tensor]], helper: ThreadPoolExecutor) -> None:
    """Copy each source into its destination. Contiguous CPU tensors of ``_SLICED_MIN_BYTES`` or
    more go in ``_SLICE_BYTES`` slices of plain memory copies (numpy's: no GIL, no OpenMP), taken
    in turn by this thread and ``helper``: when the other core is busy, whichever thread runs
    takes the next slice (torch's own ``copy_`` splits a tensor in fixed halves and waits for the
    slower). Everything else is copied with ``copy_`` here meanwhile. Returns once every byte is
    copied; raises once the helper stopped: it never writes into a buffer after this returns."""
    sliced: list[tuple[np.ndarray, np.ndarray]] = []
    rest: list[tuple[torch.Tensor, torch.Tensor]] = []
    for src, dst in pairs:
        if (src.device.type == "cpu" and src.is_contiguous() and dst.is_contiguous()
                and _nbytes(src) >= _SLICED_MIN_BYTES and not src.is_conj() and not src.is_neg()):
            s8, d8 = src.reshape(-1).view(torch.uint8).numpy(), dst.reshape(-1).view(torch.uint8).numpy()
            sliced += [(d8[i : i + _SLICE_BYTES], s8[i : i + _SLICE_BYTES]) for i in range(0, len(s8), _SLICE_BYTES)]
        else:
            rest.append((src, dst))
    todo: Iterator[tuple[np.ndarray, np.ndarray]] = iter(sliced)
    lock = threading.Lock()
    stop = threading.Event()

    def take_slices() -> None:
        while not stop.is_set():
            with lock:
                job = next(todo, None)
            if job is None:
                return
            np.copyto(job[0], job[1])

    helping: Future[None] | None = helper.submit(take_slices) if len(sliced) > 1 else None
    try:
        for src, dst in rest:
            dst.copy_(src)
        take_slices()
    except BaseException:
        stop.set()
        raise
    finally:
        if helping is not None:
            helping.result()


def _release_weak(pool_ref: Any, lease_ref: Any) -> None:
    pool, lease = pool_ref(), lease_ref()
    if pool is not None and lease is not None:
        pool.release(lease)


def _stage_tensor(t: torch.Tensor, memo: dict[int, torch.Tensor]) -> torch.Tensor:
    staged = memo.get(id(t))
    if staged is not None:
        return staged
    if t.numel() == 0 and t.layout == torch.strided and not t.is_quantized:
        staged = torch.empty(t.shape, dtype=t.dtype)
    else:  # sparse, quantized, nested, subclasses: a private copy, not pooled
        staged = t.detach().to("cpu", copy=True)
    memo[id(t)] = staged
    return staged


def _walk(obj: Any, collect: Any, memo: dict[int, torch.Tensor] | None) -> Any:
    """Traverse a state dict. With ``collect``: call it on every plain local tensor.
    With ``memo``: return a copy where every tensor is replaced by its staged copy."""
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed.tensor import DTensor

    def walk(o: Any) -> Any:
        if isinstance(o, DTensor):
            if collect is not None:
                collect(o._local_tensor)
                return None
            assert memo is not None  # no collect: a memo
            local = _stage_tensor(o._local_tensor, memo)
            return DTensor(local, o._spec, requires_grad=False)
        if isinstance(o, ShardedTensor):
            on_cpu = all(s.tensor.device.type == "cpu" for s in o.local_shards())
            if collect is not None:
                if on_cpu:
                    for s in o.local_shards():
                        collect(s.tensor)
                return None
            if not on_cpu:
                return o.cpu()
            assert memo is not None
            shards = [Shard(_stage_tensor(s.tensor, memo), s.metadata) for s in o.local_shards()]
            return ShardedTensor._init_from_local_shards_and_global_metadata(
                shards, o.metadata(), process_group=o._process_group, init_rrefs=False
            )
        if isinstance(o, torch.Tensor):
            if collect is not None:
                collect(o)
                return None
            assert memo is not None
            return _stage_tensor(o, memo)
        if isinstance(o, _PRIMITIVES):
            return o
        if isinstance(o, io.BytesIO):
            return None if collect is not None else io.BytesIO(o.getvalue())
        if type(o) in (dict, OrderedDict, StagedStateDict):
            items = [(k, walk(v)) for k, v in o.items()]
            return None if collect is not None else (OrderedDict(items) if type(o) is OrderedDict else dict(items))
        if type(o) in (list, tuple):
            items = [walk(v) for v in o]
            return None if collect is not None else type(o)(items)
        # Anything else (user objects, namedtuples...): DCP pickles it; snapshot it now.
        return None if collect is not None else copy.deepcopy(o)

    return walk(obj)
