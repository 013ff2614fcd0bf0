"""The S3 gateway's rules in memory (no processes): conditional requests, part spans, copy
ranges, the Complete list, stored headers, ``encoding-type=url``, records, and SigV2 /
SigV4 presigned URL checks against botocore's own signers."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import parse_qsl, unquote_plus, urlsplit

import pytest
from botocore.auth import HmacV1QueryAuth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tectofs.client import Stat
from tectofs.s3 import headers, multipart, sigv4
from tectofs.s3.handlers import url_encode
from tectofs.s3.objects import Record
from tectofs.s3.xml import S3Error, document, render

ETAG = "0123456789abcdef0123456789abcdef"
MTIME = 1_700_000_000.5
BEFORE, AT, AFTER = "Tue, 14 Nov 2023 21:13:19 GMT", "Tue, 14 Nov 2023 22:13:20 GMT", "Tue, 14 Nov 2023 23:13:20 GMT"


def _outcome(**given: str) -> int:
    """200, 304 or 412 for conditions named like boto3's (If_Match -> If-Match)."""
    request = {name.replace("_", "-"): value for name, value in given.items()}
    try:
        return headers.evaluate(request, ETAG, MTIME) or 200
    except S3Error as exc:
        assert exc.code == "PreconditionFailed" and exc.status == 412
        return 412


def test_conditions_follow_s3_precedence() -> None:
    assert _outcome() == 200
    assert _outcome(If_Modified_Since=BEFORE) == 200
    assert _outcome(If_Modified_Since=AT) == 304  # not modified since that very second
    assert _outcome(If_Unmodified_Since=AT) == 200
    assert _outcome(If_Unmodified_Since=BEFORE) == 412
    assert _outcome(If_Match=f'"{ETAG}"', If_Unmodified_Since=BEFORE) == 200
    assert _outcome(If_Match='"other"', If_Unmodified_Since=AFTER) == 412
    assert _outcome(If_None_Match='"other"', If_Modified_Since=AFTER) == 200
    assert _outcome(If_None_Match=f'"{ETAG}"', If_Modified_Since=BEFORE) == 304
    assert _outcome(If_None_Match=f'"x", W/"{ETAG}"') == 304
    assert _outcome(If_Match="*") == 200
    assert _outcome(If_Modified_Since="not a date") == 200  # ignored, as S3 does
    copy = {"x-amz-copy-source-If-None-Match": f'"{ETAG}"'}
    with pytest.raises(S3Error) as err:
        headers.check_copy_source(copy, ETAG, MTIME)
    assert err.value.extra["Condition"] == "x-amz-copy-source-If-None-Match"
    headers.check_copy_source({"x-amz-copy-source-If-Modified-Since": BEFORE}, ETAG, MTIME)


def test_part_spans_and_numbers() -> None:
    record = Record(etag=ETAG, parts=Record.runs([5, 5, 5, 2]))
    assert record.parts == [[5, 3], [2, 1]]
    assert [headers.part_span(record, 17, n) for n in (1, 3, 4)] == [(0, 5, 4), (10, 15, 4), (15, 17, 4)]
    with pytest.raises(S3Error) as err:
        headers.part_span(record, 17, 5)
    assert (err.value.code, err.value.status) == ("InvalidPartNumber", 416)
    assert headers.part_span(Record(etag=ETAG), 9, 1) == (0, 9, 0)  # single part: the whole object, no count
    assert headers.part_span(record, 99, 1) == (0, 99, 0)  # sizes no longer add up: the file changed
    for bad in ("0", "10001", "x", "-1", ""):
        with pytest.raises(S3Error):
            headers.part_number({"partNumber": bad})
    assert headers.part_number({}) is None and headers.part_number({"partNumber": "10000"}) == 10_000


