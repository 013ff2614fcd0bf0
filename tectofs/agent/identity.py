"""Who talks to a memory agent, and what each may do with a step.

A memory agent holds neither the cluster key nor users' secrets. Its callers prove who they are
with a *ticket* (``tectofs.wire.auth``, *Tickets*): the metadata service of the agent's cluster
(``tectofs agent --cluster``) issues one to each authenticated client (``TicketSource``) and,
asked by the agent over the agent's own proxy credential, tells it the ticket's secret
(``TicketChecker``), which the caller proved in its hello without sending it.

What the identity then allows (``may_use``, ``AgentService.authorize``):

* a step belongs to the user who began its save (its *owner*: uid, gid, groups), which the
  cluster let write the step's directory (``tectofs.agent.rules``); only the owner writes,
  verifies, seals, locates, reads or lists it, or starts a new save of it;
* proxies (other agents, whose credentials are made with ``--proxy``, and root) may do all of
  that for any step, send replicas naming their owner, and say a step is persisted;
* an unauthenticated connection may only ping.

The agent persists a step to the cluster acting as its owner (``persist.persist``), so the
metadata service checks the owner's permissions, not the agent's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable

import msgspec

from tectofs import limits
from tectofs.errors import AuthenticationFailed, PermissionDenied, TectofsError
from tectofs.wire import auth
from tectofs.wire import messages as wire
from tectofs.wire.transport import parse_group

if TYPE_CHECKING:
    from tectofs.client import FileSystem

_SECRETS_MAX = 10_000  # tickets whose secrets an agent keeps (forgotten all at once past it)
ANONYMOUS_OPERATIONS = frozenset({"ping"})
PROXY_OPERATIONS = frozenset({"mem_persisted"})


def same_cluster(a: str, b: str) -> bool:
    """Whether addresses ``a`` and ``b`` name the same metadata service (a failover group's
    members in any order)."""
    try:
        return set(parse_group(a)) == set(parse_group(b))
    except TectofsError:
        return False


def owner_of(peer: auth.Peer) -> wire.ActAs:
    """The identity a step begun by ``peer`` belongs to."""
    return wire.ActAs(uid=peer.uid, gid=peer.gid, groups=sorted(peer.groups))


def may_use(peer: auth.Peer, owner: wire.ActAs) -> bool:
    """Whether ``peer`` may write, read or list a step ``owner`` saved."""
    return peer.proxy or peer.uid == owner.uid


def authorize(peer: auth.Peer, operation: str) -> None:
    """PermissionDenied unless ``peer`` may call ``operation`` at all (steps are checked by
    ``may_use``)."""
    if peer.kind == "anonymous" and operation not in ANONYMOUS_OPERATIONS:
        raise PermissionDenied(
            f"{operation}: the memory agent serves only callers with a ticket of its cluster (a tectofs client with a"
            " credential: tectofs.torch's writer and reader take one from the checkpoint's cluster)")
    if operation in PROXY_OPERATIONS and not peer.proxy:
        raise PermissionDenied(f"{operation}: only other memory agents (proxy credentials) may call it")


class TicketSource:
    """Fresh tickets of one client: ``client_auth()`` is a hello's proof of its identity,
    taken anew from the metadata service once the last has less than
    ``limits.ticket_renew_s`` left. Thread-safe; blocking (not from ``fs``'s own loop)."""

    def __init__(self, fs: FileSystem, clock: Callable[[], float] = time.time) -> None:
        self.fs, self.clock = fs, clock
        self._lock = threading.Lock()
        self._current: tuple[wire.Ticket, auth.ClientAuth] | None = None

    @property
    def expiry(self) -> float:
        """When the current ticket expires (0: none taken yet)."""
        current = self._current
        return 0.0 if current is None else float(current[0].expiry)

    def client_auth(self) -> auth.ClientAuth:
        with self._lock:
            current = self._current
            if current is None or current[0].expiry - self.clock() < limits.ticket_renew_s:
                reply = self.fs.run(self.fs.aio.metadata.ticket(wire.TicketRequest(issuer=self.fs.meta_address)))
                proof = auth.ClientAuth(ticket=(msgspec.to_builtins(reply.ticket), reply.secret))
                current = self._current = (reply.ticket, proof)
            return current[1]


class TicketChecker:
    """The agent's :class:`tectofs.wire.server.Authenticator`: a hello must carry a ticket of
    ``cluster`` (its address), whose secret ``secret_of`` asks that cluster for (then kept
    until the ticket expires)."""

    def __init__(self, cluster: str, secret_of: Callable[[wire.Ticket], Awaitable[bytes]],
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster, self.secret_of, self.clock = cluster, secret_of, clock
        self._secrets: dict[bytes, bytes] = {}  # the ticket, encoded -> its secret
        self._asking: dict[bytes, asyncio.Future[bytes]] = {}  # tickets whose secret is being asked for

    async def resolve(self, claim: wire.HelloAuth) -> tuple[bytes, auth.Peer]:
        ticket = claim.ticket
        if claim.kind != "ticket" or ticket is None:
            raise AuthenticationFailed("a memory agent takes tickets only (a cluster key or credential is for the"
                                       " cluster's own services)")
        if not same_cluster(ticket.issuer, self.cluster):
            raise AuthenticationFailed(f"a ticket of cluster {ticket.issuer[:80]}: this memory agent serves cluster"
                                       f" {self.cluster} (tectofs agent --cluster)")
        if ticket.expiry < self.clock():
            raise AuthenticationFailed(f"the ticket of uid {ticket.uid} expired")
        key = msgspec.msgpack.encode(ticket)
        secret = self._secrets.get(key)
        if secret is None:
            secret = await self._ask(key, ticket)
        peer = auth.Peer(kind="user", name=f"uid {ticket.uid}", uid=ticket.uid, gid=ticket.gid,
                         groups=frozenset(ticket.groups), proxy=ticket.proxy)
        return secret, peer


    async def _ask(self, key: bytes, ticket: wire.Ticket) -> bytes:
        """The cluster's answer for ``ticket``: asked once however many hellos carry it at once
        (the ranks of one job connecting together), then kept."""
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.get_running_loop().create_future()
            try:
                secret = await self.secret_of(ticket)
            except TectofsError as exc:
                asking.set_exception(AuthenticationFailed(
                    f"cluster {self.cluster} did not vouch for the ticket of uid {ticket.uid}: {exc}"))
            except OSError as exc:
                asking.set_exception(AuthenticationFailed(f"could not check a ticket with cluster {self.cluster}: {exc}"))
            except BaseException:  # this hello was cancelled (the agent stops): so are those waiting with it
                asking.cancel()
                raise
            else:
                if len(self._secrets) >= _SECRETS_MAX:
                    self._secrets.clear()
                self._secrets[key] = secret
                asking.set_result(secret)
            finally:
                del self._asking[key]
        return await asyncio.shield(asking)


def cluster_secret_of(fs: FileSystem) -> Callable[[wire.Ticket], Awaitable[bytes]]:
    """``TicketChecker``'s ``secret_of`` asking the metadata service of ``fs`` (on ``fs``'s own
    loop; awaited from another)."""

    async def secret_of(ticket: wire.Ticket) -> bytes:
        future = asyncio.run_coroutine_threadsafe(fs.aio.metadata.ticket_secret(ticket), fs.loop)
        reply: Any = await asyncio.wrap_future(future)
        return bytes(reply.secret)

    return secret_of
