"""The block maps of the metadata store (a mixin of ``SqlStore``, ``engine.py``): layouts in
bounded segments, allocations, staged blocks, atomic commits, truncation. See ``engine.py``
for the tables and ``access.py`` for the permission checks (``caller``)."""

from __future__ import annotations

import json
from typing import Iterable

import msgspec

from .. import checksum, limits
from ..errors import ChecksumMismatch, InvalidArgument, IsADirectory, NoSpace, StaleFile
from ..policy import parse as parse_policy
from ..wire.values import Allocation, Attrs, Block, ChunkRef, InlineData, LayoutSegment, ServerRef, WrittenBlock
from . import access
from .access import Caller, R, W
from .base import StoreParts

# Upper bounds of encoded sizes (msgpack, field names included), for bounded layout replies:
# a block without its chunks; a chunk.
_BLOCK_BYTES_MAX = 160 + 112  # + its read capability (messages.Capability: 16-byte mac, expiry, key id <= 64)
_CHUNK_BYTES_MAX = 80 + limits.address_length_max_bytes


# What ``stage`` keeps of a block until its commit: the WrittenBlock as JSON text (rows staged by
# an older release, plain dicts of the same fields, read back the same).
_STAGED_ENCODER = msgspec.json.Encoder()
_STAGED_DECODER = msgspec.json.Decoder(WrittenBlock)


def write_min(attrs: Attrs) -> int:
    """Chunks a block of this file (or of files below this directory) needs to be accepted:
    the directory's setting, else the policy's default."""
    return int(attrs.write_min) or parse_policy(attrs.policy).write_min


def _p(parts: list[str]) -> str:
    return "/" + "/".join(parts)


