"""The operation tables, the typed metadata client and the services' handlers agree, one to
one: an operation cannot be added to (or changed in) one of them without the others."""

from __future__ import annotations

import inspect
import typing
from typing import Any

import msgspec
import pytest

from tectofs.client.metadata import MetadataClient
from tectofs.wire import claims, messages, shared_blocks
from tectofs.wire.server import Handlers


def _operation_constants() -> dict[str, messages.AnyOperation]:
    return {name: value for name, value in vars(messages).items() if isinstance(value, messages.Operation)}


def _client_methods(client_class: type) -> dict[str, Any]:
    """The public coroutine methods of ``client_class`` but the generic ``call``."""
    return {name: fn for name, fn in vars(client_class).items()
            if inspect.iscoroutinefunction(fn) and not name.startswith("_") and name != "call"}


def client_disagreements(client_class: type, table: dict[str, messages.AnyOperation]) -> list[str]:
    """How the typed methods of ``client_class`` and the operations of ``table`` (but the
    hello, which opens a connection) fail to match one to one: by name, request annotation
    and reply annotation."""
    operations = {name: op for name, op in table.items() if op is not messages.HELLO}
    methods = _client_methods(client_class)
    problems = [f"{name}: an operation without a method" for name in operations.keys() - methods.keys()]
    problems += [f"{name}: a method without an operation" for name in methods.keys() - operations.keys()]
    for name in operations.keys() & methods.keys():
        hints = typing.get_type_hints(methods[name])
        if hints.get("request") is not operations[name].request:
            problems.append(f"{name}: takes {hints.get('request')}, the operation {operations[name].request}")
        if hints.get("return") is not operations[name].reply:
            problems.append(f"{name}: returns {hints.get('return')}, the operation {operations[name].reply}")
    return sorted(problems)


def test_every_operation_is_one_constant_of_its_tables() -> None:
    constants = _operation_constants()
    assert len({id(op) for op in constants.values()}) == len(constants)  # one constant per operation
    for table in (messages.META_OPERATIONS, messages.CHUNK_OPERATIONS):
        for name, op in table.items():
            assert op.name == name
            assert any(op is constant for constant in constants.values()), f"{name} is no constant"
    tabled = {id(op) for table in (messages.META_OPERATIONS, messages.CHUNK_OPERATIONS) for op in table.values()}
    assert {id(op) for op in constants.values()} == tabled, "a constant in no table"


def test_the_metadata_client_and_the_table_agree_one_to_one() -> None:
    assert client_disagreements(MetadataClient, messages.META_OPERATIONS) == []


def test_a_client_out_of_step_with_its_table_is_caught() -> None:
    class Wrong(MetadataClient):
        async def lookup(self, request: messages.InoRequest) -> messages.AttrsReply:  # type: ignore[override]
            raise NotImplementedError

        async def getattr(self, request: messages.InoRequest) -> messages.Empty:  # type: ignore[override]
            raise NotImplementedError

        async def frobnicate(self, request: messages.Empty) -> messages.Empty:
            raise NotImplementedError

    table = {**messages.META_OPERATIONS, "extra": messages.Operation("extra", messages.Empty, messages.Empty, True)}
    # only the methods Wrong defines itself are looked at: the others read as missing
    problems = client_disagreements(Wrong, table)
    assert "frobnicate: a method without an operation" in problems
    assert "extra: an operation without a method" in problems
    assert any(p.startswith("lookup: takes") for p in problems)
    assert any(p.startswith("getattr: returns") for p in problems)


@pytest.mark.parametrize("operation", list(messages.META_OPERATIONS.values()) + list(messages.CHUNK_OPERATIONS.values()),
                         ids=lambda op: op.name)
def test_a_request_with_its_defaults_is_what_the_service_accepts(operation: messages.AnyOperation) -> None:
    """The typed client sends every field, defaults included (``msgspec.structs.asdict``): each
    default must pass the service's strict conversion, as an omitted field does."""
    required = {f.encode_name for f in msgspec.structs.fields(operation.request) if f.required}
    sample = _SAMPLES.get(operation.request, {})
    assert required <= sample.keys(), f"add a sample for {operation.request.__name__}"
    request = messages.convert(sample, operation.request)
    header = msgspec.msgpack.decode(msgspec.msgpack.encode(msgspec.structs.asdict(request)))
    assert messages.convert(header, operation.request) == request


