"""The mount against a local directory: a Hypothesis state machine that does each step under
both and requires the same result (value, or errno name).

Run in-process by ``tests/test_fuse.py`` (as root) and, as an ordinary user, by
``tests/test_fuse_multiuser.py`` through ``setpriv``::

    python -m tests.mount_model MOUNT_DIR LOCAL_DIR [--examples N] [--steps N] [--as-user UID]

Both directories must exist and belong to the user the steps run as. ``--as-user UID`` (run
by root, with no supplementary groups then): each step runs with that filesystem uid and gid
(``setfsuid``: what the kernel checks permissions with and sends to the FUSE daemon; root's
filesystem capabilities go with it), while the interpreter stays root's and can load itself.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import hashlib
import os
import random
import stat
import sys
import uuid
from typing import Any, Callable, Iterator

MiB = 1 << 20
XATTR_NAMES = ["user.a", "user.b"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _open(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never waits on a FIFO (no reader or writer on the other end)."""
    return os.open(path, flags | os.O_NONBLOCK, mode)


@contextlib.contextmanager
def _filesystem_user(uid: int | None) -> Iterator[None]:
    """Filesystem steps inside run as ``uid`` (gid ``uid``); None: as the process is."""
    if uid is None:
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.setfsgid(uid)
    libc.setfsuid(uid)
    try:
        yield
    finally:
        libc.setfsuid(0)
        libc.setfsgid(0)


