"""Multipart uploads cannot be used against other users (issue 51, part 3): real processes (a
local cluster with its S3 gateway), users made with ``tectofs user add``, boto3; each attack
checked on what is in the namespace afterwards, not only on the error code.

- A CreateMultipartUpload the caller may not make leaves nothing anywhere (it made a mode-1777
  directory inside root's 0700 directory, as root, before checking).
- An upload alice leaves pending in bob's bucket neither shows in bob's bucket (its directory,
  ListObjects) nor keeps bob from deleting it; bob, the bucket's owner, lists and aborts it.
- Alice's upload completes where she may write, as her file.
- The staging area: no user reads, lists, overwrites, aborts or crowds out another's uploads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Iterator

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tectofs.wire import auth
from tests.conftest import TestCluster as Cluster

MiB = 1 << 20
AREA = "/.tectofs-multipart"

pytestmark = pytest.mark.slow


def _client(cluster: Cluster, access: str, secret: str) -> Any:
    config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, signature_version="s3v4",
                    connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=f"http://{cluster.s3_address}", aws_access_key_id=access,
                        aws_secret_access_key=secret, region_name="us-east-1", config=config)


def _code(err: pytest.ExceptionInfo[ClientError]) -> str:
    return str(err.value.response["Error"]["Code"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = Cluster(str(tmp_path_factory.mktemp("s3safety")), servers=3, policy="rs(2,1)", block_size=1 * MiB,
                          server_dead_after_s=2.0, heartbeat_interval_s=0.3, gc_delay_s=1.0, s3_port=0)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def users(gateway: Cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """alice (uid 3001), bob (3002) and carol (3003), each made with `tectofs user add`, as
    S3 clients with the key pair it wrote into their credential file."""
    directory = tmp_path_factory.mktemp("users")
    made = {}
    for name, uid in (("alice", 3001), ("bob", 3002), ("carol", 3003)):
        path = os.path.join(directory, f"{name}.credentials")
        subprocess.run([sys.executable, "-m", "tectofs.cli", "user", "add", name, "--uid", str(uid), "--gid", str(uid),
                        "--out", path], env={**os.environ, "TECTOFS_META": gateway.address}, check=True,
                       capture_output=True, timeout=60)
        credential = auth.Credential.load(path)
        made[name] = _client(gateway, credential.s3_access_key, credential.s3_secret_key)
    return made


def _staged(gateway: Cluster) -> list[str]:
    """Every path below the staging area (as root sees it)."""
    found: list[str] = []

    def walk(path: str) -> None:
        for name, st in gateway.fs.scandir(path):
            found.append(f"{path}/{name}")
            if st.is_dir:
                walk(f"{path}/{name}")

    if gateway.fs.exists(AREA):
        walk(AREA)
    return found


def test_a_refused_upload_leaves_nothing_behind(gateway: Cluster, users: dict[str, Any]) -> None:
    gateway.fs.mkdir("/data", mode=0o700)
    gateway.fs.chmod("/data", 0o700)
    gateway.fs.write_bytes("/data/keep", b"root's")
    before = gateway.fs.listdir("/data"), _staged(gateway)
    for key in ("x", "deep/er/x"):
        with pytest.raises(ClientError) as err:
            users["alice"].create_multipart_upload(Bucket="data", Key=key)
        assert _code(err) == "AccessDenied", key
    assert (gateway.fs.listdir("/data"), _staged(gateway)) == before  # nothing made, in /data or anywhere
    assert gateway.fs.stat("/data").mode & 0o7777 == 0o700

    gateway.fs.mkdir("/ro", mode=0o755)  # readable by alice, not writable: refused too
    with pytest.raises(ClientError) as err:
        users["alice"].create_multipart_upload(Bucket="ro", Key="x")
    assert _code(err) == "AccessDenied"
    assert gateway.fs.listdir("/ro") == [] and _staged(gateway) == before[1]


def test_a_pending_upload_in_someone_elses_bucket(gateway: Cluster, users: dict[str, Any]) -> None:
    alice, bob = users["alice"], users["bob"]
    bob.create_bucket(Bucket="bobs")
    gateway.fs.chmod("/bobs", 0o777)  # bob lets others write into it
    upload = alice.create_multipart_upload(Bucket="bobs", Key="from-alice")["UploadId"]
    alice.upload_part(Bucket="bobs", Key="from-alice", UploadId=upload, PartNumber=1, Body=b"alice's part")
    assert gateway.fs.listdir("/bobs") == []  # nothing in bob's directory
    assert "Contents" not in bob.list_objects_v2(Bucket="bobs")
    assert "Contents" not in bob.list_objects(Bucket="bobs")

    # bob, the bucket's owner, sees it and may abort it (as S3 lets a bucket owner)
    listed = bob.list_multipart_uploads(Bucket="bobs").get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("from-alice", upload)]
    assert [p["PartNumber"] for p in bob.list_parts(Bucket="bobs", Key="from-alice", UploadId=upload)["Parts"]] == [1]
    bob.abort_multipart_upload(Bucket="bobs", Key="from-alice", UploadId=upload)
    assert "Uploads" not in bob.list_multipart_uploads(Bucket="bobs")
    assert not [p for p in _staged(gateway) if upload in p]
    with pytest.raises(ClientError) as err:
        alice.upload_part(Bucket="bobs", Key="from-alice", UploadId=upload, PartNumber=2, Body=b"more")
    assert _code(err) == "NoSuchUpload"

    # a pending upload does not keep bob from deleting his (object-less) bucket; it goes with it
    pending = alice.create_multipart_upload(Bucket="bobs", Key="again")["UploadId"]
    alice.upload_part(Bucket="bobs", Key="again", UploadId=pending, PartNumber=1, Body=b"x")
    bob.delete_bucket(Bucket="bobs")
    assert not gateway.fs.exists("/bobs")
    assert not [p for p in _staged(gateway) if "/bobs" in p]

    # ... and does not come back in a new bucket of that name
    users["carol"].create_bucket(Bucket="bobs")
    assert "Uploads" not in users["carol"].list_multipart_uploads(Bucket="bobs")
    with pytest.raises(ClientError) as err:
        alice.upload_part(Bucket="bobs", Key="again", UploadId=pending, PartNumber=2, Body=b"y")
    assert _code(err) in ("NoSuchUpload", "AccessDenied")
    users["carol"].delete_bucket(Bucket="bobs")


def test_a_completed_upload_where_alice_may_write(gateway: Cluster, users: dict[str, Any]) -> None:
    alice, bob = users["alice"], users["bob"]
    bob.create_bucket(Bucket="shared-mp")
    gateway.fs.chmod("/shared-mp", 0o777)
    first, last = os.urandom(5 * MiB), b"tail"
    upload = alice.create_multipart_upload(Bucket="shared-mp", Key="dir/obj", ContentType="text/x")["UploadId"]
    etags = [alice.upload_part(Bucket="shared-mp", Key="dir/obj", UploadId=upload, PartNumber=n, Body=body)["ETag"]
             for n, body in ((1, first), (2, last))]
    alice.complete_multipart_upload(Bucket="shared-mp", Key="dir/obj", UploadId=upload, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": e} for n, e in zip((1, 2), etags)]})
    got = bob.get_object(Bucket="shared-mp", Key="dir/obj")
    assert got["Body"].read() == first + last and got["ContentType"] == "text/x"
    assert gateway.fs.stat("/shared-mp/dir/obj").uid == 3001  # her file, written as her
    assert gateway.fs.listdir("/shared-mp") == ["dir"] and gateway.fs.listdir("/shared-mp/dir") == ["obj"]
    assert not [p for p in _staged(gateway) if upload in p]  # its parts are gone


def test_nobody_abuses_anothers_staged_upload(gateway: Cluster, users: dict[str, Any]) -> None:
    alice, carol = users["alice"], users["carol"]
    alice.create_bucket(Bucket="open-mp")
    gateway.fs.chmod("/open-mp", 0o777)  # carol may write objects here, but she does not own the bucket
    upload = alice.create_multipart_upload(Bucket="open-mp", Key="k")["UploadId"]
    part = alice.upload_part(Bucket="open-mp", Key="k", UploadId=upload, PartNumber=1, Body=b"alice's secret")["ETag"]
    mine = carol.create_multipart_upload(Bucket="open-mp", Key="c")["UploadId"]

    # carol can neither list alice's upload, nor read, overwrite, complete or abort it
    assert [u["UploadId"] for u in carol.list_multipart_uploads(Bucket="open-mp")["Uploads"]] == [mine]
    attacks = [
        lambda: carol.list_parts(Bucket="open-mp", Key="k", UploadId=upload),
        lambda: carol.upload_part(Bucket="open-mp", Key="k", UploadId=upload, PartNumber=1, Body=b"carol's"),
        lambda: carol.upload_part_copy(Bucket="open-mp", Key="k", UploadId=upload, PartNumber=2,
                                       CopySource={"Bucket": "open-mp", "Key": "k"}),
        lambda: carol.complete_multipart_upload(Bucket="open-mp", Key="k", UploadId=upload,
                                                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part}]}),
        lambda: carol.abort_multipart_upload(Bucket="open-mp", Key="k", UploadId=upload),
    ]
    for attack in attacks:
        with pytest.raises(ClientError) as err:
            attack()
        assert _code(err) in ("AccessDenied", "NoSuchUpload", "NoSuchKey")
    assert [p["ETag"] for p in alice.list_parts(Bucket="open-mp", Key="k", UploadId=upload)["Parts"]] == [part]

    # on disk: the area is root's, not listable; each user's uploads are in a directory of theirs alone
    area = gateway.fs.stat(AREA)
    assert (area.uid, area.mode & 0o7777) == (0, 0o711)
    assert (gateway.fs.stat(f"{AREA}/open-mp").uid, gateway.fs.stat(f"{AREA}/open-mp").mode & 0o7777) == (0, 0o711)
    for uid in (3001, 3003):
        st = gateway.fs.stat(f"{AREA}/open-mp/{uid}")
        assert (st.uid, st.gid, st.mode & 0o7777) == (uid, uid, 0o700)
    parts = [p for p in _staged(gateway) if upload in p and p.endswith("part-00001")]
    assert len(parts) == 1 and gateway.fs.read_bytes(parts[0]) == b"alice's secret"
    assert gateway.fs.stat(parts[0]).uid == 3001  # written as alice: counted as hers
    carol_fs = gateway.fs.acting_as(3003, 3003)
    for path in (AREA, f"{AREA}/open-mp", f"{AREA}/open-mp/3001"):
        with pytest.raises(PermissionError):
            carol_fs.listdir(path)
    with pytest.raises(PermissionError):
        carol_fs.read_bytes(parts[0])
    with pytest.raises(PermissionError):  # nor crowd it: nothing of hers can go where alice's uploads are
        carol_fs.mkdir(f"{AREA}/open-mp/3001/{'0' * 32}-3001")
    with pytest.raises(PermissionError):
        carol_fs.mkdir(f"{AREA}/open-mp/3001-squat")

    # a made-up upload id leads nowhere
    for made_up in ("0" * 32, "../3001", f"{'0' * 32}-3001", upload.replace("-3001", "-0")):
        with pytest.raises(ClientError) as err:
            carol.list_parts(Bucket="open-mp", Key="k", UploadId=made_up)
        assert _code(err) in ("NoSuchUpload", "AccessDenied"), made_up
    alice.abort_multipart_upload(Bucket="open-mp", Key="k", UploadId=upload)
    carol.abort_multipart_upload(Bucket="open-mp", Key="c", UploadId=mine)
    alice.delete_bucket(Bucket="open-mp")


def test_uploads_an_older_gateway_left_in_a_bucket(gateway: Cluster, users: dict[str, Any]) -> None:
    """Older gateways staged in ``/<bucket>/.tectofs-multipart`` (mode 1777): a bucket left
    with only that is deleted (each upload removed as its owner); one with objects is not."""
    bob = users["bob"]
    bob.create_bucket(Bucket="legacy")
    gateway.fs.chmod("/legacy", 0o777)
    gateway.fs.mkdir("/legacy/.tectofs-multipart", mode=0o1777)
    gateway.fs.chmod("/legacy/.tectofs-multipart", 0o1777)
    as_alice = gateway.fs.acting_as(3001, 3001)
    as_alice.mkdir(f"/legacy/.tectofs-multipart/{'a' * 32}", mode=0o700)
    as_alice.write_bytes(f"/legacy/.tectofs-multipart/{'a' * 32}/part-00001", b"old part")
    bob.put_object(Bucket="legacy", Key="obj", Body=b"x")
    with pytest.raises(ClientError) as err:
        bob.delete_bucket(Bucket="legacy")
    assert _code(err) == "BucketNotEmpty"
    assert gateway.fs.listdir(f"/legacy/.tectofs-multipart/{'a' * 32}") == ["part-00001"]  # kept while refused
    bob.delete_object(Bucket="legacy", Key="obj")
    bob.delete_bucket(Bucket="legacy")
    assert not gateway.fs.exists("/legacy")
