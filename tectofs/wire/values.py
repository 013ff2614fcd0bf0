"""The field types every message uses and the values shared by every role — attributes,
layouts, blocks, chunks, allocations, servers — as declared ``msgspec`` types. ``messages.py``
builds the requests and replies of both services from them (and re-exports them: use them as
``messages.Attrs`` and so on)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from tectofs import limits

# ---------------------------------------------------------------------- field types

Int64 = Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)]
Ino = Annotated[int, msgspec.Meta(ge=1, le=limits.int64_max)]
Id = Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)]
Crc = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF_FFFF)]
Position = Annotated[int, msgspec.Meta(ge=0, le=limits.policy_width_max - 1)]
Mode = Annotated[int, msgspec.Meta(ge=0, le=0o7777)]
Owner = Annotated[int, msgspec.Meta(ge=0, le=limits.owner_id_max)]  # uid or gid; 2**32-1 means "none"
Time = Annotated[float, msgspec.Meta(ge=-limits.timestamp_abs_max_s, le=limits.timestamp_abs_max_s)]  # finite
# Bounded here; checked (absolute, components, NUL, lengths in bytes) by tectofs.paths, which
# gives the clearer InvalidPath error.
Path = Annotated[str, msgspec.Meta(max_length=limits.path_length_max_bytes)]  # characters: at most its bytes
Name = Annotated[str, msgspec.Meta(max_length=limits.name_length_max_bytes)]
Text = Annotated[str, msgspec.Meta(max_length=limits.message_text_max_bytes)]
PolicyText = Annotated[str, msgspec.Meta(max_length=32)]
Address = Annotated[str, msgspec.Meta(min_length=3, max_length=limits.address_length_max_bytes)]
# http://HOST:PORT/metrics of a server's Prometheus endpoint (server/addresses.py)
MetricsUrl = Annotated[str, msgspec.Meta(pattern="^https?://", max_length=limits.address_length_max_bytes + 32)]
BlockSize = Annotated[int, msgspec.Meta(ge=limits.block_size_min_bytes, le=limits.block_size_max_bytes)]
BlockOffset = Annotated[int, msgspec.Meta(ge=0, le=limits.block_size_max_bytes)]
ChunkLength = Annotated[int, msgspec.Meta(ge=0, le=limits.block_size_max_bytes)]
# A file handle (tectofs.wire.auth): what lets a user name an inode by number; b"" where none is needed
# (cluster members, and root, who may reach every inode by path anyway).
Handle = Annotated[bytes, msgspec.Meta(max_length=16)]
Kind = Literal["file", "dir", "symlink", "fifo", "socket", "char", "block"]
Role = Literal["client", "chunk", "meta", "tool", "agent"]


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """Base of every message: immutable, keyword-only."""


# ---------------------------------------------------------------------- shared values


class Attrs(Message, frozen=True, kw_only=True):
    """An inode's attributes. ``stored``: bytes of data really stored (holes excluded)."""

    ino: Ino
    kind: Kind
    mode: Annotated[int, msgspec.Meta(ge=0, le=0o177777)]  # permission and file-type bits
    uid: Owner
    gid: Owner
    size: Int64
    atime: Time
    mtime: Time
    ctime: Time
    nlink: Int64
    policy: PolicyText
    block_size: BlockSize
    target: Annotated[str, msgspec.Meta(max_length=limits.symlink_target_max_bytes)] | None = None
    parent: Ino
    stored: Int64 = 0
    write_min: Int64 = 0  # chunks a block needs to be accepted (0: the policy's default)
    rdev: Int64 = 0  # a char or block device node's device number
    handle: Handle = b""  # for the caller's uid: present it to name this inode by number (tectofs.wire.auth)
    # how many extended attributes it has (None: a service too old to say); a client holding
    # these attributes under a lease answers the probes of an inode that has none itself
    xattrs: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] | None = None


Nonce = Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]
Proof = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
KeyId = Annotated[str, msgspec.Meta(max_length=64)]
UserName = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class Capability(Message, frozen=True, kw_only=True):
    """The metadata service's permission to read (layouts) or write (allocations) one block's
    chunks until ``expiry`` (seconds since 1970), signed with cluster key ``key``
    (``tectofs.wire.auth``): chunk servers check it on every anonymous get and put. A write
    capability also names, signed with the rest, the ``uid`` it was allocated for: the
    principal whose share of a chunk server's in-flight budget its puts draw on
    (``server/chunk/admission.py``); None from a metadata service older than that."""

    mac: Annotated[bytes, msgspec.Meta(min_length=16, max_length=16)]
    expiry: Int64
    key: KeyId
    uid: Annotated[int, msgspec.Meta(ge=0, le=limits.owner_id_max)] | None = None


