"""The metadata service's operations as typed methods: one per operation of
``tectofs.wire.messages.META_OPERATIONS``, named after it, taking its request type and returning
its reply type (``await fs.metadata.rename(messages.RenameRequest(src=..., dst=...))``).

Every method is one line over :meth:`MetadataClient.call`, which takes the retry policy
(blind retries only for idempotent operations; a call id for the others) from the operation.
``tests/test_typed_operations.py`` holds this class and the table to each other, one to one.
"""

from __future__ import annotations

from typing import Awaitable, Callable, TypeVar

import msgspec

from tectofs.wire import claims, inline_echo, messages, shared_blocks
from tectofs.wire.client import RpcClient
from tectofs.wire.leases import KEEPALIVE, KeepaliveReply, KeepaliveRequest

RequestT = TypeVar("RequestT", bound=messages.Message)
ReplyT = TypeVar("ReplyT", bound=messages.Message)
_EMPTY = messages.Empty()
# The calls that need not wait for this client's unsent creates (``client/claims.py``): they
# neither read nor change what those creates made (the sending itself among them).
UNORDERED = frozenset({"keepalive", "create_many", "claim_directory", "ping", "statfs", "whoami"})


# The operations that change names, attributes or extended attributes: after each (whatever
# its outcome), ``MetadataClient.on_change`` hears of it, so a cache over this client forgets
# what its own change made stale (the service recalls only other clients' leases).
# tests/test_leases.py holds every operation of the table to being here or in READING.
CHANGING = frozenset({
    "mkdir", "makedirs", "create", "symlink", "mknod", "setattr", "truncate", "set_policy", "rename", "link",
    "setxattr", "removexattr", "exchange", "unlink", "unlink_many", "rmdir", "commit", "reference_blocks",
    "create_many",
})
READING = frozenset({
    "hello", "lookup", "getattr", "readdir", "getxattr", "listxattr", "statfs", "layout", "allocate", "stage", "renew",
    "release", "release_leases", "report_bad_chunk", "repair_done", "repair_failed", "inventory_begin", "inventory",
    "drain", "block_health", "register_server", "heartbeat", "servers", "stats", "ping", "user_add", "user_remove",
    "user_list", "s3_principal", "whoami", "ticket", "ticket_secret", "keepalive", "shared_blocks",
    "claim_directory",
})  # what leaves names, attributes and extended attributes as they were


