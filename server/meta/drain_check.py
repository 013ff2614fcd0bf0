"""``tectofs admin drain`` refused when it could never finish.

Draining moves each chunk of a server to another server that holds no chunk of the same
block. A block of width ``w`` (``rs(4,2)``: 6, ``rep(3)``: 3) therefore needs ``w`` servers
besides the drained one that take new chunks (live, not draining themselves). With fewer,
the drain would never end and the server would take no new chunks meanwhile (so writes
there would go degraded): it is refused at once, saying how many servers the widest layout
on that server needs and how many would remain.

The check runs when a server starts draining, not when a drain already under way is asked
again (``--wait`` polls that way): a server that died since is waited for, not a reason to
undo the drain.
"""

from __future__ import annotations

from typing import Any

from tectofs.errors import InvalidArgument
from tectofs.policy import parse as parse_policy
from tectofs.store.health import DRAINING, IN
from tectofs.wire.messages import DrainReply


def drain(store: Any, server: str, cancel: bool = False) -> DrainReply:
    """``store.drain(server, cancel)`` (a ``SqlStore``, in its transaction), unless the server
    is not draining yet and what it holds could not be moved off it (``InvalidArgument``)."""
    if not cancel:
        found = store._find_server(server)
        if found.state != DRAINING:
            refuse_impossible(store, found.server_id)
    return store.drain(server, cancel)  # type: ignore[no-any-return]


def refuse_impossible(store: Any, server_id: int) -> None:
    remaining = sum(1 for s in store.servers() if s.live and s.state == IN and s.server_id != server_id)
    policies = [parse_policy(str(p)) for (p,) in store._all(
        "SELECT DISTINCT b.policy FROM chunks c JOIN blocks b ON b.block_id = c.block_id WHERE c.server_id = ?",
        (server_id,))]
    widest = max(policies, key=lambda p: p.width, default=None)
    if widest is not None and widest.width > remaining:
        raise InvalidArgument(
            f"cannot drain chunk server {server_id}: it holds chunks of {widest} blocks, which need {widest.width}"
            f" chunk servers besides it, and only {remaining} would remain to take them (live and not draining);"
            f" add {widest.width - remaining} chunk server{'s' if widest.width - remaining > 1 else ''} first")