def run(mount_base: str, local_base: str, examples: int = 30, steps: int = 20, as_user: int | None = None) -> None:
    """Run the state machine; each example works in fresh subdirectories of the two bases
    (as ``as_user``'s filesystem identity if given: see ``--as-user``)."""
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, initialize, rule, run_state_machine_as_test

    paths = st.sampled_from(["a", "b", "c", "a/a", "a/b", "a/a/b"])
    offsets = st.integers(0, 3 * MiB)
    lengths = st.integers(0, 200_000)
    seeds = st.integers(0, 2**32 - 1)
    modes = st.sampled_from([0o644, 0o600, 0o755, 0o000, 0o4755, 0o2711, 0o1777])
    uid, gid = (os.getuid(), os.getgid()) if as_user is None else (as_user, as_user)
    owners = st.sampled_from([(-1, gid), (uid, -1), (0, 0), (65534, 65534), (-1, 65534)])

    class MountVsLocal(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            name = uuid.uuid4().hex[:8]
            self.mount_root = os.path.join(mount_base, name)
            self.local_root = os.path.join(local_base, name)
            with _filesystem_user(as_user):
                os.mkdir(self.mount_root)
                os.mkdir(self.local_root)
            self.kept: dict[str, int] = {}  # root -> a descriptor held open across steps

        @initialize(seed=seeds)
        def populate(self, seed: int) -> None:
            """Start from a directory and two files, so that most steps find something."""
            data = random.Random(seed).randbytes(MiB + 54321)

            def action(root: str) -> None:
                os.mkdir(os.path.join(root, "a"))
                for path, content in (("b", data), ("a/a", data[:1000])):
                    with open(os.path.join(root, path), "wb") as f:
                        f.write(content)

            self.both(action)

        def both(self, action: Callable[[str], Any]) -> Any:
            results = []
            for root in (self.local_root, self.mount_root):
                try:
                    with _filesystem_user(as_user):
                        results.append(("ok", action(root)))
                except OSError as exc:
                    results.append(("error", errno.errorcode.get(exc.errno or 0, exc.errno)))
            assert results[1] == results[0], f"mount gave {results[1]!r}, local disk {results[0]!r}"
            return results[0]

        # -------------------------------------------------------------- data

        @rule(path=paths)
        def create(self, path: str) -> None:
            self.both(lambda root: os.close(_open(os.path.join(root, path), os.O_CREAT | os.O_EXCL | os.O_WRONLY)))

        @rule(path=paths, offset=offsets, length=lengths, seed=seeds)
        def write(self, path: str, offset: int, length: int, seed: int) -> None:
            data = random.Random(seed).randbytes(length)

            def action(root: str) -> int:
                fd = _open(os.path.join(root, path), os.O_WRONLY | os.O_CREAT)
                try:
                    return os.pwrite(fd, data, offset)
                finally:
                    os.close(fd)

            self.both(action)

        @rule(path=paths, length=lengths, seed=seeds)
        def append(self, path: str, length: int, seed: int) -> None:
            data = random.Random(seed).randbytes(length)

            def action(root: str) -> int:
                fd = _open(os.path.join(root, path), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
                try:
                    os.write(fd, data)
                    return os.lseek(fd, 0, os.SEEK_CUR)
                finally:
                    os.close(fd)

            self.both(action)

        @rule(path=paths, size=offsets)
        def truncate(self, path: str, size: int) -> None:
            self.both(lambda root: os.truncate(os.path.join(root, path), size))

        @rule(path=paths)
        def read(self, path: str) -> None:
            def action(root: str) -> str:
                fd = _open(os.path.join(root, path), os.O_RDONLY)
                try:
                    chunks = []
                    while chunk := os.read(fd, MiB):
                        chunks.append(chunk)
                    return _sha(b"".join(chunks))
                finally:
                    os.close(fd)

            self.both(action)

        # -------------------------------------------------------------- names

        @rule(source=paths, destination=paths)
        def rename(self, source: str, destination: str) -> None:
            self.both(lambda root: os.rename(os.path.join(root, source), os.path.join(root, destination)))

        @rule(source=paths, destination=paths)
        def link(self, source: str, destination: str) -> None:
            self.both(lambda root: os.link(os.path.join(root, source), os.path.join(root, destination)))

        @rule(path=paths)
        def unlink(self, path: str) -> None:
            self.both(lambda root: os.unlink(os.path.join(root, path)))

        @rule(path=paths)
        def mkdir(self, path: str) -> None:
            self.both(lambda root: os.mkdir(os.path.join(root, path)))

        @rule(path=paths)
        def rmdir(self, path: str) -> None:
            self.both(lambda root: os.rmdir(os.path.join(root, path)))

        @rule(path=paths)
        def mkfifo(self, path: str) -> None:
            self.both(lambda root: os.mkfifo(os.path.join(root, path), 0o640))

        @rule(path=st.sampled_from(["", "a", "a/a", "b"]))
        def listdir(self, path: str) -> None:
            self.both(lambda root: sorted(os.listdir(os.path.join(root, path))))

        # -------------------------------------------------------------- attributes

        @rule(path=paths, mode=modes)
        def chmod(self, path: str, mode: int) -> None:
            self.both(lambda root: os.chmod(os.path.join(root, path), mode))

        @rule(path=paths, owner=owners)
        def chown(self, path: str, owner: tuple[int, int]) -> None:
            self.both(lambda root: os.chown(os.path.join(root, path), *owner))

        @rule(path=paths, name=st.sampled_from(XATTR_NAMES), value=st.binary(max_size=64),
              flags=st.sampled_from([0, os.XATTR_CREATE, os.XATTR_REPLACE]))
        def setxattr(self, path: str, name: str, value: bytes, flags: int) -> None:
            self.both(lambda root: os.setxattr(os.path.join(root, path), name, value, flags))

        @rule(path=paths, name=st.sampled_from(XATTR_NAMES))
        def getxattr(self, path: str, name: str) -> None:
            self.both(lambda root: os.getxattr(os.path.join(root, path), name))

        @rule(path=paths, name=st.sampled_from(XATTR_NAMES))
        def removexattr(self, path: str, name: str) -> None:
            self.both(lambda root: os.removexattr(os.path.join(root, path), name))

        @rule(path=paths)
        def stat(self, path: str) -> None:
            def action(root: str) -> tuple[int, ...]:
                st_ = os.lstat(os.path.join(root, path))
                user_xattrs = sorted(n for n in os.listxattr(os.path.join(root, path)) if n.startswith("user."))
                return (stat.S_IFMT(st_.st_mode), stat.S_IMODE(st_.st_mode), st_.st_nlink,
                        st_.st_size if stat.S_ISREG(st_.st_mode) else 0, st_.st_uid, st_.st_gid, len(user_xattrs))

            self.both(action)

        # -------------------------------------------------------------- a file held open

        @rule(path=paths)
        def keep_open(self, path: str) -> None:
            """Hold a descriptor across the next steps (writes, renames, unlinks, replaces)."""
            self.close_kept()
            opened: dict[str, int] = {}

            def action(root: str) -> None:
                opened[root] = _open(os.path.join(root, path), os.O_RDWR)

            try:
                self.both(action)
            finally:
                if len(opened) == 2:
                    self.kept = opened
                else:
                    for fd in opened.values():
                        os.close(fd)

        @rule(offset=st.integers(0, 2 * MiB), length=st.integers(0, 100_000), seed=seeds)
        def write_kept(self, offset: int, length: int, seed: int) -> None:
            if not self.kept:
                return
            data = random.Random(seed).randbytes(length)
            self.both(lambda root: os.pwrite(self.kept[root], data, offset))

        @rule()
        def read_kept(self) -> None:
            if not self.kept:
                return

            def action(root: str) -> tuple[str, int]:
                fd = self.kept[root]
                size = os.lseek(fd, 0, os.SEEK_END)
                return _sha(os.pread(fd, size, 0)), size

            self.both(action)

        @rule()
        def close_kept(self) -> None:
            if not self.kept:
                return
            self.both(lambda root: os.close(self.kept[root]))
            self.kept.clear()

        def teardown(self) -> None:
            for fd in self.kept.values():
                os.close(fd)
            for root in (self.local_root, self.mount_root):
                with _filesystem_user(as_user):
                    _remove_tree(root)

    run_state_machine_as_test(
        MountVsLocal,
        settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
                          suppress_health_check=list(HealthCheck)),
    )


def _remove_tree(root: str) -> None:
    """Remove what a run left, whatever modes it set (best effort, as the user who made it)."""
    for directory, dirs, _ in os.walk(root, topdown=True):
        for name in dirs:
            try:
                os.chmod(os.path.join(directory, name), 0o755)
            except OSError:
                pass
    for directory, dirs, files in os.walk(root, topdown=False):
        for name in files:
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass
        for name in dirs:
            try:
                os.rmdir(os.path.join(directory, name))
            except OSError:
                pass
    try:
        os.rmdir(root)
    except OSError:
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mount_dir")
    parser.add_argument("local_dir")
    parser.add_argument("--examples", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--as-user", type=int, default=None,
                        help="do every filesystem step as this uid and gid (run by root)")
    args = parser.parse_args(argv)
    if args.as_user is not None:
        os.setgroups([])
    run(args.mount_dir, args.local_dir, args.examples, args.steps, args.as_user)
    print(f"mount_model: {args.examples} examples of {args.steps} steps agreed", file=sys.stderr)


if __name__ == "__main__":
    main()
