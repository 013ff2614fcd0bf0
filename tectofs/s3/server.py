"""The S3 gateway process: an aiohttp server that authenticates each request (SigV4),
picks the operation from method, path and sub-resource, and runs it as the caller's tectofs
user through one client connection (root's, acting for each user).

Why aiohttp: measured on this 2-core machine (loopback, 1 GiB through a minimal streaming
handler, median of 3, ``python bench/s3_bench.py --candidates``): aiohttp GET 2.90 GB/s,
PUT 1.66 GB/s; uvicorn + httptools 3.43 / 1.27; uvicorn + h11 2.19 / 0.93. aiohttp's PUT
(request body streaming, what checkpoints do most) is the fastest, its GET close to the best,
and it is one dependency with back-pressured request streams and ``StreamResponse``.

Contract: path-style addressing (``/bucket/key``); every request must be signed (header,
SigV4 presigned URL, or SigV2 presigned URL as boto3 makes by default) by a key
:class:`~tectofs.s3.principals.Principals` knows; errors are S3 XML documents with S3's
codes; a response already streaming when a read fails is cut short
(the client sees fewer bytes than Content-Length, never wrong ones). Every request is
counted in :class:`tectofs.metrics.S3Metrics` (``S3Gateway.metrics``; its ``registry`` is the
process's client registry, which ``--metrics`` serves).
"""

from __future__ import annotations

import logging
import secrets
import time
from typing import Awaitable, Callable
from urllib.parse import unquote

from aiohttp import web

from tectofs import errors, metrics
from tectofs.client import AsyncFileSystem
from tectofs.wire import auth

from . import handlers, multipart, sigv4
from . import xml as s3xml
from .principals import Principals
from .xml import S3Error

log = logging.getLogger("tectofs.s3")

Handler = Callable[[handlers.Call], Awaitable[web.StreamResponse]]

# (level, method, sub-resource) -> operation; the sub-resource is the first of SUBRESOURCES
# in the query (None: a plain request).
SUBRESOURCES = ("uploadId", "uploads", "delete", "list-type", "location", "versioning")
ROUTES: dict[tuple[str, str, str | None], Handler] = {
    ("service", "GET", None): handlers.list_buckets,
    ("bucket", "PUT", None): handlers.create_bucket,
    ("bucket", "DELETE", None): handlers.delete_bucket,
    ("bucket", "HEAD", None): handlers.head_bucket,
    ("bucket", "GET", None): handlers.list_objects_v1,
    ("bucket", "GET", "list-type"): handlers.list_objects_v2,
    ("bucket", "GET", "location"): handlers.bucket_location,
    ("bucket", "GET", "versioning"): handlers.bucket_versioning,
    ("bucket", "GET", "uploads"): handlers.list_uploads,
    ("bucket", "POST", "delete"): handlers.delete_objects,
    ("object", "PUT", None): handlers.put_object,
    ("object", "PUT", "uploadId"): handlers.upload_part,
    ("object", "GET", None): handlers.get_object,
    ("object", "GET", "uploadId"): handlers.list_parts,
    ("object", "HEAD", None): handlers.head_object,
    ("object", "DELETE", None): handlers.delete_object,
    ("object", "DELETE", "uploadId"): handlers.abort_upload,
    ("object", "POST", "uploads"): handlers.create_upload,
    ("object", "POST", "uploadId"): handlers.complete_upload,
}
# Sub-resources S3 has and this gateway does not (answered NotImplemented, never mistaken
# for a plain GET or PUT of the object).
UNSUPPORTED = frozenset({
    "acl", "tagging", "policy", "cors", "lifecycle", "website", "logging", "notification", "replication",
    "encryption", "object-lock", "retention", "legal-hold", "torrent", "restore", "select", "versions",
    "accelerate", "requestPayment", "analytics", "inventory", "metrics", "ownershipControls",
    "publicAccessBlock", "intelligent-tiering", "attributes", "policyStatus",
})


def route(method: str, bucket: str, key: str, query: dict[str, str]) -> Handler:
    """The operation a request asks for; NotImplemented / MethodNotAllowed otherwise."""
    for name in query:
        if name in UNSUPPORTED:
            raise S3Error("NotImplemented", f"the ?{name} sub-resource is not supported by the tectofs gateway")
    level = "object" if key else "bucket" if bucket else "service"
    sub = next((s for s in SUBRESOURCES if s in query), None)
    handler = ROUTES.get((level, method, sub)) or ROUTES.get((level, method, None))
    if handler is None:
        raise S3Error("MethodNotAllowed", f"{method} is not allowed on this {level}")
    return handler


def _operation(request: web.Request) -> str:
    """The name of the operation ``request`` asks for (``unknown``: none)."""
    raw_path, _, raw_query = request.raw_path.partition("?")
    try:
        return route(request.method, *split_path(raw_path), dict(sigv4.parse_query(raw_query))).__name__
    except S3Error:
        return "unknown"


