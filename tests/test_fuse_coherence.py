"""Two mounts and two library clients of one cluster, all holding metadata leases: a change made
through any of them is seen by every other one at its next call, every time, though each
answers from its cache (the kernel's, the library's) while nothing changes."""

from __future__ import annotations

import os
import random
import stat as statmod
import time
from typing import Any, Callable

import pytest

from tectofs.client import connect
from tests.test_fuse import _REASON
from tests.test_metrics import scrape

pytestmark = [pytest.mark.fuse, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]


_HOUSEKEEPING = ("keepalive", "release_leases", "heartbeat", "inventory_begin", "inventory", "register_server")


def _meta_calls_by_op(metrics_url: str) -> dict[str, float]:
    """Calls the metadata service answered so far, by operation, but housekeeping sent when its
    sender pleases (a session's keepalives, a client's batched ends of its file leases, the
    chunk servers' heartbeats and inventories)."""
    calls: dict[str, float] = {}
    for (name, labels), v in scrape(metrics_url).items():
        op = dict(labels).get("op", "")
        if name == "tectofs_meta_requests_total" and op not in _HOUSEKEEPING:
            calls[op] = calls.get(op, 0.0) + v
    return calls


def _meta_calls(metrics_url: str) -> float:
    return sum(_meta_calls_by_op(metrics_url).values())


