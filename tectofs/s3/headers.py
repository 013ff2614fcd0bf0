"""What an object answers with beyond its bytes, as S3 documents it: the headers stored at
PUT and given back by GET and HEAD, the ``response-*`` overrides, conditional requests
(``If-Match`` and friends, and CopyObject's ``x-amz-copy-source-if-*``), and the span of
``?partNumber=N``.

Sans-I/O: functions of a request's headers and query and of an object's record and times.
"""

from __future__ import annotations

import email.utils
import re
from typing import Mapping

from .objects import Record
from .xml import S3Error

# Headers a PUT (or CreateMultipartUpload, or a copy with REPLACE) may set and GET/HEAD return.
STORED = ("Cache-Control", "Content-Disposition", "Content-Encoding", "Content-Language", "Expires")
# GET ?response-<name>=value answers with that header instead of the stored one.
OVERRIDES = {"response-content-type": "Content-Type", "response-content-language": "Content-Language",
             "response-expires": "Expires", "response-cache-control": "Cache-Control",
             "response-content-disposition": "Content-Disposition", "response-content-encoding": "Content-Encoding"}
COPY_SOURCE = "x-amz-copy-source-"
PART_NUMBER_MAX = 10_000


def stored(request_headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of :data:`STORED` a request sets, with ``aws-chunked`` (a transfer
    framing, not the object's encoding) taken out of Content-Encoding."""
    out = {name: request_headers[name] for name in STORED if name in request_headers}
    if "Content-Encoding" in out:
        codings = [c.strip() for c in out["Content-Encoding"].split(",")]
        kept = [c for c in codings if c and c.lower() != "aws-chunked"]
        if kept:
            out["Content-Encoding"] = ",".join(kept)
        else:
            del out["Content-Encoding"]
    return out


def override(headers: dict[str, str], query: Mapping[str, str]) -> None:
    """Apply the ``response-*`` parameters of ``query`` to ``headers`` (in place)."""
    for name, header in OVERRIDES.items():
        if name in query:
            headers[header] = query[name]


# ---------------------------------------------------------------------------- conditions


def http_time(text: str | None) -> float | None:
    """An HTTP date (RFC 7231, or the older forms) as epoch seconds; None if absent or not a
    date (S3 then ignores the condition)."""
    if not text:
        return None
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _matches(header: str, etag: str) -> bool:
    tags = {t.strip().removeprefix("W/").strip('"') for t in header.split(",")}
    return "*" in tags or etag in tags


def evaluate(request_headers: Mapping[str, str], etag: str, mtime: float, prefix: str = "") -> int | None:
    """S3's conditional request rules (RFC 7232's precedence) for an object with ``etag`` and
    ``mtime``: raises PreconditionFailed (412), returns 304 when the object is not to be
    sent, None when the request goes ahead. ``prefix`` :data:`COPY_SOURCE` reads CopyObject's
    ``x-amz-copy-source-if-*`` headers (the caller turns 304 into 412 there).

    If-Match, when present, decides alone between 412 and going on (If-Unmodified-Since is
    then ignored); else If-Unmodified-Since earlier than the object's time fails. Then
    If-None-Match, when present, decides alone between 304 and going on (If-Modified-Since
    ignored); else If-Modified-Since not earlier than the object's time gives 304. Times
    compare at whole seconds (HTTP dates have no fractions)."""
    modified = int(mtime)
    if_match = request_headers.get(prefix + "If-Match")
    if if_match is not None:
        if not _matches(if_match, etag):
            raise _failed(prefix + "If-Match")
    else:
        since = http_time(request_headers.get(prefix + "If-Unmodified-Since"))
        if since is not None and modified > since:
            raise _failed(prefix + "If-Unmodified-Since")
    if_none = request_headers.get(prefix + "If-None-Match")
    if if_none is not None:
        return 304 if _matches(if_none, etag) else None
    since = http_time(request_headers.get(prefix + "If-Modified-Since"))
    if since is not None and modified <= since:
        return 304
    return None


def _failed(condition: str) -> S3Error:
    return S3Error("PreconditionFailed", "At least one of the pre-conditions you specified did not hold",
                   Condition=condition)


def check_copy_source(request_headers: Mapping[str, str], etag: str, mtime: float) -> None:
    """CopyObject's and UploadPartCopy's conditions on the source: any that fails is 412."""
    if evaluate(request_headers, etag, mtime, COPY_SOURCE) is not None:
        raise _failed(COPY_SOURCE + "If-None-Match" if COPY_SOURCE + "If-None-Match" in request_headers
                      else COPY_SOURCE + "If-Modified-Since")


# ---------------------------------------------------------------------------- spans


def part_number(query: Mapping[str, str]) -> int | None:
    """``?partNumber=N`` (1 to 10,000), or None."""
    text = query.get("partNumber")
    if text is None:
        return None
    if not re.fullmatch(r"\d{1,5}", text) or not 1 <= int(text) <= PART_NUMBER_MAX:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {PART_NUMBER_MAX}, inclusive",
                      ArgumentName="partNumber", ArgumentValue=text[:20])
    return int(text)


def part_span(record: Record, size: int, number: int) -> tuple[int, int, int]:
    """``(start, end, parts count)`` of part ``number`` of an object; a single-part object
    has one part, the whole object (count 0: S3 sends no PartsCount for it)."""
    sizes = record.part_sizes() if sum(s * c for s, c in record.parts) == size else []
    if not sizes:
        if number != 1:
            raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable", PartNumberRequested=str(number),
                          ActualPartCount="1")
        return 0, size, 0
    if number > len(sizes):
        raise S3Error("InvalidPartNumber", "The requested partnumber is not satisfiable", PartNumberRequested=str(number),
                      ActualPartCount=str(len(sizes)))
    start = sum(sizes[: number - 1])
    return start, start + sizes[number - 1], len(sizes)


def copy_range(header: str | None, size: int) -> tuple[int, int]:
    """UploadPartCopy's ``x-amz-copy-source-range: bytes=first-last`` -> ``[start, end)``;
    the whole source without one. As S3: any other form is InvalidArgument; a range that
    does not lie within the source is InvalidRange."""
    if header is None:
        return 0, size
    match = re.fullmatch(r"bytes=(\d+)-(\d+)", header.strip())
    if match is None or int(match.group(1)) > int(match.group(2)):
        raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be of the form bytes=first-last where"
                      " first and last are the zero-based offsets of the first and last bytes to copy",
                      ArgumentName="x-amz-copy-source-range", ArgumentValue=header[:100])
    first, last = int(match.group(1)), int(match.group(2))
    if last >= size:
        raise S3Error("InvalidRange", f"The requested range is not satisfiable: bytes {first}-{last} of an object of"
                      f" {size} bytes", ActualObjectSize=str(size))
    return first, last + 1
