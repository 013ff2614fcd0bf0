"""The tensor codec (``tectofs.tensor_codec``): bit-exact round trips for every dtype and
shape, incompressible data stored raw, malformed frames refused, and the ratio it exists for."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tectofs import tensor_codec as tc

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64]


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _round_trip(t: torch.Tensor) -> tc.Encoded | None:
    raw = _bytes(t)
    encoded = tc.encode(raw, str(t.dtype), min_saving=float("-inf"))
    if encoded is not None:
        assert tc.decode(encoded.frame) == raw
        if raw:  # the tensor it makes has every bit of the original (NaN payloads, -0.0, subnormals)
            back = torch.frombuffer(bytearray(tc.decode(encoded.frame)), dtype=t.dtype).reshape(t.shape)
            assert torch.equal(back.view(torch.uint8), t.contiguous().view(torch.uint8))
    return encoded


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bit_exact(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    if dtype.is_floating_point or dtype.is_complex:
        t = (torch.randn(3001, generator=g) * 0.02).to(dtype)
        t[:4] = torch.tensor([float("nan"), float("inf"), -0.0, 1e-40]).to(dtype)  # specials, a subnormal
    elif dtype == torch.bool:
        t = torch.rand(3001, generator=g) > 0.5
    else:
        t = torch.randint(0, 100, (3001,), generator=g).to(dtype)
    _round_trip(t)


def test_non_contiguous_views_and_empty_tensors_round_trip() -> None:
    t = torch.randn(64, 48).to(torch.bfloat16)
    for view in (t.t(), t[::3, 1::2], t[:, 5]):
        assert not view.is_contiguous()
        _round_trip(view)
    assert tc.encode(b"", "torch.float32") is None  # nothing to save: stored raw
    assert tc.decode(tc.encode(b"", "torch.float32", min_saving=float("-inf")).frame) == b""  # type: ignore[union-attr]


def test_incompressible_bytes_are_left_raw() -> None:
    noise = torch.randint(0, 256, (1 << 16,), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    assert tc.encode(_bytes(noise), "torch.uint8") is None
    assert tc.encode(_bytes(noise), "torch.bfloat16") is None  # random bits in float clothing


@pytest.mark.parametrize("scale", [0.02, 1.0, 3.0])
def test_bf16_weights_compress_to_two_thirds_at_any_scale(scale: float) -> None:
    """The reason the codec exists: bf16 weights (a normal law, as trained weights are close
    to) shrink to <= 0.67 of their bytes, where zstd on the raw bytes gives ~0.78, whether
    their exponents straddle a nibble boundary (scale 1: 0x7e/0x7f/0x80) or not."""
    w = (torch.randn(1 << 20, generator=torch.Generator().manual_seed(3)) * scale).to(torch.bfloat16)
    encoded = tc.encode(_bytes(w), "torch.bfloat16")
    assert encoded is not None and encoded.ratio <= 0.67, encoded and encoded.ratio
    assert tc.decode(encoded.frame) == _bytes(w)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=5000), dtype=st.sampled_from(["torch.bfloat16", "torch.float32", "torch.float64",
                                                             "torch.int32", "torch.uint8", "torch.float16"]))
def test_any_bytes_round_trip_whatever_the_dtype_says(data: bytes, dtype: str) -> None:
    """Lengths that are not a multiple of the item size keep their tail."""
    encoded = tc.encode(data, dtype, min_saving=float("-inf"))
    if encoded is not None:
        assert tc.decode(encoded.frame) == data


def test_malformed_frames_are_refused_never_misdecoded() -> None:
    raw = _bytes((torch.randn(5000) * 0.02).to(torch.bfloat16))
    frame = tc.encode(raw, "torch.bfloat16").frame  # type: ignore[union-attr]
    bad = [
        b"", frame[:10], b"XXXX" + frame[4:], frame[:-1], frame + b"\0",
        frame[:4] + bytes([9]) + frame[5:],  # unknown transform
        frame[:5] + bytes([3]) + frame[6:],  # an item size no dtype has
    ]
    header = struct.calcsize("<4sBBBBQB")
    flipped = bytearray(frame)
    flipped[-20] ^= 0xFF  # inside the last plane's payload
    table = bytearray(frame)
    struct.pack_into("<Q", table, header + 1, 1 << 50)  # a plane claiming a petabyte
    for candidate in [*bad, bytes(table)]:
        with pytest.raises(tc.CorruptPayload):
            tc.decode(candidate)
    try:
        out = tc.decode(bytes(flipped))
    except tc.CorruptPayload:
        pass
    else:  # a raw plane's flipped byte decodes to different bytes: the caller's checksum catches it
        assert out != raw and len(out) == len(raw)


def test_recentring_is_a_bijection_for_every_centre() -> None:
    import numpy as np

    every = np.arange(256, dtype=np.uint8)
    for center in range(256):
        high, low = tc._nibble_planes(every, center)
        zigzag = (tc._unpack_nibbles(high, 256) << 4) | tc._unpack_nibbles(low, 256)
        assert sorted(zigzag.tolist()) == list(range(256))  # a permutation of the byte values
        assert zigzag[center] == 0 and zigzag[(center - 1) % 256] == 1 and zigzag[(center + 1) % 256] == 2
        assert (tc._recentred_plane(zigzag, center) == every).all()
