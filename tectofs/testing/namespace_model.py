"""The sequential model of the shared tree: what each operation does, and answers, alone.

The checker (``tectofs.testing.linearize``) asks whether a whole history is explained by one
order of its operations, each doing exactly what :func:`apply` says here. This docstring is the
contract. The tree holds inodes (``file`` or ``dir``, with permission ``mode``, ``uid``, ``gid``,
bytes and extended attributes) under absolute paths; a file's ``nlink`` is the number of names it
has, a directory's ``2 +`` its subdirectories. Every client acts as root: permission checks,
times (atime, mtime, ctime) and inode numbers are not modelled. Paths are absolute, with no
empty, ``.`` or ``..`` components; resolving one fails ``ENOENT`` at the first missing
component and ``ENOTDIR`` at a component that is a file, before anything else is checked.

Each kind, its arguments, what it promises (errors in the order Linux checks them) and answers:

- ``create(path, mode=0o644)``: ``open(O_CREAT|O_EXCL)`` then close: ``EEXIST`` if the name
  exists; else a new empty file. Answers nothing.
- ``write(path, data)``: ``open(O_CREAT|O_TRUNC)``, one write, close (the whole file is
  ``data``, published at close): ``EISDIR`` on a directory; a new name gets mode 0644.
- ``append(path, data)``: ``open(O_CREAT|O_APPEND)``, write, close: ``data`` goes at the end.
- ``read(path)``: open, read all, close: ``EISDIR`` on a directory; answers the bytes.
- ``stat(path)``: answers ``{kind, mode, uid, gid, nlink, size}`` (``size``: files only).
- ``list(path)``: ``ENOTDIR`` on a file; answers the sorted names in the directory.
- ``rename(path, dest)``: both parents resolved first; ``ENOENT`` if ``path`` is missing;
  ``EINVAL`` if ``dest`` lies inside ``path``; ``ENOTEMPTY`` if ``path`` lies inside ``dest``;
  nothing happens if both name the same inode; then over an existing ``dest``: ``ENOTDIR``
  (a directory over a file), ``EISDIR`` (a file over a directory), ``ENOTEMPTY`` (over a
  non-empty directory); else atomically moves the name (and everything below it), replacing
  ``dest``.
- ``link(path, dest)``: ``path`` resolved first (``ENOENT``), then ``dest``'s parent,
  ``EEXIST``, then ``EPERM`` for a directory; else a second name for the same inode.
- ``unlink(path)``: ``EISDIR`` on a directory (Linux's answer); removes the name.
- ``rmdir(path)``: ``ENOTDIR`` on a file, ``EBUSY`` for ``/``, ``ENOTEMPTY``; removes it.
- ``mkdir(path, mode=0o755)``: ``EEXIST``; a new empty directory.
- ``chmod(path, mode)``, ``chown(path, uid, gid)``: set them.
- ``truncate(path, size)``: ``EISDIR`` on a directory, ``EINVAL`` for a negative size; cuts
  the bytes or extends them with zeros.
- ``setxattr(path, name, value)``: sets one extended attribute; ``getxattr(path, name)``
  answers its bytes, ``ENODATA`` when it has none of that name.
- ``fsync(path)``: open, fsync, close: changes nothing, answers nothing. A client's completed
  ``fsync`` makes its earlier changes durable (``linearize`` uses it for crash rules).

Client kinds (:data:`PROFILES`) make the same calls in terms of the same tree, with what their
interface allows: S3 makes only ``write`` (PUT), ``read`` (GET), ``stat`` (HEAD: kind and
size), ``list`` (a missing prefix lists empty), ``unlink`` (DELETE: a missing key is fine) and
``mkdir`` (a bucket or folder: existing is fine); its PUTs make parent directories, and every
error it can show is ``ENOENT`` (NoSuchKey), and a PUT shows nothing until it is complete
(it is written under a hidden name and renamed into place). Through the other kinds a
``write``/``append`` to a new name shows it, empty, from its open on. fsspec writes make parent directories
(``auto_mkdir``) and its ``info`` has no ``nlink``. A client kind's answers are compared after
:func:`observe` keeps only what that kind can see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import NamedTuple

from tectofs.testing.history import KINDS, Arg, StatValue, Value

Outcome = tuple[Value, "str | None"]  # (value, errno name or None)
#: Not a call anyone makes: the first step of a ``write`` or ``append`` (its ``open``), after
#: which a new name exists, empty, until the close publishes the bytes (README: "a new name
#: exists, empty, from the open on"). Makes an empty file if the name is missing, else nothing.
OPEN_CREATE = "open-create"


class Inode(NamedTuple):
    kind: str  # "file" or "dir"
    mode: int
    uid: int = 0
    gid: int = 0
    data: bytes = b""
    xattrs: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True)
class Profile:
    """What a client kind can call and see."""
    kinds: frozenset[str]
    stat_fields: tuple[str, ...] = ("kind", "mode", "uid", "gid", "nlink", "size")
    makes_parents: bool = False  # writes make missing parent directories
    missing_is_fine: bool = False  # deleting a missing name, listing a missing prefix, an existing mkdir: success
    errors_seen_as: str | None = None  # every error shows as this one
    empty_while_writing: bool = True  # a new name shows, empty, from a write's open to its close


PROFILES: dict[str, Profile] = {
    "mount": Profile(frozenset(KINDS)),
    "library": Profile(frozenset(KINDS)),
    "fsspec": Profile(frozenset({"create", "write", "append", "read", "stat", "list", "rename", "unlink", "mkdir",
                                 "rmdir", "fsync"}), ("kind", "mode", "uid", "gid", "size"), makes_parents=True),
    "s3": Profile(frozenset({"write", "read", "stat", "list", "unlink", "mkdir"}), ("kind", "size"),
                  makes_parents=True, missing_is_fine=True, errors_seen_as="ENOENT", empty_while_writing=False),
}


class StateKey:
    """A tree's contents as a value: equal for equal trees, its hash computed once."""

    __slots__ = ("items", "_hash")

    def __init__(self, items: frozenset[object]) -> None:
        self.items = items
        self._hash = hash(items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateKey) and self._hash == other._hash and self.items == other.items


