"""Load fan-out: with ``CheckpointReader(share_metadata=...)`` the checkpoint's ``.metadata``
is read from storage by one rank and broadcast to the others (three gloo ranks on
loopback); a failure to read it reaches every rank instead of leaving them waiting."""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import tectofs.torch as tt  # noqa: E402
from tectofs import errors  # noqa: E402
from tests.rendezvous import leave, rendezvous  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

WORLD = 3


class _CountingReader(tt.CheckpointReader):
    """Counts the reads of ``.metadata`` from storage on this rank."""

    fetches = 0

    def _fetch_metadata(self, loc: Any) -> bytes:
        self.fetches += 1
        return super()._fetch_metadata(loc)


class _Interrupted(tt.CheckpointReader):
    def _fetch_metadata(self, loc: Any) -> bytes:
        raise KeyboardInterrupt


def _state(fill: float | None = None) -> dict[str, Any]:
    torch.manual_seed(7)
    state = {f"layer{i}.weight": torch.randn(16, 8) for i in range(40)}
    if fill is not None:
        state = {k: torch.full_like(v, fill) for k, v in state.items()}
    return state


def _worker(rank: int, rendezvous: str, uri: str, missing: str) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    warnings.simplefilter("ignore")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=30))
    try:
        expected = _state()
        for share, reads in ((True, 1 if rank == 0 else 0), (False, 1)):
            reader = _CountingReader(uri, share_metadata=share)
            state = _state(fill=-1.0)
            dcp.load(state, storage_reader=reader)
            assert all(torch.equal(state[k], expected[k]) for k in expected), f"rank {rank}: wrong data (share={share})"
            assert reader.fetches == reads, f"rank {rank}, share={share}: {reader.fetches} reads of .metadata"
        # A checkpoint that is not there: every rank gets the same error, none waits.
        reader = _CountingReader(missing, share_metadata=dist.group.WORLD)
        try:
            reader.read_metadata()
        except errors.NotFound as exc:
            assert "no complete checkpoint" in str(exc), exc
            label = getattr(exc, "tectofs_where", "") or ""
            assert label.startswith("rank 0: read file"), label
        else:
            raise AssertionError(f"rank {rank}: a missing checkpoint's metadata was read")
        assert reader.fetches == (1 if rank == 0 else 0)
        # Through dcp.load, which reports a read_metadata failure only as text: every rank's
        # CheckpointFailed still starts with rank 0's cause.
        try:
            dcp.load(_state(fill=0.0), storage_reader=_CountingReader(missing, share_metadata=True))
        except tt.CheckpointFailed as exc:
            assert str(exc).startswith("rank 0: read file") and "NotFound" in str(exc), str(exc)[:300]
        else:
            raise AssertionError("a load of a missing checkpoint succeeded")
        # Anything rank 0 raises, even KeyboardInterrupt, still reaches the others.
        try:
            _Interrupted(uri, share_metadata=True).metadata_bytes()
        except KeyboardInterrupt:
            assert rank == 0
        except errors.TectofsError as exc:
            assert rank != 0 and "KeyboardInterrupt" in str(exc), exc
        dist.barrier()  # every rank got here: nobody was left in a broadcast
    finally:
        dist.destroy_process_group()
    leave()


def test_metadata_is_read_once_and_broadcast_to_every_rank(cluster: Any, tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    uri = f"tectofs://{cluster.address}/share-metadata/{os.getpid()}/step_1"
    dcp.save(_state(), storage_writer=tt.CheckpointWriter(uri))
    missing = f"tectofs://{cluster.address}/share-metadata/{os.getpid()}/step_2"
    mp.spawn(_worker, args=(rendezvous(tmp_path), uri, missing), nprocs=WORLD, join=True)


def test_sharing_is_off_without_a_process_group_or_when_asked() -> None:
    from tectofs.torch import _share

    assert not dist.is_initialized()
    assert _share.group_of(True) is None  # no torch.distributed: read directly
    assert _share.group_of(False) is None and _share.group_of(None) is None
    with pytest.raises(errors.InvalidArgument, match="ProcessGroup"):
        _share.group_of(1)
