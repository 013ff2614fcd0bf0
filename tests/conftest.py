"""Shared fixtures: real local clusters (separate processes on 127.0.0.1, ephemeral ports).

``cluster``: one cluster per test module (6 chunk servers, rs(4,2), 1 MiB blocks so that
multi-block files stay small). ``make_cluster``: a factory for tests that kill or corrupt
servers and need a cluster of their own (``cluster_class=`` takes a ``TestCluster``
subclass). Every cluster is stopped and its processes reaped at teardown; every wait inside
has a timeout.
"""

from __future__ import annotations

import atexit
import glob
import os
import random
import shutil
import subprocess
import tempfile
import time
from typing import Any, Callable, Iterator

import pytest

from tectofs.client import FileSystem, connect
from tectofs.server.chunk import packs
from tectofs.server.cluster import LocalCluster
from tectofs.wire import messages

MiB = 1 << 20

# Seeds drawn at collection (the exerciser's, the simulator's batches) name parametrized tests.
# Under pytest-xdist every worker collects and all must see the same names: they share the
# run's uid, so they draw the same seeds, and each run still draws new ones.
if "PYTEST_XDIST_TESTRUNUID" in os.environ:
    random.seed(os.environ["PYTEST_XDIST_TESTRUNUID"])

# Chunk servers store chunks up to --pack-max (1 MiB by default) as records in segment files,
# so the test clusters' small chunks (1 MiB blocks, rs(4,2): 256 KiB) are packed. A test
# that damages a chunk *file* on disk (truncates or deletes one) asks for a file per chunk.
FILE_PER_CHUNK = ["--pack-max", "0"]

# Clusters write root's credential where client commands find it (tectofs.wire.auth.config_dir):
# tests keep those files out of the user's home, in one directory per test session, removed
# when the session ends (unless the caller chose the directory).
if "TECTOFS_CONFIG_DIR" not in os.environ:
    _session_config_dir = tempfile.mkdtemp(prefix="tectofs-test-config-")
    os.environ["TECTOFS_CONFIG_DIR"] = _session_config_dir
    atexit.register(shutil.rmtree, _session_config_dir, ignore_errors=True)


class TestCluster(LocalCluster):
    """A LocalCluster with a connected client at ``.fs``."""

    fs: FileSystem

    def start(self, timeout_s: float = 60.0) -> str:
        address = super().start(timeout_s)
        self.fs = connect(address, credentials=self.credential_file)
        return address

    def chunk_file(self, path: str, block_index: int = 0, position: int = 0) -> str:
        """The chunk file of chunk ``position`` of block ``block_index`` of ``path`` (which
        need not exist): for clusters started with ``chunk_args=FILE_PER_CHUNK``."""
        block_id, chunk, data_dir = self._chunk_at(path, block_index, position)
        return _chunk_file(data_dir, block_id)

    def chunk_place(self, path: str, block_index: int = 0, position: int = 0) -> tuple[str, int]:
        """``(file, offset)``: where the data of chunk ``position`` of block ``block_index`` of
        ``path`` lies on disk, in either chunk layout (a packed record's segment, or a chunk
        file). Looked up afresh on each call: a rebuilt packed chunk is a new record."""
        return self._chunk_place(path, block_index, position)[:2]

    def _chunk_place(self, path: str, block_index: int, position: int) -> tuple[str, int, int]:
        """``(file, offset, length)``. A packed record is looked for first: it is the copy
        the server serves when a block is in both layouts (a rebuild moving it)."""
        block_id, chunk, data_dir = self._chunk_at(path, block_index, position)
        found = [(segment, packs.data_offset(offset, info.length), info.length)
                 for segment, offset, info, live in packs.records(os.path.join(data_dir, "packs"))
                 if live and info.block_id == block_id]
        if found:
            return found[-1]  # the last live record is the one the server serves
        chunk_file = _chunk_file(data_dir, block_id)
        if os.path.exists(chunk_file):
            return chunk_file, 0, chunk.length
        raise LookupError(f"chunk {position} of block {block_id:x} is on no disk of {chunk.address}")

    def _chunk_at(self, path: str, block_index: int, position: int) -> tuple[int, Any, str]:
        """``(block id, the layout's chunk, data directory of the server holding it)``."""
        layout = self.fs.run(self.fs.aio.metadata.layout(messages.LayoutRequest(path=path)))
        block = layout.blocks[block_index]
        chunk = next(c for c in block.chunks if c.position == position)
        if chunk.address is None:
            raise LookupError(f"chunk {position} of block {block.block_id:x} is on a server no longer registered")
        return block.block_id, chunk, self._data_dir_at(chunk.address)

    def flip_chunk_byte(self, path: str, block_index: int, position: int, offset: int) -> bytes:
        """Damage byte ``offset`` of a chunk's data on disk (either layout); returns it as it was."""
        file, at, length = self._chunk_place(path, block_index, position)
        assert 0 <= offset < length, f"byte {offset} of a chunk of {length} bytes"
        with open(file, "r+b") as f:
            f.seek(at + offset)
            byte = f.read(1)
            f.seek(at + offset)
            f.write(bytes([byte[0] ^ 0xFF]))
        return byte

    def wait_chunk_byte(self, path: str, block_index: int, position: int, offset: int, byte: bytes,
                        timeout_s: float = 20.0) -> None:
        """Wait until the chunk holds ``byte`` at ``offset`` again (rebuilt in place, or as a
        new packed record); fails the test after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                file, at = self.chunk_place(path, block_index, position)
                with open(file, "rb") as f:
                    f.seek(at + offset)
                    if f.read(1) == byte:
                        return
            except (LookupError, FileNotFoundError):
                pass  # between copies: being rebuilt, or its segment compacted away
            time.sleep(0.1)
        pytest.fail(f"chunk {position} of block {block_index} of {path} was not repaired within {timeout_s:g} s")

    def chunk_count(self, server_index: int | None = None) -> int:
        """Chunks stored on disk (chunk files and live packed records) by one chunk server,
        or by all of them."""
        dirs = self.chunk_data_dirs if server_index is None else [self.chunk_data_dirs[server_index]]
        count = 0
        for data_dir in dirs:
            count += len(glob.glob(os.path.join(data_dir, "chunks", "*", "*.chunk")))
            count += len({info.block_id for _, _, info, live in packs.records(os.path.join(data_dir, "packs")) if live})
        return count

    def _data_dir_at(self, address: str) -> str:
        for i, data_dir in enumerate(self.chunk_data_dirs):
            with open(os.path.join(self.root, f"chunk-{i}.address")) as f:
                if f.read().strip() == address:
                    return data_dir
        raise LookupError(f"no local chunk server at {address}")

    def stop(self) -> None:
        fs = getattr(self, "fs", None)
        if fs is not None:
            fs.close()
        super().stop()


def _chunk_file(data_dir: str, block_id: int) -> str:
    """Where a chunk server keeps a block's chunk file (``ChunkStore.path``)."""
    name = f"{block_id:016x}"
    return os.path.join(data_dir, "chunks", name[-2:], name + ".chunk")


