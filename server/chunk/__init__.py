"""The chunk server: checksummed chunk files on local flash, served over the wire protocol."""

from .service import ChunkServer
from .storage import ChunkStore

__all__ = ["ChunkServer", "ChunkStore"]
