"""Incremental checkpoints (``CheckpointWriter(incremental=True)``): a piece of a tensor whose
content hash equals that of the same piece of the same item in the previous committed
checkpoint of the job is not written again; the new file references the previous file's block
(``tectofs.store.sharing``: the same chunks, counted once more).

Pieces are the file's blocks. In an incremental checkpoint every raw tensor item of at least
``ALIGN_MIN_BYTES`` starts on a block boundary and owns its blocks (the bytes after its end,
up to the next boundary, are a hole: stored as nothing), so piece ``k`` of an item is block
``offset // block_size + k`` of its file and holds nothing else. Each item records the
SHA-256 (first ``PIECE_DIGEST_BYTES``) of each piece beside its crc32c; the next save hashes
its pieces, and those equal to the previous checkpoint's at the same item, offset within the
item and length are referenced. Smaller items and pickled objects follow the aligned ones,
packed, and are written every time. The crc32c of every item is computed over all its bytes,
written or referenced, and checked at load as for any checkpoint.

Crash safety: references are taken on files of the pending directory, after they are written
and grown to their final size, and before the commit that renames the directory into place.
A crash before the commit leaves references in a directory no loader reads, deleted by
``tectofs gc`` without touching the chunks the previous checkpoint holds (shared blocks live
while any file uses them). If the previous checkpoint disappears during the save, the pieces
it would have lent are written from memory instead: the save never depends on it being kept.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import TYPE_CHECKING, Any

from torch.distributed.checkpoint.metadata import MetadataIndex

from .. import errors
from ..checkpoint_gc import METADATA_NAME

if TYPE_CHECKING:
    from ..client import FileSystem, RawFile

PIECE_DIGEST_BYTES = 16
ALIGN_MIN_BYTES = 1 << 20  # smaller raw tensors are packed after the aligned ones, never shared


def previous_checkpoint(fs: FileSystem, parent: str, name: str) -> str | None:
    """The path of the newest committed checkpoint in ``parent`` other than ``name`` (the
    order of :func:`tectofs.torch.checkpoints`: step number, else mtime), or None."""
    from ._manage import ordered_names

    try:
        entries = fs.scandir(parent)
    except FileNotFoundError:
        return None
    for candidate in reversed(ordered_names(entries)):
        path = f"{parent.rstrip('/')}/{candidate}"
        if candidate != name and fs.exists(f"{path}/{METADATA_NAME}"):
            return path
    return None


def previous_items(fs: FileSystem, checkpoint: str) -> dict[MetadataIndex, Any]:
    """Each item of the committed checkpoint at ``checkpoint`` with where it lives (its
    ``storage_data``); empty if it cannot be read (then everything is written)."""
    try:
        metadata = pickle.loads(fs.read_bytes(f"{checkpoint}/{METADATA_NAME}"))
    except (FileNotFoundError, errors.TectofsError, pickle.UnpicklingError, AttributeError, EOFError):
        return {}
    return dict(getattr(metadata, "storage_data", None) or {})


def digests(view: memoryview, block_size: int) -> list[bytes]:
    """The digest of each ``block_size`` piece of ``view`` (hashlib releases the GIL: run it on
    a pool to hash several items at once)."""
    return [hashlib.sha256(view[i : i + block_size]).digest()[:PIECE_DIGEST_BYTES]
            for i in range(0, view.nbytes, block_size)]


def shared_pieces(previous: Any, nbytes: int, pieces: list[bytes], block_size: int) -> list[int]:
    """The pieces (indexes) of an item of ``nbytes`` with digests ``pieces`` that the same
    item of the previous checkpoint (its ``_ItemInfo``, or None) stored with the same bytes,
    in blocks of its own (aligned, of a file with the same block size)."""
    old = getattr(previous, "pieces", None)
    if (not old or previous.fmt != "raw" or previous.length != nbytes or previous.offset % block_size
            or len(old) != len(pieces)):
        return []
    return [k for k, (a, b) in enumerate(zip(old, pieces)) if a == b]


def runs(indexes: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of consecutive ``indexes`` (sorted)."""
    out: list[list[int]] = []
    for i in indexes:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return [(a, b) for a, b in out]


def aligned(offset: int, block_size: int) -> int:
    return -(-offset // block_size) * block_size


class References:
    """The blocks one new data file takes from the previous checkpoint's files, and how to
    write them instead if that checkpoint went away meanwhile."""

    def __init__(self, fs: FileSystem, path: str, block_size: int) -> None:
        self.fs = fs
        self.path = path
        self.block_size = block_size
        self._pairs: dict[str, list[tuple[int, int]]] = {}  # source file -> (block here, block there)
        self._bytes: dict[str, list[tuple[int, memoryview]]] = {}  # source file -> (offset here, bytes)
        self.referenced_bytes = 0

    def add(self, source: str, offset: int, source_offset: int, view: memoryview, pieces: list[int]) -> None:
        """Pieces ``pieces`` of the item ``view`` at ``offset`` here are those of the item at
        ``source_offset`` in file ``source``."""
        bs = self.block_size
        for k in pieces:
            self._pairs.setdefault(source, []).append((offset // bs + k, source_offset // bs + k))
            piece = view[k * bs : (k + 1) * bs]
            self._bytes.setdefault(source, []).append((offset + k * bs, piece))
            self.referenced_bytes += piece.nbytes

    def write(self, raw: RawFile, name: str, offset: int, view: memoryview, pieces: list[bytes] | None,
              previous: Any, previous_dir: str | None) -> None:
        """Write the item ``view`` at ``offset`` (aligned) of the open file ``raw`` (``name`` in
        the checkpoint): the pieces whose digests (``pieces``) equal those of the same item of
        the previous checkpoint (``previous``: its ``_ItemInfo``, in ``previous_dir``) are only
        recorded, to be referenced by :meth:`apply`; the others are written."""
        bs, n = self.block_size, view.nbytes
        same = shared_pieces(previous, n, pieces, bs) if pieces and previous_dir else []
        if same:
            self.add(f"{previous_dir}/{previous.relative_path}", offset, previous.offset, view, same)
        for first, stop in runs(sorted(set(range(-(-n // bs))) - set(same))):
            piece = view[first * bs : min(stop * bs, n)]
            if raw.pwritev([piece], offset + first * bs) != piece.nbytes:
                raise errors.CheckpointError(f"{name}: short write at offset {offset + first * bs}")

    def apply(self, size: int) -> int:
        """Grow the file to ``size`` (its final size) and take the references; the pieces of a
        source that is gone (or changed: the store refuses the reference) are written instead.
        Returns the bytes written that way."""
        if not self._pairs:
            return 0
        if self.fs.stat(self.path).size < size:
            self.fs.truncate(self.path, size)
        written = 0
        for source, pairs in self._pairs.items():
            try:
                self.fs.reference_blocks(self.path, source, pairs)
            except (FileNotFoundError, errors.InvalidArgument):
                with self.fs.open(self.path, "r+b", buffering=0) as raw:
                    for offset, piece in self._bytes[source]:
                        written += raw.pwritev([piece], offset)
                self.referenced_bytes -= sum(p.nbytes for _, p in self._bytes[source])
        return written
