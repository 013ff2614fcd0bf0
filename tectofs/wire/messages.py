"""Every message of both services as a declared type, and the table of operations.

A request's msgpack header is converted into its request type with ``msgspec.convert(...,
strict=True)``: wrong types, missing fields and out-of-range values are refused there, with
an error that names the field, before any handler or store sees the request. Replies are
declared too, and every reply is bounded by construction (listings page with a cursor, layouts
come in segments of block indexes); ``tests/test_messages.py`` checks the bound of each.

The values shared by every role — attributes, layouts, blocks, chunks, allocations — are the
``Struct`` types of ``values.py``, re-exported here; the metadata service, the client,
the FUSE adapter and the plugin all use them.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from tectofs import limits
from tectofs.wire.claims import CLAIM_DIRECTORY, CREATE_MANY
from tectofs.wire.leases import KEEPALIVE, SESSION_BYTES
from tectofs.wire.operation import AnyOperation, Operation, ReplyT, RequestT, table  # noqa: F401 (re-exported)
from tectofs.wire.shared_blocks import REFERENCE_BLOCKS, SHARED_BLOCKS
from tectofs.wire.tickets import TICKET, TICKET_SECRET, Ticket, TicketReply, TicketRequest, TicketSecretReply  # noqa: F401
from tectofs.wire.values import (  # noqa: F401 (re-exported)
    Address,
    Allocation,
    Attrs,
    Block,
    BlockOffset,
    BlockSize,
    Capability,
    ChunkLength,
    ChunkRef,
    Crc,
    DirEntry,
    Handle,
    Id,
    InlineData,
    Ino,
    Int64,
    KeyId,
    Kind,
    LayoutSegment,
    Message,
    MetricsUrl,
    Mode,
    Name,
    Nonce,
    Owner,
    Path,
    PolicyText,
    Position,
    Proof,
    Role,
    ServerInfo,
    ServerRef,
    Text,
    Time,
    UserName,
    WrittenBlock,
    WrittenChunk,
    XattrEntry,
    XattrName,
    written,
)

# ---------------------------------------------------------------------- handshake


class ActAs(Message, frozen=True, kw_only=True):
    """The local user a proxy credential (a multi-user FUSE mount) acts for on this connection."""

    uid: Owner
    gid: Owner
    groups: Annotated[list[Owner], msgspec.Meta(max_length=256)] = []


class HelloAuth(Message, frozen=True, kw_only=True):
    """Who a connection claims to be (``tectofs.wire.auth``): a cluster member proving the key
    ``key_id``, or ``user`` (root: with the key its secret derives from), or the holder of
    ``ticket`` (to servers outside the cluster's core: memory agents); ``nonce`` is the
    client's challenge to the server."""

    kind: Literal["key", "user", "ticket"]
    nonce: Nonce
    key_id: KeyId = ""
    user: Annotated[str, msgspec.Meta(max_length=64)] = ""
    act_as: ActAs | None = None
    ticket: Ticket | None = None


class Hello(Message, frozen=True, kw_only=True):
    """First request on every connection."""

    role: Role
    version: Annotated[int, msgspec.Meta(ge=0, le=255)]
    software: Text = ""
    auth: HelloAuth | None = None
    session: Annotated[bytes, msgspec.Meta(max_length=SESSION_BYTES)] = b""  # its lease session (wire/leases.py)


class HelloReply(Message, frozen=True, kw_only=True):
    role: Role
    version: int
    software: str = ""
    nonce: bytes = b""  # the server's challenge (when the hello carried auth)
    proof: bytes = b""  # the server's answer to the client's challenge
    local: str = ""  # an abstract Unix socket name to reach the same server by, from this host (local_sockets)
    pid: int = 0  # with ``local``: the server's process id, which the Unix socket's peer must have


class AuthRequest(Message, frozen=True, kw_only=True):
    """Second frame of an authenticating connection: the client's answer to the server's
    challenge. Not answered: a wrong one closes the connection with an error."""

    proof: Proof


# ---------------------------------------------------------------------- metadata service


class PathRequest(Message, frozen=True, kw_only=True):
    path: Path


class InoRequest(Message, frozen=True, kw_only=True):
    """Every request that names an inode by number carries the caller's ``handle`` for it
    (``Attrs.handle``, from the lookup, create, open or listing that reached it)."""

    ino: Ino
    handle: Handle = b""


class AttrsReply(Message, frozen=True, kw_only=True):
    """``directory``, ``directory_ctime_before`` (a mkdir's): the attributes of the new
    directory's parent after the call, and its ctime before (as ``CreateReply``)."""

    attrs: Attrs
    walk: Annotated[list[Ino], msgspec.Meta(max_length=limits.path_length_max_bytes // 2)] = []  # leased lookups: dirs walked
    directory: Attrs | None = None
    directory_ctime_before: Time | None = None


class Empty(Message, frozen=True, kw_only=True):
    pass


class CreateReply(Message, frozen=True, kw_only=True):
    """``directory``: the attributes of the file's directory after the call;
    ``directory_ctime_before``: its ctime before (NFSv3's ``wcc_data``: equal to the ctime a
    client saw after its previous change there if nobody else changed the directory since)."""

    attrs: Attrs
    created: bool = False  # the file did not exist before this call
    directory: Attrs | None = None
    directory_ctime_before: Time | None = None
    inline_max: Int64 = 0  # as LayoutSegment.inline_max
    content_stored: bool = False  # the request's content was committed (else: too large to keep inline)


class UnlinkReply(Message, frozen=True, kw_only=True):
    """``directory``: the attributes of the directory the name was in, after the call;
    ``directory_ctime_before``: its ctime before (as ``CreateReply``)."""

    directory: Attrs | None = None
    directory_ctime_before: Time | None = None


class UnlinkRequest(Message, frozen=True, kw_only=True):
    """``ino``: only if the name still leads to this inode; ``only_if_empty``: only if the
    file holds no data and no handle but ``reader``'s (the caller's lease) has it open (a
    failed writer taking back the file it created, not one another writer opened meanwhile)."""

    path: Path
    ino: Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)] = 0
    only_if_empty: bool = False
    reader: Id = 0


class UnlinkManyRequest(Message, frozen=True, kw_only=True):
    """Remove ``names`` (not directories) from ``directory`` in one transaction: all of them,
    or (the first failure raised) none."""

    directory: Path
    names: Annotated[list[Name], msgspec.Meta(min_length=1, max_length=limits.unlink_batch_max)]


class MkdirRequest(Message, frozen=True, kw_only=True):
    path: Path
    mode: Mode = 0o755
    uid: Owner = 0
    gid: Owner = 0
    policy: PolicyText | None = None
    block_size: BlockSize | None = None
    exist_ok: bool = False


class CreateRequest(Message, frozen=True, kw_only=True):
    """``reader``: the opening handle's lease (see RenewRequest), taken in the same call.
    ``content``: a small file's whole content, replacing any it had, committed in this same
    call (with ``mtime``, and ``xattrs`` set too): a small file written in one round trip.
    Content larger than the file may keep inline is not stored (``CreateReply.content_stored``)."""

    path: Path
    mode: Mode = 0o644
    uid: Owner = 0
    gid: Owner = 0
    exclusive: bool = False
    reader: Id = 0
    content: InlineData | None = None
    mtime: Time | None = None
    xattrs: Annotated[list[XattrEntry], msgspec.Meta(max_length=limits.create_xattrs_max)] = []


class LinkRequest(Message, frozen=True, kw_only=True):
    """A new name ``dst`` for the file ``src`` (a hard link)."""

    src: Path
    dst: Path




class XattrRequest(Message, frozen=True, kw_only=True):
    """One extended attribute of ``path`` (``getxattr``, ``removexattr``)."""

    path: Path
    name: XattrName


class SetxattrRequest(Message, frozen=True, kw_only=True):
    """``flags``: 1 fails if it exists (XATTR_CREATE), 2 if it does not (XATTR_REPLACE)."""

    path: Path
    name: XattrName
    value: Annotated[bytes, msgspec.Meta(max_length=limits.xattr_value_max_bytes)]
    flags: Annotated[int, msgspec.Meta(ge=0, le=3)] = 0


class XattrReply(Message, frozen=True, kw_only=True):
    value: Annotated[bytes, msgspec.Meta(max_length=limits.xattr_value_max_bytes)]


class ListxattrReply(Message, frozen=True, kw_only=True):
    names: Annotated[list[XattrName], msgspec.Meta(max_length=limits.xattr_names_max_bytes // 2)]


class ReleaseRequest(Message, frozen=True, kw_only=True):
    """A handle closed: its lease ``reader`` on ``ino`` ends."""

    ino: Ino
    reader: Id
    handle: Handle = b""


class HeldLease(Message, frozen=True, array_like=True):
    """``uid``: whom ``handle`` was issued to, when not the caller (a multi-user mount ends its
    users' leases on its own connection; only a proxy may name another uid)."""

    ino: Ino
    reader: Id
    handle: Handle = b""
    uid: Owner | None = None


class ReleaseLeasesRequest(Message, frozen=True, kw_only=True):
    """Handles closed: each of their leases ends (``release`` for many, sent in batches)."""

    leases: Annotated[list[HeldLease], msgspec.Meta(min_length=1, max_length=limits.leases_per_release_max)]


class SymlinkRequest(Message, frozen=True, kw_only=True):
    path: Path
    target: Annotated[str, msgspec.Meta(min_length=1, max_length=limits.symlink_target_max_bytes)]
    uid: Owner = 0
    gid: Owner = 0


class MknodRequest(Message, frozen=True, kw_only=True):
    """A FIFO, socket, or character or block device node: ``mode`` carries the type bits."""

    path: Path
    mode: Annotated[int, msgspec.Meta(ge=0, le=0o177777)]
    rdev: Int64 = 0
    uid: Owner = 0
    gid: Owner = 0


class ReaddirRequest(Message, frozen=True, kw_only=True):
    path: Path
    after: Name = ""  # the cursor: entries with names after this one
    limit: Annotated[int, msgspec.Meta(ge=1, le=limits.readdir_page_entries_max)] = limits.readdir_page_entries_max


class ReaddirReply(Message, frozen=True, kw_only=True):
    entries: list[DirEntry]
    next: Name | None = None  # pass as ``after`` for the next page; None: that was the last


class SetattrRequest(Message, frozen=True, kw_only=True):
    """By ``path``; or, when ``path`` is None, by ``ino`` with the caller's ``handle`` for it
    (a file unlinked while open has no path: ``fchmod``, ``fchown``, ``futimens``)."""

    path: Path | None = None
    ino: Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)] = 0
    handle: Handle = b""
    mode: Mode | None = None
    uid: Owner | None = None
    gid: Owner | None = None
    atime: Time | None = None
    mtime: Time | None = None


class TruncateRequest(Message, frozen=True, kw_only=True):
    path: Path
    size: Int64


class SetPolicyRequest(Message, frozen=True, kw_only=True):
    path: Path
    policy: PolicyText | None = None
    block_size: BlockSize | None = None
    write_min: Annotated[int, msgspec.Meta(ge=1, le=limits.policy_width_max)] | None = None


class RenameRequest(Message, frozen=True, kw_only=True):
    src: Path
    dst: Path
    noreplace: bool = False


class ExchangeRequest(Message, frozen=True, kw_only=True):
    a: Path
    b: Path


class StatfsReply(Message, frozen=True, kw_only=True):
    """Raw bytes of the live chunk servers (``capacity``, ``used``) and what files can use of
    them under the root directory's policy (``usable``, ``usable_free``: raw times the share
    of data in a stripe, e.g. 4/6 for rs(4,2), 1/3 for rep(3))."""

    files: Int64
    capacity: Int64
    used: Int64
    name_max: int
    usable: Int64 = 0
    usable_free: Int64 = 0
    policy: PolicyText = ""


class LayoutRequest(Message, frozen=True, kw_only=True):
    """By ``ino``, or by ``path`` when ``ino`` is 0. ``first``: the first block index wanted."""

    path: Path | None = None
    ino: Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)] = 0
    handle: Handle = b""  # with ``ino``
    first: Int64 = 0
    reader: Id = 0  # an opening handle: takes its lease (see RenewRequest) in the same call
    write_only: bool = False  # that handle only writes: it needs write permission, not read


