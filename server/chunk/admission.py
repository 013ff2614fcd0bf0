"""A chunk server's in-flight budget, shared fairly between principals (issue 29, part 2).

A put reserves its payload's length from the budget (``limits.chunk_inflight_bytes_max``)
when its header arrives, and gives it back once stored, refused, or its connection is lost
(the payload then never arrives whole). A put that does not fit is answered BUSY (drained,
never buffered). What made the budget a target: one principal could hold all of it — a user
with genuine write capabilities declared 64 MiB payloads on 8 connections per server and sent
a byte every few seconds, and every other user's puts were refused everywhere.

Now each reservation belongs to a *principal*: the uid the metadata service signed into the
write capability (``messages.Capability.uid``), ``member`` for cluster members (rebuilds), or
``anonymous-capability`` for a capability signed without a uid (an older metadata service).
Admission rules, checked in this order by :meth:`Admission.admit`:

1. Nothing in flight: admitted whatever its size (a put larger than the budget still goes
   through alone, as before).
2. It must fit the budget (``held + length <= budget``).
3. A principal that holds nothing yet is admitted if it fits: a newcomer always gets in
   while there is room.
4. Alone, a principal may hold at most ``alone_fraction`` of the budget (3/4): the rest is
   kept for a newcomer, who would otherwise find the budget full and wait for it. With
   ``n`` principals holding, each may hold at most ``budget / n``; one already over that
   (it took its share while alone) is refused until it drops below.

The budget is spent on reservations whose bytes arrive at a floor rate: a payload slower
than ``frame_progress_min_bytes_per_s`` over a sliding window is dropped with its connection
(``tectofs.wire.connlimits``) and its reservation returned here, so what a slow principal holds
it holds for seconds, and never more than its share. A legitimate put costs two dict
operations more than before (no lock: the event loop's thread only).
"""

from __future__ import annotations

from typing import Any

from tectofs import limits
from tectofs.shares import fair_share

MEMBER = "member"
WITHOUT_UID = "anonymous-capability"


def principal_of(cap: Any) -> str:
    """Whose share a put with capability ``cap`` (the request header's ``cap``: a dict, a
    ``messages.Capability`` or None) draws on. Only called on puts whose capability checked
    out (or members', who need none): the uid is the one the metadata service signed."""
    if cap is None:
        return MEMBER
    uid = cap.get("uid") if isinstance(cap, dict) else getattr(cap, "uid", None)
    return WITHOUT_UID if uid is None else f"uid {uid}"


class Admission:
    """Reservations of one chunk server's in-flight budget, by principal (module docstring).
    Not thread-safe: used from the event loop only."""

    def __init__(self, budget_bytes: int, alone_fraction: float = limits.chunk_inflight_alone_fraction) -> None:
        assert budget_bytes > 0
        assert 0 < alone_fraction <= 1
        self.budget_bytes = budget_bytes
        self.alone_fraction = alone_fraction
        self.held: dict[str, int] = {}  # principal -> bytes reserved (only principals holding some)
        self.total_bytes = 0

    def share_bytes(self, principal: str) -> float:
        """The most ``principal`` may hold, given who else holds some now."""
        others = len(self.held) - (principal in self.held)
        return fair_share(self.budget_bytes, self.alone_fraction, others)

    def admit(self, principal: str, length: int) -> bool:
        """Reserve ``length`` bytes for ``principal``; False: refused (nothing reserved)."""
        assert length >= 0
        if not length:
            return True
        holding = self.held.get(principal, 0)
        if self.total_bytes and (
            self.total_bytes + length > self.budget_bytes
            or holding and holding + length > self.share_bytes(principal)
        ):
            return False
        self.held[principal] = holding + length
        self.total_bytes += length
        return True

    def release(self, principal: str, length: int) -> None:
        """Give back ``length`` bytes ``principal`` reserved."""
        if not length:
            return
        left = self.held.get(principal, 0) - length
        assert left >= 0, f"{principal} releases {length} bytes more than it holds"
        self.total_bytes -= length
        if left:
            self.held[principal] = left
        else:
            self.held.pop(principal, None)
