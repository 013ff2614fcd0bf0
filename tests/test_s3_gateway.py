"""The S3 gateway against real S3 clients (boto3, the aws CLI, s3fs) on a local cluster
started with its gateway (``LocalCluster(s3_port=0)``, what ``tectofs up --s3`` runs).

What is checked: bucket and object CRUD with the same bytes through S3 and the client
library; ranged gets; ListObjects v1/v2 paginated with prefix and delimiter against a model
of S3's order; a 200 MiB multipart upload (ETag as S3 computes it); presigned URLs; aws-chunked
uploads with per-chunk signatures; wrong signatures, unknown keys and unsigned requests refused;
POSIX permissions of the caller's tectofs user; a failed upload publishes nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Iterator

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tectofs.s3.principals import keys_of
from tectofs.wire import auth, messages
from tests.conftest import TestCluster as ClusterWithClient

MiB = 1 << 20
TIMEOUT_S = 30.0


def _client(endpoint: str, access: str, secret: str, **s3_config: Any) -> Any:
    config = Config(s3={"addressing_style": "path", **s3_config}, retries={"max_attempts": 1}, signature_version="s3v4",
                    connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                        region_name="us-east-1", config=config)


def _code(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterWithClient]:
    cluster = ClusterWithClient(str(tmp_path_factory.mktemp("s3cluster")), servers=6, policy="rs(4,2)", block_size=1 * MiB,
                          server_dead_after_s=2.0, heartbeat_interval_s=0.3, gc_delay_s=1.0, s3_port=0)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def root_keys(gateway: ClusterWithClient) -> tuple[str, str]:
    with open(gateway.s3_env_file) as f:
        env = dict(line.split("=", 1) for line in f.read().split())
    return env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]


@pytest.fixture(scope="module")
def s3(gateway: ClusterWithClient, root_keys: tuple[str, str]) -> Any:
    return _client(f"http://{gateway.s3_address}", *root_keys)


@pytest.fixture(scope="module")
def bob(gateway: ClusterWithClient) -> Any:
    """A second user (uid 1000), added while the gateway runs: it serves them at once (it asks
    the metadata service for their secret; no file is copied anywhere)."""
    reply = gateway.fs.run(gateway.fs.aio.metadata.user_add(messages.UserAddRequest(name="bob", uid=1000, gid=1000, groups=[])))
    credential = auth.Credential(user="bob", secret=reply.secret, cluster=gateway.address,
                                 s3_access_key=reply.user.s3_access_key or "", s3_secret_key=reply.s3_secret_key)
    credential.save(os.path.join(gateway.root, "bob.credentials"))  # bob's own copy, as `tectofs user add` writes it
    return _client(f"http://{gateway.s3_address}", *keys_of(credential))


def _bucket(s3: Any, name: str) -> str:
    s3.create_bucket(Bucket=name)
    return name


# ---------------------------------------------------------------------------- buckets and objects


def test_root_keys_file_and_bucket_crud(gateway: ClusterWithClient, s3: Any, root_keys: tuple[str, str]) -> None:
    assert os.stat(gateway.s3_env_file).st_mode & 0o777 == 0o600
    assert root_keys == keys_of(auth.Credential.load(gateway.credential_file))
    _bucket(s3, "crud")
    assert "crud" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket="crud")
    assert gateway.fs.stat("/crud").is_dir  # a bucket is a top-level directory
    s3.create_bucket(Bucket="crud")  # one's own bucket again: 200 in us-east-1, as S3 (test_s3_semantics: elsewhere)
    with pytest.raises(ClientError) as err:
        s3.create_bucket(Bucket="Bad_Name")
    assert _code(err) == "InvalidBucketName"
    s3.put_object(Bucket="crud", Key="x", Body=b"1")
    with pytest.raises(ClientError) as err:
        s3.delete_bucket(Bucket="crud")
    assert _code(err) == "BucketNotEmpty"
    s3.delete_object(Bucket="crud", Key="x")
    s3.delete_bucket(Bucket="crud")
    with pytest.raises(ClientError) as err:
        s3.head_bucket(Bucket="crud")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="crud", Key="x")
    assert _code(err) == "NoSuchBucket"


def test_a_put_into_a_missing_bucket_makes_no_bucket(gateway: ClusterWithClient, s3: Any) -> None:
    """A small PUT tries the write first and looks for the bucket only when that fails; a
    large one looks first. Either way: NoSuchBucket, and no bucket (no directory) is made."""
    for key, body in (("k", b"small"), ("deep/er/k", b"small"), ("k", os.urandom(MiB)), ("a/b", os.urandom(MiB))):
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket="nobucket", Key=key, Body=body)
        assert _code(err) == "NoSuchBucket", (key, len(body))
        assert not gateway.fs.exists("/nobucket")


def test_objects_are_files(gateway: ClusterWithClient, s3: Any) -> None:
    _bucket(s3, "same")
    data = os.urandom(3 * MiB + 123)
    put = s3.put_object(Bucket="same", Key="dir/sub/obj.bin", Body=data, ContentType="application/x-test",
                        Metadata={"step": "100"})
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    assert gateway.fs.read_bytes("/same/dir/sub/obj.bin") == data  # the same bytes through the client
    head = s3.head_object(Bucket="same", Key="dir/sub/obj.bin")
    assert (head["ContentLength"], head["ETag"], head["ContentType"], head["Metadata"]) == (
        len(data), put["ETag"], "application/x-test", {"step": "100"})
    got = s3.get_object(Bucket="same", Key="dir/sub/obj.bin")
    assert got["Body"].read() == data and got["ETag"] == put["ETag"]

    other = os.urandom(MiB)
    gateway.fs.write_bytes("/same/dir/sub/obj.bin", other)  # changed behind the gateway's back
    got = s3.get_object(Bucket="same", Key="dir/sub/obj.bin")
    assert got["Body"].read() == other and got["ETag"] != put["ETag"]

    copied = s3.copy_object(Bucket="same", Key="copy.bin", CopySource={"Bucket": "same", "Key": "dir/sub/obj.bin"})
    assert copied["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(other).hexdigest()}"'
    assert gateway.fs.read_bytes("/same/copy.bin") == other

    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="same", Key="missing")
    assert _code(err) == "NoSuchKey"
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="same", Key="dir")  # a prefix is no object
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404

    s3.put_object(Bucket="same", Key="empty", Body=b"")
    assert s3.get_object(Bucket="same", Key="empty")["Body"].read() == b""
    result = s3.delete_objects(Bucket="same", Delete={"Objects": [{"Key": "copy.bin"}, {"Key": "dir/sub/obj.bin"},
                                                                  {"Key": "never-was"}]})
    assert sorted(d["Key"] for d in result["Deleted"]) == ["copy.bin", "dir/sub/obj.bin", "never-was"]
    assert gateway.fs.listdir("/same") == ["empty"]  # emptied prefixes went with their keys


def test_ranged_gets(gateway: ClusterWithClient, s3: Any) -> None:
    _bucket(s3, "ranges")
    data = os.urandom(2 * MiB + 77)
    s3.put_object(Bucket="ranges", Key="r", Body=data)
    cases = {"bytes=0-0": data[:1], "bytes=10-19": data[10:20], "bytes=1048570-1048600": data[1048570:1048601],
             "bytes=2097100-": data[2097100:], "bytes=-5": data[-5:], f"bytes=5-{10 * len(data)}": data[5:]}
    for header, expected in cases.items():
        got = s3.get_object(Bucket="ranges", Key="r", Range=header)
        assert got["Body"].read() == expected, header
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
        assert got["ContentRange"].endswith(f"/{len(data)}")
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="ranges", Key="r", Range=f"bytes={len(data)}-")
    assert _code(err) == "InvalidRange" and err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416


# ---------------------------------------------------------------------------- listing


def _model_listing(keys: list[str], prefix: str, delimiter: str) -> list[str]:
    """What S3 lists: keys and common prefixes (ending with the delimiter), in order."""
    out: list[str] = []
    for key in sorted(k for k in keys if k.startswith(prefix)):
        at = key.find(delimiter, len(prefix)) if delimiter else -1
        entry = key if at < 0 else key[: at + len(delimiter)]
        if not out or out[-1] != entry:
            out.append(entry)
    return out


def test_paginated_listing_with_prefix_and_delimiter(s3: Any) -> None:
    _bucket(s3, "list")
    keys = ["a-b", "a.txt", "a/x", "a/y/z", "a/y/zz", "a/y-", "ab/c", "b/1", "b/2", "b/3/4", "c", "d/e/f/g",
            "zz/top", "a/x-", "é/ü"]
    keys += [f"many/{i:03d}" for i in range(25)]
    for key in keys:
        s3.put_object(Bucket="list", Key=key, Body=key.encode())
    paginator = s3.get_paginator("list_objects_v2")
    for prefix, delimiter in [("", ""), ("", "/"), ("a", "/"), ("a/", "/"), ("a/y", ""), ("many/", ""), ("b", "/"),
                              ("", "-"), ("a/", "y")]:
        for page_size in (1, 4, 1000):
            listed: list[str] = []
            for page in paginator.paginate(Bucket="list", Prefix=prefix, Delimiter=delimiter,
                                           PaginationConfig={"PageSize": page_size}):
                listed += [o["Key"] for o in page.get("Contents", [])]
                listed += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
                assert page["KeyCount"] <= page_size
            assert sorted(listed) == _model_listing(keys, prefix, delimiter), (prefix, delimiter, page_size)
    v1 = [o["Key"] for page in s3.get_paginator("list_objects").paginate(
        Bucket="list", PaginationConfig={"PageSize": 7}) for o in page.get("Contents", [])]
    assert v1 == sorted(keys)
    after = s3.list_objects_v2(Bucket="list", StartAfter="b/2")
    assert [o["Key"] for o in after["Contents"]] == [k for k in sorted(keys) if k > "b/2"]
    first = s3.list_objects_v2(Bucket="list", Prefix="many/", MaxKeys=3)
    assert first["Contents"][0]["ETag"] == f'"{hashlib.md5(b"many/000").hexdigest()}"'
    s3.put_object(Bucket="list", Key="c/under-an-object", Body=b"")  # "c" is now a prefix too (test_s3_semantics)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="list", Prefix="c")["Contents"]] == ["c", "c/under-an-object"]


# ---------------------------------------------------------------------------- refusals and permissions


def test_wrong_signatures_and_unknown_keys_are_refused(gateway: ClusterWithClient, root_keys: tuple[str, str]) -> None:
    endpoint = f"http://{gateway.s3_address}"
    with pytest.raises(ClientError) as err:
        _client(endpoint, root_keys[0], "0" * 64).list_buckets()
    assert _code(err) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as err:
        _client(endpoint, "nobody", root_keys[1]).list_buckets()
    assert _code(err) == "InvalidAccessKeyId"
    with pytest.raises(urllib.error.HTTPError) as http_err:
        urllib.request.urlopen(f"{endpoint}/", timeout=TIMEOUT_S)
    assert http_err.value.code == 403 and b"<Code>AccessDenied</Code>" in http_err.value.read()


def test_tampered_body_is_refused_and_not_published(gateway: ClusterWithClient, s3: Any, root_keys: tuple[str, str]) -> None:
    _bucket(s3, "tamper")
    request = AWSRequest("PUT", f"http://{gateway.s3_address}/tamper/k", data=b"signed body")
    S3SigV4Auth(Credentials(*root_keys), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(prepared.url, data=b"signed bodX", method="PUT",
                                                      headers=dict(prepared.headers)), timeout=TIMEOUT_S)
    assert b"XAmzContentSHA256Mismatch" in err.value.read()
    assert gateway.fs.listdir("/tamper") == []


def test_users_act_with_their_own_permissions(gateway: ClusterWithClient, s3: Any, bob: Any) -> None:
    _bucket(s3, "private")
    s3.put_object(Bucket="private", Key="secret", Body=b"root only")
    gateway.fs.chmod("/private/secret", 0o600)
    with pytest.raises(ClientError) as err:
        bob.get_object(Bucket="private", Key="secret")
    assert _code(err) == "AccessDenied"
    with pytest.raises(ClientError) as err:
        bob.put_object(Bucket="private", Key="mine", Body=b"x")  # the bucket is root's, 0755
    assert _code(err) == "AccessDenied"
    bob.create_bucket(Bucket="bobs")  # any S3 user may create a bucket (the gateway makes it): it is theirs
    assert (gateway.fs.stat("/bobs").uid, gateway.fs.stat("/bobs").mode & 0o777) == (1000, 0o755)
    with pytest.raises(ClientError) as err:
        bob.delete_bucket(Bucket="private")  # not theirs
    assert _code(err) == "AccessDenied"
    bob.delete_bucket(Bucket="bobs")
    _bucket(s3, "shared")
    gateway.fs.chmod("/shared", 0o777)
    bob.put_object(Bucket="shared", Key="from-bob", Body=b"hello")
    assert gateway.fs.stat("/shared/from-bob").uid == 1000
    assert bob.get_object(Bucket="shared", Key="from-bob")["Body"].read() == b"hello"
    stored = auth.Credential.load(os.path.join(gateway.root, "bob.credentials"))
    as_bob = _client(f"http://{gateway.s3_address}", stored.s3_access_key, stored.s3_secret_key)  # `user add`'s pair
    assert as_bob.get_object(Bucket="shared", Key="from-bob")["Body"].read() == b"hello"
    with pytest.raises(ClientError) as err:
        as_bob.get_object(Bucket="private", Key="secret")
    assert _code(err) == "AccessDenied"


def _interrupted_put(address: str, keys: tuple[str, str], path: str, declared: int, sent: int) -> None:
    """A PUT signed for ``declared`` unsigned bytes whose client goes away after ``sent``."""
    request = AWSRequest("PUT", f"http://{address}{path}", headers={"Content-Length": str(declared)})
    signer = S3SigV4Auth(Credentials(*keys), "s3", "us-east-1")
    signer.payload = lambda request: "UNSIGNED-PAYLOAD"  # type: ignore[method-assign]
    signer.add_auth(request)
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        head = f"PUT {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in request.headers.items())
        sock.sendall(head.encode() + b"\r\n" + os.urandom(sent))
        time.sleep(0.5)


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_failed_upload_publishes_nothing(gateway: ClusterWithClient, s3: Any, root_keys: tuple[str, str]) -> None:
    _bucket(s3, "atomic")
    s3.put_object(Bucket="atomic", Key="old", Body=b"previous version")
    _interrupted_put(gateway.s3_address, root_keys, "/atomic/new", 8 * MiB, 3 * MiB)
    _interrupted_put(gateway.s3_address, root_keys, "/atomic/old", 8 * MiB, 3 * MiB)
    _wait_for(lambda: gateway.fs.listdir("/atomic") == ["old"], "the staging files to be removed")
    assert s3.get_object(Bucket="atomic", Key="old")["Body"].read() == b"previous version"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="atomic")["Contents"]] == ["old"]


# ---------------------------------------------------------------------------- multipart


def test_multipart_upload_of_200_mib(gateway: ClusterWithClient, s3: Any) -> None:
    from boto3.s3.transfer import TransferConfig

    _bucket(s3, "big")
    gateway.fs.set_policy("/big", block_size=8 * MiB)  # what a checkpoint bucket would use
    data = os.urandom(200 * MiB)
    part = 8 * MiB
    s3.upload_fileobj(io.BytesIO(data), "big", "ckpt/model.bin",
                      Config=TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=4))
    digests = b"".join(hashlib.md5(data[i:i + part]).digest() for i in range(0, len(data), part))
    head = s3.head_object(Bucket="big", Key="ckpt/model.bin")
    assert head["ETag"] == f'"{hashlib.md5(digests).hexdigest()}-{len(data) // part}"'
    assert head["ContentLength"] == len(data)
    assert hashlib.sha256(gateway.fs.read_bytes("/big/ckpt/model.bin")).digest() == hashlib.sha256(data).digest()
    got = s3.get_object(Bucket="big", Key="ckpt/model.bin", Range=f"bytes={100 * MiB - 3}-{100 * MiB + 2}")
    assert got["Body"].read() == data[100 * MiB - 3:100 * MiB + 3]
    assert gateway.fs.listdir("/big") == ["ckpt"]  # the upload's parts (kept outside the bucket) are gone
    assert gateway.fs.listdir("/.tectofs-multipart/big/0") == []
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="big")["Contents"]] == ["ckpt/model.bin"]


def test_multipart_parts_list_abort_and_rules(gateway: ClusterWithClient, s3: Any) -> None:
    _bucket(s3, "parts")
    upload = s3.create_multipart_upload(Bucket="parts", Key="obj", ContentType="text/plain")["UploadId"]
    one = s3.upload_part(Bucket="parts", Key="obj", UploadId=upload, PartNumber=1, Body=b"x" * (5 * MiB))
    two = s3.upload_part(Bucket="parts", Key="obj", UploadId=upload, PartNumber=2, Body=b"tail")
    listed = s3.list_parts(Bucket="parts", Key="obj", UploadId=upload)["Parts"]
    assert [(p["PartNumber"], p["ETag"], p["Size"]) for p in listed] == [(1, one["ETag"], 5 * MiB), (2, two["ETag"], 4)]
    uploads = s3.list_multipart_uploads(Bucket="parts")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in uploads] == [("obj", upload)]
    assert "Contents" not in s3.list_objects_v2(Bucket="parts")  # nothing published yet, parts hidden
    three = s3.upload_part(Bucket="parts", Key="obj", UploadId=upload, PartNumber=3, Body=b"unused")
    refusals = {"EntityTooSmall": [(1, one), (2, two), (3, three)],  # every part but the last: 5 MiB or more
                "InvalidPartOrder": [(2, two), (1, one)]}
    for code, chosen in refusals.items():
        with pytest.raises(ClientError) as err:
            s3.complete_multipart_upload(Bucket="parts", Key="obj", UploadId=upload, MultipartUpload={"Parts": [
                {"PartNumber": n, "ETag": p["ETag"]} for n, p in chosen]})
        assert _code(err) == code
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket="parts", Key="obj", UploadId=upload, MultipartUpload={"Parts": [
            {"PartNumber": 1, "ETag": '"0123"'}]})
    assert _code(err) == "InvalidPart"
    done = s3.complete_multipart_upload(Bucket="parts", Key="obj", UploadId=upload, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": one["ETag"]}, {"PartNumber": 2, "ETag": two["ETag"]}]})
    assert done["ETag"].endswith('-2"')
    got = s3.get_object(Bucket="parts", Key="obj")
    assert got["Body"].read() == b"x" * (5 * MiB) + b"tail" and got["ContentType"] == "text/plain"

    aborted = s3.create_multipart_upload(Bucket="parts", Key="gone")["UploadId"]
    s3.upload_part(Bucket="parts", Key="gone", UploadId=aborted, PartNumber=1, Body=b"abc")
    s3.abort_multipart_upload(Bucket="parts", Key="gone", UploadId=aborted)
    with pytest.raises(ClientError) as err:
        s3.list_parts(Bucket="parts", Key="gone", UploadId=aborted)
    assert _code(err) == "NoSuchUpload"
    with pytest.raises(ClientError):
        s3.head_object(Bucket="parts", Key="gone")


# ---------------------------------------------------------------------------- presigned and aws-chunked


def test_presigned_urls(gateway: ClusterWithClient, s3: Any) -> None:
    _bucket(s3, "presign")
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": "presign", "Key": "up"}, ExpiresIn=60)
    with urllib.request.urlopen(urllib.request.Request(put_url, data=b"via a presigned PUT", method="PUT"),
                                timeout=TIMEOUT_S) as response:
        assert response.status == 200
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": "presign", "Key": "up"}, ExpiresIn=60)
    with urllib.request.urlopen(get_url, timeout=TIMEOUT_S) as response:
        assert response.read() == b"via a presigned PUT"
    for bad_url in (get_url.replace("X-Amz-Signature=", "X-Amz-Signature=00"),
                    get_url.replace("/presign/up", "/presign/other")):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad_url, timeout=TIMEOUT_S)
        assert err.value.code == 403 and b"SignatureDoesNotMatch" in err.value.read()
    expiring = s3.generate_presigned_url("get_object", Params={"Bucket": "presign", "Key": "up"}, ExpiresIn=1)
    time.sleep(2.1)
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(expiring, timeout=TIMEOUT_S)
    assert err.value.code == 403 and b"Request has expired" in err.value.read()


def _chunked_put(address: str, keys: tuple[str, str], path: str, data: bytes, chunk: int, corrupt: int = -1,
                 content_encoding: str = "aws-chunked") -> Any:
    """A PUT with ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``: the seed signature made by
    botocore's signer, each chunk's chained to it (computed here, as AWS documents it);
    chunk ``corrupt`` gets a wrong signature. Returns (status, body)."""
    pieces = [data[i:i + chunk] for i in range(0, len(data), chunk)] + [b""]
    signature_line = len(";chunk-signature=") + 64 + 4
    encoded_length = sum(len(f"{len(p):x}") + signature_line + len(p) for p in pieces)
    request = AWSRequest("PUT", f"http://{address}{path}", headers={
        "Content-Encoding": content_encoding, "x-amz-decoded-content-length": str(len(data)),
        "Content-Length": str(encoded_length)})
    signer = S3SigV4Auth(Credentials(*keys), "s3", "us-east-1")
    signer.payload = lambda request: "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"  # type: ignore[method-assign]
    signer.add_auth(request)
    amz_date = request.headers["X-Amz-Date"]
    scope = f"{amz_date[:8]}/us-east-1/s3/aws4_request"
    key = ("AWS4" + keys[1]).encode()
    for part in (amz_date[:8], "us-east-1", "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    previous = request.headers["Authorization"].rsplit("Signature=", 1)[1]
    body = b""
    for i, piece in enumerate(pieces):
        to_sign = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, hashlib.sha256(b"").hexdigest(),
                             hashlib.sha256(piece).hexdigest()])
        previous = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
        sent = "0" * 64 if i == corrupt else previous
        body += f"{len(piece):x};chunk-signature={sent}\r\n".encode() + piece + b"\r\n"
    assert len(body) == encoded_length
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://{address}{path}", data=body, method="PUT",
                                                           headers=dict(request.headers)), timeout=TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_chunk_decoder_takes_any_piece_boundaries(rng: Any) -> None:
    """The aws-chunked decoder (sans-I/O), fed the same signed body cut at random places."""
    from tectofs.s3 import sigv4
    from tectofs.s3.xml import S3Error

    signed = sigv4.SignedRequest("root", "20260101", "us-east-1", "20260101T000000Z", ("host",), "ab" * 32,
                                 sigv4.STREAMING_SIGNED)
    key = sigv4.signing_key("secret", signed.date, signed.region)
    data = rng.randbytes(200_000)
    body, previous = b"", signed.signature
    for piece in [data[i:i + 65536] for i in range(0, len(data), 65536)] + [b""]:
        previous = sigv4.chunk_signature(key, signed, previous, hashlib.sha256(piece).hexdigest())
        body += f"{len(piece):x};chunk-signature={previous}\r\n".encode() + piece + b"\r\n"
    for damage in (None, 70_000):
        raw = bytearray(body)
        if damage is not None:
            raw[damage] ^= 1
        decoder, out, cut = sigv4.ChunkDecoder(signed, key), bytearray(), 0
        try:
            while cut < len(raw):
                step = rng.choice([1, 2, 7, 100, 4096, 70_000])
                out += b"".join(bytes(p) for p in decoder.feed(bytes(raw[cut:cut + step])))
                cut += step
            decoder.finish()
        except S3Error as exc:
            assert damage is not None and exc.code == "SignatureDoesNotMatch"
            continue
        assert damage is None and bytes(out) == data


def test_streaming_signed_chunks(gateway: ClusterWithClient, s3: Any, root_keys: tuple[str, str]) -> None:
    _bucket(s3, "chunked")
    data = os.urandom(3 * MiB + 5)
    assert _chunked_put(gateway.s3_address, root_keys, "/chunked/good", data, 64 * 1024)[0] == 200
    assert s3.get_object(Bucket="chunked", Key="good")["Body"].read() == data
    status, body = _chunked_put(gateway.s3_address, root_keys, "/chunked/bad", data, 64 * 1024, corrupt=20)
    assert status == 403 and b"SignatureDoesNotMatch" in body
    assert gateway.fs.listdir("/chunked") == ["good"]  # nothing of the refused body was published
    unsigned = _client(f"http://{gateway.s3_address}", *root_keys, payload_signing_enabled=False)
    unsigned.put_object(Bucket="chunked", Key="unsigned", Body=b"unsigned payload")
    assert s3.get_object(Bucket="chunked", Key="unsigned")["Body"].read() == b"unsigned payload"


# ---------------------------------------------------------------------------- other clients and the CLI


def aws_cli(address: str, keys: tuple[str, str], home: Any) -> Callable[..., str]:
    """The aws CLI against the gateway at ``address`` as the owner of ``keys`` (no config
    read from ``home``): ``run(*args, ok=True)`` asserts how it exits and returns its stdout
    (with its stderr, for a run expected to fail)."""
    aws = shutil.which("aws")
    assert aws is not None, "the aws CLI (awscli) is not installed"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": keys[0], "AWS_SECRET_ACCESS_KEY": keys[1],
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_CONFIG_FILE": str(home / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(home / "none")}

    def run(*args: str, ok: bool = True) -> str:
        done = subprocess.run([aws, "--endpoint-url", f"http://{address}", *args], env=env, capture_output=True,
                              text=True, timeout=120)
        assert (done.returncode == 0) == ok, (args, done.stdout, done.stderr)
        return done.stdout if ok else done.stdout + done.stderr

    return run


@pytest.mark.slow  # starts processes
def test_aws_cli(gateway: ClusterWithClient, tmp_path: Any, root_keys: tuple[str, str]) -> None:
    aws_run = aws_cli(gateway.s3_address, root_keys, tmp_path)
    source = tmp_path / "data.bin"
    source.write_bytes(os.urandom(20 * MiB + 3))  # over the CLI's 8 MiB threshold: a multipart upload
    aws_run("s3", "mb", "s3://cli")
    aws_run("s3", "cp", str(source), "s3://cli/dir/data.bin")
    assert gateway.fs.read_bytes("/cli/dir/data.bin") == source.read_bytes()
    assert "data.bin" in aws_run("s3", "ls", "s3://cli/dir/")
    aws_run("s3", "cp", "s3://cli/dir/data.bin", str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    aws_run("s3", "cp", "s3://cli/dir/data.bin", "s3://cli/copy.bin")  # a multipart copy: UploadPartCopy
    assert gateway.fs.read_bytes("/cli/copy.bin") == source.read_bytes()
    listed = json.loads(aws_run("s3api", "list-objects-v2", "--bucket", "cli"))["Contents"]
    assert [(o["Key"], o["ETag"][-3:]) for o in listed] == [("copy.bin", '-3"'), ("dir/data.bin", '-3"')]
    aws_run("s3", "rm", "--recursive", "s3://cli/")
    aws_run("s3", "rb", "s3://cli")


def test_s3fs_reads_through_the_gateway(gateway: ClusterWithClient, s3: Any, root_keys: tuple[str, str]) -> None:
    try:
        import s3fs
    except ImportError:
        pytest.fail("s3fs is not installed: pip install s3fs (with the installed botocore pinned)", pytrace=False)
    _bucket(s3, "fsspec")
    data = os.urandom(MiB + 9)
    gateway.fs.mkdir("/fsspec/nested")
    gateway.fs.write_bytes("/fsspec/nested/file.bin", data)  # written through the client, read through s3fs
    fs = s3fs.S3FileSystem(key=root_keys[0], secret=root_keys[1], client_kwargs={
        "endpoint_url": f"http://{gateway.s3_address}", "region_name": "us-east-1"}, skip_instance_cache=True)
    assert fs.ls("fsspec/nested", detail=False) == ["fsspec/nested/file.bin"]
    assert fs.cat("fsspec/nested/file.bin") == data
    with fs.open("fsspec/nested/file.bin", "rb") as f:
        f.seek(1000)
        assert f.read(100) == data[1000:1100]
    fs.pipe("fsspec/written.txt", b"through s3fs")
    assert gateway.fs.read_bytes("/fsspec/written.txt") == b"through s3fs"


@pytest.mark.slow  # starts processes
def test_cli_prints_keys(gateway: ClusterWithClient, bob: Any, tmp_path: Any) -> None:
    credential = os.path.join(gateway.root, "bob.credentials")
    for args in (["--credentials", credential], ["--key-file", gateway.key_file]):
        done = subprocess.run([sys.executable, "-m", "tectofs.cli", "s3", "keys", *args], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        expected = keys_of(auth.Credential.load(credential) if args[0] == "--credentials" else
                           auth.Credential.load(gateway.credential_file))
        assert done.stdout == f"AWS_ACCESS_KEY_ID={expected[0]}\nAWS_SECRET_ACCESS_KEY={expected[1]}\n"
