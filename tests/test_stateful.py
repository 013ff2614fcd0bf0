"""Model-based test: random operations on the real cluster and on a dict model side by side."""

from __future__ import annotations

import posixpath
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tectofs import errors
from tectofs.client import FileSystem

MiB = 1 << 20
NAMES = st.sampled_from(["a", "b", "c", "d"])
DATA = st.one_of(st.binary(max_size=300), st.integers(0, 3 * MiB).map(lambda n: bytes([n % 251]) * n))


def _error_kind(exc: BaseException) -> str:
    for kind in (FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, errors.DirectoryNotEmpty,
                 errors.InvalidArgument):
        if isinstance(exc, kind):
            return kind.__name__
    raise exc


class NamespaceModel(RuleBasedStateMachine):
    fs: ClassVar[FileSystem]  # set by the test below
    counter = 0

    @initialize()
    def setup(self) -> None:
        NamespaceModel.counter += 1
        self.root = f"/model-{NamespaceModel.counter}"
        self.fs.mkdir(self.root)
        self.files: dict[str, bytes] = {}
        self.dirs: set[str] = {self.root}

    def _path(self, *names: str) -> str:
        return posixpath.join(self.root, *names)

    def _expect(self, fn, expected_error: str | None):
        try:
            result = fn()
        except Exception as exc:  # noqa: BLE001 - compared with the model
            assert _error_kind(exc) == expected_error, f"got {exc!r}, model expected {expected_error}"
            return None
        assert expected_error is None, f"succeeded, model expected {expected_error}"
        return result

    def _parent_error(self, path: str) -> str | None:
        parent = posixpath.dirname(path)
        if parent in self.files:
            return "NotADirectoryError"
        if parent not in self.dirs:
            return "FileNotFoundError"
        return None

    @rule(d=NAMES, name=NAMES, data=DATA)
    def write(self, d, name, data):
        path = self._path(d, name) if d != name else self._path(name)
        error = self._parent_error(path) or ("IsADirectoryError" if path in self.dirs else None)
        self._expect(lambda: self.fs.write_bytes(path, data), error)
        if error is None:
            self.files[path] = data

    @rule(d=NAMES)
    def mkdir(self, d):
        path = self._path(d)
        error = "FileExistsError" if path in self.dirs or path in self.files else None
        self._expect(lambda: self.fs.mkdir(path), error)
        if error is None:
            self.dirs.add(path)

    @precondition(lambda self: self.files)
    @rule(data=st.data())
    def read(self, data):
        path = data.draw(st.sampled_from(sorted(self.files)))
        assert self.fs.read_bytes(path) == self.files[path]

    @precondition(lambda self: self.files)
    @rule(data=st.data(), offset=st.integers(0, 2 * MiB), chunk=st.binary(min_size=1, max_size=2000))
    def overwrite(self, data, offset, chunk):
        path = data.draw(st.sampled_from(sorted(self.files)))
        with self.fs.open(path, "r+b") as f:
            f.seek(offset)
            f.write(chunk)
        old = self.files[path]
        padded = old + bytes(max(0, offset - len(old)))
        self.files[path] = padded[:offset] + chunk + padded[offset + len(chunk):]

    @precondition(lambda self: self.files)
    @rule(data=st.data(), tail=st.binary(max_size=5000))
    def append(self, data, tail):
        path = data.draw(st.sampled_from(sorted(self.files)))
        with self.fs.open(path, "ab") as f:
            f.write(tail)
        self.files[path] += tail

    @precondition(lambda self: self.files)
    @rule(data=st.data(), size=st.integers(0, 3 * MiB))
    def truncate(self, data, size):
        path = data.draw(st.sampled_from(sorted(self.files)))
        self.fs.truncate(path, size)
        old = self.files[path]
        self.files[path] = old[:size] + bytes(max(0, size - len(old)))

    @rule(src=NAMES, dst=NAMES)
    def rename(self, src, dst):
        s, t = self._path(src), self._path(dst)
        if s not in self.files and s not in self.dirs:
            error = "FileNotFoundError"
        elif s == t:
            error = None
        elif s in self.dirs and t in self.files:
            error = "NotADirectoryError"
        elif s in self.files and t in self.dirs:
            error = "IsADirectoryError"
        elif t in self.dirs and any(p.startswith(t + "/") for p in list(self.files) + list(self.dirs)):
            error = "DirectoryNotEmpty"
        else:
            error = None
        self._expect(lambda: self.fs.rename(s, t), error)
        if error is None and s != t:
            moved_files = {p: v for p, v in self.files.items() if p == s or p.startswith(s + "/")}
            moved_dirs = {p for p in self.dirs if p == s or p.startswith(s + "/")}
            self.files.pop(t, None)
            self.dirs.discard(t)
            for p, v in moved_files.items():
                del self.files[p]
                self.files[t + p[len(s):]] = v
            for p in moved_dirs:
                self.dirs.discard(p)
                self.dirs.add(t + p[len(s):])

    @rule(d=NAMES, name=NAMES)
    def remove(self, d, name):
        path = self._path(d, name) if d != name else self._path(name)
        if path in self.files:
            error = None
        elif path in self.dirs:
            error = "IsADirectoryError"
        else:
            error = self._parent_error(path) or "FileNotFoundError"
        self._expect(lambda: self.fs.remove(path), error)
        self.files.pop(path, None) if error is None else None

    @rule(d=NAMES)
    def rmdir(self, d):
        path = self._path(d)
        if path in self.files:
            error = "NotADirectoryError"
        elif path not in self.dirs:
            error = "FileNotFoundError"
        elif any(p.startswith(path + "/") for p in list(self.files) + list(self.dirs)):
            error = "DirectoryNotEmpty"
        else:
            error = None
        self._expect(lambda: self.fs.rmdir(path), error)
        if error is None:
            self.dirs.discard(path)

    @invariant()
    def listings_match(self):
        if not hasattr(self, "root"):
            return
        for directory in self.dirs:
            expected = sorted(
                posixpath.basename(p) for p in list(self.files) + list(self.dirs) if posixpath.dirname(p) == directory
            )
            assert self.fs.listdir(directory) == expected
        for path, data in self.files.items():
            assert self.fs.stat(path).size == len(data)


@pytest.mark.slow
def test_client_matches_model(cluster):
    NamespaceModel.fs = cluster.fs
    test = NamespaceModel.TestCase
    test.settings = settings(max_examples=30, stateful_step_count=25, deadline=None,
                             suppress_health_check=list(HealthCheck))
    test().runTest()