class Tree:
    """One state of the tree: ``entries`` maps each path to its inode number (``/`` is 1),
    ``inodes`` each number to its :class:`Inode`. Treat as immutable: :func:`apply` answers a
    changed copy. ``key()`` is hashable and equal for equal trees (up to inode numbering)."""

    __slots__ = ("entries", "inodes", "_key")

    def __init__(self, entries: dict[str, int], inodes: dict[int, Inode]) -> None:
        self.entries = entries
        self.inodes = inodes
        self._key: StateKey | None = None

    @classmethod
    def initial(cls, files: Mapping[str, bytes | None] | None = None) -> Tree:
        """A tree with ``files`` (path -> bytes, or None for a directory; parents made as needed)."""
        tree = cls({"/": 1}, {1: Inode("dir", 0o755)})
        for path in sorted(files or {}):
            data = (files or {})[path]
            parts = _parts(path)
            for depth in range(1, len(parts)):
                parent = "/" + "/".join(parts[:depth])
                if parent not in tree.entries:
                    tree._add(parent, Inode("dir", 0o755))
            if path not in tree.entries and path != "/":
                tree._add(path, Inode("dir", 0o755) if data is None else Inode("file", 0o644, data=data))
        return tree

    def key(self) -> StateKey:
        if self._key is None:
            inodes = self.inodes
            named: frozenset[object] = frozenset(zip(self.entries, map(inodes.__getitem__, self.entries.values())))
            if len(inodes) != len(self.entries):  # hard links: which names share an inode
                groups: dict[int, list[str]] = {}
                for path, ino in self.entries.items():
                    groups.setdefault(ino, []).append(path)
                named |= {frozenset(g) for g in groups.values() if len(g) > 1}
            self._key = StateKey(named)
        return self._key

    def copy(self) -> Tree:
        return Tree(dict(self.entries), dict(self.inodes))

    def inode(self, path: str) -> Inode | None:
        ino = self.entries.get(path)
        return None if ino is None else self.inodes[ino]

    def children(self, path: str) -> list[str]:
        prefix = "/" if path == "/" else path + "/"
        return sorted(p[len(prefix):] for p in self.entries if p.startswith(prefix) and "/" not in p[len(prefix):]
                      and p != "/")

    def has_children(self, path: str) -> bool:
        prefix = path + "/"
        return any(p.startswith(prefix) for p in self.entries)

    def nlink(self, path: str) -> int:
        ino = self.entries[path]
        if self.inodes[ino].kind == "dir":
            below = [self.inodes[self.entries[_join(path, name)]] for name in self.children(path)]
            return 2 + sum(1 for inode in below if inode.kind == "dir")
        return sum(1 for other in self.entries.values() if other == ino)

    def files(self) -> dict[str, bytes | None]:
        return {p: (None if self.inodes[i].kind == "dir" else self.inodes[i].data)
                for p, i in self.entries.items() if p != "/"}

    def _add(self, path: str, inode: Inode) -> None:
        ino = max(self.inodes) + 1
        self.inodes[ino] = inode
        self.entries[path] = ino

    def _set(self, path: str, inode: Inode) -> None:
        self.inodes[self.entries[path]] = inode

    def _remove(self, path: str) -> None:
        ino = self.entries.pop(path)
        if ino not in self.entries.values():
            del self.inodes[ino]


