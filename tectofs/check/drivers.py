"""One driver per client kind: each turns a planned call (``kind``, model ``args``) into that
client's own API on the real tree and answers what :class:`tectofs.testing.history.Operation`
records (bytes, sorted names, a stat summary, or None); failures raise ``OSError`` with the
errno the client showed (:func:`errno_of` maps the exceptions each API raises).

- :class:`MountDriver`: ``os.*`` on the mountpoint (run in the host's namespace). A
  write-and-close is ``open(O_CREAT|O_TRUNC)``, ``write``, ``close``.
- :class:`LibraryDriver`: :class:`tectofs.client.FileSystem`.
- :class:`FsspecDriver`: ``fsspec.filesystem("tectofs")`` (no link, chmod, chown, truncate,
  xattrs; ``fsync`` is an ``info``: fsspec has no fsync).
- :class:`S3Driver`: boto3 against the gateway; the subtree's top-level directory is the
  bucket. stat is HEAD (a directory: its folder key ``name/``, or any key under it).
"""

from __future__ import annotations

import errno
import os
import stat as stat_module
import time
from typing import Any

from tectofs.testing.history import Arg, StatValue, Value, stat_summary

XATTR_ERRNOS = {"ENODATA": errno.ENODATA}
NOT_FOUND = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound"})  # S3 error codes that mean ENOENT


def errno_of(exc: BaseException) -> int | None:
    """The errno a client's exception stands for (None: unknown, the call's fate is unknown)."""
    number = getattr(exc, "errno", None)
    if isinstance(number, int):
        return number
    for kind, value in ((FileNotFoundError, errno.ENOENT), (FileExistsError, errno.EEXIST),
                        (IsADirectoryError, errno.EISDIR), (NotADirectoryError, errno.ENOTDIR),
                        (PermissionError, errno.EACCES)):
        if isinstance(exc, kind):
            return value
    return None


def _summary(kind: str, mode: int, uid: int, gid: int, nlink: int, size: int) -> StatValue:
    summary: StatValue = {"kind": kind, "mode": stat_module.S_IMODE(mode), "uid": uid, "gid": gid, "nlink": nlink}
    if kind == "file":
        summary["size"] = size
    return summary


class Driver:
    kind = "library"

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix  # a mount's mountpoint; "" for clients that name tectofs paths
        self.base = prefix  # the real path of the history's subtree: prefix + its tectofs path
        # An append's open: what its handle saw (the bytes it publishes its data after, at
        # close) and when it had read them; set by do_append of the kinds that have handles.
        self.opened: tuple[bytes, float] | None = None

    def real(self, path: Arg) -> str:
        return self.base if path == "/" else self.base + str(path)

    def call(self, kind: str, args: dict[str, Arg]) -> Value:
        method = getattr(self, "do_" + kind)
        result: Value = method(args)
        return result

    def close(self) -> None:
        pass


