"""Who asks, and what POSIX lets them do: the permission checks of the metadata store.

The store's operations take ``caller``: a :class:`Caller` (the authenticated uid, gid and
supplementary groups of the client the metadata service serves) or ``None``, a trusted
internal caller that is never checked. Every check here is a small function of an inode's
attributes (the ``Attrs`` ``engine.py`` loads anyway: ``mode``, ``uid``, ``gid``, ``kind``) and
the caller, with no database access; the engine calls them where Linux does.

Errors: a missing permission bit is ``PermissionDenied`` (EACCES); what only an owner or root
may do (chmod, chown, set-policy, removing from a sticky directory) is ``NotPermitted``
(EPERM), as Linux answers.
"""

from __future__ import annotations

import stat as statmod
from dataclasses import dataclass

from .. import limits
from ..errors import NotPermitted, PermissionDenied
from ..modes import killed_by_write
from ..wire.values import Attrs

R, W, X = 4, 2, 1  # the permission bits of one class (owner, group, other)


@dataclass(frozen=True)
class Caller:
    """An authenticated client: its uid, its primary gid and its supplementary groups
    (which may or may not include ``gid``)."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.groups, frozenset):  # a list or set from a table row
            object.__setattr__(self, "groups", frozenset(self.groups))

    @property
    def is_root(self) -> bool:
        return self.uid == 0

    def in_group(self, gid: int) -> bool:
        return gid == self.gid or gid in self.groups


ROOT = Caller(0, 0)


def may(attrs: Attrs, caller: Caller | None, want: int) -> bool:
    """Whether ``caller`` has every permission in ``want`` (``R | W | X`` bits) on ``attrs``.
    ``None`` may do anything. Root may do anything but execute a non-directory without any
    x bit. Others get the owner's bits if they own it, else the group's if they are in its
    group, else everyone's: only the first class that matches counts (POSIX)."""
    if caller is None:
        return True
    mode = attrs.mode
    if caller.is_root:
        return not want & X or statmod.S_ISDIR(mode) or bool(mode & 0o111)
    if caller.uid == attrs.uid:
        bits = mode >> 6
    elif caller.in_group(attrs.gid):
        bits = mode >> 3
    else:
        bits = mode
    return bits & want == want


def _words(want: int, attrs: Attrs) -> str:
    execute = "search" if statmod.S_ISDIR(attrs.mode) else "execute"
    return " and ".join(word for bit, word in ((R, "read"), (W, "write"), (X, execute)) if want & bit)


def require(attrs: Attrs, caller: Caller | None, *wants: int, path: str, on: str | None = None) -> None:
    """Raise ``PermissionDenied`` unless ``caller`` has one of ``wants`` (each a set of bits,
    all needed) on ``attrs``. ``path`` is what the caller asked for; ``on`` names the inode
    checked when it is another one (a directory on the way)."""
    if caller is None or any(may(attrs, caller, want) for want in wants):
        return
    needs = " or ".join(_words(want, attrs) for want in wants)
    where = "" if on is None or on == path else f" on {on}"
    raise PermissionDenied(f"{path}: permission denied (uid {caller.uid} needs {needs} permission{where})")


def names_only(attrs: Attrs) -> Attrs:
    """What a listing tells a caller who may read the directory but not search it (``r--``
    for them) of one entry: what ``getdents(2)`` gives, its inode number and type, and
    nothing a lookup would have had to allow: no permission bits, owner, size, times, link
    count or symlink target, and no file handle (the service issues none: it would let the
    caller name the inode by number and read it). Linux's ``ls -l`` of such a directory shows
    the names with ``?`` for the rest. ``nlink`` 0 marks it (:func:`is_names_only`): an
    inode that a directory names has a link."""
    return Attrs(ino=attrs.ino, kind=attrs.kind, mode=statmod.S_IFMT(attrs.mode), uid=0, gid=0, size=0, atime=0.0,
                 mtime=0.0, ctime=0.0, nlink=0, policy="", block_size=limits.block_size_min_bytes,
                 parent=attrs.parent)


def is_names_only(attrs: Attrs) -> bool:
    """``attrs`` is a listing's entry of a directory its caller may not search (:func:`names_only`)."""
    return attrs.nlink == 0


def owns(attrs: Attrs, caller: Caller | None) -> bool:
    """The caller is trusted, root or the owner."""
    return caller is None or caller.is_root or caller.uid == attrs.uid


def require_owner(attrs: Attrs, caller: Caller | None, path: str, doing: str) -> None:
    if not owns(attrs, caller):
        assert caller is not None
        raise NotPermitted(
            f"{path}: operation not permitted (only its owner, uid {attrs.uid}, or root may {doing};"
            f" caller is uid {caller.uid})"
        )


def require_writer(attrs: Attrs, caller: Caller | None, path: str) -> None:
    """Writing a file's data (allocate, stage, commit, a writer's lease): its owner always
    may (they could chmod it anyway: ``open(O_CREAT | O_WRONLY, 0o444)`` then write works),
    others need write permission."""
    if not owns(attrs, caller):
        require(attrs, caller, W, path=path)


