"""Turning a block into chunks and back, for both policy kinds.

Reed-Solomon uses pyeclib with ISA-L (``isa_l_rs_vand``), falling back to liberasurecode's
own ``liberasurecode_rs_vand`` when ISA-L is missing. A block is encoded in segments of
``SEGMENT_BYTES`` (``bench/erasure_segments.py``: ISA-L runs at ~4 GB/s on 2 MiB segments
here, but ~0.35 GB/s on a whole 64 MiB block, which no longer fits in cache); chunk ``i`` is the concatenation of fragment
``i`` of every segment. Every fragment of a segment has the same size, so offsets follow
from the block length alone.

The code is systematic: fragment ``i < k`` holds, after pyeclib's 80-byte header, bytes
``[i*p, (i+1)*p)`` of its segment. With every data chunk present, decoding is a copy; with
any missing, pyeclib's reconstruct rebuilds just those fragments of each segment, then it is
a copy again. pyeclib holds the GIL: callers
run these functions off the event loop.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import random
from typing import Callable, Mapping, Sequence, cast

from . import isal
from .errors import DataUnavailable
from .policy import Policy
from .regions import Regions, as_regions

Buffer = bytes | bytearray | memoryview
Allocator = Callable[[int], memoryview]
log = logging.getLogger("tectofs.erasure")

SEGMENT_BYTES = 2 << 20
FRAGMENT_HEADER_BYTES = 80
_BACKENDS = ("isa_l_rs_vand", "liberasurecode_rs_vand")


@functools.lru_cache(maxsize=32)
def _driver(k: int, m: int):  # type: ignore[no-untyped-def]
    from pyeclib.ec_iface import ECDriver

    last: Exception | None = None
    for backend in _BACKENDS:
        try:
            return ECDriver(k=k, m=m, ec_type=backend)
        except Exception as exc:  # pyeclib raises backend-specific types
            last = exc
    raise RuntimeError(f"no Reed-Solomon backend available for rs({k},{m}): {last}")


@functools.lru_cache(maxsize=4096)
def _fragment_size(k: int, m: int, segment_length: int) -> int:
    return int(_driver(k, m).get_segment_info(segment_length, segment_length)["fragment_size"])


def _segments(length: int) -> list[tuple[int, int]]:
    """``(offset, length)`` of each segment of a block of ``length`` bytes."""
    return [(o, min(SEGMENT_BYTES, length - o)) for o in range(0, length, SEGMENT_BYTES)] or [(0, 0)]


def chunk_length(policy: Policy, block_length: int) -> int:
    if policy.kind == "rep":
        return block_length
    return sum(_fragment_size(policy.data, policy.redundancy, n) for _, n in _segments(block_length))


def data_extents(policy: Policy, block_length: int, start: int, length: int) -> list[tuple[int, int, int, int]]:
    """Where bytes ``[start, start + length)`` of a block of ``block_length`` bytes lie in its
    data chunks: ``(position, chunk_offset, block_offset, n)`` runs, in block order. For rep,
    every replica holds the block as it is: position 0 stands for any of them."""
    end = min(block_length, start + length)
    if start >= end:
        return []
    if policy.kind == "rep":
        return [(0, start, start, end - start)]
    k, m = policy.data, policy.redundancy
    runs: list[tuple[int, int, int, int]] = []
    chunk_at = 0
    for offset, n in _segments(block_length):
        f = _fragment_size(k, m, n)
        payload = f - FRAGMENT_HEADER_BYTES
        if offset < end and start < offset + n:
            for i in range(k):
                first, last = max(start, offset + i * payload), min(end, offset + n, offset + (i + 1) * payload)
                if first < last:
                    runs.append((i, chunk_at + FRAGMENT_HEADER_BYTES + first - offset - i * payload, first, last - first))
        chunk_at += f
    return runs


def backend_name(policy: Policy) -> str:
    return str(_driver(policy.data, policy.redundancy).ec_type) if policy.kind == "rs" else "replication"


def encode(policy: Policy, block: "Buffer | Regions", allocate: Allocator | None = None) -> list[Buffer]:
    """Return ``policy.width`` chunks for ``block`` (one buffer, or several end to end), data
    chunks first. For rs, chunk buffers come from ``allocate(n)`` (default: new bytearrays) and
    ``block`` is not needed once this returns; for rep, every chunk is ``block`` (joined into one
    buffer if it came in several)."""
    if policy.kind == "rep":
        return [b"".join(block.parts) if isinstance(block, Regions) else block] * policy.width
    source = block if isinstance(block, Regions) else Regions([memoryview(block)])
    size = chunk_length(policy, len(source))
    alloc = allocate or (lambda n: memoryview(bytearray(n)))
    chunks = [alloc(size) for _ in range(policy.width)]
    compute = _direct_parity(policy.data, policy.redundancy)
    if compute is None or not len(source) or not _encode_direct(policy.data, policy.redundancy, compute, source, chunks):
        _encode_pyeclib(policy.data, policy.redundancy, source, chunks)
    return cast(list[Buffer], chunks)


def _encode_pyeclib(k: int, m: int, source: Regions, chunks: list[memoryview]) -> None:
    position = 0
    for offset, n in _segments(len(source)):
        position += _pyeclib_segment(k, m, source, offset, n, chunks, position)
    assert position == len(chunks[0])


def _pyeclib_segment(k: int, m: int, source: Regions, offset: int, n: int, chunks: list[memoryview], position: int) -> int:
    """Encode the segment ``[offset, offset + n)`` with pyeclib into the chunks at ``position``;
    returns the fragment size. Its fragments' headers are remembered for ``_encode_direct``."""
    fragments = _driver(k, m).encode(b"".join(source.views(offset, n)))
    f = len(fragments[0])
    for chunk, fragment in zip(chunks, fragments):
        chunk[position : position + f] = fragment
    if len(_headers) >= _HEADERS_MAX:
        _headers.clear()
    _headers[(k, m, n)] = tuple(bytes(fragment[:FRAGMENT_HEADER_BYTES]) for fragment in fragments)
    return f