def _new_cluster(root: str, cluster_class: type[TestCluster] = TestCluster, **kwargs: Any) -> TestCluster:
    options: dict[str, Any] = dict(servers=6, policy="rs(4,2)", block_size=1 * MiB, server_dead_after_s=2.0,
                                   heartbeat_interval_s=0.3, gc_delay_s=1.0)
    options.update(kwargs)
    cluster = cluster_class(root, **options)
    cluster.start()
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestCluster]:
    c = _new_cluster(str(tmp_path_factory.mktemp("cluster")))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., TestCluster]]:
    made: list[TestCluster] = []

    def make(**kwargs: Any) -> TestCluster:
        c = _new_cluster(str(tmp_path_factory.mktemp("cluster")), **kwargs)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """URL of a PostgreSQL server started for this test session. Where it cannot run, the
    tests that need it fail, saying what is missing (they are part of the contract suite),
    unless ``TECTOFS_SKIP_POSTGRES=1`` is set: then they are skipped."""
    from tectofs.testing import postgres

    lacks = postgres.missing()
    if lacks and os.environ.get("TECTOFS_SKIP_POSTGRES") == "1":
        pytest.skip(f"TECTOFS_SKIP_POSTGRES=1 and PostgreSQL cannot run here: missing {'; '.join(lacks)}")
    if lacks:
        pytest.fail(f"the PostgreSQL tests cannot run: missing {'; '.join(lacks)}. Run scripts/install.sh,"
                    " or set TECTOFS_SKIP_POSTGRES=1 to skip them", pytrace=False)
    with postgres.server() as url:
        yield url


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> random.Random:
    """A seeded RNG; the seed is printed so a failure can be replayed (TECTOFS_SEED=...)."""
    seed = int(os.environ.get("TECTOFS_SEED", random.randrange(1 << 32)))
    print(f"{request.node.nodeid}: seed {seed}")
    return random.Random(seed)


# ---------------------------------------------------------------------- the fast lane
# `python3 -m pytest -m "not slow"` runs the in-process tests alone (store contract, simulator,
# state machines, codecs, protocol): no server processes. A test is slow when its fixtures
# start processes (the closure of these names) or when it says so (`pytest.mark.slow`, for
# tests that start processes themselves); a test marked neither that starts a process fails,
# saying so, so the lane stays in-process as tests are added.
PROCESS_FIXTURES = frozenset({"cluster", "make_cluster", "postgres_server"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _in_process_unless_slow(request: pytest.FixtureRequest) -> Iterator[None]:
    # Patched by hand, not with the monkeypatch fixture: an autouse fixture that requested it
    # would set it up before every other fixture of the test and so undo it after them, putting
    # back environment variables a cluster fixture had already restored (TECTOFS_TLS_CA).
    if request.node.get_closest_marker("slow") is not None:
        yield
        return
    started = subprocess.Popen.__init__

    def refuse(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        raise AssertionError(f"{request.node.nodeid} starts a process ({args!r:.200}) but is not marked slow: "
                             "mark it pytest.mark.slow (the fast lane, -m 'not slow', is in-process)")

    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = started  # type: ignore[method-assign]


@pytest.fixture(scope="module")
def leased_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a local cluster whose leases last 2 s (leases, claims: ``test_leases.py``,
    ``test_claims.py``), one per module."""
    from tectofs.server.cluster import LocalCluster
    cluster = LocalCluster(str(tmp_path_factory.mktemp("leases")), meta_args=["--lease", "2"])
    address = cluster.start()
    yield address
    cluster.stop()
