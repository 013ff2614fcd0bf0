"""The hello that opens every connection: peers that are not tectofs (or not the kind of
tectofs server expected) are told so in seconds, from both ends."""

from __future__ import annotations

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
from tectofs.protocol import FrameDecoder, FrameKind, encode_frame


@pytest.fixture
def http_server() -> Iterator[str]:
    """A plain HTTP server on an ephemeral loopback port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def silent_server() -> Iterator[str]:
    """Accepts connections, reads whatever comes, never answers."""

    class Silent(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.settimeout(30)
            try:
                while self.request.recv(65536):
                    pass
            except OSError:
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Silent)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def banner_server() -> Iterator[str]:
    """Greets every connection first, like SSH or SMTP servers do."""

    class Banner(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(b"SSH-2.0-OpenSSH\r\n")  # shorter than a frame header
            self.request.settimeout(30)
            try:
                while self.request.recv(65536):
                    pass
            except OSError:
                pass

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Banner)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _cli_ls(address: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "tectofs.cli", "ls", "--meta", address, "/"],
                            capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - started


def test_client_pointed_at_an_http_server_fails_fast(http_server: str) -> None:
    """The issue's case: it used to hang ~5 minutes. An HTTP server waits for a request line
    that never comes, so it is a silent peer to us."""
    result, elapsed = _cli_ls(http_server)
    assert result.returncode != 0
    assert elapsed < 10, elapsed
    assert "did not answer the tectofs hello" in result.stderr, result.stderr


def test_client_pointed_at_a_server_that_speaks_first_fails_fast(banner_server: str) -> None:
    result, elapsed = _cli_ls(banner_server)
    assert result.returncode != 0
    assert elapsed < 10, elapsed
    assert "is not a tectofs server" in result.stderr, result.stderr
    assert "b'SSH-2.0-" in result.stderr  # what answered instead


def test_client_pointed_at_a_silent_port_fails_fast(silent_server: str) -> None:
    result, elapsed = _cli_ls(silent_server)
    assert result.returncode != 0
    assert elapsed < 10, elapsed
    assert "did not answer the tectofs hello" in result.stderr, result.stderr


def test_client_pointed_at_a_closed_port_fails_within_the_connect_timeout() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        result, elapsed = _cli_ls(f"127.0.0.1:{port}")
    assert result.returncode != 0
    assert elapsed < limits.rpc_connect_timeout_s + 10
    assert "cannot connect" in result.stderr, result.stderr


def test_client_pointed_at_a_chunk_server_says_what_it_reached(cluster: Any) -> None:
    chunk_address = cluster.servers()[0]["address"]
    with pytest.raises(errors.ProtocolError, match="is a tectofs chunk server, not a meta server"):
        connect(chunk_address)


def _raw(address: str, data: bytes, timeout_s: float = 10) -> tuple[list[Any], float]:
    host, port = address.rsplit(":", 1)
    started = time.monotonic()
    frames: list[Any] = []
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        if data:
            sock.sendall(data)
        decoder = FrameDecoder()
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not chunk:
                break
            frames.extend(decoder.feed(chunk))
    return frames, time.monotonic() - started


@pytest.mark.parametrize("role", ["meta", "chunk"])
def test_server_closes_a_connection_without_hello(cluster: Any, role: str) -> None:
    address = cluster.address if role == "meta" else cluster.servers()[0]["address"]
    # nothing at all: closed after the hello deadline, with a protocol error that says why
    frames, elapsed = _raw(address, b"")
    assert elapsed < limits.hello_timeout_s + 2
    assert frames and frames[-1].kind == FrameKind.ERROR and "hello" in frames[-1].header["message"]
    # a request before the hello: refused at once
    frames, elapsed = _raw(address, encode_frame(FrameKind.REQUEST, 1, {"op": "ping"}))
    assert elapsed < limits.hello_timeout_s
    assert frames[-1].kind == FrameKind.ERROR and "expected a hello" in frames[-1].header["message"]
    # another protocol version in the hello
    frames, _ = _raw(address, encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "client", "version": 9}))
    assert frames[-1].kind == FrameKind.ERROR and "version" in frames[-1].header["message"]
    # and it keeps serving everyone else
    assert cluster.fs.stat("/").is_dir
