"""The S3 semantics clients rely on (issue 33), each checked with boto3 against a cluster
started with its gateway, the answer compared with what S3 documents:

- multipart: a Complete sent again answers the same success (also after a crash between
  publishing and removing the upload); a re-sent part listed twice; GET/HEAD ``?partNumber=N``
  with PartsCount and part ranges (one part for a single-part object); UploadPartCopy ranges
  refused when improper (InvalidArgument) or outside the source (InvalidRange); 10,000 parts;
- conditional requests: If-Modified-Since / If-Unmodified-Since with If-Match / If-None-Match
  precedence on GET and HEAD, CopyObject's ``x-amz-copy-source-if-*``;
- headers: Cache-Control, Expires, Content-Encoding, Content-Language, Content-Disposition
  kept; ``response-*`` overrides; ``aws-chunked`` taken out of Content-Encoding;
- a body sent with ``Transfer-Encoding: chunked`` and no Content-Length;
- keys: directory markers (``a/``) as objects; a key that is also a prefix (``a`` and
  ``a/b``); ``encoding-type=url`` as S3 escapes;
- buckets and auth: CreateBucket of one's own bucket; copying from another user's bucket
  into one's own; presigned URLs (SigV2 as boto3 makes by default, and SigV4 expiry limits);
- the aws CLI, for those of them it has commands for.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from tectofs.s3.server import S3Gateway
from tests import test_s3_gateway as base
from tests.conftest import TestCluster as ClusterWithClient
from tests.test_s3_gateway import TIMEOUT_S, MiB, _chunked_put, _client, _code, aws_cli

# the cluster, its gateway and the boto3 clients of root and bob: test_s3_gateway's fixtures
gateway, root_keys, s3, bob = base.gateway, base.root_keys, base.s3, base.bob

pytestmark = pytest.mark.slow  # a cluster and its gateway run as processes


def _status(err: pytest.ExceptionInfo[ClientError]) -> int:
    return int(err.value.response["ResponseMetadata"]["HTTPStatusCode"])


def _http_date(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(int(seconds), tz=datetime.timezone.utc)


def _upload(s3: Any, bucket: str, key: str, parts: list[bytes]) -> tuple[str, list[dict[str, Any]]]:
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    listed = [{"PartNumber": n, "ETag": s3.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n,
                                                      Body=body)["ETag"]} for n, body in enumerate(parts, 1)]
    return upload, listed


# ---------------------------------------------------------------------------- multipart


def test_complete_sent_again_answers_the_same_success(gateway: ClusterWithClient, s3: Any) -> None:
    s3.create_bucket(Bucket="again")
    parts = [os.urandom(5 * MiB), b"tail"]
    upload, listed = _upload(s3, "again", "obj", parts)
    first = s3.complete_multipart_upload(Bucket="again", Key="obj", UploadId=upload, MultipartUpload={"Parts": listed})
    second = s3.complete_multipart_upload(Bucket="again", Key="obj", UploadId=upload, MultipartUpload={"Parts": listed})
    assert second["ETag"] == first["ETag"] and first["ETag"].endswith('-2"')
    assert s3.get_object(Bucket="again", Key="obj")["Body"].read() == b"".join(parts)
    with pytest.raises(ClientError) as err:  # the upload itself is gone, as in S3
        s3.list_parts(Bucket="again", Key="obj", UploadId=upload)
    assert _code(err) == "NoSuchUpload"

    # a crash after the object was published and before the upload was removed: the upload
    # directory is still there; a retry answers success and removes it
    upload, listed = _upload(s3, "again", "crash", [b"only part"])
    kept = f"/.tectofs-multipart/again/0/{upload}"  # root's uploads in the staging area
    gateway.fs.mkdir(f"/.tectofs-multipart/again/0/saved-{upload}")
    gateway.fs.link(f"{kept}/part-00001", f"/.tectofs-multipart/again/0/saved-{upload}/part-00001")
    done = s3.complete_multipart_upload(Bucket="again", Key="crash", UploadId=upload, MultipartUpload={"Parts": listed})
    gateway.fs.rename(f"/.tectofs-multipart/again/0/saved-{upload}", kept)  # as if the removal never ran
    gateway.fs.setxattr(kept, "user.s3.upload", b'{"key": "crash", "content_type": "x/y", "metadata": {}}')
    retried = s3.complete_multipart_upload(Bucket="again", Key="crash", UploadId=upload, MultipartUpload={"Parts": listed})
    assert retried["ETag"] == done["ETag"]
    assert not gateway.fs.exists(kept)
    assert s3.get_object(Bucket="again", Key="crash")["Body"].read() == b"only part"

    # once the key holds another object, the upload is unknown again
    s3.put_object(Bucket="again", Key="obj", Body=b"replaced")
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(Bucket="again", Key="obj", UploadId=upload, MultipartUpload={"Parts": listed})
    assert _code(err) == "NoSuchUpload"


def test_parts_resent_in_any_order(s3: Any) -> None:
    s3.create_bucket(Bucket="resend")
    first, second, third, again = (os.urandom(5 * MiB) for _ in range(4))
    upload, listed = _upload(s3, "resend", "obj", [first, second, third])
    resent = s3.upload_part(Bucket="resend", Key="obj", UploadId=upload, PartNumber=1, Body=again)["ETag"]
    # a client that lists every answer it got, by part number: part 1 twice (the stale one first)
    answers = sorted(listed + [{"PartNumber": 1, "ETag": resent}], key=lambda p: p["PartNumber"])
    with pytest.raises(ClientError) as err:  # out of order: S3's InvalidPartOrder
        s3.complete_multipart_upload(Bucket="resend", Key="obj", UploadId=upload,
                                     MultipartUpload={"Parts": answers[::-1]})
    assert _code(err) == "InvalidPartOrder"
    with pytest.raises(ClientError) as err:  # only the stale ETag of part 1: not the part stored
        s3.complete_multipart_upload(Bucket="resend", Key="obj", UploadId=upload, MultipartUpload={"Parts": listed})
    assert _code(err) == "InvalidPart"
    done = s3.complete_multipart_upload(Bucket="resend", Key="obj", UploadId=upload, MultipartUpload={"Parts": answers})
    assert done["ETag"].endswith('-3"')
    assert s3.get_object(Bucket="resend", Key="obj")["Body"].read() == again + second + third

    upload, listed = _upload(s3, "resend", "other", [first, second])  # part 2 re-sent, finishing last
    listed[1]["ETag"] = s3.upload_part(Bucket="resend", Key="other", UploadId=upload, PartNumber=2, Body=third)["ETag"]
    s3.complete_multipart_upload(Bucket="resend", Key="other", UploadId=upload, MultipartUpload={"Parts": listed})
    assert s3.get_object(Bucket="resend", Key="other")["Body"].read() == first + third


def test_get_and_head_by_part_number(s3: Any) -> None:
    s3.create_bucket(Bucket="partnum")
    parts = [os.urandom(5 * MiB), os.urandom(5 * MiB), b"last part"]
    upload, listed = _upload(s3, "partnum", "multi", parts)
    s3.complete_multipart_upload(Bucket="partnum", Key="multi", UploadId=upload, MultipartUpload={"Parts": listed})
    total = sum(map(len, parts))
    for number, body in enumerate(parts, 1):
        start = sum(map(len, parts[: number - 1]))
        got = s3.get_object(Bucket="partnum", Key="multi", PartNumber=number)
        assert got["Body"].read() == body
        assert (got["PartsCount"], got["ContentLength"], got["ResponseMetadata"]["HTTPStatusCode"]) == (3, len(body), 206)
        assert got["ContentRange"] == f"bytes {start}-{start + len(body) - 1}/{total}"
        head = s3.head_object(Bucket="partnum", Key="multi", PartNumber=number)
        assert (head["PartsCount"], head["ContentLength"], head["ContentRange"]) == (3, len(body), got["ContentRange"])
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as err:
            call(Bucket="partnum", Key="multi", PartNumber=4)
        assert _status(err) == 416

    s3.put_object(Bucket="partnum", Key="single", Body=b"one part")
    got = s3.get_object(Bucket="partnum", Key="single", PartNumber=1)
    assert got["Body"].read() == b"one part" and "PartsCount" not in got
    assert (got["ContentRange"], got["ResponseMetadata"]["HTTPStatusCode"]) == ("bytes 0-7/8", 206)  # as S3
    assert s3.head_object(Bucket="partnum", Key="single", PartNumber=1)["ContentLength"] == 8
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="partnum", Key="single", PartNumber=2)
    assert _code(err) == "InvalidPartNumber" and _status(err) == 416
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="partnum", Key="single", PartNumber=1, Range="bytes=0-1")
    assert _code(err) == "InvalidRequest"


def test_upload_part_copy_ranges(s3: Any) -> None:
    s3.create_bucket(Bucket="partcopy")
    source = os.urandom(6 * MiB)
    s3.put_object(Bucket="partcopy", Key="src", Body=source)
    upload = s3.create_multipart_upload(Bucket="partcopy", Key="dst")["UploadId"]
    copy = {"Bucket": "partcopy", "Key": "src"}
    for bad in ("bytes=1-0", "bytes=-5", "bytes=5-", "bytes=0-1-2", "0-5", "bytes=a-b"):
        with pytest.raises(ClientError) as err:
            s3.upload_part_copy(Bucket="partcopy", Key="dst", UploadId=upload, PartNumber=1, CopySource=copy,
                                CopySourceRange=bad)
        assert (_code(err), _status(err)) == ("InvalidArgument", 400), bad
    with pytest.raises(ClientError) as err:
        s3.upload_part_copy(Bucket="partcopy", Key="dst", UploadId=upload, PartNumber=1, CopySource=copy,
                            CopySourceRange=f"bytes=0-{len(source)}")  # one byte past the end
    assert _code(err) == "InvalidRange"
    one = s3.upload_part_copy(Bucket="partcopy", Key="dst", UploadId=upload, PartNumber=1, CopySource=copy,
                              CopySourceRange=f"bytes=0-{5 * MiB - 1}")["CopyPartResult"]["ETag"]
    two = s3.upload_part_copy(Bucket="partcopy", Key="dst", UploadId=upload, PartNumber=2, CopySource=copy,
                              CopySourceRange=f"bytes={5 * MiB}-{len(source) - 1}")["CopyPartResult"]["ETag"]
    s3.complete_multipart_upload(Bucket="partcopy", Key="dst", UploadId=upload, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": one}, {"PartNumber": 2, "ETag": two}]})
    assert s3.get_object(Bucket="partcopy", Key="dst")["Body"].read() == source


@pytest.fixture(scope="module")
def small_parts_gateway(gateway: ClusterWithClient, root_keys: tuple[str, str]) -> Iterator[tuple[Any, str]]:
    """A second gateway on the same cluster, in this process, whose minimum part size is one
    byte (S3's 5 MiB would make 10,000 parts 50 GB): a boto3 client of it, and its address."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = S3Gateway(gateway.address, gateway.key_file, part_bytes_min=1)
    address = asyncio.run_coroutine_threadsafe(server.start(), loop).result(TIMEOUT_S)
    try:
        yield _client(f"http://{address}", *root_keys), address
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(TIMEOUT_S)
        loop.close()


def test_ten_thousand_parts(s3: Any, small_parts_gateway: tuple[Any, str], root_keys: tuple[str, str]) -> None:
    """S3's most parts in one upload. The 10,000 UploadParts go as SigV4-signed requests on
    kept-alive connections (boto3 spends ~10 ms of CPU on each, most of this test's time
    when it sent them); list, complete and the reads go through boto3."""
    tiny, address = small_parts_gateway
    s3.create_bucket(Bucket="tenthousand")
    upload = tiny.create_multipart_upload(Bucket="tenthousand", Key="obj")["UploadId"]
    bodies = [f"<{n}>".encode() for n in range(1, 10_001)]
    connections, opened = threading.local(), []  # one kept-alive connection per sending thread
    started = time.monotonic()

    def send(number: int) -> dict[str, Any]:
        if not hasattr(connections, "http"):
            host, port = address.rsplit(":", 1)
            connections.http = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
            opened.append(connections.http)
        path = f"/tenthousand/obj?partNumber={number}&uploadId={upload}"
        body = bodies[number - 1]
        connections.http.request("PUT", path, body=body, headers=_signed_headers(
            address, root_keys, path, {"Content-Length": str(len(body))}))
        answer = connections.http.getresponse()
        assert (answer.status, answer.read()) == (200, b""), number
        return {"PartNumber": number, "ETag": answer.getheader("ETag")}

    try:
        with ThreadPoolExecutor(4) as pool:
            listed = list(pool.map(send, range(1, 10_001)))
    finally:
        for connection in opened:
            connection.close()
    assert listed[41]["ETag"] == f'"{hashlib.md5(bodies[41]).hexdigest()}"'
    uploaded = time.monotonic() - started
    parts_seen = sum(len(page.get("Parts", [])) for page in tiny.get_paginator("list_parts").paginate(
        Bucket="tenthousand", Key="obj", UploadId=upload))
    assert parts_seen == 10_000
    done = tiny.complete_multipart_upload(Bucket="tenthousand", Key="obj", UploadId=upload,
                                          MultipartUpload={"Parts": listed})
    completed = time.monotonic() - started - uploaded
    print(f"10,000 parts: uploaded in {uploaded:.1f} s, completed in {completed:.1f} s")
    digest = hashlib.md5(b"".join(hashlib.md5(b).digest() for b in bodies)).hexdigest()
    assert done["ETag"] == f'"{digest}-10000"'
    assert s3.get_object(Bucket="tenthousand", Key="obj")["Body"].read() == b"".join(bodies)
    last = s3.get_object(Bucket="tenthousand", Key="obj", PartNumber=10_000)
    assert (last["Body"].read(), last["PartsCount"]) == (b"<10000>", 10_000)
    upload2, listed2 = _upload(s3, "tenthousand", "small", [b"a", b"b"])
    with pytest.raises(ClientError) as err:  # the usual gateway keeps S3's 5 MiB minimum
        s3.complete_multipart_upload(Bucket="tenthousand", Key="small", UploadId=upload2,
                                     MultipartUpload={"Parts": listed2})
    assert _code(err) == "EntityTooSmall"


# ---------------------------------------------------------------------------- conditional requests


def test_conditional_get_and_head(s3: Any) -> None:
    s3.create_bucket(Bucket="conditions")
    etag = s3.put_object(Bucket="conditions", Key="k", Body=b"conditional")["ETag"]
    modified = s3.head_object(Bucket="conditions", Key="k")["LastModified"].timestamp()
    before, after = _http_date(modified - 3600), _http_date(modified + 3600)
    other = '"0123456789abcdef0123456789abcdef"'
    # (conditions, expected status) per S3's documented precedence
    cases: list[tuple[dict[str, Any], int]] = [
        ({"IfModifiedSince": before}, 200),
        ({"IfModifiedSince": after}, 304),
        ({"IfUnmodifiedSince": after}, 200),
        ({"IfUnmodifiedSince": before}, 412),
        ({"IfMatch": etag, "IfUnmodifiedSince": before}, 200),  # If-Match true wins over If-Unmodified-Since false
        ({"IfMatch": other, "IfUnmodifiedSince": after}, 412),
        ({"IfNoneMatch": other, "IfModifiedSince": after}, 200),  # If-None-Match false wins over If-Modified-Since
        ({"IfNoneMatch": etag, "IfModifiedSince": before}, 304),
        ({"IfMatch": etag, "IfNoneMatch": etag}, 304),
        ({"IfMatch": other, "IfNoneMatch": etag}, 412),  # 412 before 304
        ({"IfModifiedSince": after, "IfUnmodifiedSince": before}, 412),
        ({"IfMatch": "*"}, 200),
    ]
    for conditions, expected in cases:
        for call in (s3.get_object, s3.head_object):
            try:
                answer = call(Bucket="conditions", Key="k", **conditions)
                status = answer["ResponseMetadata"]["HTTPStatusCode"]
                if call is s3.get_object:
                    assert answer["Body"].read() == b"conditional"
            except ClientError as exc:
                status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
                if status == 412 and call is s3.get_object:
                    assert exc.response["Error"]["Code"] == "PreconditionFailed"
            assert status == expected, (call.__name__, conditions)


def test_copy_source_conditions(s3: Any) -> None:
    s3.create_bucket(Bucket="copyif")
    etag = s3.put_object(Bucket="copyif", Key="src", Body=b"source")["ETag"]
    modified = s3.head_object(Bucket="copyif", Key="src")["LastModified"].timestamp()
    before, after = _http_date(modified - 3600), _http_date(modified + 3600)
    source = {"Bucket": "copyif", "Key": "src"}
    refused = [{"CopySourceIfMatch": '"0123"'}, {"CopySourceIfNoneMatch": etag},
               {"CopySourceIfModifiedSince": after}, {"CopySourceIfUnmodifiedSince": before},
               {"CopySourceIfNoneMatch": etag, "CopySourceIfModifiedSince": before}]
    for conditions in refused:
        with pytest.raises(ClientError) as err:
            s3.copy_object(Bucket="copyif", Key="dst", CopySource=source, **conditions)
        assert (_code(err), _status(err)) == ("PreconditionFailed", 412), conditions
    with pytest.raises(ClientError):
        s3.head_object(Bucket="copyif", Key="dst")  # nothing was copied
    accepted = [{"CopySourceIfMatch": etag}, {"CopySourceIfNoneMatch": '"0123"'},
                {"CopySourceIfModifiedSince": before}, {"CopySourceIfUnmodifiedSince": after},
                {"CopySourceIfMatch": etag, "CopySourceIfUnmodifiedSince": before},
                {"CopySourceIfNoneMatch": '"0123"', "CopySourceIfModifiedSince": after}]
    for n, conditions in enumerate(accepted):
        s3.copy_object(Bucket="copyif", Key=f"dst{n}", CopySource=source, **conditions)
        assert s3.get_object(Bucket="copyif", Key=f"dst{n}")["Body"].read() == b"source", conditions


# ---------------------------------------------------------------------------- headers


STORED = {"CacheControl": "max-age=3600", "ContentDisposition": 'attachment; filename="x.bin"',
          "ContentEncoding": "gzip", "ContentLanguage": "de-CH", "Expires": datetime.datetime(2030, 1, 2, 3, 4, 5,
                                                                                               tzinfo=datetime.timezone.utc)}


def _stored_of(answer: dict[str, Any]) -> dict[str, Any]:
    return {name: answer.get(name) for name in STORED}


def test_headers_set_at_put_are_returned(s3: Any) -> None:
    s3.create_bucket(Bucket="headers")
    s3.put_object(Bucket="headers", Key="small", Body=b"z", **STORED)
    s3.put_object(Bucket="headers", Key="large", Body=os.urandom(3 * MiB), **STORED)  # the staged path
    upload = s3.create_multipart_upload(Bucket="headers", Key="multi", **STORED)["UploadId"]
    etag = s3.upload_part(Bucket="headers", Key="multi", UploadId=upload, PartNumber=1, Body=b"m")["ETag"]
    s3.complete_multipart_upload(Bucket="headers", Key="multi", UploadId=upload,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    s3.copy_object(Bucket="headers", Key="copied", CopySource={"Bucket": "headers", "Key": "small"})
    for key in ("small", "large", "multi", "copied"):
        assert _stored_of(s3.head_object(Bucket="headers", Key=key)) == STORED, key
        got = s3.get_object(Bucket="headers", Key=key)
        got["Body"].read()
        assert _stored_of(got) == STORED, key
    s3.copy_object(Bucket="headers", Key="replaced", CopySource={"Bucket": "headers", "Key": "small"},
                   MetadataDirective="REPLACE", CacheControl="no-cache")
    head = s3.head_object(Bucket="headers", Key="replaced")
    assert head["CacheControl"] == "no-cache" and "ContentEncoding" not in head


def test_response_overrides(s3: Any) -> None:
    s3.create_bucket(Bucket="overrides")
    s3.put_object(Bucket="overrides", Key="k", Body=b"body", ContentType="text/plain", **STORED)
    overrides = {"ResponseContentType": "application/json", "ResponseContentLanguage": "fr",
                 "ResponseExpires": datetime.datetime(2031, 1, 1, tzinfo=datetime.timezone.utc),
                 "ResponseCacheControl": "no-store", "ResponseContentDisposition": "inline",
                 "ResponseContentEncoding": "identity"}
    got = s3.get_object(Bucket="overrides", Key="k", **overrides)
    assert got["Body"].read() == b"body"
    assert (got["ContentType"], got["ContentLanguage"], got["CacheControl"], got["ContentDisposition"],
            got["ContentEncoding"]) == ("application/json", "fr", "no-store", "inline", "identity")
    assert got["Expires"] == overrides["ResponseExpires"]
    plain = s3.get_object(Bucket="overrides", Key="k")
    assert plain["ContentType"] == "text/plain" and _stored_of(plain) == STORED  # nothing stored changed


def test_aws_chunked_is_not_stored_as_content_encoding(gateway: ClusterWithClient, s3: Any,
                                                       root_keys: tuple[str, str]) -> None:
    s3.create_bucket(Bucket="awschunked")
    data = os.urandom(100_000)
    for key, sent, kept in (("plain", "aws-chunked", None), ("gzipped", "aws-chunked,gzip", "gzip"),
                            ("both", "gzip, aws-chunked", "gzip")):
        status, body = _chunked_put(gateway.s3_address, root_keys, f"/awschunked/{key}", data, 30_000,
                                    content_encoding=sent)
        assert status == 200, body
        got = s3.get_object(Bucket="awschunked", Key=key)
        assert got["Body"].read() == data  # the chunk framing is decoded, not stored
        assert got.get("ContentEncoding") == kept, sent


def _signed_headers(address: str, keys: tuple[str, str], path: str, headers: dict[str, str]) -> dict[str, str]:
    """``headers`` with a SigV4 Authorization for a PUT of ``path`` (which may carry a query)
    with an unsigned payload."""
    request = AWSRequest("PUT", f"http://{address}{path}", headers=headers)
    signer = S3SigV4Auth(Credentials(*keys), "s3", "us-east-1")
    signer.payload = lambda request: "UNSIGNED-PAYLOAD"  # type: ignore[method-assign]
    signer.add_auth(request)
    return dict(request.headers)


def test_upload_without_content_length(gateway: ClusterWithClient, s3: Any, root_keys: tuple[str, str]) -> None:
    """``Transfer-Encoding: chunked``, no Content-Length: accepted, small or large; one whose
    sender goes away before the last chunk publishes nothing; with neither, S3's
    MissingContentLength."""
    s3.create_bucket(Bucket="tchunked")
    host, port = gateway.s3_address.rsplit(":", 1)
    for key, data in (("small", b"streamed without a length"), ("large", os.urandom(3 * MiB + 1))):
        headers = _signed_headers(gateway.s3_address, root_keys, f"/tchunked/{key}", {"Transfer-Encoding": "chunked"})
        connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
        try:
            connection.request("PUT", f"/tchunked/{key}", body=iter([data[i:i + 65536]
                                                                     for i in range(0, len(data), 65536)]),
                               headers=headers, encode_chunked=True)
            answer = connection.getresponse()
            assert answer.status == 200, answer.read()
            assert answer.getheader("ETag") == f'"{hashlib.md5(data).hexdigest()}"'
        finally:
            connection.close()
        assert s3.get_object(Bucket="tchunked", Key=key)["Body"].read() == data

    headers = _signed_headers(gateway.s3_address, root_keys, "/tchunked/cut", {"Transfer-Encoding": "chunked"})
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        head = "PUT /tchunked/cut HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        piece = os.urandom(2 * MiB)
        sock.sendall(head.encode() + b"\r\n" + f"{len(piece):x}\r\n".encode() + piece + b"\r\n")  # no last chunk
        time.sleep(0.5)
    deadline = time.monotonic() + TIMEOUT_S
    while gateway.fs.listdir("/tchunked") != ["large", "small"]:  # the staging file goes
        assert time.monotonic() < deadline, gateway.fs.listdir("/tchunked")
        time.sleep(0.1)
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="tchunked", Key="cut")
    assert _status(err) == 404

    headers = _signed_headers(gateway.s3_address, root_keys, "/tchunked/none", {})
    connection = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        connection.putrequest("PUT", "/tchunked/none", skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        assert (answer.status, b"<Code>MissingContentLength</Code>" in answer.read()) == (411, True)
    finally:
        connection.close()


# ---------------------------------------------------------------------------- keys


def test_directory_markers(gateway: ClusterWithClient, s3: Any) -> None:
    s3.create_bucket(Bucket="markers")
    s3.put_object(Bucket="markers", Key="dir/", Body=b"")
    s3.put_object(Bucket="markers", Key="dir/sub/", Body=b"", Metadata={"kind": "folder"})
    s3.put_object(Bucket="markers", Key="dir/file", Body=b"f")
    s3.put_object(Bucket="markers", Key="dir/-early", Body=b"e")  # sorts before the marker's file name
    s3.put_object(Bucket="markers", Key="full/", Body=b"a marker with bytes")
    assert gateway.fs.stat("/markers/dir").is_dir  # a prefix stays a directory
    head = s3.head_object(Bucket="markers", Key="dir/sub/")
    assert (head["ContentLength"], head["Metadata"]) == (0, {"kind": "folder"})
    assert s3.get_object(Bucket="markers", Key="full/")["Body"].read() == b"a marker with bytes"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="markers")["Contents"]]
    assert keys == ["dir/", "dir/-early", "dir/file", "dir/sub/", "full/"]
    for page_size in (1, 2):  # pages that end on a marker resume after it
        paged = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket="markers", PaginationConfig={"PageSize": page_size}) for o in page.get("Contents", [])]
        assert paged == keys
    top = s3.list_objects_v2(Bucket="markers", Delimiter="/")
    assert "Contents" not in top and [p["Prefix"] for p in top["CommonPrefixes"]] == ["dir/", "full/"]
    inside = s3.list_objects_v2(Bucket="markers", Prefix="dir/", Delimiter="/")
    assert [o["Key"] for o in inside["Contents"]] == ["dir/", "dir/-early", "dir/file"]  # as S3 lists a marker
    assert [p["Prefix"] for p in inside["CommonPrefixes"]] == ["dir/sub/"]
    s3.delete_object(Bucket="markers", Key="dir/sub/")  # the marker goes, and its empty directory
    assert not gateway.fs.exists("/markers/dir/sub")
    s3.delete_object(Bucket="markers", Key="dir/")
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="markers", Prefix="dir")["Contents"]] == [
        "dir/-early", "dir/file"]
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="markers", Key="dir/")
    assert _status(err) == 404


