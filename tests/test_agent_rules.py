"""What a memory agent lets a ticket holder do with a step (issue 51, part 1): a user
("mallory", made with `tectofs user add`) with a valid ticket, against an agent root and
"alice" use, can neither squat alice's next step, nor poison a restore of root's (the copy the
reader asks first, ``find_copy``, and the listing ``latest(tiers=True)`` uses), nor pin the
agent's memory so that alice's save no longer fits. Each attack runs on real processes (the
test cluster, an agent started as `tectofs up --agent` starts it, the client library), and the
victims' bytes are checked, not only the attacker's error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import types
from typing import Any, Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402

import tectofs.client  # noqa: E402
import tectofs.torch as tt  # noqa: E402
from tectofs import errors  # noqa: E402
from tectofs.agent import messages  # noqa: E402
from tectofs.agent.client import AgentClient, agent_client  # noqa: E402
from tectofs.checksum import crc  # noqa: E402
from tectofs.cli.agent import start_agent  # noqa: E402
from tectofs.torch._memory_copy import find_copy  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

MiB = 1 << 20
WAIT_S = 30.0


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s")
        time.sleep(0.05)


def _user_add(cluster: Any, directory: str, name: str, uid: int) -> Any:
    """User ``name`` made with `tectofs user add`, owning /rules/NAME: its client and agent client."""
    path = os.path.join(directory, f"{name}.credentials")
    subprocess.run([sys.executable, "-m", "tectofs.cli", "user", "add", name, "--uid", str(uid), "--gid", str(uid),
                    "--out", path], env={**os.environ, "TECTOFS_META": cluster.address}, check=True,
                   capture_output=True, timeout=60)
    cluster.fs.mkdir(f"/rules/{name}", parents=True, exist_ok=True)
    cluster.fs.chown(f"/rules/{name}", uid, uid)
    fs = tectofs.client.connect(cluster.address, credentials=path)
    agent = AgentClient()
    agent.prove(fs)
    return types.SimpleNamespace(fs=fs, agent=agent, uid=uid)


@pytest.fixture(scope="module")
def users(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    cluster.fs.mkdir("/rules/root", parents=True, exist_ok=True)
    cluster.fs.chmod("/rules/root", 0o755)
    cluster.fs.chmod("/rules", 0o755)
    directory = str(tmp_path_factory.mktemp("users"))
    made = types.SimpleNamespace(alice=_user_add(cluster, directory, "alice", 1000),
                                 mallory=_user_add(cluster, directory, "mallory", 1001))
    try:
        yield made
    finally:
        made.alice.fs.close()
        made.mallory.fs.close()


@pytest.fixture
def agent(cluster: Any, tmp_path: Any) -> Iterator[str]:
    """One host's agent, no peer, 8 MiB, keeping 1 persisted step (as `tectofs up --agent` runs it)."""
    shm = tmp_path / "shm"
    shm.mkdir()
    proc, address = start_agent(str(tmp_path), "--cluster", cluster.address, "--shm-dir", str(shm),
                                "--memory-bytes", "8M", "--keep-steps", "1", "--wait", "0.5")
    try:
        yield address
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _seal(client: AgentClient, agent: str, step: str, save: str, data: bytes,
          replicas: int | None = None, sent: bool = False) -> messages.SealReply:
    """A step of two files (``data``, and a ``.metadata``) saved through ``client`` (``sent``:
    ``data`` was put already)."""
    if not sent:
        client.put(agent, step, save, "__0_0.distcp", 0, [memoryview(data)])
    client.put(agent, step, save, ".metadata", 0, [memoryview(b"m")])
    files = [messages.HeldFileInfo(name="__0_0.distcp", size=len(data), crc32c=crc(data)),
             messages.HeldFileInfo(name=".metadata", size=1, crc32c=crc(b"m"))]
    return client.seal(agent, step, save, files, [f.name for f in files], replicas)


def _held(client: AgentClient, agent: str, step: str) -> bytes | None:
    """The data file of ``step`` as ``client`` reads it from ``agent`` (None: not found)."""
    located = client.locate(agent, step)
    if located is None or not located.found or located.save is None:
        return None
    size = {f.name: f.size for f in located.files}["__0_0.distcp"]
    into = bytearray(size)
    client.read(agent, step, located.save, "__0_0.distcp", 0, memoryview(into))
    return bytes(into)


