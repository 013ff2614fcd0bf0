"""``setattr``: size, mode, owner and times, and which of them ride on a writer's commit.

tar, cp -p and rsync create a file, write it, then set its times, owner and mode before
closing it. On a file the caller's descriptor on this mount created (and is the only one
writing), the changes that make nothing more restrictive ride on its commit at close, one
call for all: times, a chown that changes nothing, a chmod that only adds permission bits.
The kernel sees them at once (``OpenFiles.uncommitted``). Anything else commits this
mount's writers of the file first (so their commit at close does not stamp the current time
over times set now), then sets the attributes in one metadata call: by path, or, for a file
unlinked while open (no path leads to it), by inode number with the handle of a descriptor
the caller has open on it.

A size change through a descriptor (``ftruncate``) goes to that descriptor's file; by path it
goes to every writer of the file on this mount (so their next commits keep it), or to the
metadata service when there is none.
"""

from __future__ import annotations

import stat as statmod

import pyfuse3

from tectofs.client.core import Stat
from tectofs.client.fuse.handles import OpenFile
from tectofs.client.fuse.state import MountState
from tectofs.client.fuse.users import Identity
from tectofs.errors import StaleFile
from tectofs.wire import messages

_SET_ID = statmod.S_ISUID | statmod.S_ISGID


async def set_attributes(state: MountState, inode: int, attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields,
                         fh: int | None, identity: Identity | None) -> Stat:
    """Apply the ``fields`` of ``attr`` to ``inode`` (``fh``: the descriptor of an
    ``ftruncate``) as ``identity``; returns the attributes after (before this mount's
    uncommitted changes, which ``MountState.entry`` adds)."""
    st: Stat | None = None
    if fields.update_size:
        st = await _set_size(state, inode, attr.st_size, fh, identity)
    mode = attr.st_mode & 0o7777 if fields.update_mode else None
    uid = attr.st_uid if fields.update_uid else None
    gid = attr.st_gid if fields.update_gid else None
    atime = attr.st_atime_ns / 1e9 if fields.update_atime else None
    mtime = attr.st_mtime_ns / 1e9 if fields.update_mtime else None
    if mode is None and uid is None and gid is None and atime is None and mtime is None:
        return st if st is not None else await state.stat_inode(inode, identity)
    writer = state.creating_writer(inode, identity)
    if writer is not None and _rides_on_commit(writer, mode, uid, gid):
        async with writer.lock:
            if mode is not None:
                writer.file.stamp_mode(mode)
            if atime is not None or mtime is not None:
                writer.file.stamp_times(atime, mtime)
            writer.dirty = True  # the commit carries them (a chown that changes nothing: its ctime)
            # nothing changed at the metadata service yet: what other changes left fresh stays so
            return Stat.from_attrs(writer.file.attrs)
    await state.files.commit_writers(inode)
    try:
        path: str | None = await state.checked_path(inode, identity)
    except StaleFile:  # unlinked while open
        path = None
    started = state.fresh.begin_change()
    try:
        if path is None:
            st = await _set_by_inode(state, inode, mode, uid, gid, atime, mtime, identity)
        else:
            st = await state.as_caller(identity, lambda fs: fs.setattr(path, mode=mode, uid=uid, gid=gid, atime=atime,
                                                                       mtime=mtime))
    finally:
        state.fresh.end_change(started)  # the reply carries the attributes: nothing to keep for a getattr
    return st


async def _set_by_inode(state: MountState, inode: int, mode: int | None, uid: int | None, gid: int | None,
                        atime: float | None, mtime: float | None, identity: Identity | None) -> Stat:
    """``fchmod``/``fchown``/``futimens`` of a file unlinked while open (``inode`` has no
    name): by inode number, with the handle of a descriptor the caller opened on this mount
    (the service's rules for each change apply as by path). ``StaleFile`` (ESTALE) when the
    caller has none."""
    uid_of = state.uid_of(identity)
    for handle in state.files.of(inode):
        file = handle.file
        if file.context.acting_uid != uid_of:
            continue  # another user's descriptor: its handle is not this caller's to use
        reply = await file.context.metadata.setattr(messages.SetattrRequest(
            ino=file.ino, handle=file.handle, mode=mode, uid=uid, gid=gid, atime=atime, mtime=mtime))
        return Stat.from_attrs(reply.attrs)
    raise StaleFile(f"inode {inode} has no name (unlinked while open) and the caller has no descriptor of it here")


def _rides_on_commit(writer: OpenFile, mode: int | None, uid: int | None, gid: int | None) -> bool:
    """Whether the change takes nothing away: a mode that only grants (no set-id, sticky), an
    owner and group that stay (a chown clears set-id bits, so not on such a file)."""
    attrs = writer.file.attrs
    current = attrs.mode & 0o7777 if writer.file.stamped_mode is None else writer.file.stamped_mode
    if mode is not None and (mode & ~0o777 or current & ~mode):
        return False
    if uid is None and gid is None:
        return True
    return uid in (None, attrs.uid) and gid in (None, attrs.gid) and not current & _SET_ID


async def _set_size(state: MountState, inode: int, size: int, fh: int | None, identity: Identity | None) -> Stat | None:
    """Truncate or extend ``inode`` to ``size`` (see the module docstring); the attributes
    after, when known without a call."""
    if fh is not None:
        handle = state.files.get(fh)
        async with handle.lock:
            await handle.file.truncate(size)
            handle.dirty = True
            return Stat.from_attrs(handle.file.attrs)
    writers = state.files.writers(inode)
    if not writers:
        path = await state.checked_path(inode, identity)
        await state.as_caller(identity, lambda fs: fs.truncate(path, size))
        return None
    for handle in writers:  # so that their next commits keep the new size
        async with handle.lock:
            await handle.file.truncate(size)
            await handle.file.flush()
            handle.dirty = False
    return None
