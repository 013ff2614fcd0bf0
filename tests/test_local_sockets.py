"""Local sockets (``tectofs.wire.local_sockets``): a client on a server's host moves to the server's
abstract Unix socket after the first TCP hello; the same gatekeeping applies there; it falls
back to TCP when the socket is gone; and nothing of it reaches peers on other hosts or TLS."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any

import pytest

from tectofs import limits
from tectofs.wire import local_sockets, messages
from tectofs.wire.client import RpcClient
from tectofs.wire.framing import Frame, FrameDecoder, FrameKind, encode_frame
from tectofs.wire.server import RpcServer
from tests.rpc_doubles import answering
from tests.test_exhaustion import _Handler
from tests.test_hello import frames_until_closed


def _families(client: RpcClient, address: str) -> list[str]:
    return [c.transport.get_extra_info("socket").family.name for c in client._pools.get(address, [])
            if c.transport is not None]


def test_a_client_on_the_servers_host_moves_to_its_local_socket() -> None:
    async def main() -> None:
        server = RpcServer(_Handler(), "metadata service", messages.META_OPERATIONS, "meta",
            answering(_Handler().rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0)
        client = RpcClient()
        try:
            assert local_sockets.valid_name(server.local_name)
            for _ in range(3):
                await client.call(address, messages.PING, messages.Empty())
            assert _families(client, address) == ["AF_UNIX"]
            # Its buffers are enlarged (not autotuned like TCP's), up to what the kernel allows.
            transport = client._pools[address][0].transport
            assert transport is not None  # a connection in the pool is open
            sock = transport.get_extra_info("socket")
            with open("/proc/sys/net/core/wmem_max") as f:
                allowed = min(int(f.read()), limits.local_socket_buffer_bytes)
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= allowed
            # Several calls at once open more connections: every one on the local socket.
            await asyncio.gather(*(client.call_raw(address, "statfs") for _ in range(20)))
            assert set(_families(client, address)) == {"AF_UNIX"}
            # The server counts them like any other (connection limits apply the same), and the
            # retired TCP connection is closed.
            deadline = time.monotonic() + 10
            while len(server.guard.per_peer.get("127.0.0.1", ())) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert len(server.guard.per_peer.get("127.0.0.1", ())) == 0
            assert len(server.guard.per_peer.get("local", ())) == len(_families(client, address))
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())


def test_with_local_sockets_off_everything_stays_on_tcp(monkeypatch: Any) -> None:
    async def main(client_off: bool) -> None:
        server = RpcServer(_Handler(), "metadata service", messages.META_OPERATIONS, "meta",
            answering(_Handler().rpc_ping, messages.META_OPERATIONS))
        if not client_off:
            monkeypatch.setenv(local_sockets.ENV, "0")  # the server offers no name
        address = await server.start("127.0.0.1", 0)
        monkeypatch.setenv(local_sockets.ENV, "0" if client_off else "1")
        client = RpcClient()
        try:
            assert bool(server.local_name) == client_off
            await client.call(address, messages.PING, messages.Empty())
            await client.call(address, messages.PING, messages.Empty())
            assert _families(client, address) == ["AF_INET"]
        finally:
            await client.close()
            await server.close()

    asyncio.run(main(client_off=True))
    asyncio.run(main(client_off=False))


def test_a_server_restarted_on_its_port_is_reached_by_tcp_then_by_its_new_socket() -> None:
    async def main() -> None:
        first = RpcServer(_Handler(), "metadata service", messages.META_OPERATIONS, "meta",
            answering(_Handler().rpc_ping, messages.META_OPERATIONS))
        address = await first.start("127.0.0.1", 0)
        port = int(address.rsplit(":", 1)[1])
        client = RpcClient()
        try:
            await client.call(address, messages.PING, messages.Empty())
            old_name = first.local_name
            assert client._local[address] == (old_name, os.getpid())  # (in-process server: our pid)
            await first.close()
            second = RpcServer(_Handler(), "metadata service", messages.META_OPERATIONS, "meta",
                answering(_Handler().rpc_ping, messages.META_OPERATIONS))
            await second.start("127.0.0.1", port)
            try:
                assert second.local_name != old_name
                await client.call(address, messages.PING, messages.Empty())  # the old name refuses: TCP, then asked anew
                assert client._local[address][0] == second.local_name
                await client.call(address, messages.PING, messages.Empty())
                assert "AF_UNIX" in _families(client, address)
            finally:
                await second.close()
        finally:
            await client.close()

    asyncio.run(main())


def _exchange(name: str, data: bytes, timeout_s: float = 10) -> list[Any]:
    """Send ``data`` on the local socket ``name``; the frames that come back until it closes."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(local_sockets.abstract_path(name))
        sock.sendall(data)
        return frames_until_closed(sock)


def _offered_name(address: str) -> str:
    """The local socket name a chunk server offers a raw TCP hello from this host."""
    host, port = address.rsplit(":", 1)
    hello = encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": 1})
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(hello)
        decoder = FrameDecoder()
        got: list[Frame] = []
        while not got:
            got.extend(decoder.feed(sock.recv(65536)))
    return str(got[0].header["local"])


