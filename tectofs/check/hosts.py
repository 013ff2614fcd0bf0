"""Client hosts: each a :mod:`tectofs.check.worker` process, in a network namespace of its
own when namespaces can be made (root, ``ip``, veth and bridges allowed), so no two hosts
share a Unix socket, a connection or a mount's caches.

Layout (:mod:`tectofs.testing.netns`): a namespace per host ``hK`` (``tfcPID-hK``, ``eth0`` =
``10.NN.0.(10+K)``) and the bridge's namespace ``tfcPID-sw``; the starting namespace is on the
bridge too (``10.NN.0.1``), so that the cluster's servers, started there, bind that address.
:meth:`Network.cut` takes a host's port on the bridge down (its calls wait or fail: no RST, no
FIN) and :meth:`Network.restore` brings it back. Without namespaces every host is a plain
process on 127.0.0.1 (:func:`why_no_namespaces` says why).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from typing import Any

from tectofs.testing import netns

STEP_TIMEOUT_S = netns.STEP_TIMEOUT_S
why_no_namespaces = netns.why_not


class Network:
    """The client hosts' namespaces on one bridge, with the starting namespace on it as
    :attr:`server_address`; :meth:`delete` removes them all."""

    def __init__(self, hosts: int) -> None:
        self.net = netns.Network("tfc")
        self.subnet = f"10.{180 + os.getpid() % 60}.0"
        self.server_address = f"{self.subnet}.1"
        self.hosts = [f"h{k}" for k in range(hosts)]

    def namespace(self, host: str) -> str:
        return self.net.ns(host)

    def build(self) -> None:
        self.net.build({host: f"{self.subnet}.{10 + k}" for k, host in enumerate(self.hosts)})
        self.net.attach_here(self.server_address)

    def cut(self, host: str) -> None:
        self.net.link(host, up=False)

    def restore(self, host: str) -> None:
        self.net.link(host, up=True)

    def delete(self) -> None:
        self.net.delete()


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
