"""Listing a bucket in S3's order: keys sorted by their UTF-8 bytes, with prefix,
delimiter, a start point and a page size, from directories read one page at a time.

A directory ``d`` holds the keys ``d/...``, so its place in the order is that of ``d/``,
not of ``d``: ``a-b`` and ``a.txt`` come before ``a/x`` (``-`` and ``.`` sort before ``/``).
:func:`_ordered` merges each directory's pages (sorted by name) with a small heap of the
subdirectories it has passed but whose ``name/`` is not due yet, so a directory of any size
is listed with one readdir page in memory.

Contract of :func:`walk`: yields ``(key, stat)`` for objects and ``(prefix, None)`` for
common prefixes, in ascending order, every one starting with ``prefix`` and greater than
``after`` — except that a common prefix that ``after`` lies *inside* is yielded again (S3's
behaviour for a StartAfter inside a rolled-up prefix); a prefix equal to ``after`` is not.
With delimiter ``/`` a subdirectory is a common prefix without being read (an empty directory
shows as one); any other delimiter walks every key and rolls them up. Hidden names (the
gateway's own) and special files never appear, but a directory's marker file (the key ``d/``,
:data:`~tectofs.s3.objects.MARKER_NAME`) is listed as ``d/``, first of the keys below ``d``,
and the twin of a directory ``d`` (``.tectofs-object-d``, the object ``d`` while ``d/`` is a
prefix) as ``d``, where ``d`` sorts (held in the heap like a subdirectory until due).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import heapq
import itertools
from typing import AsyncIterator

from tectofs import errors, paths
from tectofs.client import AsyncFileSystem, Stat

from .objects import MARKER_NAME, TWIN_PREFIX, Record, bucket_path, hidden, object_path, record_of, twin_path
from .xml import S3Error

RECORDS_PARALLEL = 32  # records (ETags) fetched at once for one page of a listing


def encode_token(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode()


def decode_token(token: str) -> str:
    try:
        return base64.urlsafe_b64decode(token.encode()).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise S3Error("InvalidArgument", "The continuation token provided is incorrect") from None


def _first_name_after(rel: str, target: str) -> str:
    """A readdir cursor below every name of directory ``rel`` whose keys may reach ``target``
    (names starting with a smaller character than ``target``'s next one cannot)."""
    if not target.startswith(rel) or len(target) == len(rel):
        return ""
    first = ord(target[len(rel)])
    return chr(first - 1) if first > 1 else ""


async def _twins_after(fs: AsyncFileSystem, directory: str, after: str) -> list[tuple[str, Stat]]:
    """The twins (objects whose name is also a directory) of ``directory`` whose name sorts
    after ``after``: a listing resumed past the ``.`` names would not see them otherwise."""
    found: list[tuple[str, Stat]] = []
    cursor: str | None = TWIN_PREFIX + after
    while cursor is not None:
        try:
            page, cursor = await fs.readdir_page(directory, cursor)
        except (errors.NotFound, errors.NotADirectory):
            return found
        for name, st in page:
            if not name.startswith(TWIN_PREFIX):
                return found
            found.append((name, st))
    return found


async def _ordered(fs: AsyncFileSystem, directory: str, rel: str, after: str,
                   twins: set[str]) -> AsyncIterator[tuple[str, Stat]]:
    """Entries of ``directory`` (whose keys start with ``rel``) as ``(key, stat)`` in key
    order, a directory's key ending in ``/``; readdir starts after the name ``after``. The
    keys of twins (``.tectofs-object-d`` is the object ``d``) are added to ``twins``."""
    pending: list[tuple[str, int, Stat]] = []
    tie = itertools.count()
    marker_done = False
    for name, st in await _twins_after(fs, directory, after) if after > "." else []:
        if st.is_file:
            twins.add(rel + name[len(TWIN_PREFIX):])
            heapq.heappush(pending, (rel + name[len(TWIN_PREFIX):], next(tie), st))
    cursor: str | None = after
    while cursor is not None:
        try:
            page, cursor = await fs.readdir_page(directory, cursor)
        except (errors.NotFound, errors.NotADirectory):
            return  # removed while listed: nothing more below it
        for name, st in page:
            if name.startswith(TWIN_PREFIX) and st.is_file:  # due where its key is, as a subdirectory is
                twins.add(rel + name[len(TWIN_PREFIX):])
                heapq.heappush(pending, (rel + name[len(TWIN_PREFIX):], next(tie), st))
                continue
            if rel and not marker_done and name <= MARKER_NAME:
                # the directory's own marker "d/" comes before every key below it, but a few
                # names ("-x", ".a") sort before its file name: look it up before those
                marker_done = True
                marker = st if name == MARKER_NAME else await _marker(fs, directory)
                if marker is not None and marker.is_file:
                    yield rel, marker
            if hidden(name) or not (st.is_dir or st.is_file):
                continue
            key = rel + name + ("/" if st.is_dir else "")
            while pending and pending[0][0] <= key:
                due, _, due_st = heapq.heappop(pending)
                if due == key:  # a twin left behind by a crash, shadowed by the file at its name
                    twins.discard(key)
                    continue
                yield due, due_st
            if st.is_dir:
                heapq.heappush(pending, (key, next(tie), st))
            else:
                yield key, st
    while pending:
        due, _, due_st = heapq.heappop(pending)
        yield due, due_st


async def _marker(fs: AsyncFileSystem, directory: str) -> Stat | None:
    try:
        return await fs.stat(paths.join(directory, MARKER_NAME))
    except (errors.NotFound, errors.NotADirectory):
        return None


class _Walk:
    """One listing's walk; ``beyond`` turns true once keys pass the prefix's range."""

    def __init__(self, fs: AsyncFileSystem, bucket: str, prefix: str, after: str, delimiter: str) -> None:
        self.fs, self.bucket, self.prefix, self.after, self.delimiter = fs, bucket, prefix, after, delimiter
        self.beyond = False
        self.twins: set[str] = set()  # keys listed whose object is a twin (objects.twin_path)

    def _past(self, key: str) -> bool:
        """Every key from here on is after the prefix's range."""
        return key > self.prefix and not key.startswith(self.prefix)

    async def entries(self, directory: str, rel: str) -> AsyncIterator[tuple[str, Stat | None]]:
        start = _first_name_after(rel, max(self.after, self.prefix))
        async for key, st in _ordered(self.fs, directory, rel, start, self.twins):
            if self._past(key):
                self.beyond = True
                return
            if not st.is_dir:
                if key.startswith(self.prefix) and key > self.after:
                    yield key, st
                continue
            if not (key.startswith(self.prefix) or self.prefix.startswith(key)):
                continue  # before the prefix's range
            if key <= self.after and not self.after.startswith(key):
                continue  # every key below it comes before the start point
            if self.delimiter == "/" and key.startswith(self.prefix) and key != self.prefix:
                if key != self.after:
                    yield key, None
                continue
            async for item in self.entries(paths.join(directory, key[len(rel):]), key):
                yield item
            if self.beyond:
                return


async def walk(fs: AsyncFileSystem, bucket: str, prefix: str = "", after: str = "", delimiter: str = "",
               twins: set[str] | None = None) -> AsyncIterator[tuple[str, Stat | None]]:
    """See the module docstring. ``twins``, when given, receives the keys listed whose
    object is a twin (:func:`~tectofs.s3.objects.twin_path`)."""
    state = _Walk(fs, bucket, prefix, after, delimiter)
    if twins is not None:
        state.twins = twins
    rolled: str | None = None  # the last common prefix of a delimiter other than "/"
    async for key, st in state.entries(bucket_path(bucket), ""):
        if st is None or not delimiter or delimiter == "/":
            yield key, st
            continue
        at = key.find(delimiter, len(prefix))
        if at < 0:
            yield key, st
            continue
        common = key[: at + len(delimiter)]
        if common != rolled and (common != after):
            rolled = common
            yield common, None
        elif common == after:
            rolled = common  # the page before ended on it


async def page(fs: AsyncFileSystem, bucket: str, prefix: str, after: str, delimiter: str,
               max_keys: int) -> tuple[list[tuple[str, Stat, str]], list[str], bool, str]:
    """Up to ``max_keys`` objects and common prefixes together: ``(objects, prefixes,
    truncated, last)``; objects are ``(key, stat, path of its file)``, ``last`` is the last
    key or prefix returned (the next start)."""
    objects: list[tuple[str, Stat, str]] = []
    prefixes: list[str] = []
    twins: set[str] = set()
    truncated, last = False, ""
    if max_keys > 0:
        async for key, st in walk(fs, bucket, prefix, after, delimiter, twins):
            if len(objects) + len(prefixes) == max_keys:
                truncated = True
                break
            if st is None:
                prefixes.append(key)
            else:
                path = object_path(bucket, key)
                objects.append((key, st, twin_path(path) if key in twins else path))
            last = key
    return objects, prefixes, truncated, last


async def records(fs: AsyncFileSystem, objects: list[tuple[str, Stat, str]]) -> list[Record]:
    """The records (ETags) of a page of objects, fetched :data:`RECORDS_PARALLEL` at a time."""
    gate = asyncio.Semaphore(RECORDS_PARALLEL)

    async def one(st: Stat, path: str) -> Record:
        async with gate:
            return await record_of(fs, path, st)

    return list(await asyncio.gather(*(one(st, path) for _, st, path in objects)))
