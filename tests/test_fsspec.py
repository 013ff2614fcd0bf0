"""fsspec ``tectofs://`` against a real local cluster: fsspec's own conformance mixins, URL
handling, a real consumer (pandas parquet through pyarrow), and failures that must publish
nothing."""

from __future__ import annotations

import asyncio
import errno
import gc
import io
import os
import posixpath
import time

import fsspec
import pytest
from fsspec.tests.abstract import (
    AbstractCopyTests,
    AbstractFixtures,
    AbstractGetTests,
    AbstractOpenTests,
    AbstractPipeTests,
    AbstractPutTests,
)

from tectofs.fsspec_fs import TectofsFileSystem
from tectofs.wire import auth, messages

MiB = 1 << 20


class Boom(Exception):
    """Raised by a test inside a write, to see that nothing gets published."""


@pytest.fixture(scope="module")
def tfs(cluster):
    """One fsspec filesystem for the module's cluster (made through fsspec's registry)."""
    fs = fsspec.filesystem("tectofs", meta=cluster.address)
    yield fs
    fs.close()
    TectofsFileSystem.clear_instance_cache()


class TectofsFixtures(AbstractFixtures):
    """fsspec's abstract fixtures on the module's cluster, every test under /abstract."""

    @pytest.fixture
    def fs(self, tfs):
        return tfs

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self):
        return "/abstract"


class TestTectofsCopy(AbstractCopyTests, TectofsFixtures):
    pass


class TestTectofsGet(AbstractGetTests, TectofsFixtures):
    pass


class TestTectofsPut(AbstractPutTests, TectofsFixtures):
    pass


class TestTectofsOpen(AbstractOpenTests, TectofsFixtures):
    pass


class TestTectofsPipe(AbstractPipeTests, TectofsFixtures):
    pass


# ---------------------------------------------------------------------- URLs and paths


def test_strip_protocol_and_url_kwargs():
    strip = TectofsFileSystem._strip_protocol
    assert strip("tectofs://127.0.0.1:7420/a/b/") == "/a/b"
    assert strip("tectofs:///a//b") == "/a/b"
    assert strip("a/b") == "/a/b"
    assert strip("tectofs://h:1") == strip("/") == "/"
    assert strip(["tectofs://h:1/x", "/y/"]) == ["/x", "/y"]
    kwargs = TectofsFileSystem._get_kwargs_from_urls
    assert kwargs("tectofs://10.0.0.1:7420,10.0.0.2:7420/a") == {"meta": "10.0.0.1:7420,10.0.0.2:7420"}
    assert kwargs("tectofs:///a") == {}


def test_paths_round_trip_through_urls(cluster, tfs):
    tfs.pipe("/urls/d/f", b"abc")
    listed = tfs.ls("/urls/d", detail=False)
    assert listed == ["/urls/d/f"]
    url = tfs.unstrip_protocol(listed[0])
    assert url == f"tectofs://{cluster.address}/urls/d/f"
    with fsspec.open(url, "rb") as f:
        assert f.read() == b"abc"
    fs, path = fsspec.core.url_to_fs(url)
    assert fs is tfs and path == "/urls/d/f"
    assert tfs.find(f"tectofs://{cluster.address}/urls") == ["/urls/d/f"]


def test_open_with_address_from_environment(cluster, monkeypatch):
    monkeypatch.setenv("TECTOFS_META", cluster.address)
    with fsspec.open("tectofs:///env/hello.txt", "w") as f:
        f.write("hello")
    with fsspec.open("tectofs:///env/hello.txt", "r") as f:
        assert f.read() == "hello"
    fs = fsspec.filesystem("tectofs")
    assert fs.meta == cluster.address
    fs.close()


