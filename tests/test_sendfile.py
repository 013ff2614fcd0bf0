"""Replies sent from a file with sendfile(2) (``tectofs.wire.sendfile``): the bytes arrive whole;
a file that ends before its region drops that connection only; chunk servers serve large
chunk reads this way, and a chunk damaged on disk is still caught by the reader (end to end)
and rebuilt."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from tectofs import limits
from tectofs.errors import ChecksumMismatch, ConnectionLost
from tectofs.wire import messages
from tectofs.wire.client import RpcClient
from tectofs.wire.sendfile import FileRegion, send_region
from tectofs.wire.server import RpcServer
from tests.rpc_doubles import answering
from tests.test_cluster import flip_byte, wait_for_byte

MiB = 1 << 20


class _FileServer:
    """Answers ``ping`` with a region of one file (every operation else: empty)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.region = (0, 0)
        self.opened: list[FileRegion] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("rpc_"):
            raise AttributeError(name)

        async def answer(request: Any, payload: memoryview) -> tuple[Any, Any]:
            if name != "rpc_ping":
                return messages.Empty(), b""
            region = FileRegion(os.open(self.path, os.O_RDONLY), *self.region)
            self.opened.append(region)
            return messages.PingReply(), region

        return answer


def test_a_region_arrives_whole_and_a_short_file_drops_only_its_connection(tmp_path) -> None:
    data = os.urandom(5 * MiB + 123)
    path = tmp_path / "f"
    path.write_bytes(data)
    handler = _FileServer(str(path))

    async def main() -> None:
        server = RpcServer(handler, "metadata service", messages.META_OPERATIONS, "meta",
            answering(handler.rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0)
        client = RpcClient(connections_per_server=1)
        try:
            handler.region = (4096, len(data) - 4096)
            calls = [client.call(address, messages.PING, messages.Empty()) for _ in range(4)]  # one connection, in turn
            for _, payload in await asyncio.gather(*calls):
                assert bytes(payload) == data[4096:]
            handler.region = (MiB, len(data))  # 1 MiB more than the file has
            with pytest.raises(ConnectionLost):
                await client.call(address, messages.PING, messages.Empty(), retries_max=0)
            handler.region = (0, 1000)
            _, payload = await client.call(address, messages.PING, messages.Empty())  # a new connection: served
            assert bytes(payload) == data[:1000]
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())
    assert all(region.fd == -1 for region in handler.opened)  # every descriptor closed, sent or not