_HEADERS_MAX = 4096
_headers: dict[tuple[int, int, int], tuple[bytes, ...]] = {}  # (k, m, segment length) -> pyeclib's fragment headers


def _encode_direct(k: int, m: int, compute: isal.Parity, source: Regions, chunks: list[memoryview]) -> bool:
    """``_encode_pyeclib``'s chunks, byte for byte, with one copy of the data: each data
    fragment's payload is copied into its chunk (zero-padded), its header is pyeclib's for that
    segment length (they do not depend on the data: ``_direct_parity`` checks that), and ISA-L
    writes the parity fragments in place from the data chunks. A segment length met for the
    first time is encoded by pyeclib instead, which gives its headers. False, having written
    nothing, when a chunk buffer is read-only (ISA-L needs addresses it may write to)."""
    holders = [isal.address(chunk) for chunk in chunks]  # (kept alive until ISA-L is done)
    addresses = [h[0] for h in holders if h is not None]
    if len(addresses) != len(chunks):
        return False
    position = 0
    for offset, n in _segments(len(source)):
        headers = _headers.get((k, m, n))
        if headers is None:
            position += _pyeclib_segment(k, m, source, offset, n, chunks, position)
            continue
        f = _fragment_size(k, m, n)
        payload = f - FRAGMENT_HEADER_BYTES
        at = position + FRAGMENT_HEADER_BYTES
        for chunk, header in zip(chunks, headers):
            chunk[position:at] = header
        for i in range(k):
            start = offset + i * payload
            take = max(0, min(payload, offset + n - start))
            into = at
            for piece in source.views(start, take) if take else []:
                chunks[i][into : into + len(piece)] = piece
                into += len(piece)
            if take < payload:
                chunks[i][at + take : at + payload] = bytes(payload - take)
        compute(payload, [a + at for a in addresses[:k]], [a + at for a in addresses[k:]])
        position += f
    assert position == len(chunks[0])
    return True


