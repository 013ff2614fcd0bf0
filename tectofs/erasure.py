"""Turning a block into chunks and back, for both policy kinds.

Reed-Solomon uses pyeclib with ISA-L (``isa_l_rs_vand``, ~1.1-1.4 GB/s encode here), falling
back to liberasurecode's own ``liberasurecode_rs_vand`` when ISA-L is missing. Fragments
carry pyeclib's own header (original size, index), so any ``k`` of them decode without
outside metadata. pyeclib holds the GIL: callers run these functions off the event loop.
"""

from __future__ import annotations

import functools
from typing import Sequence

from .errors import DataUnavailable
from .policy import Policy

Buffer = bytes | bytearray | memoryview

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


def backend_name(policy: Policy) -> str:
    return str(_driver(policy.data, policy.redundancy).ec_type) if policy.kind == "rs" else "replication"


def encode(policy: Policy, block: Buffer) -> list[Buffer]:
    """Return ``policy.width`` chunks for ``block``, data chunks first."""
    if policy.kind == "rep":
        return [block] * policy.width
    return list(_driver(policy.data, policy.redundancy).encode(bytes(block) if isinstance(block, memoryview) else block))


def decode(policy: Policy, chunks: dict[int, Buffer], length: int) -> Buffer:
    """Rebuild a block of ``length`` bytes from any ``policy.needed`` chunks (position -> bytes)."""
    if len(chunks) < policy.needed:
        raise DataUnavailable(f"only {len(chunks)} of the {policy.needed} chunks needed are readable")
    if policy.kind == "rep":
        data = next(iter(chunks.values()))
    else:
        fragments = [bytes(c) if isinstance(c, memoryview) else c for c in chunks.values()]
        data = _driver(policy.data, policy.redundancy).decode(fragments)
    if len(data) != length:
        raise DataUnavailable(f"decoded {len(data)} bytes where the block has {length}")
    return data


def reconstruct(policy: Policy, chunks: dict[int, Buffer], missing: Sequence[int]) -> dict[int, Buffer]:
    """Rebuild the chunks at ``missing`` positions from the available ones (for repair)."""
    if policy.kind == "rep":
        source = next(iter(chunks.values()))
        return {position: source for position in missing}
    fragments = [bytes(c) if isinstance(c, memoryview) else c for c in chunks.values()]
    rebuilt = _driver(policy.data, policy.redundancy).reconstruct(fragments, list(missing))
    return dict(zip(missing, rebuilt))
