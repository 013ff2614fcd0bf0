"""Messages of asynchronous creates (``server/meta/leases.py`` says how claims work;
``client/claims.py`` is the client's side): ``claim_directory`` makes the caller's lease session
the only one that may read or change a directory until the claim is recalled, and hands it inode
numbers for the files it will create there; ``create_many`` makes those files, in one
transaction. Listed in ``messages.META_OPERATIONS`` like every other operation."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from tectofs import limits
from tectofs.wire.operation import Operation
from tectofs.wire.values import (
    Attrs,
    Handle,
    Id,
    Ino,
    Int64,
    LayoutSegment,
    Message,
    Mode,
    Name,
    Owner,
    Path,
    Time,
    WrittenBlock,
)


class ClaimRequest(Message, frozen=True, kw_only=True):
    """Claim directory ``path`` for the caller's lease session (which needs write and search
    permission there), and reserve ``count`` inode numbers for files it creates there. Claiming
    a directory the session holds already reserves more numbers."""

    path: Path
    count: Annotated[int, msgspec.Meta(ge=1, le=limits.claim_inodes)] = limits.claim_inodes
    uid: Owner = 0  # the new files' owner and group, as CreateRequest's (a user's are the caller's)
    gid: Owner = 0


class ClaimReply(Message, frozen=True, kw_only=True):
    """``granted``: False when the directory cannot be claimed (a session-less caller, a setgid
    directory, a claim recalled moments ago): create by calls. ``directory``: its attributes
    as of the claim. ``template``: the attributes a regular file the caller creates there gets
    (owner, group, policy, block size; ``mode`` and times are the create's). ``first``: the first
    of the inode numbers reserved, ``handles[i]`` the caller's file handle for ``first + i``."""

    granted: bool
    directory: Attrs | None = None
    template: Attrs | None = None
    first: Id = 0
    handles: Annotated[list[Handle], msgspec.Meta(max_length=limits.claim_inodes)] = []
    inline_max: Id = 0


class PendingContent(Message, frozen=True, kw_only=True):
    """The first commit of a file created without a call, sent with its create (one round trip
    for a small file written whole): ``CommitRequest``'s size, inline block 0 (a new file has
    no other block; a larger one allocates chunks, which sends its create first), times and mode."""

    size: Int64
    blocks: Annotated[list[WrittenBlock], msgspec.Meta(max_length=1)] = []
    mtime: Time | None = None
    atime: Time | None = None
    mode: Mode | None = None
    # The commit's time (its ctime, and its mtime if none is given), the client's clock, as the
    # create's: a client that answered the commit before sending it told its user this time.
    # None: the service's clock when it makes the file.
    ctime: Time | None = None


class PendingCreate(Message, frozen=True, array_like=True):
    """One file made without a call: ``name`` in the claimed directory, inode ``ino`` (one of the
    claim's), permission bits ``mode``, created at ``time`` (the client's clock), opened by a
    handle holding the reader's lease ``reader`` (0: none left open), written with ``content``."""

    name: Name
    ino: Ino
    mode: Mode
    time: Time
    reader: Id = 0
    content: PendingContent | None = None


class PendingUnlink(Message, frozen=True, array_like=True):
    """One unlink made without a call: ``name`` in the claimed directory, which named inode
    ``ino`` (a regular file with no other name)."""

    name: Name
    ino: Ino


class CreateManyRequest(Message, frozen=True, kw_only=True):
    """In the claimed directory ``path`` (inode ``directory``), remove ``unlinks``, then make
    ``creates``, each in order, in one transaction: all of them or, the first failure raised,
    none. (A client never sends a create and an unlink of one name in one request: the unlinks
    going first keeps the order of everything else.)"""

    path: Path
    directory: Ino
    uid: Owner = 0  # as ClaimRequest's
    gid: Owner = 0
    creates: Annotated[list[PendingCreate], msgspec.Meta(max_length=limits.create_batch_max)] = []
    unlinks: Annotated[list[PendingUnlink], msgspec.Meta(max_length=limits.create_batch_max)] = []


class CreateManyReply(Message, frozen=True, kw_only=True):
    """``directory``: the directory's attributes after the call; ``layouts``: the layout each
    create with content has after its commit, in order (the inline bytes left out: the
    client has them, ``tectofs.wire.inline_echo``)."""

    directory: Attrs
    layouts: Annotated[list[LayoutSegment], msgspec.Meta(max_length=limits.create_batch_max)] = []


CLAIM_DIRECTORY: Final = Operation("claim_directory", ClaimRequest, ClaimReply, idempotent=False)
CREATE_MANY: Final = Operation("create_many", CreateManyRequest, CreateManyReply, idempotent=False)
