"""Read once, share with every rank: a file every rank of a load needs (the checkpoint's
``.metadata``) is read from storage by the group's first rank and broadcast to the others over
``torch.distributed``, instead of every rank reading the same bytes from the same chunk
servers at the same moment (1,024 ranks: 1,024 reads of one file; with this, one read and a
broadcast over the training network, which DCP's collectives already use).

It is a collective: every rank of the group must call :func:`read_once` at the same point
(``dcp.load`` calls ``read_metadata`` on every rank of its process group). A failure to read
on the first rank reaches every rank as the same error class, labelled with where it
happened, so no rank waits for bytes that will not come.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from torch.distributed.checkpoint.metadata import MetadataIndex

from .. import errors
from ._failures import _WHERE, where


def group_of(share: Any) -> Any:
    """The process group ``share`` names (``True``: the default group; a ``ProcessGroup``:
    that one), or None when sharing is off: ``share`` false or None, ``torch.distributed``
    not initialized, a group of one rank (reading directly is as fast), or a group this
    process is not in. InvalidArgument for anything else."""
    if share is None or share is False:
        return None
    import torch.distributed as dist

    if not dist.is_available():
        return None
    if share is not True and not isinstance(share, dist.ProcessGroup):
        raise errors.InvalidArgument(f"share_metadata={share!r}: use True, False or a torch.distributed ProcessGroup")
    if not dist.is_initialized():
        return None
    group = dist.group.WORLD if share is True else share
    return group if dist.get_rank(group) >= 0 and dist.get_world_size(group) > 1 else None


def read_once(group: Any, read: Callable[[], bytes]) -> bytes:
    """``read()`` on rank 0 of ``group`` (a ``ProcessGroup``), its bytes on every rank.

    Every rank of ``group`` must call this; each takes part in exactly one broadcast, whatever
    happens on rank 0. If ``read`` raises there (anything, KeyboardInterrupt included), rank 0
    re-raises it and every other rank raises the same tectofs error class with the same
    message and label (``rank 0: read file ...``); an error that is not a tectofs error
    arrives as :class:`tectofs.errors.TectofsError` naming its class."""
    import torch.distributed as dist

    payload: list[Any] = [None]
    failure: BaseException | None = None
    if dist.get_rank(group) == 0:
        try:
            payload[0] = ("ok", read())
        except BaseException as exc:
            failure = exc
            payload[0] = _error_payload(exc)
    # src is a global rank: group_src= needs torch >= 2.6, and pyproject allows 2.4.
    dist.broadcast_object_list(payload, src=dist.get_global_rank(group, 0), group=group)
    if failure is not None:
        raise failure
    outcome = payload[0]
    if outcome[0] == "ok":
        return outcome[1]  # type: ignore[no-any-return]
    _, code, message, label = outcome
    received = errors.from_wire(code, message)
    with contextlib.suppress(Exception):
        setattr(received, _WHERE, f"{label} (read for every rank of the group)" if label else None)
    raise received


def _error_payload(exc: BaseException) -> tuple[str, str, str, str | None]:
    """What the other ranks are told of rank 0's failure: only strings, so it always pickles."""
    try:
        code, message = errors.to_wire(exc)
        return "error", code, message, where(exc)
    except Exception:
        return "error", errors.TectofsError.code, type(exc).__name__, None


# -- every stored item read once per load (CheckpointReader(share_reads=...)) -------------------


@dataclass
class ReadShare:
    """One rank's part in reading each shared item once: the items it reads from storage for
    other ranks too (``send``: item -> the group ranks it sends it to) and those it gets from
    the rank that read them (``receive``: item -> that group rank). ``tags`` numbers each
    shared item the same way on every rank (point-to-point messages are matched by tag)."""

    send: dict[MetadataIndex, list[int]] = field(default_factory=dict)
    receive: dict[MetadataIndex, int] = field(default_factory=dict)
    tags: dict[MetadataIndex, int] = field(default_factory=dict)


def assign_readers(needs: list[dict[MetadataIndex, int]]) -> list[ReadShare]:
    """``needs[r]``: the stored items group rank ``r`` loads (item -> bytes). Each item more
    than one rank needs is read by one of them (the one with the fewest bytes to read so far,
    the lower rank on a tie; the largest items are placed first) and sent to the others.
    Returns each rank's :class:`ReadShare` (the same ``tags`` on every rank)."""
    wanted: dict[MetadataIndex, list[int]] = {}
    nbytes: dict[MetadataIndex, int] = {}
    for rank, items in enumerate(needs):
        for item, n in items.items():
            wanted.setdefault(item, []).append(rank)
            nbytes[item] = n
    load = [sum(n for item, n in items.items() if len(wanted[item]) == 1) for items in needs]
    shares = [ReadShare() for _ in needs]
    shared = sorted((item for item, ranks in wanted.items() if len(ranks) > 1 and nbytes[item] > 0),
                    key=lambda item: (-nbytes[item], str(item)))
    tags = {item: tag for tag, item in enumerate(shared)}
    for item in shared:
        ranks = wanted[item]
        reader = min(ranks, key=lambda r: (load[r], r))
        load[reader] += nbytes[item]
        shares[reader].send[item] = [r for r in ranks if r != reader]
        for r in ranks:
            if r != reader:
                shares[r].receive[item] = reader
    for share in shares:
        share.tags = {item: tags[item] for item in (*share.send, *share.receive)}
    return shares


_OK, _FAILED = 1, 2