def test_the_local_socket_keeps_the_same_gates(cluster: Any) -> None:
    """A chunk server's local socket refuses what its TCP port refuses: a request before the
    hello, garbage, and a put without a capability; and it keeps serving everyone."""
    name = _offered_name(cluster.servers()[0].address)
    assert local_sockets.valid_name(name)
    frames = _exchange(name, encode_frame(FrameKind.REQUEST, 1, {"op": "ping"}))
    assert frames[-1].kind == FrameKind.ERROR and "expected a hello" in frames[-1].header["message"]
    frames = _exchange(name, b"GET / HTTP/1.1\r\n\r\n" + bytes(64))
    assert frames and frames[-1].kind == FrameKind.ERROR
    hello = encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": 1})
    put = encode_frame(FrameKind.REQUEST, 2, {"op": "put_chunk", "block_id": "x", "position": 0, "crcs": [], "crc": 0},
                       4096) + bytes(4096)
    started = time.monotonic()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(local_sockets.abstract_path(name))
        sock.sendall(hello + put)
        decoder = FrameDecoder()
        got: list[Frame] = []
        while len(got) < 2 and time.monotonic() - started < 10:
            got.extend(decoder.feed(sock.recv(65536)))
    assert got[0].kind == FrameKind.RESPONSE and got[0].header["local"] == ""  # offered over TCP only
    assert got[1].kind == FrameKind.ERROR and got[1].header["code"] == "capability"
    data = os.urandom(3 << 20)
    cluster.fs.write_bytes("/after-local-probes", data)
    assert cluster.fs.read_bytes("/after-local-probes") == data


def test_a_name_bound_by_another_process_is_not_trusted(cluster: Any) -> None:
    """Once a server exits, anyone on the host may bind its name: the client checks the peer's
    process id (SO_PEERCRED) against the one the server gave over TCP, refuses the impostor
    without sending it a byte, and carries on by TCP."""
    fs = cluster.fs
    data = os.urandom(3 << 20)
    fs.write_bytes("/impostor", data)
    assert fs.read_bytes("/impostor") == data
    rpc = fs.aio.rpc
    chunk_address = cluster.servers()[0].address
    real_name, real_pid = rpc._local[chunk_address]
    assert real_pid != os.getpid()
    impostor_name = local_sockets.new_name("chunk")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as impostor:
        impostor.bind(local_sockets.abstract_path(impostor_name))
        impostor.listen(16)
        impostor.settimeout(0.5)

        async def call_through_impostor() -> None:
            rpc._local[chunk_address] = (impostor_name, real_pid)
            for conn in rpc._pools.get(chunk_address, []):
                conn.close()
            await rpc.call(chunk_address, messages.PING, messages.Empty())  # a new connection to that very server

        fs.run(call_through_impostor())
        assert fs.read_bytes("/impostor") == data
        assert impostor_name in rpc._local_refused
        accepted, _ = impostor.accept()  # the kernel connected it; the client sent nothing
        with accepted:
            accepted.settimeout(0.5)
            try:
                assert accepted.recv(100) == b""
            except socket.timeout:
                pass
    assert fs.read_bytes("/impostor") == data
    assert rpc._local.get(chunk_address, ("", 0))[0] in ("", real_name)


class _Transport:
    def __init__(self, family: socket.AddressFamily, peer: Any, own: Any) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.info = {"peername": peer, "sockname": own, "socket": self.sock}

    def get_extra_info(self, key: str) -> Any:
        return self.info.get(key)


@pytest.mark.parametrize(("family", "peer", "own", "same"), [
    (socket.AF_INET, ("127.0.0.1", 5000), ("127.0.0.1", 6000), True),
    (socket.AF_INET, ("127.0.0.5", 5000), ("127.0.0.1", 6000), True),  # any loopback address
    (socket.AF_INET, ("10.1.2.3", 5000), ("10.1.2.3", 6000), True),  # one of this host's own addresses
    (socket.AF_INET, ("10.1.2.4", 5000), ("10.1.2.3", 6000), False),  # another host
    (socket.AF_INET6, ("::1", 5000, 0, 0), ("::1", 6000, 0, 0), True),
    (socket.AF_INET6, ("fe80::2", 5000, 0, 2), ("fe80::1", 6000, 0, 2), False),
    (socket.AF_INET6, ("::ffff:127.0.0.1", 5000, 0, 0), ("::ffff:127.0.1.1", 6000, 0, 0), True),  # server on "::"
    (socket.AF_INET6, ("::ffff:10.1.2.4", 5000, 0, 0), ("::ffff:10.1.2.3", 6000, 0, 0), False),
    (socket.AF_UNIX, "", "", False),  # already local: nothing to offer
])
def test_the_offer_goes_only_to_peers_on_the_same_host(family: socket.AddressFamily, peer: Any, own: Any,
                                                         same: bool) -> None:
    transport = _Transport(family, peer, own)
    try:
        assert local_sockets.same_host(transport) is same  # type: ignore[arg-type]
    finally:
        transport.sock.close()


def test_a_tls_server_offers_no_local_socket(make_cluster: Any) -> None:
    c = make_cluster(tls=True)
    c.fs.write_bytes("/f", b"x" * 100)
    assert c.fs.read_bytes("/f") == b"x" * 100
    rpc = c.fs.aio.rpc
    families = {f for address in list(rpc._pools) for f in _families(rpc, address)}
    assert families == {"AF_INET"}
    offers = {conn.local_offer for pool in rpc._pools.values() for conn in pool}
    assert offers == {""}  # the servers offered none (the client, with TLS, would take none either)
    assert not rpc.local_sockets


def test_names_from_a_peer_are_checked() -> None:
    assert local_sockets.valid_name(local_sockets.new_name("chunk"))
    for bad in ["", "other-name", "tectofs-" + "x" * 200, "tectofs-\0x", "tectofs-\u00e9"]:
        assert not local_sockets.valid_name(bad)
