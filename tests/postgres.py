"""A throwaway PostgreSQL server for tests, from the Debian packages on this machine.

Runs as the ``postgres`` user (PostgreSQL refuses root) in a fresh directory under /tmp,
on a free loopback port, with fsync off (test speed), and is stopped at the end.
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


def available() -> bool:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return False
    return _binaries() is not None and shutil.which("runuser") is not None and os.geteuid() == 0


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
    shutil.chown(root, "postgres", "postgres")
    data = os.path.join(root, "data")
    subprocess.run(["runuser", "-u", "postgres", "--", f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres",
                    "--no-sync"], check=True, capture_output=True, timeout=timeout_s)
    port = _free_port()
    log = open(os.path.join(root, "server.log"), "wb")
    process = subprocess.Popen(
        ["runuser", "-u", "postgres", "--", f"{bindir}/postgres", "-D", data, "-p", str(port), "-k", root,
         "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
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