def split_path(raw_path: str) -> tuple[str, str]:
    """``/bucket/some%20key`` -> (``bucket``, ``some key``) (path-style addressing)."""
    bucket, _, key = unquote(raw_path).lstrip("/").partition("/")
    return bucket, key


class S3Gateway:
    """Serves S3 for the cluster at ``meta_address``. ``key_file``: the cluster key (the
    gateway acts as root, and for every user; with it, the metadata service tells the gateway
    each user's S3 secret: :mod:`tectofs.s3.principals`)."""

    def __init__(self, meta_address: str, key_file: str, part_bytes_min: int = multipart.PART_BYTES_MIN) -> None:
        self.part_bytes_min = part_bytes_min  # every multipart part but the last: at least this (S3: 5 MiB)
        self.ring = auth.KeyRing(key_file)
        self.fs = AsyncFileSystem(meta_address, auth.Credential.root_from_keys(self.ring, meta_address))
        self.principals = Principals(self.fs, self.ring)
        self.metrics = metrics.s3_metrics()
        self.runner: web.AppRunner | None = None
        self.address = ""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=s3xml.BODY_MAX_BYTES)
        app.router.add_route("*", r"/{path:[\s\S]*}", self.handle)  # keys may hold newlines
        app.on_response_prepare.append(self._tag)
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; returns ``HOST:PORT``."""
        # auto_decompress off: a body sent with Content-Encoding gzip is the object's bytes, stored as sent
        self.runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, read_bufsize=1 << 20,
                                    auto_decompress=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, backlog=1024)
        await site.start()
        bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
        self.address = f"{bound[0]}:{bound[1]}"
        return self.address

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await self.principals.close()
        await self.fs.close()

    async def _call(self, request: web.Request) -> handlers.Call:
        """Authenticate ``request`` and say what it asks for."""
        raw_path, _, raw_query = request.raw_path.partition("?")
        pairs = sigv4.parse_query(raw_query)
        bucket, key = split_path(raw_path)
        signed = sigv4.parse(request.headers, pairs)
        if signed is None:
            raise S3Error("AccessDenied", "Access Denied: requests must be signed (AWS Signature Version 4)")
        principal = await self.principals.lookup(signed.access_key)
        if principal is None:
            raise S3Error("InvalidAccessKeyId", "The AWS Access Key Id you provided does not exist in our records.",
                          AWSAccessKeyId=signed.access_key[:128])
        signing_key = sigv4.verify(signed, principal.secret, request.method, raw_path, pairs, request.headers)
        return handlers.Call(request, self.principals.filesystem(principal), self.fs, principal, signed, signing_key,
                             bucket, key, dict(pairs), self.part_bytes_min)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        request[handlers.REQUEST_ID] = secrets.token_hex(8).upper()
        started = time.perf_counter()
        handler: Handler | None = None
        response: web.StreamResponse | None = None
        try:
            call = await self._call(request)
            handler = route(request.method, call.bucket, call.key, call.query)
            response = await handler(call)
            return response
        except (ConnectionError, web.HTTPException):
            raise
        except Exception as exc:
            if request.get(handlers.STREAMING):
                raise  # the status went out already: the connection is cut short
            response = self._error(request, exc)
            return response
        finally:
            self._count(request, handler, response, started)

    def _count(self, request: web.Request, handler: Handler | None, response: web.StreamResponse | None,
               started: float) -> None:
        """Count one request: its operation (for one that never reached a handler, the one it
        asked for, or ``unknown``), status (``cut``: none was answered, or a streamed answer
        was cut short), latency, body bytes received and sent."""
        sent = 0
        if response is not None and request.method != "HEAD":
            sent = response.body_length if response.prepared else (response.content_length or 0)
        self.metrics.observe(_operation(request) if handler is None else handler.__name__,
                             "cut" if response is None else response.status, time.perf_counter() - started,
                             request.content.total_bytes, sent)

    @staticmethod
    async def _tag(request: web.Request, response: web.StreamResponse) -> None:
        response.headers["x-amz-request-id"] = request.get(handlers.REQUEST_ID, "")

    @staticmethod
    def _error(request: web.Request, exc: Exception) -> web.Response:
        """The S3 error document for whatever a request raised."""
        resource = unquote(request.raw_path.partition("?")[0])
        if isinstance(exc, errors.TectofsError):
            exc = s3xml.from_tectofs(exc, resource)
        elif not isinstance(exc, S3Error):  # a bug or a failure not foreseen: logged, answered 500
            log.error("%s %s failed", request.method, resource, exc_info=exc)
            exc = S3Error("InternalError", f"{type(exc).__name__}: {exc}")
        if exc.status >= 500:
            log.warning("%s %s: %s %s", request.method, resource, exc.code, exc.message)
        headers = None
        if exc.code == "InvalidRange" and "ActualObjectSize" in exc.extra:
            headers = {"Content-Range": f"bytes */{exc.extra['ActualObjectSize']}"}
        exc.resource = exc.resource or resource
        return web.Response(body=s3xml.error_document(exc, request[handlers.REQUEST_ID]), status=exc.status,
                            content_type="application/xml", headers=headers)
