"""Request bodies as the gateway consumes them: a stream of byte pieces, decoded from
``aws-chunked`` when the client sent that, and checked as they pass.

Contract: :func:`pieces` yields the payload in arrival order and raises :class:`S3Error`
*at the end* (after the last piece, before the caller publishes anything) when the body's
integrity fails: a signed payload hash that differs (``XAmzContentSHA256Mismatch``), a chunk
signature that does not chain (``SignatureDoesNotMatch``, raised as soon as that chunk ends),
a body shorter than announced (``IncompleteBody``; a ``Transfer-Encoding: chunked`` body
without Content-Length announces nothing), or a Content-MD5 that differs
(``BadDigest``). Memory: one piece at a time, whatever the body's size.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
from typing import Any, AsyncIterator

from aiohttp import web

from . import sigv4
from .xml import S3Error

PIECE_BYTES = 1 << 20  # pieces are gathered up to this before they are passed on


def declared_length(request: web.Request, signed: sigv4.SignedRequest | None) -> int:
    """The payload's length: ``x-amz-decoded-content-length`` for aws-chunked bodies, else
    Content-Length; -1 (not known before its end) for a body sent with ``Transfer-Encoding:
    chunked`` and neither. A body with none of them is refused (MissingContentLength)."""
    chunked = signed is not None and signed.payload.startswith("STREAMING-")
    text = request.headers.get("x-amz-decoded-content-length" if chunked else "Content-Length")
    if text is None and "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        return -1
    if text is None:
        raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.")
    try:
        length = int(text)
    except ValueError:
        raise S3Error("InvalidArgument", f"bad content length {text[:40]!r}") from None
    if length < 0:
        raise S3Error("InvalidArgument", "negative content length")
    return length


def content_md5(request: web.Request) -> bytes | None:
    """The Content-MD5 header's digest, if the client sent one."""
    text = request.headers.get("Content-MD5")
    if text is None:
        return None
    try:
        digest = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != 16:
        raise S3Error("InvalidDigest", "The Content-MD5 you specified was invalid.")
    return digest


async def _gathered(request: web.Request) -> AsyncIterator[bytes]:
    """The raw body, in pieces of up to about :data:`PIECE_BYTES`."""
    pending: list[bytes] = []
    size = 0
    async for data in request.content.iter_any():
        pending.append(data)
        size += len(data)
        if size >= PIECE_BYTES:
            yield pending[0] if len(pending) == 1 else b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


class Digests:
    """Hashes of a stream computed in a worker thread, one piece behind the caller (hashlib
    releases the GIL on large buffers: MD5 runs beside the network and the client's
    encoding instead of on the event loop). Pieces must not change once passed in."""

    def __init__(self, *hashes: Any) -> None:
        self.hashes = [h for h in hashes if h is not None]
        self._last: asyncio.Future[None] | None = None

    def _update(self, piece: memoryview | bytes) -> None:
        for h in self.hashes:
            h.update(piece)

    async def update(self, piece: memoryview | bytes) -> None:
        if not self.hashes:
            return
        if self._last is not None:
            await self._last
        self._last = asyncio.get_running_loop().run_in_executor(None, self._update, piece)

    async def finish(self) -> None:
        """Wait until every piece passed in is hashed."""
        if self._last is not None:
            await self._last


async def pieces(request: web.Request, signed: sigv4.SignedRequest | None, key: bytes | None,
                 md5: "hashlib._Hash | None" = None) -> AsyncIterator[memoryview]:
    """The payload of ``request``, verified as described in the module docstring. ``md5``,
    when given, is updated with every byte (the caller's ETag)."""
    length = declared_length(request, signed)
    expected_md5 = content_md5(request)
    md5 = md5 if md5 is not None else (hashlib.md5() if expected_md5 is not None else None)
    payload = signed.payload if signed is not None else sigv4.UNSIGNED
    decoder = None
    if payload.startswith("STREAMING-"):
        decoder = sigv4.ChunkDecoder(signed, key if payload.startswith("STREAMING-AWS4") else None)  # type: ignore[arg-type]
    sha = hashlib.sha256() if payload not in (sigv4.UNSIGNED,) and decoder is None else None
    digests = Digests(sha, md5)
    received = 0
    try:
        async for raw in _gathered(request):
            for piece in decoder.feed(raw) if decoder is not None else [memoryview(raw)]:
                received += len(piece)
                if received > length >= 0:
                    raise S3Error("IncompleteBody", "the body is longer than its declared length")
                await digests.update(piece)
                yield piece
    finally:
        await digests.finish()
    if decoder is not None:
        decoder.finish()
    if received != length and length >= 0:
        raise S3Error("IncompleteBody", f"You did not provide the number of bytes specified ({received} of {length})")
    if sha is not None and not hmac.compare_digest(sha.hexdigest(), payload):
        raise S3Error("XAmzContentSHA256Mismatch", "The provided 'x-amz-content-sha256' header does not match what was"
                      " computed.")
    if expected_md5 is not None and md5 is not None and md5.digest() != expected_md5:
        raise S3Error("BadDigest", "The Content-MD5 you specified did not match what we received.")


async def read_all(request: web.Request, signed: sigv4.SignedRequest | None, key: bytes | None, limit: int) -> bytes:
    """A small body (an XML request document) whole, verified; longer than ``limit`` is refused."""
    if declared_length(request, signed) > limit:
        raise S3Error("MalformedXML", f"request document larger than {limit} bytes")
    document = bytearray()
    async for piece in pieces(request, signed, key):
        document += piece
        if len(document) > limit:  # a chunked body says its length only at its end
            raise S3Error("MalformedXML", f"request document larger than {limit} bytes")
    return bytes(document)