class AllocateRequest(Message, frozen=True, kw_only=True):
    """``writer``: the handle's id; its lease (``renew``) keeps these allocations alive.
    ``claimed_in``: the directory the caller's session holds claimed, with ``ino`` one of the
    numbers that claim handed it and its create possibly not sent yet (``tectofs.wire.claims``):
    a file not made yet is allocated for as that directory's new files are (its policy), so the
    writer need not send its creates first."""

    ino: Ino
    handle: Handle = b""
    writer: Id = 0
    count: Annotated[int, msgspec.Meta(ge=1, le=limits.allocate_blocks_max)] = 1
    spares: Annotated[int, msgspec.Meta(ge=0, le=limits.policy_width_max)] = limits.spare_servers_per_block
    exclude: Annotated[list[Id], msgspec.Meta(max_length=limits.servers_max)] = []
    claimed_in: Annotated[int, msgspec.Meta(ge=0, le=limits.int64_max)] = 0


class AllocateReply(Message, frozen=True, kw_only=True):
    blocks: list[Allocation]
    lease_s: float = limits.allocation_grace_s  # uncommitted allocations not renewed for this long expire


class RenewRequest(Message, frozen=True, kw_only=True):
    """Leases on ``ino``: a writer's (its uncommitted allocations and staged blocks live on)
    and a reader's (the file's chunks are kept, even after an unlink or replace)."""

    ino: Ino
    handle: Handle = b""
    writer: Id = 0
    reader: Id = 0