@pytest.fixture
def four_clients(make_cluster: Any, tmp_path: Any) -> Any:
    from tectofs.client.fuse import start_mount_process

    cluster = make_cluster(meta_args=["--lease", "5"], metrics=True)
    mounts = [start_mount_process(cluster.address, str(tmp_path / f"mnt{i}"), log_path=str(tmp_path / f"mount{i}.log"))
              for i in range(2)]
    libraries = [connect(cluster.address, credentials=cluster.credential_file, leases=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 10
        while not all(fs.aio.lease_session and fs.aio.lease_session.remaining() for fs in libraries):
            assert time.monotonic() < deadline, "no lease within 10 s"
            time.sleep(0.05)
        yield cluster, [m.mountpoint for m in mounts], libraries
    finally:
        for fs in libraries:
            fs.close()
        for m in mounts:
            m.stop()


class Views:
    """The four clients, each reading the namespace its own way (a mount through the kernel)."""

    def __init__(self, mountpoints: list[str], libraries: list[Any], base: str) -> None:
        self.mountpoints, self.libraries, self.base = mountpoints, libraries, base

    def stat_all(self, name: str) -> list[tuple[int, int, int] | None]:
        """(mode, size, inode) of ``name`` as each client sees it (None: absent)."""
        seen: list[tuple[int, int, int] | None] = []
        for mnt in self.mountpoints:
            try:
                st = os.stat(f"{mnt}{self.base}/{name}")
                seen.append((statmod.S_IMODE(st.st_mode), st.st_size, st.st_ino))
            except FileNotFoundError:
                seen.append(None)
        for fs in self.libraries:
            try:
                st = fs.stat(f"{self.base}/{name}")
                seen.append((st.mode & 0o7777, st.size, st.ino))
            except FileNotFoundError:
                seen.append(None)
        return seen

    def list_all(self) -> list[list[str]]:
        """The names in the directory as each client lists it (a mount: through its kernel)."""
        listed = [sorted(os.listdir(f"{mnt}{self.base}")) for mnt in self.mountpoints]
        return listed + [sorted(fs.listdir(self.base)) for fs in self.libraries]


def test_a_change_through_any_client_is_seen_by_every_other_at_its_next_call(four_clients: Any) -> None:
    cluster, mountpoints, libraries = four_clients
    base = f"/coherent-{os.getpid()}"
    libraries[0].mkdir(base)
    views = Views(mountpoints, libraries, base)
    rng = random.Random(7)
    names = [f"n{i}" for i in range(4)]

    def through_mount(i: int) -> Callable[[str, str, Any], None]:
        root = f"{mountpoints[i]}{base}"

        def change(kind: str, name: str, value: Any) -> None:
            if kind == "write":
                with open(f"{root}/{name}", "wb") as f:
                    f.write(value)
            elif kind == "chmod":
                os.chmod(f"{root}/{name}", value)
            elif kind == "rename":
                os.rename(f"{root}/{name}", f"{root}/{value}")
            elif kind == "unlink":
                os.unlink(f"{root}/{name}")
        return change

    def through_library(i: int) -> Callable[[str, str, Any], None]:
        fs = libraries[i]

        def change(kind: str, name: str, value: Any) -> None:
            path = f"{base}/{name}"
            if kind == "write":
                fs.write_bytes(path, value)
            elif kind == "chmod":
                fs.chmod(path, value)
            elif kind == "rename":
                fs.rename(path, f"{base}/{value}")
            elif kind == "unlink":
                fs.remove(path)
        return change

    changers = [through_mount(0), through_mount(1), through_library(0), through_library(1)]
    expected: dict[str, tuple[int, int] | None] = {n: None for n in names}
    checked = 0
    for step in range(120):
        for name in names:  # every client looks (and caches) before the change
            views.stat_all(name)
        views.list_all()
        who = rng.randrange(4)
        present = [n for n in names if expected[n] is not None]
        kind = rng.choice(["write", "write", "chmod", "rename", "unlink"] if present else ["write"])
        if kind == "write":
            name = rng.choice(names)
            data = os.urandom(rng.randrange(0, 3000))
            before = expected[name]
            mode = before[0] if before is not None else 0o644
            changers[who](kind, name, data)
            expected[name] = (mode, len(data))
        else:
            name = rng.choice(present)
            if kind == "chmod":
                mode = rng.choice([0o600, 0o640, 0o644, 0o755])
                changers[who](kind, name, mode)
                expected[name] = (mode, expected[name][1])  # type: ignore[index]
            elif kind == "rename":
                target = rng.choice([n for n in names if n != name])
                changers[who](kind, name, target)
                expected[target], expected[name] = expected[name], None
            else:
                changers[who](kind, name, None)
                expected[name] = None
        for n in names:  # each client's next call sees it: all four agree with what was done
            seen = views.stat_all(n)
            want = expected[n]
            for client, got in enumerate(seen):
                assert (got is None) == (want is None), (step, kind, who, n, client, got, want)
                if got is not None and want is not None:
                    assert got[:2] == want, (step, kind, who, n, client, got, want)
            checked += 1
        listed = sorted(n for n in names if expected[n] is not None)
        assert views.list_all() == [listed] * 4, (step, kind, who)
    assert checked == 120 * len(names)


def test_repeated_stats_through_a_leased_mount_ask_nobody(four_clients: Any) -> None:
    """``ls -lR`` again, ``stat`` again: the kernel answers while the lease lasts."""
    cluster, mountpoints, libraries = four_clients
    base = f"/quiet-{os.getpid()}"
    libraries[0].mkdir(base)
    for i in range(50):
        libraries[0].write_bytes(f"{base}/f{i}", b"x" * i)
    where = f"{mountpoints[0]}{base}"
    for name in os.listdir(where):
        os.stat(f"{where}/{name}")
    before = _meta_calls_by_op(cluster.metrics_urls["meta"])
    for _ in range(20):
        for name in os.listdir(where):
            os.stat(f"{where}/{name}")
    after = _meta_calls_by_op(cluster.metrics_urls["meta"])
    asked = {op: n - before.get(op, 0.0) for op, n in after.items() if n != before.get(op, 0.0)}
    assert sum(asked.values()) <= 2, asked  # 20 listings and 1,000 stats of 50 files: the kernel and the cache answer


def test_content_rewritten_anywhere_is_read_at_the_next_open_though_pages_are_kept(four_clients: Any) -> None:
    """The kernel keeps a file's pages across opens only while they are the version an open sees
    (``client/fuse/page_cache.py``): a rewrite elsewhere of the same size with its mtime put back
    (``rsync -t``) is still read at the next open, through either mount."""
    cluster, mountpoints, libraries = four_clients
    base = f"/pages-{os.getpid()}"
    libraries[0].mkdir(base)
    rng = random.Random(11)
    data = os.urandom(2000)
    libraries[0].write_bytes(f"{base}/f", data)
    stamp = (1_700_000_000.0, 1_700_000_000.0)
    for step in range(30):
        for mnt in mountpoints:  # both mounts read it (their kernels keep the pages)
            with open(f"{mnt}{base}/f", "rb") as f:
                assert f.read() == data, (step, mnt)
            with open(f"{mnt}{base}/f", "rb") as f:
                assert f.read() == data, (step, mnt)
        data = os.urandom(2000)
        who = rng.randrange(3)
        if who < 2:
            path = f"{mountpoints[who]}{base}/f"
            with open(path, "r+b") as f:
                f.write(data)
            os.utime(path, stamp)
        else:
            libraries[1].write_bytes(f"{base}/f", data, mtime=stamp[1])


def test_files_created_through_a_mount_without_calls_are_seen_everywhere_at_the_next_call(four_clients: Any) -> None:
    """A burst of creates claims its directory (``client/claims.py``): the mount answers them
    without a call each, and every other client's next call sees every file."""
    cluster, mountpoints, libraries = four_clients
    base = f"/claimed-{os.getpid()}"
    os.mkdir(f"{mountpoints[0]}{base}")
    before = _meta_calls_by_op(cluster.metrics_urls["meta"])
    for i in range(60):
        os.close(os.open(f"{mountpoints[0]}{base}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o640))
    after = _meta_calls_by_op(cluster.metrics_urls["meta"])
    creates = after.get("create", 0.0) - before.get("create", 0.0)
    assert creates <= 4, (creates, after)  # the first few, then the directory is claimed
    names = sorted(f"f{i}" for i in range(60))
    assert sorted(os.listdir(f"{mountpoints[1]}{base}")) == names  # recalls the claim: all were sent
    # (the first claim hands out 32 numbers; a second, asked for after 16 creates, 64 more)
    assert after.get("claim_directory", 0.0) - before.get("claim_directory", 0.0) == 2
    views = Views(mountpoints, libraries, base)
    for name in ("f0", "f59"):
        seen = views.stat_all(name)
        assert all(s is not None and s[:2] == (0o640, 0) for s in seen), seen
        assert len({s[2] for s in seen if s is not None}) == 1, seen  # one inode, for every client
    libraries[1].rename(f"{base}/f59", f"{base}/renamed")  # another client changes what was just created
    assert "renamed" in os.listdir(f"{mountpoints[0]}{base}") and "f59" not in os.listdir(f"{mountpoints[0]}{base}")
    with open(f"{mountpoints[0]}{base}/f1", "wb") as f:  # and the creator writes into its new files
        f.write(b"hello")
    assert libraries[0].read_bytes(f"{base}/f1") == b"hello"