@functools.lru_cache(maxsize=32)
def _direct_parity(k: int, m: int) -> isal.Parity | None:
    """ISA-L's parity for rs(k, m) if ISA-L is the backend and ``_encode_direct`` gives exactly
    ``_encode_pyeclib``'s chunks on random blocks (a whole segment and a short one, a block
    shorter than a segment, a block of one byte; each encoded twice, so that the second time
    takes the direct path with the headers the first left); None otherwise, and encodes go
    through pyeclib."""
    try:
        if _driver(k, m).ec_type.name != "isa_l_rs_vand":
            return None
        compute = isal.parity(k, m)
        if compute is None:
            return None
        for length in (SEGMENT_BYTES + 12_345, 1_000, 1):
            block = Regions([memoryview(os.urandom(length))])
            size = sum(_fragment_size(k, m, n) for _, n in _segments(length))
            expected = [memoryview(bytearray(size)) for _ in range(k + m)]
            _encode_pyeclib(k, m, block, expected)  # (leaves the headers of these lengths)
            got = [memoryview(bytearray(size)) for _ in range(k + m)]
            if not _encode_direct(k, m, compute, block, got) or any(a != b for a, b in zip(expected, got)):
                log.warning("encoding rs(%d,%d) with ISA-L directly differs from pyeclib; using pyeclib", k, m)
                return None
        return compute
    except Exception as exc:  # whatever went wrong, pyeclib's path still works
        log.warning("encoding rs(%d,%d) with ISA-L directly failed its check (%s); using pyeclib", k, m, exc)
        return None


class InPlaceChunk:
    """Data chunk ``position`` of an rs block, laid out so that its payload bytes land straight
    where they belong in the block's buffer ``out``, and only the rest (each fragment's header,
    the last fragment's padding) in a small spill buffer: ``pieces`` in chunk order, to receive
    the chunk into (``tectofs.wire.framing.Scatter``). Decoding then has nothing to copy for it."""

    def __init__(self, policy: Policy, position: int, out: "memoryview | Regions") -> None:
        if policy.kind != "rs" or not 0 <= position < policy.data:
            raise ValueError(f"only the data chunks of an rs policy are placed in the block, not {position} of {policy}")
        k, m = policy.data, policy.redundancy
        self.out = out
        target = as_regions(out)
        spill_at: list[tuple[int, int]] = []  # per segment: (header, padding) lengths in the spill buffer
        places: list[list[memoryview]] = []  # per segment: where its payload goes in ``out``
        for offset, n in _segments(len(out)):
            payload = _fragment_size(k, m, n) - FRAGMENT_HEADER_BYTES
            start = offset + position * payload
            take = max(0, min(payload, offset + n - start))
            places.append(target.views(start, take) if take else [])
            spill_at.append((FRAGMENT_HEADER_BYTES, payload - take))
        spill = memoryview(bytearray(sum(h + p for h, p in spill_at)))
        self.pieces: list[memoryview] = []
        self._bounds: list[tuple[int, int]] = []  # per segment: its pieces' [first, end)
        used = 0
        for (header, padding), place in zip(spill_at, places):
            first = len(self.pieces)
            self.pieces += [spill[used : used + header], *place, spill[used + header : used + header + padding]]
            used += header + padding
            self._bounds.append((first, len(self.pieces)))

    def fragment(self, segment: int) -> bytes:
        """Fragment ``segment`` of the chunk, whole (header, payload, padding), as pyeclib takes it."""
        first, end = self._bounds[segment]
        return b"".join(self.pieces[first:end])


