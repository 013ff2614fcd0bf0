"""A model-based file exerciser (in the spirit of fsx): random writes, reads, truncates up and
down, fsyncs and reopens of one file, checked byte for byte against an in-memory model.

A :class:`Target` is one way of reaching a file (the client library's handle, or a FUSE mount
through a buffered or an ``O_DIRECT`` descriptor, and ``mmap``); :func:`run` drives a
target with a seeded random sequence and raises :class:`Divergence` at the first difference,
naming the seed, the operation number and the recent history, so a failure can be replayed.
"""

from __future__ import annotations

import collections
import mmap
import os
import random
from typing import Any, Protocol

DIRECT_ALIGN = 4096  # O_DIRECT buffers are aligned to this


class Divergence(AssertionError):
    """The target's bytes (or size) differ from the model's."""


class Target(Protocol):
    """One open file. Every method acts at once on the target; ``read`` returns at most
    ``length`` bytes (short only at end of file)."""

    #: the other ways of writing and reading this target supports (e.g. "mmap")
    channels: tuple[str, ...]

    def write(self, offset: int, data: bytes, channel: str = "") -> None: ...
    def read(self, offset: int, length: int, channel: str = "") -> bytes: ...
    def truncate(self, size: int) -> None: ...
    def sync(self) -> None: ...
    def reopen(self) -> None: ...
    def size(self) -> int: ...
    def close(self) -> None: ...


