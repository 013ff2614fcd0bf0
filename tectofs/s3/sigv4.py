"""AWS Signature Version 4 as S3 checks it: the ``Authorization`` header, presigned query
URLs, and ``aws-chunked`` bodies (``STREAMING-AWS4-HMAC-SHA256-PAYLOAD``: every chunk signed,
each signature chained to the previous one; ``STREAMING-UNSIGNED-PAYLOAD-TRAILER``: chunks
unsigned, a checksum trailer).

Sans-I/O: functions of the request's method, raw path, raw query and headers, and a
:class:`ChunkDecoder` fed bytes as they arrive. The crypto is the standard library's
(``hmac``, ``hashlib``); the canonical forms follow AWS's documentation and botocore's signer
(``botocore.auth.S3SigV4Auth``: S3 paths are not normalized; query pairs sorted after encoding;
header values trimmed with inner runs of spaces collapsed).

Contract: :func:`parse` turns a request into a :class:`SignedRequest` (who claims to sign,
what) or raises :class:`~tectofs.s3.xml.S3Error`; :func:`verify` checks it against the
claimed principal's secret (constant-time compare) and the clock. Body integrity (a signed
payload hash, or chunk signatures) is checked by the body reader as bytes arrive
(:mod:`tectofs.s3.body`), before anything is published.
"""

from __future__ import annotations

import base64
import calendar
import hashlib
import hmac
import re
import time
from dataclasses import dataclass
from typing import Mapping
from urllib.parse import quote, unquote

from .xml import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
CLOCK_SKEW_MAX_S = 15 * 60  # S3's: a header-signed request more than 15 minutes off is refused
PRESIGN_EXPIRES_MAX_S = 7 * 24 * 3600
_HEX64 = re.compile(r"[0-9a-f]{64}")
_AUTH_FIELD = re.compile(r"\s*(\w+)\s*=\s*([^,\s]*)\s*")


@dataclass(frozen=True)
class SignedRequest:
    """What a request claims: who signed it (``access_key``), for which scope, what it
    signed, and how its body is protected (``payload``: a sha256 hex, ``UNSIGNED-PAYLOAD`` or
    one of the ``STREAMING-*`` modes)."""

    access_key: str
    date: str  # the scope's day, YYYYMMDD
    region: str
    amz_date: str  # YYYYMMDDTHHMMSSZ
    signed_headers: tuple[str, ...]
    signature: str
    payload: str
    presigned: bool = False
    expires_s: int = 0  # presigned: X-Amz-Expires (SigV4), or the Expires epoch second (SigV2)
    version: int = 4  # 2: a SigV2 presigned URL (AWSAccessKeyId, Expires, Signature)

    @property
    def scope(self) -> str:
        return f"{self.date}/{self.region}/s3/aws4_request"