def _parts(path: str) -> list[str]:
    return [part for part in path.split("/") if part]


def _join(parent: str, name: str) -> str:
    return "/" + name if parent == "/" else f"{parent}/{name}"


def _parent(path: str) -> str:
    head = path.rsplit("/", 1)[0]
    return head or "/"


def _check_path(path: str) -> None:
    parts = path.split("/")[1:]
    if not path.startswith("/") or (path != "/" and any(p in ("", ".", "..") for p in parts)):
        raise ValueError(f"not a model path: {path!r}")


def resolve_parent(tree: Tree, path: str) -> str | None:
    """The error resolving ``path``'s parent directories gives (``ENOENT``, ``ENOTDIR``), or None."""
    parts = _parts(path)
    current = ""
    for part in parts[:-1]:
        current += "/" + part
        inode = tree.inode(current)
        if inode is None:
            return "ENOENT"
        if inode.kind != "dir":
            return "ENOTDIR"
    return None


def _make_parents(tree: Tree, path: str) -> str | None:
    """mkdir -p of ``path``'s parents in place (``tree`` is a fresh copy); the error or None."""
    parts = _parts(path)
    current = ""
    for part in parts[:-1]:
        current += "/" + part
        inode = tree.inode(current)
        if inode is None:
            tree._add(current, Inode("dir", 0o755))
        elif inode.kind != "dir":
            return "ENOTDIR"
    return None


def _int(args: Mapping[str, Arg], name: str, default: int | None = None) -> int:
    value = args.get(name, default)
    if not isinstance(value, int):
        raise ValueError(f"argument {name}: expected an integer, got {value!r}")
    return value


def _bytes(args: Mapping[str, Arg], name: str) -> bytes:
    value = args.get(name, b"")
    if isinstance(value, str):
        return value.encode()
    if not isinstance(value, bytes):
        raise ValueError(f"argument {name}: expected bytes, got {value!r}")
    return value


def stat_of(tree: Tree, path: str) -> StatValue:
    inode = tree.inode(path)
    assert inode is not None
    summary: StatValue = {"kind": inode.kind, "mode": inode.mode, "uid": inode.uid, "gid": inode.gid,
                          "nlink": tree.nlink(path)}
    if inode.kind == "file":
        summary["size"] = len(inode.data)
    return summary


def apply(tree: Tree, kind: str, args: Mapping[str, Arg], profile: Profile = PROFILES["library"]) -> tuple[Tree, Outcome]:
    """Do one operation on ``tree``: the resulting tree (``tree`` itself when nothing changed)
    and what the operation answers, as the module docstring says."""
    path = str(args["path"])
    _check_path(path)
    error = resolve_parent(tree, path)
    if error is not None and profile.makes_parents and kind in ("write", "append", "create", "mkdir"):
        changed = tree.copy()
        error = _make_parents(changed, path)
        if error is None:
            after, outcome = apply(changed, kind, args, replace(profile, makes_parents=False))
            return after, outcome
    if error is not None:
        return tree, _missing(profile, kind, error)
    inode = tree.inode(path)
    if kind in ("rename", "link"):
        return _two_paths(tree, kind, path, str(args["dest"]), inode)
    if kind == "create":
        if inode is not None:
            return tree, (None, "EEXIST")
        changed = tree.copy()
        changed._add(path, Inode("file", _int(args, "mode", 0o644)))
        return changed, (None, None)
    if kind == "mkdir":
        if inode is not None:
            return tree, (None, None if profile.missing_is_fine and inode.kind == "dir" else "EEXIST")
        changed = tree.copy()
        changed._add(path, Inode("dir", _int(args, "mode", 0o755)))
        return changed, (None, None)
    if kind == OPEN_CREATE:
        if inode is not None:
            return tree, (None, None)
        changed = tree.copy()
        changed._add(path, Inode("file", 0o644))
        return changed, (None, None)
    if kind in ("write", "append"):
        data = _bytes(args, "data")
        if inode is not None and inode.kind == "dir":
            return tree, (None, "EISDIR")
        changed = tree.copy()
        if inode is None:
            changed._add(path, Inode("file", 0o644, data=data))
        else:
            changed._set(path, inode._replace(data=inode.data + data if kind == "append" else data))
        return changed, (None, None)
    if inode is None:
        return tree, _missing(profile, kind, "ENOENT")
    if kind == "read":
        return tree, (None, "EISDIR") if inode.kind == "dir" else (inode.data, None)
    if kind == "stat":
        return tree, (stat_of(tree, path), None)
    if kind == "list":
        if inode.kind != "dir":
            return tree, ([], None) if profile.missing_is_fine else (None, "ENOTDIR")
        return tree, (tree.children(path), None)
    if kind == "getxattr":
        value = dict(inode.xattrs).get(str(args["name"]))
        return tree, (value, None) if value is not None else (None, "ENODATA")
    if kind == "fsync":
        return tree, (None, None)
    if kind == "unlink":
        if inode.kind == "dir":
            return tree, (None, None if profile.missing_is_fine else "EISDIR")
        changed = tree.copy()
        changed._remove(path)
        return changed, (None, None)
    if kind == "rmdir":
        if inode.kind != "dir":
            return tree, (None, "ENOTDIR")
        if path == "/":
            return tree, (None, "EBUSY")
        if tree.has_children(path):
            return tree, (None, "ENOTEMPTY")
        changed = tree.copy()
        changed._remove(path)
        return changed, (None, None)
    if kind == "truncate":
        size = _int(args, "size")
        if inode.kind == "dir":
            return tree, (None, "EISDIR")
        if size < 0:
            return tree, (None, "EINVAL")
        data = inode.data[:size] + b"\0" * max(0, size - len(inode.data))
        return _changed(tree, path, inode._replace(data=data))
    if kind == "chmod":
        return _changed(tree, path, inode._replace(mode=_int(args, "mode") & 0o7777))
    if kind == "chown":
        return _changed(tree, path, inode._replace(uid=_int(args, "uid", inode.uid), gid=_int(args, "gid", inode.gid)))
    if kind == "setxattr":
        xattrs = dict(inode.xattrs)
        xattrs[str(args["name"])] = _bytes(args, "value")
        return _changed(tree, path, inode._replace(xattrs=tuple(sorted(xattrs.items()))))
    raise ValueError(f"unknown operation kind {kind!r}")


