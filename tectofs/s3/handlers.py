"""The S3 operations: one function per operation, from an authenticated :class:`Call`
to an aiohttp response. Object bytes stream through (:mod:`.objects`, :mod:`.body`); errors
are raised as :class:`~tectofs.s3.xml.S3Error` (the server renders them).

Buckets are the top-level directories (S3's naming rules apply to new ones); the caller's
tectofs identity decides what it may see and change (the metadata service checks POSIX
permissions on every call).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any, Awaitable
from urllib.parse import quote_plus, unquote

from aiohttp import web

from tectofs import errors
from tectofs.client import AsyncFileSystem

from . import body, listing, multipart, objects, sigv4, staging
from . import headers as s3headers
from . import xml as s3xml
from .objects import Record
from .principals import Principal
from .xml import S3Error, from_tectofs

# What a request carries between the gateway and its handlers (typed keys: aiohttp >= 3.14)
REQUEST_ID = web.RequestKey("request_id", str)  # answered as x-amz-request-id and in error documents
STREAMING = web.RequestKey("streaming", bool)  # the status went out: an error can only cut the answer short

BUCKET_NAME = re.compile(r"(?=.{3,63}$)[a-z0-9][a-z0-9.-]*[a-z0-9]")
LIST_KEYS_MAX = 1000
SMALL_BODY_MAX = s3xml.BODY_MAX_BYTES
KEEPALIVE_S = 10.0  # a long Complete or Copy sends a space this often


@dataclass
class Call:
    """One authenticated request: who (``principal``, acting through ``fs``), on what
    (``bucket``, ``key``: empty for the service and bucket levels), with which signature
    (``signed``, ``signing_key``: the body's checks need them)."""

    request: web.Request
    fs: AsyncFileSystem
    gateway_fs: AsyncFileSystem
    principal: Principal
    signed: sigv4.SignedRequest | None
    signing_key: bytes | None
    bucket: str
    key: str
    query: dict[str, str] = field(default_factory=dict)
    part_bytes_min: int = multipart.PART_BYTES_MIN  # the gateway's (S3's 5 MiB unless a test says otherwise)

    @property
    def resource(self) -> str:
        return f"/{self.bucket}/{self.key}" if self.key else f"/{self.bucket}"

    def body(self, md5: Any = None) -> Any:
        return body.pieces(self.request, self.signed, self.signing_key, md5)

    async def upload_fs(self, owner_may: bool = False) -> AsyncFileSystem:
        """The view that acts on the request's upload: the caller's if they started it; with
        ``owner_may`` (list its parts, abort it) the initiator's when the caller owns the
        bucket or is root (:func:`~tectofs.s3.staging.view_for`)."""
        return await staging.view_for(self.fs, self.gateway_fs, self.principal, self.bucket, self.query["uploadId"],
                                      owner_may)

    async def small_body(self) -> bytes:
        return await body.read_all(self.request, self.signed, self.signing_key, SMALL_BODY_MAX)

    def int_query(self, name: str, default: int, low: int = 0, high: int = LIST_KEYS_MAX) -> int:
        text = self.query.get(name)
        if text is None or text == "":
            return default
        try:
            value = int(text)
        except ValueError:
            raise S3Error("InvalidArgument", f"{name} must be an integer") from None
        if value < low:
            raise S3Error("InvalidArgument", f"{name} must be at least {low}")
        return min(value, high)


def xml_response(root: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=s3xml.render(root), status=status, content_type="application/xml", headers=headers)


async def slow_xml(call: Call, work: Awaitable[Any]) -> web.StreamResponse:
    """Answer an operation that may run for minutes (assembling or copying gigabytes) the
    way S3 does: status 200 and the XML declaration at once, a space every
    :data:`KEEPALIVE_S` while ``work`` runs (so clients' read timeouts do not fire), then
    the document ``work`` returns — or, if it fails, the error document (botocore reads an
    error in a 200 answer of CompleteMultipartUpload and CopyObject). ``work`` runs to its
    end even if the client goes away."""
    task = asyncio.ensure_future(work)
    response = web.StreamResponse(status=200, headers={"Content-Type": "application/xml"})
    call.request[STREAMING] = True
    try:
        await response.prepare(call.request)
        await response.write(b'<?xml version="1.0" encoding="UTF-8"?>\n')
        while not task.done():
            await asyncio.wait([task], timeout=KEEPALIVE_S)
            if not task.done():
                await response.write(b" ")
    except (ConnectionError, asyncio.CancelledError):
        await asyncio.shield(asyncio.wait([task]))  # the client went away: finish what was asked anyway
        raise
    try:
        document = task.result()
    except (S3Error, errors.TectofsError) as exc:
        error = exc if isinstance(exc, S3Error) else from_tectofs(exc, call.resource)
        document = s3xml.document("Error", [("Code", error.code), ("Message", error.message),
                                            ("Resource", call.resource), ("RequestId", call.request[REQUEST_ID])],
                                  namespace=False)
    await response.write(ET.tostring(document, encoding="utf-8"))
    await response.write_eof()
    return response


def quoted(etag: str) -> str:
    return f'"{etag}"'


def _user_metadata(request: web.Request) -> dict[str, str]:
    return {k[len("x-amz-meta-"):].lower(): v for k, v in request.headers.items() if k.lower().startswith("x-amz-meta-")}


def _object_headers(st: Any, record: Record) -> dict[str, str]:
    headers = {"ETag": quoted(record.etag), "Last-Modified": s3xml.http_date(st.mtime), "Accept-Ranges": "bytes",
               "Content-Type": record.content_type, **record.headers}
    headers.update({f"x-amz-meta-{k}": v for k, v in record.metadata.items()})
    return headers


# ---------------------------------------------------------------------------- service and buckets


async def list_buckets(call: Call) -> web.Response:
    root = s3xml.document("ListAllMyBucketsResult")
    s3xml.owner(root, call.principal.uid, call.principal.name)
    buckets = s3xml.child(root, "Buckets")
    for name, st in await call.fs.scandir("/"):
        if st.is_dir and BUCKET_NAME.fullmatch(name):
            s3xml.child(buckets, "Bucket", [("Name", name), ("CreationDate", s3xml.timestamp(st.ctime))])
    return xml_response(root)


async def create_bucket(call: Call) -> web.Response:
    """Any S3 user may create a bucket, as in S3: the gateway makes the top-level directory
    and gives it to the caller (their uid and gid, mode 0755). A bucket the caller already
    owns answers 200 in us-east-1 (S3's legacy behaviour there), BucketAlreadyOwnedByYou in
    other regions; someone else's is BucketAlreadyExists."""
    if not BUCKET_NAME.fullmatch(call.bucket) or ".." in call.bucket:
        raise S3Error("InvalidBucketName", "The specified bucket is not valid.", call.resource)
    path = objects.bucket_path(call.bucket)
    try:
        await call.gateway_fs.mkdir(path, mode=0o755)
    except errors.AlreadyExists:
        st = await call.gateway_fs.stat(path)
        if st.uid != call.principal.uid or not st.is_dir:
            raise S3Error("BucketAlreadyExists", "The requested bucket name is not available.", call.resource) from None
        if (call.signed.region if call.signed else "us-east-1") != "us-east-1":
            raise S3Error("BucketAlreadyOwnedByYou", "Your previous request to create the named bucket succeeded and"
                          " you already own it.", call.resource) from None
        return web.Response(headers={"Location": f"/{call.bucket}"})
    if call.principal.uid != 0:
        await call.gateway_fs.setattr(path, uid=call.principal.uid, gid=call.principal.gid)
    await staging.remove_bucket_area(call.gateway_fs, call.bucket)  # uploads a crash left under the name
    return web.Response(headers={"Location": f"/{call.bucket}"})


async def delete_bucket(call: Call) -> web.Response:
    """Remove a bucket with no objects: its owner (or root) may, whoever owns the directory
    above it. Uploads still pending in it do not keep it (as S3): they are removed with it."""
    st = await objects.require_bucket(call.fs, call.bucket)
    if call.principal.uid not in (0, st.uid):
        raise S3Error("AccessDenied", "Access Denied", call.resource)
    for attempt in range(2):
        try:
            await call.gateway_fs.rmdir(objects.bucket_path(call.bucket))
            break
        except errors.DirectoryNotEmpty:
            if attempt or not await staging.remove_legacy_uploads(call.gateway_fs, call.bucket):
                raise S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty", call.resource) from None
        except errors.TectofsError as exc:
            raise from_tectofs(exc, call.resource, missing="NoSuchBucket") from None
    await staging.remove_bucket_area(call.gateway_fs, call.bucket)
    return web.Response(status=204)


async def head_bucket(call: Call) -> web.Response:
    await objects.require_bucket(call.fs, call.bucket)
    try:
        await call.fs.readdir_page(objects.bucket_path(call.bucket))  # may the caller read it?
    except errors.TectofsError as exc:
        raise from_tectofs(exc, call.resource, missing="NoSuchBucket") from None
    return web.Response(headers={"x-amz-bucket-region": call.signed.region if call.signed else "us-east-1"})


async def bucket_location(call: Call) -> web.Response:
    await objects.require_bucket(call.fs, call.bucket)
    return xml_response(s3xml.document("LocationConstraint"))


async def bucket_versioning(call: Call) -> web.Response:
    await objects.require_bucket(call.fs, call.bucket)
    return xml_response(s3xml.document("VersioningConfiguration"))


def _listing_args(call: Call) -> tuple[str, str, int]:
    delimiter = call.query.get("delimiter", "")
    encoding = call.query.get("encoding-type")
    if encoding not in (None, "url"):
        raise S3Error("InvalidArgument", "Invalid Encoding Method specified in Request")
    return call.query.get("prefix", ""), delimiter, call.int_query("max-keys", LIST_KEYS_MAX)


def url_encode(key: str) -> str:
    """A key as S3 writes it for ``encoding-type=url``: letters, digits and ``-_.*/`` kept,
    a space as ``+``, every other byte of its UTF-8 as ``%XX`` (botocore decodes it with
    ``unquote_plus``)."""
    return quote_plus(key, safe="/*").replace("~", "%7E")


def _encoder(call: Call) -> Any:
    """Keys as the client asked: ``encoding-type=url`` percent-encodes them."""
    if call.query.get("encoding-type") == "url":
        return url_encode
    return lambda k: k


async def _listing(call: Call, root: Any, after: str, owners: bool) -> tuple[bool, str]:
    """Fill a ListBucketResult's Contents (with Owner if ``owners``) and CommonPrefixes;
    returns (truncated, last)."""
    prefix, delimiter, max_keys = _listing_args(call)
    await objects.require_bucket(call.fs, call.bucket)
    try:
        found, prefixes, truncated, last = await listing.page(call.fs, call.bucket, prefix, after, delimiter, max_keys)
    except errors.TectofsError as exc:
        raise from_tectofs(exc, call.resource, missing="NoSuchBucket") from None
    encode = _encoder(call)
    records = await listing.records(call.fs, found)
    for (key, st, _), record in zip(found, records):
        entry = s3xml.child(root, "Contents", [("Key", encode(key)), ("LastModified", s3xml.timestamp(st.mtime)),
                                               ("ETag", quoted(record.etag)), ("Size", st.size)])
        if owners:
            s3xml.owner(entry, st.uid)
        s3xml.child(entry, "StorageClass").text = "STANDARD"
    for common in prefixes:
        s3xml.child(root, "CommonPrefixes", [("Prefix", encode(common))])
    return truncated, last


async def list_objects_v2(call: Call) -> web.Response:
    prefix, delimiter, max_keys = _listing_args(call)
    token = call.query.get("continuation-token")
    start_after = call.query.get("start-after", "")
    after = max(start_after, listing.decode_token(token)) if token else start_after
    encode = _encoder(call)
    root = s3xml.document("ListBucketResult", [
        ("Name", call.bucket), ("Prefix", encode(prefix)), ("Delimiter", encode(delimiter) if delimiter else None),
        ("MaxKeys", max_keys), ("EncodingType", call.query.get("encoding-type")),
        ("ContinuationToken", token), ("StartAfter", encode(start_after) if start_after else None)])
    truncated, last = await _listing(call, root, after, owners=call.query.get("fetch-owner") == "true")
    count = len(s3xml.children(root, "Contents")) + len(s3xml.children(root, "CommonPrefixes"))
    s3xml.fill(root, [("KeyCount", count), ("IsTruncated", truncated),
                       ("NextContinuationToken", listing.encode_token(last) if truncated else None)])
    return xml_response(root)


async def list_objects_v1(call: Call) -> web.Response:
    prefix, delimiter, max_keys = _listing_args(call)
    marker = call.query.get("marker", "")
    encode = _encoder(call)
    root = s3xml.document("ListBucketResult", [
        ("Name", call.bucket), ("Prefix", encode(prefix)), ("Marker", encode(marker)), ("MaxKeys", max_keys),
        ("Delimiter", encode(delimiter) if delimiter else None), ("EncodingType", call.query.get("encoding-type"))])
    truncated, last = await _listing(call, root, marker, owners=True)
    s3xml.fill(root, [("IsTruncated", truncated), ("NextMarker", encode(last) if truncated and delimiter else None)])
    return xml_response(root)


async def delete_objects(call: Call) -> web.Response:
    keys, quiet = s3xml.parse_delete(await call.small_body())
    await objects.require_bucket(call.fs, call.bucket)
    root = s3xml.document("DeleteResult")
    for key in keys:
        try:
            await objects.remove_object(call.fs, call.bucket, key)
            if not quiet:
                s3xml.child(root, "Deleted", [("Key", key)])
        except (S3Error, errors.TectofsError) as exc:
            error = exc if isinstance(exc, S3Error) else from_tectofs(exc, key)
            s3xml.child(root, "Error", [("Key", key), ("Code", error.code), ("Message", error.message)])
    return xml_response(root)


async def list_uploads(call: Call) -> web.Response:
    prefix = call.query.get("prefix", "")
    root = s3xml.document("ListMultipartUploadsResult", [("Bucket", call.bucket), ("Prefix", prefix),
                                                         ("IsTruncated", False)])
    for key, upload_id, started in await multipart.uploads(call.fs, call.gateway_fs, call.principal, call.bucket,
                                                           prefix):
        s3xml.child(root, "Upload", [("Key", key), ("UploadId", upload_id), ("Initiated", s3xml.timestamp(started)),
                                     ("StorageClass", "STANDARD")])
    return xml_response(root)


# ---------------------------------------------------------------------------- objects


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``Range: bytes=a-b`` -> ``[start, end)`` within ``size``; None for the whole object
    (no header, or one S3 ignores); InvalidRange when nothing of it is in the object."""
    if not header:
        return None
    match = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", header)
    if match is None or match.group(1) == match.group(2) == "":
        return None  # several ranges, or not bytes: S3 sends the whole object
    first, last = match.group(1), match.group(2)
    if first == "":
        start, end = max(0, size - int(last)), size
        if int(last) == 0:
            start = size
    else:
        start = int(first)
        end = size if last == "" else min(size, int(last) + 1)
        if last != "" and int(last) < start:
            return None
    if start >= size or start >= end:
        raise S3Error("InvalidRange", "The requested range is not satisfiable", ActualObjectSize=str(size))
    return start, end


async def _answer_head(call: Call) -> "tuple[str, Any, dict[str, str], tuple[int, int] | None] | web.Response":
    """What HEAD and GET share: the object's path, Stat and headers (``response-*``
    overrides applied), and the requested span — a Range, or ``?partNumber=N`` (with
    ``x-amz-mp-parts-count`` for a multipart object) — with its Content-Range set; or the
    whole answer when a condition decides it (304; 412 is raised)."""
    number = s3headers.part_number(call.query)
    if number is not None and "Range" in call.request.headers:
        raise S3Error("InvalidRequest", "Cannot specify both Range header and partNumber query parameter")
    path, st, record = await objects.stat_object(call.fs, call.bucket, call.key)
    headers = _object_headers(st, record)
    if s3headers.evaluate(call.request.headers, record.etag, st.mtime) is not None:
        return web.Response(status=304, headers={"ETag": headers["ETag"], "Last-Modified": headers["Last-Modified"]})
    s3headers.override(headers, call.query)
    span = parse_range(call.request.headers.get("Range"), st.size)
    if number is not None:
        start, end, count = s3headers.part_span(record, st.size, number)
        span = (start, end) if end > start else None
        if count:
            headers["x-amz-mp-parts-count"] = str(count)
    if span is not None:
        headers["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{st.size}"
    return path, st, headers, span


async def head_object(call: Call) -> web.StreamResponse:
    answer = await _answer_head(call)
    if isinstance(answer, web.Response):
        return answer
    _, st, headers, span = answer
    start, end = span or (0, st.size)
    response = web.StreamResponse(status=206 if span else 200, headers=headers)
    response.content_length = end - start  # HEAD: the length a GET would send, and no body
    return response


async def get_object(call: Call) -> web.StreamResponse:
    answer = await _answer_head(call)
    if isinstance(answer, web.Response):
        return answer
    path, st, headers, span = answer
    start, end = span or (0, st.size)
    stream = objects.stream_file(call.fs, path, start, end)
    try:
        first = await anext(stream, b"")  # opening errors are still S3 errors, before the status is sent
    except errors.TectofsError as exc:
        raise from_tectofs(exc, call.resource) from None
    response = web.StreamResponse(status=206 if span else 200, headers=headers)
    response.content_length = end - start
    call.request[STREAMING] = True
    await response.prepare(call.request)
    if first:
        await response.write(first)
    async for data in stream:
        await response.write(data)
    await response.write_eof()
    return response


async def put_object(call: Call) -> web.StreamResponse:
    if "x-amz-copy-source" in call.request.headers:
        return await copy_object(call)
    path = objects.object_path(call.bucket, call.key)  # a key "d/" (a directory marker): the file d/.tectofs-dir
    md5 = hashlib.md5()
    content_type = call.request.headers.get("Content-Type") or Record.content_type
    metadata = _user_metadata(call.request)
    stored = s3headers.stored(call.request.headers)
    # (the bucket is checked only if the write finds no directory for the key: one call for a small object)
    record = await objects.write_file(call.fs, path, call.body(md5), lambda: Record(
        etag=md5.hexdigest(), content_type=content_type, metadata=metadata, headers=stored))
    return web.Response(headers={"ETag": quoted(record.etag)})


def copy_source(header: str) -> tuple[str, str]:
    """``x-amz-copy-source`` (``/bucket/key`` or ``bucket/key``, URL-encoded) -> (bucket, key)."""
    source = unquote(header.split("?", 1)[0]).lstrip("/")
    bucket, _, key = source.partition("/")
    if not bucket or not key:
        raise S3Error("InvalidArgument", "Copy Source must mention the source bucket and key: sourcebucket/sourcekey")
    return bucket, key


async def copy_object(call: Call) -> web.StreamResponse:
    """CopyObject: the source is streamed through the gateway into the destination,
    published atomically; ``x-amz-metadata-directive: REPLACE`` takes the request's
    metadata, otherwise the source's is kept."""
    src_bucket, src_key = copy_source(call.request.headers["x-amz-copy-source"])
    src_path, st, src_record = await objects.stat_object(call.fs, src_bucket, src_key)
    s3headers.check_copy_source(call.request.headers, src_record.etag, st.mtime)
    await objects.require_bucket(call.fs, call.bucket)
    replace = call.request.headers.get("x-amz-metadata-directive", "COPY").upper() == "REPLACE"
    if not replace and (src_bucket, src_key) == (call.bucket, call.key):
        raise S3Error("InvalidRequest", "This copy request is illegal because it is trying to copy an object to itself"
                      " without changing the object's metadata.")
    content_type = (call.request.headers.get("Content-Type") or Record.content_type) if replace else src_record.content_type
    metadata = _user_metadata(call.request) if replace else src_record.metadata
    stored = s3headers.stored(call.request.headers) if replace else src_record.headers
    destination = objects.object_path(call.bucket, call.key)

    async def copy() -> Any:
        md5 = hashlib.md5()
        record = await objects.write_file(call.fs, destination, objects.stream_file(call.fs, src_path, 0, st.size, md5),
                                          lambda: Record(etag=md5.hexdigest(), content_type=content_type,
                                                         metadata=metadata, headers=stored))
        return s3xml.document("CopyObjectResult", [("LastModified", s3xml.timestamp(record.mtime)),
                                                   ("ETag", quoted(record.etag))])

    return await slow_xml(call, copy())