def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    """The day's key: HMAC chain over ``"AWS4" + secret``, date, region, service."""
    key = hmac.new(f"AWS4{secret}".encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _hmac_hex(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def uri_encode(text: str, slash: bool = True) -> str:
    """AWS's URI encoding: every byte but ``A-Za-z0-9-_.~`` as ``%XX`` (``/`` kept in paths)."""
    return quote(text, safe="/~" if slash else "~")


def parse_query(raw_query: str) -> list[tuple[str, str]]:
    """``a=1&b&c=%2F`` -> decoded pairs, in order (``+`` is a plus, as AWS reads it)."""
    pairs = []
    for piece in raw_query.split("&") if raw_query else []:
        name, _, value = piece.partition("=")
        pairs.append((unquote(name), unquote(value)))
    return pairs


def canonical_query(pairs: list[tuple[str, str]]) -> str:
    encoded = sorted((uri_encode(k, slash=False), uri_encode(v, slash=False)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def canonical_headers(headers: Mapping[str, str], names: tuple[str, ...]) -> str:
    """``name:value\\n`` for each signed header (values trimmed, inner spaces collapsed)."""
    lines = []
    for name in names:
        values = headers.getall(name, []) if hasattr(headers, "getall") else (
            [headers[name]] if name in headers else [])
        if not values:
            raise S3Error("SignatureDoesNotMatch", f"signed header {name!r} is missing from the request")
        lines.append(f"{name}:{','.join(' '.join(v.split()) for v in values)}\n")
    return "".join(lines)


def canonical_request(method: str, raw_path: str, query: list[tuple[str, str]], headers: Mapping[str, str],
                      signed: SignedRequest) -> str:
    """The canonical request of AWS's documentation (S3 flavour: the path is re-encoded,
    never normalized)."""
    path = uri_encode(unquote(raw_path)) or "/"
    pairs = [(k, v) for k, v in query if k != "X-Amz-Signature"]
    return "\n".join([method, path, canonical_query(pairs), canonical_headers(headers, signed.signed_headers),
                      ";".join(signed.signed_headers), signed.payload])


def string_to_sign(signed: SignedRequest, canonical: str) -> str:
    return "\n".join([ALGORITHM, signed.amz_date, signed.scope, hashlib.sha256(canonical.encode()).hexdigest()])


# ---------------------------------------------------------------------------- parsing


def _credential(value: str) -> tuple[str, str, str]:
    """``AKID/20240101/us-east-1/s3/aws4_request`` -> (access key, date, region)."""
    parts = value.split("/")
    if len(parts) != 5 or parts[3] != "s3" or parts[4] != "aws4_request" or not re.fullmatch(r"\d{8}", parts[1]):
        raise S3Error("AuthorizationHeaderMalformed", f"malformed credential scope {value[:200]!r}")
    return parts[0], parts[1], parts[2]


def _signed_headers(value: str) -> tuple[str, ...]:
    names = tuple(value.split(";")) if value else ()
    if "host" not in names:
        raise S3Error("AuthorizationHeaderMalformed", "SignedHeaders must include host")
    return names


def _from_header(authorization: str, headers: Mapping[str, str]) -> SignedRequest:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise S3Error("InvalidArgument" if algorithm.startswith("AWS ") or algorithm == "AWS" else
                      "AuthorizationHeaderMalformed", f"unsupported authorization {algorithm[:40]!r}: use {ALGORITHM}")
    fields = {}
    for item in rest.split(","):
        match = _AUTH_FIELD.fullmatch(item)
        if match is None:
            raise S3Error("AuthorizationHeaderMalformed", f"malformed Authorization field {item[:100]!r}")
        fields[match.group(1)] = match.group(2)
    try:
        access_key, date, region = _credential(fields["Credential"])
        signed_headers, signature = _signed_headers(fields["SignedHeaders"]), fields["Signature"]
    except KeyError as missing:
        raise S3Error("AuthorizationHeaderMalformed", f"the Authorization header lacks {missing}") from None
    amz_date = headers.get("x-amz-date") or ""
    payload = headers.get("x-amz-content-sha256") or ""
    if not payload:
        raise S3Error("InvalidRequest", "x-amz-content-sha256 is required with AWS4-HMAC-SHA256")
    if payload not in (UNSIGNED, STREAMING_SIGNED, STREAMING_UNSIGNED_TRAILER) and not _HEX64.fullmatch(payload):
        raise S3Error("InvalidArgument", f"unsupported x-amz-content-sha256 {payload[:80]!r}")
    return SignedRequest(access_key, date, region, amz_date, signed_headers, signature, payload)


def _from_query(query: dict[str, str]) -> SignedRequest:
    if query.get("X-Amz-Algorithm") != ALGORITHM:
        raise S3Error("AuthorizationQueryParametersError", f"X-Amz-Algorithm must be {ALGORITHM}")
    try:
        access_key, date, region = _credential(query["X-Amz-Credential"])
        expires = int(query["X-Amz-Expires"])
        signed = SignedRequest(access_key, date, region, query["X-Amz-Date"], _signed_headers(query["X-Amz-SignedHeaders"]),
                               query["X-Amz-Signature"], query.get("X-Amz-Content-Sha256", UNSIGNED), presigned=True,
                               expires_s=expires)
    except KeyError as missing:
        raise S3Error("AuthorizationQueryParametersError", f"a presigned URL needs {missing}") from None
    except ValueError:
        raise S3Error("AuthorizationQueryParametersError", "X-Amz-Expires should be a number",
                      http_status=403) from None
    if expires < 0:
        raise S3Error("AuthorizationQueryParametersError", "X-Amz-Expires must be non-negative", http_status=403)
    if expires == 0:
        raise S3Error("AuthorizationQueryParametersError", "X-Amz-Expires must be greater than 0 (a URL valid for no"
                      " time at all)", http_status=403)
    if expires > PRESIGN_EXPIRES_MAX_S:
        raise S3Error("AuthorizationQueryParametersError", "X-Amz-Expires must be less than a week (in seconds); that"
                      f" is, the given X-Amz-Expires must be less than {PRESIGN_EXPIRES_MAX_S} seconds", http_status=403)
    return signed


def _from_query_v2(query: dict[str, str]) -> SignedRequest:
    """A SigV2 presigned URL (what boto3 makes unless told ``signature_version="s3v4"``)."""
    try:
        expires = int(query["Expires"])
    except KeyError:
        raise S3Error("AccessDenied", "Query-string authentication requires the Signature, Expires and AWSAccessKeyId"
                      " parameters") from None
    except ValueError:
        raise S3Error("AccessDenied", "Invalid date (should be seconds since epoch): Expires") from None
    return SignedRequest(query["AWSAccessKeyId"], "", "us-east-1", "", (), query.get("Signature", ""), UNSIGNED,
                         presigned=True, expires_s=expires, version=2)


def parse(headers: Mapping[str, str], query: list[tuple[str, str]]) -> SignedRequest | None:
    """The signature a request carries (header or presigned query), or None if unsigned."""
    authorization = headers.get("authorization")
    if authorization:
        return _from_header(authorization, headers)
    as_dict = dict(query)
    if "X-Amz-Signature" in as_dict or "X-Amz-Credential" in as_dict:
        return _from_query(as_dict)
    if "AWSAccessKeyId" in as_dict and "Signature" in as_dict:
        return _from_query_v2(as_dict)
    return None


# ---------------------------------------------------------------------------- checking


def _amz_time(amz_date: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(amz_date, "%Y%m%dT%H%M%SZ")))
    except ValueError:
        raise S3Error("AccessDenied", f"malformed X-Amz-Date {amz_date[:40]!r}") from None


def check_time(signed: SignedRequest, now: float) -> None:
    """Header signatures must be within 15 minutes of ``now``; presigned URLs unexpired."""
    if signed.version == 2:
        if now > signed.expires_s:
            raise S3Error("AccessDenied", "Request has expired")
        return
    at = _amz_time(signed.amz_date)
    if not signed.amz_date.startswith(signed.date):
        raise S3Error("SignatureDoesNotMatch", "X-Amz-Date is not on the credential scope's day")
    if signed.presigned:
        if now > at + signed.expires_s:
            raise S3Error("AccessDenied", "Request has expired")
        if at > now + CLOCK_SKEW_MAX_S:
            raise S3Error("AccessDenied", "Request is not valid yet")
    elif abs(now - at) > CLOCK_SKEW_MAX_S:
        raise S3Error("RequestTimeTooSkewed", "The difference between the request time and the server's time is too large")


def verify(signed: SignedRequest, secret: str, method: str, raw_path: str, query: list[tuple[str, str]],
           headers: Mapping[str, str], now: float | None = None) -> bytes:
    """Raise unless ``signed`` is a valid signature by the holder of ``secret``; return the
    day's signing key (chunk signatures chain from it)."""
    check_time(signed, time.time() if now is None else now)
    if signed.version == 2:
        _verify_v2(signed, secret, method, raw_path, query, headers)
        return b""
    key = signing_key(secret, signed.date, signed.region)
    canonical = canonical_request(method, raw_path, query, headers, signed)
    expected = _hmac_hex(key, string_to_sign(signed, canonical))
    if not hmac.compare_digest(expected, signed.signature.lower()):
        raise S3Error("SignatureDoesNotMatch",
                      "The request signature we calculated does not match the signature you provided. Check your key"
                      " and signing method.")
    return key


# Query parameters SigV2 signs as part of the resource (botocore's ``HmacV1Auth.QSAOfInterest``).
V2_SUBRESOURCES = frozenset({
    "accelerate", "acl", "cors", "defaultObjectAcl", "location", "logging", "partNumber", "policy", "requestPayment",
    "torrent", "versioning", "versionId", "versions", "website", "uploads", "uploadId", "response-content-type",
    "response-content-language", "response-expires", "response-cache-control", "response-content-disposition",
    "response-content-encoding", "delete", "lifecycle", "tagging", "restore", "storageClass", "notification",
    "replication", "analytics", "metrics", "inventory", "select", "select-type", "object-lock",
})


def string_to_sign_v2(method: str, raw_path: str, query: list[tuple[str, str]], headers: Mapping[str, str]) -> str:
    """SigV2's string to sign for a presigned URL: method, Content-MD5, Content-Type, Expires,
    the ``x-amz-*`` parameters, and the resource (path and signed sub-resources)."""
    as_dict = dict(query)
    amz = sorted((k.lower(), v.strip()) for k, v in query if k.lower().startswith("x-amz-"))
    resource = uri_encode(unquote(raw_path)) or "/"
    sub = sorted((k, v) for k, v in query if k in V2_SUBRESOURCES)
    if sub:
        resource += "?" + "&".join(f"{k}={v}" if v else k for k, v in sub)
    lines = [method, as_dict.get("content-md5", headers.get("Content-MD5", "")),
             as_dict.get("content-type", headers.get("Content-Type", "")), as_dict.get("Expires", ""),
             *(f"{k}:{v}" for k, v in amz), resource]
    return "\n".join(lines)


def _verify_v2(signed: SignedRequest, secret: str, method: str, raw_path: str, query: list[tuple[str, str]],
               headers: Mapping[str, str]) -> None:
    text = string_to_sign_v2(method, raw_path, query, headers)
    expected = base64.b64encode(hmac.new(secret.encode(), text.encode(), hashlib.sha1).digest()).decode()
    if not hmac.compare_digest(expected, signed.signature):
        raise S3Error("SignatureDoesNotMatch", "The request signature we calculated does not match the signature you"
                      " provided. Check your key and signing method.")


def chunk_signature(key: bytes, signed: SignedRequest, previous: str, chunk_sha256: str) -> str:
    """The signature of one ``aws-chunked`` chunk, chained to the ``previous`` one (the seed
    is the request's own signature)."""
    text = "\n".join(["AWS4-HMAC-SHA256-PAYLOAD", signed.amz_date, signed.scope, previous, EMPTY_SHA256, chunk_sha256])
    return _hmac_hex(key, text)


# ---------------------------------------------------------------------------- aws-chunked


class ChunkDecoder:
    """Decodes an ``aws-chunked`` body, fed in arbitrary pieces: ``feed(data)`` returns the
    payload bytes it completes (views into its own buffer, valid until the next feed),
    checking each chunk's signature when ``key`` is given; ``finish()`` raises unless the
    final (empty) chunk and any trailer arrived. A chunk header or trailer line longer than
    ``line_max`` is refused; chunk data is never held whole (passed on as it arrives)."""

    def __init__(self, signed: SignedRequest, key: bytes | None, line_max: int = 4096) -> None:
        self.signed, self.key, self.line_max = signed, key, line_max
        self.previous = signed.signature
        self._line = bytearray()
        self._remaining = 0  # data bytes of the current chunk still to come
        self._state = "header"  # header -> data -> crlf -> header ... -> trailer -> done
        self._chunk_sig = ""
        self._hash = hashlib.sha256()

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes | memoryview) -> list[memoryview]:
        out: list[memoryview] = []
        view = memoryview(data)
        while view:
            if self._state == "data":
                n = min(self._remaining, len(view))
                piece, view = view[:n], view[n:]
                self._hash.update(piece)
                self._remaining -= n
                out.append(piece)
                if self._remaining == 0:
                    self._end_chunk()
                continue
            if self._state == "done":
                raise S3Error("IncompleteBody", "bytes after the final aws-chunked chunk")
            end = bytes(view[: self.line_max + 2]).find(b"\n")
            take = len(view) if end < 0 else end + 1
            self._line += view[:take]
            view = view[take:]
            if len(self._line) > self.line_max + 2:
                raise S3Error("IncompleteBody", "an aws-chunked header line is too long")
            if end >= 0:
                line, self._line = bytes(self._line).rstrip(b"\r\n").decode("latin-1"), bytearray()
                self._on_line(line)
        return out

    def _on_line(self, line: str) -> None:
        if self._state == "crlf":
            if line:
                raise S3Error("IncompleteBody", "aws-chunked data longer than its declared size")
            self._state = "header"
        elif self._state == "header":
            size_text, _, extension = line.partition(";")
            try:
                size = int(size_text.strip(), 16)
            except ValueError:
                raise S3Error("IncompleteBody", f"malformed aws-chunked header {line[:80]!r}") from None
            name, _, value = extension.partition("=")
            if self.key is not None and name.strip() != "chunk-signature":
                raise S3Error("SignatureDoesNotMatch", "an aws-chunked chunk lacks its chunk-signature")
            self._chunk_sig, self._remaining = value.strip(), size
            if size:
                self._state = "data"
            else:
                self._end_chunk()
        elif self._state == "trailer":
            if not line:
                self._state = "done"  # trailers (checksums) are accepted, not re-checked
        else:
            raise S3Error("IncompleteBody", "malformed aws-chunked body")

    def _end_chunk(self) -> None:
        final = self._state == "header"  # a zero-size chunk
        if self.key is not None:
            expected = chunk_signature(self.key, self.signed, self.previous, self._hash.hexdigest())
            if not hmac.compare_digest(expected, self._chunk_sig.lower()):
                raise S3Error("SignatureDoesNotMatch", "an aws-chunked chunk signature does not match")
            self.previous = expected
        self._hash = hashlib.sha256()
        self._state = "trailer" if final else "crlf"

    def finish(self) -> None:
        if self._state == "trailer" and not self._line:
            self._state = "done"  # a body that ends right after the final chunk (no trailer, no CRLF)
        if self._state != "done":
            raise S3Error("IncompleteBody", "the aws-chunked body ended before its final chunk")
