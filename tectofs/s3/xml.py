"""S3's XML: error documents and codes, result documents, and the request bodies the
gateway reads (CompleteMultipartUpload, Delete).

Contract: every failure the gateway answers is an :class:`S3Error` (code, message, HTTP
status from :data:`STATUS`); :func:`from_tectofs` maps the client library's errors onto S3
codes in one place. Documents are built with ``xml.etree.ElementTree`` (escaping included)
and carry S3's namespace; request bodies are parsed with a size bound and without caring
whether the client sent the namespace.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from typing import Any, Iterable

from tectofs import errors

NAMESPACE = "http://s3.amazonaws.com/doc/2006-03-01/"
BODY_MAX_BYTES = 2 << 20  # a Delete of 1,000 keys or a Complete of 10,000 parts fits

STATUS = {
    "AccessDenied": 403, "AuthorizationHeaderMalformed": 400, "AuthorizationQueryParametersError": 400,
    "BadDigest": 400, "BucketAlreadyExists": 409, "BucketAlreadyOwnedByYou": 409, "BucketNotEmpty": 409,
    "EntityTooLarge": 400, "EntityTooSmall": 400, "IncompleteBody": 400, "InternalError": 500,
    "InvalidAccessKeyId": 403, "InvalidArgument": 400, "InvalidBucketName": 400, "InvalidDigest": 400,
    "InvalidPart": 400, "InvalidPartOrder": 400, "InvalidPartNumber": 416, "InvalidRange": 416, "InvalidRequest": 400,
    "KeyTooLongError": 400, "MalformedXML": 400, "MethodNotAllowed": 405, "MissingContentLength": 411,
    "NoSuchBucket": 404, "NoSuchKey": 404, "NoSuchUpload": 404, "NotImplemented": 501,
    "PreconditionFailed": 412, "RequestTimeTooSkewed": 403, "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403, "SlowDown": 503, "XAmzContentSHA256Mismatch": 400,
}


MISSING_MESSAGES = {"NoSuchKey": "The specified key does not exist.", "NoSuchBucket": "The specified bucket does not exist",
                    "NoSuchUpload": "The specified upload does not exist."}


class S3Error(Exception):
    """An S3 error answer: ``code`` (S3's), a message, and the resource it concerns."""

    def __init__(self, code: str, message: str, resource: str = "", *, http_status: int = 0, **extra: str) -> None:
        super().__init__(message)
        self.code, self.message, self.resource, self.extra = code, message, resource, extra
        self.http_status = http_status  # 0: the code's usual status (STATUS)

    @property
    def status(self) -> int:
        return self.http_status or STATUS.get(self.code, 400)


def from_tectofs(exc: errors.TectofsError, resource: str, missing: str = "NoSuchKey") -> S3Error:
    """The S3 error for a client library failure on ``resource``; ``missing`` is the code
    for "not there" (NoSuchKey for objects, NoSuchBucket for buckets, NoSuchUpload)."""
    if isinstance(exc, (errors.NotFound, errors.NotADirectory, errors.IsADirectory)):
        return S3Error(missing, MISSING_MESSAGES.get(missing, str(exc)), resource)
    if isinstance(exc, errors.PermissionDenied):
        return S3Error("AccessDenied", "Access Denied", resource)
    if isinstance(exc, errors.DirectoryNotEmpty):
        return S3Error("BucketNotEmpty", "The bucket you tried to delete is not empty", resource)
    if isinstance(exc, errors.AlreadyExists):
        return S3Error("BucketAlreadyExists", str(exc), resource)
    if isinstance(exc, (errors.InvalidPath, errors.NameTooLong)):
        return S3Error("KeyTooLongError" if isinstance(exc, errors.NameTooLong) else "InvalidArgument", str(exc), resource)
    if isinstance(exc, errors.Busy):
        return S3Error("SlowDown", str(exc), resource)
    if isinstance(exc, (errors.NoSpace, errors.Timeout, errors.ConnectionLost, errors.DataUnavailable)):
        return S3Error("ServiceUnavailable", str(exc), resource)
    return S3Error("InternalError", f"{type(exc).__name__}: {exc}", resource)


# ---------------------------------------------------------------------------- documents


def _element(parent: ET.Element, tag: str, value: Any = None) -> ET.Element:
    child = ET.SubElement(parent, tag)
    if value is not None:
        child.text = str(value).lower() if isinstance(value, bool) else str(value)
    return child


def fill(parent: ET.Element, fields: Iterable[tuple[str, Any]]) -> ET.Element:
    """Children ``<tag>value</tag>`` for each pair; a value None is left out."""
    for tag, value in fields:
        if value is not None:
            _element(parent, tag, value)
    return parent


def document(root_tag: str, fields: Iterable[tuple[str, Any]] = (), namespace: bool = True) -> ET.Element:
    root = ET.Element(root_tag, {"xmlns": NAMESPACE} if namespace else {})
    return fill(root, fields)


def child(parent: ET.Element, tag: str, fields: Iterable[tuple[str, Any]] = ()) -> ET.Element:
    return fill(ET.SubElement(parent, tag), fields)


def render(root: ET.Element) -> bytes:
    """The document, with a carriage return in text written ``&#13;`` (as S3 does: an XML
    parser would turn a raw one into a newline)."""
    body = ET.tostring(root, encoding="utf-8", xml_declaration=False).replace(b"\r", b"&#13;")
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + body


def error_document(error: S3Error, request_id: str) -> bytes:
    root = document("Error", [("Code", error.code), ("Message", error.message),
                              ("Resource", error.resource or None), *error.extra.items(), ("RequestId", request_id)],
                    namespace=False)
    return render(root)


def timestamp(seconds: float) -> str:
    """ISO 8601 in UTC with milliseconds, as S3 writes times in XML."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


def http_date(seconds: float) -> str:
    """RFC 7231 date, as S3 writes Last-Modified."""
    return time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(seconds))


def owner(parent: ET.Element, uid: int, name: str = "") -> None:
    child(parent, "Owner", [("ID", str(uid)), ("DisplayName", name or str(uid))])


# ---------------------------------------------------------------------------- request bodies


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse_body(body: bytes, root_tag: str) -> ET.Element:
    """The parsed request document, refusing others (MalformedXML)."""
    if len(body) > BODY_MAX_BYTES:
        raise S3Error("MalformedXML", f"request document larger than {BODY_MAX_BYTES} bytes")
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise S3Error("MalformedXML", f"The XML you provided was not well-formed: {exc}") from None
    if _local(root.tag) != root_tag:
        raise S3Error("MalformedXML", f"expected a {root_tag} document, got {_local(root.tag)}")
    return root


def children(element: ET.Element, tag: str) -> list[ET.Element]:
    return [c for c in element if _local(c.tag) == tag]


def text(element: ET.Element, tag: str, default: str | None = None) -> str:
    found = children(element, tag)
    if not found:
        if default is None:
            raise S3Error("MalformedXML", f"{_local(element.tag)} lacks {tag}")
        return default
    return found[0].text or ""


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """A CompleteMultipartUpload body -> [(part number, ETag without quotes)]."""
    parts = []
    for part in children(parse_body(body, "CompleteMultipartUpload"), "Part"):
        try:
            number = int(text(part, "PartNumber"))
        except ValueError:
            raise S3Error("MalformedXML", "PartNumber must be a number") from None
        parts.append((number, text(part, "ETag").strip().strip('"')))
    if not parts:
        raise S3Error("MalformedXML", "CompleteMultipartUpload names no part")
    return parts


def parse_delete(body: bytes) -> tuple[list[str], bool]:
    """A Delete body -> (keys, quiet)."""
    root = parse_body(body, "Delete")
    keys = [text(o, "Key") for o in children(root, "Object")]
    if len(keys) > 1000:
        raise S3Error("MalformedXML", "a Delete names at most 1000 keys")
    return keys, text(root, "Quiet", "false").strip().lower() == "true"