def test_asynchronous_use_on_the_callers_loop(cluster):
    """``asynchronous=True``: the coroutines run on the caller's loop, the client is made there."""

    async def main() -> None:
        fs = TectofsFileSystem(meta=cluster.address, asynchronous=True, skip_instance_cache=True)
        try:
            await fs._pipe_file("/async/f", b"0123456789")
            assert await fs._cat_file("/async/f", start=2, end=5) == b"234"
            assert await fs._ls("/async", detail=False) == ["/async/f"]
            await fs._mv("/async/f", "/async/g")
            assert await fs._find("/async") == ["/async/g"]
        finally:
            await fs._close()

    asyncio.run(main())


def test_no_address_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TECTOFS_META", raising=False)
    with pytest.raises(ValueError, match="TECTOFS_META"):
        TectofsFileSystem(skip_instance_cache=True)


# ---------------------------------------------------------------------- operations


def test_info_ls_and_find(tfs):
    tfs.pipe({"/ops/a/x": b"1", "/ops/a/y/z": b"22", "/ops/b": b""})
    info = tfs.info("/ops/a/y/z")
    assert info["name"] == "/ops/a/y/z" and info["type"] == "file" and info["size"] == 2
    assert info["mtime"] > 0 and tfs.modified("/ops/a/y/z").timestamp() == pytest.approx(info["mtime"])
    assert tfs.info("/ops/a")["type"] == "directory"
    listing = tfs.ls("/ops/a")
    assert [(e["name"], e["type"]) for e in listing] == [("/ops/a/x", "file"), ("/ops/a/y", "directory")]
    assert tfs.ls("/ops/a/x", detail=False) == ["/ops/a/x"]  # a file lists as itself
    assert tfs.find("/ops") == ["/ops/a/x", "/ops/a/y/z", "/ops/b"]
    assert tfs.find("/ops", withdirs=True, maxdepth=1) == ["/ops", "/ops/a", "/ops/b"]
    assert tfs.glob("/ops/a/*") == ["/ops/a/x", "/ops/a/y"]
    assert tfs.du("/ops") == 3
    assert tfs.exists("/ops/b") and not tfs.exists("/ops/nothing") and not tfs.exists("/ops/b/under-a-file")


def test_ranged_reads(tfs, rng):
    data = rng.randbytes(3 * MiB + 1234)  # several 1 MiB blocks of the test cluster
    tfs.pipe_file("/ranges/f", data)
    assert tfs.cat_file("/ranges/f") == data
    assert tfs.cat_file("/ranges/f", start=MiB - 10, end=2 * MiB + 10) == data[MiB - 10 : 2 * MiB + 10]
    assert tfs.cat_file("/ranges/f", start=-100) == data[-100:]
    assert tfs.cat_file("/ranges/f", start=10, end=-10) == data[10:-10]
    assert tfs.cat_file("/ranges/f", start=len(data) + 5) == b""
    starts = [0, 5, MiB, len(data) - 3]
    ends = [10, MiB + 5, 3 * MiB, len(data) + 100]
    assert tfs.cat_ranges(["/ranges/f"] * 4, starts, ends) == [data[s:e] for s, e in zip(starts, ends)]
    mixed = tfs.cat_ranges(["/ranges/f", "/ranges/missing", "/ranges/f"], (MiB, 0, 0), (MiB + 3, 5, 2))
    assert mixed[0] == data[MiB : MiB + 3] and isinstance(mixed[1], FileNotFoundError) and mixed[2] == data[:2]
    with pytest.raises(FileNotFoundError):
        tfs.cat_ranges(["/ranges/missing"], 0, 5, on_error="raise")
    with tfs.open("/ranges/f", "rb", block_size=64 * 1024) as f:
        f.seek(2 * MiB + 7)
        assert f.read(1000) == data[2 * MiB + 7 : 2 * MiB + 1007]
        assert f.info()["size"] == len(data)
    assert tfs.cat(["/ranges/f", "/ranges/f"]) == {"/ranges/f": data}


