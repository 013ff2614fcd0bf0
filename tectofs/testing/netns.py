"""Hosts on one machine: network namespaces (``ip netns``) joined by veth pairs to a bridge in a
namespace of its own, and tectofs processes started in them, for tests and benchmarks that need
real hosts whose links can be cut (``ip link set <port> down`` on the bridge: the host
vanishes, as a dead switch port, a kernel panic or a hung NIC look to its peers: no RST, no
FIN). One helper for every such layout: ``tests/test_multihost_netns.py`` (servers and a
client each in a namespace), ``tectofs check``'s client hosts (:mod:`tectofs.check.hosts`: the
cluster in the starting namespace, put on the bridge by :meth:`Network.attach_here`) and the
hedged-read tests and benchmark; each with a namespace prefix of its own.

Needs root, ``ip`` (iproute2) and a kernel that allows network namespaces, veth pairs and
bridges (:func:`why_not` says which is missing).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

STEP_TIMEOUT_S = 30  # every ip command, and the default wait of the callers' steps


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=STEP_TIMEOUT_S)


def why_not() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2 is not installed)"
    probe = f"tfsprobe{os.getpid()}"
    made = ip("netns", "add", probe)
    if made.returncode != 0:
        return f"'ip netns add' is not permitted here: {made.stderr.strip()}"
    try:
        bridge = ip("-n", probe, "link", "add", "br0", "type", "bridge")
        if bridge.returncode != 0:
            return f"no bridge in a network namespace: {bridge.stderr.strip()}"
        veth = ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        if veth.returncode != 0:
            return f"no veth pairs: {veth.stderr.strip()}"
    finally:
        ip("netns", "del", probe)
    return None


class Network:
    """Namespaces ``PREFIX-sw`` (the bridge) and one per node, each node with ``eth0`` on the
    bridge, its bridge port named in ``ports``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = f"{prefix}{os.getpid()}"
        self.namespaces: list[str] = []
        self.ports: dict[str, str] = {}  # node -> its port on the bridge (in PREFIX-sw)
        self.here = ""  # the starting namespace's interface on the bridge (attach_here)

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def _run(self, *args: str) -> None:
        done = ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def add_namespace(self, node: str) -> str:
        name = self.ns(node)
        self._run("netns", "add", name)
        self.namespaces.append(name)
        self._run("-n", name, "link", "set", "lo", "up")
        return name

    def build(self, nodes: dict[str, str]) -> None:
        """A namespace per node (name -> its address in a /24), all on one bridge."""
        switch = self.add_namespace("sw")
        self._run("-n", switch, "link", "add", "br0", "type", "bridge")
        self._run("-n", switch, "link", "set", "br0", "up")
        for i, (node, address) in enumerate(nodes.items()):
            name = self.add_namespace(node)
            port = self.ports[node] = f"p{i}"
            self._run("link", "add", "eth0", "netns", name, "type", "veth", "peer", "name", port, "netns", switch)
            self._run("-n", switch, "link", "set", port, "master", "br0")
            self._run("-n", switch, "link", "set", port, "up")
            self._run("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
            self._run("-n", name, "link", "set", "eth0", "up")

    def attach_here(self, address: str) -> str:
        """Put the starting namespace on the bridge too: a veth end named ``PREFIX`` here with
        ``address``/24 (its peer ``ph`` on the bridge), so that processes started here (a
        :class:`tectofs.server.cluster.LocalCluster`'s servers) bind it and every node reaches
        them. Call after :meth:`build`; :meth:`delete` removes it. Returns the interface's name."""
        switch = self.ns("sw")
        self._run("link", "add", self.prefix, "type", "veth", "peer", "name", "ph", "netns", switch)
        self.here = self.prefix
        self._run("-n", switch, "link", "set", "ph", "master", "br0")
        self._run("-n", switch, "link", "set", "ph", "up")
        self._run("addr", "add", f"{address}/24", "dev", self.prefix)
        self._run("link", "set", self.prefix, "up")
        return self.prefix

    def link(self, node: str, up: bool) -> None:
        """Cut (``up=False``) or restore ``node``'s link: its port on the bridge goes down or up."""
        self._run("-n", self.ns("sw"), "link", "set", self.ports[node], "up" if up else "down")

    def delete(self) -> None:
        if self.here:
            ip("link", "del", self.here)  # the pair goes with it
            self.here = ""
        for name in reversed(self.namespaces):
            ip("netns", "del", name)  # its interfaces go with it
        self.namespaces.clear()


class Processes:
    """Processes started in namespaces; all stopped (SIGTERM, then SIGKILL) by ``stop``.
    ``env``: their environment (e.g. a PYTHONPATH naming the tree to run)."""

    def __init__(self, logs: Path, cwd: str | Path, env: dict[str, str] | None = None) -> None:
        self.logs = logs
        self.cwd = cwd
        self.env = env
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, namespace: str, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``tectofs <args>`` in ``namespace``, its output in ``<logs>/<name>.log``."""
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                ["ip", "netns", "exec", namespace, sys.executable, "-m", "tectofs.cli", *args],
                stdout=log, stderr=subprocess.STDOUT, cwd=self.cwd, env=self.env, start_new_session=True)
        self.started.append(process)
        return process

    def run(self, namespace: str, *args: str, timeout_s: float = STEP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        """``python3 <args>`` in ``namespace``, waited for."""
        return subprocess.run(["ip", "netns", "exec", namespace, sys.executable, *args], capture_output=True,
                              text=True, cwd=self.cwd, env=self.env, timeout=timeout_s)

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
