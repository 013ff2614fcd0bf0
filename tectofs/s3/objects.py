"""Objects as files: where a key lives, what the gateway records about it, and the
streaming write, read and copy every object operation is built from.

- Bucket ``b``, key ``k/x`` is the file ``/b/k/x``; the directories on the way are made as
  needed (and removed again when a delete leaves them empty). A key ending in ``/`` (``k/``, a
  directory marker as consoles and s3fs make them) is the file ``/b/k/.tectofs-dir``.
- **A key that is also a prefix** (``a`` and ``a/b``): ``/b/a`` is the directory of the keys
  below it, and the object ``a`` is its *twin*, the file ``/b/.tectofs-object-a`` beside it.
  Writing ``a/b`` while ``a`` is a file renames the file to its twin (one atomic rename) and
  makes the directory; readers look for the twin when a key's name is missing or a directory;
  when the directory goes (its last key deleted) the twin takes its name back. Names starting with
  ``.tectofs-`` are the gateway's own (staging files, multipart uploads): never keys, never
  listed.
- **Atomic publish.** An object is written to a hidden staging file beside its final name
  (``.tectofs-put-<random>``), closed (one commit), given its record, then renamed onto the
  key (one metadata transaction). A body that fails midway — the client went away, a
  signature or digest did not check out, a chunk server failed — aborts the staging file:
  readers keep the previous object, or find none.
- **Record.** The extended attribute ``user.s3`` holds JSON: ETag, content type, user
  metadata, the headers given at PUT, a multipart object's part sizes and upload id, and the
  size and mtime the object had when they were recorded. A file changed
  since (through the client or the mount) no longer matches them: its ETag is then derived
  from its inode, size and mtime (not an MD5, but it changes whenever the content does).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from tectofs import errors, paths
from tectofs.client import AsyncFileSystem, Stat

from .xml import S3Error, from_tectofs

RECORD_XATTR = "user.s3"
INTERNAL_PREFIX = ".tectofs-"
MARKER_NAME = INTERNAL_PREFIX + "dir"  # in directory d: the object "d/" (a directory marker)
TWIN_PREFIX = INTERNAL_PREFIX + "object-"  # beside directory d: the object "d", when d is also a prefix
READ_BYTES = 4 << 20  # a GET reads and sends this much at a time (one ahead)
KEY_BYTES_MAX = 1024


def hidden(name: str) -> bool:
    """A directory entry that is the gateway's own, never a key."""
    return name.startswith(INTERNAL_PREFIX)


def parent_of(path: str) -> str:
    """``/b/k/x`` -> ``/b/k``."""
    return path.rsplit("/", 1)[0] or "/"


def twin_path(path: str) -> str:
    """``/b/k/d`` -> ``/b/k/.tectofs-object-d``: where the object ``k/d`` lives while ``k/d/``
    is a prefix of other keys (``/b/k/d`` is then their directory)."""
    parent, _, name = path.rpartition("/")
    return f"{parent}/{TWIN_PREFIX}{name}"


def bucket_path(bucket: str) -> str:
    return "/" + bucket


def object_path(bucket: str, key: str) -> str:
    """The file of ``key``, refusing keys that name no file (empty or dot components,
    reserved names). A key ending in ``/`` (a directory marker, ``a/``) is the file
    :data:`MARKER_NAME` in the directory ``a``."""
    if not key or len(key.encode()) > KEY_BYTES_MAX:
        raise S3Error("KeyTooLongError" if key else "InvalidArgument", "keys are 1 to 1024 bytes", key)
    marker = key.endswith("/")
    parts = (key[:-1] if marker else key).split("/")
    if any(p in ("", ".", "..") or hidden(p) or "\0" in p for p in parts):
        raise S3Error("InvalidArgument", f"key {key!r} cannot be stored: tectofs keys have no empty, '.', '..' or"
                      f" '{INTERNAL_PREFIX}*' components", key)
    return paths.join(bucket_path(bucket), *parts, *([MARKER_NAME] if marker else []))