def test_streamed_write_put_and_get(tfs, tmp_path, rng):
    data = rng.randbytes(2 * MiB + 99)
    with tfs.open("/stream/big", "wb", block_size=300_000) as f:
        for start in range(0, len(data), 123_457):
            f.write(data[start : start + 123_457])
    assert tfs.cat("/stream/big") == data
    with tfs.open("/stream/big", "ab") as f:
        f.write(b"tail")
    assert tfs.cat("/stream/big") == data + b"tail"
    local = tmp_path / "up.bin"
    local.write_bytes(data)
    tfs.put_file(str(local), "/stream/up.bin")
    tfs.get_file("/stream/up.bin", str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == data
    into = io.BytesIO()
    tfs.get_file("/stream/up.bin", into)
    assert into.getvalue() == data
    tfs.copy("/stream/up.bin", "/stream/copy.bin")
    assert tfs.cat("/stream/copy.bin") == data


def test_mv_is_a_rename(tfs):
    tfs.pipe({"/mv/src/a": b"a", "/mv/src/sub/b": b"b", "/mv/file": b"f"})
    ino = tfs.info("/mv/src")["ino"]
    tfs.mv("/mv/src", "/mv/dst")
    assert tfs.info("/mv/dst")["ino"] == ino  # the same directory, moved whole
    assert tfs.find("/mv/dst") == ["/mv/dst/a", "/mv/dst/sub/b"] and not tfs.exists("/mv/src")
    tfs.mv("/mv/file", "/mv/dst")  # into an existing directory
    assert tfs.cat("/mv/dst/file") == b"f"
    tfs.mv("/mv/dst/a", "/mv/dst/file")  # replaces a file
    assert tfs.cat("/mv/dst/file") == b"a" and not tfs.exists("/mv/dst/a")


def test_mkdir_rmdir_and_rm(tfs):
    tfs.mkdir("/dirs/a/b")  # parents by default
    with pytest.raises(FileExistsError):
        tfs.mkdir("/dirs/a/b")
    with pytest.raises(FileExistsError):
        tfs.makedirs("/dirs/a")
    tfs.makedirs("/dirs/a", exist_ok=True)
    with pytest.raises(FileNotFoundError):
        tfs.mkdir("/dirs/x/y", create_parents=False)
    tfs.pipe("/dirs/a/b/f", b"x")
    with pytest.raises(OSError) as raised:
        tfs.rmdir("/dirs/a/b")
    assert raised.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError):
        tfs.rm("/dirs/a")  # not empty, not recursive
    tfs.rm_file("/dirs/a/b/f")
    tfs.rmdir("/dirs/a/b")
    tfs.pipe({"/dirs/a/c/d/e": b"1", "/dirs/a/f": b"2"})
    tfs.rm("/dirs/a", recursive=True)
    assert not tfs.exists("/dirs/a") and tfs.exists("/dirs")


def test_errors_are_the_builtins_fsspec_users_catch(tfs):
    tfs.pipe({"/err/file": b"x"})
    tfs.mkdir("/err/dir")
    with pytest.raises(FileNotFoundError):
        tfs.cat("/err/missing")
    with pytest.raises(FileNotFoundError):
        tfs.open("/err/missing", "rb")
    with pytest.raises(FileNotFoundError):
        tfs.info("/err/missing")
    with pytest.raises(FileNotFoundError):
        tfs.rm("/err/missing")
    with pytest.raises(FileNotFoundError):
        tfs.ls("/err/missing")
    with pytest.raises(IsADirectoryError):
        tfs.open("/err/dir", "rb")
    with pytest.raises(IsADirectoryError):
        tfs.rm_file("/err/dir")
    with pytest.raises(NotADirectoryError):
        tfs.pipe_file("/err/file/child", b"y")
    with pytest.raises(FileExistsError):
        tfs.pipe_file("/err/file", b"y", mode="create")
    with pytest.raises(FileExistsError):
        tfs.open("/err/file", "xb")
    assert tfs.cat("/err/file") == b"x"


