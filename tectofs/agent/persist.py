"""Persist a held step to the cluster exactly as a normal save would have made it: its files
into a hidden ``.<name>.pending-<token>`` directory beside the step, ``.metadata`` last, then
one atomic rename onto the step's name (``tectofs.torch._dcp``'s commit protocol). A crash at
any point leaves no step or the whole one.

Several agents may hold the same sealed step (the primary and its replicas, which take over
when the primary stops telling them it persisted). Whichever renames first commits; another
that finds the step committed compares its ``.metadata`` with its own: the same bytes mean the
same save, persisted (its own pending directory is deleted); other bytes mean someone else
saved that name, which is refused (AlreadyExists), never overwritten.

Every call acts as the step's owner (``FileSystem.acting_as``; the agent's credential is a
proxy): the metadata service checks the owner's permissions, and what is made is the owner's.
"""

from __future__ import annotations

import mmap
import os
import uuid
from typing import TYPE_CHECKING

from tectofs import errors
from tectofs import uri as _uri
from tectofs.checkpoint_gc import METADATA_NAME, pending_name

if TYPE_CHECKING:
    from tectofs.client import FileSystem
    from tectofs.wire.messages import ActAs


def _read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _same_save_committed(fs: FileSystem, final: str, metadata: bytes) -> bool:
    """Whether ``final`` holds a committed checkpoint with ``metadata`` as its ``.metadata``;
    AlreadyExists if it holds another one."""
    try:
        committed = fs.read_bytes(f"{final}/{METADATA_NAME}")
    except FileNotFoundError:
        return False
    if committed != metadata:
        raise errors.AlreadyExists(f"{final} was committed by another save: the memory tier's copy is not persisted"
                                   " over it")
    return True


def persist(step: str, files: dict[str, str], cluster: str, owner: ActAs) -> bool:
    """Commit the step ``step`` (a ``tectofs://`` id; without an address, of ``cluster``)
    made of ``files`` (name -> local path; ``.metadata`` among them) to its cluster, acting as
    ``owner``. Returns True if this call committed it, False if the same save was committed
    already (by another agent). Raises on failure, after deleting its pending directory (best
    effort)."""
    assert METADATA_NAME in files
    loc = _uri.parse(step)
    fs = _uri.filesystem(loc.address or cluster).acting_as(owner.uid, owner.gid, owner.groups)
    if not loc.name:
        raise errors.InvalidArgument(f"{step}: a checkpoint cannot be the root directory")
    metadata = _read_file(files[METADATA_NAME])
    if _same_save_committed(fs, loc.path, metadata):
        return False
    fs.mkdir(loc.parent, parents=True, exist_ok=True)
    pending = _uri.Location(loc.address, loc.parent).child(pending_name(loc.name, uuid.uuid4().hex[:16])).path
    fs.mkdir(pending)
    try:
        for name, path in sorted(files.items()):
            if name != METADATA_NAME:
                _copy_in(fs, path, f"{pending}/{name}")
        fs.write_bytes(f"{pending}/{METADATA_NAME}", metadata)
        try:
            fs.rename(pending, loc.path)
            return True
        except (FileExistsError, errors.DirectoryNotEmpty, NotADirectoryError, IsADirectoryError):
            if not _same_save_committed(fs, loc.path, metadata):
                raise
        fs.rmtree(pending)
        return False
    except BaseException:
        try:
            fs.rmtree(pending)
        except Exception:  # gc_pending collects what is left
            pass
        raise


def _copy_in(fs: FileSystem, source: str, target: str) -> None:
    """Write the local file ``source`` to the cluster file ``target``, from a mapping of it."""
    with open(source, "rb") as f, fs.open(target, "wb", buffering=0) as raw:
        size = os.fstat(f.fileno()).st_size
        if not size:
            return
        mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        written = raw.pwritev([memoryview(mapped)], 0)
        try:
            mapped.close()
        except BufferError:  # the client still holds a slice of it (a block buffer's view): closed when freed
            pass
        if written != size:
            raise errors.CheckpointError(f"{target}: wrote {written} of {size} bytes")