def _attempt(action: Callable[[], object]) -> errors.TectofsError | None:
    """What an attack's call was answered with (None: it was served)."""
    try:
        action()
    except errors.TectofsError as exc:
        return exc
    return None


def test_a_user_cannot_squat_another_users_next_step(cluster: Any, users: Any, agent: str) -> None:
    """mallory tries to save and seal alice's next step first (a directory she cannot write);
    alice then saves it, reads her own bytes back, and finds them persisted as hers."""
    step = f"tectofs://{cluster.address}/rules/alice/step_1"
    squat = _attempt(lambda: _seal(users.mallory.agent, agent, step, "squat", b"mallory's bytes"))
    hers = os.urandom(64 << 10)
    sealed = _seal(users.alice.agent, agent, step, "hers", hers)
    assert (sealed.copies, sealed.persisted) == (1, True)  # no peer: persisted before it returned
    assert _held(users.alice.agent, agent, step) == hers
    assert cluster.fs.read_bytes("/rules/alice/step_1/__0_0.distcp") == hers
    assert cluster.fs.stat("/rules/alice/step_1").uid == 1000
    assert isinstance(squat, errors.PermissionDenied) and "may not write /rules/alice" in str(squat), squat


def test_a_user_cannot_poison_a_restore_of_another_users_step(cluster: Any, users: Any, agent: str) -> None:
    """root's step 1 left the agent's memory (persisted, then evicted by step 2: --keep-steps 1);
    mallory tries to seal her bytes under root's step ids (step_1 again, a newer step_9). Root's
    ``find_copy`` finds no copy of step 1 but its own, its load reads root's tensors, and
    ``latest(tiers=True)`` and the listing it uses name root's steps only. A step once committed
    cannot be sealed again in memory, even by a user who may write its directory."""
    run = f"tectofs://{cluster.address}/rules/root/run"
    saved = {step: {"w": torch.full((64, 64), float(step)), "step": step} for step in (1, 2)}
    for step, state in saved.items():
        writer = tt.CheckpointWriter(tier="memory", agent=agent)
        dcp.save(state, checkpoint_id=f"{run}/step_{step}", storage_writer=writer)
    root = agent_client(run)
    _wait_for(lambda: not getattr(root.locate(agent, f"{run}/step_1"), "found", True), "step 1 evicted")

    poisons = {name: _attempt(lambda: _seal(users.mallory.agent, agent, f"{run}/{name}", "poison",
                                            b"mallory's tensors"))
               for name in ("step_1", "step_9")}
    copy = find_copy(f"{run}/step_1", [agent])  # what the reader asks first
    if copy is not None:
        try:
            committed = cluster.fs.read_bytes("/rules/root/run/step_1/__0_0.distcp")
            assert copy.read_bytes(f"{run}/step_1/__0_0.distcp") == committed, "a copy of another writer's bytes"
        finally:
            copy.close()
    listed = tt.checkpoints(run, tiers=True, agent=agent)
    assert [i.uri.rsplit("/", 1)[1] for i in listed] == ["step_1", "step_2"]
    info = tt.latest(run, tiers=True, agent=agent)
    assert info is not None and info.uri == f"{run}/step_2" and "memory" in info.tiers
    for step in (1, 2):
        target = {"w": torch.zeros(64, 64), "step": -1}
        reader = tt.CheckpointReader(agent=agent)
        dcp.load(target, checkpoint_id=f"{run}/step_{step}", storage_reader=reader)
        assert torch.equal(target["w"], saved[step]["w"]) and target["step"] == step
        assert reader.loaded_from == ("storage" if step == 1 else "memory")
    for name, answer in poisons.items():
        assert isinstance(answer, errors.PermissionDenied) and "may not write /rules/root" in str(answer), answer
    with pytest.raises(errors.InvalidArgument, match="canonically"):  # listed under root's run by prefix
        _seal(users.mallory.agent, agent, f"{run}//step_9", "poison", b"mallory's tensors")

    # A directory both may write: alice's step, persisted and evicted, is not sealed again by mallory.
    cluster.fs.mkdir("/rules/shared", exist_ok=True)
    cluster.fs.chmod("/rules/shared", 0o1777)
    shared = f"tectofs://{cluster.address}/rules/shared"
    hers = os.urandom(4096)
    _seal(users.alice.agent, agent, f"{shared}/step_1", "hers", hers)
    _seal(users.alice.agent, agent, f"{shared}/step_2", "hers", os.urandom(4096))
    _wait_for(lambda: _held(users.alice.agent, agent, f"{shared}/step_1") is None, "alice's step 1 evicted")
    with pytest.raises(errors.AlreadyExists, match="committed already"):
        _seal(users.mallory.agent, agent, f"{shared}/step_1", "poison", b"mallory's tensors")
    assert cluster.fs.read_bytes("/rules/shared/step_1/__0_0.distcp") == hers


