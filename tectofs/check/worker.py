"""The process that runs one host's clients: ``python -m tectofs.check.worker`` (started by
:mod:`.hosts`, inside the host's network namespace when there is one, so its mounts and
connections are the host's own).

It reads one JSON command a line on stdin and answers one JSON line on stdout:

- ``{"cmd": "setup", "meta": ADDR, "credentials": FILE, "clients": [{"id", "kind"}...],
  "mount_root": DIR, "s3": {"endpoint", "access", "secret"}}``: make the clients (a mount
  each for kind ``mount``, under ``mount_root``); answers ``{"ok": true}``.
- ``{"cmd": "run", "base": PATH, "seed": N, "calls": K, "start": T, "timeout_s": S}``: at
  time ``T`` every client starts its ``K`` calls (:func:`tectofs.check.plan.draw_calls`) on the
  subtree ``PATH``, one after another, each recorded; answers ``{"history": JSON}`` with the
  host's clients and operations (a call still running after ``S`` seconds: never completed).
- ``{"cmd": "kill_mount", "client": ID}``: SIGKILL that client's mount (answers
  ``{"killed_at": T}``); ``{"cmd": "start_mount", "client": ID}``: mount it again (a join).
- ``{"cmd": "quit"}``: unmount, close and exit.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from tectofs.check import drivers, plan
from tectofs.testing.history import UNKNOWN_ERRNOS, History, Value

log = logging.getLogger(__name__)
MOUNT_DURABILITY_WINDOW_S = 0.05  # a mount with async creates (tectofs.testing.history.Client)


class Worker:
    def __init__(self) -> None:
        self.drivers: dict[str, drivers.Driver] = {}
        self.kinds: dict[str, str] = {}
        self.mounts: dict[str, Any] = {}
        self.busy: set[str] = set()  # clients whose last call never returned
        self.crashed_at: dict[str, float] = {}  # history client name -> when its mount was killed
        self.incarnations: dict[str, int] = {}
        self.lock = threading.Lock()
        self.setup_args: dict[str, Any] = {}

    def setup(self, message: dict[str, Any]) -> dict[str, Any]:
        self.setup_args = message
        for client in message["clients"]:
            self.kinds[client["id"]] = client["kind"]
            self._make(client["id"])
        return {"ok": True}

    def _make(self, client_id: str) -> None:
        kind = self.kinds[client_id]
        meta, credentials = self.setup_args["meta"], self.setup_args["credentials"]
        if kind == "mount":
            from tectofs.client.fuse import start_mount_process

            mountpoint = os.path.join(self.setup_args["mount_root"], client_id)
            self.mounts[client_id] = start_mount_process(
                meta, mountpoint, credentials=credentials, log_path=mountpoint + ".log", timeout_s=30)
            self.drivers[client_id] = drivers.MountDriver(mountpoint)
        elif kind == "library":
            from tectofs.client import connect

            self.drivers[client_id] = drivers.LibraryDriver(connect(meta, credentials=credentials))
        elif kind == "fsspec":
            self.drivers[client_id] = drivers.FsspecDriver(meta)
        else:
            s3 = self.setup_args["s3"]
            self.drivers[client_id] = drivers.S3Driver(s3["endpoint"], s3["access"], s3["secret"])

    def name(self, client_id: str) -> str:
        """The history's name for the client: a mount mounted again is a new client (``c1+1``)."""
        count = self.incarnations.get(client_id, 0)
        return client_id if count == 0 else f"{client_id}+{count}"

    def kill_mount(self, client_id: str) -> dict[str, Any]:
        with self.lock:
            mount = self.mounts.pop(client_id)
            killed_at = time.time()
            self.crashed_at[self.name(client_id)] = killed_at
        os.kill(mount.pid, signal.SIGKILL)
        mount.process.wait(timeout=10)
        subprocess.run(["fusermount3", "-u", "-z", mount.mountpoint], capture_output=True, timeout=10)
        return {"killed_at": killed_at}

    def start_mount(self, client_id: str) -> dict[str, Any]:
        """Mount a killed client's mountpoint again: a client joining (while others write)."""
        if client_id in self.mounts:
            return {"ok": True}
        with self.lock:
            self.incarnations[client_id] = self.incarnations.get(client_id, 0) + 1
        self._make(client_id)
        self.busy.discard(client_id)
        return {"ok": True}

    def pause_mount(self, client_id: str) -> dict[str, Any]:
        """SIGSTOP the client's mount (``resume_mount``: SIGCONT): its leases expire meanwhile."""
        os.kill(self.mounts[client_id].pid, signal.SIGSTOP)
        return {"ok": True}

    def resume_mount(self, client_id: str) -> dict[str, Any]:
        os.kill(self.mounts[client_id].pid, signal.SIGCONT)
        return {"ok": True}

    def run(self, message: dict[str, Any]) -> dict[str, Any]:
        history = History()
        base = str(message["base"])
        pending: dict[str, tuple[float, str, dict[str, Any]]] = {}
        deadline = time.monotonic() + float(message["timeout_s"])
        threads = []
        for client_id in list(self.busy):  # a call never returned: a new client takes its place
            if self.kinds[client_id] != "mount":
                with self.lock:
                    self.incarnations[client_id] = self.incarnations.get(client_id, 0) + 1
                self._make(client_id)
                self.busy.discard(client_id)
        for client_id, driver in self.drivers.items():
            if client_id in self.busy:
                continue
            thread = threading.Thread(target=self._client, args=(
                history, client_id, driver, base, message, pending, deadline), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            for name, (invoke, kind, args) in pending.items():
                self.busy.add(name.split("+")[0])
                history.add(name, kind, invoke, None, **args)
            for name, killed_at in self.crashed_at.items():
                if name in history.clients:
                    history.crash(name, killed_at)
            answer = history.to_json()
        return {"history": answer}

    def _client(self, history: History, client_id: str, driver: drivers.Driver, base: str, message: dict[str, Any],
                pending: dict[str, tuple[float, str, dict[str, Any]]], deadline: float) -> None:
        kind_of_client = self.kinds[client_id]
        mount = kind_of_client == "mount"
        time.sleep(max(0.0, float(message["start"]) - time.time()))
        while mount and client_id not in self.mounts:  # killed: it joins when it is mounted again
            if time.monotonic() > deadline - 1:
                return
            time.sleep(0.05)
        with self.lock:
            name = self.name(client_id)
            driver = self.drivers[client_id]
            rules = {"durability_window_s": MOUNT_DURABILITY_WINDOW_S} if mount else {}
            history.client(name, kind_of_client, self.setup_args.get("host", "h0"), **rules)
        driver.base = driver.prefix + base
        leave_out = frozenset(message.get("leave_out", ()))
        for kind, args in plan.draw_calls(int(message["seed"]), kind_of_client, name, int(message["calls"]), leave_out):
            invoke = time.time()
            with self.lock:
                pending[name] = (invoke, kind, args)
            value: Value = None
            error: str | None = None
            complete: float | None
            driver.opened = None
            try:
                value = driver.call(kind, args)
                complete = time.time()
            except Exception as exc:  # noqa: BLE001 - the answer is recorded, whatever it was
                number = drivers.errno_of(exc)
                complete = None if number is None or number in UNKNOWN_ERRNOS else time.time()
                if complete is not None:
                    error = errno.errorcode.get(number or 0, f"E{number}")
                else:
                    log.info("%s %s%r: %r (recorded as unknown)", name, kind, args, exc)
            with self.lock:
                del pending[name]
                opened = driver.opened
                if kind == "append" and opened is not None and complete is not None and error is None:
                    # An append's handle publishes, at close, the whole file as it saw it at open
                    # with the data after it (close-to-open: an append another client published
                    # meanwhile is replaced): recorded as a read of what it saw (at its open) and
                    # a write of the whole file, both within the call.
                    seen, read_at = opened
                    history.add(name, "read", invoke, read_at, seen, None, path=args["path"])
                    history.add(name, "write", invoke, complete, None, None, path=args["path"],
                                data=seen + bytes(args["data"]))  # type: ignore[arg-type]
                else:
                    history.add(name, kind, invoke, complete, value, error, **args)

    def quit(self) -> None:
        for client_id, mount in list(self.mounts.items()):
            try:
                mount.stop()
            except Exception:  # noqa: BLE001 - stop the others all the same
                log.exception("stopping the mount of %s", client_id)
        for client_id, driver in self.drivers.items():
            if not isinstance(driver, drivers.MountDriver) and client_id not in self.busy:
                try:
                    driver.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing %s", client_id)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="worker %(message)s")
    worker = Worker()
    write_lock = threading.Lock()

    def answer(message: dict[str, Any]) -> None:
        command = message["cmd"]
        try:
            if command == "quit":
                worker.quit()
                reply: dict[str, Any] = {"ok": True}
            elif command in ("setup", "run"):
                reply = getattr(worker, command)(message)
            else:
                reply = getattr(worker, command)(message["client"])
        except Exception as exc:  # noqa: BLE001 - the runner decides what a failed command means
            log.exception("command %s", command)
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        reply["id"] = message.get("id")
        with write_lock:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()

    for line in sys.stdin:  # each command on its own thread: a mount joins while a history runs
        message = json.loads(line)
        if message["cmd"] == "quit":
            answer(message)
            break
        threading.Thread(target=answer, args=(message,), daemon=True).start()
    os._exit(0)  # threads stuck in a dead service's call do not hold the exit


if __name__ == "__main__":
    main()