@pytest.mark.slow  # starts processes
def test_over_tls_a_region_is_read_and_encrypted(tmp_path, monkeypatch) -> None:
    """sendfile would bypass TLS: a region answered on a TLS connection goes through the
    transport instead, and its descriptor is still closed."""
    from tectofs.wire import tls

    files = tls.make_test_certificates(str(tmp_path / "tls"))
    monkeypatch.setenv(tls.CERT_ENV, files["cert"])
    monkeypatch.setenv(tls.KEY_ENV, files["key"])
    monkeypatch.setenv(tls.CA_ENV, files["ca"])
    data = os.urandom(3 * MiB + 5)
    path = tmp_path / "f"
    path.write_bytes(data)
    handler = _FileServer(str(path))
    handler.region = (7, len(data) - 7)

    async def main() -> bytes:
        server = RpcServer(handler, "metadata service", messages.META_OPERATIONS, "meta",
            answering(handler.rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0)
        assert server.tls
        client = RpcClient(connections_per_server=1)
        try:
            _, payload = await client.call(address, messages.PING, messages.Empty())
            return bytes(payload)
        finally:
            await client.close()
            await server.close()

    assert asyncio.run(main()) == data[7:]
    assert [region.fd for region in handler.opened] == [-1]


def test_send_region_says_when_the_file_is_short_and_closes_its_socket(tmp_path) -> None:
    import socket

    path = tmp_path / "short"
    path.write_bytes(b"x" * 100)
    a, b = socket.socketpair()
    a.setblocking(False)
    region = FileRegion(os.open(path, os.O_RDONLY), 0, 200)
    dup = os.dup(a.fileno())
    try:
        with pytest.raises(ChecksumMismatch, match="ended 100 bytes before"):
            send_region(dup, b"head", region, lambda: False)
        assert b.recv(1000) == b"head" + b"x" * 100
        with pytest.raises(OSError):
            os.fstat(dup)  # send_region owns the duplicate it was given
    finally:
        region.close()
        a.close()
        b.close()


def test_a_peer_that_stops_reading_is_dropped_and_never_holds_up_others(tmp_path, monkeypatch) -> None:
    """A region to a peer that reads nothing ends at its deadline (stall allowance + bytes at
    the minimum rate) with that connection aborted; meanwhile other clients are served."""
    import socket

    from tectofs.wire.framing import PROTOCOL_VERSION, FrameKind, encode_frame

    monkeypatch.setattr(limits, "send_file_stall_s", 1.0)
    monkeypatch.setattr(limits, "send_file_rate_min_bytes_per_s", 64 * MiB)
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.truncate(64 * MiB)  # more than any socket buffer takes
    handler = _FileServer(str(path))

    async def main() -> float:
        server = RpcServer(handler, "metadata service", messages.META_OPERATIONS, "meta",
            answering(handler.rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0)
        host, port = address.rsplit(":", 1)
        client = RpcClient(connections_per_server=1)
        loop = asyncio.get_running_loop()
        try:
            handler.region = (0, 64 * MiB)
            stuck = socket.create_connection((host, int(port)))
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.sendall(encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": PROTOCOL_VERSION})
                          + encode_frame(FrameKind.REQUEST, 2, {"op": "ping"}))
            started = loop.time()
            await asyncio.sleep(0.5)
            handler.region = (0, 4096)
            _, payload = await asyncio.wait_for(client.call(address, messages.PING, messages.Empty()), 5)  # served meanwhile
            assert bytes(payload) == bytes(4096)
            while handler.opened[0].fd != -1:  # the stuck one's region: closed at its deadline
                assert loop.time() - started < 10, "a peer that reads nothing held its region past the deadline"
                await asyncio.sleep(0.05)
            elapsed = loop.time() - started
            stuck.setblocking(False)
            with pytest.raises((ConnectionResetError, BlockingIOError)):  # aborted: reset, or data then EOF
                while stuck.recv(1 << 20):
                    pass
            stuck.close()
            return elapsed
        finally:
            await client.close()
            await server.close()

    elapsed = asyncio.run(main())
    assert 1.5 < elapsed < 10


def test_regions_are_bounded_per_process_beyond_which_reads_are_checked_here(tmp_path, monkeypatch) -> None:
    from tectofs import checksum
    from tectofs.server.chunk.storage import ChunkStore
    from tectofs.wire import sendfile

    monkeypatch.setattr(limits, "send_file_regions_max", 1)
    store = ChunkStore(str(tmp_path))
    data = os.urandom(2 * MiB)
    store.write(1, 0, memoryview(data), checksum.piece_crcs(data), checksum.crc(data))
    first, crcs, _ = store.serve(1, 0, -1, bytearray, MiB)
    assert isinstance(first, FileRegion) and crcs == checksum.piece_crcs(data)
    second, _, _ = store.serve(1, 0, -1, bytearray, MiB)  # one open already: read and verified here
    assert not isinstance(second, FileRegion) and bytes(second) == data
    first.close()
    first.close()  # idempotent, counted once
    assert sendfile.open_regions() == 0
    third, _, _ = store.serve(1, 65536, MiB, bytearray, MiB)
    assert isinstance(third, FileRegion) and (third.offset, third.length) == (65536, MiB)
    third.close()


def test_large_chunks_are_sent_from_their_files_and_damage_is_still_caught(make_cluster) -> None:
    c = make_cluster(block_size=8 * MiB)  # rs(4,2): chunks of 2 MiB, sent from the file
    data = os.urandom(16 * MiB + 1)
    c.fs.write_bytes("/big", data)
    assert c.fs.read_bytes("/big") == data

    def sent_from_files() -> int:
        total = 0
        for server in c.fs.servers():
            reply, _ = c.fs.run(c.fs.aio.rpc.call_raw(server.address, "stat", {}, idempotent=True))
            total += int(dict(reply.get("stats", {})).get("reads_sent_from_file", 0))
        return total

    assert sent_from_files() >= 8  # the data chunks of two blocks at least
    assert limits.chunk_sendfile_min_bytes <= 2 * MiB
    victim = c.chunk_file("/big", block_index=0, position=1)  # a data chunk: read on every read
    byte = flip_byte(victim, MiB + 7)
    assert c.fs.read_bytes("/big") == data  # the reader caught it and decoded from parity
    wait_for_byte(victim, MiB + 7, byte)  # reported by the reader, rebuilt by the service
    assert c.fs.read_bytes("/big") == data


class _MemoryServer:
    """Answers ``ping`` with ``self.payload`` (bytes in memory)."""

    def __init__(self) -> None:
        self.payload = b""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("rpc_"):
            raise AttributeError(name)

        async def answer(request: Any, payload: memoryview) -> tuple[Any, Any]:
            return (messages.PingReply(), self.payload) if name == "rpc_ping" else (messages.Empty(), b"")

        return answer


def test_large_payloads_from_memory_go_out_on_a_thread_whole_and_in_turn(monkeypatch) -> None:
    """Payloads of ``send_on_thread_min_bytes`` or more leave through a thread (writev), one
    frame at a time per connection; a peer that stops reading is dropped at the deadline while
    others are served."""
    import socket

    import tectofs.wire.transport
    from tectofs.wire.framing import PROTOCOL_VERSION, FrameKind, encode_frame

    threaded: list[int] = []
    real_send = tectofs.wire.transport.send_region

    def counting(fd: int, head: bytes, payload: Any, closing: Any) -> None:
        threaded.append(len(payload))
        real_send(fd, head, payload, closing)

    monkeypatch.setattr(tectofs.wire.transport, "send_region", counting)
    monkeypatch.setattr(limits, "send_file_stall_s", 1.0)
    monkeypatch.setattr(limits, "send_file_rate_min_bytes_per_s", 64 * MiB)
    handler = _MemoryServer()
    data = os.urandom(8 * MiB + 5)

    async def main() -> None:
        server = RpcServer(handler, "metadata service", messages.META_OPERATIONS, "meta",
            answering(handler.rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0)
        host, port = address.rsplit(":", 1)
        client = RpcClient(connections_per_server=1)
        try:
            handler.payload = data
            for _, payload in await asyncio.gather(*[client.call(address, messages.PING, messages.Empty()) for _ in range(4)]):
                assert bytes(payload) == data
            assert threaded == [len(data)] * 4
            handler.payload = bytes(64 * MiB)  # more than any socket buffer takes
            stuck = socket.create_connection((host, int(port)))
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.sendall(encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": PROTOCOL_VERSION})
                          + encode_frame(FrameKind.REQUEST, 2, {"op": "ping"}))
            await asyncio.sleep(0.5)
            handler.payload = b"small"
            _, payload = await asyncio.wait_for(client.call(address, messages.PING, messages.Empty()), 5)  # served meanwhile
            assert bytes(payload) == b"small"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10  # the frame's deadline is 1 s + 64 MiB at 64 MiB/s
            while len(server.connections) > 1:  # the stuck peer's connection is dropped, the client's kept
                assert loop.time() < deadline, "a peer that reads nothing held its connection past the deadline"
                await asyncio.sleep(0.05)
            _, payload = await asyncio.wait_for(client.call(address, messages.PING, messages.Empty()), 5)
            assert bytes(payload) == b"small"
            stuck.close()
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())


def test_with_every_send_thread_taken_large_payloads_go_through_the_transport(monkeypatch) -> None:
    import tectofs.wire.transport

    threaded: list[int] = []
    monkeypatch.setattr(tectofs.wire.transport, "send_region", lambda *a: threaded.append(1))
    monkeypatch.setattr(limits, "send_buffer_threads", 0)  # all taken (peers slow to read, say)
    handler = _MemoryServer()
    handler.payload = os.urandom(3 * MiB)

    async def main() -> None:
        server = RpcServer(handler, "metadata service", messages.META_OPERATIONS, "meta",
            answering(handler.rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0)
        client = RpcClient(connections_per_server=1)
        try:
            _, payload = await asyncio.wait_for(client.call(address, messages.PING, messages.Empty()), 10)
            assert bytes(payload) == handler.payload
        finally:
            await client.close()
            await server.close()

    asyncio.run(main())
    assert threaded == []
