"""The model-based file exerciser (``tests/exerciser.py``) against the client library and the
FUSE mount: random writes (buffered, O_DIRECT, mmap), reads, truncates up and down, fsyncs,
close and reopen, compared byte for byte with an in-memory model.

Files live in a directory with 64 KiB blocks, so a file of at most ``SIZE_MAX`` bytes spans
dozens of blocks and most operations cross or touch a block boundary. Each seed is printed;
``TECTOFS_SEED=N`` replays one, ``TECTOFS_EXERCISER_OPS`` sets the operations per seed.
"""

from __future__ import annotations

import os
import random
import uuid
from typing import Any

import pytest

from tests import exerciser

KiB = 1 << 10
BLOCK_SIZE = 64 * KiB
SIZE_MAX = 40 * BLOCK_SIZE
OPERATIONS = int(os.environ.get("TECTOFS_EXERCISER_OPS", "1500"))
SEEDS = 4  # per target: 2 x 4 x 1500 = 12,000 operations in CI (new seeds every run)


def _seeds(salt: str) -> list[int]:
    if "TECTOFS_SEED" in os.environ:
        return [int(os.environ["TECTOFS_SEED"])]
    return [random.Random(f"{salt}-{random.randrange(1 << 32)}").randrange(1 << 32) for _ in range(SEEDS)]


def _directory(fs: Any, prefix: str) -> str:
    path = f"/{prefix}-{uuid.uuid4().hex[:8]}"
    fs.mkdir(path, block_size=BLOCK_SIZE)
    return path


@pytest.mark.parametrize("seed", _seeds("library"))
def test_exerciser_through_the_library(cluster: Any, seed: int) -> None:
    print(f"exerciser (library): seed {seed}, {OPERATIONS} operations")
    directory = _directory(cluster.fs, "fsx-lib")
    done = exerciser.run(exerciser.LibraryTarget(cluster.fs, f"{directory}/f"), seed, OPERATIONS,
                         BLOCK_SIZE, SIZE_MAX, "library")
    assert done == OPERATIONS


@pytest.fixture(scope="module")
def mounted_root(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.test_fuse import _REASON

    if _REASON is not None:
        pytest.skip(_REASON)
    from tectofs.client.fuse import is_mounted, start_mount_process

    mountpoint = str(tmp_path_factory.mktemp("fsx-mnt"))
    process = start_mount_process(cluster.address, mountpoint,
                                  log_path=str(tmp_path_factory.mktemp("fsx-log") / "mount.log"))
    try:
        yield mountpoint
    finally:
        process.stop()
        assert not is_mounted(mountpoint)


@pytest.mark.fuse
@pytest.mark.parametrize("seed", _seeds("mount"))
def test_exerciser_through_the_mount(cluster: Any, mounted_root: str, seed: int) -> None:
    print(f"exerciser (mount): seed {seed}, {OPERATIONS} operations")
    directory = _directory(cluster.fs, "fsx-mnt")
    direct = seed % 2 == 1  # half the seeds through an O_DIRECT descriptor
    done = exerciser.run(exerciser.PosixTarget(mounted_root + directory + "/f", direct), seed, OPERATIONS,
                         BLOCK_SIZE, SIZE_MAX, "mount (O_DIRECT)" if direct else "mount")
    assert done == OPERATIONS
