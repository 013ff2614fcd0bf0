"""A throwaway PostgreSQL server for tests and benchmarks, from the Debian packages on this machine.

Runs as the ``postgres`` user when started by root (PostgreSQL refuses root), else as the
current user, in a fresh directory under /tmp, on a free loopback port, with fsync off (test
speed), and is stopped at the end. ``scripts/install.sh`` installs the packages; tests that
need the server fail when it cannot run (``missing`` says why), unless
``TECTOFS_SKIP_POSTGRES=1`` is set.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Iterator


def _binaries() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return os.path.dirname(found[-1]) if found else None


def missing() -> list[str]:
    """What this machine lacks to run the server (empty: nothing), each with its remedy."""
    lacks = []
    try:
        import psycopg  # noqa: F401
    except ImportError:
        lacks.append("psycopg (pip install 'psycopg[binary]', the dev extra)")
    if _binaries() is None:
        lacks.append("/usr/lib/postgresql/*/bin/postgres (apt-get install postgresql; scripts/install.sh does)")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        lacks.append("runuser, to run PostgreSQL as the postgres user (apt-get install util-linux)")
    return lacks


def _as_server_user(command: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server(timeout_s: float = 60.0) -> Iterator[str]:
    """Start a server; yield the URL of its ``postgres`` database."""
    import psycopg

    bindir = _binaries()
    assert bindir is not None
    root = tempfile.mkdtemp(prefix="tectofs-pg-", dir="/tmp")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    data = os.path.join(root, "data")
    subprocess.run(_as_server_user([f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync"]),
                   check=True, capture_output=True, timeout=timeout_s)
    port = _free_port()
    log = open(os.path.join(root, "server.log"), "wb")
    process = subprocess.Popen(
        _as_server_user([f"{bindir}/postgres", "-D", data, "-p", str(port), "-k", root,
                         "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"]),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg.connect(url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"PostgreSQL did not start; see {root}/server.log") from None
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def new_database(url: str) -> str:
    """Create an empty database on the server at ``url``; return its URL."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return url.rsplit("/", 1)[0] + "/" + name
