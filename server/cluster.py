"""A whole cluster on one machine: one metadata service and N chunk servers, each a real
process, all state under one root directory. Used by ``tectofs up``, the tests and the
benchmarks."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time
from typing import Any

from tectofs import children, limits, private_files
from tectofs.errors import InvalidArgument, TectofsError, Timeout
from tectofs.server import addresses
from tectofs.wire import auth, messages


def _python_command(*args: str) -> list[str]:
    return children.cli_command(*args)


def _exit_reason(process: subprocess.Popen[bytes]) -> str:
    """``what exited with code N: the last line it logged (log: PATH)``."""
    args = [str(a) for a in process.args]  # type: ignore[union-attr]
    role = args[args.index("tectofs.cli") + 1] if "tectofs.cli" in args[:-1] else None
    what = _ROLES.get(role, role) if role else "a child process"
    log_path = getattr(process, "log_path", None)
    last = ""
    if log_path:
        try:
            with open(log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(log_path) - 4096))
                lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
            last = lines[-1] if lines else ""
        except OSError:
            pass
    return (f"{what} exited with code {process.returncode}" + (f": {last}" if last else "")
            + (f" (log: {log_path})" if log_path else ""))


_ROLES = {"meta": "the metadata service", "chunk": "a chunk server", "s3": "the S3 gateway"}


def wait_for_file(path: str, timeout_s: float, process: subprocess.Popen[bytes] | None = None) -> str:
    """Wait until ``path`` exists and is non-empty; return its content. A ``process`` that
    exits first raises ``TectofsError`` with the last line it logged (its reason, e.g. a port
    in use) and where its log is."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise TectofsError(_exit_reason(process))
        try:
            with open(path) as f:
                content = f.read().strip()
            if content:
                return content
        except FileNotFoundError:
            pass
        time.sleep(0.05)
    raise Timeout(f"{path} did not appear within {timeout_s:.0f}s")


