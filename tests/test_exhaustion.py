"""Resource exhaustion: attacks of a few lines of Python, with no credentials, against real
servers. Memory follows the bytes a peer sends, never the sizes it declares; a connection
that stalls mid-frame is closed (and what it reserved released), one that sits idle too;
connections are capped per server and per peer address; and legitimate clients keep working
throughout. The clusters here run with timeouts and caps lowered through the environment
(``tectofs.wire.connlimits``), so each attack plays out in seconds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import select
import socket
import time
import tracemalloc
from typing import Any, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tectofs import errors, limits
from tectofs.wire import auth, messages
from tectofs.wire.client import RpcClient
from tectofs.wire.connlimits import ConnectionPolicy
from tectofs.wire.framing import (
    FIXED_HEADER_BYTES,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameKind,
    encode_frame,
    staged_bytes,
)
from tectofs.wire.server import RpcServer
from tests.rpc_doubles import answering

MiB = 1 << 20
STALL_S = 2.0
IDLE_S = 4.0
CONNECTIONS_MAX = 400
PER_PEER_MAX = 120
ENV = {
    "TECTOFS_FRAME_STALL_TIMEOUT_S": str(STALL_S),
    "TECTOFS_CONNECTION_IDLE_TIMEOUT_S": str(IDLE_S),
    "TECTOFS_CONNECTIONS_MAX": str(CONNECTIONS_MAX),
    "TECTOFS_CONNECTIONS_PER_PEER_MAX": str(PER_PEER_MAX),
}
MDS_RSS_MAX = 200 * MiB
CHUNK_RSS_MAX = limits.chunk_inflight_bytes_max + 128 * MiB
HELLO = encode_frame(FrameKind.REQUEST, 1, {"op": "hello", "role": "tool", "version": PROTOCOL_VERSION})


def _cluster(make_cluster: Any) -> Any:
    return make_cluster(servers=3, policy="rs(2,1)", extra_env=ENV)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for process {pid}")


def _chunk_server(cluster: Any, i: int = 0) -> tuple[str, int]:
    """Address and pid of chunk server ``i``."""
    with open(os.path.join(cluster.root, f"chunk-{i}.address")) as f:
        address = f.read().strip()
    return address, cluster.chunk_processes[i].pid


def _round_trip(cluster: Any, name: str) -> None:
    """A legitimate client writes a file and reads it back."""
    data = os.urandom(MiB + 4321)
    cluster.fs.write_bytes(f"/{name}", data)
    assert cluster.fs.read_bytes(f"/{name}") == data


@contextlib.contextmanager
def _sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def _connect(address: str, source_ip: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10, source_address=(source_ip, 0))


def _attack(opened: list[socket.socket], address: str, count: int, data: bytes, first_ip: int = 10,
            per_ip: int = 100) -> list[socket.socket]:
    """``count`` connections to ``address`` (``per_ip`` from each of 127.0.0.<first_ip>, ...),
    each sending ``data`` and then nothing."""
    made = []
    for i in range(count):
        sock = _connect(address, f"127.0.0.{first_ip + i // per_ip}")
        opened.append(sock)
        made.append(sock)
        if data:
            sock.sendall(data)
    return made


def _received(sock: socket.socket, timeout_s: float) -> tuple[list[Any], bool]:
    """The frames the server sent within ``timeout_s``, and whether it closed the connection."""
    decoder = FrameDecoder()
    frames: list[Frame] = []
    deadline = time.monotonic() + timeout_s
    poller = select.poll()  # not select(): a flood's descriptors pass 1024
    poller.register(sock, select.POLLIN)
    while True:
        if not poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            break
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return frames, True
        if not data:
            return frames, True
        frames.extend(decoder.feed(data))
    return frames, False


def _errors(frames: list[Any]) -> list[tuple[str, str]]:
    return [(f.header["code"], f.header["message"]) for f in frames if f.kind == FrameKind.ERROR]


def _assert_closed_as_stalled(socks: list[socket.socket]) -> None:
    """Every one of ``socks`` is closed within the stall timeout (and a sweep), with an error
    that says why, or was refused when its hello was (a cluster that wants credentials)."""
    deadline = time.monotonic() + STALL_S + 5
    for sock in socks:
        frames, closed = _received(sock, max(0.1, deadline - time.monotonic()))
        assert closed, "a stalled connection was left open"
        codes = _errors(frames)
        assert codes, "closed without saying why"
        code, message = codes[-1]
        assert code == "timeout" and "closed the connection" in message or code in ("protocol", "authentication"), codes


# --------------------------------------------------------------------------- the decoder alone


def test_decoder_commits_memory_as_bytes_arrive() -> None:
    made: list[bytearray] = []

    def deferred(header: dict[str, Any], length: int) -> Any:
        def commit() -> bytearray:
            made.append(bytearray(length))
            return made[-1]

        return commit

    declared = 64 * MiB
    wire = encode_frame(FrameKind.REQUEST, 1, {"op": "put", "pad": "x" * 200_000}, declared)
    decoder = FrameDecoder(deferred)
    decoder.feed(wire[:FIXED_HEADER_BYTES])
    assert len(decoder.get_buffer()) == limits.frame_receive_first_bytes  # not the 200 KB declared
    decoder.feed(wire[FIXED_HEADER_BYTES:])
    assert len(decoder.get_buffer()) <= limits.frame_receive_first_bytes and not made  # nor 64 MiB
    assert decoder.receiving_payload_bytes == declared  # admitted (what a lost connection releases)
    staged = staged_bytes(declared)
    assert staged <= declared // limits.frame_payload_amplification_max
    decoder.feed(bytes(staged - 1))
    assert not made
    decoder.feed(b"\x01")
    assert len(made) == 1 and len(made[0]) == declared and made[0][staged - 1] == 1
    assert decoder.get_buffer().obj is made[0]  # the rest goes straight into the final buffer
    (frame,) = decoder.feed(bytes(declared - staged))
    assert frame.payload.obj is made[0]

    # Many peers declaring the largest header and sending none of it commit little.
    fixed = encode_frame(FrameKind.REQUEST, 1, {"pad": "x" * (limits.frame_header_max_bytes - 20)})[:FIXED_HEADER_BYTES]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        decoders = []
        for _ in range(300):
            d = FrameDecoder()
            d.feed(fixed)
            d.get_buffer()
            decoders.append(d)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 300 * 3 * limits.frame_receive_first_bytes, grown


def test_decoder_direct_buffers_stay_zero_copy() -> None:
    buffers: list[bytearray] = []
    def allocate(header: dict[str, Any], n: int) -> bytearray:
        buffers.append(bytearray(n))
        return buffers[-1]

    decoder = FrameDecoder(allocate)
    payload = os.urandom(3 * MiB)
    (frame,) = decoder.feed(encode_frame(FrameKind.REQUEST, 1, {"op": "put"}, len(payload)) + payload)
    assert frame.payload.obj is buffers[0] and bytes(frame.payload) == payload


@given(
    frames=st.lists(st.tuples(st.dictionaries(st.text(max_size=4), st.integers(-1000, 1000), max_size=3),
                              st.integers(0, 300_000), st.sampled_from(["deferred", "direct", "drop"])),
                    min_size=1, max_size=4),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=60, deadline=None)
def test_decoder_staging_survives_any_split(frames: list[Any], seed: int) -> None:
    rng = random.Random(seed)
    payloads = [rng.randbytes(n) for _, n, _ in frames]

    def allocate(header: dict[str, Any], length: int) -> Any:
        mode = header["mode"]
        return None if mode == "drop" else (lambda: bytearray(length)) if mode == "deferred" else bytearray(length)

    wire = b"".join(encode_frame(FrameKind.REQUEST, i, {**h, "mode": mode}, len(p)) + p
                    for i, ((h, _, mode), p) in enumerate(zip(frames, payloads)))
    decoder, got, position = FrameDecoder(allocate), [], 0
    while position < len(wire):
        cut = rng.choice([1, 7, 4096, 65536, 200_000])
        got.extend(decoder.feed(wire[position : position + cut]))
        position += cut
    assert [f.request_id for f in got] == list(range(len(frames)))
    for frame, (_, _, mode), payload in zip(got, frames, payloads):
        assert frame.discarded == (mode == "drop" and len(payload) > 0)
        assert bytes(frame.payload) == (b"" if frame.discarded else payload)
        assert not decoder.mid_frame


# --------------------------------------------------------------------------- attacks on real servers


def test_half_frames_declaring_large_payloads_to_the_metadata_service(make_cluster: Any) -> None:
    """Attack 1: half frames declaring 65 MiB payloads (the MDS takes none at all)."""
    cluster = _cluster(make_cluster)
    pid = cluster.meta_process.pid
    before = _rss(pid)
    ping = encode_frame(FrameKind.REQUEST, 2, {"op": "ping"}, limits.frame_payload_max_bytes)
    with _sockets() as opened:
        greeted = _attack(opened, cluster.address, 12, HELLO + ping + bytes(1000))
        bare = _attack(opened, cluster.address, 12, ping[: FIXED_HEADER_BYTES + 9], first_ip=11)
        time.sleep(0.5)
        during = _rss(pid)
        _round_trip(cluster, "during-attack-1")
        print(f"metadata service RSS {before / MiB:.0f} MiB -> {during / MiB:.0f} MiB under 24 half frames of 65 MiB")
        assert during < MDS_RSS_MAX and during - before < 32 * MiB
        _assert_closed_as_stalled(greeted + bare)
    _round_trip(cluster, "after-attack-1")


def test_fixed_headers_declaring_large_msgpack_headers(make_cluster: Any) -> None:
    """Attack 2: 300 fixed headers, each declaring a 1 MiB msgpack header, to a chunk server."""
    cluster = _cluster(make_cluster)
    address, pid = _chunk_server(cluster)
    fixed = encode_frame(FrameKind.REQUEST, 1, {"pad": "x" * (limits.frame_header_max_bytes - 20)})[:FIXED_HEADER_BYTES]
    before = _rss(pid)
    with _sockets() as opened:
        socks = _attack(opened, address, 300, fixed)
        time.sleep(0.5)
        during = _rss(pid)
        _round_trip(cluster, "during-attack-2")
        print(f"chunk server RSS {before / MiB:.0f} MiB -> {during / MiB:.0f} MiB under 300 declared 1 MiB headers")
        assert during < CHUNK_RSS_MAX and during - before < 32 * MiB
        _assert_closed_as_stalled(socks)


def test_idle_half_puts_give_back_the_in_flight_budget(make_cluster: Any) -> None:
    """Attack 3: 48 half put_chunk frames reserve what one principal may of the in-flight budget, then stall."""
    cluster = _cluster(make_cluster)
    address, pid = _chunk_server(cluster)
    stat = lambda: cluster.fs.run(cluster.fs.aio.rpc.call_raw(address, "stat", {}, idempotent=True))[0]  # noqa: E731
    declared = 16 * MiB
    before = _rss(pid)
    with _sockets() as opened:  # without capabilities: drained, nothing reserved (tests/test_security.py)
        socks = [s for i in range(8) for s in _attack(opened, address, 1, HELLO + encode_frame(
            FrameKind.REQUEST, 2, {"op": "put_chunk", "block_id": 1 << 40 | i, "position": 0, "crcs": [], "crc": 0},
            declared) + bytes(256 * 1024), first_ip=20)]
        time.sleep(0.5)
        assert stat()["inflight"] == 0
    # A client with genuine write capabilities (an authenticated user's allocations) that stalls.
    ring = auth.KeyRing(cluster.key_file)
    expiry = auth.capability_expiry(600)

    def cap(block_id: int) -> dict[str, Any]:
        key, tag = auth.sign_capability(ring, block_id, "w", expiry)
        return {"mac": tag, "expiry": expiry, "key": key}

    with _sockets() as opened:
        socks = []
        for i in range(48):
            put = encode_frame(FrameKind.REQUEST, 2, {"op": "put_chunk", "block_id": 1 << 40 | i, "position": 0,
                                                      "crcs": [], "crc": 0, "cap": cap(1 << 40 | i)}, declared)
            sent = 512 * 1024 if i % 2 else 0  # half send some payload: their buffers are made
            socks += _attack(opened, address, 1, HELLO + put + bytes(sent), first_ip=20 + i % 3)
        # Capabilities signed without a uid share one principal, which may hold 3/4 of the
        # budget alone (server/chunk/admission.py; tests/test_admission.py for per-uid shares).
        most = int(limits.chunk_inflight_bytes_max * limits.chunk_inflight_alone_fraction)
        deadline = time.monotonic() + 5
        while stat()["inflight"] < most and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stat()["inflight"] == most  # all one principal may reserve
        time.sleep(0.5)  # the payload bytes sent arrive too
        during = _rss(pid)
        print(f"chunk server RSS {before / MiB:.0f} MiB -> {during / MiB:.0f} MiB with its in-flight budget reserved")
        assert during < CHUNK_RSS_MAX
        _assert_closed_as_stalled(socks)
        deadline = time.monotonic() + 5
        while stat()["inflight"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stat()["inflight"] == 0  # every reservation released with its connection
    _round_trip(cluster, "after-attack-3")


def test_chunk_reads_validate_offset_and_length(make_cluster: Any) -> None:
    """Attack 4: a get_chunk at offset -2 GiB (and other impossible ranges)."""
    cluster = _cluster(make_cluster)
    _round_trip(cluster, "readable")
    layout = cluster.fs.run(cluster.fs.aio.metadata.layout(messages.LayoutRequest(path="/readable")))
    block = layout.blocks[0]
    chunk = block.chunks[0]
    pid = next(p.pid for i, p in enumerate(cluster.chunk_processes) if _chunk_server(cluster, i)[0] == chunk.address)
    fields: dict[str, Any] = {"block_id": block.block_id}
    if getattr(block, "cap", None) is not None:
        fields["cap"] = block.cap

    def get(**request: Any) -> Any:
        call = cluster.fs.aio.rpc.call_raw(chunk.address, "get_chunk", {**fields, **request}, idempotent=True)
        return cluster.fs.run(call)

    before = _rss(pid)
    for request, field in [({"offset": -(2 << 30)}, "$.offset"), ({"offset": 1 << 40}, "$.offset"),
                           ({"length": -2}, "$.length"), ({"length": 1 << 40}, "$.length")]:
        with pytest.raises(errors.InvalidArgument, match=field.replace("$", r"\$")):
            get(**request)
    with pytest.raises(errors.InvalidArgument, match="past the chunk"):
        get(offset=limits.block_size_max_bytes)
    reply, payload = get(offset=0, length=limits.block_size_max_bytes)  # clipped to the chunk
    assert len(payload) == reply["chunk_length"] < limits.block_size_max_bytes
    after = _rss(pid)
    print(f"chunk server RSS {before / MiB:.0f} MiB -> {after / MiB:.0f} MiB after impossible reads")
    assert after - before < 32 * MiB


def test_connection_caps(make_cluster: Any) -> None:
    """Attack 5: a flood of idle connections; over the per-peer cap each is refused with an error
    saying which, over the total the oldest unauthenticated ones are closed saying why, and
    clients, connected or new, keep working."""
    cluster = _cluster(make_cluster)
    pid = cluster.meta_process.pid
    with open(f"/proc/{pid}/limits") as f:
        soft, hard = next(line.split()[3:5] for line in f if line.startswith("Max open files"))
    assert soft == hard  # raised at start, so the cap binds before the descriptors run out
    _round_trip(cluster, "before-flood")
    with _sockets() as opened:
        one_peer = _attack(opened, cluster.address, PER_PEER_MAX + 30, b"", first_ip=30, per_ip=1000)
        time.sleep(limits.connection_refused_linger_s + 0.3)  # refused: answered when they speak, or then
        refused = _refusals(one_peer)
        assert len(refused) == 30
        assert all(code == "busy" and "connections from 127.0.0.30, its limit per peer address" in message
                   for code, message in refused), refused[:3]
        everyone = _attack(opened, cluster.address, CONNECTIONS_MAX, b"", first_ip=31)
        time.sleep(limits.connection_refused_linger_s + 0.3)
        # At the total cap the metadata service makes room by closing its oldest unauthenticated
        # connections (tests/test_connection_pools.py): the first peer's, then the flood's first.
        evicted = _refusals(one_peer[:PER_PEER_MAX]) + _refusals(everyone)
        assert len(evicted) >= PER_PEER_MAX
        assert all(code == "busy" and "unauthenticated connections, its limit for them" in message
                   for code, message in evicted), evicted[:3]
        assert not _refusals(everyone[-PER_PEER_MAX:])  # the newest stay
        cluster.fs.stat("/")  # a connected client keeps being served
        rss = _rss(pid)
        print(f"metadata service RSS {rss / MiB:.0f} MiB with {CONNECTIONS_MAX} connections")
        assert rss < MDS_RSS_MAX
        assert _admitted(cluster)  # a newcomer too: the oldest unauthenticated connection makes room
        _round_trip(cluster, "during-flood")
    deadline = time.monotonic() + 5
    while True:  # the flood's connections closed: room again
        try:
            _admitted(cluster)
            break
        except errors.Busy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    _round_trip(cluster, "after-flood")


def _refusals(socks: list[socket.socket]) -> list[tuple[str, str]]:
    """The errors of the connections among ``socks`` the server closed."""
    outcomes = [_received(sock, 0) for sock in socks]
    return [_errors(frames)[0] for frames, closed in outcomes if closed]


def _admitted(cluster: Any) -> bool:
    """Whether a new connection to the metadata service is served (raises Busy if not)."""
    fresh = RpcClient(retries_max=1)
    try:
        cluster.fs.run(fresh.call(cluster.address, messages.PING, messages.Empty()))
    except errors.PermissionDenied:
        pass  # served, if not welcome
    finally:
        cluster.fs.run(fresh.close())
    return True


def test_idle_connections_are_closed_and_clients_reconnect(make_cluster: Any) -> None:
    cluster = _cluster(make_cluster)
    _round_trip(cluster, "first")
    pooled = [conn for pool in cluster.fs.aio.rpc._pools.values() for conn in pool]
    assert pooled
    with _sockets() as opened:
        (idle,) = _attack(opened, cluster.address, 1, HELLO)
        started = time.monotonic()
        frames, closed = _received(idle, IDLE_S + 5)
        assert closed
        if [f.kind for f in frames] == [FrameKind.RESPONSE]:  # hello answered (not refused for want of credentials)
            assert IDLE_S - 0.5 < time.monotonic() - started < IDLE_S + 3
    time.sleep(1)
    assert all(conn.closed.done() for conn in pooled)  # the servers closed the client's idle connections ...
    _round_trip(cluster, "second")  # ... and it did not notice


class _Handler:
    """Answers every operation of the metadata service's table with an empty reply."""

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("rpc_"):
            raise AttributeError(name)

        async def answer(request: Any, payload: memoryview) -> tuple[Any, bytes]:
            return messages.Empty(), b""

        return answer