def test_a_user_cannot_pin_the_memory_another_user_saves_into(cluster: Any, users: Any, agent: str) -> None:
    """mallory tries to seal 7 MiB of steps for a directory she may not write, then 7 MiB in her
    own directory made read-only once they began (never persistable): she holds at most her
    share of the agent's 8 MiB, and alice's 2 MiB save still fits, and reads back whole."""
    mallory = users.mallory
    pinned = os.urandom(MiB - 4096)
    theirs = f"tectofs://{cluster.address}/rules/mallory"
    answers = [_attempt(lambda: _seal(mallory.agent, agent, f"tectofs://{cluster.address}/rules/root/pin_{i}",
                                      "pin", pinned, replicas=0)) for i in range(7)]
    began: list[int] = []
    for i in range(7):  # 7 MiB, each step begun while she may write her directory
        put = _attempt(lambda: mallory.agent.put(agent, f"{theirs}/step_{i}", "pin", "__0_0.distcp", 0,
                                                 [memoryview(pinned)]))
        if put is None:
            began.append(i)
        answers.append(put)
    mallory.fs.chmod("/rules/mallory", 0o555)  # nothing of hers can be persisted now
    try:
        for i in began:  # sealed, kept in memory only (replicas=0)
            answers.append(_attempt(lambda: _seal(mallory.agent, agent, f"{theirs}/step_{i}", "pin", pinned,
                                                  replicas=0, sent=True)))

        hers = os.urandom(2 * MiB)
        step = f"tectofs://{cluster.address}/rules/alice/big"
        sealed = _seal(users.alice.agent, agent, step, "hers", hers)
        assert sealed.persisted
        assert _held(users.alice.agent, agent, step) == hers
        assert cluster.fs.read_bytes("/rules/alice/big/__0_0.distcp") == hers
    finally:
        mallory.fs.chmod("/rules/mallory", 0o755)
    assert all(isinstance(a, errors.PermissionDenied) for a in answers[:7]), answers[:7]
    shares = [a for a in answers[7:] if a is not None]
    assert shares and all(isinstance(a, errors.NoSpace) and "share" in str(a) for a in shares), shares
    assert len(began) <= 6, began


def test_a_save_no_peer_holds_is_persisted_before_it_returns(cluster: Any, agent: str) -> None:
    """One agent, no peer (issue 51, part 5): the save returns persisted, as README says, unless
    one copy in memory was asked for (replicas=0)."""
    run = f"tectofs://{cluster.address}/rules/root/lone"
    writer = tt.CheckpointWriter(tier="memory", agent=agent)
    state = {"w": torch.full((16, 16), 3.0)}
    assert isinstance(writer, tt.MemoryTierWriter)
    dcp.save(state, checkpoint_id=f"{run}/step_1", storage_writer=writer)
    assert writer.last_seal is not None
    assert (writer.last_seal.copies, writer.last_seal.persisted) == (1, True)
    assert "0 of 1 peers took a copy (no peers)" in writer.last_seal.note
    assert sorted(cluster.fs.listdir("/rules/root/lone/step_1")) == [".metadata", "__0_0.distcp"]
    one = _seal(agent_client(run), agent, f"{run}/step_2", "one", b"in memory only", replicas=0)
    assert (one.copies, one.persisted) == (1, False)
