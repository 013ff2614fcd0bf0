"""The hello that opens every connection: peers that are not tectofs (or not the kind of
tectofs server expected) are told so in seconds, from both ends."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import socket
import socketserver
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import pytest

from tectofs import errors, limits
from tectofs.client import connect
from tectofs.wire import messages
from tectofs.wire.connlimits import ConnectionPolicy
from tectofs.wire.framing import Frame, FrameDecoder, FrameKind, encode_frame
from tectofs.wire.server import RpcServer
from tests.rpc_doubles import answering
from tests.test_exhaustion import _Handler as _Silent  # answers anything; never reached here


@contextlib.contextmanager
def _serving(server: socketserver.TCPServer) -> Iterator[str]:
    """Run ``server`` on a thread; yield its loopback address; shut it down after."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _tcp_server(greeting: bytes) -> socketserver.ThreadingTCPServer:
    """Sends ``greeting`` (maybe nothing) to each connection, then reads and never answers."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(greeting)
            self.request.settimeout(30)
            try:
                while self.request.recv(65536):
                    pass
            except OSError:
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    return server


@pytest.fixture
def http_server() -> Iterator[str]:
    """A plain HTTP server on an ephemeral loopback port."""
    with _serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)) as address:
        yield address


@pytest.fixture
def silent_server() -> Iterator[str]:
    with _serving(_tcp_server(b"")) as address:
        yield address


@pytest.fixture
def banner_server() -> Iterator[str]:
    """Greets every connection first, like SSH or SMTP servers do."""
    with _serving(_tcp_server(b"SSH-2.0-OpenSSH\r\n")) as address:  # shorter than a frame header
        yield address


def _cli_ls(address: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tectofs.cli", "ls", "--meta", address, "/"],
                            capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - started


@pytest.mark.slow  # starts processes
def test_client_pointed_at_an_http_server_fails_fast(http_server: str) -> None:
    """The issue's case: it used to hang ~5 minutes. An HTTP server waits for a request line
    that never comes, so it is a silent peer to us."""
    result, elapsed = _cli_ls(http_server)
    assert result.returncode != 0
    assert elapsed < 10, elapsed
    assert "did not answer the tectofs hello" in result.stderr, result.stderr


@pytest.mark.slow  # starts processes
def test_client_pointed_at_a_server_that_speaks_first_fails_fast(banner_server: str) -> None:
    result, elapsed = _cli_ls(banner_server)
    assert result.returncode != 0
    assert elapsed < 10, elapsed
    assert "is not a tectofs server" in result.stderr, result.stderr
    assert "b'SSH-2.0-" in result.stderr  # what answered instead


@pytest.mark.slow  # starts processes
def test_client_pointed_at_a_silent_port_fails_fast(silent_server: str) -> None:
    result, elapsed = _cli_ls(silent_server)
    assert result.returncode != 0
    assert elapsed < 10, elapsed
    assert "did not answer the tectofs hello" in result.stderr, result.stderr


@pytest.mark.slow  # starts processes
def test_client_pointed_at_a_closed_port_fails_within_the_connect_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        result, elapsed = _cli_ls(f"127.0.0.1:{port}")
    assert result.returncode != 0
    assert elapsed < limits.rpc_connect_timeout_s + 10
    assert "cannot connect" in result.stderr, result.stderr


def test_client_pointed_at_a_chunk_server_says_what_it_reached(cluster: Any) -> None:
    chunk_address = cluster.servers()[0].address
    with pytest.raises(errors.ProtocolError, match="is a tectofs chunk server, not a meta server"):
        connect(chunk_address)


def _raw(address: str, data: bytes, timeout_s: float = 10) -> tuple[list[Any], float]:
    host, port = address.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        if data:
            sock.sendall(data)
        frames = frames_until_closed(sock)
    return frames, time.monotonic() - started


def frames_until_closed(sock: socket.socket) -> list[Any]:
    """The frames ``sock`` receives until the peer closes it, resets it, or its timeout passes."""
    frames: list[Any] = []
    decoder = FrameDecoder()
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            break
        if not chunk:
            break
        frames.extend(decoder.feed(chunk))
    return frames


def test_a_connection_that_says_nothing_is_closed_at_the_hello_deadline() -> None:
    """Nothing at all: closed after the hello deadline (``ConnectionPolicy.hello_wait_s``, 10 s
    by default; 1.5 s here), with an error that says why."""

    async def main() -> tuple[list[Any], float]:
        server = RpcServer(_Silent(), "metadata service", messages.META_OPERATIONS, "meta",
            answering(_Silent().rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0, ConnectionPolicy(hello_wait_s=1.5))
        try:
            return await asyncio.to_thread(_raw, address, b"", 10)
        finally:
            await server.close()

    frames, elapsed = asyncio.run(main())
    assert 1.0 < elapsed < 4
    assert frames and frames[-1].kind == FrameKind.ERROR and "no tectofs hello within 1.5 s" in frames[-1].header["message"]
    assert ConnectionPolicy().hello_wait_s == limits.hello_wait_server_s


@pytest.mark.parametrize("role", ["meta", "chunk"])
def test_server_refuses_a_request_before_the_hello(cluster: Any, role: str) -> None:
    address = cluster.address if role == "meta" else cluster.servers()[0].address
    # a request before the hello: refused at once
    frames, elapsed = _raw(address, encode_frame(FrameKind.REQUEST, 1, {"op": "ping"}))
    assert elapsed < 2
    assert frames[-1].kind == FrameKind.ERROR and "expected a hello" in frames[-1].header["message"]
    # another protocol version in the hello
    frames, _ = _raw(address, encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "client", "version": 9}))
    assert frames[-1].kind == FrameKind.ERROR and "version" in frames[-1].header["message"]
    # and it keeps serving everyone else
    assert cluster.fs.stat("/").is_dir


def _greeted(address: str, *frames: bytes) -> list[Any]:
    hello = encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": 1})
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(hello + b"".join(frames))
        decoder = FrameDecoder()
        got: list[Frame] = []
        while len(got) < 1 + len(frames):
            got.extend(decoder.feed(sock.recv(65536)))
    return got[1:]


def test_a_payload_where_none_belongs_is_invalid_not_busy(cluster: Any) -> None:
    chunk_address = cluster.servers()[0].address
    payload = b"x" * 1000
    (reply,) = _greeted(chunk_address, encode_frame(FrameKind.REQUEST, 2, {"op": "get_chunk", "block_id": 1},
                                                    len(payload)) + payload)
    assert reply.kind == FrameKind.ERROR
    assert reply.header["code"] == "invalid_argument" and "takes no payload" in reply.header["message"]
    # an invalid put gives back what it reserved: the server still admits puts afterwards
    for batch in range(12):  # 600 MiB in all, past the server's 512 MiB in-flight limit
        puts = [encode_frame(FrameKind.REQUEST, 10 + i, {"op": "put_chunk", "block_id": "x", "position": 0, "crcs": [],
                                                         "crc": 0}, 1 << 20) + bytes(1 << 20) for i in range(50)]
        replies = _greeted(chunk_address, *puts)
        # refused before admission (no capability: tests/test_security.py), never "busy": nothing leaked
        assert {r.header["code"] for r in replies} == {"capability"}
    stat = cluster.fs.run(cluster.fs.aio.rpc.call_raw(chunk_address, "stat", {}))[0]
    assert stat["inflight"] == 0


def test_a_put_before_the_hello_reserves_nothing(cluster: Any) -> None:
    chunk_address = cluster.servers()[0].address
    put = encode_frame(FrameKind.REQUEST, 1, {"op": "put_chunk", "block_id": 1, "position": 0, "crcs": [], "crc": 0},
                       1 << 20) + bytes(1 << 20)
    for _ in range(3):
        frames, _ = _raw(chunk_address, put)
        assert frames[-1].kind == FrameKind.ERROR and "expected a hello" in frames[-1].header["message"]
    stat = cluster.fs.run(cluster.fs.aio.rpc.call_raw(chunk_address, "stat", {}))[0]
    assert stat["inflight"] == 0
