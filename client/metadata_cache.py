"""Names, attributes and extended attributes a client read while it held leases, answered again
without a call until a recall (``server/meta/leases.py``, ``client/lease_session.py``).

Keyed as the service leases them: a directory's names (``(directory ino, name)`` -> the inode,
or absent), an inode's attributes and extended attributes. A path is resolved from ``/`` one
name at a time; any name not cached is a miss, answered by the service (whose lookups say the
directories they walked, so what they teach is keyed exactly). A recall drops what it names;
the loss of the session drops everything. An answer is kept only if no recall arrived while it
was on its way (``LeaseSession.still``). Bounded: ``limits.metadata_cache_entries_max`` names
and as many inodes, least recently used first out.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, Protocol, TypeVar, Union

from tectofs import limits, paths
from tectofs.wire.leases import Recall
from tectofs.wire.values import Message



class Attributes(Protocol):
    """What the cache needs of the attributes it keeps (``tectofs.client.Stat``)."""

    @property
    def ino(self) -> int: ...

    @property
    def kind(self) -> str: ...


StatT = TypeVar("StatT", bound=Attributes)
ROOT_INO = 1
ABSENT = None  # a name cached as absent


class Miss:
    """Not cached: ask the service."""


MISS = Miss()
AnswerT = TypeVar("AnswerT")


class MetadataCache(Generic[StatT]):
    def __init__(self, entries_max: int = limits.metadata_cache_entries_max) -> None:
        self.entries_max = entries_max
        self._names: OrderedDict[tuple[int, str], int | None] = OrderedDict()
        self._attrs: OrderedDict[int, StatT] = OrderedDict()
        self._xattrs: dict[int, dict[str, bytes | None]] = {}
        self._xattr_names: dict[int, list[str]] = {}
        self.hits = 0
        self.misses = 0

    # ------------------------------------------------------------------ answers

    def lookup(self, path: str) -> Union[StatT, None, Miss]:
        """``path``'s attributes, ``ABSENT`` if a name on the way is absent, or ``MISS``."""
        ino = self._resolve(paths.split(path))
        if isinstance(ino, Miss) or ino is None:
            return self._count(ino)
        return self._count(self._attrs.get(ino, MISS))

    def xattr(self, path: str, name: str) -> "bytes | None | Miss":
        """Extended attribute ``name`` of ``path``: its value, None (absent) or ``MISS``."""
        ino = self._resolve(paths.split(path))
        values = self._xattrs.get(ino) if isinstance(ino, int) else None
        return self._count(values.get(name, MISS) if values is not None else MISS)

    def xattr_names(self, path: str) -> "list[str] | Miss":
        ino = self._resolve(paths.split(path))
        names = self._xattr_names.get(ino) if isinstance(ino, int) else None
        return self._count(list(names) if names is not None else MISS)

    def _count(self, answer: AnswerT) -> AnswerT:
        if isinstance(answer, Miss):
            self.misses += 1
        else:
            self.hits += 1
        return answer

    def _resolve(self, parts: list[str]) -> "int | None | Miss":
        ino: int | None = ROOT_INO
        for name in parts:
            if ino is None:
                return ABSENT
            parent = self._attrs.get(ino)
            if parent is not None and parent.kind != "dir":
                return MISS  # the service says which error
            key = (ino, name)
            if key not in self._names:
                return MISS
            self._names.move_to_end(key)
            ino = self._names[key]
        return ino

    # ------------------------------------------------------------------ what the service said

    def learned(self, path: str, walk: list[int], stat: StatT) -> None:
        """A lookup of ``path`` through the directories ``walk`` (/ first) found ``stat``."""
        parts = paths.split(path)
        if len(walk) != len(parts):
            return
        for i, name in enumerate(parts):
            self._name(walk[i], name, walk[i + 1] if i + 1 < len(parts) else stat.ino)
        self.attributes(stat)

    def learned_absent(self, path: str) -> None:
        """A lookup of ``path`` found no such name: kept if its directory resolves here."""
        parts = paths.split(path)
        if not parts:
            return
        parent = self._resolve(parts[:-1])
        if isinstance(parent, int):
            self._name(parent, parts[-1], ABSENT)

    def attributes(self, stat: StatT) -> None:
        self._attrs[stat.ino] = stat
        self._attrs.move_to_end(stat.ino)
        while len(self._attrs) > self.entries_max:
            ino, _ = self._attrs.popitem(last=False)
            self._xattrs.pop(ino, None)
            self._xattr_names.pop(ino, None)

    def learned_xattr(self, path: str, name: str, value: bytes | None) -> None:
        ino = self._resolve(paths.split(path))
        if isinstance(ino, int) and ino in self._attrs:
            self._xattrs.setdefault(ino, {})[name] = value

    def learned_xattr_names(self, path: str, names: list[str]) -> None:
        ino = self._resolve(paths.split(path))
        if isinstance(ino, int) and ino in self._attrs:
            self._xattr_names[ino] = list(names)

    def _name(self, parent: int, name: str, ino: int | None) -> None:
        self._names[(parent, name)] = ino
        self._names.move_to_end((parent, name))
        while len(self._names) > self.entries_max:
            self._names.popitem(last=False)

    # ------------------------------------------------------------------ forgetting

    def forget(self, recall: Recall | None) -> None:
        """Drop what ``recall`` names (None: everything)."""
        if recall is None:
            self.clear()
            return
        for ino in recall.inos:
            self.forget_inode(ino)
        for entry in recall.entries:
            self._names.pop((entry.parent, entry.name), None)

    def forget_path(self, path: str) -> None:
        """This client changed ``path``: drop its name and what it named (the service does not
        recall a client's own changes; the kernel, a mount's other cache, knows them already)."""
        parts = paths.split(path)
        if not parts:
            self._attrs.pop(ROOT_INO, None)
            return
        parent = self._resolve(parts[:-1])
        if isinstance(parent, int):
            ino = self._names.pop((parent, parts[-1]), None)
            self._attrs.pop(parent, None)  # its mtime and ctime moved
            if ino is not None:
                self.forget_inode(ino)

    def forget_inode(self, ino: int) -> None:
        self._attrs.pop(ino, None)
        self._xattrs.pop(ino, None)
        self._xattr_names.pop(ino, None)

    def clear(self) -> None:
        self._names.clear()
        self._attrs.clear()
        self._xattrs.clear()
        self._xattr_names.clear()


def changed_paths(request: Message) -> list[str]:
    """The paths a changing request names (``client/metadata.py``'s ``CHANGING``)."""
    found = [getattr(request, field) for field in ("path", "src", "dst", "a", "b") if getattr(request, field, None)]
    directory = getattr(request, "directory", None)
    if isinstance(directory, str):
        found.extend(paths.join(directory, name) for name in getattr(request, "names", ()))
    return found
