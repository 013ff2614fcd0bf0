"""Degraded writes: with chunk servers missing, writes go on as long as the policy's
``write_min`` chunks of each block can be stored (k+1 for rs(k,m)); such blocks are counted
as under-redundant. Below the minimum, a clear error within seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from typing import Any, Callable

import pytest

from tectofs import errors
from tectofs.wire import messages

MiB = 1 << 20


def _kill(c: Any, count: int) -> None:
    for i in range(count):
        c.kill_chunk_server(i)
    deadline = time.monotonic() + 30
    while sum(s.live for s in c.servers()) > len(c.chunk_data_dirs) - count:
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_one_server_of_six_down_writes_go_on(make_cluster: Callable[..., Any], tmp_path: Any) -> None:
    c = make_cluster()  # rs(4,2): writes need 5 chunks, reads 4
    fs = c.fs
    _kill(c, 1)
    data = os.urandom(3 * MiB + 123)
    fs.write_bytes("/degraded", data)  # library
    assert fs.read_bytes("/degraded") == data
    layout = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path="/degraded")))
    assert {len(b.chunks) for b in layout.blocks} == {5}
    local = tmp_path / "put.bin"
    local.write_bytes(os.urandom(2 * MiB))
    put = subprocess.run([sys.executable, "-m", "tectofs.cli", "put", "-q", "--meta", c.address, str(local), "/put"],
                         capture_output=True, text=True, timeout=120)
    assert put.returncode == 0, put.stderr
    assert fs.read_bytes("/put") == local.read_bytes()
    status = subprocess.run([sys.executable, "-m", "tectofs.cli", "status", "--meta", c.address],
                            capture_output=True, text=True, timeout=60)
    assert re.search(r"blocks: \d+ healthy, [1-9]\d* under-redundant, 0 unreadable", status.stdout), status.stdout
    _dcp_save_and_load(c)


def _dcp_save_and_load(c: Any) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import tectofs.torch  # noqa: F401  (tectofs:// checkpoint ids)

    state = {"w": torch.randn(256, 1024), "b": torch.arange(1000)}
    ckpt = f"tectofs://{c.address}/ckpt/step_1"
    dcp.save(state, checkpoint_id=ckpt)
    back = {"w": torch.zeros(256, 1024), "b": torch.zeros(1000, dtype=torch.int64)}
    dcp.load(back, checkpoint_id=ckpt)
    assert torch.equal(back["w"], state["w"]) and torch.equal(back["b"], state["b"])


def test_below_the_write_minimum_is_a_clear_error(make_cluster: Callable[..., Any]) -> None:
    c = make_cluster()
    c.fs.write_bytes("/before", b"x" * 1000)
    _kill(c, 2)  # 4 live < 5
    started = time.monotonic()
    with pytest.raises(errors.NoSpace, match="needs at least 5 live chunk servers .* 4 are live"):
        c.fs.write_bytes("/after", os.urandom(MiB))
    assert time.monotonic() - started < 15
    assert not c.fs.exists("/after")
    with pytest.raises(errors.NoSpace):  # a failed overwrite with 2 of 6 down leaves the old bytes
        with c.fs.open("/before", "wb") as f:
            f.write(os.urandom(3 * MiB))
    assert c.fs.read_bytes("/before") == b"x" * 1000  # reads survive two losses


def test_a_hung_server_delays_a_save_by_seconds_not_forever(make_cluster: Callable[..., Any]) -> None:
    """rs(4,2) on exactly 6 servers: no spare to hedge to. A SIGSTOPped server's chunks are
    given up once 5 of 6 are durable and the straggler is hedge_slowdown_factor x slower than
    the median (at least hedge_after_min_s): each block costs about a second, never a timeout.
    Bound checked: under 10 s over the same save with every server answering."""
    import signal

    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import tectofs.torch  # noqa: F401

    c = make_cluster()
    state = {f"layer{i}": torch.randn(1024, 1024) for i in range(4)}  # 16 MiB
    started = time.monotonic()
    dcp.save(state, checkpoint_id=f"tectofs://{c.address}/healthy")
    healthy_s = time.monotonic() - started
    victim = c.chunk_processes[5]
    victim.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        dcp.save(state, checkpoint_id=f"tectofs://{c.address}/hung")
        hung_s = time.monotonic() - started
        back = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(back, checkpoint_id=f"tectofs://{c.address}/hung")
        assert all(torch.equal(back[k], state[k]) for k in state)
    finally:
        victim.send_signal(signal.SIGCONT)
    print(f"save with every server {healthy_s:.1f}s, with one SIGSTOPped {hung_s:.1f}s")
    assert hung_s < healthy_s + 10, (healthy_s, hung_s)


def test_a_write_held_open_past_the_allocation_grace_commits(make_cluster: Callable[..., Any]) -> None:
    """The writer's lease: a handle renews its allocations while it is open (here the grace
    is 2 s and the writer pauses 6 s between blocks); was: "block N was not allocated"."""
    c = make_cluster(allocation_grace_s=2.0)
    fs = c.fs
    first, second = os.urandom(2 * MiB), os.urandom(2 * MiB)
    with fs.open("/long-writer", "wb") as f:
        f.write(first)
        f.flush()
        time.sleep(6)  # three graces: the MDS expires what is not renewed every second
        f.write(second)
        time.sleep(3)
    assert fs.read_bytes("/long-writer") == first + second


@pytest.mark.parametrize("how", ["unlink", "replace"])
def test_an_open_reader_keeps_its_version(make_cluster: Callable[..., Any], how: str) -> None:
    """POSIX open-unlinked semantics: the reader's lease defers the collection of the version
    it opened (GC delay here 1 s; the reader goes on 4 s later) until it closes."""
    c = make_cluster()
    fs = c.fs
    data = os.urandom(5 * MiB + 77)
    fs.write_bytes("/read-me", data)
    with fs.open("/read-me", "rb") as f:
        assert f.read(MiB) == data[:MiB]
        if how == "unlink":
            fs.remove("/read-me")
        else:
            fs.write_bytes("/read-me", b"the new version")
        time.sleep(4)  # past the GC delay: the old chunks would be gone without the lease
        assert f.read() == data[MiB:]
        f.seek(0)
        assert f.read(10) == data[:10]
    if how == "replace":
        assert fs.read_bytes("/read-me") == b"the new version"


def test_write_minimum_is_set_per_directory(make_cluster: Callable[..., Any]) -> None:
    c = make_cluster()
    fs = c.fs
    fs.mkdir("/strict")
    st = fs.set_policy("/strict", write_min=6)  # rs(4,2): never accept a block with a chunk missing
    assert st.write_min == 6
    fs.mkdir("/strict/sub")
    assert fs.stat("/strict/sub").write_min == 6  # inherited, like the policy
    with pytest.raises(errors.InvalidArgument, match="between 4 .* and 6"):
        fs.set_policy("/strict", write_min=3)  # fewer than a read needs
    _kill(c, 1)
    with pytest.raises(errors.NoSpace, match="at least 6 live"):
        fs.write_bytes("/strict/sub/f", os.urandom(MiB))
    assert not fs.exists("/strict/sub/f")
    fs.write_bytes("/relaxed", os.urandom(MiB))  # the default directory still writes degraded
