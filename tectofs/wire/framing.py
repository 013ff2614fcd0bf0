"""Sans-I/O codec for the tectofs wire protocol.

A frame is::

    fixed header (32 bytes, big endian)
        magic          u32   0x54465331 ("TFS1")
        version        u8    PROTOCOL_VERSION
        kind           u8    FrameKind (REQUEST, RESPONSE, ERROR)
        flags          u16   reserved, must be 0
        request_id     u64   chosen by the requester, echoed in the reply
        header_length  u32   bytes of the msgpack header that follows
        payload_length u64   bytes of raw payload after the header
    header_crc     u32   crc32c of the 28 bytes above and of the msgpack header
    msgpack header (a map; requests carry "op")
    raw payload    (chunk bytes; integrity is covered end to end by chunk checksums)

No sockets here: :class:`FrameDecoder` hands out the buffer the next bytes must be received
into (``get_buffer``), is told how many arrived (``advance``), and returns complete
:class:`Frame` objects. That fits ``asyncio.BufferedProtocol`` and ``socket.recv_into``
alike, so payloads land in their final buffer without intermediate copies, and the codec can
be tested and fuzzed in memory.

Memory follows the bytes that arrived, never a size a peer declared: a msgpack header is
received into pieces that grow with what arrived (from ``limits.frame_receive_first_bytes``),
and a payload whose allocator defers its buffer (returns a function that makes it) is staged
the same way until 1/``limits.frame_payload_amplification_max`` of it arrived; only then is
its final buffer made and the rest received straight into it. Refused payloads are drained
into one small scratch buffer shared by the whole process.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, TypeAlias

import crc32c
import msgspec

from tectofs import limits
from tectofs.errors import ProtocolError, to_wire

MAGIC = 0x54465331
PROTOCOL_VERSION = 1
_FIXED = struct.Struct(">IBBHQIQ")
_CRC = struct.Struct(">I")
FIXED_HEADER_BYTES = _FIXED.size + _CRC.size  # 32
_MAGIC_BYTES = MAGIC.to_bytes(4, "big")


class FrameKind(enum.IntEnum):
    REQUEST = 1
    RESPONSE = 2
    ERROR = 3


FrameHeader: TypeAlias = "dict[str, Any]"  # loose dict: the peer's map, unchecked until a Struct converts it
"""A frame's header as msgpack decoded it (or as this side built it to send): the peer's own
map, not yet checked. What acts on a request converts it to its operation's declared Struct
(``messages.convert``); the few fields read before that (``op``, and a put's ``cap`` and
``block_id`` when its payload is admitted) are checked where they are read. The wire's one
untyped map, named here so that each place holding one says so."""


@dataclass
class Frame:
    kind: FrameKind
    request_id: int
    header: FrameHeader
    payload: memoryview = field(default_factory=lambda: memoryview(b""))
    discarded: bool = False  # the payload allocator refused the payload: it was drained, not kept


_encode_header = msgspec.msgpack.Encoder().encode


def encode_frame(kind: FrameKind, request_id: int, header: Any, payload_length: int = 0) -> bytes:
    """Encode everything but the payload; the caller sends ``payload_length`` bytes after it.
    ``header`` is a map: a dict, or a message (``tectofs.wire.messages``)."""
    body = _encode_header(header)
    if len(body) > limits.frame_header_max_bytes:
        raise ProtocolError(f"frame header of {len(body)} bytes exceeds the limit")
    if payload_length > limits.frame_payload_max_bytes:
        raise ProtocolError(f"payload of {payload_length} bytes exceeds the frame limit")
    fixed = _FIXED.pack(MAGIC, PROTOCOL_VERSION, int(kind), 0, request_id, len(body), payload_length)
    crc = crc32c.crc32c(body, crc32c.crc32c(fixed))
    return fixed + _CRC.pack(crc) + body


Buffer: TypeAlias = "bytearray | memoryview"
def encode_error(request_id: int, exc: BaseException) -> bytes:
    """An ERROR frame carrying ``exc`` (request id 0: about the connection as a whole)."""
    code, message = to_wire(exc)
    return encode_frame(FrameKind.ERROR, request_id, {"code": code, "message": message})


PayloadAllocator = Callable[[FrameHeader, int], "Buffer | Scatter | Callable[[], Buffer] | None"]
"""Given a frame's header and payload length, return the buffer to receive it into; or a
``Scatter`` of the caller's buffers (the frame is then delivered with an empty ``payload``:
the bytes are where the scatter put them); or a function that makes that buffer, called once
a bounded fraction of the payload arrived (the buffer's memory is then committed as bytes
arrive; the bytes before are copied in once); or None to receive and discard it (the frame is
then delivered with an empty ``payload`` and ``discarded`` set)."""


def default_allocator(header: FrameHeader, length: int) -> Callable[[], bytearray]:
    """A new bytearray, made once a bounded part of the payload arrived (``staged_bytes``)."""
    return lambda: bytearray(length)


def staged_bytes(length: int) -> int:
    """How much of a ``length``-byte payload with a deferred buffer is received before that
    buffer is made."""
    return min(length, max(limits.frame_payload_staged_min_bytes, length // limits.frame_payload_amplification_max))


_SCRATCH = memoryview(bytearray(limits.frame_drain_scratch_bytes))  # drained bytes are never read: one for all


class Scatter:
    """A payload received straight into the caller's buffers: ``views`` in order, as many
    bytes as they hold together (no copy from a receive buffer afterwards).

    ``divert()`` makes every byte still to come go to scratch memory instead: a caller that
    stops waiting for the payload (cancelled, timed out, answered by another server) calls it
    before it hands the buffers on, so a reply arriving late never writes into memory that is
    no longer its own. Everything runs on the event loop's thread: once ``divert()`` returned,
    no later byte lands in ``views``."""

    __slots__ = ("views", "total", "filled", "diverted", "_index", "_at")

    def __init__(self, views: list[memoryview]) -> None:
        self.views = [v for v in views if len(v)]
        self.total = sum(len(v) for v in self.views)
        self.filled = 0
        self.diverted = False
        self._index = 0
        self._at = 0

    @property
    def complete(self) -> bool:
        """Every byte arrived, and went into ``views``."""
        return self.filled == self.total and not self.diverted

    def region(self) -> memoryview:
        """Where the next bytes go (never empty before the payload is complete)."""
        if self.diverted:
            return _SCRATCH[: min(len(_SCRATCH), self.total - self.filled)]
        return self.views[self._index][self._at :]

    def advance(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.diverted:
            return
        self._at += nbytes
        if self._at == len(self.views[self._index]):
            self._index += 1
            self._at = 0

    def divert(self) -> None:
        """From now on, what is still to come goes to scratch (nothing, if all of it arrived),
        and the caller's buffers are let go."""
        if self.filled < self.total:
            self.diverted = True
            self.views = []