_SAMPLES: dict[type, dict[str, Any]] = {
    messages.Hello: {"role": "client", "version": 1},
    messages.PathRequest: {"path": "/a"},
    messages.TicketRequest: {"issuer": "127.0.0.1:7420"},
    messages.Ticket: {"uid": 1000, "gid": 1000, "expiry": 1_800_000_000, "key_id": "k1", "issuer": "127.0.0.1:7420"},
    messages.InoRequest: {"ino": 1},
    messages.MkdirRequest: {"path": "/a"},
    messages.UnlinkManyRequest: {"directory": "/a", "names": ["b", "c"]},
    shared_blocks.ReferenceBlocksRequest: {"path": "/a", "source": "/b", "pairs": [[0, 0]]},
    shared_blocks.SharedBlocksRequest: {"directory": "/a", "names": ["b"]},
    claims.ClaimRequest: {"path": "/a"},
    claims.CreateManyRequest: {"path": "/a", "directory": 2, "creates": [["b", 3, 0o644, 0.0]]},
    messages.CreateRequest: {"path": "/a"},
    messages.SymlinkRequest: {"path": "/a", "target": "b"},
    messages.MknodRequest: {"path": "/a", "mode": 0o10644},
    messages.ReaddirRequest: {"path": "/a"},
    messages.SetattrRequest: {"path": "/a"},
    messages.TruncateRequest: {"path": "/a", "size": 0},
    messages.SetPolicyRequest: {"path": "/a"},
    messages.RenameRequest: {"src": "/a", "dst": "/b"},
    messages.LinkRequest: {"src": "/a", "dst": "/b"},
    messages.ReleaseRequest: {"ino": 1, "reader": 1},
    messages.ReleaseLeasesRequest: {"leases": [[1, 1]]},
    messages.XattrRequest: {"path": "/a", "name": "user.x"},
    messages.SetxattrRequest: {"path": "/a", "name": "user.x", "value": b""},
    messages.ExchangeRequest: {"a": "/a", "b": "/b"},
    messages.UnlinkRequest: {"path": "/a"},
    messages.LayoutRequest: {},
    messages.AllocateRequest: {"ino": 1},
    messages.StageRequest: {"ino": 1, "writer": 1},
    messages.RenewRequest: {"ino": 1},
    messages.CommitRequest: {"ino": 1, "size": 0},
    messages.ReportBadChunkRequest: {"block_id": 1, "position": 0, "server_id": 1},
    messages.RepairDoneRequest: {"block_id": 1, "position": 0, "server_id": 1, "length": 0, "crc": 0},
    messages.RepairFailedRequest: {"block_id": 1, "position": 0, "server_id": 1},
    messages.InventoryBeginRequest: {"server_id": 1},
    messages.InventoryRequest: {"server_id": 1, "report": 1, "block_ids": []},
    messages.DrainRequest: {"server": "1"},
    messages.BlockHealthRequest: {"files": []},
    messages.RegisterServerRequest: {"uuid": "u", "address": "h:1"},
    messages.HeartbeatRequest: {"server_id": 1},
    messages.UserAddRequest: {"name": "alice", "uid": 1, "gid": 1},
    messages.UserNameRequest: {"name": "alice"},
    messages.S3KeyRequest: {"access_key": "k"},
    messages.PutChunkRequest: {"block_id": 1, "position": 0, "crcs": [], "crc": 0},
    messages.GetChunkRequest: {"block_id": 1},
    messages.DeleteChunksRequest: {"block_ids": []},
}


def handler_disagreements(handlers: Handlers) -> list[str]:
    """Handlers whose first parameter is not annotated with their operation's request type, or
    whose return annotation does not name its reply type first."""
    problems = []
    for operation, handler in handlers.items():
        hints = typing.get_type_hints(handler)
        first = next(iter(inspect.signature(handler).parameters))
        if hints.get(first) is not operation.request:
            problems.append(f"{operation.name}: takes {hints.get(first)}, the operation {operation.request}")
        answered = typing.get_args(hints.get("return"))
        if not answered or answered[0] is not operation.reply:
            problems.append(f"{operation.name}: answers {hints.get('return')}, the operation {operation.reply}")
    return problems


def _service_handlers() -> list[tuple[Handlers, dict[str, messages.AnyOperation]]]:
    from tectofs.server.chunk.service import ChunkServer
    from tectofs.server.meta.service import MetadataService

    # Their handler tables need no running service: instances that were never initialised do.
    return [(object.__new__(MetadataService)._handlers(), messages.META_OPERATIONS),
            (object.__new__(ChunkServer)._handlers(), messages.CHUNK_OPERATIONS)]


def test_every_operation_has_exactly_one_handler_of_its_types() -> None:
    for handlers, table in _service_handlers():
        served = handlers.serving(table)  # raises unless one handler per operation, none more
        assert served.keys() == table.keys() - {"hello"}
        assert handler_disagreements(handlers) == []


def test_handlers_out_of_step_with_their_table_are_caught() -> None:
    async def wrong(request: messages.InoRequest, payload: memoryview) -> tuple[messages.Empty, bytes]:
        raise NotImplementedError

    async def ping(request: messages.Empty, payload: memoryview) -> tuple[messages.PingReply, bytes]:
        raise NotImplementedError

    handlers = Handlers()
    handlers.add(messages.LOOKUP, wrong)  # type: ignore[arg-type]  # what mypy refuses, caught here too
    assert handler_disagreements(handlers) == [
        f"lookup: takes {messages.InoRequest}, the operation {messages.PathRequest}",
        f"lookup: answers tuple[{messages.Empty.__module__}.Empty, bytes], the operation {messages.AttrsReply}",
    ]
    with pytest.raises(ValueError, match="two handlers for the operation lookup"):
        handlers.add(messages.LOOKUP, wrong)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"none for \['ping'\], for operations not in it \['lookup'\]"):
        handlers.serving({"hello": messages.HELLO, "ping": messages.PING})
    other = Handlers()
    other.add(messages.Operation("ping", messages.Empty, messages.PingReply, idempotent=False), ping)
    with pytest.raises(ValueError, match=r"registered with another operation \['ping'\]"):
        other.serving({"hello": messages.HELLO, "ping": messages.PING})
    assert other.serving({"hello": messages.HELLO, "ping": other.items()[0][0]}) == {"ping": ping}
