"""The memory agent's server (``tectofs agent``): one per host, owning host memory for
checkpoints outside the training processes, so a trainer's crash loses none of them.

Operations (``tectofs.agent.messages``):

* ``mem_put``: a trainer (or the step's primary agent) sends a file's bytes of one save.
* ``mem_seal``: the save is complete. The agent checks every file against the sizes and crc32cs
  the writer recorded, marks it sealed, and — if it is the primary (sealed by a trainer) — copies
  it to ``replicas`` peers (``--peers``; each seals its copy, naming this agent its primary).
  It answers once ``replicas`` peers hold it: the save then counts as saved in memory. If fewer
  peers can take it, or no peer does (an agent without peers), it persists the step before
  answering instead (a save never counts as saved with a single copy in memory, unless the
  writer asked for one: ``replicas=0``, or ``--replicas 0``).
* Persistence runs behind, one step at a time, oldest first (``tectofs.agent.persist``): the
  primary persists at once; a replica takes over once ``takeover_s`` passed without the primary
  telling it (``mem_persisted``) that the step is persisted. A failed attempt is retried after
  ``persist_retry_s``; a name committed by another save is not retried (reported by ``mem_list``).
* ``mem_locate`` / ``mem_get`` / ``mem_list``: readers find a sealed step and read it (in place
  through shared memory on this host, or over the wire).

Security (``tectofs.agent.identity``, ``tectofs.agent.rules``): every caller proves an identity
with a ticket of the agent's cluster (``cluster``); a save begins only if the cluster lets its
saver write the step's directory and holds no checkpoint there yet; a step is its saver's alone
(others neither read, list nor overwrite it), other agents (proxies) replicate, the agent
persists each step acting as its owner, and steps not yet persisted hold at most their owner's
share of the memory. Bad requests are answered with an error naming the field, and the agent keeps serving
(``tectofs.wire.server``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import msgspec

from tectofs import errors, limits
from tectofs import uri as _uri
from tectofs.buffers import BufferPool
from tectofs.checkpoint_gc import METADATA_NAME
from tectofs.wire import messages as wire
from tectofs.wire.auth import Peer
from tectofs.wire.client import RpcClient
from tectofs.wire.sendfile import FileRegion
from tectofs.wire.server import Handlers, RpcServer, current_peer

from . import identity, messages, persist, rules
from .forward import Forwarding
from .store import HeldStep, StepStore

log = logging.getLogger(__name__)

_SWEEP_S = 0.2  # how often the background loop looks for steps to persist or collect
_BUFFERS_BYTES = 8 * messages.PIECE_BYTES_MAX  # idle payload buffers kept for reuse
_FORWARDS_MAX = 4  # pieces of one save being forwarded to peers at once


class AgentService:
    """One agent. ``root``: the shared-memory directory its steps live under (a directory of
    its own is made inside); ``cluster``: the metadata service (address) whose tickets it takes
    and where its steps are persisted; ``peers``: agents to replicate to, in order of preference;
    ``wait_s``: how long a put waits for persistence to free memory before it fails (NoSpace)."""

    def __init__(self, root: str = "/dev/shm", *, cluster: str, memory_bytes_max: int, keep_steps: int = 2,
                 peers: list[str] | None = None, replicas: int | None = None, wait_s: float = 60.0,
                 takeover_s: float = 30.0, persist_retry_s: float = 5.0, abandon_s: float = 600.0) -> None:
        self.store = StepStore(root, memory_bytes_max, keep_steps, abandon_s)
        self.shares = rules.Shares(memory_bytes_max)
        self.cluster = cluster
        self._tickets: identity.TicketSource | None = None  # this agent's own, for its calls to peers
        self.peers = list(peers or [])
        self.replicas = min(len(self.peers), 1 if replicas is None else replicas)
        self._one_copy_is_enough = replicas == 0  # --replicas 0: saved with no peer's copy, not persisted first
        self.wait_s = wait_s
        self.takeover_s = takeover_s
        self.persist_retry_s = persist_retry_s
        self.address = ""
        # Put payloads are received into reused buffers (fresh memory is slow to fault in), given
        # back once written to shared memory; replication reads into them too.
        self.buffers = BufferPool(_BUFFERS_BYTES)
        self.rpc = RpcServer(self, "memory agent", messages.AGENT_OPERATIONS, "agent", self._handlers(),
                             allocate_payload=lambda header, length: lambda: self.buffers.get(length),
                             authenticator=identity.TicketChecker(cluster, self._secret_of))
        self.peer_client = RpcClient(connections_per_server=2, timeout_s=30.0, retries_max=1, role="agent")
        self._freed = asyncio.Event()
        self._holders: dict[str, list[str]] = {}  # step -> peers holding a sealed replica of it
        self._retry_at: dict[str, float] = {}  # step -> when its persistence may be tried again
        self._persist_locks: dict[str, asyncio.Lock] = {}  # step -> held while persisting it
        self._forwards: dict[str, Forwarding] = {}  # step -> its save being forwarded to peers as it arrives
        self._checks: dict[tuple[str, str, int], asyncio.Future[None]] = {}  # (step, save, uid) being checked
        self._fs: Any = None  # the agent's client of its cluster, once made
        self._sweeper: asyncio.Task[None] | None = None
        self.persisted_steps = 0

    def _handlers(self) -> Handlers:
        served = Handlers()
        served.add(messages.PUT, self.rpc_put)  # trainers and primaries
        served.add(messages.VERIFY, self.rpc_verify)
        served.add(messages.SEAL, self.rpc_seal)
        served.add(messages.PERSISTED, self.rpc_persisted)  # primaries, to their replicas
        served.add(messages.LOCATE, self.rpc_locate)  # readers
        served.add(messages.GET, self.rpc_get)
        served.add(messages.LIST, self.rpc_list)
        served.add(wire.PING, self.rpc_ping)
        return served

    # ------------------------------------------------------------------ identity

    def _cluster_fs(self) -> Any:
        """The agent's own client of its cluster (blocking: call it off the event loop)."""
        return _uri.filesystem(self.cluster)

    async def _secret_of(self, ticket: wire.Ticket) -> bytes:
        fs = await asyncio.to_thread(self._cluster_fs)
        return await identity.cluster_secret_of(fs)(ticket)

    async def _authenticate_to_peers(self) -> None:
        """Make the peer client's new connections prove this agent's own ticket (a fresh one)."""
        if self._tickets is None or self._tickets.expiry - time.time() < limits.ticket_renew_s:
            if self._tickets is None:
                self._tickets = identity.TicketSource(await asyncio.to_thread(self._cluster_fs))
            self.peer_client.default_auth = await asyncio.to_thread(self._tickets.client_auth)

    async def check_credential(self) -> str:
        """Whether this agent's credential may act for trainers (a proxy): "" if so, else why
        not (it could neither persist their steps nor replicate to its peers)."""
        fs = await asyncio.to_thread(self._cluster_fs)
        me = await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(fs.aio.metadata.whoami(), fs.loop))
        if me.proxy:
            return ""
        return (f"the agent's credential (user {me.name}, uid {me.uid}) may not act for other users: make it with"
                " 'tectofs user add NAME --proxy' (and give the agent it through $TECTOFS_CREDENTIALS)")

    @staticmethod
    def authorize(peer: Peer, operation: str) -> None:
        identity.authorize(peer, operation)

    def _check_cluster(self, step: str) -> None:
        address = _uri.parse(step).address
        if address is not None and not identity.same_cluster(address, self.cluster):
            raise errors.InvalidArgument(f"{step} is a step of cluster {address}; this memory agent serves cluster"
                                         f" {self.cluster} (tectofs agent --cluster)")

    def _mine(self, held: HeldStep | None) -> HeldStep | None:
        """``held`` if the caller may use it (``identity.may_use``), else None: another user's
        step is as absent."""
        return held if held is not None and identity.may_use(current_peer.get(), held.owner) else None

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on ``host:port``; PermissionDenied first if the cluster refuses the agent's
        credential or it is not a proxy's (a cluster that does not answer is only logged: it
        is asked again at each use)."""
        try:
            why = await asyncio.wait_for(self.check_credential(), limits.hello_timeout_s * 2)
        except (errors.PermissionDenied, errors.AuthenticationFailed) as exc:
            raise errors.PermissionDenied(f"the memory agent's credential for cluster {self.cluster} is refused: {exc}"
                                          ) from None
        except (errors.TectofsError, OSError, asyncio.TimeoutError, ValueError) as exc:
            log.warning("memory agent: cannot check its credential with cluster %s (%s: %s); serving anyway",
                        self.cluster, type(exc).__name__, exc)
        else:
            if why:
                raise errors.PermissionDenied(why)
        self.address = await self.rpc.start(host, port)
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        return self.address

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        await self.rpc.close()
        await self.peer_client.close()
        self.store.close()

    # ------------------------------------------------------------------ puts and seals

    async def rpc_put(self, r: messages.PutRequest, payload: memoryview) -> tuple[wire.Empty, bytes]:
        forwarded = False
        try:
            peer = current_peer.get()
            if (r.replica or r.owner is not None) and not peer.proxy:
                raise errors.PermissionDenied("mem_put: only memory agents (proxy credentials) send replicas")
            if r.replica and r.owner is None:
                raise errors.InvalidArgument("mem_put: a replica names the user who saved it (owner)")
            owner = r.owner if r.replica and r.owner is not None else identity.owner_of(peer)
            self._check_cluster(r.step)
            existing = self.store.steps.get(r.step)
            if existing is not None and not identity.may_use(peer, existing.owner):
                raise errors.PermissionDenied(f"{r.step} is being saved or held by another user")
            if not r.replica and (existing is None or existing.save != r.save):
                await self._may_begin(r.step, r.save, owner)
                existing = self.store.steps.get(r.step)  # (the check awaited: another save may have begun)
                if existing is not None and not identity.may_use(peer, existing.owner):
                    raise errors.PermissionDenied(f"{r.step} is being saved or held by another user")
            try:
                held = self.store.begin(r.step, r.save, primary=not r.replica, origin=None, owner=owner)
                growth = self.store.growth(held, r.file, r.offset, payload.nbytes)
                if growth:
                    await self._room(growth, r.step, owner.uid)
                held = self.store.begin(r.step, r.save, primary=not r.replica, origin=None,
                                        owner=owner)  # (a wait may have dropped it)
                self.store.write(held, r.file, r.offset, payload)
            except errors.NoSpace:
                # No room, or the file system cut the piece short: the save is torn (its writer's
                # save fails), and what it took goes now, not once abandoned, so the next save fits.
                torn = self.store.steps.get(r.step)
                if torn is not None and torn.save == r.save and not torn.sealed:
                    self.store.drop(r.step)
                raise
            if not r.replica and self.replicas:
                await self._authenticate_to_peers()
                await self._forwarding(r.step, r.save).forward(
                    msgspec.structs.replace(r, replica=True, owner=held.owner), payload)
                forwarded = True
        finally:
            if not forwarded:
                self.buffers.put(payload)
        return wire.Empty(), b""

    async def _may_begin(self, step: str, save: str, owner: wire.ActAs) -> None:
        """Raise unless ``owner`` may begin save ``save`` of ``step`` (``rules.may_save``,
        asked of the cluster once for all the puts of the save that arrive together)."""
        loc = rules.canonical(step)
        key = (step, save, owner.uid)
        check = self._checks.get(key)
        if check is None:
            check = self._checks[key] = asyncio.get_running_loop().create_future()
            try:
                if self._fs is None:
                    self._fs = await asyncio.to_thread(self._cluster_fs)
                await rules.may_save(self._fs, loc, owner)
            except Exception as exc:
                check.set_exception(exc)
                check.exception()  # retrieved: the waiters, if any, raise it too
            except BaseException:  # this put was cancelled (the agent stops): so are those waiting with it
                check.cancel()
                raise
            else:
                check.set_result(None)
            finally:
                del self._checks[key]
        await asyncio.shield(check)

    def _forwarding(self, step: str, save: str) -> Forwarding:
        """The forwarding of save ``save`` of ``step`` to this agent's first ``replicas`` peers."""
        forwarding = self._forwards.get(step)
        if forwarding is None or forwarding.save != save:
            if forwarding is not None:
                forwarding.cancel()
            forwarding = self._forwards[step] = Forwarding(self.peer_client, save, self.peers[:self.replicas],
                                                           _FORWARDS_MAX, self.buffers.put)
        return forwarding

    def payload_unused(self, payload: memoryview, header: dict[str, Any]) -> None:
        """An invalid put's payload: its buffer serves the next one."""
        self.buffers.put(payload)

    async def _room(self, nbytes: int, step: str, uid: int) -> None:
        """Wait until ``nbytes`` more fit, in the agent and in the share of ``uid`` (the
        step's owner: ``rules.Shares``), as persistence frees memory, at most ``wait_s``;
        NoSpace at once if no other step is there to be persisted."""
        deadline = time.monotonic() + self.wait_s
        while True:
            fits = self.store.room_for(nbytes)
            over_share = self.shares.refusal(uid, nbytes, self.store.steps.values())
            if fits and not over_share:
                return
            left = deadline - time.monotonic()
            # Only another save's step, once persisted, can free memory: with none, waiting is in vain.
            if left <= 0 or all(s.persisted or s.step == step for s in self.store.steps.values()):
                if fits:
                    raise errors.NoSpace(
                        f"memory agent {self.address}: {nbytes} more bytes of {step} exceed its saver's share of the"
                        f" agent's memory: {over_share}; waited {self.wait_s:g} s for persistence. Steps not yet"
                        " persisted count against their saver: let them persist, or save less at once")
                unpersisted = [s for s in self.store.steps.values() if not s.persisted]
                free = self.store.free_bytes()
                where = (f"; its shared-memory directory {self.store.directory} has only {free} bytes free (--shm-dir:"
                         " a larger tmpfs, or less of it used by others)" if free < nbytes else "")
                raise errors.NoSpace(
                    f"memory agent {self.address} is full ({self.store.held_bytes} of {self.store.memory_bytes_max}"
                    f" bytes; {len(unpersisted)} steps not yet persisted or being received{where}): {nbytes} more"
                    f" bytes of {step} waited {self.wait_s:g} s for persistence to free memory. Raise --memory-bytes,"
                    " lower --keep-steps or save less often")
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), min(left, 1.0))
            except asyncio.TimeoutError:
                pass

    async def rpc_verify(self, r: messages.VerifyRequest, payload: memoryview) -> tuple[wire.Empty, bytes]:
        await self._verify(self._receiving(r.step, r.save), r.files)
        return wire.Empty(), b""

    def _receiving(self, step: str, save: str) -> HeldStep:
        held = self._mine(self.store.steps.get(step))
        if held is None or held.save != save:
            raise errors.NotFound(f"memory agent {self.address} holds no save {save} of {step}: its files never"
                                  " arrived, or the agent restarted since")
        return held

    async def _verify(self, held: HeldStep, files: list[messages.HeldFileInfo]) -> None:
        """Check ``files`` of ``held`` against the writer's sizes and crc32cs; a save that
        fails is torn: it is dropped, and the error says why."""
        reason = await asyncio.to_thread(StepStore.check, held, files)
        if reason:
            self.store.drop(held.step)
            self._freed.set()
            raise errors.CheckpointError(f"memory agent {self.address}: save {held.save} of {held.step} is torn"
                                         f" ({reason}); it was dropped")
        StepStore.verified(held, files)

    async def rpc_seal(self, r: messages.SealRequest, payload: memoryview) -> tuple[messages.SealReply, bytes]:
        if r.primary is not None and not current_peer.get().proxy:
            raise errors.PermissionDenied("mem_seal: only memory agents (proxy credentials) seal replicas")
        held = self._receiving(r.step, r.save)
        if not held.sealed:
            if METADATA_NAME not in r.names:
                raise errors.InvalidArgument(f"a seal of {r.step} names no {METADATA_NAME}")
            await self._verify(held, r.files)
            held.primary, held.origin = r.primary is None, r.primary
            self.store.seal(held, r.names)
            self._freed.set()
        if not held.primary:
            return messages.SealReply(copies=1, persisted=held.persisted), b""
        wanted = self.replicas if r.replicas is None else r.replicas
        holders, failures = await self._replicate(held, wanted)
        # One copy in memory is a save only if asked for (replicas=0, --replicas 0); else a save
        # no peer holds is persisted before it returns, with peers configured or not.
        one_copy_is_enough = r.replicas == 0 or (r.replicas is None and self._one_copy_is_enough)
        note = ""
        if (len(holders) < wanted or not (holders or one_copy_is_enough)) and not held.persisted:
            note = (f"{len(holders)} of {max(wanted, 1)} peers took a copy ({'; '.join(failures) or 'no peers'}):"
                    " persisted before answering")
            await self._persist(held)
            if not held.persisted:
                raise errors.CheckpointError(f"{r.step}: {note[:-len(' before answering')]} failed: {held.persist_error}")
        return messages.SealReply(copies=1 + len(holders), persisted=held.persisted, note=note), b""

    async def _replicate(self, held: HeldStep, replicas: int) -> tuple[list[str], list[str]]:
        """Have ``replicas`` peers hold ``held`` sealed: those it was forwarded to as it arrived
        seal their copies, other peers get a whole copy; returns the peers holding it and what
        failed on the others."""
        holders = self._holders.setdefault(held.step, [])
        failures: list[str] = []
        if replicas:
            await self._authenticate_to_peers()
        forwarding = self._forwards.pop(held.step, None)
        if forwarding is not None and forwarding.save == held.save:
            for peer in await forwarding.finished():
                if len(holders) < replicas and peer not in holders:
                    try:
                        await self._seal_on(held, peer)
                        holders.append(peer)
                    except (errors.TectofsError, OSError) as exc:
                        forwarding.failed[peer] = f"{type(exc).__name__}: {exc}"
            failures.extend(f"{peer}: {why}" for peer, why in forwarding.failed.items())
        for peer in self.peers:
            if len(holders) >= replicas:
                break
            if peer in holders or (forwarding is not None and peer in forwarding.failed):
                continue
            try:
                await self._copy_to(held, peer)
                holders.append(peer)
            except (errors.TectofsError, OSError) as exc:
                failures.append(f"{peer}: {exc}")
                log.warning("memory agent %s: could not replicate %s to %s: %s", self.address, held.step, peer, exc)
        return list(holders), failures

    async def _copy_to(self, held: HeldStep, peer: str) -> None:
        for info in held.infos:
            path = held.files[info.name].path
            offset = 0
            buffer = self.buffers.get(messages.PIECE_BYTES_MAX)
            try:
                while True:
                    n = await asyncio.to_thread(_pread_into, path, offset, buffer)
                    if n or offset == 0:
                        await self.peer_client.call(peer, messages.PUT, messages.PutRequest(
                            step=held.step, save=held.save, file=info.name, offset=offset, replica=True,
                            owner=held.owner), buffer[:n])
                    offset += n
                    if n < buffer.nbytes:
                        break
            finally:
                self.buffers.put(buffer)
        await self._seal_on(held, peer)

    async def _seal_on(self, held: HeldStep, peer: str) -> None:
        """Have ``peer``, which holds every file of ``held``, check and seal its copy."""
        await self.peer_client.call(peer, messages.SEAL, messages.SealRequest(
            step=held.step, save=held.save, files=held.infos, names=[f.name for f in held.infos], replicas=0,
            primary=self.address))

    # ------------------------------------------------------------------ persistence

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_S)
            try:
                gone = self.store.collect_abandoned()
                for step in gone:
                    forwarding = self._forwards.pop(step, None)
                    if forwarding is not None:
                        forwarding.cancel()
                if gone:
                    self._freed.set()
                for held in self._due():
                    await self._persist(held)
            except Exception:  # the loop must outlive any one failure
                log.exception("memory agent %s: background persistence failed", self.address)

    def _due(self) -> list[HeldStep]:
        """Sealed steps to persist now, oldest first: a primary's at once, a replica's once
        ``takeover_s`` passed since it was sealed here."""
        now = time.monotonic()
        due = [s for s in self.store.steps.values()
               if s.sealed and not s.persisted and not s.persisting and now >= self._retry_at.get(s.step, 0.0)
               and (s.primary or now - s.sealed_at >= self.takeover_s)]
        return sorted(due, key=lambda s: s.sealed_at)

    async def _persist(self, held: HeldStep) -> None:
        """Persist ``held`` unless it is; one attempt at a time per step (a caller that finds
        one under way waits for it, then tries again only if it failed). On success, tell the
        peers holding replicas, so they may evict theirs."""
        lock = self._persist_locks.setdefault(held.step, asyncio.Lock())
        async with lock:
            if not held.persisted:
                await self._persist_once(held)
        if not lock.locked() and self._persist_locks.get(held.step) is lock:
            del self._persist_locks[held.step]

    async def _persist_once(self, held: HeldStep) -> None:
        held.persisting = True
        files = {name: f.path for name, f in held.files.items()}
        try:
            await asyncio.to_thread(persist.persist, held.step, files, self.cluster, held.owner)
        except errors.AlreadyExists as exc:
            held.persist_error = str(exc)
            self._retry_at[held.step] = float("inf")
            log.error("memory agent %s: %s", self.address, exc)
            return
        except Exception as exc:
            held.persist_error = f"{type(exc).__name__}: {exc}"
            self._retry_at[held.step] = time.monotonic() + self.persist_retry_s
            log.warning("memory agent %s: persisting %s failed (retried in %g s): %s", self.address, held.step,
                        self.persist_retry_s, held.persist_error)
            return
        finally:
            held.persisting = False
        self.persisted_steps += 1
        self._retry_at.pop(held.step, None)
        self.store.mark_persisted(held.step, held.save)
        self._freed.set()
        told = self._holders.pop(held.step, []) + ([held.origin] if held.origin else [])
        if told:
            await self._authenticate_to_peers()
        for peer in told:
            try:
                await self.peer_client.call(peer, messages.PERSISTED, messages.StepRequest(step=held.step, save=held.save),
                                            timeout_s=5.0, retries_max=0)
            except (errors.TectofsError, OSError) as exc:  # it takes over later and finds the step committed
                log.info("memory agent %s: could not tell %s that %s is persisted: %s", self.address, peer, held.step, exc)

    async def rpc_persisted(self, r: messages.StepRequest, payload: memoryview) -> tuple[wire.Empty, bytes]:
        if r.save is not None and self.store.mark_persisted(r.step, r.save):
            self._freed.set()
        return wire.Empty(), b""

    # ------------------------------------------------------------------ reads

    async def rpc_locate(self, r: messages.StepRequest, payload: memoryview) -> tuple[messages.LocateReply, bytes]:
        held = self._mine(self.store.sealed(r.step, r.save))
        if held is None:
            return messages.LocateReply(found=False, peers=self.peers), b""
        return messages.LocateReply(found=True, save=held.save, files=held.infos,
                                    paths=[held.files[f.name].path for f in held.infos], persisted=held.persisted,
                                    peers=self.peers), b""

    async def rpc_get(self, r: messages.GetRequest, payload: memoryview) -> tuple[wire.Empty, FileRegion]:
        held = self._mine(self.store.sealed(r.step, r.save))
        if held is None:
            raise errors.NotFound(f"memory agent {self.address} holds no sealed save {r.save} of {r.step} (evicted?)")
        file = held.files.get(r.file)
        if file is None:
            raise errors.NotFound(f"{r.step} (save {r.save}) has no file {r.file!r}")
        if r.offset + r.length > file.size:
            raise errors.InvalidArgument(f"{r.file} of {r.step} has {file.size} bytes: cannot read {r.length} at"
                                         f" offset {r.offset}")
        return wire.Empty(), FileRegion(os.open(file.path, os.O_RDONLY), r.offset, r.length)  # sent with sendfile

    async def rpc_list(self, r: messages.ListRequest, payload: memoryview) -> tuple[messages.ListReply, bytes]:
        peer = current_peer.get()
        held = sorted((s for s in self.store.steps.values()
                       if s.sealed and s.step.startswith(r.prefix) and identity.may_use(peer, s.owner)),
                      key=lambda s: s.step)
        listed = [messages.HeldStepInfo(step=s.step, save=s.save, persisted=s.persisted, primary=s.primary,
                                        nbytes=s.nbytes) for s in held[:messages.STEPS_LISTED_MAX]]
        return messages.ListReply(steps=listed, truncated=len(held) > len(listed), peers=self.peers,
                                  memory_bytes=self.store.held_bytes,
                                  memory_bytes_max=self.store.memory_bytes_max), b""

    async def rpc_ping(self, r: wire.Empty, payload: memoryview) -> tuple[wire.PingReply, bytes]:
        return wire.PingReply(), b""

    def status(self) -> dict[str, Any]:
        return {"address": self.address, "steps": len(self.store.steps), "bytes": self.store.held_bytes,
                "persisted_steps": self.persisted_steps}


def _pread_into(path: str, offset: int, buffer: memoryview) -> int:
    """Fill ``buffer`` from ``offset`` of the file ``path``; returns the bytes read (fewer at its end)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < buffer.nbytes:
            got = os.preadv(fd, [buffer[done:]], offset + done)
            if got <= 0:
                break
            done += got
        return done
    finally:
        os.close(fd)