def test_permission_error_for_another_user(cluster, tfs, tmp_path):
    """``credentials=`` names the user; root's private file is refused to alice."""
    reply = cluster.fs.run(cluster.fs.aio.metadata.user_add(messages.UserAddRequest(name="fsspec-alice", uid=1000, gid=1000, groups=[])))
    credential = str(tmp_path / "alice.credentials")
    auth.Credential(user="fsspec-alice", secret=reply.secret, cluster=cluster.address).save(credential)
    tfs.pipe({"/private/secret": b"s", "/private/public": b"p"})
    cluster.fs.chmod("/private/secret", 0o600)
    alice = fsspec.filesystem("tectofs", meta=cluster.address, credentials=credential, skip_instance_cache=True)
    try:
        assert alice.cat("/private/public") == b"p"
        with pytest.raises(PermissionError):
            alice.cat("/private/secret")
        with pytest.raises(PermissionError):
            alice.pipe("/private/mine", b"m")  # /private is root's, 0755
    finally:
        alice.close()


# ---------------------------------------------------------------------- nothing published on failure


def test_write_aborted_by_an_exception_publishes_nothing(tfs):
    with pytest.raises(Boom):
        with tfs.open("/abort/new", "wb") as f:
            f.write(os.urandom(3 * MiB))  # whole blocks already sent to the chunk servers
            raise Boom
    assert not tfs.exists("/abort/new")
    tfs.pipe_file("/abort/old", b"previous")
    with pytest.raises(Boom):
        with tfs.open("/abort/old", "wb", block_size=MiB) as f:
            f.write(os.urandom(2 * MiB))
            raise Boom
    assert tfs.cat("/abort/old") == b"previous"


def test_writer_dropped_without_close_publishes_nothing(tfs):
    f = tfs.open("/abort/dropped", "wb", block_size=1000)
    f.write(b"x" * 3000)  # past the block size: handed to the handle, not committed
    del f
    gc.collect()
    deadline = time.monotonic() + 10  # the abort runs on the loop without the collector waiting
    while tfs.exists("/abort/dropped") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not tfs.exists("/abort/dropped")


def test_failed_put_and_transaction_discard_publish_nothing(tfs, tmp_path):
    tfs.pipe_file("/abort/put", b"previous")
    local = tmp_path / "shrinks.bin"
    local.write_bytes(os.urandom(3 * MiB))

    class Shrink(fsspec.callbacks.Callback):
        def call(self, *args, **kwargs):  # after the first block: the local file shrinks
            os.truncate(local, MiB + 1)

    with pytest.raises(OSError, match="short read"):
        tfs.put_file(str(local), "/abort/put", callback=Shrink())
    assert tfs.cat("/abort/put") == b"previous"
    with pytest.raises(Boom):
        with tfs.transaction:
            with tfs.open("/abort/in-transaction", "wb") as f:
                f.write(b"data")
            assert not tfs.cat("/abort/in-transaction")  # written, not yet published
            raise Boom
    assert not tfs.exists("/abort/in-transaction")
    with tfs.transaction:
        tfs.pipe_file("/abort/committed", b"kept")  # pipe does not join transactions: at once
        with tfs.open("/abort/in-transaction", "wb") as f:
            f.write(b"data")
    assert tfs.cat("/abort/in-transaction") == b"data"


# ---------------------------------------------------------------------- a real consumer


def test_pandas_parquet_round_trip(cluster, tfs):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    frame = pd.DataFrame({"step": range(10_000), "loss": [1.0 / (i + 1) for i in range(10_000)],
                          "tag": [f"r{i % 7}" for i in range(10_000)]})
    url = f"tectofs://{cluster.address}/tables/run-a/metrics.parquet"
    frame.to_parquet(url, engine="pyarrow")
    assert tfs.info("/tables/run-a/metrics.parquet")["size"] > 0
    back = pd.read_parquet(url, engine="pyarrow")
    pd.testing.assert_frame_equal(back, frame)
    subset = pd.read_parquet(url, engine="pyarrow", columns=["loss"])
    assert list(subset.columns) == ["loss"] and len(subset) == 10_000