def decode_into(policy: Policy, chunks: Mapping[int, "Buffer | InPlaceChunk"], out: "memoryview | Regions") -> None:
    """Rebuild a block into ``out`` (exactly the block's length: one buffer, or several end to
    end) from any ``policy.needed`` chunks, given as position -> bytes, or as an
    ``InPlaceChunk`` of ``out`` (already in place: nothing to copy)."""
    if len(chunks) < policy.needed:
        raise DataUnavailable(f"only {len(chunks)} of the {policy.needed} chunks needed are readable")
    length = len(out)
    placed = {p: c for p, c in chunks.items() if isinstance(c, InPlaceChunk)}
    if any(c.out is not out for c in placed.values()):
        raise ValueError("a chunk was placed in another buffer than the one decoded into")
    if policy.kind == "rep":
        replica = next(iter(chunks.values()))
        assert not isinstance(replica, InPlaceChunk)  # (only rs data chunks are placed)
        source = memoryview(replica)
        if len(source) != length:
            raise DataUnavailable(f"replica of {len(source)} bytes where the block has {length}")
        as_regions(out).write(0, source)
        return
    k, m = policy.data, policy.redundancy
    target = as_regions(out)
    views = {p: memoryview(c).cast("B") for p, c in chunks.items() if not isinstance(c, InPlaceChunk)}
    expected = chunk_length(policy, length)
    for p, v in views.items():
        if len(v) != expected:
            raise DataUnavailable(f"chunk {p} has {len(v)} bytes where {expected} are expected")
    # Data chunks that are missing are rebuilt segment by segment with pyeclib's reconstruct
    # (ISA-L recomputes only them: 0.1 s per GB here, where its decode of the whole segment
    # took 1.2-1.9 s); then every segment is the concatenation of its data fragments' payloads.
    lost = sorted(set(range(k)) - views.keys() - placed.keys())
    if lost and len(chunks) == k and _rebuilds_directly(k, m) and _decode_direct(k, m, views, placed, lost, target):
        return
    driver = _driver(k, m)
    payload_at = FRAGMENT_HEADER_BYTES
    position = 0
    for segment, (offset, n) in enumerate(_segments(length)):
        f = _fragment_size(k, m, n)
        data = {i: views[i][position : position + f] for i in range(k) if i in views}
        if lost:
            fragments = [v[position : position + f].tobytes() for v in views.values()]
            fragments += [c.fragment(segment) for c in placed.values()]
            # (pyeclib sorts the list it is given and answers in that order: it gets a copy)
            data.update(zip(lost, (memoryview(r) for r in driver.reconstruct(fragments, list(lost)))))
        payload = f - FRAGMENT_HEADER_BYTES
        for i in data:
            start = offset + i * payload
            take = max(0, min(payload, offset + n - start))
            if take:
                target.write(start, data[i][payload_at : payload_at + take])
        position += f


def _decode_direct(k: int, m: int, views: dict[int, memoryview], placed: "dict[int, InPlaceChunk]", lost: list[int],
                   target: Regions) -> bool:
    """``decode_into``'s rs path with ISA-L called directly (``isal.rebuild``): each segment's
    lost data fragments are computed from the ``k`` fragments where they lie (received buffers,
    or their place in ``target``) straight into their place in ``target``. Only a fragment that
    is not one contiguous span there (a short last segment, a piece across two regions) goes
    through a buffer of its own. pyeclib's path copies every fragment into ``bytes`` and back.
    False, having written nothing, when ISA-L cannot (a read-only buffer, a singular matrix)."""
    if not len(target):
        return False
    sources = tuple(sorted([*views, *placed]))
    compute = isal.rebuild(k, m, sources, tuple(lost))
    holders = {p: isal.address(v) for p, v in views.items()}
    if compute is None or any(h is None for h in holders.values()):
        return False
    keep: list[object] = []  # what ISA-L reads from or writes to stays alive until it is done

    def span(start: int, payload: int, take: int) -> int | None:
        """The address of ``target[start : start + payload]`` if that is one writable span."""
        if take != payload:
            return None
        pieces = target.views(start, payload)
        found = isal.address(pieces[0]) if len(pieces) == 1 else None
        if found is None:
            return None
        keep.append(found[1])
        return found[0]

    def scratch(content: bytes) -> tuple[int, bytearray]:
        """A buffer of its own holding ``content``, and its address."""
        buffer = bytearray(content)
        found = isal.address(buffer)
        assert found is not None
        keep.append(found[1])
        return found[0], buffer

    position = 0
    for segment, (offset, n) in enumerate(_segments(len(target))):
        f = _fragment_size(k, m, n)
        payload = f - FRAGMENT_HEADER_BYTES
        at = position + FRAGMENT_HEADER_BYTES
        addresses = []
        for p in sources:
            if p in views:
                addresses.append(holders[p][0] + at)  # type: ignore[index]
            else:
                start = offset + p * payload
                here = span(start, payload, max(0, min(payload, offset + n - start)))
                if here is None:
                    here = scratch(placed[p].fragment(segment)[FRAGMENT_HEADER_BYTES:])[0]
                addresses.append(here)
        copies: list[tuple[int, int, bytearray]] = []  # (start in target, bytes, scratch): written after
        for i in lost:
            start = offset + i * payload
            take = max(0, min(payload, offset + n - start))
            here = span(start, payload, take)
            if here is None:
                here, buffer = scratch(bytes(payload))
                copies.append((start, take, buffer))
            addresses.append(here)
        compute(payload, addresses[:k], addresses[k:])
        for start, take, buffer in copies:
            if take:
                target.write(start, memoryview(buffer)[:take])
        for i in views:
            if i < k:  # a data chunk received into a buffer: its payload goes into place
                start = offset + i * payload
                take = max(0, min(payload, offset + n - start))
                if take:
                    target.write(start, views[i][at : at + take])
        position += f
    return True