async def delete_object(call: Call) -> web.Response:
    await objects.remove_object(call.fs, call.bucket, call.key)
    return web.Response(status=204)


# ---------------------------------------------------------------------------- multipart


async def create_upload(call: Call) -> web.Response:
    upload_id = await multipart.create(call.fs, call.gateway_fs, call.principal, call.bucket, call.key,
                                       call.request.headers.get("Content-Type") or Record.content_type,
                                       _user_metadata(call.request), s3headers.stored(call.request.headers))
    root = s3xml.document("InitiateMultipartUploadResult", [("Bucket", call.bucket), ("Key", call.key),
                                                            ("UploadId", upload_id)])
    return xml_response(root)


async def upload_part(call: Call) -> web.StreamResponse:
    number = call.int_query("partNumber", 0, low=1, high=multipart.PART_NUMBER_MAX)
    if "x-amz-copy-source" in call.request.headers:
        return await upload_part_copy(call, number)
    md5 = hashlib.md5()
    record = await multipart.upload_part(await call.upload_fs(), call.bucket, call.key, call.query["uploadId"], number,
                                         call.body(md5), md5)
    return web.Response(headers={"ETag": quoted(record.etag)})


async def upload_part_copy(call: Call, number: int) -> web.StreamResponse:
    """UploadPartCopy: a part from (a range of) an existing object, streamed through."""
    src_bucket, src_key = copy_source(call.request.headers["x-amz-copy-source"])
    src_path, st, src_record = await objects.stat_object(call.fs, src_bucket, src_key)
    start, end = s3headers.copy_range(call.request.headers.get("x-amz-copy-source-range"), st.size)
    s3headers.check_copy_source(call.request.headers, src_record.etag, st.mtime)
    uploader = await call.upload_fs()
    await multipart.info(uploader, call.bucket, call.key, call.query["uploadId"])

    async def copy() -> Any:
        md5 = hashlib.md5()
        record = await multipart.upload_part(uploader, call.bucket, call.key, call.query["uploadId"], number,
                                             objects.stream_file(call.fs, src_path, start, end, md5), md5)
        return s3xml.document("CopyPartResult", [("LastModified", s3xml.timestamp(record.mtime)),
                                                 ("ETag", quoted(record.etag))])

    return await slow_xml(call, copy())


