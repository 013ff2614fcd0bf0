"""An RPC operation as a declared value (``Operation``), apart from the messages so that a
module of messages of its own (``shared_blocks.py``) can declare operations that
``messages.py`` lists in its tables. Re-exported by ``messages.py``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

from tectofs.wire.values import Message

RequestT = TypeVar("RequestT", bound=Message, covariant=True)
ReplyT = TypeVar("ReplyT", bound=Message, covariant=True)


@dataclass(frozen=True)
class Operation(Generic[RequestT, ReplyT]):
    """One RPC: its request and reply types, whether it may be retried blindly (it changes
    nothing, or doing it twice is the same as once), and whether the request carries a payload.

    Each operation is one constant (``messages.LOOKUP``, ``messages.PUT_CHUNK``, ...); the tables of the
    two services are made of those constants, and so are the typed client
    (``tectofs.client.metadata``) and each service's handler table: the request and reply types
    named here are the ones a caller passes and gets back and the ones a handler takes and answers."""

    name: str
    request: type[RequestT]
    reply: type[ReplyT]
    idempotent: bool
    payload: bool = False


AnyOperation: TypeAlias = "Operation[Message, Message]"


def table(*operations: AnyOperation) -> dict[str, AnyOperation]:
    return {op.name: op for op in operations}