class _Pieces:
    """``total`` bytes received into pieces, each at most as large as what arrived before it
    (and at least ``first``): a peer that declares much and sends little commits little. Each
    byte is copied at most once more, when the pieces are joined."""

    __slots__ = ("total", "first", "filled", "pieces", "_room")

    def __init__(self, total: int, first: int = limits.frame_receive_first_bytes) -> None:
        self.total = total
        self.first = first
        self.filled = 0
        self.pieces: list[bytearray] = []
        self._room = 0  # unfilled bytes at the end of the last piece

    @property
    def complete(self) -> bool:
        return self.filled == self.total

    def region(self) -> memoryview:
        if not self._room:
            size = min(self.total - self.filled, max(self.first, self.filled))
            self.pieces.append(bytearray(size))
            self._room = size
        last = self.pieces[-1]
        return memoryview(last)[len(last) - self._room :]

    def advance(self, nbytes: int) -> None:
        self._room -= nbytes
        self.filled += nbytes

    def join(self) -> "bytes | bytearray":
        return self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)

    def copy_into(self, target: memoryview) -> None:
        offset = 0
        for piece in self.pieces:
            target[offset : offset + len(piece)] = piece
            offset += len(piece)


class FrameDecoder:
    """Incremental frame parser. Feed it with ``get_buffer`` + ``advance`` (zero copy) or
    ``feed`` (convenience, copies). Raises :class:`ProtocolError` on the first invalid byte
    sequence; after that the decoder is dead and the connection must be closed.

    Declared sizes are checked against the limits before anything is allocated, and nothing
    is allocated from them: see the module docstring."""

    def __init__(
        self,
        allocate_payload: PayloadAllocator = default_allocator,
        payload_max_bytes: int = limits.frame_payload_max_bytes,
        header_max_bytes: int = limits.frame_header_max_bytes,
    ) -> None:
        self._allocate = allocate_payload
        self._payload_max = payload_max_bytes
        self._header_max = header_max_bytes
        self._fixed = bytearray(FIXED_HEADER_BYTES)
        self._reset()
        self.dead = False

    def _reset(self) -> None:
        self._state = "fixed"  # then "header", "stage" (a deferred payload's first bytes), "payload", "scatter" or "discard"
        self._buf: bytearray | memoryview = self._fixed
        self._filled = 0
        self._pieces = _Pieces(0)
        self._make_buffer: Callable[[], Buffer] | None = None
        self._kind = FrameKind.REQUEST
        self._request_id = 0
        self._header_length = 0
        self._payload_length = 0
        self._header: FrameHeader = {}
        self._expected_crc = 0
        self._fixed_crc = 0
        self._discard_left = 0
        self._scatter: Scatter | None = None

    @property
    def request_id(self) -> int:
        """The request id of the frame being received (what a payload allocator answers for)."""
        return self._request_id

    @property
    def receiving_payload_bytes(self) -> int:
        """Length of the admitted payload being received (0 between payloads, and for one being
        drained): what a connection lost now leaves admitted but never delivered."""
        return self._payload_length if self._state in ("stage", "payload", "scatter") else 0

    @property
    def header(self) -> FrameHeader:
        """The msgpack header of the frame whose payload is being received ({} before it arrived)."""
        return self._header

    @property
    def mid_frame(self) -> bool:
        """Some bytes of a frame arrived, not all of them."""
        return self._state != "fixed" or self._filled > 0

    @property
    def frame_bytes(self) -> int:
        """The size of the frame being received, as far as known (its fixed header's, until that
        arrived)."""
        return FIXED_HEADER_BYTES + self._header_length + self._payload_length

    @property
    def fixed_bytes(self) -> bytes:
        """The bytes received so far where a frame's fixed header belongs (for error messages
        about peers that are not tectofs)."""
        return bytes(self._fixed)

    def get_buffer(self) -> memoryview:
        """The writable region the next received bytes must go into (never empty)."""
        if self.dead:
            raise ProtocolError("decoder used after a protocol error")
        if self._state == "discard":
            return _SCRATCH[: min(len(_SCRATCH), self._discard_left)]
        if self._state in ("header", "stage"):
            return self._pieces.region()
        if self._scatter is not None:
            return self._scatter.region()
        return memoryview(self._buf)[self._filled :]

    def advance(self, nbytes: int) -> list[Frame]:
        """Record that ``nbytes`` were written into the last buffer; return finished frames."""
        frames: list[Frame] = []
        if self._state == "discard":
            self._discard_left -= nbytes
            if self._discard_left == 0:
                frames.append(self._finish(memoryview(b"")))
            return frames
        if self._scatter is not None:
            self._scatter.advance(nbytes)
            if self._scatter.filled == self._scatter.total:
                frames.append(self._finish(memoryview(b"")))
            return frames
        if self._state in ("header", "stage"):
            self._pieces.advance(nbytes)
        else:
            self._filled += nbytes
            if self._state == "fixed" and 4 <= self._filled < FIXED_HEADER_BYTES and self._fixed[:4] != _MAGIC_BYTES:
                self.dead = True  # a peer that is not tectofs: say so now, not after 32 bytes
                raise ProtocolError(f"bad magic 0x{int.from_bytes(self._fixed[:4], 'big'):08x}")
        try:
            # A state with nothing (left) to read -- an empty header or payload -- completes at once.
            while self._state != "discard" and self._complete():
                frame = self._step()
                if frame is not None:
                    frames.append(frame)
                    break
        except ProtocolError:
            self.dead = True
            raise
        return frames

    def _complete(self) -> bool:
        if self._state in ("header", "stage"):
            return self._pieces.complete
        if self._scatter is not None:
            return False  # advance() finishes a scatter
        return self._filled == len(self._buf)

    def feed(self, data: bytes) -> list[Frame]:
        """Copying convenience for tests and fuzzers: consume all of ``data``."""
        frames: list[Frame] = []
        view = memoryview(data)
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            view = view[n:]
            frames.extend(self.advance(n))
        return frames

    def _step(self) -> Frame | None:
        if self._state == "fixed":
            magic, version, kind, flags, request_id, header_length, payload_length = _FIXED.unpack_from(
                self._fixed
            )
            if magic != MAGIC:
                raise ProtocolError(f"bad magic 0x{magic:08x}")
            if version != PROTOCOL_VERSION:
                raise ProtocolError(f"unsupported protocol version {version}")
            if kind not in FrameKind._value2member_map_:
                raise ProtocolError(f"unknown frame kind {kind}")
            if flags != 0:
                raise ProtocolError(f"unknown frame flags 0x{flags:04x}")
            if header_length > self._header_max:
                raise ProtocolError(f"frame header of {header_length} bytes exceeds the limit")
            if payload_length > self._payload_max:
                raise ProtocolError(f"frame payload of {payload_length} bytes exceeds the limit")
            self._kind = FrameKind(kind)
            self._request_id = request_id
            self._header_length = header_length
            self._payload_length = payload_length
            (self._expected_crc,) = _CRC.unpack_from(self._fixed, _FIXED.size)
            self._fixed_crc = crc32c.crc32c(memoryview(self._fixed)[: _FIXED.size])
            self._state = "header"
            self._pieces = _Pieces(header_length)
            return None
        if self._state == "header":
            body = self._pieces.join()
            if crc32c.crc32c(body, self._fixed_crc) != self._expected_crc:
                raise ProtocolError("frame header checksum mismatch")
            try:
                header = msgspec.msgpack.decode(body)
            except Exception as exc:  # DecodeError, and e.g. unhashable map keys
                raise ProtocolError(f"undecodable frame header: {exc}") from None
            if not isinstance(header, dict):
                raise ProtocolError("frame header is not a map")
            self._header = header
            buffer = self._allocate(header, self._payload_length) if self._payload_length else bytearray()
            if buffer is None:
                self._state = "discard"
                self._discard_left = self._payload_length
            elif isinstance(buffer, Scatter):
                if buffer.total != self._payload_length:
                    raise ProtocolError("scatter of the wrong size")  # our bug, not the peer's
                self._state = "scatter"
                self._scatter = buffer
            elif callable(buffer):
                self._state = "stage"
                self._make_buffer = buffer
                self._pieces = _Pieces(staged_bytes(self._payload_length))
            else:
                self._receive_into(buffer, 0)
            return None
        if self._state == "stage":
            assert self._make_buffer is not None
            buffer = self._make_buffer()
            staged, self._make_buffer = self._pieces, None
            self._receive_into(buffer, staged.filled)
            staged.copy_into(memoryview(buffer))
            return None
        # payload complete
        return self._finish(memoryview(self._buf))

    def _receive_into(self, buffer: Buffer, filled: int) -> None:
        if len(buffer) != self._payload_length:
            raise ProtocolError("payload buffer of the wrong size")  # our bug, not the peer's
        self._state = "payload"
        self._buf = buffer
        self._filled = filled
        self._pieces = _Pieces(0)

    def _finish(self, payload: memoryview) -> Frame:
        frame = Frame(self._kind, self._request_id, self._header, payload, discarded=self._state == "discard")
        self._reset()
        return frame
