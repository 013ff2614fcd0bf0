"""The simulator's transport seam: an in-memory network of asyncio transports.

The production protocols (``tectofs.wire.transport.FramedProtocol`` under ``RpcServer`` and
``RpcClient``) run unchanged over ``SimTransport``, which ``SimLoop.create_server`` and
``create_connection`` hand them instead of sockets. Like TCP, a connection delivers bytes in
order, never duplicated; so the faults are TCP's:

- latency: every write arrives after a seeded delay; writes on different connections
  overtake each other (messages reordered across connections);
- delay: now and then a write waits much longer (a congested link);
- drop: a write is cut short (or not) and the connection reset after the bytes that did
  arrive (a lost segment the sender gave up on); when a whole request arrived, the client's
  retry on a new connection is a duplicated message, which the exactly-once call ids must
  absorb;
- crash: a host's process dies; its listeners close at once, its connections reset;
- partition: a host is unreachable, connects hang until their deadline and its
  connections' bytes vanish until it heals.

Each delivery runs in the receiver's context (``tectofs.testing.loop.HOST``), so tasks a
protocol starts belong to the receiving process.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from tectofs.testing.loop import host_context

if TYPE_CHECKING:
    from tectofs.testing.loop import SimLoop


@dataclass
class NetworkFaults:
    """How the network misbehaves in one schedule (probabilities per write)."""

    latency_s: tuple[float, float] = (0.0001, 0.002)
    delay_p: float = 0.0
    delay_s: tuple[float, float] = (0.05, 1.5)
    drop_p: float = 0.0


class _Socket:
    """What ``server.sockets[0].getsockname()`` needs."""

    def __init__(self, host: str, port: int) -> None:
        self.address = (host, port)

    def getsockname(self) -> tuple[str, int]:
        return self.address


class Listener:
    """A listening endpoint (what ``loop.create_server`` returns: an ``asyncio.Server``'s API)."""

    def __init__(self, network: Network, loop: SimLoop, owner: str, factory: Callable[[], asyncio.BaseProtocol],
                 host: str, port: int) -> None:
        self.network, self.loop, self.owner, self.factory = network, loop, owner, factory
        self.host, self.port = host, port
        self.sockets = [_Socket(host, port)]
        self.serving = True

    def is_serving(self) -> bool:
        return self.serving

    def close(self) -> None:
        self.serving = False
        if self.network.listeners.get((self.host, self.port)) is self:
            del self.network.listeners[(self.host, self.port)]

    async def wait_closed(self) -> None:
        return None

    def get_loop(self) -> SimLoop:
        return self.loop


def _feed(protocol: asyncio.BaseProtocol, data: bytes) -> None:
    if isinstance(protocol, asyncio.BufferedProtocol):
        view = memoryview(data)
        while view:
            buffer = memoryview(protocol.get_buffer(len(view))).cast("B")
            n = min(len(buffer), len(view))
            assert n > 0, "a protocol offered an empty buffer"
            buffer[:n] = view[:n]
            protocol.buffer_updated(n)
            view = view[n:]
    else:
        assert isinstance(protocol, asyncio.Protocol)
        protocol.data_received(data)


class SimTransport(asyncio.Transport):
    """One end of an in-memory connection."""

    def __init__(self, network: Network, loop: SimLoop, host: str, local: tuple[str, int],
                 remote: tuple[str, int], protocol: asyncio.BaseProtocol) -> None:
        super().__init__()
        self.network, self.loop, self.host = network, loop, host
        self.local, self.remote = local, remote
        self.protocol = protocol
        self.peer: SimTransport | None = None
        self.closing = False
        self.lost = False  # connection_lost was delivered (or the process is gone)
        self.reading = True
        self.held: list[bytes] = []  # arrived while reading was paused
        self.last_arrival_s = 0.0  # bytes this end sends arrive in order

    # ------------------------------------------------------------------ asyncio.Transport

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": self.remote, "sockname": self.local}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self.protocol

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        if self.reading:
            return
        self.reading = True
        held, self.held = self.held, []
        for data in held:
            self.loop.call_soon(self._arrive, data, context=host_context(self.host))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return 0, 0

    def write(self, data: Any) -> None:
        if self.closing or not data:
            return
        self.network.send(self, bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(bytes(d) for d in list_of_data))

    def can_write_eof(self) -> bool:
        return False

    def write_eof(self) -> None:
        self.close()

    def close(self) -> None:
        """Graceful: what was written still arrives, then the peer sees the end."""
        if self.closing:
            return
        self.closing = True
        self.loop.call_soon(self._lose, None, context=host_context(self.host))
        if self.peer is not None:
            self.network.schedule(self, self.peer._lose, None)

    def abort(self) -> None:
        """A reset: bytes in flight are lost, the peer sees ConnectionResetError."""
        if self.closing and self.lost:
            return
        self.closing = True
        self.loop.call_soon(self._lose, None, context=host_context(self.host))
        if self.peer is not None:
            self.peer.reset_soon()

    # ------------------------------------------------------------------ the network's side

    def reset_soon(self) -> None:
        """The other end reset: this end learns it after a network delay, and bytes still in
        flight to it are gone."""
        if self.lost:
            return
        self.closing = True
        delay = self.network.latency()
        self.loop.call_later(delay, self._lose, ConnectionResetError("connection reset by peer"),
                             context=host_context(self.host))

    def vanish(self) -> None:
        """This end's process died: nothing more reaches it, nothing of it runs."""
        self.closing = True
        self.lost = True

    def _arrive(self, data: bytes) -> None:
        if self.lost:
            return
        if not self.reading:
            self.held.append(data)
            return
        try:
            _feed(self.protocol, data)
        except Exception as exc:  # as asyncio's transports do: a protocol that fails loses its connection
            self.network.stats["protocol_errors"] += 1
            self.network.errors.append(f"{self.host}: {type(exc).__name__}: {exc}")
            self.abort()

    def _lose(self, exc: Exception | None) -> None:
        if self.lost:
            return
        self.lost = True
        self.closing = True
        self.network.transports.pop(self, None)
        self.protocol.connection_lost(exc)


class Network:
    """Every listener and connection of one simulation, and the network's faults."""

    def __init__(self, rng: random.Random, faults: NetworkFaults | None = None) -> None:
        self.rng = rng
        self.faults = faults or NetworkFaults()
        self.listeners: dict[tuple[str, int], Listener] = {}
        # Insertion-ordered (a set would iterate by object id: crashes would close connections
        # in an order that differs from run to run, and a seed would not replay exactly).
        self.transports: dict[SimTransport, None] = {}
        self.unreachable: set[str] = set()  # partitioned hosts
        self.crashed: set[str] = set()  # hosts whose process died (until one listens there again)
        self.ports: Counter[str] = Counter()
        self.stats: Counter[str] = Counter()
        self.errors: list[str] = []
        self.quiet = False  # faults stopped: latency only

    def latency(self) -> float:
        return self.rng.uniform(*self.faults.latency_s)

    def listen(self, loop: SimLoop, owner: str, factory: Callable[[], asyncio.BaseProtocol], host: str,
               port: int) -> Listener:
        if not port:
            self.ports[host] += 1
            port = 40000 + self.ports[host]
        if (host, port) in self.listeners:
            raise OSError(98, f"address {host}:{port} already in use")
        self.crashed.discard(owner)
        listener = Listener(self, loop, owner, factory, host, port)
        self.listeners[(host, port)] = listener
        return listener

    async def connect(self, loop: SimLoop, from_host: str, factory: Callable[[], asyncio.BaseProtocol], host: str,
                      port: int) -> tuple[SimTransport, asyncio.BaseProtocol]:
        if from_host in self.crashed:
            raise ConnectionRefusedError(111, f"{from_host} crashed: its process cannot connect")
        await asyncio.sleep(self.latency() * 2)
        if host in self.unreachable or from_host in self.unreachable:
            self.stats["connects_hung"] += 1
            await asyncio.sleep(3600.0)  # no SYN-ACK: the caller's deadline ends it
        listener = self.listeners.get((host, port))
        if listener is None or not listener.serving:
            self.stats["connects_refused"] += 1
            raise ConnectionRefusedError(111, f"connection to {host}:{port} refused")
        self.ports[from_host] += 1
        local = (from_host, 50000 + self.ports[from_host])
        client_protocol = factory()
        server_protocol = host_context(listener.owner).run(listener.factory)
        client = SimTransport(self, loop, from_host, local, (host, port), client_protocol)
        server = SimTransport(self, loop, listener.owner, (host, port), local, server_protocol)
        client.peer, server.peer = server, client
        self.transports.update({client: None, server: None})
        self.stats["connections"] += 1
        host_context(listener.owner).run(server_protocol.connection_made, server)
        client_protocol.connection_made(client)
        return client, client_protocol

    def schedule(self, sender: SimTransport, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback`` at the receiving end after the connection's latency, in order
        with what ``sender`` sent before."""
        assert sender.peer is not None
        now = sender.loop.time()
        delay = self.latency()
        if not self.quiet and self.faults.delay_p and self.rng.random() < self.faults.delay_p:
            delay += self.rng.uniform(*self.faults.delay_s)
            self.stats["delayed"] += 1
        # Strictly later than the previous delivery: timers due at one instant run in no set order.
        arrival = max(now + delay, sender.last_arrival_s + 1e-6)
        sender.last_arrival_s = arrival
        sender.loop.call_at(arrival, callback, *args, context=host_context(sender.peer.host))

    def send(self, sender: SimTransport, data: bytes) -> None:
        receiver = sender.peer
        if receiver is None or receiver.lost:
            return
        if receiver.host in self.unreachable or sender.host in self.unreachable:
            self.stats["lost_to_partition"] += 1
            return
        if not self.quiet and self.faults.drop_p and self.rng.random() < self.faults.drop_p:
            self.stats["dropped"] += 1
            # All of it may arrive before the reset: the request ran, its reply is lost, and the
            # caller's retry on a new connection is a duplicate the call ids must absorb.
            kept = data[: self.rng.randrange(len(data) + 1)]
            if kept:
                self.schedule(sender, receiver._arrive, kept)
            self.schedule(sender, receiver._lose, ConnectionResetError("connection reset (simulated loss)"))
            sender.closing = True
            sender.loop.call_later(self.latency(), sender._lose, ConnectionResetError("connection reset (simulated loss)"),
                                   context=host_context(sender.host))
            return
        self.stats["writes"] += 1
        self.schedule(sender, receiver._arrive, data)

    def crash(self, host: str) -> None:
        """``host``'s process dies: its listeners close, its connections reset."""
        self.crashed.add(host)
        for key, listener in list(self.listeners.items()):
            if listener.owner == host:
                listener.close()
        for transport in list(self.transports):
            if transport.host == host:
                transport.vanish()
                self.transports.pop(transport, None)
                if transport.peer is not None:
                    transport.peer.reset_soon()
