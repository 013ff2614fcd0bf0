"""Names, attributes and extended attributes a client read while it held leases, answered again
without a call until a recall (``server/meta/leases.py``, ``client/lease_session.py``).

Keyed as the service leases them: a directory's names (``(directory ino, name)`` -> the inode,
or absent), an inode's attributes and extended attributes. A path is resolved from ``/`` one
name at a time; any name not cached is a miss, answered by the service (whose lookups say the
directories they walked, so what they teach is keyed exactly). A recall drops what it names;
the loss of the session drops everything. An answer is kept only if no recall arrived while it
was on its way (``LeaseSession.still``). Bounded: ``limits.metadata_cache_entries_max`` names
and as many inodes, least recently used first out.

Layouts read under a lease are kept too: a small file's whole (its bytes inline: an open needs
no call), and a larger file's whole-file layout with the *reader's lease* of the last handle
that closed on it (``park_reader``): the next read-only open takes that lease (``take_layout``)
instead of asking for a new one, while it has half its life left. Whatever drops such a
layout (a recall, this client's own change, eviction, the session's loss) hands its lease to
``end_reader``, which ends it at the service: a file unlinked elsewhere is not kept alive.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Generic, Literal, NamedTuple, Protocol, TypeVar, Union

from tectofs import limits, paths
from tectofs.wire.leases import Recall
from tectofs.wire.values import Attrs, LayoutSegment, Message


class Attributes(Protocol):
    """What the cache needs of the attributes it keeps (``tectofs.client.Stat``)."""

    @property
    def ino(self) -> int: ...

    @property
    def kind(self) -> str: ...

    @property
    def nlink(self) -> int: ...

    @property
    def xattrs(self) -> int | None: ...  # how many extended attributes (None: not said)


StatT = TypeVar("StatT", bound=Attributes)
ROOT_INO = 1
ABSENT = None  # a name cached as absent


class Miss:
    """Not cached: ask the service."""


MISS = Miss()
AnswerT = TypeVar("AnswerT")


class CachedLayout(NamedTuple):
    """A layout an open may use without a call: a small file's (``reader`` 0: its bytes are
    inline, no lease needed) or a larger file's with a reader's lease (``reader``) the opener
    now holds, granted or last renewed when the event loop's clock read ``since``."""

    layout: LayoutSegment
    reader: int = 0
    since: float = 0.0


@dataclass(slots=True)
class _KeptLayout:
    uid: int | None  # who read it (its file handle is theirs)
    layout: LayoutSegment
    reader: int = 0  # a parked reader's lease on the file (0: none)
    since: float = 0.0  # when that lease was granted or last renewed (the event loop's clock)


EndReader = Callable[[int, int, bytes, "int | None"], None]  # (ino, reader, file handle, uid it was issued to)


