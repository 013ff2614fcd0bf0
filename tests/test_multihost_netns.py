"""A real multi-host layout on one machine: the metadata service, three chunk servers and a
client, each in its own network namespace (``ip netns``), joined by veth pairs to a bridge
that lives in a namespace of its own, on addresses this test makes (10.77.0.0/24). Nothing
is reachable over the loopback: each namespace has its own, and the test proves the servers
are not on the client's. The servers bind their namespace address, or 0.0.0.0 with
``--advertise``; the client writes and reads a file through them, and ``status`` shows the
advertised addresses and metrics URLs (scraped from the client's namespace).

Needs root, ``ip`` (iproute2) and a kernel that allows network namespaces, veth pairs and
bridges; skipped, saying which, elsewhere. Namespace names carry the pid (parallel runs do not
clash); they are deleted, and every process this test started is stopped, even on failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Iterator

import pytest

from tectofs.server.cluster import wait_for_file
from tectofs.testing import netns
from tectofs.wire import auth

pytestmark = pytest.mark.slow  # starts processes (the fast lane is in-process: tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
SUBNET = "10.77.0"
META = f"{SUBNET}.1"
CHUNKS = [f"{SUBNET}.11", f"{SUBNET}.12", f"{SUBNET}.13"]
CLIENT = f"{SUBNET}.100"
STEP_TIMEOUT_S = netns.STEP_TIMEOUT_S  # every wait below: a process start, a command, a client script


# The layout's helper (tectofs.testing.netns); these names stay importable from here
# (tests/test_hedged_reads.py imports them).
_ip = netns.ip
_why_not = netns.why_not


class Network(netns.Network):
    """Namespaces ``tfsPID-sw`` (the bridge) and one per node, each node with ``eth0`` on the bridge."""

    def __init__(self) -> None:
        super().__init__("tfs")


class Processes(netns.Processes):
    """Processes started in namespaces (``tectofs`` of this tree); all stopped by ``stop``."""

    def __init__(self, logs: Path) -> None:
        super().__init__(logs, cwd=REPO)


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    reason = _why_not()
    if reason is not None:
        pytest.skip(f"multi-host test needs network namespaces: {reason}")
    root = tmp_path_factory.mktemp("netns")
    key_file = str(root / "cluster.key")
    auth.create_key_file(key_file)
    meta_address = f"{META}:7420"
    credentials = str(root / "root.credentials")
    auth.Credential.root_from_keys(auth.KeyRing(key_file), meta_address).save(credentials)

    net = Network()
    processes = Processes(root)
    try:
        net.build({"meta": META, **{f"c{i}": a for i, a in enumerate(CHUNKS)}, "client": CLIENT})
        # The metadata service listens everywhere in its namespace and advertises its address.
        meta = processes.start(
            net.ns("meta"), "meta", "meta", "--store", str(root / "meta.db"), "--host", "0.0.0.0", "--port", "7420",
            "--advertise", meta_address, "--policy", "rs(2,1)", "--block-size", "1M", "--key-file", key_file,
            "--metrics", "0.0.0.0:9100", "--ready-file", str(root / "meta.address"))
        assert wait_for_file(str(root / "meta.address"), STEP_TIMEOUT_S, meta) == meta_address
        # Chunk servers: bound to their namespace address; to 0.0.0.0 advertising host:port;
        # to 0.0.0.0 on a free port advertising the host only.
        how = [["--host", CHUNKS[0], "--port", "7421", "--metrics", f"{CHUNKS[0]}:9101"],
               ["--host", "0.0.0.0", "--port", "7421", "--advertise", f"{CHUNKS[1]}:7421", "--metrics", "0.0.0.0:9101"],
               ["--host", "0.0.0.0", "--port", "0", "--advertise", CHUNKS[2], "--metrics", "0.0.0.0:0"]]
        chunks = []
        for i, flags in enumerate(how):
            chunks.append(processes.start(
                net.ns(f"c{i}"), f"chunk-{i}", "chunk", "--data", str(root / f"chunk-{i}"), "--meta", meta_address,
                "--key-file", key_file, "--ready-file", str(root / f"chunk-{i}.address"), *flags))
        advertised = [wait_for_file(str(root / f"chunk-{i}.address"), STEP_TIMEOUT_S, p) for i, p in enumerate(chunks)]
        yield {"root": root, "net": net, "meta": meta_address, "credentials": credentials, "chunks": advertised,
               "processes": processes}
    except BaseException:
        for name in ["meta", "chunk-0", "chunk-1", "chunk-2"]:
            print(f"--- {name}.log\n{processes.log(name)}")
        raise
    finally:
        processes.stop()
        net.delete()


CLIENT_SCRIPT = textwrap.dedent("""
    import hashlib, json, socket, sys, time, urllib.request
    from tectofs.wire import messages
    from tectofs.client import connect

    meta, credentials, source = sys.argv[1:4]
    data = open(source, "rb").read()
    out = {}
    with connect(meta, credentials=credentials) as fs:
        deadline = time.monotonic() + 15
        while sum(s.live for s in fs.servers()) < 3:
            assert time.monotonic() < deadline, fs.servers()
            time.sleep(0.2)
        fs.mkdir("/multihost", exist_ok=True)
        fs.write_bytes("/multihost/data.bin", data)
        out["read_sha256"] = hashlib.sha256(fs.read_bytes("/multihost/data.bin")).hexdigest()
        layout = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path="/multihost/data.bin")))
        out["chunk_addresses"] = sorted({c.address for b in layout.blocks for c in b.chunks})
        out["servers"] = messages.to_plain(fs.servers())
        stats = fs.run(fs.aio.metadata.stats())
        out["meta_address"], out["meta_metrics_url"] = stats.address, stats.metrics_url
    out["scraped"] = {}
    for url in [out["meta_metrics_url"]] + [s["metrics_url"] for s in out["servers"]]:
        with urllib.request.urlopen(url, timeout=10) as response:
            out["scraped"][url] = b"tectofs_" in response.read()
    out["loopback"] = {}
    for address in [meta] + [s["address"] for s in out["servers"]]:
        port = int(address.rsplit(":", 1)[1])
        try:
            socket.create_connection(("127.0.0.1", port), timeout=3).close()
            out["loopback"][address] = "connected"
        except OSError as exc:
            out["loopback"][address] = type(exc).__name__
    print(json.dumps(out))
