"""Where multipart uploads wait: a staging area outside every bucket, one directory per
bucket and user, and who may act on an upload there.

Layout (made by the gateway, as root, only once the caller was found to be allowed)::

    /.tectofs-multipart/                  root, 0711: nobody but root lists it
        <bucket>/                         root, 0711: which users have uploads is root's to know
            <uid>/                        the user's, 0700: only they (and root) see their uploads
                <hex>-<uid>/              an upload (its id), made by the user: its parts

So an upload never shows in a bucket's directory (nor in anyone's listing but its
initiator's) and never keeps a bucket from being deleted; its parts are files of its
initiator, written with the initiator's identity like any other file; one user's uploads
can be neither read, listed, overwritten nor crowded out by another user's.

Who may act on an upload (the metadata service checks the rest, as ever):

- its initiator (the uid in its id): everything, with their own identity;
- the bucket's owner and root: list it, list its parts and abort it (as S3 lets a bucket owner);
  the gateway then acts *as the initiator* (:func:`initiator_view`), so whatever the initiator
  put in their directory (links to other files, others' directories moved in) can be removed
  only as far as the initiator could remove it themselves;
- anyone else: AccessDenied.

Deleting a bucket removes its part of the area (:func:`remove_bucket_area`; each user's
uploads as that user), and creating a bucket clears what a crash may have left under its name.
"""

from __future__ import annotations

import logging
import re
import secrets

from tectofs import errors, paths
from tectofs.client import AsyncFileSystem, Stat
from tectofs.store import access

from .objects import INTERNAL_PREFIX, hidden, object_path, parent_of, require_bucket
from .principals import Principal
from .xml import S3Error, from_tectofs

log = logging.getLogger("tectofs.s3")

STAGING_DIR = "/" + INTERNAL_PREFIX + "multipart"
AREA_MODE = 0o711  # the area and each bucket's part of it: searchable, not listable
USER_MODE = 0o700
LEGACY_DIR = INTERNAL_PREFIX + "multipart"  # in each bucket, mode 1777: where gateways before this area staged
UPLOAD_ID = re.compile(r"[0-9a-f]{32}-(0|[1-9][0-9]{0,9})")


def no_such_upload(upload_id: str) -> S3Error:
    return S3Error("NoSuchUpload", "The specified upload does not exist.", upload_id)


def bucket_area(bucket: str) -> str:
    """``/.tectofs-multipart/<bucket>``; a name that could lead elsewhere is no bucket."""
    if not bucket or "/" in bucket or "\0" in bucket or bucket in (".", "..") or hidden(bucket):
        raise S3Error("NoSuchBucket", "The specified bucket does not exist", f"/{bucket}")
    return paths.join(STAGING_DIR, bucket)


def user_area(bucket: str, uid: int) -> str:
    return paths.join(bucket_area(bucket), str(uid))


def new_upload_id(uid: int) -> str:
    """128 random bits, then the initiator's uid (where the upload is)."""
    return f"{secrets.token_hex(16)}-{uid}"


def initiator_of(upload_id: str) -> int:
    match = UPLOAD_ID.fullmatch(upload_id)
    if match is None:
        raise no_such_upload(upload_id)
    return int(match.group(1))


def upload_path(bucket: str, upload_id: str) -> str:
    return paths.join(user_area(bucket, initiator_of(upload_id)), upload_id)


# ---------------------------------------------------------------------------- starting an upload


def _may_write(st: Stat, principal: Principal) -> bool:
    """What the metadata service will ask of a new name in directory ``st``: write and search."""
    caller = access.Caller(principal.uid, principal.gid, frozenset(principal.groups))
    return access.may(st, caller, access.W | access.X)  # type: ignore[arg-type]  # mode, uid, gid: all it reads


async def check_may_put(fs: AsyncFileSystem, principal: Principal, bucket: str, key: str) -> Stat:
    """Refuse (AccessDenied) a caller who could not publish ``key``: the nearest directory on
    its way that exists (the key's own, usually) must let them add names. Returns the
    bucket's stat. Nothing is made: this runs before anything is. (Complete is still checked
    by the metadata service as it publishes: this is the early answer S3 gives.)"""
    resource = f"/{bucket}/{key}"
    bucket_st = await require_bucket(fs, bucket)
    directory = parent_of(object_path(bucket, key))
    while True:
        if directory == "/" + bucket:
            st = bucket_st
        else:
            try:
                st = await fs.stat(directory)
            except (errors.NotFound, errors.NotADirectory):
                directory = parent_of(directory)  # made at Complete: whoever may add names above
                continue
            except errors.TectofsError as exc:
                raise from_tectofs(exc, resource) from None
            if not st.is_dir:  # an object that would become a twin: renamed within its directory
                directory = parent_of(directory)
                continue
        if not _may_write(st, principal):
            raise S3Error("AccessDenied", "Access Denied", resource)
        return bucket_st


