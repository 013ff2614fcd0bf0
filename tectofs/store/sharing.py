"""Blocks shared between files (a mixin of ``SqlStore``, ``engine.py``): an incremental
checkpoint's file points at the blocks of the previous checkpoint's file that it would have
rewritten with the same bytes.

A block is shared by giving a second ``blocks`` row (another file, or another index) the
same ``block_id``; the block's ``chunks`` rows (one per stored chunk, keyed by ``block_id``)
exist once. The references to a block are counted by the store as the ``blocks`` rows that
carry its id (indexed: ``blocks_block_id``), so nothing can drift out of step with the block
maps themselves:

* dropping a file's blocks (``engine._drop_blocks``: unlink, replace, truncate, overwrite)
  deletes a block's chunks, and queues them for the chunk servers' garbage collection, only
  when its last row goes; a block another file still uses stays whole;
* repair and scrub work on ``block_id``s (the ``chunks`` and ``repairs`` tables), so a shared
  block is rebuilt once, for every file that uses it;
* a reference is taken in one transaction (``reference_blocks``) on a file that exists:
  there is no state in between in which a block is referenced by something the store cannot
  see. The checkpoint writer references blocks into files of its hidden pending directory,
  before the commit that renames it into place: a crash before the commit leaves the
  references in a directory no reader opens, which ``tectofs gc`` deletes like any other
  leftover, dropping its references and never the chunks the previous checkpoint still uses.
"""

from __future__ import annotations

from .. import limits
from ..errors import InvalidArgument
from ..wire.values import Attrs
from . import access
from .access import Caller, R, W, X
from .base import StoreParts

SHARING_SCHEMA = ["CREATE INDEX IF NOT EXISTS blocks_block_id ON blocks (block_id)"]


def _p(parts: list[str]) -> str:
    return "/" + "/".join(parts)


class SharedBlocks(StoreParts):
    def reference_blocks(
        self, target: list[str], source: list[str], pairs: list[tuple[int, int]], *, caller: Caller | None = None,
    ) -> Attrs:
        """Make block ``target_idx`` of file ``target`` the block ``source_idx`` of file
        ``source`` for each ``(target_idx, source_idx)`` of ``pairs``: the same chunks, counted
        once more, the same stored span (``start``, ``length``, ``valid``), policy and checksums.
        Whatever ``target`` held at those indexes is dropped. Each referenced block must lie
        wholly within ``target``'s size (grow it first with ``truncate``); both files must have
        the same block size, and the source blocks must be stored in chunks (not inline).
        A caller needs write permission on ``target`` and read permission on ``source``.
        Returns ``target``'s attributes after; all or nothing (one transaction)."""
        if len(pairs) > limits.commit_blocks_max:
            raise InvalidArgument(f"{len(pairs)} blocks: at most {limits.commit_blocks_max} per reference_blocks")
        into, origin = self._regular_file(target, caller, W), self._regular_file(source, caller, R)
        if into.ino == origin.ino:
            raise InvalidArgument(f"{_p(target)}: a file cannot reference its own blocks")
        if into.block_size != origin.block_size:
            raise InvalidArgument(f"{_p(target)} has {into.block_size}-byte blocks and {_p(source)}"
                                  f" {origin.block_size}-byte ones: only blocks of the same size can be shared")
        targets = [t for t, _ in pairs]
        if len(set(targets)) != len(targets):
            raise InvalidArgument(f"{_p(target)}: a block index is referenced twice")
        rows = []
        for target_idx, source_idx in pairs:
            row = self._one("SELECT block_id, policy, start, length, valid, missing FROM blocks"
                            " WHERE ino = ? AND idx = ?", (origin.ino, source_idx))
            if row is None:
                raise InvalidArgument(f"{_p(source)} has no stored block {source_idx} (a hole, inline, or past its end)")
            if target_idx < 0 or target_idx * into.block_size + int(row[4]) > into.size:
                raise InvalidArgument(f"block {target_idx} of {_p(target)} would lie past its size {into.size}:"
                                      " truncate it to its final size first")
            rows.append((target_idx, row))
        for target_idx, (block_id, policy, start, length, valid, missing) in rows:
            self._drop_blocks(into.ino, only_idx=target_idx)
            self._x("INSERT INTO blocks (ino, idx, block_id, policy, start, length, valid, missing)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (into.ino, target_idx, block_id, policy, start, length, valid, missing))
        now = self.clock()
        self._x("UPDATE inodes SET mtime = ?, ctime = ? WHERE ino = ?", (now, now, into.ino))
        self._count_stored(into.ino)
        return self._get(into.ino)

    def shared_blocks(
        self, directory: list[str], names: list[str], offset: int = 0, limit: int = 16384, *, caller: Caller | None = None,
    ) -> tuple[list[tuple[int, int, int]], bool]:
        """For the files ``names`` of ``directory`` (other names are skipped): ``(i, block_id,
        stored bytes)`` of each of their blocks that some use elsewhere (another file, or
        another index) shares, ``i`` indexing ``names``; blocks used once are unique to their
        file. At most ``limit`` rows from row ``offset`` on, and whether more follow.
        ``tectofs du`` counts a subtree's unique bytes from it: its logical bytes less every
        use of a shared block after the first within the subtree. A caller needs to be
        allowed to list ``directory``."""
        if len(names) > limits.health_inos_per_call_max:
            raise InvalidArgument(f"shared_blocks takes at most {limits.health_inos_per_call_max} files")
        parent = self._resolve(directory, caller)
        access.require(parent, caller, R | X, path=_p(directory))
        inos: dict[int, int] = {}
        for i, name in enumerate(names):
            child = self._child_attrs(parent.ino, name)
            if child is not None and child.kind == "file":
                inos.setdefault(child.ino, i)
        if not inos:
            return [], False
        marks = ", ".join("?" for _ in inos)
        rows = self._all(
            f"SELECT b.ino, b.block_id, b.valid - b.start FROM blocks b WHERE b.ino IN ({marks}) AND EXISTS"
            " (SELECT 1 FROM blocks o WHERE o.block_id = b.block_id AND (o.ino != b.ino OR o.idx != b.idx))"
            " ORDER BY b.ino, b.idx LIMIT ? OFFSET ?", (*inos, limit + 1, offset))
        out = [(inos[int(ino)], int(block_id), int(nbytes)) for ino, block_id, nbytes in rows[:limit]]
        return out, len(rows) > limit