def test_client_retries_when_a_server_closes_its_idle_connection_as_it_calls() -> None:
    """Calls spaced about the idle timeout apart: some find their pooled connection closed,
    some race the close; every one succeeds."""

    async def main() -> int:
        server = RpcServer(_Handler(), "metadata service", messages.META_OPERATIONS, "meta",
            answering(_Handler().rpc_ping, messages.META_OPERATIONS))
        address = await server.start("127.0.0.1", 0, ConnectionPolicy(connection_idle_timeout_s=0.2))
        client = RpcClient(connections_per_server=1)
        opened: dict[int, Any] = {}
        try:
            for _ in range(25):
                await client.call(address, messages.PING, messages.Empty())
                await client.call_raw(address, "statfs")  # not marked idempotent: retried thanks to its call id
                opened.update((id(c), c) for c in client._pools.get(address, []))
                await asyncio.sleep(random.uniform(0.15, 0.35))
        finally:
            await client.close()
            await server.close()
        return len(opened)

    assert asyncio.run(main()) > 3  # the server did close idle connections


def test_a_trickled_frame_is_closed_by_its_deadline() -> None:
    """A peer that sends a byte now and then never stalls for the timeout, but its frame
    must still finish at the minimum rate."""

    async def main() -> tuple[float, bytes]:
        server = RpcServer(_Handler(), "metadata service", messages.META_OPERATIONS, "meta",
            answering(_Handler().rpc_ping, messages.META_OPERATIONS))
        policy = ConnectionPolicy(frame_stall_timeout_s=0.5, frame_receive_rate_min_bytes_per_s=1 * MiB)
        address = await server.start("127.0.0.1", 0, policy)
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(HELLO + encode_frame(FrameKind.REQUEST, 2, {"op": "ping"}, MiB))
        started = time.monotonic()

        async def trickle() -> None:
            while not writer.is_closing():
                writer.write(bytes(100))
                await asyncio.sleep(0.1)

        trickling = asyncio.get_running_loop().create_task(trickle())
        received = b""
        try:
            while time.monotonic() - started < 10:
                try:
                    data = await asyncio.wait_for(reader.read(65536), 10)
                except ConnectionResetError:  # closed with our trickle unread
                    break
                if not data:
                    break
                received += data
            return time.monotonic() - started, received
        finally:
            trickling.cancel()
            writer.close()
            await server.close()

    elapsed, received = asyncio.run(main())
    assert 1.4 < elapsed < 3, elapsed  # 0.5 s + 1 MiB at 1 MiB/s, and a sweep
    frames = FrameDecoder().feed(received)
    assert "took over" in frames[-1].header["message"]
