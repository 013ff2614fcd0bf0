"""Client hosts: each a :mod:`tectofs.check.worker` process, in a network namespace of its
own when namespaces can be made (root, ``ip``, veth and bridges allowed), so no two hosts
share a Unix socket, a connection or a mount's caches.

Layout (as ``tests/test_multihost_netns.py``, with the bridge in the starting namespace so
that the cluster's servers, started there, bind the bridge's address): a bridge
``tfcPID`` with ``10.NN.0.1/24`` and, per host ``hK``, a namespace ``tfcPID-hK`` whose
``eth0`` (``10.NN.0.(10+K)``) is a veth pair's end on the bridge. :meth:`Network.cut` takes a
host's link down (its calls wait or fail) and :meth:`Network.restore` brings it back.
Without namespaces every host is a plain process on 127.0.0.1 (:func:`why_no_namespaces`
says why).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from typing import Any

STEP_TIMEOUT_S = 30.0


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=STEP_TIMEOUT_S)


def why_no_namespaces() -> str | None:
    """Why network namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "no 'ip' command (iproute2 is not installed)"
    probe = f"tfcprobe{os.getpid()}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"'ip netns add' is not permitted here: {made.stderr.strip()}"
    try:
        veth = _ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "a1")
        if veth.returncode != 0:
            return f"no veth pairs: {veth.stderr.strip()}"
        bridge = _ip("-n", probe, "link", "add", "br0", "type", "bridge")
        if bridge.returncode != 0:
            return f"no bridges: {bridge.stderr.strip()}"
    finally:
        _ip("netns", "del", probe)
    return None


class Network:
    """The bridge and one namespace per host; :meth:`delete` removes them all."""

    def __init__(self, hosts: int) -> None:
        self.prefix = f"tfc{os.getpid()}"
        self.subnet = f"10.{180 + os.getpid() % 60}.0"
        self.server_address = f"{self.subnet}.1"
        self.hosts = [f"h{k}" for k in range(hosts)]
        self.namespaces: list[str] = []
        self.bridge = ""

    def namespace(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def _run(self, *args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def build(self) -> None:
        self.bridge = self.prefix
        self._run("link", "add", self.bridge, "type", "bridge")
        self._run("addr", "add", f"{self.server_address}/24", "dev", self.bridge)
        self._run("link", "set", self.bridge, "up")
        for k, host in enumerate(self.hosts):
            name = self.namespace(host)
            self._run("netns", "add", name)
            self.namespaces.append(name)
            self._run("-n", name, "link", "set", "lo", "up")
            port = f"{self.prefix}p{k}"
            self._run("link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", name)
            self._run("link", "set", port, "master", self.bridge)
            self._run("link", "set", port, "up")
            self._run("-n", name, "addr", "add", f"{self.subnet}.{10 + k}/24", "dev", "eth0")
            self._run("-n", name, "link", "set", "eth0", "up")

    def cut(self, host: str) -> None:
        self._run("-n", self.namespace(host), "link", "set", "eth0", "down")

    def restore(self, host: str) -> None:
        self._run("-n", self.namespace(host), "link", "set", "eth0", "up")

    def delete(self) -> None:
        for name in reversed(self.namespaces):
            _ip("netns", "del", name)  # its veth end, and so the pair, go with it
        self.namespaces.clear()
        if self.bridge:
            _ip("link", "del", self.bridge)
            self.bridge = ""


class Host:
    """One worker process (in ``namespace`` if given); :meth:`ask` sends a command and waits
    for its answer, :meth:`send` returns a queue the answer arrives on (commands run at once)."""

    def __init__(self, name: str, namespace: str | None, log_path: str, env: dict[str, str] | None = None) -> None:
        self.name = name
        command = [sys.executable, "-m", "tectofs.check.worker"]
        if namespace is not None:
            command = ["ip", "netns", "exec", namespace, *command]
        self.log = open(log_path, "ab")
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        env=env, start_new_session=True)
        self._waiting: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._next = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            answer = json.loads(line)
            with self._lock:
                waiting = self._waiting.pop(int(answer.get("id") or 0), None)
            if waiting is not None:
                waiting.put(answer)
        with self._lock:  # the worker is gone: every question gets an answer
            for waiting in self._waiting.values():
                waiting.put({"error": f"host {self.name}: its worker exited ({self.process.poll()})"})
            self._waiting.clear()

    def send(self, command: str, **fields: Any) -> queue.Queue[dict[str, Any]]:
        answer: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._next += 1
            self._waiting[self._next] = answer
            message = {"cmd": command, "id": self._next, **fields}
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except OSError as exc:
            answer.put({"error": f"host {self.name}: {exc}"})
        return answer

    def ask(self, command: str, timeout_s: float = STEP_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        try:
            answer = self.send(command, **fields).get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"host {self.name}: no answer to {command} within {timeout_s:.0f}s") from None
        if "error" in answer:
            raise RuntimeError(f"host {self.name}: {command}: {answer['error']}")
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.ask("quit", timeout_s=20)
            except RuntimeError:
                pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.log.close()