class Exchange:
    """The point-to-point transfers of one rank's :class:`ReadShare` over ``group`` (a
    ``ProcessGroup``). Each item goes as a header (a status: read, or a failure mark) and its
    bytes (``lengths[item]`` of them, known on both sides from the checkpoint's metadata), so
    receives are posted ahead, up to ``window_bytes``, and run beside the reads. A rank that
    could not read an item still sends both, the header marking the failure (and zeros for
    the bytes), so the ranks waiting for it fail at once instead of waiting: every item owed
    is sent whatever happens (:meth:`close`).

    Call order: :meth:`__init__` (posts the first receives), :meth:`send` for each item of
    ``share.send`` as soon as it is read, :meth:`received` (yields each received item),
    :meth:`close` (in a ``finally``: sends what was not sent, takes what is still coming,
    waits for every send)."""

    def __init__(self, group: Any, share: ReadShare, lengths: dict[MetadataIndex, int],
                 window_bytes: int = 256 << 20) -> None:
        import torch
        import torch.distributed as dist

        self._dist, self._torch = dist, torch
        self.group, self.share, self.lengths, self.window_bytes = group, share, lengths, window_bytes
        self.received_bytes = self.sent_bytes = 0
        self._sends: list[Any] = []  # (work, the tensor it sends: kept alive until it is done)
        self._unsent = set(share.send)
        self._waiting = list(share.receive)  # in the order they are taken
        self._posted: dict[MetadataIndex, tuple[Any, Any, Any, Any]] = {}  # item -> header, its work, bytes, work
        self._posted_bytes = 0
        self._post()

    def _global(self, group_rank: int) -> int:
        return int(self._dist.get_global_rank(self.group, group_rank))

    def _post(self) -> None:
        """Post the receives of the next items, while within ``window_bytes`` (at least one)."""
        torch, dist = self._torch, self._dist
        for item in self._waiting:
            if item in self._posted:
                continue
            n = self.lengths[item]
            if self._posted and self._posted_bytes + n > self.window_bytes:
                return
            source, tag = self._global(self.share.receive[item]), 2 * self.share.tags[item]
            header, payload = torch.zeros(1, dtype=torch.int64), torch.empty(n, dtype=torch.uint8)
            self._posted[item] = (header, _started(dist.irecv(header, src=source, group=self.group, tag=tag)),
                                  payload, _started(dist.irecv(payload, src=source, group=self.group, tag=tag + 1))
                                  if n else None)
            self._posted_bytes += n

    def _push(self, item: MetadataIndex, status: int, payload: Any) -> None:
        torch, dist = self._torch, self._dist
        header, tag = torch.tensor([status], dtype=torch.int64), 2 * self.share.tags[item]
        for rank in self.share.send[item]:
            self._sends.append((_started(dist.isend(header, dst=self._global(rank), group=self.group, tag=tag)), header))
            if payload.numel():
                self._sends.append((_started(dist.isend(payload, dst=self._global(rank), group=self.group,
                                                        tag=tag + 1)), payload))
        self._unsent.discard(item)

    def send(self, item: MetadataIndex, data: memoryview) -> None:
        """Send ``item``'s bytes (checked against its crc32c) to every rank that waits for it."""
        torch = self._torch
        if data.nbytes != self.lengths[item]:
            raise errors.CheckpointError(f"item of {data.nbytes} bytes, {self.lengths[item]} recorded")
        payload = torch.frombuffer(data, dtype=torch.uint8) if data.nbytes else torch.empty(0, dtype=torch.uint8)
        self._push(item, _OK, payload)
        self.sent_bytes += data.nbytes * len(self.share.send[item])

    def received(self) -> Iterator[tuple[MetadataIndex, memoryview]]:
        """Yield ``(item, bytes)`` for each item of ``share.receive``, as it arrives (its
        crc32c is for the caller to check, as for bytes read from storage). Raises
        ``CheckpointError`` naming the rank that could not read an item."""
        while self._waiting:
            item = self._waiting[0]
            data = self._take(item)
            if data is None:
                raise errors.CheckpointError(
                    f"rank {self.share.receive[item]} of the load's group could not read an item it reads for this"
                    " rank too (its own error says why)")
            self.received_bytes += data.nbytes
            yield item, data

    def _take(self, item: MetadataIndex) -> memoryview | None:
        """Wait for ``item``'s header and bytes (None: its reader failed); post the next receives."""
        self._post()
        header, header_work, payload, payload_work = self._posted.pop(item)
        self._waiting.remove(item)
        header_work.wait()
        if payload_work is not None:
            payload_work.wait()
        self._posted_bytes -= payload.numel()
        self._post()
        return memoryview(payload.numpy()).cast("B") if int(header[0]) == _OK else None

    def close(self) -> None:
        """Send what was not sent (this rank failed before it read it: a failure mark and
        zeros), take (and drop) what is still coming to this rank (its senders wait until
        it is taken), then wait until every send is done."""
        torch = self._torch
        for item in sorted(self._unsent, key=self.share.tags.__getitem__):
            self._push(item, _FAILED, torch.zeros(self.lengths[item], dtype=torch.uint8))
        while self._waiting:
            self._take(self._waiting[0])
        for work, _ in self._sends:
            work.wait()
        self._sends.clear()

def _started(work: Any) -> Any:
    """A point-to-point operation's ``Work`` (None only for a rank outside the group: never here)."""
    assert work is not None
    return work
