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
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Iterator

import pytest

from tectofs.server.cluster import wait_for_file
from tectofs.wire import auth

pytestmark = pytest.mark.slow  # starts processes (the fast lane is in-process: tests/conftest.py)

REPO = Path(__file__).resolve().parent.parent
SUBNET = "10.77.0"
META = f"{SUBNET}.1"
CHUNKS = [f"{SUBNET}.11", f"{SUBNET}.12", f"{SUBNET}.13"]
CLIENT = f"{SUBNET}.100"
STEP_TIMEOUT_S = 30  # every wait below: a process start, a command, a client script


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=STEP_TIMEOUT_S)


def _why_not() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2 is not installed)"
    probe = f"tfsprobe{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"'ip netns add' is not permitted here: {made.stderr.strip()}"
    try:
        bridge = _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        if bridge.returncode != 0:
            return f"no bridge in a network namespace: {bridge.stderr.strip()}"
        veth = _ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        if veth.returncode != 0:
            return f"no veth pairs: {veth.stderr.strip()}"
    finally:
        _ip("netns", "del", probe)
    return None


class Network:
    """Namespaces ``PREFIX-sw`` (the bridge) and one per node, each node with ``eth0`` on the bridge."""

    def __init__(self) -> None:
        self.prefix = f"tfs{os.getpid()}"
        self.namespaces: list[str] = []

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def _run(self, *args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def add_namespace(self, node: str) -> str:
        name = self.ns(node)
        self._run("netns", "add", name)
        self.namespaces.append(name)
        self._run("-n", name, "link", "set", "lo", "up")
        return name

    def build(self, nodes: dict[str, str]) -> None:
        switch = self.add_namespace("sw")
        self._run("-n", switch, "link", "add", "br0", "type", "bridge")
        self._run("-n", switch, "link", "set", "br0", "up")
        for i, (node, address) in enumerate(nodes.items()):
            name = self.add_namespace(node)
            port = f"p{i}"
            self._run("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", switch)
            self._run("-n", switch, "link", "set", port, "master", "br0")
            self._run("-n", switch, "link", "set", port, "up")
            self._run("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            self._run("-n", name, "link", "set", "eth0", "up")

    def delete(self) -> None:
        for name in reversed(self.namespaces):
            _ip("netns", "del", name)  # its interfaces go with it
        self.namespaces.clear()


class Processes:
    """Processes started in namespaces; all stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, namespace: str, name: str, *args: str) -> subprocess.Popen[bytes]:
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", namespace, sys.executable, "-m", "tectofs.cli", *args],
                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        self.started.append(process)
        return process

    def stop(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # ip netns exec exec()s: this is the tectofs process
        deadline = time.monotonic() + 10
        for process in self.started:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=5)

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""


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
        while sum(s["live"] for s in fs.servers()) < 3:
            assert time.monotonic() < deadline, fs.servers()
            time.sleep(0.2)
        fs.mkdir("/multihost", exist_ok=True)
        fs.write_bytes("/multihost/data.bin", data)
        out["read_sha256"] = hashlib.sha256(fs.read_bytes("/multihost/data.bin")).hexdigest()
        layout = fs.run(fs.aio.metadata.layout(messages.LayoutRequest(path="/multihost/data.bin")))
        out["chunk_addresses"] = sorted({c.address for b in layout.blocks for c in b.chunks})
        out["servers"] = fs.servers()
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