class RenewReply(Message, frozen=True, kw_only=True):
    renewed: int


BlockList = Annotated[list[WrittenBlock], msgspec.Meta(max_length=limits.commit_blocks_max)]
HoleList = Annotated[list[Int64], msgspec.Meta(max_length=limits.commit_blocks_max)]


class StageRequest(Message, frozen=True, kw_only=True):
    """Part of a commit sent ahead (a writer with more blocks than one commit carries).
    Staged blocks and holes are invisible until the same ``writer`` commits the file;
    ``cut_from`` first withdraws what this writer staged at that index and above."""

    ino: Ino
    handle: Handle = b""
    writer: Id
    blocks: BlockList = []
    holes: HoleList = []
    cut_from: Int64 | None = None


class CommitRequest(Message, frozen=True, kw_only=True):
    ino: Ino
    handle: Handle = b""
    size: Int64
    blocks: BlockList = []
    replace: bool = False
    mtime: Time | None = None
    shrunk_to: Int64 | None = None
    holes: HoleList = []
    writer: Id | None = None  # publish what this writer staged, too
    atime: Time | None = None  # also set the access time (utimens on a file being written: one call)
    mode: Mode | None = None  # also chmod (the permission bits), under setattr's rules
    # False: the reply leaves out the bytes of the inline block this request carries (the
    # writer has them: ``tectofs.wire.inline_echo``); True, an older client's default: echoed.
    echo_inline: bool = True


