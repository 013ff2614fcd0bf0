"""Copying files and trees between the local filesystem and tectofs, in any direction.

``put``, ``get`` and ``cp`` all come down to :func:`copy`: it first plans every directory to
make and file to copy (checking every source, so a typo fails before anything is written),
then copies them under one progress line for the whole transfer.

Nothing half-written is ever published: a tectofs file is written through a handle that
aborts on failure or Ctrl-C (readers keep the previous version; a new name is removed again),
and a local file is written under a temporary name in the same directory and renamed into
place once complete.

Paths on the command line: see :data:`CP_HELP`.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import sys
import time
from typing import Any, Iterator

from tectofs import limits

from .common import UsageError
from .output import human, shown
from .progress import Progress

PREFIX = "tectofs:"
CP_HELP = ("A path starting with 'tectofs:' is in tectofs: 'tectofs:/ckpt/a.bin' on the cluster of --meta /"
           " $TECTOFS_META / the config file, or 'tectofs://HOST:PORT/ckpt/a.bin' on that cluster. Any other path"
           " is local (write './tectofs:x' for a local file named so); a source '-' is standard input, a"
           " destination '-' standard output; an existing local FIFO or device is written into, never replaced.")


STDIN = STDOUT = "-"


def _regular_or_absent(path: str) -> bool:
    """Nothing at ``path`` (a dangling symlink included), a regular file or a directory: what
    a file may be renamed over. False for a FIFO, a device or a socket (symlinks followed)."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return True
    return stat.S_ISREG(mode) or stat.S_ISDIR(mode)


