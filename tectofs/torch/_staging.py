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
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Iterator

import numpy as np
import torch

from .. import errors, limits

_PRIMITIVES = (int, float, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size)
# Large CPU tensors are copied in slices that the staging thread and one helper thread take in
# turn (``_copy_into``); the rest with ``copy_`` on the staging thread.
_SLICE_BYTES = 32 << 20
_SLICED_MIN_BYTES = 4 << 20


class StagedStateDict(dict):
    """A plain ``dict`` that can be weakly referenced (so its lease ends with it)."""

    __slots__ = ("__weakref__",)


class Lease:
    """A staged checkpoint's hold on its pool buffers (see the module docstring)."""

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
        self._lease: Lease | None = None
        self.allocated_bytes = 0  # bytes of buffers allocated by the pool over its life
        self.reused_bytes = 0  # bytes served from kept buffers
        self._helper: tuple[int, ThreadPoolExecutor] | None = None  # (pid, the copying helper thread)
        self._stage_thread: tuple[int, ThreadPoolExecutor] | None = None  # (pid, stage_beside's thread)

    def _copy_helper(self) -> ThreadPoolExecutor:
        """The pool's helper thread for copies (made again in a forked child: threads do not
        survive a fork)."""
        if self._helper is None or self._helper[0] != os.getpid():
            self._helper = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="tectofs-stage"))
        return self._helper[1]

    # -- leases -----------------------------------------------------------------------
    def _acquire(self, sizes: list[int], timeout: float | None) -> Lease:
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
            lease = Lease(buffers, total)
            self._lease = lease
            return lease

    def _release_locked(self, lease: Lease) -> None:
        if lease.released:
            return
        lease.released = True
        for buf in lease.buffers:
            self._free.setdefault(buf.numel(), []).append(buf)
        lease.buffers = []
        if self._lease is lease:
            self._lease = None
        self._cond.notify_all()

    def release(self, lease: Lease) -> None:
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
        if self._stage_thread is not None:
            self._stage_thread[1].shutdown(wait=False)
            self._stage_thread = None
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
    def stage(self, state_dict: dict[str, Any], timeout: float | None = None) -> tuple[StagedStateDict, Lease]:
        """Copy ``state_dict`` into pool buffers; returns the staged copy and its lease.

        Blocks first until the previous staged checkpoint of this pool is uploaded."""
        sources = _sources(state_dict)
        return self._stage(state_dict, sources, timeout, self._copy_helper())

    def stage_beside(self, state_dict: dict[str, Any], timeout: float | None = None) -> Future[tuple[StagedStateDict, Lease]]:
        """Start staging ``state_dict`` on the pool's staging thread and return at once.

        The caller's thread only takes a snapshot of the structure (containers and
        non-tensor values are copied now; tensors are referenced, with their in-place
        version counters). The wait for the previous upload and the copies run on one
        background thread (not two: the training step owns the other cores meanwhile).
        Until the returned future is done the caller must not modify the tensors in place:
        every ``torch.optim`` optimizer's ``step()`` waits for it by itself (a global step
        pre-hook, at most ``timeout``); anything else (a forward pass updating BatchNorm
        statistics, a manual ``add_``) must wait for the future first. A tensor modified in
        place before its copy is finished fails the staging (``CheckpointError``): the copy
        would not be the state at the call."""
        sources = _sources(state_dict)
        versions = [t._version for t in sources]
        identity: dict[int, torch.Tensor] = {id(t): t for t in sources}
        skeleton = _walk(state_dict, None, identity)  # private tensors (sparse, empty...) are copied here
        for t in list(identity.values()):
            identity.setdefault(id(t), t)
        _ensure_optimizer_hook()
        future = self._stager().submit(self._stage_checked, skeleton, sources, versions, timeout, identity)
        with _in_flight_lock:
            _in_flight.add(future)
        future.add_done_callback(_forget_in_flight)
        return future

    @torch.no_grad()
    def _stage_checked(self, skeleton: dict[str, Any], sources: list[torch.Tensor], versions: list[int],
                       timeout: float | None, private: dict[int, torch.Tensor]) -> tuple[StagedStateDict, Lease]:
        staged, lease = self._stage(skeleton, sources, timeout, None, private)
        changed = [t for t, v in zip(sources, versions) if t._version != v]
        if changed:
            self.release(lease)
            t = changed[0]
            raise errors.CheckpointError(
                f"{len(changed)} tensor(s) (the first {tuple(t.shape)} {t.dtype}) were modified in place while "
                "async_save was staging them, so the checkpoint would not be the state it was called with: "
                "wait for the staging (AsyncSaveResponse.staging_completion.result()) before changing the state "
                "outside an optimizer step")
        return staged, lease

    def _stage(self, state_dict: dict[str, Any], sources: list[torch.Tensor], timeout: float | None,
               helper: ThreadPoolExecutor | None, private: dict[int, torch.Tensor] | None = None,
               ) -> tuple[StagedStateDict, Lease]:
        lease = self._acquire([_nbytes(t) for t in sources], timeout)
        try:
            memo: dict[int, torch.Tensor] = dict(private or {})
            pairs = []
            for src, buf in zip(sources, lease.buffers):
                dst = buf.view(src.dtype).view(src.shape)
                pairs.append((src.detach(), dst))
                memo[id(src)] = dst
            _copy_into(pairs, helper)
            staged = _walk(state_dict, None, memo)
        except BaseException:
            self.release(lease)
            raise
        out = StagedStateDict(staged)
        weakref.finalize(out, _release_weak, weakref.ref(self), weakref.ref(lease))
        return out, lease

    def _stager(self) -> ThreadPoolExecutor:
        """The thread that runs :meth:`stage_beside` (made again in a forked child)."""
        if self._stage_thread is None or self._stage_thread[0] != os.getpid():
            self._stage_thread = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="tectofs-stage-beside"))
        return self._stage_thread[1]