@dataclass
class Record:
    """What the gateway keeps about an object beside its bytes."""

    etag: str
    content_type: str = "binary/octet-stream"
    metadata: dict[str, str] = field(default_factory=dict)
    size: int = -1
    mtime: float = -1.0
    headers: dict[str, str] = field(default_factory=dict)  # Cache-Control, Expires, ... as given at PUT
    parts: list[list[int]] = field(default_factory=list)  # a multipart object's part sizes: [[size, count], ...]
    upload_id: str = ""  # the multipart upload that made it (a retried Complete answers from it)

    def encode(self) -> bytes:
        fields = dataclasses.asdict(self)
        for name in ("headers", "parts", "upload_id"):  # left out when empty: the common record stays small
            if not fields[name]:
                del fields[name]
        return json.dumps(fields, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> "Record | None":
        try:
            fields = json.loads(raw)
            return cls(etag=str(fields["etag"]), content_type=str(fields.get("content_type") or cls.content_type),
                       metadata={str(k): str(v) for k, v in dict(fields.get("metadata") or {}).items()},
                       size=int(fields.get("size", -1)), mtime=float(fields.get("mtime", -1.0)),
                       headers={str(k): str(v) for k, v in dict(fields.get("headers") or {}).items()},
                       parts=[[int(size), int(count)] for size, count in fields.get("parts") or []],
                       upload_id=str(fields.get("upload_id") or ""))
        except (ValueError, KeyError, TypeError):
            return None

    def part_sizes(self) -> list[int]:
        """The sizes of a multipart object's parts, in order (empty for a single-part object)."""
        return [size for size, count in self.parts for _ in range(count)]

    @staticmethod
    def runs(sizes: list[int]) -> list[list[int]]:
        """``[5, 5, 5, 2]`` -> ``[[5, 3], [2, 1]]`` (what :attr:`parts` holds)."""
        out: list[list[int]] = []
        for size in sizes:
            if out and out[-1][0] == size:
                out[-1][1] += 1
            else:
                out.append([size, 1])
        return out


def derived_etag(st: Stat) -> str:
    """The ETag of a file without a valid record: changes with its content."""
    return hashlib.md5(f"{st.ino}:{st.size}:{st.mtime!r}".encode()).hexdigest()


async def record_of(fs: AsyncFileSystem, path: str, st: Stat) -> Record:
    """The object's record if it still describes the file, else one with a derived ETag."""
    try:
        record = Record.decode(await fs.getxattr(path, RECORD_XATTR))
    except errors.TectofsError:
        record = None
    if record is None or record.size != st.size or record.mtime != st.mtime:
        return Record(etag=derived_etag(st), size=st.size, mtime=st.mtime)
    return record


async def locate(fs: AsyncFileSystem, bucket: str, key: str) -> tuple[str, Stat] | None:
    """``(path, stat)`` of the file holding an object: the file at its key, or its twin
    (:func:`twin_path`) when the key's name is a directory (or is missing: a key being turned
    into a twin); None if there is neither. Other failures (AccessDenied) are raised."""
    path = object_path(bucket, key)
    try:
        st: Stat | None = await fs.stat(path)
    except (errors.NotFound, errors.NotADirectory):
        st = None
    except errors.TectofsError as exc:
        raise from_tectofs(exc, f"/{bucket}/{key}") from None
    if st is not None and st.is_file:
        return path, st
    if key.endswith("/"):
        return None
    try:
        twin = await fs.stat(twin_path(path))
    except (errors.NotFound, errors.NotADirectory):
        return None
    except errors.TectofsError as exc:
        raise from_tectofs(exc, f"/{bucket}/{key}") from None
    return (twin_path(path), twin) if twin.is_file else None


async def stat_object(fs: AsyncFileSystem, bucket: str, key: str) -> tuple[str, Stat, Record]:
    """``(path, stat, record)`` of an existing object; NoSuchKey (or NoSuchBucket) otherwise."""
    found = await locate(fs, bucket, key)
    if found is None:
        await require_bucket(fs, bucket)
        raise S3Error("NoSuchKey", "The specified key does not exist.", f"/{bucket}/{key}")
    path, st = found
    return path, st, await record_of(fs, path, st)


async def require_bucket(fs: AsyncFileSystem, bucket: str) -> Stat:
    """The bucket's directory; NoSuchBucket if there is none."""
    try:
        st = await fs.stat(bucket_path(bucket))
    except errors.TectofsError as exc:
        raise from_tectofs(exc, f"/{bucket}", missing="NoSuchBucket") from None
    if not st.is_dir:
        raise S3Error("NoSuchBucket", "The specified bucket does not exist", f"/{bucket}")
    return st


# ---------------------------------------------------------------------------- writing


async def _make_parents(fs: AsyncFileSystem, path: str) -> None:
    """The directories of an object's key below its bucket; NoSuchBucket if the bucket is not
    there (never made here: only CreateBucket makes one). An object in the way (key ``a``
    when ``a/b`` is written) moves to its twin name first (:func:`_to_twin`)."""
    parent = parent_of(path)
    await require_bucket(fs, paths.split(path)[0])
    if not paths.split(parent)[1:]:
        return  # the bucket itself
    for attempt in range(3):  # an object written into the way meanwhile is moved too
        try:
            await fs.mkdir(parent, parents=True, exist_ok=True)
            return
        except errors.NotADirectory:
            if attempt == 2:
                raise
            await _to_twin(fs, parent, bucket_path(paths.split(path)[0]))


async def _to_twin(fs: AsyncFileSystem, directory: str, bucket: str) -> None:
    """Make way for the directory ``directory``: each file on its path below ``bucket`` (an
    object ``a`` when ``a/...`` is written) is renamed to its twin name — one atomic rename,
    and readers look there when the key's name is missing or a directory — and the directory
    is made in its place."""
    below = directory[len(bucket):].strip("/").split("/")
    current = bucket
    for name in below:
        current = paths.join(current, name)
        try:
            st = await fs.stat(current)
        except errors.NotFound:
            return  # nothing further down exists: mkdir will make it
        if st.is_file:
            await fs.rename(current, twin_path(current))
            await fs.mkdir(current, exist_ok=True)


async def write_file(fs: AsyncFileSystem, path: str, body: AsyncIterator[memoryview | bytes],
                     make_record: "Any", make_parents: bool = True) -> Record:
    """Publish ``body`` as the file ``path`` atomically (see the module docstring): staged
    beside it, committed, recorded (``make_record()`` is called once the body is complete
    and returns the :class:`Record`; its size and mtime are filled in here), renamed into
    place. Nothing is published if anything fails. ``make_parents``: make the directories
    on the way (an object's), else they must exist (a part's upload directory)."""
    try:
        return await _write_file(fs, path, body, make_record, make_parents)
    except (errors.NotADirectory, errors.AlreadyExists, errors.IsADirectory):
        raise S3Error("InvalidRequest", f"{path}: a key and a directory of the same name collided while both were"
                      " written; try again") from None


async def _write_file(fs: AsyncFileSystem, path: str, body: AsyncIterator[memoryview | bytes], make_record: "Any",
                      make_parents: bool) -> Record:
    head, complete = await _read_up_to(body, fs.inline_max)
    if complete:
        return await _write_small_file(fs, path, bytes(head), make_record, make_parents)
    return await _write_staged(fs, path, _chained(bytes(head), body), make_record, make_parents)


async def _read_up_to(body: AsyncIterator[memoryview | bytes], limit: int) -> tuple[bytearray, bool]:
    """The body's first bytes, at least ``limit + 1`` of them if it has more; and whether
    that was all of it."""
    head = bytearray()
    async for piece in body:
        head += piece
        if len(head) > limit:
            return head, False
    return head, True


async def _chained(head: bytes, rest: AsyncIterator[memoryview | bytes]) -> AsyncIterator[memoryview | bytes]:
    yield head
    async for piece in rest:
        yield piece


async def _write_small_file(fs: AsyncFileSystem, path: str, data: bytes, make_record: "Any",
                            make_parents: bool) -> Record:
    """A small object: its bytes, record and mtime published in one metadata call (the common
    case: its prefix exists), atomically, with no staging file."""
    record = make_record()
    record.size, record.mtime = len(data), time.time()
    xattrs = [(RECORD_XATTR, record.encode())]
    try:
        await fs.write_bytes(path, data, mtime=record.mtime, xattrs=xattrs)
    except (errors.NotFound, errors.NotADirectory):
        if not make_parents:
            raise
        await _make_parents(fs, path)
        await _write_bytes_or_twin(fs, path, data, record, xattrs)
    except errors.IsADirectory:  # the key is also a prefix of others: the object is its twin
        if not make_parents:
            raise
        await fs.write_bytes(twin_path(path), data, mtime=record.mtime, xattrs=xattrs)
    return record


async def _write_bytes_or_twin(fs: AsyncFileSystem, path: str, data: bytes, record: Record,
                               xattrs: list[tuple[str, bytes]]) -> None:
    try:
        await fs.write_bytes(path, data, mtime=record.mtime, xattrs=xattrs)
    except errors.IsADirectory:
        await fs.write_bytes(twin_path(path), data, mtime=record.mtime, xattrs=xattrs)


async def _write_staged(fs: AsyncFileSystem, path: str, body: AsyncIterator[memoryview | bytes], make_record: "Any",
                        make_parents: bool) -> Record:
    """A large object: written beside its name, committed, recorded, renamed into place."""
    parent = parent_of(path)
    staging = paths.join(parent, f"{INTERNAL_PREFIX}put-{secrets.token_hex(8)}")
    for attempt in range(3):  # a concurrent delete may remove the empty parent just made
        if make_parents:
            await _make_parents(fs, path)
        try:
            handle = await fs.open(staging, "xb", file_mode=0o644)
            break
        except errors.NotFound:
            if attempt == 2 or not make_parents:
                raise
    try:
        offset = 0
        async for piece in body:
            await handle.write(offset, piece)
            offset += len(piece)
        await handle.close()
    except BaseException:
        await handle.abort()
        raise
    try:
        record = make_record()
        record.size, record.mtime = handle.attrs.size, handle.attrs.mtime
        await fs.setxattr(staging, RECORD_XATTR, record.encode())
        try:
            await fs.rename(staging, path)
        except errors.IsADirectory:
            if not make_parents:
                raise
            await fs.rename(staging, twin_path(path))  # the key is also a prefix of others
    except BaseException:
        await _discard(fs, staging)
        raise
    return record


async def _discard(fs: AsyncFileSystem, path: str) -> None:
    try:
        await asyncio.shield(fs.remove(path))
    except errors.TectofsError:
        pass


async def remove_object(fs: AsyncFileSystem, bucket: str, key: str) -> None:
    """Delete a key (absent already is success, as in S3) and the directories it leaves
    empty. Its twin goes too (one it had, or a stale one a crash left, which the file at the
    key shadowed: it must not come back)."""
    path = object_path(bucket, key)
    removed = False
    for target in (path, *([] if key.endswith("/") else [twin_path(path)])):
        try:
            await fs.remove(target)
            removed = True
        except (errors.NotFound, errors.NotADirectory, errors.IsADirectory):
            pass
    if not removed:
        await require_bucket(fs, bucket)
        return
    await prune(fs, parent_of(path), bucket_path(bucket))


async def prune(fs: AsyncFileSystem, directory: str, stop: str) -> None:
    """Remove ``directory`` and its parents up to (not including) ``stop`` while empty; an
    object that was the twin of a removed directory takes its name back."""
    while directory != stop and directory.startswith(stop + "/"):
        try:
            await fs.rmdir(directory)
        except errors.TectofsError:
            return  # not empty (or not ours): S3 prefixes live as long as their keys
        try:
            await fs.rename(twin_path(directory), directory, noreplace=True)
        except errors.AlreadyExists:  # the key was written meanwhile: its twin is the older object
            await _discard(fs, twin_path(directory))
        except errors.TectofsError:
            pass  # no twin (the usual case)
        directory = parent_of(directory)


# ---------------------------------------------------------------------------- reading


async def stream_file(fs: AsyncFileSystem, path: str, start: int, end: int,
                      md5: "hashlib._Hash | None" = None) -> AsyncIterator[bytes]:
    """Bytes ``[start, end)`` of ``path`` in :data:`READ_BYTES` pieces, the next piece read
    while the caller sends the last (two pieces in memory at most). The handle (and its
    lease: the version opened stays readable) is opened at the first iteration."""
    handle = await fs.open(path, "rb")
    try:
        end = min(end, handle.size)
        position = start
        ahead = asyncio.ensure_future(handle.read(position, min(READ_BYTES, end - position))) if position < end else None
        while ahead is not None:
            data = await ahead
            position += len(data)
            ahead = (asyncio.ensure_future(handle.read(position, min(READ_BYTES, end - position)))
                     if position < end and data else None)
            if md5 is not None:
                md5.update(data)
            yield data
    finally:
        if ahead is not None and not ahead.done():
            ahead.cancel()
        await handle.close()


async def copy_file(fs: AsyncFileSystem, src: str, dst: str, make_record: Any,
                    src_fs: AsyncFileSystem | None = None) -> Record:
    """Copy ``src`` onto ``dst`` through the gateway, streamed and published atomically."""
    return await write_file(fs, dst, stream_file(src_fs or fs, src, 0, 1 << 62), make_record)