def _missing(profile: Profile, kind: str, error: str) -> Outcome:
    if profile.missing_is_fine and kind == "unlink":
        return None, None
    if profile.missing_is_fine and kind == "list":
        return [], None
    return None, error


def _changed(tree: Tree, path: str, inode: Inode) -> tuple[Tree, Outcome]:
    changed = tree.copy()
    changed._set(path, inode)
    return changed, (None, None)


def _inside(path: str, ancestor: str) -> bool:
    return ancestor == "/" or path.startswith(ancestor + "/")


def _two_paths(tree: Tree, kind: str, path: str, dest: str, inode: Inode | None) -> tuple[Tree, Outcome]:
    _check_path(dest)
    if kind == "link":
        if inode is None:
            return tree, (None, "ENOENT")
        error = resolve_parent(tree, dest)
        if error is not None:
            return tree, (None, error)
        if dest in tree.entries:
            return tree, (None, "EEXIST")
        if inode.kind == "dir":
            return tree, (None, "EPERM")
        changed = tree.copy()
        changed.entries[dest] = tree.entries[path]
        return changed, (None, None)
    error = resolve_parent(tree, dest)
    if error is not None:
        return tree, (None, error)
    if inode is None:
        return tree, (None, "ENOENT")
    if path == "/" or _inside(dest, path):
        return tree, (None, "EINVAL" if path != dest else None)
    if dest == "/" or _inside(path, dest):
        return tree, (None, "ENOTEMPTY")
    target = tree.inode(dest)
    if target is not None:
        if tree.entries[dest] == tree.entries[path]:
            return tree, (None, None)
        if inode.kind == "dir" and target.kind != "dir":
            return tree, (None, "ENOTDIR")
        if inode.kind != "dir" and target.kind == "dir":
            return tree, (None, "EISDIR")
        if target.kind == "dir" and tree.has_children(dest):
            return tree, (None, "ENOTEMPTY")
    changed = tree.copy()
    if target is not None:
        changed._remove(dest)
    prefix = path + "/"
    for old in [p for p in changed.entries if p == path or p.startswith(prefix)]:
        changed.entries[dest + old[len(path):]] = changed.entries.pop(old)
    return changed, (None, None)


def observe(profile: Profile, kind: str, outcome: Outcome) -> Outcome:
    """What a client of ``profile`` sees of ``outcome``: the errors it can tell apart, the stat
    fields it has, names sorted. Applied to the model's answer and to the recorded one alike."""
    value, error = outcome
    if error is not None:
        return None, profile.errors_seen_as or error
    if kind == "stat" and isinstance(value, dict):
        return {name: v for name, v in value.items() if name in profile.stat_fields}, None
    if kind == "list" and isinstance(value, list):
        return sorted(value), None
    return value, None
