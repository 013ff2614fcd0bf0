"""Multipart uploads: parts staged as files outside the bucket, assembled into the object
by streaming them, in order, into one atomically published file.

Layout and who may act on an upload: :mod:`.staging` (``/.tectofs-multipart/<bucket>/<uid>/
<upload id>``, the initiator's own directory; the extended attribute ``user.s3.upload`` holds
the key, content type, metadata and the bucket's inode number, so an upload outlives no
bucket). Each part is ``part-NNNNN``, published like an object (staged, recorded with its MD5,
renamed), so a part upload that fails leaves the previous part of that number, or none.
Create checks that the caller may publish the key before anything is made.

Complete checks the part list (:func:`chosen_parts`: numbers not decreasing, ETags matching,
every part but the last at least 5 MiB, as S3 requires), streams the parts into the object (two
reads in memory at a time, whatever the object's size), publishes it with the multipart ETag
(MD5 of the parts' MD5s, ``-N``), the parts' sizes (GET ``?partNumber=N``) and the upload id in
its record, then removes the upload; the list is checked before the (long) assembly starts, so
a wrong list is an ordinary error answer. A Complete sent again answers from the object's
record (:func:`completed`). Abort removes the upload directory.

Every function taking ``fs`` acts through it on the upload: the caller's view, or the
initiator's (:func:`~tectofs.s3.staging.view_for`) when the bucket's owner lists or aborts it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import AsyncIterator, Awaitable, Callable

from tectofs import errors, paths
from tectofs.client import AsyncFileSystem, Stat

from . import staging
from .objects import Record, locate, object_path, record_of, require_bucket, stream_file, write_file
from .principals import Principal
from .staging import no_such_upload, upload_path
from .xml import S3Error, from_tectofs

UPLOAD_XATTR = "user.s3.upload"
PART_NUMBER_MAX = 10_000
PART_BYTES_MIN = 5 << 20
RECORDS_PARALLEL = 32  # part records read at once (a Complete of 10,000 parts)
SMALL_PART_BYTES = 1 << 20  # parts up to this are read whole, several at once, when assembled
SMALL_PARTS_AHEAD = 16  # ... this many ahead (at most 16 MiB in memory)


def part_path(bucket: str, upload_id: str, number: int) -> str:
    if not 1 <= number <= PART_NUMBER_MAX:
        raise S3Error("InvalidArgument", f"Part number must be an integer between 1 and {PART_NUMBER_MAX}, inclusive")
    return paths.join(upload_path(bucket, upload_id), f"part-{number:05d}")


async def create(fs: AsyncFileSystem, gateway_fs: AsyncFileSystem, principal: Principal, bucket: str, key: str,
                 content_type: str, metadata: dict[str, str], headers: dict[str, str] | None = None) -> str:
    """Start an upload of ``key``; returns its id. The caller must be able to publish the key
    (:func:`~tectofs.s3.staging.check_may_put`) before anything is made; ``gateway_fs`` (root)
    makes the caller's staging directory on their first upload into the bucket."""
    object_path(bucket, key)  # refuse keys that cannot be stored now, not at the end
    bucket_st = await staging.check_may_put(fs, principal, bucket, key)
    upload_id = staging.new_upload_id(principal.uid)
    try:
        directory = await staging.make_upload(fs, gateway_fs, principal, bucket, upload_id, bucket_st)
        info = {"key": key, "content_type": content_type, "metadata": metadata, "headers": headers or {},
                "bucket": bucket_st.ino}
        await fs.setxattr(directory, UPLOAD_XATTR, json.dumps(info).encode())
    except errors.TectofsError as exc:
        raise from_tectofs(exc, f"/{bucket}/{key}") from None
    return upload_id


async def info(fs: AsyncFileSystem, bucket: str, key: str | None, upload_id: str) -> dict[str, object]:
    """An upload's key, content type and metadata; NoSuchUpload unless it exists (and, when
    ``key`` is given, is an upload of that key)."""
    try:
        found = json.loads(await fs.getxattr(upload_path(bucket, upload_id), UPLOAD_XATTR))
    except (errors.TectofsError, ValueError) as exc:
        if isinstance(exc, errors.PermissionDenied):
            raise S3Error("AccessDenied", "Access Denied", upload_id) from None
        await require_bucket(fs, bucket)
        raise no_such_upload(upload_id) from None
    if not isinstance(found, dict) or key is not None and found.get("key") != key:
        raise no_such_upload(upload_id)
    return found