def check_direct_decode(policy: Policy) -> None:
    """Run the once-per-process check of ``_rebuilds_directly`` now (a client does, on a codec
    thread, when it first asks for a parity chunk: the check then overlaps that get instead of
    delaying the first degraded decode by ~0.2-0.35 s)."""
    if policy.kind == "rs":
        _rebuilds_directly(policy.data, policy.redundancy)


@functools.lru_cache(maxsize=32)
def _rebuilds_directly(k: int, m: int) -> bool:
    """Whether ``_decode_direct`` gives back the very block that pyeclib encoded, for rs(k, m):
    checked once on a random block of a whole segment and a short one, for every set of ``k``
    chunks that lacks a data chunk (24 of them for wide policies), with the data chunks received
    into buffers and again received in place (``InPlaceChunk``). False (decodes go through pyeclib) if ISA-L is not the
    backend or anything differs."""
    try:
        if _driver(k, m).ec_type.name != "isa_l_rs_vand" or not isal.available():
            return False
        policy = Policy("rs", k, m)
        length = SEGMENT_BYTES + 12_345
        block = os.urandom(length)
        chunks = [bytes(c) for c in encode(policy, block)]
        choices = [c for c in itertools.combinations(range(k + m), k) if set(range(k)) - set(c)]
        if len(choices) > 24:  # wide policies: the most lost first, and a random sample of the rest
            choices = choices[-4:] + random.sample(choices[:-4], 20)
        for sources in choices:
            lost = sorted(set(range(k)) - set(sources))
            for in_place in (False, True):
                got = memoryview(bytearray(length))
                placed = {p: InPlaceChunk(policy, p, got) for p in sources if in_place and p < k}
                for p, chunk in placed.items():
                    used = 0
                    for piece in chunk.pieces:
                        piece[:] = chunks[p][used : used + len(piece)]
                        used += len(piece)
                views = {p: memoryview(bytearray(chunks[p])) for p in sources if p not in placed}
                if not _decode_direct(k, m, views, placed, lost, Regions([got])):
                    log.warning("decoding rs(%d,%d) with ISA-L directly is not possible for chunks %s (a matrix"
                                " that cannot be inverted?); using pyeclib", k, m, sources)
                    return False
                if got != block:
                    log.warning("decoding rs(%d,%d) with ISA-L directly differs from pyeclib; using pyeclib", k, m)
                    return False
        return True
    except Exception as exc:  # whatever went wrong, pyeclib's path still works
        log.warning("decoding rs(%d,%d) with ISA-L directly failed its check (%s); using pyeclib", k, m, exc)
        return False


def reconstruct(policy: Policy, chunks: dict[int, Buffer], missing: Sequence[int], block_length: int) -> dict[int, bytearray]:
    """Rebuild the chunks at ``missing`` positions from available ones (for repair)."""
    if policy.kind == "rep":
        source = next(iter(chunks.values()))
        return {position: bytearray(source) for position in missing}
    k, m = policy.data, policy.redundancy
    driver = _driver(k, m)
    views = [memoryview(c).cast("B") for c in chunks.values()]
    wanted = sorted(set(missing))  # pyeclib answers in sorted order (and sorts the list it is given)
    rebuilt = {p: bytearray() for p in wanted}
    position = 0
    for _, n in _segments(block_length):
        f = _fragment_size(k, m, n)
        fragments = [v[position : position + f].tobytes() for v in views]
        for p, fragment in zip(wanted, driver.reconstruct(fragments, list(wanted))):
            rebuilt[p] += fragment
        position += f
    return rebuilt