def test_copy_ranges() -> None:
    assert headers.copy_range(None, 10) == (0, 10)
    assert headers.copy_range("bytes=2-4", 10) == (2, 5)
    for improper in ("bytes=4-2", "bytes=-3", "bytes=3-", "bytes=1-2,4-5", "items=1-2"):
        with pytest.raises(S3Error) as err:
            headers.copy_range(improper, 10)
        assert err.value.code == "InvalidArgument", improper
    with pytest.raises(S3Error) as err:
        headers.copy_range("bytes=5-10", 10)
    assert err.value.code == "InvalidRange"


def test_complete_lists() -> None:
    big, small = multipart.PART_BYTES_MIN, 1
    have = {n: (_stat(big if n < 3 else small), Record(etag=f"e{n}")) for n in (1, 2, 3)}
    assert multipart.chosen_parts([(1, "e1"), (2, "e2"), (3, "e3")], have) == [1, 2, 3]
    assert multipart.chosen_parts([(1, "old"), (1, "e1"), (3, "e3")], have) == [1, 3]  # part 1 listed twice
    for wanted, code in (([(2, "e2"), (1, "e1")], "InvalidPartOrder"), ([(1, "old")], "InvalidPart"),
                         ([(4, "e4")], "InvalidPart"), ([(3, "e3"), (3, "e3"), (4, "x")], "InvalidPart")):
        with pytest.raises(S3Error) as err:
            multipart.chosen_parts(wanted, have)
        assert err.value.code == code, wanted
    small_first = {1: (_stat(small), Record(etag="e1")), 2: (_stat(small), Record(etag="e2"))}
    with pytest.raises(S3Error) as err:
        multipart.chosen_parts([(1, "e1"), (2, "e2")], small_first)
    assert err.value.code == "EntityTooSmall"
    assert multipart.chosen_parts([(1, "e1"), (2, "e2")], small_first, part_bytes_min=1) == [1, 2]


def test_a_complete_of_ten_thousand_parts_is_checked_in_linear_time() -> None:
    """S3's largest list (10,000 parts, each listed twice as a client that re-sent every part
    would): a check that looked up each number's ETags by scanning the list took ~10^8 steps."""
    count = 10_000
    have = {n: (_stat(1), Record(etag=f"e{n}")) for n in range(1, count + 1)}
    wanted = [pair for n in range(1, count + 1) for pair in ((n, "stale"), (n, f"e{n}"))]
    started = time.process_time()
    assert multipart.chosen_parts(wanted, have, part_bytes_min=1) == list(range(1, count + 1))
    assert time.process_time() - started < 2.0  # linear: ~20 ms; quadratic: minutes


def test_a_list_parts_page_reads_the_records_of_its_parts_only() -> None:
    """Each page of a ListParts of 10,000 parts reads the ETags of the parts it shows, not of
    every part stored (paging through them all read 100,000 records before)."""
    count, upload = 10_000, "0" * 32 + "-0"
    read: list[str] = []

    class Parts:
        async def scandir(self, path: str) -> list[tuple[str, Stat]]:
            return [(f"part-{n:05d}", _stat(n)) for n in range(count, 0, -1)]  # any order

        async def getxattr(self, path: str, name: str) -> bytes:
            read.append(path)
            return Record(etag=f"e{path.rsplit('-', 1)[1]}", size=int(path.rsplit("-", 1)[1]), mtime=0.0).encode()

    page = asyncio.run(multipart.parts(Parts(), "bucket", upload, after=1000, limit=1001))  # type: ignore[arg-type]
    assert [n for n, _, _ in page] == list(range(1001, 2002))
    assert [record.etag for _, _, record in page][:2] == ["e01001", "e01002"]
    assert len(read) == 1001
    assert asyncio.run(multipart.parts(Parts(), "bucket", upload, after=9_999))[0][0] == 10_000  # type: ignore[arg-type]


def _stat(size: int) -> Stat:
    return Stat(ino=1, kind="file", size=size, mode=0o644, uid=0, gid=0, atime=0.0, mtime=0.0, ctime=0.0, nlink=1,
                policy="", block_size=1 << 20, target=None)