async def require_current(fs: AsyncFileSystem, bucket: str, upload: dict[str, object], upload_id: str) -> None:
    """NoSuchUpload unless the upload was started in the bucket now at ``bucket`` (not in one
    of that name deleted since)."""
    if upload.get("bucket") != (await require_bucket(fs, bucket)).ino:
        raise no_such_upload(upload_id)


async def upload_part(fs: AsyncFileSystem, bucket: str, key: str, upload_id: str, number: int,
                      body: AsyncIterator[memoryview | bytes], md5: "hashlib._Hash") -> Record:
    """Store one part (``body`` updates ``md5`` as it is read); returns its record."""
    path = part_path(bucket, upload_id, number)
    await info(fs, bucket, key, upload_id)
    try:
        return await write_file(fs, path, body, lambda: Record(etag=md5.hexdigest()), make_parents=False)
    except errors.NotFound:
        raise no_such_upload(upload_id) from None


async def parts(fs: AsyncFileSystem, bucket: str, upload_id: str, after: int = 0,
                limit: int | None = None) -> list[tuple[int, Stat, Record]]:
    """The upload's parts numbered above ``after``: ``(number, stat, record)`` by number, the
    first ``limit`` of them (all when None). Only those returned have their record read: a
    page of a ListParts costs one record per part shown, not one per part stored."""
    directory = upload_path(bucket, upload_id)
    stored = sorted((int(name[5:]), name, st) for name, st in await fs.scandir(directory)
                    if name.startswith("part-") and name[5:].isdigit() and st.is_file)
    wanted = [part for part in stored if part[0] > after][:limit]
    gate = asyncio.Semaphore(RECORDS_PARALLEL)

    async def one(number: int, name: str, st: Stat) -> tuple[int, Stat, Record]:
        async with gate:
            return number, st, await record_of(fs, paths.join(directory, name), st)

    return list(await asyncio.gather(*(one(*part) for part in wanted)))


def chosen_parts(wanted: list[tuple[int, str]], have: dict[int, tuple[Stat, Record]],
                 part_bytes_min: int = PART_BYTES_MIN) -> list[int]:
    """The part numbers a Complete's list (``wanted``: part number, ETag) assembles, in order.

    As S3: the numbers must not decrease (``InvalidPartOrder``); each must name a part as it
    is stored now (``InvalidPart``); every part but the last is at least ``part_bytes_min``
    (``EntityTooSmall``). A number listed more than once (a client that re-sent a part and
    listed both answers) is one part, the one stored: one of its entries must carry its ETag."""
    numbers = [n for n, _ in wanted]
    if numbers != sorted(numbers):
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order. The parts list must be"
                      " specified in order by part number.")
    etags: dict[int, set[str]] = {}
    for number, etag in wanted:
        etags.setdefault(number, set()).add(etag)
    chosen: list[int] = []
    for number, listed in etags.items():  # in the list's order, each number once
        part = have.get(number)
        if part is None or part[1].etag not in listed:
            raise S3Error("InvalidPart", f"One or more of the specified parts could not be found (part {number}).")
        chosen.append(number)
    for number in chosen[:-1]:
        if have[number][0].size < part_bytes_min:
            raise S3Error("EntityTooSmall", f"Your proposed upload is smaller than the minimum allowed object size"
                          f" (part {number}: {have[number][0].size} bytes).")
    return chosen


async def completed(fs: AsyncFileSystem, bucket: str, key: str, upload_id: str) -> Record | None:
    """The object a Complete of ``upload_id`` already published, if it is still the one at
    ``key`` (its record names the upload): what a retried Complete answers."""
    try:
        found = await locate(fs, bucket, key)
    except S3Error:
        return None
    if found is None:
        return None
    record = await record_of(fs, *found)
    return record if record.upload_id == upload_id else None