async def complete_upload(call: Call) -> web.StreamResponse:
    wanted = s3xml.parse_complete(await call.small_body())
    assemble = await multipart.prepare_complete(await call.upload_fs(), call.bucket, call.key, call.query["uploadId"], wanted,
                                                call.part_bytes_min)

    async def complete() -> Any:
        record = await assemble()
        return s3xml.document("CompleteMultipartUploadResult", [
            ("Location", f"/{call.bucket}/{call.key}"), ("Bucket", call.bucket), ("Key", call.key),
            ("ETag", quoted(record.etag))])

    return await slow_xml(call, complete())


async def abort_upload(call: Call) -> web.Response:
    uploader = await call.upload_fs(owner_may=True)
    await multipart.info(uploader, call.bucket, call.key, call.query["uploadId"])
    await multipart.abort(uploader, call.bucket, call.query["uploadId"])
    return web.Response(status=204)


async def list_parts(call: Call) -> web.Response:
    upload_id = call.query["uploadId"]
    uploader = await call.upload_fs(owner_may=True)
    await multipart.info(uploader, call.bucket, call.key, upload_id)
    marker = call.int_query("part-number-marker", 0, high=multipart.PART_NUMBER_MAX)
    max_parts = call.int_query("max-parts", LIST_KEYS_MAX)
    found = await multipart.parts(uploader, call.bucket, upload_id, after=marker, limit=max_parts + 1)
    shown, truncated = found[:max_parts], len(found) > max_parts
    root = s3xml.document("ListPartsResult", [
        ("Bucket", call.bucket), ("Key", call.key), ("UploadId", upload_id), ("PartNumberMarker", marker),
        ("NextPartNumberMarker", shown[-1][0] if shown else marker), ("MaxParts", max_parts),
        ("IsTruncated", truncated), ("StorageClass", "STANDARD")])
    for number, st, record in shown:
        s3xml.child(root, "Part", [("PartNumber", number), ("LastModified", s3xml.timestamp(st.mtime)),
                                   ("ETag", quoted(record.etag)), ("Size", st.size)])
    return xml_response(root)
