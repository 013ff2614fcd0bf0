"""What a stored chunk's checksummed header or footer says about it (both chunk layouts)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)  # one per packed chunk in a chunk server's index: keep it small
class ChunkInfo:
    block_id: int
    position: int
    length: int
    whole_crc: int
    piece_crcs: list[int]