async def prepare_complete(fs: AsyncFileSystem, bucket: str, key: str, upload_id: str,
                           wanted: list[tuple[int, str]],
                           part_bytes_min: int = PART_BYTES_MIN) -> Callable[[], Awaitable[Record]]:
    """Check a Complete's part list (``wanted``: part number, ETag) at once; returns what
    assembles and publishes the object (which may take minutes) and removes the upload.

    Idempotent, as S3: the object's record names the upload, so a Complete sent again (its
    first answer lost) answers the same success while the object is the one it made — after
    the upload is gone, and also when a crash came between publishing and removing the
    upload (the object is published atomically first, then the upload removed)."""
    done = await completed(fs, bucket, key, upload_id)
    if done is not None:
        async def answer_again() -> Record:
            try:
                await abort(fs, bucket, upload_id)
            except S3Error:
                pass  # removed already (the usual case)
            return done

        return answer_again
    upload = await info(fs, bucket, key, upload_id)
    await require_current(fs, bucket, upload, upload_id)
    have = {n: (st, record) for n, st, record in await parts(fs, bucket, upload_id)}
    chosen = chosen_parts(wanted, have, part_bytes_min)

    def concatenated() -> AsyncIterator[bytes]:
        return _concatenated(fs, [(part_path(bucket, upload_id, n), have[n][0].size) for n in chosen])

    digest = hashlib.md5(b"".join(bytes.fromhex(have[n][1].etag) for n in chosen)).hexdigest()

    async def assemble() -> Record:
        record = await write_file(fs, object_path(bucket, key), concatenated(), lambda: Record(
            etag=f"{digest}-{len(chosen)}", content_type=str(upload.get("content_type") or Record.content_type),
            metadata=dict(upload.get("metadata") or {}),  # type: ignore[call-overload]
            headers=dict(upload.get("headers") or {}),  # type: ignore[call-overload]
            parts=Record.runs([have[n][0].size for n in chosen]), upload_id=upload_id))
        await abort(fs, bucket, upload_id)
        return record

    return assemble


async def _concatenated(fs: AsyncFileSystem, files: list[tuple[str, int]]) -> AsyncIterator[bytes]:
    """The bytes of ``files`` (path, size) one after the other. Small parts (up to
    :data:`SMALL_PART_BYTES`) are read whole, up to :data:`SMALL_PARTS_AHEAD` of them ahead
    (one round trip each would otherwise make 10,000 tiny parts take minutes); larger ones
    stream (:func:`~tectofs.s3.objects.stream_file`)."""
    ahead: dict[int, asyncio.Future[bytes]] = {}
    try:
        for index, (path, size) in enumerate(files):
            if size > SMALL_PART_BYTES:
                async for data in stream_file(fs, path, 0, size):
                    yield data
                continue
            for later in range(index, min(len(files), index + SMALL_PARTS_AHEAD)):
                if later not in ahead and files[later][1] <= SMALL_PART_BYTES:
                    ahead[later] = asyncio.ensure_future(fs.read_range(files[later][0], 0, files[later][1]))
            yield await ahead.pop(index)
    finally:
        for future in ahead.values():
            future.cancel()


async def abort(fs: AsyncFileSystem, bucket: str, upload_id: str) -> None:
    """Remove an upload and its parts."""
    try:
        await fs.rmtree(upload_path(bucket, upload_id))
    except errors.NotFound:
        await require_bucket(fs, bucket)
        raise no_such_upload(upload_id) from None
    except errors.TectofsError as exc:
        raise from_tectofs(exc, upload_id, missing="NoSuchUpload") from None


async def uploads(fs: AsyncFileSystem, gateway_fs: AsyncFileSystem, principal: Principal, bucket: str,
                  prefix: str) -> list[tuple[str, str, float]]:
    """Uploads in progress in ``bucket`` whose key starts with ``prefix``: ``(key, upload id,
    started)``, sorted by key. The bucket's owner (and root) see everyone's (each user's read
    as that user); anyone else their own."""
    bucket_st = await require_bucket(fs, bucket)
    if principal.uid in (0, bucket_st.uid):
        views = [(uid, gateway_fs if uid == principal.uid == 0 else fs if uid == principal.uid
                  else gateway_fs.acting_as(uid, st.gid)) for uid, st in await staging.user_areas(gateway_fs, bucket)]
    else:
        views = [(principal.uid, fs)]
    found = []
    for uid, view in views:
        directory = staging.user_area(bucket, uid)
        try:
            entries = await view.scandir(directory)
        except errors.TectofsError:
            continue  # none here (or not theirs to read)
        for upload_id, st in entries:
            try:
                staging.initiator_of(upload_id)
                upload = json.loads(await view.getxattr(paths.join(directory, upload_id), UPLOAD_XATTR))
                key = str(upload["key"])
            except (S3Error, errors.TectofsError, ValueError, KeyError, TypeError):
                continue
            if key.startswith(prefix) and upload.get("bucket") == bucket_st.ino:
                found.append((key, upload_id, st.ctime))
    return sorted(found)
