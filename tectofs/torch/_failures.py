"""A tectofs failure inside DCP, told cause first.

DCP collects each rank's exception and raises ``CheckpointException``, whose message starts
with ``CheckpointException ranks:dict_keys([0])`` and puts the cause at the end of a long
traceback. Our writer and reader run every storage step inside :func:`step`, which records
on the exception *where* it happened (rank, operation, path, metadata service); the
exception itself is left as it is (its class still says what went wrong, and DCP still ships
it between ranks: the note is an attribute, pickled with it). :func:`cause_first` then turns
DCP's exception into a :class:`CheckpointFailed` whose message starts with that note.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

from torch.distributed.checkpoint.api import CheckpointException

_WHERE = "tectofs_where"


@contextlib.contextmanager
def step(rank: int, operation: str, path: str, server: str | None, record: Any = None) -> Iterator[None]:
    """Run one storage step; an exception escaping it is labelled (once: the innermost
    step names the most precise operation) ``rank R: OPERATION PATH on SERVER``, and kept
    as ``record.last_failure`` (DCP sometimes reports a storage failure only as text inside
    an error of its own: the metadata read of a load)."""
    try:
        yield
    except Exception as exc:
        if getattr(exc, _WHERE, None) is None:
            server = server or os.environ.get("TECTOFS_META") or "the default metadata service"
            with contextlib.suppress(Exception):  # some exception types refuse attributes
                setattr(exc, _WHERE, f"rank {rank}: {operation} {path} on {server}")
        if record is not None:
            record.last_failure = exc
        raise


def where(exc: BaseException) -> str | None:
    """The label :func:`step` put on ``exc`` (None: not a tectofs storage failure)."""
    return getattr(exc, _WHERE, None)


def headline(failures: dict[int, Any], fallback: BaseException | None = None) -> str | None:
    """``rank R: OPERATION PATH on SERVER failed: Class: message`` for the lowest failed rank
    whose exception is labelled (else for ``fallback``, a labelled failure this rank saw),
    plus how many other ranks failed; None if there is no labelled failure."""
    labelled = [pair[0] for _, pair in sorted(failures.items()) if where(pair[0])]
    if fallback is not None and where(fallback):
        labelled.append(fallback)
    if not labelled:
        return None
    exc = labelled[0]
    text = f"{where(exc)} failed: {type(exc).__name__}: {exc}"
    others = len(failures) - 1
    if others:
        text += f" (and {others} other rank{'s' if others > 1 else ''} failed: see below)"
    return text


class CheckpointFailed(CheckpointException):
    """DCP's ``CheckpointException`` (same ``failures``, still caught by
    ``except CheckpointException``) whose message starts with the tectofs cause:
    ``rank 0: write /run/.step_1.pending-…/__0_0.distcp on 10.0.0.1:7420 failed: …``,
    then DCP's per-rank tracebacks."""

    def __init__(self, msg: str, failures: dict[int, Any], first: str) -> None:
        BaseException.__init__(self, msg, failures, first)  # all three: pickled with it
        self._failures = failures
        self.first = first

    def __str__(self) -> str:
        return f"{self.first}\n{super().__str__()}"


def cause_first(exc: CheckpointException, storage: Any = None) -> CheckpointException:
    """``exc`` as a :class:`CheckpointFailed` if one of its failures (or the
    ``last_failure`` of this rank's tectofs ``storage``) is a labelled tectofs failure;
    otherwise ``exc`` itself (failures of other storage are left alone)."""
    first = headline(exc.failures, getattr(storage, "last_failure", None))
    if isinstance(exc, CheckpointFailed) or first is None:
        return exc
    failed = CheckpointFailed(exc.args[0] if exc.args else "checkpoint", exc.failures, first)
    failed.__traceback__ = exc.__traceback__
    return failed
