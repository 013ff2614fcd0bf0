"""The agent's operations (``tectofs agent``), each a declared request and reply type with
bounds, in one table (``AGENT_OPERATIONS``), served by ``tectofs.agent.service``.

A step is named by its ``tectofs://HOST:PORT/path`` id; ``save`` is the token of one save of
it (two attempts at one step never mix). A put carries up to ``PIECE_BYTES_MAX`` bytes of one
file as its payload; a get answers that much at most, so no frame exceeds the wire's bound."""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from tectofs import limits
from tectofs.wire.messages import HELLO, PING, ActAs, Address, Crc, Empty, Int64, Message, Operation, Text, table

PIECE_BYTES_MAX: Final = 32 * limits.MiB  # bytes of one put or get
FILES_MAX: Final = 1024  # files of one step (every rank's, and .metadata): one seal or locate header holds them
STEPS_LISTED_MAX: Final = 512  # steps in one listing reply
STEP_ID_BYTES_MAX: Final = 1024
FILE_NAME_BYTES_MAX: Final = 128
LOCAL_PATH_BYTES_MAX: Final = 512
REPLICAS_MAX: Final = 8
PEERS_MAX: Final = 64

StepId = Annotated[str, msgspec.Meta(min_length=12, max_length=STEP_ID_BYTES_MAX)]  # tectofs://h:p/...
SaveToken = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z_-]+$")]
FILE_NAME_PATTERN: Final = r"^(?!\.\.?$)[^/\x00]+$"  # one name in a directory: no "/", not "." or ".."
FileName = Annotated[str, msgspec.Meta(min_length=1, max_length=FILE_NAME_BYTES_MAX, pattern=FILE_NAME_PATTERN)]


class HeldFileInfo(Message, frozen=True, kw_only=True):
    """One file of a step: its name in the checkpoint directory, size and crc32c of all of it."""

    name: FileName
    size: Int64
    crc32c: Crc


class PutRequest(Message, frozen=True, kw_only=True):
    """Bytes ``[offset, offset + len(payload))`` of file ``file`` of save ``save`` of ``step``.
    ``replica``: sent by the step's primary agent (a copy it replicates), not by a trainer;
    ``owner``: with ``replica``, the user who saved the step (``tectofs.agent.identity``: only
    agents, which are proxies, send either)."""

    step: StepId
    save: SaveToken
    file: FileName
    offset: Int64
    replica: bool = False
    owner: ActAs | None = None


class VerifyRequest(Message, frozen=True, kw_only=True):
    """A rank sent these files of save ``save`` of ``step``: check each one's size and crc32c
    (the writer's), so the seal can count them as received whole."""

    step: StepId
    save: SaveToken
    files: Annotated[list[HeldFileInfo], msgspec.Meta(max_length=FILES_MAX)]


class SealRequest(Message, frozen=True, kw_only=True):
    """Save ``save`` of ``step`` is complete: exactly the files ``names`` (the ``.metadata``
    among them), each verified by a ``mem_verify`` or by ``files`` here. The agent answers once
    ``replicas`` peers hold it too, or, if they cannot, once it is persisted. ``primary``: set
    when a primary seals its replica on a peer (the peer's address is then its origin, which
    persists it)."""

    step: StepId
    save: SaveToken
    files: Annotated[list[HeldFileInfo], msgspec.Meta(max_length=FILES_MAX)]
    names: Annotated[list[FileName], msgspec.Meta(min_length=1, max_length=FILES_MAX)]
    replicas: Annotated[int, msgspec.Meta(ge=0, le=REPLICAS_MAX)] | None = None  # None: the agent's --replicas
    primary: Address | None = None


class SealReply(Message, frozen=True, kw_only=True):
    """``copies``: agents holding the sealed step (this one included); ``persisted``: committed
    to the cluster already; ``note``: why fewer copies than asked, if so."""

    copies: Annotated[int, msgspec.Meta(ge=1, le=REPLICAS_MAX + 1)]
    persisted: bool
    note: Text = ""


class StepRequest(Message, frozen=True, kw_only=True):
    step: StepId
    save: SaveToken | None = None


class LocateReply(Message, frozen=True, kw_only=True):
    """A sealed step this agent holds (``found``), with its files; ``paths``: where each file
    lies in this host's shared memory (readable in place by a process on the same host);
    ``peers``: the agents this one replicates to."""

    found: bool
    save: SaveToken | None = None
    files: Annotated[list[HeldFileInfo], msgspec.Meta(max_length=FILES_MAX)] = []
    paths: Annotated[list[Annotated[str, msgspec.Meta(max_length=LOCAL_PATH_BYTES_MAX)]],
                     msgspec.Meta(max_length=FILES_MAX)] = []
    persisted: bool = False
    peers: Annotated[list[Address], msgspec.Meta(max_length=PEERS_MAX)] = []


class GetRequest(Message, frozen=True, kw_only=True):
    """Bytes ``[offset, offset + length)`` of one file of a sealed save (the reply's payload)."""

    step: StepId
    save: SaveToken
    file: FileName
    offset: Int64
    length: Annotated[int, msgspec.Meta(ge=0, le=PIECE_BYTES_MAX)]


class ListRequest(Message, frozen=True, kw_only=True):
    """Sealed steps whose id starts with ``prefix``."""

    prefix: Annotated[str, msgspec.Meta(max_length=STEP_ID_BYTES_MAX)]


class HeldStepInfo(Message, frozen=True, kw_only=True):
    step: StepId
    save: SaveToken
    persisted: bool
    primary: bool  # sealed here by a trainer (else: a replica)
    nbytes: Int64


class ListReply(Message, frozen=True, kw_only=True):
    steps: Annotated[list[HeldStepInfo], msgspec.Meta(max_length=STEPS_LISTED_MAX)]
    truncated: bool = False
    peers: Annotated[list[Address], msgspec.Meta(max_length=PEERS_MAX)] = []
    memory_bytes: Int64 = 0
    memory_bytes_max: Int64 = 0


PUT: Final = Operation("mem_put", PutRequest, Empty, idempotent=True, payload=True)
VERIFY: Final = Operation("mem_verify", VerifyRequest, Empty, idempotent=True)
SEAL: Final = Operation("mem_seal", SealRequest, SealReply, idempotent=True)
LOCATE: Final = Operation("mem_locate", StepRequest, LocateReply, idempotent=True)
GET: Final = Operation("mem_get", GetRequest, Empty, idempotent=True)
LIST: Final = Operation("mem_list", ListRequest, ListReply, idempotent=True)
PERSISTED: Final = Operation("mem_persisted", StepRequest, Empty, idempotent=True)

AGENT_OPERATIONS: Final = table(HELLO, PUT, VERIFY, SEAL, LOCATE, GET, LIST, PERSISTED, PING)