class Exerciser:
    """Draws operations from ``rng`` for a file of at most ``size_max`` bytes whose blocks are
    ``block_size`` bytes (sizes near block boundaries are drawn often: that is where bugs live)."""

    def __init__(self, target: Target, rng: random.Random, block_size: int, size_max: int, label: str) -> None:
        self.target = target
        self.rng = rng
        self.block_size = block_size
        self.size_max = size_max
        self.label = label
        self.model = bytearray()
        self.history: collections.deque[str] = collections.deque(maxlen=25)
        self.done = 0

    # ------------------------------------------------------------------ choices

    def _position(self, upto: int) -> int:
        """An offset in [0, upto]: uniform, or at / next to a block boundary, or at the end."""
        rng, bs = self.rng, self.block_size
        roll = rng.random()
        if roll < 0.3 and upto >= bs:
            boundary = rng.randrange(upto // bs + 1) * bs
            return max(0, min(upto, boundary + rng.choice((-1, 0, 0, 1))))
        if roll < 0.4:
            return min(upto, len(self.model))
        return rng.randrange(upto + 1)

    def _length(self, limit: int) -> int:
        rng = self.rng
        roll = rng.random()
        if roll < 0.3:
            n = rng.randrange(1, 64)
        elif roll < 0.8:
            n = rng.randrange(1, 2 * self.block_size)
        else:
            n = rng.randrange(1, 4 * self.block_size)
        return max(1, min(n, limit))

    # ------------------------------------------------------------------ operations

    def op_write(self) -> None:
        if self._channel() == "mmap" and self.model:
            offset = self.rng.randrange(len(self.model))
            data = self.rng.randbytes(self._length(len(self.model) - offset))  # mmap cannot grow a file
            self._write(offset, data, "mmap")
        else:
            offset = self._position(self.size_max - 1)
            self._write(offset, self.rng.randbytes(self._length(self.size_max - offset)), "")

    def _write(self, offset: int, data: bytes, channel: str) -> None:
        self.history.append(f"write({offset}, {len(data)}{', ' + channel if channel else ''})")
        self.target.write(offset, data, channel)
        end = offset + len(data)
        if end > len(self.model):
            self.model.extend(bytes(end - len(self.model)))
        self.model[offset:end] = data

    def op_read(self) -> None:
        size = len(self.model)
        if self._channel() == "mmap" and size:
            channel, offset = "mmap", self.rng.randrange(size)
            length = self._length(size - offset)
        else:
            channel, offset = "", self._position(size + 100)
            length = self._length(4 * self.block_size)
        self.history.append(f"read({offset}, {length}{', ' + channel if channel else ''})")
        got = self.target.read(offset, length, channel)
        expected = bytes(self.model[offset : offset + length])
        if got != expected:
            self._diverged(f"read({offset}, {length}) differs {_first_difference(got, expected, offset)}")

    def op_truncate(self) -> None:
        rng, bs, size = self.rng, self.block_size, len(self.model)
        roll = rng.random()
        if roll < 0.15:
            new = 0
        elif roll < 0.45:
            new = rng.randrange(size + 1) if size else 0  # down
        elif roll < 0.65:
            new = min(self.size_max, rng.randrange(self.size_max // bs + 1) * bs)  # a block boundary
        else:
            new = rng.randrange(size, self.size_max + 1)  # up
        self.history.append(f"truncate({new})")
        self.target.truncate(new)
        if new < size:
            del self.model[new:]
        else:
            self.model.extend(bytes(new - size))

    def op_sync(self) -> None:
        self.history.append("fsync")
        self.target.sync()

    def op_reopen(self) -> None:
        self.history.append("close+open")
        self.target.reopen()
        self.check_size()

    def op_verify(self) -> None:
        """Everything at once: the size and every byte."""
        self.history.append("verify")
        self.check_size()
        got = self.target.read(0, len(self.model) + 1)
        if got != bytes(self.model):
            self._diverged(f"whole-file read differs {_first_difference(got, bytes(self.model), 0)}")

    def check_size(self) -> None:
        size = self.target.size()
        if size != len(self.model):
            self._diverged(f"size {size}, model {len(self.model)}")

    # ------------------------------------------------------------------ driving

    WEIGHTS = {"op_write": 30, "op_read": 25, "op_truncate": 16, "op_sync": 8, "op_reopen": 5, "op_verify": 3}

    def run(self, operations: int) -> None:
        names = list(self.WEIGHTS)
        weights = [self.WEIGHTS[n] for n in names]
        for _ in range(operations):
            getattr(self, self.rng.choices(names, weights)[0])()
            self.done += 1
        self.op_reopen()
        self.op_verify()

    def _channel(self) -> str:
        """The target's plain calls ("") or, now and then, one of its other channels."""
        if self.target.channels and self.rng.random() < 0.3:
            return self.rng.choice(self.target.channels)
        return ""

    def _diverged(self, what: str) -> None:
        raise Divergence(
            f"{self.label}: operation {self.done}: {what}\nlast operations: " + "; ".join(self.history)
        )


def _first_difference(got: bytes, expected: bytes, base: int) -> str:
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return f"first at offset {base + i}: got {got[i:i + 8].hex()}, expected {expected[i:i + 8].hex()}"
    return f"in length: got {len(got)} bytes, expected {len(expected)}"


# ---------------------------------------------------------------------- targets


class LibraryTarget:
    """The file through the client library's ``AsyncFile`` (one handle, reopened on demand)."""

    channels: tuple[str, ...] = ()

    def __init__(self, fs: Any, path: str) -> None:
        self.fs = fs
        self.path = path
        fs.write_bytes(path, b"")
        self.handle = fs.run(fs.aio.open(path, "r+b"))

    def write(self, offset: int, data: bytes, channel: str = "") -> None:
        assert self.fs.run(self.handle.write(offset, data)) == len(data)

    def read(self, offset: int, length: int, channel: str = "") -> bytes:
        return bytes(self.fs.run(self.handle.read(offset, length)))

    def truncate(self, size: int) -> None:
        self.fs.run(self.handle.truncate(size))

    def sync(self) -> None:
        self.fs.run(self.handle.flush())

    def reopen(self) -> None:
        self.fs.run(self.handle.close())
        self.handle = self.fs.run(self.fs.aio.open(self.path, "r+b"))

    def size(self) -> int:
        return int(self.handle.size)

    def close(self) -> None:
        self.fs.run(self.handle.close())


class PosixTarget:
    """The file through a mounted file system, on one descriptor (opened with ``O_DIRECT``
    when ``direct``: then every read and write bypasses the page cache) and ``mmap`` on that
    descriptor (a mapping of the current size, synced and unmapped after each use).

    One descriptor, as in the common case: the mount keeps one client handle per descriptor,
    and handles of one file see each other's writes at commit (close, fsync), not before."""

    channels: tuple[str, ...] = ("mmap",)

    def __init__(self, path: str, direct: bool) -> None:
        self.path = path
        self.flags = os.O_RDWR | (os.O_DIRECT if direct else 0)
        self.fd = os.open(path, self.flags | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, offset: int, data: bytes, channel: str = "") -> None:
        if channel == "mmap":
            with mmap.mmap(self.fd, 0) as mapped:
                mapped[offset : offset + len(data)] = data
                mapped.flush()
        else:
            with _aligned(len(data)) as buffer:  # O_DIRECT wants page-aligned memory
                buffer[: len(data)] = data
                assert os.pwritev(self.fd, [memoryview(buffer)[: len(data)]], offset) == len(data)

    def read(self, offset: int, length: int, channel: str = "") -> bytes:
        if channel == "mmap":
            with mmap.mmap(self.fd, 0, prot=mmap.PROT_READ) as mapped:
                return bytes(mapped[offset : offset + length])
        out = bytearray()
        with _aligned(length) as buffer:
            while len(out) < length:  # a read may come back short of the request before end of file
                n = os.preadv(self.fd, [memoryview(buffer)[: length - len(out)]], offset + len(out))
                if not n:
                    break
                out += buffer[:n]
        return bytes(out)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)

    def sync(self) -> None:
        os.fsync(self.fd)

    def reopen(self) -> None:
        os.close(self.fd)
        self.fd = os.open(self.path, self.flags)

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)


def _aligned(length: int) -> mmap.mmap:
    """A page-aligned anonymous buffer of at least ``length`` bytes (for O_DIRECT)."""
    return mmap.mmap(-1, max(DIRECT_ALIGN, -(-length // DIRECT_ALIGN) * DIRECT_ALIGN))


def run(target: Target, seed: int, operations: int, block_size: int, size_max: int, label: str) -> int:
    """Run ``operations`` random operations (plus a final reopen and full verify) on
    ``target`` from ``seed``; returns how many ran. Closes the target."""
    exerciser = Exerciser(target, random.Random(seed), block_size, size_max, f"{label} seed {seed}")
    try:
        exerciser.run(operations)
    finally:
        target.close()
    return exerciser.done