def require_linkable(attrs: Attrs, caller: Caller | None, path: str) -> None:
    """A new hard link to the inode ``attrs`` names, as Linux with ``fs.protected_hardlinks =
    1``: its owner (or root) may link anything; others only a regular file that is neither
    set-user-ID nor set-group-ID-and-group-executable and that they may both read and write.
    Otherwise a user could keep another's file alive after its owner deleted it, or pin a
    set-id program at a path of its own. ``NotPermitted`` (EPERM), as Linux answers."""
    if owns(attrs, caller):
        return
    assert caller is not None
    mode = attrs.mode
    set_id = killed_by_write(mode)
    if attrs.kind == "file" and not set_id and may(attrs, caller, R | W):
        return
    raise NotPermitted(
        f"{path}: operation not permitted (uid {caller.uid} may link only files it owns, or regular files it may"
        f" read and write that are not set-id; its owner is uid {attrs.uid})"
    )


def require_removable(directory: Attrs, entry: Attrs, caller: Caller | None, path: str, dir_path: str) -> None:
    """Removing (or renaming, or replacing) the entry ``path`` of ``directory``: write and
    search permission on the directory; in a sticky directory (``S_ISVTX``, like /tmp) only
    the entry's owner, the directory's owner or root."""
    require(directory, caller, W | X, path=path, on=dir_path)
    if (caller is not None and directory.mode & statmod.S_ISVTX and not caller.is_root
            and caller.uid not in (directory.uid, entry.uid)):
        raise NotPermitted(
            f"{path}: operation not permitted ({dir_path} is sticky: only the entry's owner, uid {entry.uid},"
            f" the directory's owner, uid {directory.uid}, or root may remove or replace it; caller is"
            f" uid {caller.uid})"
        )


def require_move(
    source_dir: Attrs, entry: Attrs, target_dir: Attrs, caller: Caller | None, path: str, source_dir_path: str
) -> None:
    """Taking ``entry`` out of ``source_dir`` to put it into ``target_dir`` (rename, exchange):
    it must be removable from ``source_dir``, and a directory that changes parent needs write
    permission on itself (its ``..`` changes), as Linux asks."""
    require_removable(source_dir, entry, caller, path, source_dir_path)
    if entry.kind == "dir" and source_dir.ino != target_dir.ino:
        require(entry, caller, W, path=path)


def new_owner(parent: Attrs, caller: Caller | None, mode: int, uid: int, gid: int) -> tuple[int, int, int]:
    """``(mode, uid, gid)`` of a new inode (``mode`` with its file type) below ``parent``.
    A trusted caller's request is taken as it is. Otherwise the inode belongs to the caller's
    uid and gid, except below a setgid directory: the directory's gid, a new directory is
    setgid too, and a new setgid-and-group-executable file of a caller outside that group
    loses its setgid bit (Linux)."""
    if caller is None:
        return mode, uid, gid
    uid, gid = caller.uid, caller.gid
    if parent.mode & statmod.S_ISGID:
        gid = parent.gid
        if statmod.S_ISDIR(mode):
            mode |= statmod.S_ISGID
        elif mode & (statmod.S_ISGID | statmod.S_IXGRP) == statmod.S_ISGID | statmod.S_IXGRP and not (
                caller.is_root or caller.in_group(gid)):
            mode &= ~statmod.S_ISGID
    return mode, uid, gid


def checked_setattr(
    attrs: Attrs, caller: Caller | None, path: str, mode: int | None, uid: int | None, gid: int | None,
    times: bool,
) -> int | None:
    """Check a setattr and return the mode to store (``mode``, the full new mode or None for
    unchanged, adjusted as Linux does). chmod: the owner or root; a non-root owner outside the
    file's (new) group cannot set its setgid bit. chown: only root changes the owner; the
    owner may change the group to one they are in; a non-root chown clears the setuid and
    setgid bits of a non-directory. Clearing only the setuid and setgid bits (what the kernel
    asks when a non-owner writes a set-id file): anyone with write permission. Times: the
    owner, root, or anyone with write permission."""
    if caller is None:
        return mode
    if uid is not None and not caller.is_root and uid != attrs.uid:
        raise NotPermitted(
            f"{path}: operation not permitted (only root may change the owner, uid {attrs.uid}, to uid {uid};"
            f" caller is uid {caller.uid})"
        )
    chown = uid is not None or gid is not None
    if chown:
        require_owner(attrs, caller, path, "chown it")
    if gid is not None and not caller.is_root and gid != attrs.gid and not caller.in_group(gid):
        raise NotPermitted(f"{path}: operation not permitted (uid {caller.uid} is not in group {gid})")
    kill_set_id = (mode is not None and not chown and mode != attrs.mode
                   and mode == attrs.mode & ~(statmod.S_ISUID | statmod.S_ISGID))
    if kill_set_id and not owns(attrs, caller):
        require(attrs, caller, W, path=path)
    elif mode is not None:
        require_owner(attrs, caller, path, "chmod it")
        if not (caller.is_root or caller.in_group(attrs.gid if gid is None else gid)):
            mode &= ~statmod.S_ISGID
    if times and not owns(attrs, caller):
        require(attrs, caller, W, path=path)
    if chown and not caller.is_root and not statmod.S_ISDIR(attrs.mode):
        mode = (attrs.mode if mode is None else mode) & ~(statmod.S_ISUID | statmod.S_ISGID)
    return mode