class LocalCluster:
    """Start, inspect, kill and stop a local cluster. Usable as a context manager."""

    def __init__(
        self,
        root: str,
        servers: int = 6,
        port: int = 0,
        policy: str = "rs(4,2)",
        block_size: int = limits.block_size_default_bytes,
        host: str = "127.0.0.1",
        server_dead_after_s: float = limits.server_dead_after_s,
        heartbeat_interval_s: float = limits.heartbeat_interval_s,
        gc_delay_s: float = 30.0,
        allocation_grace_s: float = limits.allocation_grace_s,
        sync: bool | str = True,
        chunk_inflight_bytes_max: int = limits.chunk_inflight_bytes_max,
        log_to_files: bool = True,
        store: str | None = None,
        extra_env: dict[str, str] | None = None,
        meta_args: list[str] | None = None,
        chunk_args: list[str] | None = None,
        tls: bool = False,
        s3_port: int | None = None,
        metrics: bool = False,
        advertise: str | None = None,
    ) -> None:
        """``tls``: every connection uses TLS, with a throwaway CA and certificate made under
        ``root/tls`` (``tls_files``); this process's clients trust it too (``$TECTOFS_TLS_CA``).
        ``s3_port``: also run the S3 gateway there (0: any port; ``s3_address``), with root's
        S3 keys in ``s3_env_file`` (mode 0600). ``metrics``: the metadata service and every chunk
        server serve Prometheus metrics on a free port of ``host``; ``metrics_urls`` maps each
        ("meta", "chunk-0", ...) to its ``http://HOST:PORT/metrics`` (kept up to date across restarts).
        ``advertise``: the host every server gives out (``--advertise``, each with its own port);
        required when ``host`` is a wildcard (``server/addresses.py``)."""
        if addresses.is_wildcard(host) and not advertise:
            raise InvalidArgument(f"--host {host or '*'} listens on every address, which no client can connect to:"
                                  " add --advertise HOST, the address other hosts reach this machine at")
        self.advertise = advertise
        self.root = os.path.abspath(root)
        self.server_count = servers
        self.port = port
        self.policy = policy
        self.block_size = block_size
        self.host = host
        self.server_dead_after_s = server_dead_after_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.gc_delay_s = gc_delay_s
        self.allocation_grace_s = allocation_grace_s
        self.sync = sync
        self.chunk_inflight_bytes_max = chunk_inflight_bytes_max
        self.log_to_files = log_to_files
        self.store = store or os.path.join(self.root, "meta.db")
        self.env = children.cli_env({**os.environ, **(extra_env or {})})
        self.meta_args = list(meta_args or [])  # further flags for every `tectofs meta` (e.g. --repair-after)
        self.chunk_args = list(chunk_args or [])  # ... and every `tectofs chunk` (e.g. --scrub-rate)
        self.tls_files: dict[str, str] = {}
        if tls:
            from tectofs.wire import tls as tls_setup

            self.tls_files = tls_setup.make_test_certificates(os.path.join(self.root, "tls"))
            self.env.update({tls_setup.CERT_ENV: self.tls_files["cert"], tls_setup.KEY_ENV: self.tls_files["key"],
                             tls_setup.CA_ENV: self.tls_files["ca"]})
            # This process's clients (wait_live, tests) talk TLS to it, until stop() puts it back.
            self._ca_env_before = os.environ.get(tls_setup.CA_ENV)
            os.environ[tls_setup.CA_ENV] = self.tls_files["ca"]
        self.key_file = os.path.join(self.root, "cluster.key")  # made at the first start (tectofs.wire.auth)
        self.credential_file = os.path.join(self.root, "root.credentials")  # root's, for this cluster
        self.meta_process: subprocess.Popen[bytes] | None = None
        self.s3_port = s3_port
        self.s3_process: subprocess.Popen[bytes] | None = None
        self.s3_address = ""
        self.s3_env_file = os.path.join(self.root, "credentials", "s3.env")
        self.chunk_processes: list[subprocess.Popen[bytes] | None] = []
        self.address = ""
        self.metrics = metrics
        self.metrics_urls: dict[str, str] = {}
        # child name -> (restarts so far, time of the next try or 0, time of the last restart)
        self._restarts: dict[str, tuple[int, float, float]] = {}

    @property
    def chunk_data_dirs(self) -> list[str]:
        return [os.path.join(self.root, f"chunk-{i}") for i in range(self.server_count)]

    def _spawn(self, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        logs = os.path.join(self.root, "logs")
        os.makedirs(logs, mode=private_files.DIRECTORY_MODE, exist_ok=True)
        private_files.owner_only(logs, private_files.DIRECTORY_MODE)  # (the logs name users' files)
        log_path = os.path.join(logs, log_name)
        if self.log_to_files:
            out: Any = open(log_path, "ab")
        else:
            out = None
        try:
            process = subprocess.Popen(_python_command(*args), stdout=out, stderr=subprocess.STDOUT if out else None,
                                       env=self.env, start_new_session=True)
            process.log_path = log_path if out is not None else None  # type: ignore[attr-defined]  # for _exit_reason
            return process
        finally:
            if out is not None:
                out.close()

    def start(self, timeout_s: float = 60.0) -> str:
        """Start every process; the cluster key is made under the root the first time, and
        root's credential is written to ``credential_file`` and where this user's client
        commands look for it (``tectofs.wire.auth.default_credential_path``)."""
        os.makedirs(self.root, exist_ok=True)
        auth.create_key_file(self.key_file)
        self.address = self._start_meta(self.port, timeout_s)
        credential = auth.Credential.root_from_keys(auth.KeyRing(self.key_file), self.address)
        credential.save(self.credential_file)
        credential.save(auth.default_credential_path(self.address))
        self.chunk_processes = [self._start_chunk(i) for i in range(self.server_count)]
        self.wait_live(self.server_count, timeout_s)
        for i, process in enumerate(self.chunk_processes):
            self._read_metrics(f"chunk-{i}", process, timeout_s)
        if self.s3_port is not None:
            self._start_s3(self.s3_port, timeout_s)
        return self.address

    def _advertise_args(self) -> list[str]:
        return ["--advertise", self.advertise] if self.advertise else []

    def _metrics_args(self, name: str) -> list[str]:
        """Flags for child ``name`` to serve metrics on a free port and say which (``_read_metrics``)."""
        if not self.metrics:
            return []
        ready = os.path.join(self.root, f"{name}.metrics-address")
        if os.path.exists(ready):
            os.unlink(ready)
        return ["--metrics", f"{self.host}:0", "--metrics-ready-file", ready]

    def _read_metrics(self, name: str, process: subprocess.Popen[bytes] | None, timeout_s: float) -> None:
        if self.metrics:
            address = wait_for_file(os.path.join(self.root, f"{name}.metrics-address"), timeout_s, process)
            self.metrics_urls[name] = addresses.metrics_url(address, self.advertise)

    def _start_s3(self, port: int, timeout_s: float) -> None:
        """Start the S3 gateway (serving every user) and write root's S3 keys to ``s3_env_file``."""
        from tectofs.s3_env import write_env_file

        ready = os.path.join(self.root, "s3.address")
        if os.path.exists(ready):
            os.unlink(ready)
        self.s3_process = self._spawn(
            ["s3", "--meta", self.address, "--listen", f"{self.host}:{port}", "--key-file", self.key_file,
             "--ready-file", ready], "s3.log")
        self.s3_address = wait_for_file(ready, timeout_s, self.s3_process)
        write_env_file(self.s3_env_file, auth.Credential.root_from_keys(auth.KeyRing(self.key_file), self.address))

    def _forget_credential(self) -> None:
        """Remove root's credential from the user's configuration, if it is still this cluster's."""
        path = auth.default_credential_path(self.address) if self.address else ""
        try:
            if path and auth.Credential.load(path).secret == auth.Credential.load(self.credential_file).secret:
                os.unlink(path)
        except (TectofsError, OSError):
            pass

    def _start_meta(self, port: int, timeout_s: float) -> str:
        ready = os.path.join(self.root, "meta.address")
        if os.path.exists(ready):
            os.unlink(ready)
        self.meta_process = self._spawn(
            ["meta", "--store", self.store, "--host", self.host, "--port", str(port),
             "--policy", self.policy, "--block-size", str(self.block_size), "--ready-file", ready,
             "--dead-after", str(self.server_dead_after_s), "--gc-delay", str(self.gc_delay_s),
             "--allocation-grace", str(self.allocation_grace_s), "--key-file", self.key_file, *self.meta_args,
             *self._advertise_args(), *self._metrics_args("meta")],
            "meta.log",
        )
        address = wait_for_file(ready, timeout_s, self.meta_process)
        self._read_metrics("meta", self.meta_process, timeout_s)  # written before the address
        return address

    def start_extra_meta(self, timeout_s: float = 30.0) -> tuple[str, subprocess.Popen[bytes]]:
        """Another metadata service on the same store (PostgreSQL: several MDS, one namespace).
        Returns its address and process; the caller stops it."""
        n = len(glob.glob(os.path.join(self.root, "meta-extra-*.address")))
        ready = os.path.join(self.root, f"meta-extra-{n}.address")
        process = self._spawn(
            ["meta", "--store", self.store, "--host", self.host, "--port", "0", "--ready-file", ready,
             "--dead-after", str(self.server_dead_after_s), "--gc-delay", str(self.gc_delay_s),
             "--key-file", self.key_file, *self.meta_args, *self._advertise_args()],
            f"meta-extra-{n}.log",
        )
        return wait_for_file(ready, timeout_s, process), process

    def kill_meta(self, sig: int = signal.SIGKILL) -> None:
        if self.meta_process is not None and self.meta_process.poll() is None:
            self.meta_process.send_signal(sig)
            self.meta_process.wait(timeout=10)

    def restart_meta(self, timeout_s: float = 30.0) -> None:
        """Start the metadata service again on the same store and port."""
        port = int(self.address.rsplit(":", 1)[1])
        deadline = time.monotonic() + timeout_s
        while True:  # the port may linger briefly after a kill
            try:
                self._start_meta(port, timeout_s)
                return
            except TectofsError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def _start_chunk(self, i: int) -> subprocess.Popen[bytes]:
        ready = os.path.join(self.root, f"chunk-{i}.address")
        if os.path.exists(ready):
            os.unlink(ready)
        args = ["chunk", "--data", self.chunk_data_dirs[i], "--meta", self.address, "--host", self.host,
                "--heartbeat", str(self.heartbeat_interval_s), "--ready-file", ready,
                "--inflight-max", str(self.chunk_inflight_bytes_max), "--key-file", self.key_file, *self.chunk_args,
                *self._advertise_args(), *self._metrics_args(f"chunk-{i}")]
        if self.sync is False or self.sync == "none":
            args.append("--no-sync")
        elif isinstance(self.sync, str):
            args += ["--sync", self.sync]
        return self._spawn(args, f"chunk-{i}.log")

    def restart_chunk(self, i: int, timeout_s: float = 30.0) -> None:
        """Start chunk server ``i`` again on its data directory; returns once it has
        registered its (new) address with the metadata service."""
        process = self._start_chunk(i)
        self.chunk_processes[i] = process
        wait_for_file(os.path.join(self.root, f"chunk-{i}.address"), timeout_s, process)
        self._read_metrics(f"chunk-{i}", process, timeout_s)

    def servers(self) -> list[messages.ServerInfo]:
        from tectofs.client import connect

        with connect(self.address, credentials=self.credential_file) as fs:
            return fs.servers()

    def wait_live(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        live = 0
        while time.monotonic() < deadline:
            for process in self.chunk_processes:
                if process is not None and process.poll() is not None and process.returncode not in (0, -9, -15):
                    raise TectofsError(f"a chunk server exited with code {process.returncode}; see {self.root}/logs")
            try:
                live = sum(1 for s in self.servers() if s.live)
            except (TectofsError, OSError):
                live = 0
            if live >= count:
                return
            time.sleep(0.1)
        raise Timeout(f"only {live} of {count} chunk servers became live within {timeout_s:.0f}s; see {self.root}/logs")

    def supervise(self) -> list[str]:
        """Restart children that exited, with exponential backoff (1 s, 2 s, 4 s ... up to
        ``limits.restart_backoff_max_s``; a child that stays up that long twice over is
        forgiven). Returns one line per event, for the operator. ``tectofs up`` calls it
        twice a second."""
        events: list[str] = []
        now = time.monotonic()
        children = [("metadata service", "meta", self.meta_process)] + [
            (f"chunk server {i}", f"chunk-{i}", p) for i, p in enumerate(self.chunk_processes)
        ] + [("S3 gateway", "s3", self.s3_process)]
        for label, name, process in children:
            if process is None:
                continue
            attempts, next_try, restarted_at = self._restarts.get(name, (0, 0.0, 0.0))
            if process.poll() is None:
                if name in self._restarts and next_try == 0.0 and now - restarted_at > 2 * limits.restart_backoff_max_s:
                    del self._restarts[name]
                continue
            if next_try == 0.0:  # just noticed
                delay = min(limits.restart_backoff_max_s, 2.0**attempts)
                self._restarts[name] = (attempts, now + delay, 0.0)
                events.append(f"{label} exited with code {process.returncode} (log: {self.root}/logs/{name}.log);"
                              f" restarting in {delay:g} s")
            elif now >= next_try:
                try:
                    if name == "meta":
                        self.restart_meta()
                    elif name == "s3":
                        self._start_s3(int(self.s3_address.rsplit(":", 1)[1]), 30.0)
                    else:
                        self.restart_chunk(int(name.split("-")[1]))
                    self._restarts[name] = (attempts + 1, 0.0, time.monotonic())
                    events.append(f"{label} restarted")
                except (TectofsError, OSError) as exc:
                    delay = min(limits.restart_backoff_max_s, 2.0 ** (attempts + 1))
                    self._restarts[name] = (attempts + 1, now + delay, 0.0)
                    events.append(f"{label} did not come back ({exc}); next try in {delay:g} s")
        return events

    def kill_chunk_server(self, i: int, sig: int = signal.SIGKILL) -> None:
        process = self.chunk_processes[i]
        if process is not None and process.poll() is None:
            process.send_signal(sig)
            process.wait(timeout=10)

    def stop(self) -> None:
        processes = ([self.s3_process] if self.s3_process else []) + [p for p in self.chunk_processes if p is not None] + (
            [self.meta_process] if self.meta_process else [])
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        self._forget_credential()
        if self.tls_files:
            if self._ca_env_before is None:
                os.environ.pop("TECTOFS_TLS_CA", None)
            else:
                os.environ["TECTOFS_TLS_CA"] = self._ca_env_before

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
