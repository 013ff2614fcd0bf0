"""What one open file knows of its block map.

Layouts arrive in segments (``messages.LayoutSegment``: the blocks with index in ``[first,
end)``), so a handle on a file of a million blocks holds the part it uses. :class:`LayoutMap`
keeps the known ranges of block indexes and the blocks in them: inside a known range, an index
without a block is a hole; outside every known range the handle must fetch a segment first.
"""

from __future__ import annotations

from tectofs.wire import messages


class LayoutMap:
    def __init__(self, segment: messages.LayoutSegment) -> None:
        self.blocks: dict[int, messages.Block] = {}
        self._ranges: list[tuple[int, int | None]] = []  # sorted, disjoint [first, end); None: no end
        self.add(segment)

    def add(self, segment: messages.LayoutSegment) -> None:
        """Learn a segment (it replaces what was known of its range)."""
        for idx in [i for i in self.blocks if i >= segment.first and (segment.end is None or i < segment.end)]:
            del self.blocks[idx]
        for block in segment.blocks:
            self.blocks[block.idx] = block
        self._cover(segment.first, segment.end)

    def known(self, idx: int) -> bool:
        return any(first <= idx and (end is None or idx < end) for first, end in self._ranges)

    def first_unknown(self, first: int, last: int) -> int | None:
        """The lowest index in ``[first, last]`` outside every known range, or None."""
        idx = first
        for start, end in self._ranges:
            if end is not None and end <= idx:
                continue
            if start > idx:
                return idx
            if end is None:
                return None
            idx = end
            if idx > last:
                return None
        return idx if idx <= last else None

    def forget_from(self, first: int) -> None:
        """Everything from block ``first`` on is gone (a truncate): known, and holes."""
        for idx in [i for i in self.blocks if i >= first]:
            del self.blocks[idx]
        self._cover(first, None)

    def _cover(self, first: int, end: int | None) -> None:
        merged: list[tuple[int, int | None]] = []
        for start, stop in sorted(self._ranges + [(first, end)]):
            if merged:
                last_start, last_stop = merged[-1]
                if last_stop is None or start <= last_stop:
                    merged[-1] = (last_start, None if last_stop is None or stop is None else max(last_stop, stop))
                    continue
            merged.append((start, stop))
        self._ranges = merged
