"""What both sides of the RPC layer share: the framed connection (``FramedProtocol``: the
decoder, write flow control, payloads sent in slices or by a thread) and the addresses, names and
types of both ends. ``tectofs.wire.server`` (the server) and ``tectofs.wire.client`` (the client) build on
it; neither imports the other, so the client library never imports the server's module."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from tectofs import limits
from tectofs.errors import ChecksumMismatch, ConnectionLost, InvalidArgument, ProtocolError, TectofsError, Timeout
from tectofs.wire.framing import Frame, FrameDecoder, FrameKind, PayloadAllocator, encode_frame
from tectofs.wire.sendfile import (
    FileRegion,
    buffer_pool,
    read_region,
    release_buffer_send,
    reserve_buffer_send,
    send_region,
)
from tectofs.wire.sendfile import pool as sendfile_pool

log = logging.getLogger("tectofs.wire.server")

Payload = bytes | bytearray | memoryview
ReplyPayload = Payload | FileRegion  # what a handler may answer with: a buffer, or a file region (tectofs.wire.sendfile)
_SEND_SLICE_BYTES = 1 << 20
Reply = tuple[Any, Payload]  # a reply as received
SOFTWARE = "tectofs 0.1"


class HelloTimeout(Timeout):
    """A peer accepted the connection but did not answer the hello in time."""


class WrongPeer(ProtocolError):
    """The peer answered the hello as no tectofs server of the expected role does: the address
    names another program, or another role (a configuration error; ``tectofs`` exits 2)."""


def parse_address(address: str) -> tuple[str, int]:
    """``"HOST:PORT"`` -> ``(host, port)``; raises InvalidArgument with the bad text."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgument(f"bad address {address!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def parse_group(group: str) -> list[str]:
    """``"HOST:PORT,HOST:PORT,..."`` (a failover group of equivalent servers; one address is a
    group of one) -> its member addresses, in order; raises InvalidArgument with the bad text."""
    members = [m.strip() for m in group.split(",")]
    if len(members) > limits.address_group_members_max:
        raise InvalidArgument(f"bad address group {group[:200]!r}: more than {limits.address_group_members_max} members")
    if len(set(members)) != len(members):
        raise InvalidArgument(f"bad address group {group!r}: an address is named twice")
    for member in members:
        parse_address(member)
    return members



class FramedProtocol(asyncio.BufferedProtocol):
    """Shared plumbing: decoder, write flow control, close handling."""

    def __init__(self, allocate_payload: PayloadAllocator | None = None) -> None:
        self.decoder = FrameDecoder(allocate_payload) if allocate_payload else FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._send_lock = asyncio.Lock()
        self.sending_file = False  # a thread is sending a frame on this socket: write nothing
        self.bytes_received = 0
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self._can_write.set()
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        now = time.monotonic()  # for a server's stall, progress and idle timeouts (tectofs.wire.connlimits)
        if not self.decoder.mid_frame:
            self.frame_started_s = now
        self.received_s = now
        self.bytes_received += nbytes
        try:
            frames = self.decoder.advance(nbytes)
        except ProtocolError as exc:
            self.protocol_failed(exc)
            return
        for frame in frames:
            self.frame_received(frame)

    def frame_received(self, frame: Frame) -> None:
        raise NotImplementedError

    def protocol_failed(self, exc: TectofsError) -> None:
        raise NotImplementedError

    async def send(self, kind: FrameKind, request_id: int, header: Any, payload: ReplyPayload = b"") -> None:
        await self.send_encoded(encode_frame(kind, request_id, header, len(payload)), payload)

    async def send_encoded(self, head: bytes, payload: ReplyPayload = b"") -> None:
        """Send a frame whose header ``encode_frame`` made, then its payload."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionLost("connection closed")
        plain = transport.get_extra_info("ssl_object") is None
        if isinstance(payload, FileRegion):
            if plain:
                async with self._send_lock:
                    await self._writable(transport)
                    await self._send_on_thread(transport, head, payload)
                return
            # TLS: the bytes must pass through the encrypting transport (the caller still
            # owns and closes the region)
            payload = await asyncio.get_running_loop().run_in_executor(sendfile_pool(), read_region, payload)
        view = memoryview(payload).cast("B") if payload else None
        async with self._send_lock:
            await self._writable(transport)
            if view is not None and plain and len(view) >= limits.send_on_thread_min_bytes and reserve_buffer_send():
                # A large payload in memory: a thread writes it in a few large writev(2) calls,
                # the event loop meanwhile free (far less CPU than slices through the transport).
                try:
                    await self._send_on_thread(transport, head, view)
                finally:
                    release_buffer_send()
                return
            # The transport copies what the socket does not take at once into a bytearray and
            # memmoves it forward after every send: handing it a 16 MiB payload costs far more
            # than the payload itself. So payloads go in slices, each once the buffer drained,
            # and a lock keeps concurrent frames from interleaving.
            transport.write(head)
            if view is None:
                return
            for offset in range(0, len(view), _SEND_SLICE_BYTES):
                if offset:
                    await self._writable(transport)
                transport.write(view[offset : offset + _SEND_SLICE_BYTES])

    async def _send_on_thread(self, transport: asyncio.Transport, head: bytes, payload: "FileRegion | memoryview") -> None:
        """A frame sent by a thread, not the transport: once the transport's buffer is empty (the
        send lock is held and ``sending_file`` makes error paths abort rather than write, so
        nothing else reaches the socket meanwhile), a thread writes the header and the payload —
        a file region with sendfile(2) (on ``tectofs.wire.sendfile.pool``), a buffer with writev(2)
        (on ``buffer_pool``) — waiting for room with poll(2). Whatever goes wrong — a stalled or
        too slow peer, a short file, a cancellation — the frame is incomplete: the connection is
        aborted and ConnectionLost raised; a cancelled send waits for its thread first (it reads
        the payload)."""
        self.sending_file = True
        try:
            deadline = time.monotonic() + limits.send_file_stall_s
            pause = 0.0005
            while transport.get_write_buffer_size():  # earlier frames must leave first (usually none)
                if transport.is_closing() or time.monotonic() > deadline:
                    raise ConnectionLost("the peer stopped reading before a frame could be sent")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.02)
            sock = transport.get_extra_info("socket")
            threads = sendfile_pool() if isinstance(payload, FileRegion) else buffer_pool()
            sending = asyncio.get_running_loop().run_in_executor(
                threads, send_region, os.dup(sock.fileno()), head, payload, transport.is_closing)
            # A cancelled send raises CancelledError, not the thread's failure: retrieved here, so
            # an interrupted put does not end with "Future exception was never retrieved".
            sending.add_done_callback(lambda done: done.cancelled() or done.exception())
            try:
                await asyncio.shield(sending)
            except asyncio.CancelledError:
                transport.abort()
                await asyncio.wait([sending])  # the thread reads the payload: let it stop
                raise
        except BaseException as exc:
            transport.abort()
            if isinstance(exc, ChecksumMismatch):
                log.error("a file region could not be sent whole (%s): the file is shorter than its footer said", exc)
            if isinstance(exc, (TectofsError, OSError)):
                raise ConnectionLost(f"frame not sent: {exc}") from None
            raise
        finally:
            self.sending_file = False

    async def _writable(self, transport: asyncio.Transport) -> None:
        await self._can_write.wait()
        if transport.is_closing():
            raise ConnectionLost("connection closed")