def _sources(state_dict: dict[str, Any]) -> list[torch.Tensor]:
    """The plain local tensors of ``state_dict`` that go into pool buffers, each once."""
    sources: list[torch.Tensor] = []
    seen: set[int] = set()

    def collect(t: torch.Tensor) -> None:
        if _poolable(t) and id(t) not in seen:
            seen.add(id(t))
            sources.append(t)

    _walk(state_dict, collect, None)
    return sources


# Stagings running beside the training step (StagingPool.stage_beside), process-wide: every
# optimizer's step() waits for them first (the optimizer mutates parameters in place).
_in_flight: set[Future[Any]] = set()
_in_flight_lock = threading.Lock()
_hook_installed = False


def _forget_in_flight(future: Future[Any]) -> None:
    with _in_flight_lock:
        _in_flight.discard(future)


def _ensure_optimizer_hook() -> None:
    """Install (once per process) the optimizer step pre-hook that waits for stagings."""
    global _hook_installed
    with _in_flight_lock:
        if _hook_installed:
            return
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        register_optimizer_step_pre_hook(_before_optimizer_step)
        _hook_installed = True


def _before_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Before any ``optimizer.step()``: wait for the stagings in flight (at most
    ``limits.staging_timeout_s``; past it the step goes on and the staging, if the step
    touches a tensor it has not copied yet, fails rather than save a torn tensor)."""
    with _in_flight_lock:
        pending = [f for f in _in_flight if not f.done()]
    if pending:
        wait(pending, timeout=limits.staging_timeout_s)


def _copy_into(pairs: list[tuple[torch.Tensor, torch.Tensor]], helper: ThreadPoolExecutor | None) -> None:
    """Copy each source into its destination. Contiguous CPU tensors of ``_SLICED_MIN_BYTES`` or
    more go in ``_SLICE_BYTES`` slices of plain memory copies (numpy's: no GIL, no OpenMP), taken
    in turn by this thread and ``helper``: when the other core is busy, whichever thread runs
    takes the next slice (torch's own ``copy_`` splits a tensor in fixed halves and waits for the
    slower). Everything else is copied with ``copy_`` here meanwhile. No ``helper``: all on this thread. Returns once every byte is
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

    helping: Future[None] | None = helper.submit(take_slices) if helper is not None and len(sliced) > 1 else None
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