def test_object_and_prefix_of_the_same_name(gateway: ClusterWithClient, s3: Any) -> None:
    """``a`` and ``a/b`` both: ``/bucket/a`` is the directory, the object ``a`` its twin."""
    s3.create_bucket(Bucket="both")
    s3.put_object(Bucket="both", Key="a", Body=b"object a")
    s3.put_object(Bucket="both", Key="a/b", Body=b"below a")  # turns the file a into its twin
    s3.put_object(Bucket="both", Key="x/y", Body=b"below x")
    s3.put_object(Bucket="both", Key="x", Body=os.urandom(3 * MiB))  # the directory first; a staged write
    big = os.urandom(3 * MiB)
    s3.put_object(Bucket="both", Key="x", Body=big)  # overwritten while a twin
    for key in ("a-b", "a.txt", "a/", "m"):
        s3.put_object(Bucket="both", Key=key, Body=key.encode())
    assert gateway.fs.stat("/both/a").is_dir and gateway.fs.stat("/both/.tectofs-object-a").is_file
    assert s3.get_object(Bucket="both", Key="a")["Body"].read() == b"object a"
    assert s3.get_object(Bucket="both", Key="x")["Body"].read() == big
    assert s3.head_object(Bucket="both", Key="x")["ETag"] == f'"{hashlib.md5(big).hexdigest()}"'
    keys = ["a", "a-b", "a.txt", "a/", "a/b", "m", "x", "x/y"]
    for page_size in (1, 3, 1000):
        listed = [o["Key"] for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket="both", PaginationConfig={"PageSize": page_size}) for o in page.get("Contents", [])]
        assert listed == keys, page_size
    first = s3.list_objects_v2(Bucket="both")["Contents"][0]
    assert (first["Key"], first["ETag"], first["Size"]) == ("a", f'"{hashlib.md5(b"object a").hexdigest()}"', 8)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="both", StartAfter="m")["Contents"]] == ["x", "x/y"]
    top = s3.list_objects_v2(Bucket="both", Delimiter="/")
    assert [o["Key"] for o in top["Contents"]] == ["a", "a-b", "a.txt", "m", "x"]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["a/", "x/"]
    s3.copy_object(Bucket="both", Key="m/n", CopySource={"Bucket": "both", "Key": "a"})
    assert s3.get_object(Bucket="both", Key="m")["Body"].read() == b"m"
    assert s3.get_object(Bucket="both", Key="m/n")["Body"].read() == b"object a"

    s3.delete_objects(Bucket="both", Delete={"Objects": [{"Key": "a/b"}, {"Key": "a/"}]})
    assert gateway.fs.stat("/both/a").is_file  # its directory gone, the twin took its name back
    assert not gateway.fs.exists("/both/.tectofs-object-a")
    assert s3.get_object(Bucket="both", Key="a")["Body"].read() == b"object a"
    s3.delete_object(Bucket="both", Key="x")  # the object goes, the keys below it stay
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="both", Key="x")
    assert _code(err) == "NoSuchKey"
    assert s3.get_object(Bucket="both", Key="x/y")["Body"].read() == b"below x"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="both")["Contents"]] == [
        "a", "a-b", "a.txt", "m", "m/n", "x/y"]

    upload, listed = _upload(s3, "both", "x", [b"assembled onto a directory's name"])
    s3.complete_multipart_upload(Bucket="both", Key="x", UploadId=upload, MultipartUpload={"Parts": listed})
    again = s3.complete_multipart_upload(Bucket="both", Key="x", UploadId=upload, MultipartUpload={"Parts": listed})
    assert again["ETag"].endswith('-1"')
    assert s3.get_object(Bucket="both", Key="x")["Body"].read() == b"assembled onto a directory's name"