BadChunkKind = Literal["corrupt", "missing", "unreachable", ""]


class ReportBadChunkRequest(Message, frozen=True, kw_only=True):
    """A chunk that could not be read. ``kind`` "corrupt" (failed its checksum) or "missing"
    (its server does not have it) marks it bad and schedules its repair; "unreachable" (or
    nothing: an older client) is only counted, since its server may just be down."""

    block_id: Id
    position: Position
    server_id: Id
    reason: Text = ""
    kind: BadChunkKind = ""


class RegisterServerRequest(Message, frozen=True, kw_only=True):
    uuid: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    address: Address  # where clients reach it (``--advertise``; never a wildcard)
    capacity: Int64 = 0
    used: Int64 = 0
    metrics_url: MetricsUrl | None = None  # its Prometheus endpoint (``--metrics``); None: off


class RegisterServerReply(Message, frozen=True, kw_only=True):
    server_id: Id


ServerStats = Annotated[dict[Annotated[str, msgspec.Meta(max_length=64)], Int64], msgspec.Meta(max_length=64)]


class HeartbeatRequest(Message, frozen=True, kw_only=True):
    server_id: Id
    address: Address | None = None  # where it serves now: the metadata service follows it
    capacity: Int64 = 0
    used: Int64 = 0
    inflight: Int64 = 0
    chunks: Int64 = 0
    stats: ServerStats = {}  # scrub and repair progress, shown by ``tectofs status``
    metrics_url: MetricsUrl | None = None  # as at registration; None: unchanged (a server of 0.1.0 sends none)