class Local:
    """The local filesystem; the source ``-`` is standard input."""

    label = ""

    def kind(self, path: str) -> str | None:
        """``"dir"``, ``"file"`` or ``"other"`` (symlinks followed), None if nothing is there."""
        if path == STDIN:
            return "file"
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        import stat

        return "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"

    def size(self, path: str) -> int:
        return 0 if path == STDIN else os.stat(path).st_size

    def children(self, path: str) -> Iterator[tuple[str, str, int]]:
        """``(name, kind, size)`` sorted by name; symlinks to directories are not followed (``"other"``)."""
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                yield e.name, "dir", 0
            elif e.is_file():
                yield e.name, "file", e.stat().st_size
            else:
                yield e.name, "other", 0

    join = staticmethod(os.path.join)

    def mkdir(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def reader(self, path: str) -> Any:
        return contextlib.nullcontext(sys.stdin.buffer) if path == STDIN else open(path, "rb")

    @contextlib.contextmanager
    def writer(self, path: str) -> Iterator[Any]:
        """A file that appears at ``path`` only once complete (written under a temporary name).
        ``-`` is standard output, and an existing FIFO, device or socket is written into, as
        ``cp`` does: renaming a file over it would destroy it (``/dev/null`` as root)."""
        if path == STDOUT:
            yield sys.stdout.buffer
            sys.stdout.buffer.flush()
            return
        if not _regular_or_absent(path):
            with _named_errors(path):
                f = open(path, "wb")  # a FIFO waits for its reader; a device ignores the truncation
            try:
                yield _Named(f, path)
            finally:
                with _named_errors(path):
                    f.close()
            return
        directory, name = os.path.split(os.path.abspath(path))
        temporary = os.path.join(directory, f".{name}.tectofs-{os.getpid()}.part")
        try:
            f = open(temporary, "wb")
        except OSError as exc:  # name the file the user asked for, not the temporary one
            raise type(exc)(exc.errno, exc.strerror, path) from None
        try:
            with f:
                yield f
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise

    def show(self, path: str) -> str:
        return path

    def canonical(self, path: str) -> str:
        return os.path.realpath(path)


@contextlib.contextmanager
def _named_errors(path: str) -> Iterator[None]:
    """An ``OSError`` in the block names ``path`` (``/dev/full: No space left on device``)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror, path) from None


class _Named:
    """A file whose write errors name ``path``."""

    def __init__(self, f: Any, path: str) -> None:
        self.f, self.path = f, path

    def write(self, data: Any) -> int:
        with _named_errors(self.path):
            return int(self.f.write(data))


class Remote:
    """One tectofs cluster, through a connected ``tectofs.client.FileSystem``."""

    def __init__(self, fs: Any, label: str) -> None:
        self.fs = fs
        self.label = label

    def kind(self, path: str) -> str | None:
        try:
            st = self.fs.stat(path)
        except FileNotFoundError:
            return None
        return st.kind if st.kind in ("dir", "file") else "other"

    def size(self, path: str) -> int:
        return int(self.fs.stat(path).size)

    def children(self, path: str) -> Iterator[tuple[str, str, int]]:
        for name, st in self.fs.iter_scandir(path):
            yield name, st.kind if st.kind in ("dir", "file") else "other", st.size

    join = staticmethod(posixpath.join)

    def mkdir(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def reader(self, path: str) -> Any:
        return self.fs.open(path, "rb")

    def writer(self, path: str) -> Any:
        return self.fs.open(path, "wb")  # aborts on an exception: nothing published

    def show(self, path: str) -> str:
        return f"{PREFIX}{self.label}{path}"

    def canonical(self, path: str) -> str:
        return posixpath.normpath(path)


Endpoint = Local | Remote


class Plan:
    """What :func:`copy` will do: directories to make (parents first) and files to copy."""

    def __init__(self) -> None:  # a plain class: dataclasses would cost 5 ms of every 'tectofs --help'
        self.dirs: list[str] = []
        self.files: list[tuple[str, str, int]] = []  # (source, target, size)
        self.skipped: list[str] = []

    @property
    def total(self) -> int:
        return sum(size for _, _, size in self.files)


def _basename(path: str) -> str:
    return os.path.basename(path.rstrip("/")) or path


def plan(src: Endpoint, sources: list[str], dst: Endpoint, target: str, recursive: bool) -> Plan:
    """Like ``cp [-r] SOURCES... TARGET``: into TARGET if it is a directory (it must be, for
    several sources or a trailing ``/``), else as TARGET. Raises ``FileNotFoundError``,
    ``IsADirectoryError`` (a directory without ``recursive``) or :class:`UsageError`."""
    to_stdout = isinstance(dst, Local) and target == STDOUT
    if to_stdout and len(sources) > 1:
        raise UsageError("standard output ('-') takes one file ('tectofs cat' writes several)")
    target_kind = dst.kind(target)
    into = target_kind == "dir"
    if not into and (len(sources) > 1 or target.endswith("/")):
        why = "no such directory" if target_kind is None else "a file is there"
        raise NotADirectoryError(f"{dst.show(target)} is not a directory ({why})")
    out = Plan()
    for source in sources:
        kind = src.kind(source)
        if kind is None:
            raise FileNotFoundError(f"{src.show(source)}: no such file or directory")
        if to_stdout and kind == "dir":
            raise UsageError(f"standard output ('-') takes a file, not the directory {src.show(source)}")
        if into and source == STDIN and isinstance(src, Local):
            raise UsageError(f"standard input ('-') has no name: give a file name, not the directory {dst.show(target)}")
        destination = dst.join(target, _basename(source)) if into else target
        if kind == "dir":
            if not recursive:
                raise IsADirectoryError(f"{src.show(source)} is a directory (use -r to copy it and what it holds)")
            if src is dst and (dst.canonical(destination) + "/").startswith(src.canonical(source).rstrip("/") + "/"):
                raise UsageError(f"cannot copy {src.show(source)} into itself ({dst.show(destination)})")
            if dst.kind(destination) not in (None, "dir"):
                raise NotADirectoryError(f"cannot replace the file {dst.show(destination)} by directory {src.show(source)}")
            _walk(src, source, dst, destination, out)
        elif kind == "file" or isinstance(src, Local):  # named local FIFOs and devices: read like cp does
            out.files.append((source, destination, src.size(source)))
        else:
            out.skipped.append(src.show(source))
    return out


def _walk(src: Endpoint, source: str, dst: Endpoint, destination: str, out: Plan) -> None:
    out.dirs.append(destination)
    for name, kind, size in src.children(source):
        if kind == "dir":
            _walk(src, src.join(source, name), dst, dst.join(destination, name), out)
        elif kind == "file":
            out.files.append((src.join(source, name), dst.join(destination, name), size))
        else:
            out.skipped.append(src.show(src.join(source, name)))


def copy(src: Endpoint, sources: list[str], dst: Endpoint, target: str, recursive: bool, quiet: bool) -> Plan:
    """Plan, then copy everything under one progress line (on a terminal, unless ``quiet``);
    print a summary on stdout unless ``quiet``. Returns the plan carried out."""
    todo = plan(src, sources, dst, target, recursive)
    for skipped in [] if quiet else todo.skipped:
        print(f"skipping {shown(skipped, sys.stderr)}: not a regular file or directory", file=sys.stderr)
    started = time.monotonic()
    buffer = memoryview(bytearray(8 * limits.MiB))
    with Progress(todo.total, enabled=not quiet) as bar:
        for directory in todo.dirs:
            dst.mkdir(directory)
        for source, destination, _ in todo.files:
            bar.describe(_basename(source))
            with src.reader(source) as reader, dst.writer(destination) as writer:
                while n := reader.readinto(buffer):
                    writer.write(buffer[:n])
                    bar.update(n)
    elapsed = max(time.monotonic() - started, 1e-9)
    if not quiet:
        what = (f"{src.show(todo.files[0][0])} -> {dst.show(todo.files[0][1])}" if len(todo.files) == 1 and not todo.dirs
                else f"{len(todo.files)} files, {len(todo.dirs)} directories -> {dst.show(target)}")
        out = sys.stderr if isinstance(dst, Local) and target == STDOUT else sys.stdout  # stdout has the data
        print(f"{shown(what, out)}: {human(bar.done)} in {elapsed:.2f}s ({human(bar.done / elapsed)}/s)", file=out)
    return todo


def parse(argument: str) -> tuple[str | None, str] | None:
    """``"tectofs:/a"`` -> ``(None, "/a")``; ``"tectofs://H:P/a"`` -> ``("H:P", "/a")``; a local path -> None."""
    if not argument.startswith(PREFIX):
        return None
    rest = argument[len(PREFIX):]
    if rest.startswith("//"):
        address, slash, path = rest[2:].partition("/")
        if not address:
            raise UsageError(f"{argument!r}: no cluster address after 'tectofs://' (use tectofs://HOST:PORT/path)")
        return address, "/" + path
    if not rest.startswith("/"):
        raise UsageError(f"{argument!r}: tectofs paths are absolute (tectofs:/path)")
    return None, rest


class Clusters:
    """The clients a command opened, one per cluster address; ``close()`` closes them all."""

    def __init__(self, args: Any) -> None:
        self.args = args
        self.open: dict[str, Remote] = {}

    def remote(self, address: str | None) -> Remote:
        from .common import _client, _meta_address

        resolved = address or _meta_address(self.args)
        if resolved not in self.open:
            self.open[resolved] = Remote(_client(self.args, resolved), f"//{address}" if address else "")
        return self.open[resolved]

    def __enter__(self) -> "Clusters":
        return self

    def __exit__(self, *exc: Any) -> None:
        for remote in self.open.values():
            remote.fs.close()