def test_url_encoded_listing(s3: Any) -> None:
    s3.create_bucket(Bucket="encoded")
    keys = ["line\nbreak", "carriage\rreturn", "sp ace+plus", "tilde~star*", "é/ü", "amp&lt<"]
    for key in keys:
        s3.put_object(Bucket="encoded", Key=key, Body=b"x")
    # boto3 asks for encoding-type=url and decodes: every key comes back as it was
    assert [o["Key"] for o in s3.list_objects_v2(Bucket="encoded")["Contents"]] == sorted(keys, key=str.encode)
    assert [o["Key"] for o in s3.list_objects(Bucket="encoded")["Contents"]] == sorted(keys, key=str.encode)
    raw = s3.list_objects_v2(Bucket="encoded", EncodingType="url")  # asked explicitly: botocore leaves it as sent
    assert [o["Key"] for o in raw["Contents"]] == ["amp%26lt%3C", "carriage%0Dreturn", "line%0Abreak",
                                                   "sp+ace%2Bplus", "tilde%7Estar*", "%C3%A9/%C3%BC"]
    listed = s3.list_objects_v2(Bucket="encoded", Delimiter="\n")
    assert [p["Prefix"] for p in listed["CommonPrefixes"]] == ["line\n"]
    assert len(listed["Contents"]) == len(keys) - 1
    # without encoding, a carriage return survives XML (written &#13;)
    unencoded = _client(s3.meta.endpoint_url, *_keys_of(s3))
    unencoded.meta.events.unregister("before-parameter-build.s3.ListObjectsV2",
                                     unique_id="set-list-objects-encoding-type")
    found = [o["Key"] for o in unencoded.list_objects_v2(Bucket="encoded")["Contents"]]
    assert "carriage\rreturn" in found


