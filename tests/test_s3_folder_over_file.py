"""A folder key over an object of the same name, and the reverse (issue 52's checker): S3 keeps
both keys, and so does the gateway. A name cannot be both a file and a directory, so the
directory takes the name and the object moves to its twin ``.tectofs-object-<name>`` beside
it (one atomic rename; README "Keys as files"): no PUT of one key loses another's bytes,
whichever client wrote them, and the object takes its name back when the folder goes."""

from __future__ import annotations

import errno
from typing import Any, Iterator

import pytest

from tectofs.errors import TectofsError
from tests.conftest import TestCluster as ClusterWithClient
from tests.test_s3_gateway import _client

pytestmark = pytest.mark.slow  # a cluster and its gateway run as processes


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterWithClient]:
    cluster = ClusterWithClient(str(tmp_path_factory.mktemp("s3folders")), servers=1, policy="rep(1)", s3_port=0)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def s3(gateway: ClusterWithClient) -> Any:
    with open(gateway.s3_env_file) as f:
        env = dict(line.split("=", 1) for line in f.read().split())
    client = _client(f"http://{gateway.s3_address}", env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket="folders")
    return client


def _get(s3: Any, key: str) -> bytes:
    return bytes(s3.get_object(Bucket="folders", Key=key)["Body"].read())


def _keys(s3: Any, prefix: str) -> list[str]:
    return [o["Key"] for o in s3.list_objects_v2(Bucket="folders", Prefix=prefix).get("Contents", [])]


def test_a_folder_put_over_an_object_keeps_the_object(gateway: ClusterWithClient, s3: Any) -> None:
    s3.put_object(Bucket="folders", Key="d/f", Body=b"x")
    s3.put_object(Bucket="folders", Key="d/f/", Body=b"")
    assert (_get(s3, "d/f"), _get(s3, "d/f/")) == (b"x", b"")
    assert _keys(s3, "d/") == ["d/f", "d/f/"]
    assert gateway.fs.read_bytes("/folders/d/.tectofs-object-f") == b"x"  # what a mount shows meanwhile
    s3.delete_object(Bucket="folders", Key="d/f/")  # the folder goes: the object takes its name back
    assert gateway.fs.read_bytes("/folders/d/f") == b"x" and _keys(s3, "d/") == ["d/f"]


def test_an_object_put_over_a_folder_keeps_the_folder_and_its_keys(s3: Any) -> None:
    s3.put_object(Bucket="folders", Key="e/f/", Body=b"")
    s3.put_object(Bucket="folders", Key="e/f/g", Body=b"g")
    s3.put_object(Bucket="folders", Key="e/f", Body=b"F")
    assert [_get(s3, k) for k in ("e/f", "e/f/", "e/f/g")] == [b"F", b"", b"g"]
    assert _keys(s3, "e/") == ["e/f", "e/f/", "e/f/g"]


def test_a_key_below_an_object_keeps_the_object(s3: Any) -> None:
    s3.put_object(Bucket="folders", Key="h/f", Body=b"x")
    s3.put_object(Bucket="folders", Key="h/f/g", Body=b"g")
    assert (_get(s3, "h/f"), _get(s3, "h/f/g")) == (b"x", b"g")


def test_a_file_written_by_a_library_client_survives_a_folder_put(gateway: ClusterWithClient, s3: Any) -> None:
    gateway.fs.mkdir("/folders/p")
    gateway.fs.write_bytes("/folders/p/f", b"written by a client, no S3 record")
    s3.put_object(Bucket="folders", Key="p/f/", Body=b"")
    assert _get(s3, "p/f") == b"written by a client, no S3 record"
    s3.delete_object(Bucket="folders", Key="p/f/")
    assert gateway.fs.read_bytes("/folders/p/f") == b"written by a client, no S3 record"


def test_an_empty_folder_is_a_directory_holding_its_marker(gateway: ClusterWithClient, s3: Any) -> None:
    s3.put_object(Bucket="folders", Key="q/", Body=b"")
    with pytest.raises(TectofsError) as err:  # POSIX sees the marker file: rmdir is refused
        gateway.fs.rmdir("/folders/q")
    assert err.value.errno == errno.ENOTEMPTY
    assert gateway.fs.listdir("/folders/q") == [".tectofs-dir"]
