"""What each client of one history calls: drawn from a seed, on a small shared tree.

Each history works in its own subtree ``BASE`` (``/<root>/h<N>``); the history's operations name
paths inside it as absolute *model* paths (``/a/f``), which :func:`real_path` maps to
``BASE/a/f``. The initial tree (:data:`INITIAL`) is two directories with a file each; calls pick
from a handful of names in them so that clients collide: renames over and into existing names
and across directories, links, removals of what others just made.

Which calls a client kind can make is ``tectofs.testing.namespace_model.PROFILES``: S3 makes
write (PUT), read (GET), stat (HEAD), list, unlink (DELETE) and mkdir (a folder) only; fsspec
has no link, chmod, chown, truncate or extended attributes; a mount and the library make every
kind. A name holds a file or a directory, never one then the other: renames and links go
between names of one kind, so that S3 (where a key ``a/f`` and a folder ``a/f/`` are two
things) sees the same tree as the others.
"""

from __future__ import annotations

import random

from tectofs.testing.history import KINDS, Arg
from tectofs.testing.namespace_model import PROFILES

# keep: never named by a call, so that /a and /b are never empty (the S3 gateway removes a
# directory a DELETE leaves empty, as S3 prefixes vanish; S3 deletes only top-level names).
INITIAL: dict[str, bytes | None] = {"/a": None, "/b": None, "/a/f": b"first", "/b/g": b"second",
                                    "/a/keep": b"k", "/b/keep": b"k"}
FILE_NAMES = ("/a/f", "/a/g", "/b/f", "/b/g", "/a/s/f")
DIR_NAMES = ("/a/s", "/b/s")
XATTR_NAMES = ("user.k", "user.j")
MODES = (0o644, 0o600, 0o755, 0o640)
OWNERS = ((0, 0), (1000, 1000), (0, 1000))
#: How often each kind is drawn (reads and writes most: they are what a cache gets wrong).
WEIGHTS = {"create": 3, "write": 6, "append": 3, "read": 6, "stat": 5, "list": 4, "rename": 5, "link": 2,
           "unlink": 3, "chmod": 2, "chown": 1, "truncate": 2, "mkdir": 3, "rmdir": 2, "setxattr": 2,
           "getxattr": 2, "fsync": 2}
assert set(WEIGHTS) == set(KINDS)

#: Calls a client kind could make but the checks leave out, and why (README: ``tectofs check``).
LEFT_OUT: dict[str, frozenset[str]] = {
    # An S3 folder ("a/s/", PUT) is the object stored as the file a/s/.tectofs-dir: a directory
    # with a file in it to every other client, not the model's empty directory.
    "s3": frozenset({"mkdir"}),
}

Call = tuple[str, dict[str, Arg]]


def real_path(base: str, path: str) -> str:
    return base if path == "/" else base + path


def draw_call(rng: random.Random, client_kind: str, label: str, leave_out: frozenset[str] = frozenset()) -> Call:
    """One random call a client of ``client_kind`` can make (none of ``leave_out``); ``label``
    makes its data unique."""
    kinds = sorted(PROFILES[client_kind].kinds - LEFT_OUT.get(client_kind, frozenset()) - leave_out)
    if not kinds:
        raise ValueError(f"a {client_kind} client has no call left to make")
    kind = rng.choices(kinds, [WEIGHTS[k] for k in kinds])[0]
    # A name is a file's or a directory's for the whole history (renames and links keep to
    # names of their kind): an S3 key and a folder of the same name are not one object.
    # fsspec's mv(a, d) moves a *into* d when d is a directory: its renames are of files only.
    is_dir = kind in ("mkdir", "rmdir", "list") or (
        kind in ("rename", "stat") and client_kind != "s3" and not (kind == "rename" and client_kind == "fsspec")
        and rng.random() < 0.3)
    if kind == "list":
        path = rng.choice(("/a", "/b") + DIR_NAMES)
    elif kind == "unlink" and client_kind == "s3":  # never empties /a/s: the gateway would remove it
        path = rng.choice(FILE_NAMES[:4])
    elif kind in ("create", "write", "append") and client_kind == "fsspec":
        # fsspec makes a missing parent (auto_mkdir) by a mkdir, then opens again: two steps, where
        # the model has one (PROFILES["fsspec"].makes_parents); its writes keep to /a and /b.
        path = rng.choice(FILE_NAMES[:4])
    else:
        path = rng.choice(DIR_NAMES if is_dir else FILE_NAMES)
    args: dict[str, Arg] = {"path": path}
    if kind in ("write", "append"):
        args["data"] = label.encode()
    elif kind == "rename":
        names: tuple[str, ...] = DIR_NAMES if is_dir else FILE_NAMES
        if client_kind == "fsspec":  # fsspec's mv(p, p) returns at once, even for a missing p
            names = tuple(name for name in names if name != path)
        args["dest"] = rng.choice(names)
    elif kind == "link":
        args["dest"] = rng.choice(FILE_NAMES)
    elif kind == "chmod":
        args["mode"] = rng.choice(MODES)
    elif kind == "chown":
        args["uid"], args["gid"] = rng.choice(OWNERS)
    elif kind == "truncate":
        args["size"] = rng.randrange(0, 8)
    elif kind in ("setxattr", "getxattr"):
        args["name"] = rng.choice(XATTR_NAMES)
        if kind == "setxattr":
            args["value"] = label.encode()
    return kind, args


def draw_calls(seed: int, client_kind: str, client_id: str, count: int,
               leave_out: frozenset[str] = frozenset()) -> list[Call]:
    rng = random.Random(f"{seed}/{client_id}")
    return [draw_call(rng, client_kind, f"{client_id}.{i}", leave_out) for i in range(count)]