def _keys_of(client: Any) -> tuple[str, str]:
    credentials = client._request_signer._credentials
    return credentials.access_key, credentials.secret_key


# ---------------------------------------------------------------------------- buckets and auth


def test_create_own_bucket_again(gateway: ClusterWithClient, root_keys: tuple[str, str], s3: Any, bob: Any) -> None:
    s3.create_bucket(Bucket="mine")
    assert s3.create_bucket(Bucket="mine")["ResponseMetadata"]["HTTPStatusCode"] == 200  # us-east-1
    elsewhere = boto3.client("s3", endpoint_url=f"http://{gateway.s3_address}", aws_access_key_id=root_keys[0],
                             aws_secret_access_key=root_keys[1], region_name="eu-west-1",
                             config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
    with pytest.raises(ClientError) as err:
        elsewhere.create_bucket(Bucket="mine", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    assert (_code(err), _status(err)) == ("BucketAlreadyOwnedByYou", 409)
    with pytest.raises(ClientError) as err:
        bob.create_bucket(Bucket="mine")
    assert (_code(err), _status(err)) == ("BucketAlreadyExists", 409)


def test_copy_from_another_users_bucket(gateway: ClusterWithClient, s3: Any, bob: Any) -> None:
    s3.create_bucket(Bucket="roots")
    s3.put_object(Bucket="roots", Key="readable", Body=b"anyone may read", CacheControl="public")
    s3.put_object(Bucket="roots", Key="secret", Body=b"root only")
    gateway.fs.chmod("/roots/secret", 0o600)
    bob.create_bucket(Bucket="bobs-copies")
    bob.copy_object(Bucket="bobs-copies", Key="copy", CopySource={"Bucket": "roots", "Key": "readable"})
    got = bob.get_object(Bucket="bobs-copies", Key="copy")
    assert (got["Body"].read(), got["CacheControl"]) == (b"anyone may read", "public")
    assert gateway.fs.stat("/bobs-copies/copy").uid == 1000
    with pytest.raises(ClientError) as err:
        bob.copy_object(Bucket="bobs-copies", Key="stolen", CopySource={"Bucket": "roots", "Key": "secret"})
    assert _code(err) == "AccessDenied"
    with pytest.raises(ClientError) as err:
        bob.copy_object(Bucket="roots", Key="planted", CopySource={"Bucket": "bobs-copies", "Key": "copy"})
    assert _code(err) == "AccessDenied"


def _status_of(url: str, method: str = "GET", data: bytes | None = None,
               headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers or {}),
                                    timeout=TIMEOUT_S) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_presigned_url_expiry_limits(gateway: ClusterWithClient, s3: Any) -> None:
    s3.create_bucket(Bucket="presigned")
    s3.put_object(Bucket="presigned", Key="k", Body=b"presigned body")
    good = s3.generate_presigned_url("get_object", Params={"Bucket": "presigned", "Key": "k"}, ExpiresIn=3600)
    assert _status_of(good) == (200, b"presigned body")
    week = s3.generate_presigned_url("get_object", Params={"Bucket": "presigned", "Key": "k"}, ExpiresIn=604800)
    assert _status_of(week) == (200, b"presigned body")
    for expires in ("0", "-1", "604801"):
        status, body = _status_of(good.replace("X-Amz-Expires=3600", f"X-Amz-Expires={expires}"))
        assert status == 403 and b"<Code>AuthorizationQueryParametersError</Code>" in body, expires


def test_presigned_urls_as_boto3_makes_them_by_default(gateway: ClusterWithClient, root_keys: tuple[str, str]) -> None:
    """boto3 without ``signature_version="s3v4"`` presigns with SigV2 (AWSAccessKeyId,
    Expires, Signature): accepted until it expires, refused when tampered with."""
    plain = boto3.client("s3", endpoint_url=f"http://{gateway.s3_address}", aws_access_key_id=root_keys[0],
                         aws_secret_access_key=root_keys[1], region_name="us-east-1")
    plain.create_bucket(Bucket="sigvtwo")
    plain.put_object(Bucket="sigvtwo", Key="a key+with/odd chars", Body=b"v2 body", ContentType="text/plain")
    params = {"Bucket": "sigvtwo", "Key": "a key+with/odd chars"}
    url = plain.generate_presigned_url("get_object", Params=params, ExpiresIn=600)
    assert "AWSAccessKeyId=" in url and "X-Amz-Signature" not in url
    assert _status_of(url) == (200, b"v2 body")
    overridden = plain.generate_presigned_url("get_object", Params={**params, "ResponseContentType": "x/y"})
    with urllib.request.urlopen(overridden, timeout=TIMEOUT_S) as answer:
        assert answer.headers["Content-Type"] == "x/y"
    put_url = plain.generate_presigned_url("put_object", Params={"Bucket": "sigvtwo", "Key": "uploaded"})
    # (SigV2 signs the Content-Type: none was signed, so none is sent, rather than urllib's default)
    assert _status_of(put_url, "PUT", b"put through v2", {"Content-Type": ""})[0] == 200
    assert plain.get_object(Bucket="sigvtwo", Key="uploaded")["Body"].read() == b"put through v2"
    status, body = _status_of(url.replace("/sigvtwo/", "/sigvtwo/x"))
    assert status == 403 and b"SignatureDoesNotMatch" in body
    expiring = plain.generate_presigned_url("get_object", Params=params, ExpiresIn=1)
    time.sleep(2.1)
    status, body = _status_of(expiring)
    assert status == 403 and b"Request has expired" in body


# ---------------------------------------------------------------------------- the aws CLI


def test_aws_cli_sees_the_same(gateway: ClusterWithClient, tmp_path: Any, root_keys: tuple[str, str]) -> None:
    """The behaviours above where the aws CLI has a command of its own."""
    aws_run = aws_cli(gateway.s3_address, root_keys, tmp_path)
    aws_run("s3api", "create-bucket", "--bucket", "clisem")
    aws_run("s3api", "create-bucket", "--bucket", "clisem")  # one's own again: success in us-east-1
    source = tmp_path / "body.txt"
    source.write_bytes(b"from the cli")
    aws_run("s3api", "put-object", "--bucket", "clisem", "--key", "k", "--body", str(source), "--cache-control",
            "max-age=60", "--content-disposition", "inline", "--content-language", "en")
    head = json.loads(aws_run("s3api", "head-object", "--bucket", "clisem", "--key", "k", "--part-number", "1"))
    assert (head["CacheControl"], head["ContentDisposition"], head["ContentLanguage"], head["ContentLength"]) == (
        "max-age=60", "inline", "en", 12)
    later = (datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "304" in aws_run("s3api", "get-object", "--bucket", "clisem", "--key", "k", "--if-modified-since", later,
                            str(tmp_path / "out"), ok=False)
    aws_run("s3api", "put-object", "--bucket", "clisem", "--key", "folder/")
    assert "PRE folder/" in aws_run("s3", "ls", "s3://clisem/")
    listed = json.loads(aws_run("s3api", "list-objects-v2", "--bucket", "clisem", "--prefix", "folder/"))
    assert [o["Key"] for o in listed["Contents"]] == ["folder/"]
    url = aws_run("s3", "presign", "s3://clisem/k", "--expires-in", "300").strip()
    assert _status_of(url) == (200, b"from the cli")
