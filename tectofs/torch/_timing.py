"""Per-checkpoint timings: each save and load of this rank is recorded in the process's
:class:`tectofs.metrics.CheckpointMetrics` and logged as one INFO line (logger
``tectofs.torch``) of ``key=value`` pairs::

    checkpoint saved uri=tectofs://10.0.0.1:7420/runs/a/step_100 rank=0 bytes=1073741824 stage_s=0.412 upload_s=3.107 commit_s=0.021
    checkpoint loaded uri=tectofs://10.0.0.1:7420/runs/a/step_100 rank=0 bytes=1073741824 read_s=2.310 verify_s=0.388
    checkpoint async_save uri=tectofs://10.0.0.1:7420/runs/a/step_200 rank=0 blocking_s=0.415 background_s=3.140
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterator

from .. import metrics

log = logging.getLogger("tectofs.torch")


@contextlib.contextmanager
def timed(phases: dict[str, float], phase: str) -> Iterator[None]:
    """Add the time the block took (if it did not raise) to ``phases[phase]``."""
    started = time.perf_counter()
    yield
    phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - started


def _line(event: str, uri: str | None, rank: int, values: dict[str, Any]) -> str:
    pairs = " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())
    return f"checkpoint {event} uri={uri} rank={rank} {pairs}"


def saved(uri: str | None, rank: int, phases: dict[str, float], nbytes: int) -> None:
    """This rank's part of a save is over (its upload; the coordinator's commit too)."""
    metrics.checkpoint_metrics().saved(phases, nbytes, time.time())
    log.info("%s", _line("saved", uri, rank, {"bytes": nbytes, **{f"{p}_s": s for p, s in phases.items()}}))


def loaded(uri: str | None, rank: int, phases: dict[str, float], nbytes: int) -> None:
    metrics.checkpoint_metrics().loaded(phases, nbytes)
    log.info("%s", _line("loaded", uri, rank, {"bytes": nbytes, **{f"{p}_s": s for p, s in phases.items()}}))


def track_async_save(result: Any, started: float, writer: Any) -> None:
    """``dcp.async_save`` through ``writer`` (a ``CheckpointWriter``) returned ``result`` (a
    future, or a response holding the upload's future) after blocking its caller since
    ``started`` (``time.perf_counter``): record that, and the background upload once its
    future is done (failed or not)."""
    returned = time.perf_counter()
    blocking = returned - started
    checkpoint = metrics.checkpoint_metrics()
    checkpoint.async_saved("blocking", blocking)
    upload = getattr(result, "upload_completion", result)
    if not hasattr(upload, "add_done_callback"):
        return

    def done(_: Any) -> None:
        background = time.perf_counter() - returned
        checkpoint.async_saved("background", background)
        values = {"blocking_s": blocking, "background_s": background}
        log.info("%s", _line("async_save", writer.checkpoint_id, writer.rank, values))

    upload.add_done_callback(done)