class RepairOrder(Message, frozen=True, kw_only=True):
    """Rebuild chunk ``position`` of a block and store it here. ``length`` is the block's
    stored bytes (what was encoded); ``crc`` the chunk's recorded crc32c, when one was ever
    stored (None: a position a degraded write left out). ``sources`` are the block's readable
    chunks; one at ``position`` itself (a server being drained) is copied, not rebuilt."""

    block_id: Id
    position: Position
    policy: PolicyText
    length: ChunkLength
    crc: Crc | None = None
    sources: Annotated[list[ChunkRef], msgspec.Meta(max_length=limits.policy_width_max)]


class HeartbeatReply(Message, frozen=True, kw_only=True):
    delete: Annotated[list[Id], msgspec.Meta(max_length=limits.gc_orders_per_heartbeat_max)]
    repairs: Annotated[list[RepairOrder], msgspec.Meta(max_length=limits.repair_orders_per_heartbeat_max)] = []


class RepairDoneRequest(Message, frozen=True, kw_only=True):
    block_id: Id
    position: Position
    server_id: Id
    length: ChunkLength
    crc: Crc


class RepairFailedRequest(Message, frozen=True, kw_only=True):
    block_id: Id
    position: Position
    server_id: Id
    reason: Text = ""
    occupied: bool = False  # the target holds a sound chunk of another position of the block


class InventoryBeginRequest(Message, frozen=True, kw_only=True):
    server_id: Id


class InventoryBeginReply(Message, frozen=True, kw_only=True):
    report: Id


class InventoryRequest(Message, frozen=True, kw_only=True):
    """Part of a chunk server's full report of the chunks it holds (``last``: the final part)."""

    server_id: Id
    report: Id
    block_ids: Annotated[list[Id], msgspec.Meta(max_length=limits.inventory_batch_max)]
    last: bool = False


class InventoryReply(Message, frozen=True, kw_only=True):
    missing: Int64 = 0  # chunks the store expected on the server and the report lacked (marked bad)
    orphans: Int64 = 0  # chunks held that no block refers to (collected after a grace period)


class DrainRequest(Message, frozen=True, kw_only=True):
    server: Annotated[str, msgspec.Meta(min_length=1, max_length=limits.address_length_max_bytes)]  # id, uuid or address
    cancel: bool = False


class DrainReply(Message, frozen=True, kw_only=True):
    server_id: Id
    state: Text
    chunks: Int64  # chunks the store still places on it


class FileRef(Message, frozen=True, array_like=True):
    """An inode named by number, with the caller's handle for it."""

    ino: Ino
    handle: Handle = b""


class BlockHealthRequest(Message, frozen=True, kw_only=True):
    files: Annotated[list[FileRef], msgspec.Meta(max_length=limits.health_inos_per_call_max)]


