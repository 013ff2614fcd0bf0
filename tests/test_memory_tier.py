"""The checkpoint memory tier (issue 34, part 1): ``tectofs agent`` processes on loopback as
simulated nodes over one test cluster, trainers saving with ``dcp.save`` and
``CheckpointWriter(tier="memory")``, SIGKILLs of the trainer, of an agent and of a whole node
(agent and trainer) during save, replication and persistence. What must hold: a committed
(sealed or persisted) step is never lost or torn, a save that was not sealed is never seen, a
load reads one step from one source. The store's bounds are tested in process (fast lane)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import textwrap
import time
import types
from typing import Any, Callable, Iterator

import pytest
from msgspec import to_builtins as msgspec_to_builtins
from msgspec.structs import replace as msgspec_replace

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402

import tectofs  # noqa: E402
import tectofs.client  # noqa: E402
import tectofs.torch as tt  # noqa: E402
from tectofs import errors  # noqa: E402
from tectofs.agent import messages  # noqa: E402
from tectofs.agent.client import AgentClient, agent_client  # noqa: E402
from tectofs.agent.identity import TicketSource  # noqa: E402
from tectofs.agent.store import StepStore  # noqa: E402
from tectofs.checksum import crc  # noqa: E402
from tectofs.cli.agent import start_agent  # noqa: E402
from tectofs.wire import auth  # noqa: E402
from tectofs.wire import messages as wire  # noqa: E402
from tectofs.wire.client import RpcClient  # noqa: E402
from tests.rendezvous import leave, rendezvous  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

TREE = os.path.dirname(os.path.dirname(os.path.realpath(tectofs.__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (TREE, os.environ.get("PYTHONPATH")) if p)}
WAIT_S = 30.0
ROOT = wire.ActAs(uid=0, gid=0)


def _state(seed: int, rows: int = 256) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(rows, 1024, generator=gen), "b": torch.randn(1024, generator=gen), "step": seed}


def _empty(rows: int = 256) -> dict[str, Any]:
    return {"w": torch.zeros(rows, 1024), "b": torch.zeros(1024), "step": -1}


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return torch.equal(a["w"], b["w"]) and torch.equal(a["b"], b["b"]) and a["step"] == b["step"]


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.05)


class Agents:
    """Agent processes started by a test (one per simulated node), killed at teardown."""

    def __init__(self, root: str, cluster: str) -> None:
        self.root, self.cluster = root, cluster
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *args: str) -> tuple[subprocess.Popen[bytes], str]:
        shm = os.path.join(self.root, f"shm-{len(self.procs)}")
        os.makedirs(shm)
        proc, address = start_agent(self.root, "--cluster", self.cluster, "--shm-dir", shm, *args,
                                    name=f"agent-{len(self.procs)}")
        self.procs.append(proc)
        return proc, address

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


@pytest.fixture
def agents(tmp_path: Any, cluster: Any) -> Iterator[Agents]:
    made = Agents(str(tmp_path), cluster.address)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def nodes(agents: Agents) -> tuple[Agents, subprocess.Popen[bytes], str, subprocess.Popen[bytes], str]:
    """Two nodes: node 2's agent first, then node 1's, which replicates to it."""
    proc2, peer = agents.start("--memory-bytes", "256M", "--takeover", "1")
    proc1, local = agents.start("--memory-bytes", "256M", "--peers", peer)
    return agents, proc1, local, proc2, peer


def _load(uri: str, agent: str, rows: int = 256) -> tuple[dict[str, Any], str]:
    target = _empty(rows)
    reader = tt.CheckpointReader(agent=agent)
    dcp.load(target, checkpoint_id=uri, storage_reader=reader)
    return target, reader.loaded_from


def test_a_save_is_read_from_memory_then_a_peer_then_storage(cluster: Any, nodes: Any) -> None:
    agents, proc1, local, proc2, peer = nodes
    run = f"tectofs://{cluster.address}/memtier/tiers"
    saved = _state(1)
    writer = tt.CheckpointWriter(tier="memory", agent=f"{local},{peer}")
    assert isinstance(writer, tt.MemoryTierWriter)
    dcp.save(saved, checkpoint_id=f"{run}/step_1", storage_writer=writer)
    assert writer.last_seal is not None and writer.last_seal.copies == 2

    loaded, source = _load(f"{run}/step_1", f"{local},{peer}")
    assert source == "memory" and _same(loaded, saved)
    listed = tt.checkpoints(run, tiers=True, agent=f"{local},{peer}")
    assert [i.uri for i in listed] == [f"{run}/step_1"]
    assert {"memory", "peer"} <= listed[0].tiers
    # Persisted behind the save, exactly as a storage save makes it.
    _wait_for(lambda: "storage" in tt.checkpoints(run, tiers=True, agent=local)[0].tiers, "persisted")
    assert sorted(cluster.fs.listdir("/memtier/tiers/step_1")) == [".metadata", "__0_0.distcp"]
    assert tt.latest(run, tiers=True, agent=local) == tt.CheckpointInfo(f"{run}/step_1",
                                                                        frozenset({"memory", "peer", "storage"}))

    proc1.kill()
    proc1.wait(timeout=10)
    loaded, source = _load(f"{run}/step_1", f"{local},{peer}")
    assert source == "peer" and _same(loaded, saved)
    proc2.kill()
    proc2.wait(timeout=10)
    loaded, source = _load(f"{run}/step_1", f"{local},{peer}")
    assert source == "storage" and _same(loaded, saved)
    assert tt.latest(run, agent=f"{local},{peer}") == f"{run}/step_1"


def test_a_trainer_that_may_not_open_its_agents_files_reads_them_through_its_socket(
        cluster: Any, nodes: Any, monkeypatch: Any) -> None:
    """The systemd unit runs the agent as its own user: a trainer of another user cannot open
    the step's files (0600). It still reads this host's copy, through the agent's socket, and
    checks it, rather than going to a peer or the chunk servers."""
    from tectofs.torch import _memory_copy

    _, _, local, proc2, peer = nodes
    uri = f"tectofs://{cluster.address}/memtier/other_user/step_1"
    saved = _state(4)
    dcp.save(saved, checkpoint_id=uri, storage_writer=tt.CheckpointWriter(tier="memory", agent=f"{local},{peer}"))
    proc2.kill()  # no peer to fall back to
    proc2.wait(timeout=10)

    def not_ours(self: Any, agent: str, step: str, reply: Any) -> None:
        raise PermissionError(13, "Permission denied", reply.paths[0])

    monkeypatch.setattr(_memory_copy.LocalCopy, "__init__", not_ours)
    source = _memory_copy.find_copy(uri, [local, peer])
    assert isinstance(source, _memory_copy.PeerCopy) and source.agent == local and source.tier == "memory"
    source.close()
    loaded, tier = _load(uri, f"{local},{peer}")
    assert tier == "memory" and _same(loaded, saved)


def test_this_hosts_copy_is_trusted_as_sealed_unless_verify_memory(cluster: Any, nodes: Any) -> None:
    """A copy in this host's memory was checked against the writer's crc32c when sealed; a load
    reads it without checking again (``loaded_from`` "memory", whatever the bytes now are),
    while ``verify_memory=True`` checks every item, finds a byte changed since and reads the
    whole load again from the peer, bit-exact."""
    from tectofs.agent.client import agent_client

    _, _, local, _, peer = nodes
    uri = f"tectofs://{cluster.address}/memtier/trusted/step_1"
    saved = _state(3)
    dcp.save(saved, checkpoint_id=uri, storage_writer=tt.CheckpointWriter(tier="memory", agent=f"{local},{peer}"))
    located = agent_client(uri).locate(local, uri)
    assert located is not None and located.found
    data = [path for info, path in zip(located.files, located.paths) if info.name.endswith(".distcp")]
    assert len(data) == 1
    with open(data[0], "r+b") as f:  # one byte in the middle of the tensor w, changed behind the agent
        middle = os.fstat(f.fileno()).st_size // 2
        f.seek(middle)
        byte = f.read(1)
        f.seek(middle)
        f.write(bytes([byte[0] ^ 0xFF]))

    loaded, source = _load(uri, f"{local},{peer}")
    assert source == "memory" and not _same(loaded, saved)

    target = _empty()
    reader = tt.CheckpointReader(agent=f"{local},{peer}", verify_memory=True)
    with pytest.warns(UserWarning, match="crc32c"):
        dcp.load(target, checkpoint_id=uri, storage_reader=reader)
    assert reader.loaded_from == "peer" and _same(target, saved)


def test_a_save_whose_peer_is_down_is_persisted_before_it_returns(cluster: Any, nodes: Any) -> None:
    """Replication cannot be done (node 2's agent was killed): the seal persists the step
    before answering, so the save never counts as saved with one copy in memory."""
    agents, proc1, local, proc2, peer = nodes
    proc2.kill()
    proc2.wait(timeout=10)
    run = f"tectofs://{cluster.address}/memtier/lonely"
    writer = tt.CheckpointWriter(tier="memory", agent=local)
    assert isinstance(writer, tt.MemoryTierWriter)
    dcp.save(_state(4), checkpoint_id=f"{run}/step_1", storage_writer=writer)
    assert writer.last_seal is not None
    assert (writer.last_seal.copies, writer.last_seal.persisted) == (1, True)
    assert "0 of 1 peers took a copy" in writer.last_seal.note
    assert _committed(cluster, "/memtier/lonely/step_1") == [".metadata", "__0_0.distcp"]
    loaded, source = _load(f"{run}/step_1", local)
    assert source == "memory" and _same(loaded, _state(4))


TRAINER = textwrap.dedent('''
    import sys, time, torch
    import torch.distributed.checkpoint as dcp
    import tectofs.torch as tt
    from tectofs.agent.client import AgentClient
    run, agent, stall_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
    original = AgentClient.put
    def put(self, address, step, save, name, offset, views):
        original(self, address, step, save, name, offset, views)
        if step.endswith(f"step_{stall_at}"):
            print("stalled", flush=True)
            time.sleep(60)  # the test kills us here: mid-save
    AgentClient.put = put
    writer = tt.CheckpointWriter(tier="memory", agent=agent)
    for step in (1, 2, 3):
        gen = torch.Generator().manual_seed(step)
        sd = {"w": torch.randn(256, 1024, generator=gen), "b": torch.randn(1024, generator=gen), "step": step}
        dcp.save(sd, checkpoint_id=f"{run}/step_{step}", storage_writer=writer)
        print("saved", step, writer.last_seal.copies, flush=True)
''')


def _trainer(tmp_path: Any, run: str, agent: str, stall_at: int) -> subprocess.Popen[str]:
    script = os.path.join(str(tmp_path), "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    return subprocess.Popen([sys.executable, script, run, agent, str(stall_at)], env=ENV, stdout=subprocess.PIPE,
                            text=True)


def _read_until(proc: subprocess.Popen[str], line: str) -> list[str]:
    """The trainer's lines up to ``line`` (bounded: it is killed if it takes too long)."""
    seen: list[str] = []
    deadline = time.monotonic() + WAIT_S
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        got = proc.stdout.readline().strip()
        if not got and proc.poll() is not None:
            break
        seen.append(got)
        if got == line:
            return seen
    proc.kill()
    pytest.fail(f"the trainer never printed {line!r}: {seen}")


def test_a_trainer_killed_mid_save_leaves_the_step_before_it(cluster: Any, nodes: Any, tmp_path: Any) -> None:
    agents, proc1, local, proc2, peer = nodes
    run = f"tectofs://{cluster.address}/memtier/killed_trainer"
    trainer = _trainer(tmp_path, run, f"{local},{peer}", stall_at=2)
    try:
        assert _read_until(trainer, "stalled") == ["saved 1 2", "stalled"]
        trainer.send_signal(signal.SIGKILL)
    finally:
        trainer.kill()
        trainer.wait(timeout=10)
    assert tt.latest(run, agent=f"{local},{peer}") == f"{run}/step_1"
    loaded, source = _load(f"{run}/step_1", f"{local},{peer}")
    assert source == "memory" and _same(loaded, _state(1))
    with pytest.raises(tt.CheckpointFailed, match="no complete checkpoint"):  # the torn save is seen by no one
        _load(f"{run}/step_2", f"{local},{peer}")
    assert all(not i.uri.endswith("step_2") for i in tt.checkpoints(run, tiers=True, agent=f"{local},{peer}"))


def _kill_node_at(trainer: subprocess.Popen[str], agent: subprocess.Popen[bytes], line: str) -> None:
    """SIGKILL a whole node, its agent and its trainer, once the trainer printed ``line``."""
    try:
        _read_until(trainer, line)
        agent.send_signal(signal.SIGKILL)
        trainer.send_signal(signal.SIGKILL)
    finally:
        trainer.kill()
        trainer.wait(timeout=10)
        agent.wait(timeout=10)


def test_a_node_killed_mid_save_and_replication_leaves_the_step_before_it(cluster: Any, nodes: Any,
                                                                          tmp_path: Any) -> None:
    """Node 1's agent and trainer are killed while step 2 is being received and forwarded to
    node 2: node 2 holds all of step 1 and at most part of step 2 (never sealed, never seen)."""
    agents, proc1, local, proc2, peer = nodes
    run = f"tectofs://{cluster.address}/memtier/killed_mid_replication"
    _kill_node_at(_trainer(tmp_path, run, f"{local},{peer}", stall_at=2), proc1, "stalled")  # mid-step 2
    assert tt.latest(run, agent=f"{local},{peer}") == f"{run}/step_1"
    loaded, source = _load(f"{run}/step_1", f"{local},{peer}")
    assert source in ("peer", "storage") and _same(loaded, _state(1))
    with pytest.raises(tt.CheckpointFailed, match="no complete checkpoint"):
        _load(f"{run}/step_2", f"{local},{peer}")


def test_a_node_killed_during_persistence_loses_no_step(cluster: Any, nodes: Any, tmp_path: Any) -> None:
    """Node 1 (its agent and its trainer) is killed right after a seal, while its agent
    persists: the step is committed whole or not at all, loadable from node 2's copy meanwhile,
    and node 2 persists it itself once node 1 stops answering (--takeover)."""
    agents, proc1, local, proc2, peer = nodes
    run = f"tectofs://{cluster.address}/memtier/killed_node"
    _kill_node_at(_trainer(tmp_path, run, f"{local},{peer}", stall_at=3), proc1, "saved 2 2")  # step 2 sealed
    for step in (1, 2):
        names = _committed(cluster, f"/memtier/killed_node/step_{step}")
        assert names in (None, [".metadata", "__0_0.distcp"]), f"step_{step} torn in storage: {names}"
        loaded, source = _load(f"{run}/step_{step}", f"{local},{peer}")
        assert source in ("peer", "storage") and _same(loaded, _state(step))
    _wait_for(lambda: _committed(cluster, "/memtier/killed_node/step_2") is not None, "node 2 took over persistence")
    loaded, source = _load(f"{run}/step_2", "")
    assert source == "storage" and _same(loaded, _state(2))


def _committed(cluster: Any, path: str) -> list[str] | None:
    try:
        return sorted(cluster.fs.listdir(path))
    except FileNotFoundError:
        return None


def test_async_save_and_load_through_the_checkpoint_id(cluster: Any, agents: Agents,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, agent = agents.start("--memory-bytes", "64M")
    monkeypatch.setenv("TECTOFS_AGENT", agent)
    monkeypatch.setenv("TECTOFS_TIER", "memory")
    run = f"tectofs://{cluster.address}/memtier/by_id"
    saved = _state(7, rows=64)
    dcp.save(saved, checkpoint_id=f"{run}/step_1")
    writer = tt.CheckpointWriter(tier="memory")
    future = dcp.async_save(_state(8, rows=64), checkpoint_id=f"{run}/step_2", storage_writer=writer)
    assert isinstance(future, concurrent.futures.Future)
    future.result(timeout=WAIT_S)
    target = _empty(rows=64)
    dcp.load(target, checkpoint_id=tt.latest(run))
    assert _same(target, _state(8, rows=64))
    dcp.load(target, checkpoint_id=f"{run}/step_1")
    assert _same(target, saved)


@pytest.mark.slow
def test_a_full_agent_refuses_a_save_clearly_and_keeps_unpersisted_steps(cluster: Any, agents: Agents) -> None:
    """Nothing can be persisted (a file stands where the step's directory would be, put there
    after its save began): a save that needs room fails after --wait with NoSpace, and the
    earlier step, the only copy, stays."""
    _, agent = agents.start("--memory-bytes", "5M", "--keep-steps", "1", "--wait", "0.5")
    run = f"tectofs://{cluster.address}/unpersistable-full/run"
    client = agent_client(run)
    first = f"{run}/step_1"
    data = memoryview(os.urandom(3 << 20))
    client.put(agent, first, "s1", "__0_0.distcp", 0, [data])
    _unpersistable(cluster, "full")
    _seal(client, agent, first, "s1", data)
    with pytest.raises(errors.NoSpace, match="memory agent .* is full"):
        client.put(agent, f"tectofs://{cluster.address}/full-other/step_2", "s2", "__0_0.distcp", 0, [data])
    located = client.locate(agent, first)
    assert located is not None and located.found and not located.persisted


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_shared_memory_file_system_fails_a_save_at_once_and_frees_what_it_took(cluster: Any,
                                                                                     agents: Agents) -> None:
    """The agent's bound (--memory-bytes) is larger than its tmpfs: a save that does not fit
    there fails at once (nothing else would free room) saying where memory ran out, a save cut
    short by the file system leaves nothing behind, and the agent goes on serving."""
    import subprocess as sp

    shm = os.path.join(agents.root, "small-shm")
    os.makedirs(shm)
    sp.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tectofs-test", shm], check=True, timeout=30)
    try:
        proc, agent = start_agent(agents.root, "--cluster", cluster.address, "--shm-dir", shm, "--memory-bytes",
                                  "256M", "--wait", "30", name="small-agent")
        agents.procs.append(proc)
        run = f"tectofs://{cluster.address}/small-shm/run"
        client = agent_client(run)
        started = time.monotonic()
        with pytest.raises(errors.NoSpace, match="small-shm.* bytes free"):
            client.put(agent, f"{run}/step_1", "s1", "__0_0.distcp", 0, [memoryview(os.urandom(12 << 20))])
        assert time.monotonic() - started < 15  # not --wait: nothing was there to persist
        # Another program fills the tmpfs in the middle of a save: its next piece no longer
        # fits, and the torn save is dropped with the bytes it held.
        step = f"{run}/step_2"
        client.put(agent, step, "s2", "__0_0.distcp", 0, [memoryview(os.urandom(2 << 20))])
        filler = os.path.join(shm, "filler")
        with open(filler, "wb") as f:
            try:
                f.write(os.urandom(5 << 20))
            except OSError:
                pass
        with pytest.raises(errors.NoSpace, match="small-shm.* bytes free"):
            client.put(agent, step, "s2", "__0_0.distcp", 2 << 20, [memoryview(os.urandom(2 << 20))])
        os.unlink(filler)
        held = [f for d, _, files in os.walk(shm) for f in files]
        assert held == [], held
        assert _seal(client, agent, f"{run}/step_3", "s3", memoryview(b"abc")).copies == 1
        assert proc.poll() is None
    finally:
        agents.close()
        sp.run(["umount", "-l", shm], check=False, timeout=30)


def _unpersistable(cluster: Any, name: str) -> None:
    """Make the steps of run directory /unpersistable-NAME/run impossible to persist: a file
    stands where it would be (after their saves began: the agent refuses a save it could not
    persist when it begins)."""
    cluster.fs.write_bytes(f"/unpersistable-{name}", b"in the way")


def _seal(client: Any, agent: str, step: str, save: str, data: memoryview) -> messages.SealReply:
    client.put(agent, step, save, "__0_0.distcp", 0, [data])
    client.put(agent, step, save, ".metadata", 0, [memoryview(b"m")])
    files = [messages.HeldFileInfo(name="__0_0.distcp", size=data.nbytes, crc32c=crc(data)),
             messages.HeldFileInfo(name=".metadata", size=1, crc32c=crc(b"m"))]
    return client.seal(agent, step, save, files, [f.name for f in files], 0)


@pytest.mark.slow
def test_bad_input_gets_a_clear_error_and_the_agent_keeps_serving(cluster: Any, agents: Agents) -> None:
    _, agent = agents.start("--memory-bytes", "16M")
    run = f"tectofs://{cluster.address}/bad-input/run"
    client = agent_client(run)
    step = f"{run}/step_1"
    with pytest.raises(errors.NotFound, match="holds no save"):
        client.seal(agent, step, "nope", [], [".metadata"], 0)
    client.put(agent, step, "s1", "__0_0.distcp", 0, [memoryview(b"abc")])
    with pytest.raises(errors.CheckpointError, match="torn"):  # a wrong crc: the save is dropped
        client.verify(agent, step, "s1", [messages.HeldFileInfo(name="__0_0.distcp", size=3, crc32c=crc(b"abd"))])
    with pytest.raises(errors.NotFound):
        client.verify(agent, step, "s1", [])
    assert _seal(client, agent, step, "s2", memoryview(b"abc")).copies == 1
    with pytest.raises(errors.InvalidArgument, match="cannot read"):
        client.read(agent, step, "s2", "__0_0.distcp", 2, memoryview(bytearray(5)))

    rpc = RpcClient(retries_max=0, timeout_s=5.0, default_auth=TicketSource(cluster.fs).client_auth())

    async def raw() -> list[str]:
        answers = []
        for op, header in (("mem_seal", {"step": 5}), ("mem_get", {"step": step, "save": "s2", "file": "../x",
                                                                   "offset": 0, "length": 1}),
                           ("mem_put", {"step": step, "save": "x" * 100, "file": "f", "offset": 0}),
                           ("mem_put", {"step": step, "save": "s9", "file": "..", "offset": 0}),
                           ("no_such_op", {})):
            try:
                await rpc.call_raw(agent, op, header)
                answers.append("accepted")
            except errors.TectofsError as exc:
                answers.append(type(exc).__name__)
        await rpc.close()
        return answers

    import asyncio

    assert asyncio.run(raw()) == ["InvalidArgument"] * 5
    import socket

    with socket.create_connection(tuple(agent.rsplit(":", 1)), timeout=5) as s:  # type: ignore[arg-type]
        s.sendall(b"this is not a tectofs frame" * 10)
        s.settimeout(5)
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
    assert _seal(client, agent, f"{run}/step_3", "s3", memoryview(b"xyz")).copies == 1
    with pytest.raises(errors.InvalidArgument, match="this memory agent serves cluster"):
        client.put(agent, "tectofs://127.0.0.1:1/run/step_1", "s1", "__0_0.distcp", 0, [memoryview(b"abc")])


@pytest.fixture(scope="module")
def alice(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """User alice (uid 1000, not a proxy): her client of the cluster (``fs``) and credential
    file (``credentials``)."""
    path = str(tmp_path_factory.mktemp("alice") / "alice.credentials")
    reply = cluster.fs.run(cluster.fs.aio.metadata.user_add(wire.UserAddRequest(name="alice", uid=1000, gid=1000,
                                                                                groups=[])))
    auth.Credential(user="alice", secret=reply.secret, cluster=cluster.address).save(path)
    fs = tectofs.client.connect(cluster.address, credentials=path)
    try:
        yield types.SimpleNamespace(fs=fs, credentials=path)
    finally:
        fs.close()


def _as(fs: Any) -> AgentClient:
    """An agent client proving the identity of ``fs`` (not the process's own: ``agent_client``)."""
    client = AgentClient()
    client.prove(fs)
    return client


def test_a_step_is_its_savers_alone(cluster: Any, nodes: Any, alice: Any) -> None:
    """Another user (alice) can neither find, list, read nor overwrite root's step held in
    memory, nor pass for an agent (replicas, seals of replicas, persisted notices), nor connect
    without a ticket, with someone else's, with a forged or an expired one; root's step loads
    whole afterwards."""
    _, _, local, _, peer = nodes
    run = f"tectofs://{cluster.address}/memtier/owned"
    uri = f"{run}/step_1"
    saved = _state(11, rows=16)
    dcp.save(saved, checkpoint_id=uri, storage_writer=tt.CheckpointWriter(tier="memory", agent=f"{local},{peer}"))
    mine = agent_client(uri).locate(local, uri)
    assert mine is not None and mine.found
    theirs = _as(alice.fs)
    for agent in (local, peer):  # the primary's copy and the replica
        located = theirs.locate(agent, uri)
        assert located is not None and not located.found
        listed = theirs.listing(agent, run)
        assert listed is not None and listed.steps == []
    with pytest.raises(errors.NotFound):
        theirs.read(local, uri, mine.save or "", ".metadata", 0, memoryview(bytearray(1)))
    with pytest.raises(errors.PermissionDenied, match="another user"):  # a new save of root's step
        theirs.put(local, uri, "forged", "__0_0.distcp", 0, [memoryview(b"evil")])
    with pytest.raises(errors.PermissionDenied, match="send replicas"):
        theirs.call(local, messages.PUT, messages.PutRequest(step=f"{run}/step_2", save="s", file="f", offset=0,
                                                             replica=True, owner=ROOT), b"x")
    with pytest.raises(errors.PermissionDenied, match="seal replicas"):
        theirs.call(local, messages.SEAL, messages.SealRequest(step=uri, save=mine.save or "", files=[],
                                                               names=[".metadata"], primary=peer))
    with pytest.raises(errors.PermissionDenied, match="only other memory agents"):
        theirs.call(local, messages.PERSISTED, messages.StepRequest(step=uri, save=mine.save))

    import asyncio

    ticket = alice.fs.run(alice.fs.aio.metadata.ticket(wire.TicketRequest(issuer=cluster.address)))
    forged = msgspec_replace(ticket.ticket, uid=0, gid=0, proxy=True)
    expired = cluster.fs.run(cluster.fs.aio.metadata.ticket(wire.TicketRequest(issuer=cluster.address)))
    stale = msgspec_replace(expired.ticket, expiry=int(time.time()) - 1)
    cases = {
        "anonymous": None,
        "forged uid": auth.ClientAuth(ticket=(msgspec_to_builtins(forged), ticket.secret)),
        "expired": auth.ClientAuth(ticket=(msgspec_to_builtins(stale), expired.secret)),
        "a user credential": auth.ClientAuth(credential=auth.Credential.load(alice.credentials)),
    }

    async def refused(client_auth: Any) -> str:
        rpc = RpcClient(retries_max=0, timeout_s=5.0, default_auth=client_auth)
        try:
            await rpc.call(local, messages.LOCATE, messages.StepRequest(step=uri))
            return "served"
        except errors.PermissionDenied as exc:
            return type(exc).__name__
        finally:
            await rpc.close()

    answers = {name: asyncio.run(refused(how)) for name, how in cases.items()}
    assert answers == {"anonymous": "PermissionDenied", "forged uid": "AuthenticationFailed",
                       "expired": "AuthenticationFailed", "a user credential": "AuthenticationFailed"}, answers
    loaded, source = _load(uri, f"{local},{peer}", rows=16)
    assert source == "memory" and _same(loaded, saved)


def test_the_agent_persists_a_step_as_its_saver(cluster: Any, nodes: Any, alice: Any) -> None:
    """alice's step in her own directory is persisted as hers (uid 1000); her step in a
    directory only root may write is refused when its save begins (the agent would persist it
    acting as her): nothing of it is held."""
    _, _, local, _, peer = nodes
    cluster.fs.mkdir("/memtier/alices", parents=True, exist_ok=True)
    cluster.fs.chown("/memtier/alices", 1000, 1000)
    cluster.fs.mkdir("/memtier/roots", parents=True, exist_ok=True)
    cluster.fs.chmod("/memtier/roots", 0o755)
    client = _as(alice.fs)
    hers, blocked = (f"tectofs://{cluster.address}/memtier/{d}/step_1" for d in ("alices", "roots"))
    assert _seal(client, local, hers, "s1", memoryview(b"weights")).copies == 1
    with pytest.raises(errors.PermissionDenied, match="may not write /memtier/roots"):
        _seal(client, local, blocked, "s1", memoryview(b"weights"))
    _wait_for(lambda: getattr(client.locate(local, hers), "persisted", False), "alice's step persisted")
    assert cluster.fs.stat("/memtier/alices/step_1").uid == 1000
    assert cluster.fs.stat("/memtier/alices/step_1/__0_0.distcp").uid == 1000
    assert cluster.fs.read_bytes("/memtier/alices/step_1/__0_0.distcp") == b"weights"
    located = client.locate(local, blocked)
    assert located is not None and not located.found
    assert not cluster.fs.exists("/memtier/roots/step_1")


def test_an_agent_whose_credential_may_not_act_for_others_does_not_start(
        cluster: Any, agents: Agents, alice: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TECTOFS_CREDENTIALS", alice.credentials)
    with pytest.raises(RuntimeError, match="did not start"):
        agents.start("--memory-bytes", "16M")
    with open(os.path.join(agents.root, "logs", f"agent-{len(agents.procs)}.log")) as f:
        assert "may not act for other users" in f.read()


def _rank(rank: int, rendezvous: str, run: str, agents_of: list[str]) -> None:
    """One of two gloo ranks, each with its own shard, each on its own "node" (agent list)."""
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    try:
        shard = {f"rank{rank}.w": torch.full((64, 64), float(rank + 1)), "shared": torch.arange(8.0)}
        writer = tt.CheckpointWriter(tier="memory", agent=agents_of[rank])
        dcp.save(shard, checkpoint_id=f"{run}/step_1", storage_writer=writer)
        target = {f"rank{rank}.w": torch.zeros(64, 64), "shared": torch.zeros(8)}
        reader = tt.CheckpointReader(agent=agents_of[rank])
        dcp.load(target, checkpoint_id=f"{run}/step_1", storage_reader=reader)
        assert torch.equal(target[f"rank{rank}.w"], shard[f"rank{rank}.w"]), f"rank {rank}: wrong shard"
        assert torch.equal(target["shared"], shard["shared"])
        assert reader.loaded_from == "memory", (rank, reader.loaded_from)  # node 2 holds the replica
        dist.barrier()
    finally:
        dist.destroy_process_group()
    leave()


def test_two_ranks_on_two_nodes_save_one_step_to_the_coordinators_agent(cluster: Any, nodes: Any, tmp_path: Any) -> None:
    """Each rank sends its files to the coordinator's agent (the plan names it), which seals
    the step once every rank's files are there and checked, with its replica on the other
    node: each rank then loads the step from its own node's memory."""
    import torch.multiprocessing as mp

    agents, proc1, local, proc2, peer = nodes
    run = f"tectofs://{cluster.address}/memtier/ranks"
    mp.spawn(_rank, args=(rendezvous(tmp_path), run, [f"{local},{peer}", f"{peer},{local}"]), nprocs=2, join=True)
    located = agent_client(run).locate(local, f"{run}/step_1")
    assert located is not None and located.found
    assert sorted(f.name for f in located.files) == [".metadata", "__0_0.distcp", "__1_0.distcp"]


# ---------------------------------------------------------------------- the store, in process


def _held(store: StepStore, step: str, nbytes: int, persisted: bool) -> None:
    held = store.begin(step, "s", primary=True, origin=None, owner=ROOT)
    assert store.room_for(nbytes)
    store.write(held, "__0_0.distcp", 0, memoryview(bytes(nbytes)))
    store.write(held, ".metadata", 0, memoryview(b"m"))
    StepStore.verified(held, [messages.HeldFileInfo(name="__0_0.distcp", size=nbytes, crc32c=0),
                              messages.HeldFileInfo(name=".metadata", size=1, crc32c=0)])
    store.seal(held, ["__0_0.distcp", ".metadata"])
    if persisted:
        assert store.mark_persisted(step, "s")


def test_the_store_never_evicts_the_only_copy_of_an_unpersisted_step(tmp_path: Any) -> None:
    now = [0.0]
    store = StepStore(str(tmp_path), memory_bytes_max=1000, keep_steps=3, clock=lambda: now[0])
    _held(store, "tectofs://h:1/r/step_1", 400, persisted=False)
    now[0] += 1
    _held(store, "tectofs://h:1/r/step_2", 400, persisted=True)
    assert store.room_for(500)  # step_2 (persisted) goes
    assert sorted(store.steps) == ["tectofs://h:1/r/step_1"]
    assert not store.room_for(700)  # only step_1 could make room: it stays
    assert sorted(store.steps) == ["tectofs://h:1/r/step_1"]
    with pytest.raises(errors.NoSpace):
        store.room_for(1001)
    with pytest.raises(errors.AlreadyExists):  # a second save of a step held unpersisted
        store.begin("tectofs://h:1/r/step_1", "other", primary=True, origin=None, owner=ROOT)
    assert store.mark_persisted("tectofs://h:1/r/step_1", "s")
    assert store.room_for(700) and not store.steps


def test_the_store_keeps_the_newest_persisted_steps_and_drops_abandoned_saves(tmp_path: Any) -> None:
    now = [0.0]
    store = StepStore(str(tmp_path), memory_bytes_max=1 << 20, keep_steps=2, abandon_s=10.0, clock=lambda: now[0])
    for step in range(1, 5):
        now[0] += 1
        _held(store, f"tectofs://h:1/r/step_{step}", 10, persisted=step != 2)
    # step_2 is not persisted: kept beyond K until it is
    assert sorted(store.steps) == ["tectofs://h:1/r/step_2", "tectofs://h:1/r/step_3", "tectofs://h:1/r/step_4"]
    torn = store.begin("tectofs://h:1/r/step_5", "s", primary=True, origin=None, owner=ROOT)
    store.write(torn, "__0_0.distcp", 0, memoryview(b"partial"))
    with pytest.raises(errors.InvalidArgument, match="never received"):
        store.seal(torn, ["__0_0.distcp", ".metadata"])
    assert store.sealed("tectofs://h:1/r/step_5") is None
    now[0] += 11
    assert store.collect_abandoned() == ["tectofs://h:1/r/step_5"]
    assert store.mark_persisted("tectofs://h:1/r/step_2", "s")
    assert sorted(store.steps) == ["tectofs://h:1/r/step_3", "tectofs://h:1/r/step_4"]


def test_the_widest_agent_messages_fit_a_frame_header() -> None:
    import msgspec

    from tectofs import limits

    name = "n" * messages.FILE_NAME_BYTES_MAX
    widest = messages.HeldFileInfo(name=name, size=2**63 - 1, crc32c=2**32 - 1)
    step = "s" * messages.STEP_ID_BYTES_MAX
    replies = [
        messages.LocateReply(found=True, save="t" * 64, files=[widest] * messages.FILES_MAX,
                             paths=["p" * messages.LOCAL_PATH_BYTES_MAX] * messages.FILES_MAX, persisted=True,
                             peers=["a" * limits.address_length_max_bytes] * messages.PEERS_MAX),
        messages.ListReply(steps=[messages.HeldStepInfo(step=step, save="t" * 64, persisted=True, primary=True,
                                                        nbytes=2**63 - 1)] * messages.STEPS_LISTED_MAX, truncated=True,
                           peers=["a" * limits.address_length_max_bytes] * messages.PEERS_MAX),
        messages.SealRequest(step=step, save="t" * 64, files=[widest] * messages.FILES_MAX,
                             names=[name] * messages.FILES_MAX, replicas=8, primary="a" * 255),
    ]
    for message in replies:
        assert len(msgspec.msgpack.encode(message)) <= limits.reply_header_budget_bytes, type(message).__name__



def test_a_load_that_fails_from_memory_is_read_again_whole_from_the_next_source(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``read_with_failover``: a memory source failing mid-load hands the whole load to the next
    source holding the step (here none: the chunk servers), with a warning naming both; a
    failure from the chunk servers is the caller's."""
    from tectofs.torch import _memory_copy

    class Failing(_memory_copy.Source):
        def __init__(self) -> None:
            self.agent, self.step, self.save, self.files, self.tier = "127.0.0.1:9", "s", "t", {}, "memory"
            self.closed = False

        def close(self) -> None:
            self.closed = True

    asked: list[frozenset[str]] = []
    monkeypatch.setattr(_memory_copy, "find_copy", lambda step, agent_list, skip=frozenset(): asked.append(skip))
    reads: list[object] = []
    switched: list[object] = []
    failing = Failing()

    def read() -> None:
        reads.append(switched[-1] if switched else failing)
        if len(reads) == 1:
            raise errors.ChecksumMismatch("item x fails its crc32c check")

    with pytest.warns(UserWarning, match=r"from memory agent 127.0.0.1:9 failed .*crc32c.* from the chunk servers"):
        _memory_copy.read_with_failover(read, failing, "s", ["127.0.0.1:9"], switched.append)
    assert reads == [failing, None] and switched == [None] and failing.closed
    assert asked == [frozenset({"127.0.0.1:9"})]

    def broken() -> None:
        raise errors.NotFound("no complete checkpoint")

    with pytest.raises(errors.NotFound):
        _memory_copy.read_with_failover(broken, None, "s", [], switched.append)


def test_a_cluster_is_the_same_whatever_the_order_of_its_group() -> None:
    from tectofs.agent.identity import same_cluster

    assert same_cluster("10.0.0.1:7420,10.0.0.2:7420", "10.0.0.2:7420,10.0.0.1:7420")
    assert not same_cluster("10.0.0.1:7420", "10.0.0.1:7421")
    assert not same_cluster("not an address", "10.0.0.1:7420")


def test_many_hellos_with_one_ticket_ask_the_cluster_once() -> None:
    """The ranks of one job connect to the coordinator's agent at once: 500 hellos carrying
    the same ticket cost one question to the cluster; a ticket it refuses fails each hello."""
    import asyncio

    from tectofs.agent.identity import TicketChecker
    from tectofs.errors import AuthenticationFailed, PermissionDenied

    asked: list[int] = []

    async def secret_of(ticket: Any) -> bytes:
        asked.append(ticket.uid)
        await asyncio.sleep(0.05)
        if ticket.uid == 666:
            raise PermissionDenied("forged")
        return b"s" * 32

    expiry = int(time.time()) + 3600  # one expiry: each claim of a uid is the same ticket

    def claim(uid: int) -> Any:
        ticket = wire.Ticket(uid=uid, gid=uid, expiry=expiry, key_id="k", issuer="127.0.0.1:7420")
        return wire.HelloAuth(kind="ticket", nonce=b"n" * 16, ticket=ticket)

    async def main() -> tuple[list[Any], list[Any]]:
        checker = TicketChecker("127.0.0.1:7420", secret_of)
        good = await asyncio.gather(*(checker.resolve(claim(1000)) for _ in range(500)))
        bad = await asyncio.gather(*(checker.resolve(claim(666)) for _ in range(50)), return_exceptions=True)
        await checker.resolve(claim(1000))  # kept
        return good, bad

    good, bad = asyncio.run(main())
    assert asked == [1000, 666]
    assert {(secret, peer.uid) for secret, peer in good} == {(b"s" * 32, 1000)}
    assert all(isinstance(e, AuthenticationFailed) and "did not vouch" in str(e) for e in bad)


def test_the_tickets_one_identity_takes_within_a_step_are_one_ticket(cluster: Any) -> None:
    from tectofs import limits

    tickets = [cluster.fs.run(cluster.fs.aio.metadata.ticket(wire.TicketRequest(issuer=cluster.address)))
               for _ in range(3)]
    assert len({t.ticket.expiry for t in tickets}) <= 2  # (a step boundary may fall between them)
    first = tickets[0].ticket
    assert first.expiry % limits.ticket_expiry_step_s == 0
    assert limits.ticket_ttl_s <= first.expiry - time.time() <= limits.ticket_ttl_s + limits.ticket_expiry_step_s + 5
    assert tickets[0].secret == tickets[1].secret or tickets[1].secret == tickets[2].secret
