"""A run of bytes made of several buffers laid end to end: the destination of a vectored read.

A reader that wants consecutive bytes of a file in several places (``preadv``: the plugin
loading a block that holds several tensors) hands them over as one ``Regions``; a block is
then received and decoded straight into them, as into one buffer, with no copy between.
"""

from __future__ import annotations

import bisect
from typing import Sequence


class Regions:
    """Consecutive bytes ``[0, len(self))`` stored in ``parts``, in order (C-contiguous
    buffers; writable where the bytes are written into). Byte ``i`` lives in the part that
    covers it; empty parts are dropped."""

    def __init__(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        views = (memoryview(p).cast("B") for p in parts)
        self.parts = [v for v in views if v.nbytes]
        self._starts: list[int] = []
        total = 0
        for part in self.parts:
            self._starts.append(total)
            total += len(part)
        self._length = total

    def __len__(self) -> int:
        return self._length

    def views(self, start: int, length: int) -> list[memoryview]:
        """The pieces of the parts that hold bytes ``[start, start + length)``, in order."""
        if start < 0 or length < 0 or start + length > self._length:
            raise ValueError(f"bytes [{start}, {start + length}) are outside regions of {self._length} bytes")
        pieces: list[memoryview] = []
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while length > 0:
            part, within = self.parts[i], start - self._starts[i]
            take = min(length, len(part) - within)
            pieces.append(part[within : within + take])
            start += take
            length -= take
            i += 1
        return pieces

    def write(self, start: int, data: memoryview | bytes | bytearray) -> None:
        """Copy ``data`` to bytes ``[start, start + len(data))``."""
        source = memoryview(data).cast("B")
        done = 0
        for piece in self.views(start, len(source)):
            piece[:] = source[done : done + len(piece)]
            done += len(piece)


def as_regions(target: "memoryview | Regions") -> Regions:
    """``target`` itself if it is Regions, else one-part Regions over it."""
    return target if isinstance(target, Regions) else Regions([target])
