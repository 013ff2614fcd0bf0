"""Path validation and splitting, shared by the client, the metadata service and FUSE.

Paths are absolute, ``/``-separated strings. A name is rejected (never silently cleaned)
when it is empty, ``.`` or ``..``, contains ``/`` or NUL, or is longer than 255 bytes in
UTF-8: a storage system must not guess which file the caller meant.
"""

from __future__ import annotations

from . import limits
from .errors import InvalidPath, NameTooLong


def check_name(name: str) -> str:
    """Return ``name`` if it is a valid single path component, else raise InvalidPath."""
    if not isinstance(name, str):
        raise InvalidPath(f"name must be a string, not {type(name).__name__}")
    if name in ("", ".", ".."):
        raise InvalidPath(f"invalid name {name!r}: empty, '.' and '..' are not allowed")
    if "/" in name or "\x00" in name:
        raise InvalidPath(f"invalid name {name!r}: '/' and NUL are not allowed in a name")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPath(f"invalid name {name!r}: not encodable as UTF-8") from None
    if len(encoded) > limits.name_length_max_bytes:
        raise NameTooLong(
            f"name of {len(encoded)} bytes exceeds the {limits.name_length_max_bytes}-byte limit: {name[:40]!r}..."
        )
    return name


def split(path: str) -> list[str]:
    """``"/a/b/c"`` -> ``["a", "b", "c"]``; ``"/"`` -> ``[]``. Every component is checked.

    Repeated and trailing slashes are tolerated (``"/a//b/"`` is ``["a", "b"]``) as POSIX
    does; relative paths, ``.`` and ``..`` are rejected."""
    if not isinstance(path, str):
        raise InvalidPath(f"path must be a string, not {type(path).__name__}")
    if "\x00" in path:
        raise InvalidPath(f"invalid path {path!r}: contains a NUL byte")
    if not path.startswith("/"):
        raise InvalidPath(f"invalid path {path!r}: must be absolute (start with '/')")
    if len(path.encode("utf-8", "surrogatepass")) > limits.path_length_max_bytes:
        raise NameTooLong(f"path longer than {limits.path_length_max_bytes} bytes")
    return [check_name(part) for part in path.split("/") if part]


def join(*parts: str) -> str:
    return "/" + "/".join(p for part in parts for p in part.split("/") if p)


def parent_and_name(path: str) -> tuple[list[str], str]:
    """Split into the parent's components and the last name; the root has no name."""
    parts = split(path)
    if not parts:
        raise InvalidPath("the root directory has no name and cannot be created, removed or renamed")
    return parts[:-1], parts[-1]
