"""Durability policies: ``rs(k,m)`` (Reed-Solomon, k data + m parity chunks) or ``rep(n)``.

A policy is set per directory and inherited by what is created below it; a file keeps the
policy it was created with. Each block of a file becomes ``width`` chunks on distinct
chunk servers, and can be read back from any ``needed`` of them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from .errors import InvalidArgument

DEFAULT_POLICY = "rs(4,2)"
_RS = re.compile(r"^rs\((\d+),(\d+)\)$")
_REP = re.compile(r"^rep\((\d+)\)$")


@dataclass(frozen=True)
class Policy:
    kind: str  # "rs" or "rep"
    data: int  # k for rs, 1 for rep
    redundancy: int  # m for rs, n-1 for rep

    @property
    def width(self) -> int:
        """Chunks per block, each on a distinct server."""
        return self.data + self.redundancy

    @property
    def needed(self) -> int:
        """Chunks that suffice to read a block."""
        return self.data

    @property
    def write_min(self) -> int:
        """Chunks that must be durable for a block to be accepted when servers are missing
        (a degraded write): k+1 for rs(k,m), so one more loss still leaves it readable; 2 for
        rep(n >= 2); all of them when the policy has no spare (rs(k,1) needs k+1 = width)."""
        if self.kind == "rs":
            return min(self.width, self.data + 1)
        return min(self.width, 2)

    @property
    def tolerates(self) -> int:
        """Chunk servers that may be lost with every block still readable."""
        return self.redundancy

    def __str__(self) -> str:
        return f"rs({self.data},{self.redundancy})" if self.kind == "rs" else f"rep({self.width})"


@functools.lru_cache(maxsize=256)
def parse(text: str) -> Policy:
    """Parse ``"rs(k,m)"`` or ``"rep(n)"``; spaces are ignored. Raises InvalidArgument.
    Remembered (a ``Policy`` is immutable): every open of a file parses its policy."""
    compact = str(text).replace(" ", "").lower()
    if m := _RS.match(compact):
        k, parity = int(m.group(1)), int(m.group(2))
        if not (1 <= k <= 32 and 1 <= parity <= 16):
            raise InvalidArgument(f"policy {text!r}: need 1 <= k <= 32 and 1 <= m <= 16")
        return Policy("rs", k, parity)
    if m := _REP.match(compact):
        n = int(m.group(1))
        if not 1 <= n <= 16:
            raise InvalidArgument(f"policy {text!r}: need 1 <= n <= 16")
        return Policy("rep", 1, n - 1)
    raise InvalidArgument(f"unknown durability policy {text!r}: expected 'rs(k,m)' or 'rep(n)'")
