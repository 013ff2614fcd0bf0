"""Errors that mean something.

Every library error subclasses :class:`TectofsError` and, where one fits, the matching
builtin, so callers can ``except FileNotFoundError`` without knowing tectofs.  Each error
class carries one ``errno`` (used by the FUSE adapter) and one wire ``code`` (used by the
RPC layer to re-raise the same class on the client side).
"""

from __future__ import annotations

import errno as _errno


class TectofsError(Exception):
    """Base of all tectofs errors."""

    code = "error"
    errno = _errno.EIO


class NotFound(TectofsError, FileNotFoundError):
    code = "not_found"
    errno = _errno.ENOENT


class AlreadyExists(TectofsError, FileExistsError):
    code = "exists"
    errno = _errno.EEXIST


class NotADirectory(TectofsError, NotADirectoryError):
    code = "not_a_directory"
    errno = _errno.ENOTDIR


class IsADirectory(TectofsError, IsADirectoryError):
    code = "is_a_directory"
    errno = _errno.EISDIR


class DirectoryNotEmpty(TectofsError, OSError):
    code = "not_empty"
    errno = _errno.ENOTEMPTY


class InvalidPath(TectofsError, ValueError):
    """A path or name that can never be valid (``..``, NUL bytes, too long, empty)."""

    code = "invalid_path"
    errno = _errno.EINVAL


class InvalidArgument(TectofsError, ValueError):
    code = "invalid_argument"
    errno = _errno.EINVAL


class NameTooLong(InvalidPath):
    code = "name_too_long"
    errno = _errno.ENAMETOOLONG


class NoSpace(TectofsError, OSError):
    """Not enough live chunk servers or capacity to place data."""

    code = "no_space"
    errno = _errno.ENOSPC


class Busy(TectofsError):
    """The server is at its admission limit; retry after a backoff."""

    code = "busy"
    errno = _errno.EAGAIN


class ChecksumMismatch(TectofsError, IOError):
    """Stored or received bytes do not match their checksum."""

    code = "checksum"
    errno = _errno.EIO


class ChunkMissing(TectofsError, IOError):
    code = "chunk_missing"
    errno = _errno.EIO


class DataUnavailable(TectofsError, IOError):
    """Too many chunks of a block are lost or corrupt to reconstruct it."""

    code = "unavailable"
    errno = _errno.EIO


class ProtocolError(TectofsError):
    """A peer sent bytes that are not a valid frame (bad magic, version, checksum, size)."""

    code = "protocol"
    errno = _errno.EPROTO


class ConnectionLost(TectofsError, ConnectionError):
    code = "connection_lost"
    errno = _errno.EIO


class Timeout(TectofsError, TimeoutError):
    code = "timeout"
    errno = _errno.ETIMEDOUT


class StaleFile(TectofsError):
    """The file changed or vanished under an open handle."""

    code = "stale"
    errno = _errno.ESTALE


class TooManyLinks(TectofsError, OSError):
    """A file already has ``limits.link_count_max`` names (POSIX's EMLINK)."""

    code = "too_many_links"
    errno = _errno.EMLINK


class NoAttribute(TectofsError, OSError):
    """The file has no extended attribute of that name (ENODATA, which ``getxattr`` gives)."""

    code = "no_attribute"
    errno = _errno.ENODATA


class NotSupported(TectofsError, OSError):
    """tectofs does not do this (an extended attribute namespace it does not keep)."""

    code = "not_supported"
    errno = _errno.EOPNOTSUPP


class AttributeTooLarge(TectofsError, OSError):
    """An extended attribute's value is larger than ``limits.xattr_value_max_bytes`` (E2BIG)."""

    code = "attribute_too_large"
    errno = _errno.E2BIG


class AttributeNameTooLong(TectofsError, OSError):
    """An extended attribute's name is longer than ``limits.xattr_name_max_bytes`` (ERANGE, as Linux)."""

    code = "attribute_name_too_long"
    errno = _errno.ERANGE


class CheckpointError(TectofsError):
    code = "checkpoint"
    errno = _errno.EIO


class PermissionDenied(TectofsError, PermissionError):
    """The caller may not do this: POSIX permission bits, a missing or rejected credential,
    an operation reserved to the cluster's own servers or to administrators."""

    code = "permission"
    errno = _errno.EACCES


class NotPermitted(PermissionDenied):
    """Only the owner (or root) may do this: chmod, chown, set-policy (POSIX's EPERM)."""

    code = "not_permitted"
    errno = _errno.EPERM


class AuthenticationFailed(PermissionDenied):
    """A hello's proof did not check out: unknown user, wrong secret or key, or a peer that
    could not prove it holds the cluster key."""

    code = "authentication"


class CapabilityRefused(PermissionDenied):
    """A chunk server refused a get or put: no capability, a forged one, or one for another
    block or mode."""

    code = "capability"


class CapabilityExpired(CapabilityRefused):
    """The capability was genuine but has expired: fetch a fresh layout and try again."""

    code = "capability_expired"


_BY_CODE: dict[str, type[TectofsError]] = {}


def _register(cls: type[TectofsError]) -> None:
    _BY_CODE[cls.code] = cls
    for sub in cls.__subclasses__():
        _register(sub)


_register(TectofsError)


def from_wire(code: str, message: str) -> TectofsError:
    """Rebuild the error a server reported; unknown codes become :class:`TectofsError`."""
    return _BY_CODE.get(code, TectofsError)(message)


def to_wire(exc: BaseException) -> tuple[str, str]:
    """The ``(code, message)`` pair sent to a peer for ``exc``."""
    if isinstance(exc, TectofsError):
        return exc.code, str(exc)
    return TectofsError.code, f"{type(exc).__name__}: {exc}"