class MountDriver(Driver):
    kind = "mount"

    def do_create(self, args: dict[str, Arg]) -> Value:
        os.close(os.open(self.real(args["path"]), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return None

    def _write(self, args: dict[str, Arg], flags: int) -> Value:
        fd = os.open(self.real(args["path"]), os.O_CREAT | os.O_WRONLY | flags, 0o644)
        try:
            os.write(fd, bytes(args["data"]) if isinstance(args["data"], bytes) else str(args["data"]).encode())
        finally:
            os.close(fd)
        return None

    def do_write(self, args: dict[str, Arg]) -> Value:
        return self._write(args, os.O_TRUNC)

    def do_append(self, args: dict[str, Arg]) -> Value:
        fd = os.open(self.real(args["path"]), os.O_CREAT | os.O_RDWR | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            self.opened = (os.pread(fd, size, 0) if size else b"", time.time())
            os.write(fd, bytes(args["data"]))  # type: ignore[arg-type]
        finally:
            os.close(fd)
        return None

    def do_read(self, args: dict[str, Arg]) -> Value:
        with open(self.real(args["path"]), "rb") as file:
            return file.read()

    def do_stat(self, args: dict[str, Arg]) -> Value:
        return stat_summary(os.stat(self.real(args["path"])))

    def do_list(self, args: dict[str, Arg]) -> Value:
        return sorted(os.listdir(self.real(args["path"])))

    def do_rename(self, args: dict[str, Arg]) -> Value:
        os.rename(self.real(args["path"]), self.real(args["dest"]))
        return None

    def do_link(self, args: dict[str, Arg]) -> Value:
        os.link(self.real(args["path"]), self.real(args["dest"]))
        return None

    def do_unlink(self, args: dict[str, Arg]) -> Value:
        os.unlink(self.real(args["path"]))
        return None

    def do_chmod(self, args: dict[str, Arg]) -> Value:
        os.chmod(self.real(args["path"]), int(args["mode"]))
        return None

    def do_chown(self, args: dict[str, Arg]) -> Value:
        os.chown(self.real(args["path"]), int(args["uid"]), int(args["gid"]))
        return None

    def do_truncate(self, args: dict[str, Arg]) -> Value:
        os.truncate(self.real(args["path"]), int(args["size"]))
        return None

    def do_mkdir(self, args: dict[str, Arg]) -> Value:
        os.mkdir(self.real(args["path"]), 0o755)
        return None

    def do_rmdir(self, args: dict[str, Arg]) -> Value:
        os.rmdir(self.real(args["path"]))
        return None

    def do_setxattr(self, args: dict[str, Arg]) -> Value:
        os.setxattr(self.real(args["path"]), str(args["name"]), bytes(args["value"]))  # type: ignore[arg-type]
        return None

    def do_getxattr(self, args: dict[str, Arg]) -> Value:
        return os.getxattr(self.real(args["path"]), str(args["name"]))

    def do_fsync(self, args: dict[str, Arg]) -> Value:
        fd = os.open(self.real(args["path"]), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return None


class LibraryDriver(Driver):
    kind = "library"

    def __init__(self, fs: Any) -> None:
        super().__init__()
        self.fs = fs

    def close(self) -> None:
        self.fs.close()

    def do_create(self, args: dict[str, Arg]) -> Value:
        self.fs.write_bytes(self.real(args["path"]), b"", exclusive=True)
        return None

    def do_write(self, args: dict[str, Arg]) -> Value:
        with self.fs.open(self.real(args["path"]), "wb") as file:
            file.write(args["data"])
        return None

    def do_append(self, args: dict[str, Arg]) -> Value:
        with self.fs.open(self.real(args["path"]), "a+b", buffering=0) as file:
            seen = bytearray(file.handle.size)
            file.preadv([seen], 0)
            self.opened = (bytes(seen), time.time())
            file.write(args["data"])
        return None

    def do_read(self, args: dict[str, Arg]) -> Value:
        data: bytes = self.fs.read_bytes(self.real(args["path"]))
        return data

    def do_stat(self, args: dict[str, Arg]) -> Value:
        st = self.fs.stat(self.real(args["path"]))
        return _summary(st.kind, st.mode, st.uid, st.gid, st.nlink, st.size)

    def do_list(self, args: dict[str, Arg]) -> Value:
        return sorted(self.fs.listdir(self.real(args["path"])))

    def do_rename(self, args: dict[str, Arg]) -> Value:
        self.fs.rename(self.real(args["path"]), self.real(args["dest"]))
        return None

    def do_link(self, args: dict[str, Arg]) -> Value:
        self.fs.link(self.real(args["path"]), self.real(args["dest"]))
        return None

    def do_unlink(self, args: dict[str, Arg]) -> Value:
        self.fs.remove(self.real(args["path"]))
        return None

    def do_chmod(self, args: dict[str, Arg]) -> Value:
        self.fs.chmod(self.real(args["path"]), int(args["mode"]))
        return None

    def do_chown(self, args: dict[str, Arg]) -> Value:
        self.fs.chown(self.real(args["path"]), int(args["uid"]), int(args["gid"]))
        return None

    def do_truncate(self, args: dict[str, Arg]) -> Value:
        self.fs.truncate(self.real(args["path"]), int(args["size"]))
        return None

    def do_mkdir(self, args: dict[str, Arg]) -> Value:
        self.fs.mkdir(self.real(args["path"]), 0o755)
        return None

    def do_rmdir(self, args: dict[str, Arg]) -> Value:
        self.fs.rmdir(self.real(args["path"]))
        return None

    def do_setxattr(self, args: dict[str, Arg]) -> Value:
        self.fs.setxattr(self.real(args["path"]), str(args["name"]), args["value"])
        return None

    def do_getxattr(self, args: dict[str, Arg]) -> Value:
        value: bytes = self.fs.getxattr(self.real(args["path"]), str(args["name"]))
        return value

    def do_fsync(self, args: dict[str, Arg]) -> Value:
        path = self.real(args["path"])
        if self.fs.stat(path).kind == "dir":
            return None
        with self.fs.open(path, "r+b") as file:
            file.fsync()
        return None


class FsspecDriver(Driver):
    kind = "fsspec"

    def __init__(self, meta: str) -> None:
        super().__init__()
        import fsspec

        self.fs = fsspec.filesystem("tectofs", meta=meta, skip_instance_cache=True)

    def do_create(self, args: dict[str, Arg]) -> Value:
        path = self.real(args["path"])
        if self.fs.exists(path):  # fsspec has no exclusive create everywhere: the check races, see docs
            raise FileExistsError(errno.EEXIST, "exists", path)
        with self.fs.open(path, "xb"):
            pass
        return None

    def do_write(self, args: dict[str, Arg]) -> Value:
        self.fs.pipe_file(self.real(args["path"]), args["data"])
        return None

    def do_append(self, args: dict[str, Arg]) -> Value:
        with self.fs.open(self.real(args["path"]), "ab") as file:
            # fsspec opens "ab" only, a handle that may not read: the bytes it publishes its data
            # after (what it saw at open) are read through that handle, made readable for it.
            handle = file.handle
            handle.readable = True
            try:
                self.opened = (file._run(handle.read(0, handle.size)), time.time())
            finally:
                handle.readable = False
            file.write(args["data"])
        return None

    def do_read(self, args: dict[str, Arg]) -> Value:
        data: bytes = self.fs.cat_file(self.real(args["path"]))
        return data

    def do_stat(self, args: dict[str, Arg]) -> Value:
        info = self.fs.info(self.real(args["path"]))
        return _summary(str(info["kind"]), int(info["mode"]), int(info["uid"]), int(info["gid"]),
                        int(info["nlink"]), int(info["size"]))

    def do_list(self, args: dict[str, Arg]) -> Value:
        path = self.real(args["path"])
        if self.fs.info(path)["type"] != "directory":
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", path)
        return sorted(os.path.basename(name.rstrip("/")) for name in self.fs.ls(path, detail=False))

    def do_rename(self, args: dict[str, Arg]) -> Value:
        self.fs.mv(self.real(args["path"]), self.real(args["dest"]))
        return None

    def do_unlink(self, args: dict[str, Arg]) -> Value:
        self.fs.rm_file(self.real(args["path"]))
        return None

    def do_mkdir(self, args: dict[str, Arg]) -> Value:
        path = self.real(args["path"])
        self.fs.mkdir(path, create_parents=True)
        return None

    def do_rmdir(self, args: dict[str, Arg]) -> Value:
        self.fs.rmdir(self.real(args["path"]))
        return None

    def do_fsync(self, args: dict[str, Arg]) -> Value:
        self.fs.info(self.real(args["path"]))
        return None


class S3Driver(Driver):
    kind = "s3"

    def __init__(self, endpoint: str, access: str, secret: str) -> None:
        super().__init__()
        import boto3
        from botocore.config import Config

        config = Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}, signature_version="s3v4",
                        connect_timeout=5, read_timeout=20)
        self.s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                               region_name="us-east-1", config=config)

    def _key(self, path: Arg) -> tuple[str, str]:
        bucket, _, key = self.real(path).lstrip("/").partition("/")
        return bucket, key

    def call(self, kind: str, args: dict[str, Arg]) -> Value:
        from botocore.exceptions import ClientError

        try:
            return super().call(kind, args)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code"))
            if code in NOT_FOUND:  # every error S3 shows is NoSuchKey to the model (PROFILES["s3"])
                raise FileNotFoundError(errno.ENOENT, code) from exc
            # A 5xx (the metadata service restarting, a chunk server gone) or any other answer:
            # the call may or may not have taken effect (an exception with no errno: unknown).
            raise RuntimeError(f"S3 {kind}: {code}") from exc

    def do_write(self, args: dict[str, Arg]) -> Value:
        bucket, key = self._key(args["path"])
        self.s3.put_object(Bucket=bucket, Key=key, Body=args["data"])
        return None

    def do_read(self, args: dict[str, Arg]) -> Value:
        bucket, key = self._key(args["path"])
        data: bytes = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        return data

    def do_stat(self, args: dict[str, Arg]) -> Value:
        from botocore.exceptions import ClientError

        bucket, key = self._key(args["path"])
        try:
            head = self.s3.head_object(Bucket=bucket, Key=key)
            return {"kind": "file", "size": int(head["ContentLength"])}
        except ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code")) not in NOT_FOUND:
                raise
            head = self.s3.head_object(Bucket=bucket, Key=key + "/")
            return {"kind": "dir"}

    def do_list(self, args: dict[str, Arg]) -> Value:
        bucket, key = self._key(args["path"])
        listed = self.s3.list_objects_v2(Bucket=bucket, Prefix=key + "/", Delimiter="/")
        names = {item["Key"][len(key) + 1:] for item in listed.get("Contents", [])}
        names |= {item["Prefix"][len(key) + 1:].rstrip("/") for item in listed.get("CommonPrefixes", [])}
        return sorted(name for name in names if name)

    def do_unlink(self, args: dict[str, Arg]) -> Value:
        bucket, key = self._key(args["path"])
        self.s3.delete_object(Bucket=bucket, Key=key)
        return None

    def do_mkdir(self, args: dict[str, Arg]) -> Value:
        bucket, key = self._key(args["path"])
        self.s3.put_object(Bucket=bucket, Key=key + "/", Body=b"")
        return None
