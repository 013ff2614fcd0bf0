"""What a directory says about the checkpoints saved below it (extended attributes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import errors
from ..checkpoint_gc import COMPRESS_XATTR

if TYPE_CHECKING:
    from ..client import FileSystem


def directory_compresses(fs: FileSystem, path: str) -> bool:
    """Whether checkpoints saved below ``path`` are compressed by default: the
    ``user.tectofs.compress`` attribute (``zstd``: yes, ``off``: no) of ``path`` or of its
    nearest ancestor that has one; no if none has. Unreadable attributes count as absent."""
    while True:
        try:
            value = bytes(fs.getxattr(path, COMPRESS_XATTR)).decode(errors="replace").strip().lower()
        except (errors.TectofsError, OSError):
            value = ""
        if value:
            return value in ("zstd", "on", "1", "true", "yes")
        if path in ("", "/"):
            return False
        path = path.rstrip("/").rsplit("/", 1)[0] or "/"