class BlockMaps(StoreParts):
    def layout(
        self, parts: list[str] | None = None, ino: int | None = None, first: int = 0, reader: int = 0,
        write_only: bool = False, *, caller: Caller | None = None,
    ) -> LayoutSegment:
        """A segment of the file's block map: its attributes and the blocks with index in
        ``[first, end)``, each with its chunks and their servers. ``end`` is None when the
        segment reaches the end of the file; a large file comes in several segments, each
        bounded by ``limits.reply_header_budget_bytes``.

        Block ``idx`` covers file bytes ``[idx * block_size, idx * block_size + valid)``: its
        ``length`` stored bytes sit at ``start`` within it; the bytes before ``start`` and from
        ``start + length`` on are zeros. Indexes without a block are holes (zeros). With
        ``reader``, an opening handle takes its lease (``renew``) on the file. A caller needs
        read permission with ``reader`` (write permission if the handle is ``write_only``),
        else read or write permission."""
        attrs = self._resolve(parts or [], caller) if ino is None else self._get(ino)
        if attrs.kind == "dir":
            raise IsADirectory(f"/{'/'.join(parts or [])} is a directory")
        access.require(attrs, caller, *(((W,) if write_only else (R,)) if reader else (R, W)),
                       path=_p(parts or []) if ino is None else f"inode {ino}")
        if reader:
            self.renew(attrs.ino, reader=reader)
            if not write_only:
                attrs = self._accessed(attrs)
        width = parse_policy(attrs.policy).width
        budget = limits.reply_header_budget_bytes - limits.inline_bytes_max  # room for an inline block
        count = max(1, budget // (_BLOCK_BYTES_MAX + width * _CHUNK_BYTES_MAX))
        row = self._one(
            "SELECT idx FROM blocks WHERE ino = ? AND idx >= ? ORDER BY idx LIMIT 1 OFFSET ?", (attrs.ino, first, count)
        )
        end = None if row is None else int(row[0])
        rows = self._all(
            "SELECT b.idx, b.block_id, b.policy, b.start, b.length, b.valid, c.position, c.server_id, s.address,"
            " c.length, c.crc FROM blocks b JOIN chunks c ON c.block_id = b.block_id"
            " LEFT JOIN servers s ON s.server_id = c.server_id WHERE b.ino = ? AND b.idx >= ? AND b.idx < ?"
            " ORDER BY b.idx, c.position",
            (attrs.ino, first, limits.int64_max if end is None else end),
        )
        blocks: dict[int, Block] = {}
        for idx, block_id, policy, start, length, valid, position, server_id, address, clen, crc in rows:
            block = blocks.get(idx)
            if block is None:
                block = blocks[idx] = Block(idx=idx, block_id=block_id, policy=policy, start=start, length=length,
                                            valid=valid, chunks=[])
            block.chunks.append(ChunkRef(position=position, server_id=server_id, address=address, length=clen, crc=crc))
        for idx, start, length, valid, data, crc in self._all(
            "SELECT idx, start, length, valid, data, crc FROM inline_blocks WHERE ino = ? AND idx >= ? AND idx < ?",
            (attrs.ino, first, limits.int64_max if end is None else end),
        ):
            blocks[idx] = Block(idx=idx, block_id=0, policy=attrs.policy, start=start, length=length, valid=valid,
                                chunks=[], inline=InlineData(data=bytes(data), crc=crc))
        return LayoutSegment(attrs=attrs, blocks=sorted(blocks.values(), key=lambda b: b.idx), first=first, end=end,
                             inline_max=self._inline_max(attrs))

    def _inline_max(self, attrs: Attrs) -> int:
        """The largest file of ``attrs``'s that is committed inline (its block 0 kept here)."""
        return min(self.inline_max, attrs.block_size) if attrs.kind == "file" else 0

    def _accessed(self, attrs: Attrs) -> Attrs:
        """An open for reading (or a listing) of ``attrs``: its atime moves to now under
        Linux's ``relatime`` rule: when it is not newer than its mtime or ctime, or a day old.
        So a file read by a thousand ranks after a save costs one update, not a thousand."""
        now = self.clock()
        if attrs.atime <= attrs.mtime or attrs.atime <= attrs.ctime or now - attrs.atime >= 86_400:
            self._x("UPDATE inodes SET atime = ? WHERE ino = ?", (now, attrs.ino))
            return msgspec.structs.replace(attrs, atime=now)
        return attrs

    def allocate(
        self, ino: int, count: int, spares: int = limits.spare_servers_per_block, exclude: Iterable[int] = (),
        writer: int = 0, *, caller: Caller | None = None, absent_as: Attrs | None = None,
    ) -> list[Allocation]:
        """Reserve ``count`` block ids (fewer if their reply would outgrow its budget: the
        caller asks again) for file ``ino`` and choose, per block, ``width`` distinct
        live servers (least loaded first) plus up to ``spares`` spare ones, never one of
        ``exclude`` (servers the client just failed to reach). With fewer live servers than
        ``width`` but at least the policy's ``write_min``, the blocks get every live server
        (a degraded write: positions past the list are not stored); below that, NoSpace.
        A caller writes under ``access.require_writer``. ``absent_as``: the attributes to
        allocate by if no inode ``ino`` exists yet (a claimed directory's new file whose create
        is on its way: ``claimed_file``; the caller checked the claim)."""
        if not 1 <= count <= limits.allocate_blocks_max:
            raise InvalidArgument(f"allocate count {count} outside [1, {limits.allocate_blocks_max}]")
        if absent_as is not None and self._one("SELECT 1 FROM inodes WHERE ino = ?", (ino,)) is None:
            attrs = absent_as
        else:
            attrs = self._file(ino, caller)
        policy = parse_policy(attrs.policy)
        # Fewer blocks than asked when the reply would outgrow its budget (wide policies).
        count = min(count, max(1, limits.reply_header_budget_bytes
                               // (_BLOCK_BYTES_MAX + (policy.width + spares) * _CHUNK_BYTES_MAX)))
        excluded = set(exclude)
        live = [s for s in self.live_servers() if s.server_id not in excluded and s.state == "in"]
        minimum = write_min(attrs)
        if len(live) < minimum:
            raise NoSpace(
                f"{policy} needs at least {minimum} live chunk servers ({policy.width} for full"
                f" redundancy), {len(live)} are live"
                + ("" if live else ": start chunk servers (tectofs chunk) or check their heartbeats")
            )
        # Pending allocations weigh like data already stored, so one call spreads its blocks.
        load = {s.server_id: s.used + s.inflight for s in live}
        free = {s.server_id: s.capacity - s.used for s in live}
        chunk_estimate = attrs.block_size // policy.data
        first = self._next("block_id", count)
        now = self.clock()
        out: list[Allocation] = []
        for n in range(count):
            candidates = [sid for sid in load if free[sid] >= chunk_estimate] or list(load)
            self.rng.shuffle(candidates)  # tie-break so equal servers share the load
            candidates.sort(key=load.__getitem__)
            chosen = candidates[: policy.width + spares]
            if len([sid for sid in chosen if free[sid] >= chunk_estimate]) < minimum:
                raise NoSpace(f"fewer than {minimum} live chunk servers have room for a {chunk_estimate}-byte chunk")
            for sid in chosen[: policy.width]:
                load[sid] += chunk_estimate
                free[sid] -= chunk_estimate
            block_id = first + n
            self._x(
                "INSERT INTO allocations (block_id, ino, created, servers, writer) VALUES (?, ?, ?, ?, ?)",
                (block_id, ino, now, json.dumps(chosen), writer),
            )
            addresses = {s.server_id: s.address for s in live}
            out.append(Allocation(block_id=block_id, policy=str(policy), write_min=minimum,
                                  servers=[ServerRef(server_id=sid, address=addresses[sid]) for sid in chosen]))
        return out

    def _check_written_block(self, ino: int, attrs: Attrs, block: WrittenBlock) -> None:
        """A block a writer commits or stages: allocated to this file, not committed yet,
        its stored span inside the block, chunk positions distinct and at least the policy's
        ``write_min`` of them (all of them, unless the write was degraded). A block stored
        inline: see ``_check_inline_block``."""
        if block.inline is not None:
            self._check_inline_block(attrs, block)
            return
        row = self._one("SELECT ino FROM allocations WHERE block_id = ?", (block.block_id,))
        if row is None or row[0] != ino:
            raise InvalidArgument(f"block {block.block_id} was not allocated to inode {ino}, is committed, or its allocation"
                                  " expired (its writer renewed nothing for the allocation grace): nothing was published")
        start = block.start
        if not (0 <= start and 0 < block.length and start + block.length <= attrs.block_size):
            raise InvalidArgument(f"block {block.block_id}: {block.length} bytes at {start} do not fit a block")
        policy = parse_policy(attrs.policy)
        positions = sorted(c.position for c in block.chunks)
        minimum = write_min(attrs)
        if len(set(positions)) != len(positions) or not set(positions) <= set(range(policy.width)) or (
                len(positions) < minimum):
            raise InvalidArgument(
                f"block {block.block_id} has chunks {positions}; {policy} needs at least {minimum}"
                f" distinct positions in [0, {policy.width})"
            )

    def _check_inline_block(self, attrs: Attrs, block: WrittenBlock) -> None:
        """An inline block a writer commits: block 0 of a file that is at most ``inline_max``
        bytes (the size it commits is checked by ``commit``), no chunks, block id 0, ``length``
        bytes whose crc32c is the one sent."""
        assert block.inline is not None
        if block.idx != 0 or block.chunks or block.block_id:
            raise InvalidArgument(f"an inline block is block 0 with no chunks and no block id (got block {block.idx},"
                                  f" {len(block.chunks)} chunks, id {block.block_id})")
        data = block.inline.data
        if len(data) != block.length or block.start + block.length > self._inline_max(attrs):
            raise InvalidArgument(f"inline block of inode {attrs.ino}: {block.length} bytes at {block.start} with"
                                  f" {len(data)} bytes of data; at most {self._inline_max(attrs)} are stored inline")
        if checksum.crc(data) != block.inline.crc:
            raise ChecksumMismatch(f"inline block of inode {attrs.ino}: its data does not match its crc32c"
                                   " (damaged on the way)")

    def _file(self, ino: int, writing_caller: Caller | None = None) -> Attrs:
        """File ``ino``'s attributes, for writing its data with ``writing_caller``."""
        attrs = self._get(ino)
        if attrs.kind != "file":
            raise IsADirectory(f"inode {ino} is not a file")
        access.require_writer(attrs, writing_caller, f"inode {ino}")
        return attrs

    def stage(
        self, ino: int, writer: int, blocks: list[WrittenBlock], holes: Iterable[int] = (),
        cut_from: int | None = None, *, caller: Caller | None = None,
    ) -> None:
        """Record part of a commit ahead of it (a writer with more blocks than one call
        carries): nothing becomes visible until ``commit(..., writer=writer)``. ``cut_from``
        first withdraws what this writer staged at that index and above (it truncated);
        a later block or hole at an index replaces what was staged there."""
        attrs = self._file(ino, caller)
        for block in blocks:
            if block.inline is not None:
                raise InvalidArgument("an inline block is committed, never staged")
            self._check_written_block(ino, attrs, block)
        if cut_from is not None:
            for (block_id,) in self._all(
                "SELECT block_id FROM staged WHERE ino = ? AND writer = ? AND idx >= ? AND block_id IS NOT NULL",
                (ino, writer, cut_from),
            ):
                self._release_allocation(block_id, set())
            self._x("DELETE FROM staged WHERE ino = ? AND writer = ? AND idx >= ?", (ino, writer, cut_from))
        now = self.clock()
        entries: list[tuple[int, WrittenBlock | None]] = [(idx, None) for idx in holes]
        for idx, staged in entries + [(b.idx, b) for b in blocks]:
            old = self._one("SELECT block_id FROM staged WHERE ino = ? AND writer = ? AND idx = ?", (ino, writer, idx))
            if old is not None:
                if old[0] is not None and (staged is None or old[0] != staged.block_id):
                    self._release_allocation(old[0], set())
                self._x("DELETE FROM staged WHERE ino = ? AND writer = ? AND idx = ?", (ino, writer, idx))
            self._x(
                "INSERT INTO staged (ino, writer, idx, block_id, block, created) VALUES (?, ?, ?, ?, ?, ?)",
                (ino, writer, idx, None if staged is None else staged.block_id,
                 None if staged is None else _STAGED_ENCODER.encode(staged).decode(), now),
            )

    def _take_staged(self, ino: int, writer: int) -> tuple[dict[int, WrittenBlock], set[int]]:
        rows = self._all("SELECT idx, block FROM staged WHERE ino = ? AND writer = ?", (ino, writer))
        self._x("DELETE FROM staged WHERE ino = ? AND writer = ?", (ino, writer))
        blocks = {int(idx): _STAGED_DECODER.decode(block) for idx, block in rows if block is not None}
        return blocks, {int(idx) for idx, block in rows if block is None}

    def commit(
        self, ino: int, size: int, blocks: list[WrittenBlock], replace: bool, mtime: float | None = None,
        shrunk_to: int | None = None, holes: Iterable[int] = (), writer: int | None = None,
        atime: float | None = None, mode: int | None = None, *, caller: Caller | None = None,
        now: float | None = None,
    ) -> LayoutSegment:
        """Publish written blocks and the new size (and ``mtime``, and ``atime`` if given: a
        writer may set its file's times, as ``setattr`` lets it; and ``mode``'s permission
        bits, under ``setattr``'s rules for a chmod) in one step, at ``now`` (the ctime, and the
        mtime if none is given; None: the store's clock).

        ``blocks``: each allocated to this file and not committed before;
        with ``writer``, what that writer staged (``stage``) comes first, and ``blocks`` and
        ``holes`` override it index by index. ``replace`` drops every block not committed
        now first (a whole-file rewrite); otherwise, in this order: the file is cut to
        ``shrunk_to`` (the smallest size the writer truncated to since its last commit, so that
        bytes it cut off never come back when it grows the file again), the blocks at ``holes``
        are dropped (the writer zeroed them whole), the new blocks replace the old ones at
        their indexes (copy-on-write), and blocks past ``size`` are dropped.
        Returns the first segment of the file's new layout, so a writer that goes on reading
        needs no second call."""
        attrs = self._file(ino, caller)
        if mode is not None:
            mode = access.checked_setattr(attrs, caller, f"inode {ino}", (attrs.mode & ~0o7777) | (mode & 0o7777),
                                          None, None, times=False)
        block_size = attrs.block_size
        new, hole_set = self._take_staged(ino, writer) if writer is not None else ({}, set())
        for idx in holes:
            hole_set.add(idx)
            if idx in new:
                self._release_allocation(new.pop(idx).block_id, set())
        for block in blocks:
            hole_set.discard(block.idx)
            old = new.get(block.idx)
            if old is not None and old.block_id != block.block_id:
                self._release_allocation(old.block_id, set())
            new[block.idx] = block
        for block in new.values():
            self._check_written_block(ino, attrs, block)
        if size > self._inline_max(attrs) and any(b.inline is not None for b in new.values()):
            raise InvalidArgument(f"inode {ino}: a file of {size} bytes is not stored inline"
                                  f" (at most {self._inline_max(attrs)} bytes are)")
        if replace:
            self._drop_blocks(ino)
        else:
            if shrunk_to is not None:
                self._shrink(ino, shrunk_to, block_size)
            for idx in hole_set | set(new):
                self._drop_blocks(ino, only_idx=idx)
            self._shrink(ino, size, block_size)
        if now is None:
            now = self.clock()
        for block in new.values():
            start = block.start
            valid = min(start + block.length, size - block.idx * block_size)
            if valid <= start:  # nothing of it lies below the size: a hole after all
                self._release_allocation(block.block_id, set())
                continue
            if block.inline is not None:
                self._x("INSERT INTO inline_blocks (ino, idx, start, length, valid, data, crc) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (ino, block.idx, start, block.length, valid, block.inline.data, block.inline.crc))
                continue
            self._x(
                "INSERT INTO blocks (ino, idx, block_id, policy, start, length, valid, missing)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (ino, block.idx, block.block_id, attrs.policy, start, block.length, valid,
                 parse_policy(attrs.policy).width - len(block.chunks)),
            )
            for chunk in block.chunks:
                self._x(
                    "INSERT INTO chunks (block_id, position, server_id, length, crc, since) VALUES (?, ?, ?, ?, ?, ?)",
                    (block.block_id, chunk.position, chunk.server_id, chunk.length, chunk.crc, now),
                )
            self._release_allocation(block.block_id, {c.server_id for c in block.chunks})
        self._x("UPDATE inodes SET size = ?, mtime = ?, ctime = ?, atime = COALESCE(?, atime), mode = COALESCE(?, mode)"
                " WHERE ino = ?", (size, mtime or now, now, atime, mode, ino))
        self._count_stored(ino)
        return self.layout(ino=ino)

    def renew(
        self, ino: int, writer: int = 0, reader: int = 0, reader_lease_s: float = limits.reader_lease_s,
        *, caller: Caller | None = None,
    ) -> int:
        """``ServersAndLeases.renew``; a caller renews a writer's lease under
        ``access.require_writer`` and a reader's with read permission. The leases on a file
        that is gone (unlinked while open) are renewed unchecked: there is nothing to check
        them against, and they only delay the collection of its chunks."""
        if caller is not None:
            attrs: Attrs | None
            try:
                attrs = self._get(ino)
            except StaleFile:
                attrs = None
            if attrs is not None and writer:
                access.require_writer(attrs, caller, f"inode {ino}")
            if attrs is not None and reader:
                access.require(attrs, caller, R, path=f"inode {ino}")
        return super().renew(ino, writer, reader, reader_lease_s)

    def _release_allocation(self, block_id: int, used: set[int]) -> None:
        """Forget a committed block's allocation. Spare servers it did not end up on may hold
        a copy from a hedged or retried write that lost the race: queue those for deletion."""
        row = self._one("SELECT servers FROM allocations WHERE block_id = ?", (block_id,))
        if row is None:  # expired already: its chunks are queued for deletion
            return
        (servers,) = row
        due = self.clock() + self.gc_delay_s
        for server_id in set(json.loads(servers)) - used:
            self._x(
                "INSERT INTO gc_queue (server_id, block_id, due) VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                (server_id, block_id, due),
            )
        self._x("DELETE FROM allocations WHERE block_id = ?", (block_id,))

    def _shrink(self, ino: int, size: int, block_size: int) -> None:
        """Forget blocks wholly past ``size`` and clip the valid length of the last one, so a
        later extension reads zeros there, as POSIX requires. A last block left with no
        stored byte below ``size`` is dropped too."""
        self._drop_blocks(ino, from_idx=(size + block_size - 1) // block_size)
        if size % block_size:
            last, within = divmod(size, block_size)
            for table in ("blocks", "inline_blocks"):
                self._x(f"UPDATE {table} SET valid = ? WHERE ino = ? AND idx = ? AND valid > ?", (within, ino, last, within))
            if self._one("SELECT 1 FROM blocks WHERE ino = ? AND idx = ? AND valid <= start UNION ALL"
                         " SELECT 1 FROM inline_blocks WHERE ino = ? AND idx = ? AND valid <= start", (ino, last, ino, last)):
                self._drop_blocks(ino, only_idx=last)

    def _count_stored(self, ino: int) -> None:
        """Recount the bytes file ``ino`` really stores (holes and zero heads and tails excluded)."""
        self._x("UPDATE inodes SET stored = (SELECT COALESCE(SUM(valid - start), 0) FROM blocks WHERE ino = ?)"
                " + (SELECT COALESCE(SUM(valid - start), 0) FROM inline_blocks WHERE ino = ?) WHERE ino = ?", (ino, ino, ino))

    def truncate(self, parts: list[str], size: int, *, caller: Caller | None = None) -> Attrs:
        """Set the size of a file: shrinking drops data past ``size``; growing reads as zeros.
        A caller needs write permission."""
        attrs = self._regular_file(parts, caller, W)
        if size < 0:
            raise InvalidArgument("negative size")
        if size < attrs.size:
            self._shrink(attrs.ino, size, attrs.block_size)
            self._count_stored(attrs.ino)
        now = self.clock()
        self._x("UPDATE inodes SET size = ?, mtime = ?, ctime = ? WHERE ino = ?", (size, now, now, attrs.ino))
        return self._get(attrs.ino)

    def _regular_file(self, parts: list[str], caller: Caller | None, want: int) -> Attrs:
        """The regular file at ``parts``, once ``caller`` is allowed ``want`` (``R``, ``W``) on it."""
        attrs = self._resolve(parts, caller)
        if attrs.kind == "dir":
            raise IsADirectory(f"{_p(parts)} is a directory")
        if attrs.kind != "file":
            raise InvalidArgument(f"{_p(parts)} is not a regular file")
        access.require(attrs, caller, want, path=_p(parts))
        return attrs