class MetadataClient:
    """Calls to the metadata service at ``address`` (an address or a failover group) through
    ``rpc`` (whose connections carry the caller's identity)."""

    def __init__(self, rpc: RpcClient, address: str) -> None:
        self.rpc = rpc
        self.address = address
        # Told of every CHANGING call: its name, request, reply (None: it failed) and the lease
        # session's token when it began (``lease_token``; None without).
        self.on_change: Callable[[str, messages.Message, messages.Message | None, tuple[int, int] | None],
                                 None] | None = None
        self.lease_token: Callable[[], tuple[int, int]] | None = None  # LeaseSession.token (client/lease_session.py)
        # Sends this client's unsent creates (None: there are none) before every call but the
        # UNORDERED (``CreateClaims.flush_before``): the service sees this client's changes in order.
        self.flush_before: Callable[[], Awaitable[None] | None] | None = None
        # The claimed directory whose unsent create makes this file (None: none), its sending
        # started (``CreateClaims.allocating``): an allocation for the file goes without waiting.
        self.allocating: Callable[[int], int | None] | None = None
        # Sends a commit of a file whose create is not sent yet with that create (its answer;
        # None: an ordinary commit): ``CreateClaims.absorb_commit``.
        self.absorb_commit: Callable[[messages.CommitRequest], Awaitable[messages.LayoutSegment] | None] | None = None

    async def call(self, operation: messages.Operation[RequestT, ReplyT], request: RequestT,
                   complete: Callable[[ReplyT], ReplyT] | None = None, *, ordered: bool = True) -> ReplyT:
        """One call of ``operation``: its reply, or the service's error raised. ``complete``
        makes the reply whole before anything (``on_change`` too) sees it. ``ordered=False``: it
        need not wait for this client's unsent creates (as UNORDERED operations)."""
        if self.flush_before is not None and ordered and operation.name not in UNORDERED:
            unsent = self.flush_before()
            if unsent is not None:
                await unsent
        reply: ReplyT | None = None
        began = self.lease_token() if self.lease_token is not None else None
        try:
            answer, _ = await self.rpc.call(self.address, operation, request)
            reply = answer if complete is None else complete(answer)
        finally:
            if self.on_change is not None and operation.name in CHANGING:
                self.on_change(operation.name, request, reply, began)
        return reply

    async def lookup(self, request: messages.PathRequest) -> messages.AttrsReply:
        return await self.call(messages.LOOKUP, request)

    async def getattr(self, request: messages.InoRequest) -> messages.AttrsReply:
        return await self.call(messages.GETATTR, request)

    async def mkdir(self, request: messages.MkdirRequest) -> messages.AttrsReply:
        return await self.call(messages.MKDIR, request)

    async def makedirs(self, request: messages.MkdirRequest) -> messages.AttrsReply:
        return await self.call(messages.MAKEDIRS, request)

    async def create(self, request: messages.CreateRequest) -> messages.CreateReply:
        return await self.call(messages.CREATE, request)

    async def symlink(self, request: messages.SymlinkRequest) -> messages.AttrsReply:
        return await self.call(messages.SYMLINK, request)

    async def mknod(self, request: messages.MknodRequest) -> messages.AttrsReply:
        return await self.call(messages.MKNOD, request)

    async def readdir(self, request: messages.ReaddirRequest) -> messages.ReaddirReply:
        return await self.call(messages.READDIR, request)

    async def setattr(self, request: messages.SetattrRequest) -> messages.AttrsReply:
        return await self.call(messages.SETATTR, request)

    async def truncate(self, request: messages.TruncateRequest) -> messages.AttrsReply:
        return await self.call(messages.TRUNCATE, request)

    async def set_policy(self, request: messages.SetPolicyRequest) -> messages.AttrsReply:
        return await self.call(messages.SET_POLICY, request)

    async def rename(self, request: messages.RenameRequest) -> messages.AttrsReply:
        return await self.call(messages.RENAME, request)

    async def link(self, request: messages.LinkRequest) -> messages.AttrsReply:
        return await self.call(messages.LINK, request)

    async def release(self, request: messages.ReleaseRequest) -> messages.Empty:
        return await self.call(messages.RELEASE, request)

    async def release_leases(self, request: messages.ReleaseLeasesRequest) -> messages.Empty:
        return await self.call(messages.RELEASE_LEASES, request)

    async def getxattr(self, request: messages.XattrRequest) -> messages.XattrReply:
        return await self.call(messages.GETXATTR, request)

    async def listxattr(self, request: messages.PathRequest) -> messages.ListxattrReply:
        return await self.call(messages.LISTXATTR, request)

    async def setxattr(self, request: messages.SetxattrRequest) -> messages.Empty:
        return await self.call(messages.SETXATTR, request)

    async def removexattr(self, request: messages.XattrRequest) -> messages.Empty:
        return await self.call(messages.REMOVEXATTR, request)

    async def exchange(self, request: messages.ExchangeRequest) -> messages.Empty:
        return await self.call(messages.EXCHANGE, request)

    async def unlink(self, request: messages.UnlinkRequest) -> messages.UnlinkReply:
        return await self.call(messages.UNLINK, request)

    async def unlink_many(self, request: messages.UnlinkManyRequest) -> messages.UnlinkReply:
        return await self.call(messages.UNLINK_MANY, request)

    async def reference_blocks(self, request: shared_blocks.ReferenceBlocksRequest) -> shared_blocks.ReferenceBlocksReply:
        return await self.call(messages.REFERENCE_BLOCKS, request)

    async def shared_blocks(self, request: shared_blocks.SharedBlocksRequest) -> shared_blocks.SharedBlocksReply:
        return await self.call(messages.SHARED_BLOCKS, request)

    async def rmdir(self, request: messages.PathRequest) -> messages.UnlinkReply:
        return await self.call(messages.RMDIR, request)

    async def statfs(self, request: messages.Empty = _EMPTY) -> messages.StatfsReply:
        return await self.call(messages.STATFS, request)

    async def layout(self, request: messages.LayoutRequest) -> messages.LayoutSegment:
        return await self.call(messages.LAYOUT, request)

    async def allocate(self, request: messages.AllocateRequest) -> messages.AllocateReply:
        """Blocks for a file; one whose create this client has not sent yet is allocated for
        under its directory's claim (``claimed_in``) while the creates go, not after them (its
        commit, a call, waits for them)."""
        directory = self.allocating(request.ino) if self.allocating is not None else None
        if directory is None:
            return await self.call(messages.ALLOCATE, request)
        return await self.call(messages.ALLOCATE, msgspec.structs.replace(request, claimed_in=directory),
                               ordered=False)

    async def stage(self, request: messages.StageRequest) -> messages.Empty:
        return await self.call(messages.STAGE, request)

    async def renew(self, request: messages.RenewRequest) -> messages.RenewReply:
        return await self.call(messages.RENEW, request)

    async def commit(self, request: messages.CommitRequest) -> messages.LayoutSegment:
        """The file's layout after the commit, whole: the service is asked not to echo the
        inline block the request carries, which is put back here (``tectofs.wire.inline_echo``).
        The first commit of a file created without a call goes with its create (``absorb_commit``)."""
        absorbed = self.absorb_commit(request) if self.absorb_commit is not None else None
        if absorbed is not None:
            began = self.lease_token() if self.lease_token is not None else None
            layout: messages.LayoutSegment | None = None
            try:
                layout = await absorbed
            finally:
                if self.on_change is not None:
                    self.on_change(messages.COMMIT.name, request, layout, began)
            return layout
        return await self.call(messages.COMMIT, msgspec.structs.replace(request, echo_inline=False),
                               lambda answer: inline_echo.restore(answer, request.blocks))

    async def report_bad_chunk(self, request: messages.ReportBadChunkRequest) -> messages.Empty:
        return await self.call(messages.REPORT_BAD_CHUNK, request)

    async def repair_done(self, request: messages.RepairDoneRequest) -> messages.Empty:
        return await self.call(messages.REPAIR_DONE, request)

    async def repair_failed(self, request: messages.RepairFailedRequest) -> messages.Empty:
        return await self.call(messages.REPAIR_FAILED, request)

    async def inventory_begin(self, request: messages.InventoryBeginRequest) -> messages.InventoryBeginReply:
        return await self.call(messages.INVENTORY_BEGIN, request)

    async def inventory(self, request: messages.InventoryRequest) -> messages.InventoryReply:
        return await self.call(messages.INVENTORY, request)

    async def drain(self, request: messages.DrainRequest) -> messages.DrainReply:
        return await self.call(messages.DRAIN, request)

    async def block_health(self, request: messages.BlockHealthRequest) -> messages.BlockHealthReply:
        return await self.call(messages.BLOCK_HEALTH, request)

    async def register_server(self, request: messages.RegisterServerRequest) -> messages.RegisterServerReply:
        return await self.call(messages.REGISTER_SERVER, request)

    async def heartbeat(self, request: messages.HeartbeatRequest) -> messages.HeartbeatReply:
        return await self.call(messages.HEARTBEAT, request)

    async def servers(self, request: messages.Empty = _EMPTY) -> messages.ServersReply:
        return await self.call(messages.SERVERS, request)

    async def stats(self, request: messages.Empty = _EMPTY) -> messages.StatsReply:
        return await self.call(messages.STATS, request)

    async def ping(self, request: messages.Empty = _EMPTY) -> messages.PingReply:
        return await self.call(messages.PING, request)

    async def user_add(self, request: messages.UserAddRequest) -> messages.UserAddReply:
        return await self.call(messages.USER_ADD, request)

    async def user_remove(self, request: messages.UserNameRequest) -> messages.Empty:
        return await self.call(messages.USER_REMOVE, request)

    async def user_list(self, request: messages.Empty = _EMPTY) -> messages.UserListReply:
        return await self.call(messages.USER_LIST, request)

    async def s3_principal(self, request: messages.S3KeyRequest) -> messages.S3PrincipalReply:
        return await self.call(messages.S3_PRINCIPAL, request)

    async def whoami(self, request: messages.Empty = _EMPTY) -> messages.WhoamiReply:
        return await self.call(messages.WHOAMI, request)

    async def ticket(self, request: messages.TicketRequest) -> messages.TicketReply:
        return await self.call(messages.TICKET, request)

    async def ticket_secret(self, request: messages.Ticket) -> messages.TicketSecretReply:
        return await self.call(messages.TICKET_SECRET, request)

    async def keepalive(self, request: KeepaliveRequest) -> KeepaliveReply:
        return await self.call(KEEPALIVE, request)

    async def claim_directory(self, request: claims.ClaimRequest) -> claims.ClaimReply:
        return await self.call(claims.CLAIM_DIRECTORY, request)

    async def create_many(self, request: claims.CreateManyRequest) -> claims.CreateManyReply:
        return await self.call(claims.CREATE_MANY, request)