class MetadataCache(Generic[StatT]):
    def __init__(self, entries_max: int = limits.metadata_cache_entries_max,
                 make: "Callable[[Attrs], StatT] | None" = None, end_reader: "EndReader | None" = None,
                 reader_lease_s: float = limits.reader_lease_s) -> None:
        """``make``: the cached form of a reply's attributes (for what this client's own
        changes answered: ``changed_by_self``). ``end_reader``: ends a parked reader's lease
        whose layout is dropped (None: no lease is parked). ``reader_lease_s``: how long the
        service keeps a reader's lease that is not renewed."""
        self.entries_max = entries_max
        self.make = make
        self.end_reader = end_reader
        self.reader_lease_s = reader_lease_s
        # Directories whose every name is here (made by this client, or listed whole, under a
        # lease on their listing): a name not here is absent (CephFS's I_COMPLETE).
        self._complete: set[int] = set()
        # Whole listings read under a lease on them (or known: a directory this client made),
        # kept in step with this client's own changes while no recall crossed them: directory
        # inode -> [(name, attributes)], sorted by name; and where each listed inode is listed.
        self._listings: dict[int, list[tuple[str, StatT]]] = {}
        self._listed_in: dict[int, tuple[int, str]] = {}  # inode -> (directory, name)
        self._names: OrderedDict[tuple[int, str], int | None] = OrderedDict()
        self._attrs: OrderedDict[int, StatT] = OrderedDict()
        self._xattrs: dict[int, dict[str, bytes | None]] = {}
        self._xattr_names: dict[int, list[str]] = {}
        self._linked: set[int] = set()  # cached inodes with more than one name (not directories)
        # Whole-file layouts read under a lease on their attributes, with the uid that read them
        # (a file handle in them is that user's) and, for a file not inline, the reader's lease
        # parked by the last handle that closed on it.
        self._layouts: OrderedDict[int, _KeptLayout] = OrderedDict()
        self._layout_bytes = 0
        self.layout_bytes_max = limits.metadata_cache_data_bytes_max
        self.chunk_layouts_max = limits.metadata_cache_chunk_layouts_max
        self._chunk_layouts = 0
        self.hits = 0
        self.misses = 0
        self.leases_reused = 0  # opens that took a parked reader's lease

    # ------------------------------------------------------------------ answers

    def lookup(self, path: str) -> Union[StatT, None, Miss]:
        """``path``'s attributes, ``ABSENT`` if a name on the way is absent, or ``MISS``."""
        ino = self._resolve(paths.split(path))
        if isinstance(ino, Miss) or ino is None:
            return self._count(ino)
        return self._count(self._attrs.get(ino, MISS))

    def listing(self, path: str) -> "list[tuple[str, StatT]] | Miss":
        """``path``'s whole listing, or ``MISS``."""
        ino = self._resolve(paths.split(path))
        listed = self._listings.get(ino) if isinstance(ino, int) else None
        return self._count(list(listed) if listed is not None else MISS)

    def learned_listing(self, path: str, entries: "list[tuple[str, StatT]]") -> None:
        """``path``'s whole listing was ``entries`` (read under a lease on it)."""
        directory = self._resolve(paths.split(path))
        if not isinstance(directory, int) or len(entries) > self.entries_max // 2:
            return
        if any(not stat.nlink for _, stat in entries):  # names only (read, not search, permission): no lookups
            return
        self._drop_listing(directory)
        self._listings[directory] = sorted(entries, key=_name_of)  # (Python's order: see _relist)
        for name, stat in entries:
            self._name(directory, name, stat.ino)
            self.attributes(stat)
            self._listed_in[stat.ino] = (directory, name)
        self._complete.add(directory)

    def _drop_listing(self, directory: int) -> None:
        for name, stat in self._listings.pop(directory, ()):
            if self._listed_in.get(stat.ino) == (directory, name):
                del self._listed_in[stat.ino]

    def _relist(self, directory: int, name: str, stat: "StatT | None") -> None:
        """This client's own change, with no recall across it: ``name`` in ``directory``'s
        cached listing (if one is) now has the attributes ``stat`` (None: is gone)."""
        listed = self._listings.get(directory)
        if listed is None:
            return
        at = bisect.bisect_left(listed, name, key=_name_of)
        if at < len(listed) and listed[at][0] == name:
            _, old = listed.pop(at)
            if self._listed_in.get(old.ino) == (directory, name):
                del self._listed_in[old.ino]
        if stat is not None:
            listed.insert(at, (name, stat))
            self._listed_in[stat.ino] = (directory, name)

    def _own_attributes(self, stat: StatT) -> None:
        """This client's own change, with no recall across it, left an inode with ``stat``:
        its attributes and its entry in the listing that lists it are ``stat``; what else was
        kept of it (extended attributes, a small file's layout) goes."""
        where = self._listed_in.get(stat.ino)
        self.forget_inode(stat.ino, listing=False)
        self.attributes(stat)
        if where is not None:
            self._relist(where[0], where[1], stat)

    def _directory_changed(self, directory: int, after: "StatT | None") -> None:
        """An own change moved ``directory``'s mtime and ctime: to ``after`` (its attributes in
        the reply, no recall across it), else they are forgotten, and so is the listing that
        shows the old ones."""
        if after is not None and after.ino == directory:
            self._own_attributes(after)
            return
        self._attrs.pop(directory, None)
        where = self._listed_in.get(directory)
        if where is not None:
            self._drop_listing(where[0])

    def xattr(self, path: str, name: str) -> "bytes | None | Miss":
        """Extended attribute ``name`` of ``path``: its value, None (absent) or ``MISS``."""
        ino = self._resolve(paths.split(path))
        if not isinstance(ino, int):
            return self._count(MISS)
        values = self._xattrs.get(ino)
        if values is not None and name in values:
            return self._count(values[name])
        if name.startswith("security.") and self._has_none(ino):
            return self._count(None)  # (user.* and trusted.* the service answers: their permissions differ)
        return self._count(MISS)

    def xattr_names(self, path: str) -> "list[str] | Miss":
        ino = self._resolve(paths.split(path))
        if not isinstance(ino, int):
            return self._count(MISS)
        names = self._xattr_names.get(ino)
        if names is None and self._has_none(ino):
            names = []
        return self._count(list(names) if names is not None else MISS)

    def layout(self, path: str, uid: int | None) -> "LayoutSegment | Miss":
        """The whole layout of the small file at ``path`` (its bytes inline), as ``uid`` read it
        under the lease that still holds its attributes, or ``MISS``."""
        kept = self._kept(path, uid)
        return self._count(kept.layout if kept is not None and _whole_inline(kept.layout) else MISS)

    def take_layout(self, path: str, uid: int | None, now: float) -> "CachedLayout | Miss":
        """What a read-only open of ``path`` by ``uid`` may use without a call (``now``: the
        event loop's clock, which ``since`` was read on): a small file's inline layout, or a
        larger file's layout with its parked reader's lease, taken (the caller holds it now,
        renews it, and parks or ends it at its close), if it has at least half its life left;
        else ``MISS`` (a lease past that is left to lapse at the service)."""
        kept = self._kept(path, uid)
        if kept is None:
            return self._count(MISS)
        if _whole_inline(kept.layout):
            return self._count(CachedLayout(kept.layout))
        if not kept.reader:
            return self._count(MISS)
        reader, since, kept.reader = kept.reader, kept.since, 0
        if now - since > self.reader_lease_s / 2:  # lapses soon at the service: let it
            return self._count(MISS)
        self.leases_reused += 1
        return self._count(CachedLayout(kept.layout, reader, since))

    def _kept(self, path: str, uid: int | None) -> "_KeptLayout | None":
        ino = self._resolve(paths.split(path))
        if not isinstance(ino, int):
            return None
        kept = self._layouts.get(ino)
        if kept is None or kept.uid != uid or ino not in self._attrs:
            return None
        self._layouts.move_to_end(ino)
        return kept

    def learned_layout(self, path: str, uid: int | None, layout: LayoutSegment) -> None:
        """``uid`` read ``layout`` of ``path`` (under a lease on its attributes): kept if it is
        a whole file's and ``path`` is the inode it names here (a small file's, bytes inline,
        serves opens at once; a larger file's once a closing handle parks its lease)."""
        if self.make is not None and _whole(layout) and self._resolve(paths.split(path)) == layout.attrs.ino:
            if _whole_inline(layout) or self.end_reader is not None:
                self._keep_layout(uid, layout)

    def park_reader(self, layout: LayoutSegment, uid: int | None, reader: int, since: float) -> bool:
        """A read-only handle that opened with ``layout`` (as ``uid``) closed holding reader's
        lease ``reader`` (granted or renewed at ``since``): keep the lease for the next open if
        ``layout`` is still the one kept (no recall, own change or other open replaced it since)
        and no lease is parked there. False (also for a small file, whose next open needs no
        lease): the caller ends its lease."""
        kept = self._layouts.get(layout.attrs.ino)
        if kept is None or kept.layout is not layout or kept.uid != uid or kept.reader or _whole_inline(layout):
            return False
        kept.reader, kept.since = reader, since
        return True

    def _keep_layout(self, uid: int | None, layout: LayoutSegment) -> None:
        assert self.make is not None
        ino = layout.attrs.ino
        self.attributes(self.make(layout.attrs))
        self._drop_layout(ino)
        self._layouts[ino] = _KeptLayout(uid, layout)
        if _whole_inline(layout):
            self._layout_bytes += _inline_bytes(layout)
        else:
            self._chunk_layouts += 1
        while (self._layout_bytes > self.layout_bytes_max or self._chunk_layouts > self.chunk_layouts_max) and self._layouts:
            self._drop_layout(next(iter(self._layouts)))

    def _drop_layout(self, ino: int) -> None:
        kept = self._layouts.pop(ino, None)
        if kept is None:
            return
        if _whole_inline(kept.layout):
            self._layout_bytes -= _inline_bytes(kept.layout)
            return
        self._chunk_layouts -= 1
        if kept.reader and self.end_reader is not None:
            self.end_reader(ino, kept.reader, kept.layout.attrs.handle, kept.uid)

    def _has_none(self, ino: int) -> bool:
        """Whether the inode's cached attributes say it has no extended attributes."""
        stat = self._attrs.get(ino)
        return stat is not None and stat.xattrs == 0

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
                return ABSENT if ino in self._complete else MISS
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
        if stat.kind != "dir" and stat.nlink > 1:
            self._linked.add(stat.ino)
        else:
            self._linked.discard(stat.ino)
        self._attrs.move_to_end(stat.ino)
        while len(self._attrs) > self.entries_max:
            ino, _ = self._attrs.popitem(last=False)
            self.forget_inode(ino)

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
            (evicted_parent, _), _ = self._names.popitem(last=False)
            self._complete.discard(evicted_parent)  # one of its names is no longer here
            self._drop_listing(evicted_parent)

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
            self._drop_listing(entry.parent)
        self._complete.difference_update(recall.listings)
        for directory in recall.listings:
            self._drop_listing(directory)
        for directory in recall.claims:
            self._claim_ended(directory)

    def _claim_ended(self, directory: int) -> None:
        """This client's claim on ``directory`` ended: what it learned there while it held it
        (the names it created and unlinked without a call, their files' attributes, the
        directory's) no lease covers (the service grants nothing for a claim's creates), so the
        names there go, with the attributes of what they named (but directories' names: a
        claim's holder only adds and removes files), and the directory's attributes and listing."""
        for key in [key for key in self._names if key[0] == directory]:
            ino = self._names[key]
            stat = self._attrs.get(ino) if ino is not None else None
            if stat is not None and stat.kind == "dir":
                continue
            del self._names[key]
            if ino is not None:
                self.forget_inode(ino)
        self._complete.discard(directory)
        self._drop_listing(directory)
        self.forget_inode(directory)

    def changed_by_self(self, operation: str, request: Message, reply: "Message | None",
                        fresh_for: "int | None | Literal[False]" = False) -> None:
        """This client's own ``operation`` with ``request`` answered ``reply`` (None: it failed,
        or may have succeeded unseen). The service recalls nothing from the client that made a
        change, and grants its session the names and attributes the call changed (a claim's
        creates and unlinks, made without a call, are covered by the claim instead, and go
        when it ends: ``_claim_ended``): the cache learns the new names from the reply (so a
        directory it made stays complete through its creates), or forgets what the request named. ``fresh_for``: the
        uid the call was made as (None: the client's own) when no recall crossed it (False: one
        may have): a commit's answer, the file's new layout, leased to it, is then kept."""
        if reply is not None and self.make is not None:
            if self._learned_own(operation, request, reply, fresh=fresh_for is not False):
                return
            attrs = getattr(reply, "attrs", None)
            if fresh_for is not False and attrs is not None and self._names_inode(operation, request, attrs.ino):
                self._own_attributes(self.make(attrs))  # its new attributes, in its listing entry too
                if operation == "commit" and isinstance(reply, LayoutSegment) and (
                        _whole_inline(reply) or (_whole(reply) and self.end_reader is not None)):
                    self._keep_layout(fresh_for, reply)  # a larger file's: its writer parks its lease with it
                return
        for path in changed_paths(request):
            self.forget_path(path)
        ino = getattr(request, "ino", 0)
        if ino:
            self.forget_inode(ino)

    def _names_inode(self, operation: str, request: Message, ino: int) -> bool:
        """Whether own ``operation`` changed only the attributes of inode ``ino``, which
        ``request`` names (by number, or by a path that leads to it here)."""
        if operation == "commit":
            return getattr(request, "ino", 0) == ino
        if operation in ("setattr", "truncate"):
            path = getattr(request, "path", None)
            return self._resolve(paths.split(str(path))) == ino if path is not None else getattr(request, "ino", 0) == ino
        return False

    def _learned_own(self, operation: str, request: Message, reply: Message, fresh: bool = False) -> bool:
        """What a successful own change taught (True), or False if it is to be forgotten.
        ``fresh``: no recall crossed the call, so the listing of the directory it changed is
        kept, changed as the reply says."""
        assert self.make is not None
        made = operation in ("create", "mkdir", "makedirs", "symlink", "mknod", "link")
        if not (made or operation in ("unlink", "rename")):
            return False
        path = str(getattr(request, "dst" if operation in ("link", "rename") else "path"))
        parts = paths.split(path)
        parent = self._resolve(parts[:-1]) if parts else None
        if not isinstance(parent, int) or operation == "makedirs":
            return False
        attrs = getattr(reply, "attrs", None)
        if operation == "rename":
            source = paths.split(str(getattr(request, "src")))
            source_parent = self._resolve(source[:-1]) if source else None
            if not isinstance(source_parent, int) or attrs is None:
                return False
            if source != parts:  # onto another name of the same file: nothing happened (POSIX)
                held = self._names.get((parent, parts[-1]), MISS)
                if held == attrs.ino:
                    return True
                if isinstance(held, Miss) and attrs.nlink > 1:  # (maybe so: both names are forgotten)
                    return False
            self._own_name(source_parent, source[-1], ABSENT)
        directory = getattr(reply, "directory", None)
        after = self.make(directory) if fresh and directory is not None else None
        if operation == "unlink":
            self._own_name(parent, parts[-1], ABSENT, None if fresh else MISS, after)
            return True
        if attrs is None:
            return False
        stat = self.make(attrs)
        keep = fresh and operation in ("create", "mkdir", "symlink", "mknod")  # a new name, its entry known
        self.forget_inode(stat.ino, listing=not keep)  # a create may have replaced its content (inline) and xattrs
        self._own_name(parent, parts[-1], stat.ino, stat if keep else MISS, after)
        self.attributes(stat)
        if operation == "mkdir" and not getattr(request, "exist_ok", True):
            self._complete.add(stat.ino)  # new and empty, and its listing leased to this client
            if keep:
                self._listings[stat.ino] = []
        return True

    def _own_name(self, parent: int, name: str, ino: int | None, listed: "StatT | None | Miss" = MISS,
                  after: "StatT | None" = None) -> None:
        """``name`` in ``parent`` is now ``ino`` (or absent), by this client's own change;
        ``parent``'s listing now shows it with ``listed`` (None: not at all; ``MISS``: not
        known, the listing goes) and ``parent`` has the attributes ``after`` (None: not known)."""
        old = self._names.get((parent, name))
        if isinstance(listed, Miss):
            self._drop_listing(parent)
        else:
            self._relist(parent, name, listed)
        if old is not None and old != ino:
            self.forget_inode(old)  # its link count (or its life) changed
        self._directory_changed(parent, after)
        self._name(parent, name, ino)

    def learned_complete(self, directory: int) -> None:
        """Every name of ``directory`` is here (a whole listing read under a lease)."""
        self._complete.add(directory)

    def forget_path(self, path: str) -> None:
        """This client changed ``path``: drop its name and what it named (the service does not
        recall a client's own changes; the kernel, a mount's other cache, knows them already)."""
        parts = paths.split(path)
        if not parts:
            self._attrs.pop(ROOT_INO, None)
            return
        parent = self._resolve(parts[:-1])
        if not isinstance(parent, int):
            # Not resolvable here, yet what it names may be cached: under another name (a hard
            # link), or below a name this cache let go of (and may learn again): all goes.
            self.clear()
            return
        key = (parent, parts[-1])
        known = key in self._names
        ino = self._names.pop(key, None)
        self._complete.discard(parent)
        self._drop_listing(parent)
        self._attrs.pop(parent, None)  # its mtime and ctime moved
        if ino is not None:
            self.forget_inode(ino)
        elif not known:  # which inode it named is not known here: any with another name may be it
            for linked in list(self._linked):
                self.forget_inode(linked)

    def forget_inode(self, ino: int, listing: bool = True) -> None:
        """Drop what is kept of inode ``ino``, and the listing that lists it (unless ``listing``
        is False: the caller puts its entry right)."""
        self._linked.discard(ino)
        where = self._listed_in.get(ino)
        if where is not None and listing:
            self._drop_listing(where[0])
        self._attrs.pop(ino, None)
        self._xattrs.pop(ino, None)
        self._xattr_names.pop(ino, None)
        self._drop_layout(ino)

    def clear(self) -> None:
        self._linked.clear()
        self._listings.clear()
        self._listed_in.clear()
        self._complete.clear()
        self._names.clear()
        self._attrs.clear()
        self._xattrs.clear()
        self._xattr_names.clear()
        for ino in list(self._layouts):
            self._drop_layout(ino)


def _name_of(entry: "tuple[str, object]") -> str:
    return entry[0]


def _whole(layout: LayoutSegment) -> bool:
    """Whether ``layout`` is a whole file's (one segment)."""
    return not layout.first and layout.end is None


def _whole_inline(layout: LayoutSegment) -> bool:
    """Whether ``layout`` is a whole file's, every block's bytes in it (a small file's)."""
    return _whole(layout) and all(block.inline is not None for block in layout.blocks)


def _inline_bytes(layout: LayoutSegment) -> int:
    return sum(len(block.inline.data) for block in layout.blocks if block.inline is not None)


def changed_paths(request: Message) -> list[str]:
    """The paths a changing request names (``client/metadata.py``'s ``CHANGING``)."""
    found = [getattr(request, field) for field in ("path", "src", "dst", "a", "b") if getattr(request, field, None)]
    directory = getattr(request, "directory", None)
    if isinstance(directory, str):
        found.extend(paths.join(directory, name) for name in getattr(request, "names", ()))
    return found