class FileHealth(Message, frozen=True, kw_only=True):
    """Blocks of one file: ``healthy`` have every chunk readable; ``under_redundant`` can be
    read but lost at least one chunk; ``unreadable`` have fewer readable chunks than a read needs."""

    ino: Ino
    blocks: Int64
    healthy: Int64
    under_redundant: Int64
    unreadable: Int64


class BlockHealthReply(Message, frozen=True, kw_only=True):
    files: Annotated[list[FileHealth], msgspec.Meta(max_length=limits.health_inos_per_call_max)]


class ServersReply(Message, frozen=True, kw_only=True):
    servers: Annotated[list[ServerInfo], msgspec.Meta(max_length=limits.servers_max)]


class StatsReply(Message, frozen=True, kw_only=True):
    uptime_s: float
    store: dict[str, int]
    counts: dict[str, int]
    bad_chunk_reports: int
    busy_answers: int
    invalid_requests: int
    queued: int
    address: Address | None = None  # the answering service's advertised address (one of a failover group)
    metrics_url: MetricsUrl | None = None  # its Prometheus endpoint; None: off


class PingReply(Message, frozen=True, kw_only=True):
    ok: bool = True


# ---------------------------------------------------------------------- chunk server


class PutChunkRequest(Message, frozen=True, kw_only=True):
    """Plus the chunk's bytes as payload."""

    block_id: Id
    position: Position
    crcs: Annotated[list[Crc], msgspec.Meta(max_length=limits.block_size_max_bytes // limits.checksum_piece_bytes + 1)]
    crc: Crc
    overwrite: bool = False
    cap: Capability | None = None  # write capability (from the allocation); members need none


class GetChunkRequest(Message, frozen=True, kw_only=True):
    block_id: Id
    cap: Capability | None = None  # read capability (from the layout); members need none
    offset: BlockOffset = 0  # within the chunk: never negative, never past the largest chunk
    length: Annotated[int, msgspec.Meta(ge=-1, le=limits.block_size_max_bytes)] = -1  # -1: to the end


class GetChunkReply(Message, frozen=True, kw_only=True):
    """Plus the bytes as payload."""

    crcs: list[int]
    chunk_length: int
    position: int
    crc: int


class DeleteChunksRequest(Message, frozen=True, kw_only=True):
    block_ids: Annotated[list[Id], msgspec.Meta(max_length=limits.gc_orders_per_heartbeat_max)]


class DeleteChunksReply(Message, frozen=True, kw_only=True):
    deleted: int


class ChunkStatReply(Message, frozen=True, kw_only=True):
    capacity: int
    used: int
    inflight: int
    chunks: int
    server_id: int | None
    uuid: str
    stats: dict[str, int]


# ---------------------------------------------------------------------- users


class UserAddRequest(Message, frozen=True, kw_only=True):
    name: UserName
    uid: Owner
    gid: Owner
    groups: Annotated[list[Owner], msgspec.Meta(max_length=64)] = []
    admin: bool = False
    proxy: bool = False


class UserInfo(Message, frozen=True, kw_only=True):
    name: str
    uid: int
    gid: int
    groups: list[int]
    admin: bool = False
    proxy: bool = False
    s3_access_key: str | None = None


class UserAddReply(Message, frozen=True, kw_only=True):
    """The new user and its secrets, shown this once (the credential file is made from them)."""

    user: UserInfo
    secret: bytes
    s3_secret_key: str


class UserNameRequest(Message, frozen=True, kw_only=True):
    name: UserName


class S3KeyRequest(Message, frozen=True, kw_only=True):
    access_key: Annotated[str, msgspec.Meta(min_length=1, max_length=128)]


class S3PrincipalReply(Message, frozen=True, kw_only=True):
    """Who signs with an S3 access key, and the secret it signs with (members only: the S3
    gateway checks signatures with it)."""

    user: UserInfo
    secret_key: str


class UserListReply(Message, frozen=True, kw_only=True):
    users: list[UserInfo]
    more: bool = False


class WhoamiReply(Message, frozen=True, kw_only=True):
    kind: str
    name: str
    uid: int
    gid: int
    groups: list[int]
    admin: bool
    proxy: bool


# ---------------------------------------------------------------------- the tables

HELLO: Final = Operation("hello", Hello, HelloReply, idempotent=True)

# ---- the metadata service

LOOKUP: Final = Operation("lookup", PathRequest, AttrsReply, idempotent=True)
GETATTR: Final = Operation("getattr", InoRequest, AttrsReply, idempotent=True)
MKDIR: Final = Operation("mkdir", MkdirRequest, AttrsReply, idempotent=False)
MAKEDIRS: Final = Operation("makedirs", MkdirRequest, AttrsReply, idempotent=False)
CREATE: Final = Operation("create", CreateRequest, CreateReply, idempotent=False)
SYMLINK: Final = Operation("symlink", SymlinkRequest, AttrsReply, idempotent=False)
MKNOD: Final = Operation("mknod", MknodRequest, AttrsReply, idempotent=False)
READDIR: Final = Operation("readdir", ReaddirRequest, ReaddirReply, idempotent=True)
SETATTR: Final = Operation("setattr", SetattrRequest, AttrsReply, idempotent=True)
TRUNCATE: Final = Operation("truncate", TruncateRequest, AttrsReply, idempotent=True)
SET_POLICY: Final = Operation("set_policy", SetPolicyRequest, AttrsReply, idempotent=True)
RENAME: Final = Operation("rename", RenameRequest, AttrsReply, idempotent=False)
LINK: Final = Operation("link", LinkRequest, AttrsReply, idempotent=False)
RELEASE: Final = Operation("release", ReleaseRequest, Empty, idempotent=True)
RELEASE_LEASES: Final = Operation("release_leases", ReleaseLeasesRequest, Empty, idempotent=True)
GETXATTR: Final = Operation("getxattr", XattrRequest, XattrReply, idempotent=True)
LISTXATTR: Final = Operation("listxattr", PathRequest, ListxattrReply, idempotent=True)
SETXATTR: Final = Operation("setxattr", SetxattrRequest, Empty, idempotent=True)
REMOVEXATTR: Final = Operation("removexattr", XattrRequest, Empty, idempotent=False)
EXCHANGE: Final = Operation("exchange", ExchangeRequest, Empty, idempotent=False)
UNLINK: Final = Operation("unlink", UnlinkRequest, UnlinkReply, idempotent=False)
UNLINK_MANY: Final = Operation("unlink_many", UnlinkManyRequest, UnlinkReply, idempotent=False)
RMDIR: Final = Operation("rmdir", PathRequest, UnlinkReply, idempotent=False)
STATFS: Final = Operation("statfs", Empty, StatfsReply, idempotent=True)
LAYOUT: Final = Operation("layout", LayoutRequest, LayoutSegment, idempotent=True)
ALLOCATE: Final = Operation("allocate", AllocateRequest, AllocateReply, idempotent=False)
STAGE: Final = Operation("stage", StageRequest, Empty, idempotent=True)
RENEW: Final = Operation("renew", RenewRequest, RenewReply, idempotent=True)
COMMIT: Final = Operation("commit", CommitRequest, LayoutSegment, idempotent=False)
REPORT_BAD_CHUNK: Final = Operation("report_bad_chunk", ReportBadChunkRequest, Empty, idempotent=True)
REPAIR_DONE: Final = Operation("repair_done", RepairDoneRequest, Empty, idempotent=True)
REPAIR_FAILED: Final = Operation("repair_failed", RepairFailedRequest, Empty, idempotent=True)
INVENTORY_BEGIN: Final = Operation("inventory_begin", InventoryBeginRequest, InventoryBeginReply, idempotent=True)
INVENTORY: Final = Operation("inventory", InventoryRequest, InventoryReply, idempotent=True)
DRAIN: Final = Operation("drain", DrainRequest, DrainReply, idempotent=True)
BLOCK_HEALTH: Final = Operation("block_health", BlockHealthRequest, BlockHealthReply, idempotent=True)
REGISTER_SERVER: Final = Operation("register_server", RegisterServerRequest, RegisterServerReply, idempotent=True)
HEARTBEAT: Final = Operation("heartbeat", HeartbeatRequest, HeartbeatReply, idempotent=True)
SERVERS: Final = Operation("servers", Empty, ServersReply, idempotent=True)
STATS: Final = Operation("stats", Empty, StatsReply, idempotent=True)
PING: Final = Operation("ping", Empty, PingReply, idempotent=True)
USER_ADD: Final = Operation("user_add", UserAddRequest, UserAddReply, idempotent=False)
USER_REMOVE: Final = Operation("user_remove", UserNameRequest, Empty, idempotent=True)
USER_LIST: Final = Operation("user_list", Empty, UserListReply, idempotent=True)
S3_PRINCIPAL: Final = Operation("s3_principal", S3KeyRequest, S3PrincipalReply, idempotent=True)
WHOAMI: Final = Operation("whoami", Empty, WhoamiReply, idempotent=True)

# ---- chunk servers (and PING, above)

PUT_CHUNK: Final = Operation("put_chunk", PutChunkRequest, Empty, idempotent=True, payload=True)
GET_CHUNK: Final = Operation("get_chunk", GetChunkRequest, GetChunkReply, idempotent=True)
DELETE_CHUNKS: Final = Operation("delete_chunks", DeleteChunksRequest, DeleteChunksReply, idempotent=True)
CHUNK_STAT: Final = Operation("stat", Empty, ChunkStatReply, idempotent=True)

META_OPERATIONS: Final = table(
    HELLO, LOOKUP, GETATTR, MKDIR, MAKEDIRS, CREATE, SYMLINK, MKNOD, READDIR, SETATTR, TRUNCATE, SET_POLICY,
    RENAME, LINK, RELEASE, RELEASE_LEASES, GETXATTR, LISTXATTR, SETXATTR, REMOVEXATTR, EXCHANGE, UNLINK,
    UNLINK_MANY, RMDIR, STATFS, LAYOUT, ALLOCATE, STAGE, RENEW, COMMIT, REPORT_BAD_CHUNK, REPAIR_DONE, REPAIR_FAILED,
    INVENTORY_BEGIN, INVENTORY, DRAIN, BLOCK_HEALTH, REGISTER_SERVER, HEARTBEAT, SERVERS, STATS, PING, USER_ADD,
    USER_REMOVE, USER_LIST, S3_PRINCIPAL, WHOAMI, TICKET, TICKET_SECRET, REFERENCE_BLOCKS, SHARED_BLOCKS, KEEPALIVE,
    CLAIM_DIRECTORY, CREATE_MANY,
)

CHUNK_OPERATIONS: Final = table(
    HELLO, PUT_CHUNK, GET_CHUNK, DELETE_CHUNKS, CHUNK_STAT, PING,
)


# Upper bounds of encoded sizes (msgpack, field names included) of one written block without
# its chunks and of one written chunk: what a commit or stage request can carry follows.
_WRITTEN_BLOCK_BYTES_MAX = 96
_WRITTEN_CHUNK_BYTES_MAX = 64


def blocks_per_call(width: int) -> int:
    """How many blocks (or holes) of a policy ``width`` wide one commit or stage call carries,
    within the reply budget whatever the values."""
    return max(1, min(limits.commit_blocks_max, limits.reply_header_budget_bytes
                      // (_WRITTEN_BLOCK_BYTES_MAX + width * _WRITTEN_CHUNK_BYTES_MAX)))


def convert(value: Any, kind: type[Any]) -> Any:
    """``value`` (plain msgpack data) as ``kind``, strictly; raises ``msgspec.ValidationError``."""
    return msgspec.convert(value, kind, strict=True)


def to_plain(value: Any) -> Any:
    """A message (or anything holding messages) as plain dicts and lists."""
    return msgspec.to_builtins(value)