def test_stored_headers_and_overrides() -> None:
    given = {"Cache-Control": "no-cache", "Content-Encoding": "aws-chunked, gzip", "Expires": "x", "Other": "no"}
    assert headers.stored(given) == {"Cache-Control": "no-cache", "Content-Encoding": "gzip", "Expires": "x"}
    assert headers.stored({"Content-Encoding": "aws-chunked"}) == {}
    answer = {"Content-Type": "a/b"}
    headers.override(answer, {"response-content-type": "c/d", "response-expires": "y", "unrelated": "z"})
    assert answer == {"Content-Type": "c/d", "Expires": "y"}


def test_url_encoding_as_s3_and_botocore_decode_it() -> None:
    assert url_encode("a b+c/d*e~f\ng\r") == "a+b%2Bc/d*e%7Ef%0Ag%0D"
    assert url_encode("é") == "%C3%A9"
    for key in ("a b+c/d*e~f\ng\r", "é/ü&<>'\"", "%41"):
        assert unquote_plus(url_encode(key)) == key
    assert b"&#13;" in render(document("K", [("Key", "a\rb")]))


def test_records_round_trip() -> None:
    full = Record(etag=ETAG, content_type="t/x", metadata={"k": "v"}, size=3, mtime=1.5,
                  headers={"Cache-Control": "c"}, parts=[[5, 2], [1, 1]], upload_id="u" * 32)
    assert Record.decode(full.encode()) == full
    assert b"parts" not in Record(etag=ETAG).encode()  # the common record stays as small as before
    assert Record.decode(b'{"etag": "e"}') == Record(etag="e")
    assert Record.decode(b'{"etag": "e", "parts": [["x"]]}') is None


def _query(url: str) -> list[tuple[str, str]]:
    return parse_qsl(urlsplit(url).query, keep_blank_values=True)


def test_sigv2_presigned_urls_as_botocore_signs_them() -> None:
    for key, extra in (("plain", ""), ("a key+with/odd~chars", ""), ("k", "response-content-type=x%2Fy")):
        url = f"http://127.0.0.1:9/bucket/{'%20'.join(key.split(' ')).replace('+', '%2B')}"
        if extra:
            url += "?" + extra
        request = AWSRequest("GET", url)
        HmacV1QueryAuth(Credentials("alice", "secret"), expires=60).add_auth(request)
        parts = urlsplit(request.url)
        query = _query(request.url)
        signed = sigv4.parse({}, query)
        assert signed is not None and signed.version == 2 and signed.access_key == "alice"
        sigv4.verify(signed, "secret", "GET", parts.path, query, {})
        with pytest.raises(S3Error) as err:
            sigv4.verify(signed, "wrong", "GET", parts.path, query, {})
        assert err.value.code == "SignatureDoesNotMatch"
        with pytest.raises(S3Error) as err:
            sigv4.verify(signed, "secret", "GET", parts.path, query, {}, now=time.time() + 120)
        assert (err.value.code, err.value.message) == ("AccessDenied", "Request has expired")


def test_sigv4_presigned_expiry_limits() -> None:
    request = AWSRequest("GET", "http://127.0.0.1:9/bucket/key")
    S3SigV4QueryAuth(Credentials("alice", "secret"), "s3", "us-east-1", expires=60).add_auth(request)
    query = _query(request.url)
    signed = sigv4.parse({}, query)
    assert signed is not None
    sigv4.verify(signed, "secret", "GET", "/bucket/key", query, {"host": "127.0.0.1:9"})
    for expires in ("0", "-5", "604801", "soon"):
        changed = [(k, expires if k == "X-Amz-Expires" else v) for k, v in query]
        with pytest.raises(S3Error) as err:
            sigv4.parse({}, changed)
        assert (err.value.code, err.value.status) == ("AuthorizationQueryParametersError", 403), expires