async def make_user_area(gateway_fs: AsyncFileSystem, bucket: str, principal: Principal) -> None:
    """The caller's directory in the bucket's part of the area, and the directories above it
    (root's), made if missing; it is given to the caller. Refuses to use an area that is not
    root's alone (one someone else made first could be read by them)."""
    area = await gateway_fs.mkdir(STAGING_DIR, mode=AREA_MODE, exist_ok=True)
    if not area.is_dir or area.uid != 0 or area.mode & 0o022:
        log.error("%s is not a directory of root's that only root may change (uid %d, mode %o): multipart uploads"
                  " are refused until it is", STAGING_DIR, area.uid, area.mode & 0o7777)
        raise S3Error("InternalError", f"the gateway's staging directory {STAGING_DIR} is not root's alone")
    await gateway_fs.mkdir(bucket_area(bucket), mode=AREA_MODE, exist_ok=True)
    mine = await gateway_fs.mkdir(user_area(bucket, principal.uid), mode=USER_MODE, exist_ok=True)
    if (mine.uid, mine.gid) != (principal.uid, principal.gid):
        await gateway_fs.setattr(user_area(bucket, principal.uid), uid=principal.uid, gid=principal.gid)


async def make_upload(fs: AsyncFileSystem, gateway_fs: AsyncFileSystem, principal: Principal, bucket: str,
                      upload_id: str, bucket_st: Stat) -> str:
    """The upload's directory, made by the caller (its parts get the bucket's policy and block
    size); the caller's area is made first if this is their first upload there."""
    path = upload_path(bucket, upload_id)
    for attempt in range(2):
        try:
            await fs.mkdir(path, mode=USER_MODE, policy=bucket_st.policy or None,
                           block_size=bucket_st.block_size or None)
            return path
        except (errors.NotFound, errors.PermissionDenied):
            if attempt:  # PermissionDenied: made by root and not yet given to the caller (a concurrent first upload)
                raise
            await make_user_area(gateway_fs, bucket, principal)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------- acting on an upload


async def owns_bucket(fs: AsyncFileSystem, principal: Principal, bucket: str) -> bool:
    return principal.uid == 0 or (await require_bucket(fs, bucket)).uid == principal.uid


async def initiator_view(gateway_fs: AsyncFileSystem, bucket: str, uid: int) -> AsyncFileSystem:
    """The gateway acting as the user whose area in ``bucket`` is ``uid``'s (with that
    directory's group); NotFound if they have none."""
    st = await gateway_fs.stat(user_area(bucket, uid))
    return gateway_fs if uid == 0 else gateway_fs.acting_as(uid, st.gid)


async def view_for(fs: AsyncFileSystem, gateway_fs: AsyncFileSystem, principal: Principal, bucket: str,
                   upload_id: str, owner_may: bool) -> AsyncFileSystem:
    """The client view that acts on ``upload_id``: the caller's own if they started it; the
    initiator's if ``owner_may`` and the caller owns the bucket (or is root); else
    AccessDenied (NoSuchUpload if there is no such upload)."""
    uid = initiator_of(upload_id)
    if uid == principal.uid:
        return fs
    if not owner_may or not await owns_bucket(fs, principal, bucket):
        await require_bucket(fs, bucket)
        raise S3Error("AccessDenied", "Access Denied", upload_id)
    try:
        return await initiator_view(gateway_fs, bucket, uid)
    except errors.NotFound:
        raise no_such_upload(upload_id) from None


async def user_areas(gateway_fs: AsyncFileSystem, bucket: str) -> list[tuple[int, Stat]]:
    """``(uid, stat)`` of each user's directory in the bucket's part of the area."""
    try:
        entries = await gateway_fs.scandir(bucket_area(bucket))
    except errors.NotFound:
        return []
    return [(int(name), st) for name, st in entries if st.is_dir and name.isdigit()]


async def remove_bucket_area(gateway_fs: AsyncFileSystem, bucket: str) -> None:
    """Remove the pending uploads of a bucket that is gone (or new): each user's as that
    user, then the directories the gateway made. What cannot be removed now (an upload
    started meanwhile) stays, out of every bucket's way, until the name is made a bucket again."""
    try:
        for uid, st in await user_areas(gateway_fs, bucket):
            directory = user_area(bucket, uid)
            view = gateway_fs if uid == 0 else gateway_fs.acting_as(uid, st.gid)
            for name, entry in await view.scandir(directory):
                target = paths.join(directory, name)
                await (view.rmtree(target) if entry.is_dir else view.remove(target))
            await gateway_fs.rmdir(directory)
        await gateway_fs.rmdir(bucket_area(bucket))
    except errors.NotFound:
        pass
    except errors.TectofsError as exc:
        log.warning("pending uploads of bucket %s not all removed: %s", bucket, exc)


async def remove_legacy_uploads(gateway_fs: AsyncFileSystem, bucket: str) -> bool:
    """When a bucket holds nothing but the uploads directory older gateways made in it
    (``/<bucket>/.tectofs-multipart``, mode 1777), remove it: each upload as its owner, then
    the directory. Returns whether it did (the bucket may then be empty)."""
    top = paths.join("/" + bucket, LEGACY_DIR)
    try:
        if [name for name, _ in await gateway_fs.scandir("/" + bucket)] != [LEGACY_DIR]:
            return False
        for name, st in await gateway_fs.scandir(top):
            view = gateway_fs if st.uid == 0 else gateway_fs.acting_as(st.uid, st.gid)
            target = paths.join(top, name)
            await (view.rmtree(target) if st.is_dir else view.remove(target))
        await gateway_fs.rmdir(top)
    except errors.TectofsError as exc:
        log.warning("uploads directory of bucket %s from an older gateway not removed: %s", bucket, exc)
        return False
    return True