""")


def _in_client(layout: dict[str, object], *args: str) -> subprocess.CompletedProcess[str]:
    net = layout["net"]
    assert isinstance(net, Network)
    return subprocess.run(["ip", "netns", "exec", net.ns("client"), sys.executable, *args], capture_output=True,
                          text=True, cwd=REPO, timeout=STEP_TIMEOUT_S * 2)


def test_write_and_read_across_namespaces(layout: dict[str, object]) -> None:
    root = layout["root"]
    assert isinstance(root, Path)
    data = os.urandom(3 * (1 << 20) + 12345)  # four 1 MiB blocks, the last partial, rs(2,1) across three hosts
    (root / "source.bin").write_bytes(data)
    done = _in_client(layout, "-c", CLIENT_SCRIPT, str(layout["meta"]), str(layout["credentials"]),
                      str(root / "source.bin"))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])

    import hashlib

    assert out["read_sha256"] == hashlib.sha256(data).hexdigest()  # bit-exact through three namespaces
    chunks = layout["chunks"]
    assert isinstance(chunks, list)
    assert chunks[0] == f"{CHUNKS[0]}:7421" and chunks[1] == f"{CHUNKS[1]}:7421"
    assert chunks[2].startswith(f"{CHUNKS[2]}:") and not chunks[2].endswith(":0")
    servers = out["servers"]
    assert sorted(s["address"] for s in servers) == sorted(chunks)  # the advertised addresses, no wildcard
    assert set(out["chunk_addresses"]) <= set(chunks) and len(out["chunk_addresses"]) == 3
    urls = sorted(s["metrics_url"] for s in servers)
    assert urls[0] == f"http://{CHUNKS[0]}:9101/metrics" and urls[1] == f"http://{CHUNKS[1]}:9101/metrics"
    assert urls[2].startswith(f"http://{CHUNKS[2]}:") and not urls[2].startswith(f"http://{CHUNKS[2]}:0/")
    assert out["meta_address"] == layout["meta"]
    assert out["meta_metrics_url"] == f"http://{META}:9100/metrics"
    assert all(out["scraped"].values()) and len(out["scraped"]) == 4  # each URL answers from the client's host
    # The loopback is not the way: none of the servers is there in the client's namespace.
    assert out["loopback"] and set(out["loopback"].values()) == {"ConnectionRefusedError"}, out["loopback"]


def test_status_shows_advertised_addresses(layout: dict[str, object]) -> None:
    done = _in_client(layout, "-m", "tectofs.cli", "status", "--meta", str(layout["meta"]),
                      "--credentials", str(layout["credentials"]))
    assert done.returncode == 0, done.stderr[-3000:]
    chunks = layout["chunks"]
    assert isinstance(chunks, list)
    for address in chunks:
        assert address in done.stdout
    assert "0.0.0.0" not in done.stdout and "127.0.0.1" not in done.stdout