class ChunkRef(Message, frozen=True, kw_only=True):
    """Where one chunk of a block lives, and its whole-chunk crc32c."""

    position: Position
    server_id: Id
    address: Address | None = None  # None: the server is not registered any more
    length: ChunkLength
    crc: Crc
    # Layouts only: a client set this server aside lately and the metadata service has not heard
    # from it since (server/meta/set_aside.py): read other chunks first. (Older peers: ignored.)
    set_aside: bool = False


class InlineData(Message, frozen=True, kw_only=True):
    """A small file's stored bytes, kept in the metadata store instead of chunks (a block
    stored inline), and their crc32c: the writer computes it, the store checks it and keeps it,
    every reader checks it again."""

    data: Annotated[bytes, msgspec.Meta(max_length=limits.inline_bytes_max)]
    crc: Crc


class Block(Message, frozen=True, kw_only=True):
    """One committed (or written, not yet committed) block of a file.

    It covers file bytes ``[idx * block_size, idx * block_size + valid)``; its ``length``
    stored bytes sit at ``start`` within it, and everything else in it reads as zeros.
    A block stored inline (a small file's block 0) has ``inline`` (its ``length`` bytes), no
    chunks and ``block_id`` 0."""

    idx: Int64
    block_id: Id
    policy: PolicyText
    start: BlockOffset = 0
    length: ChunkLength
    valid: BlockOffset
    chunks: Annotated[list[ChunkRef], msgspec.Meta(max_length=limits.policy_width_max)]
    cap: Capability | None = None  # to read its chunks (layouts); None in what a writer commits
    inline: InlineData | None = None


class WrittenChunk(Message, frozen=True, kw_only=True):
    position: Position
    server_id: Id
    length: ChunkLength
    crc: Crc


class WrittenBlock(Message, frozen=True, kw_only=True):
    """A block as a writer commits (or stages) it: where its chunks went, or (``inline``,
    commits only, no chunks, ``block_id`` 0) its bytes themselves."""

    idx: Int64
    block_id: Id
    start: BlockOffset = 0
    length: Annotated[int, msgspec.Meta(ge=1, le=limits.block_size_max_bytes)]
    chunks: Annotated[list[WrittenChunk], msgspec.Meta(max_length=limits.policy_width_max)]
    inline: InlineData | None = None


class LayoutSegment(Message, frozen=True, kw_only=True):
    """The blocks of a file with index in ``[first, end)`` (``end`` None: to the end of the
    file); an index in that range without a block is a hole. Bounded by construction: the
    metadata service ends a segment early (a smaller ``end``) rather than exceed the frame."""

    attrs: Attrs
    blocks: list[Block]
    first: Int64 = 0
    end: Int64 | None = None
    # Files up to this size are stored inline (the whole file one block in the metadata
    # store); 0: never (a service that does not, or --inline-max 0).
    inline_max: Int64 = 0
    # A commit's answer to a writer that asked not to have its inline block echoed: that
    # block's ``inline.data`` is empty here, its bytes being the ones the commit carried
    # (``tectofs.wire.inline_echo``).
    inline_omitted: bool = False


class ServerRef(Message, frozen=True, kw_only=True):
    server_id: Id
    address: Address


class Allocation(Message, frozen=True, kw_only=True):
    """A block id reserved for a file and where to put its chunks: ``width`` servers, then spares."""

    block_id: Id
    policy: PolicyText
    servers: list[ServerRef]
    write_min: Int64 = 0  # chunks that must be stored for the block to be accepted (0: the policy's)
    cap: Capability | None = None  # to put its chunks


class DirEntry(Message, frozen=True, kw_only=True):
    name: Name
    attrs: Attrs


class ServerInfo(Message, frozen=True, kw_only=True):
    server_id: Id
    uuid: Text
    address: Address
    capacity: Int64
    used: Int64
    inflight: Int64
    chunks: Int64
    last_heartbeat: float
    live: bool
    state: Text = "in"  # "in" | "draining"
    stats: dict[str, int] = {}
    metrics_url: MetricsUrl | None = None  # its Prometheus endpoint; None: off (or a server of 0.1.0)


XattrName = Annotated[str, msgspec.Meta(min_length=1, max_length=4 * limits.xattr_name_max_bytes)]


class XattrEntry(Message, frozen=True, kw_only=True):
    """An extended attribute set with a file's content (``CreateRequest.xattrs``)."""

    name: XattrName
    value: Annotated[bytes, msgspec.Meta(max_length=limits.xattr_value_max_bytes)]


def written(block: Block) -> WrittenBlock:
    """What a writer commits of a block it wrote."""
    return WrittenBlock(
        idx=block.idx, block_id=block.block_id, start=block.start, length=block.length,
        chunks=[WrittenChunk(position=c.position, server_id=c.server_id, length=c.length, crc=c.crc) for c in block.chunks],
        inline=block.inline,
    )
