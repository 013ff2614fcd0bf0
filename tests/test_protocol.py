"""The sans-I/O codec alone: round trips, arbitrary splits, and fuzzed garbage."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectofs.errors import ProtocolError
from tectofs.wire.framing import FIXED_HEADER_BYTES, FrameDecoder, FrameKind, encode_frame

headers = st.dictionaries(st.text(max_size=8), st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
                                                         st.binary(max_size=20), st.booleans(), st.none()), max_size=5)


@given(
    frames=st.lists(st.tuples(st.sampled_from(list(FrameKind)), st.integers(0, 2**64 - 1), headers,
                              st.binary(max_size=3000)), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 4000), max_size=20),
)
@settings(max_examples=200, deadline=None)
def test_frames_survive_any_split(frames, cuts):
    wire = b"".join(encode_frame(kind, rid, header, len(payload)) + payload for kind, rid, header, payload in frames)
    decoder = FrameDecoder()
    decoded = []
    position = 0
    for cut in cuts + [len(wire)]:
        decoded.extend(decoder.feed(wire[position : position + cut]))
        position += cut
        if position >= len(wire):
            break
    decoded.extend(decoder.feed(wire[position:]))
    assert [(f.kind, f.request_id, f.header, bytes(f.payload)) for f in decoded] == frames


@given(st.binary(min_size=FIXED_HEADER_BYTES, max_size=200))
@settings(max_examples=300, deadline=None)
def test_garbage_raises_protocol_error_or_waits(garbage):
    decoder = FrameDecoder(payload_max_bytes=1 << 20)
    try:
        decoder.feed(garbage)
    except ProtocolError as exc:
        assert str(exc)
        assert decoder.dead
        with pytest.raises(ProtocolError):
            decoder.get_buffer()


def test_flipped_header_byte_is_caught():
    frame = bytearray(encode_frame(FrameKind.REQUEST, 7, {"op": "lookup", "path": "/a"}))
    for i in range(len(frame)):
        damaged = bytearray(frame)
        damaged[i] ^= 0x01
        decoder = FrameDecoder()
        try:
            frames = decoder.feed(bytes(damaged))
        except ProtocolError:
            continue
        # Only a flip in the length fields can leave the decoder waiting for more bytes.
        assert frames == [], f"flip at byte {i} went unnoticed"


def test_oversized_payload_rejected_before_allocation():
    allocated: list[int] = []

    def allocate(header: dict[str, Any], n: int) -> bytearray:
        allocated.append(n)
        return bytearray(n)

    decoder = FrameDecoder(allocate, payload_max_bytes=1000)
    with pytest.raises(ProtocolError, match="exceeds"):
        decoder.feed(encode_frame(FrameKind.REQUEST, 1, {"op": "x"}, 1001)[:FIXED_HEADER_BYTES])
    assert allocated == []


def test_discarded_payload_keeps_stream_in_sync():
    decoder = FrameDecoder(lambda header, n: None if header.get("drop") else bytearray(n))
    wire = encode_frame(FrameKind.REQUEST, 1, {"drop": True}, 5) + b"12345" + encode_frame(FrameKind.REQUEST, 2, {}, 2) + b"ok"
    frames = decoder.feed(wire)
    assert [f.request_id for f in frames] == [1, 2]
    assert frames[0].discarded is True
    assert bytes(frames[1].payload) == b"ok"


@given(payload=st.binary(min_size=1, max_size=3000), sizes=st.lists(st.integers(0, 700), min_size=1, max_size=6),
       cuts=st.lists(st.integers(1, 900), max_size=12))
@settings(max_examples=200, deadline=None)
def test_a_scattered_payload_lands_in_the_callers_buffers_in_order(payload, sizes, cuts):
    from tectofs.wire.framing import Scatter

    sizes = sizes[:-1] + [max(0, len(payload) - sum(sizes[:-1]))]  # the views hold exactly the payload
    if sum(sizes) != len(payload):
        return
    views = [memoryview(bytearray(n)) for n in sizes]
    decoder = FrameDecoder(lambda header, n: Scatter(list(views)))
    wire = encode_frame(FrameKind.RESPONSE, 7, {"ok": 1}, len(payload)) + payload + encode_frame(FrameKind.RESPONSE, 8, {})
    frames, position = [], 0
    for cut in cuts + [len(wire)]:
        frames += decoder.feed(wire[position : position + cut])
        position += cut
    assert [(f.request_id, bytes(f.payload)) for f in frames] == [(7, b""), (8, b"")]
    assert b"".join(bytes(v) for v in views) == payload


def test_a_diverted_scatter_writes_nothing_more_and_the_stream_goes_on():
    from tectofs.wire.framing import Scatter

    views = [memoryview(bytearray(100)), memoryview(bytearray(100))]
    scatter = Scatter(views)
    decoder = FrameDecoder(lambda header, n: scatter)
    payload = bytes(range(200))
    first = encode_frame(FrameKind.RESPONSE, 1, {}, 200)
    wire = first + payload + encode_frame(FrameKind.RESPONSE, 2, {"next": True})
    head = len(first)
    assert decoder.feed(wire[: head + 50]) == []
    scatter.divert()  # the caller stopped waiting: the rest must not reach its buffers
    frames = decoder.feed(wire[head + 50 :])
    assert [f.request_id for f in frames] == [1, 2] and frames[1].header == {"next": True}
    assert bytes(views[0][:50]) == payload[:50] and bytes(views[0][50:]) == bytes(50) and bytes(views[1]) == bytes(100)
    assert not scatter.complete
    scatter.divert()  # harmless twice


def test_a_scatter_of_the_wrong_size_is_refused():
    from tectofs.wire.framing import Scatter

    decoder = FrameDecoder(lambda header, n: Scatter([memoryview(bytearray(n - 1))]))
    with pytest.raises(ProtocolError, match="scatter of the wrong size"):
        decoder.feed(encode_frame(FrameKind.RESPONSE, 1, {}, 10) + bytes(10))
