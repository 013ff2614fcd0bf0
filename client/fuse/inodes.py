"""The kernel's inodes and the tectofs paths they stand for (the metadata service is path based).

The kernel names files by inode number, tectofs inode numbers themselves (the root is
``pyfuse3.ROOT_INODE``, tectofs's root inode 1). For each inode the kernel knows, the table
keeps the names it was reached by, each a (parent inode, name) pair, and the kernel's lookup
count; a path is made by walking parents up to the root at each request, never cached whole,
so a renamed directory moves every path below it at once.

Contract:

- ``looked_up(parent, name, ino)`` after every reply that gives the kernel an entry
  (lookup, create, mkdir, mknod, symlink, link, each listed entry of READDIRPLUS): it counts
  one lookup, as the kernel does; ``forget(ino, n)`` takes ``n`` away, and an inode whose count
  reaches 0 is dropped once no known inode names it as parent (a directory stays while the
  kernel knows something below it).
- A file with several names (hard links) is one inode; the name confirmed last is its path,
  and any other it was reached by serves when that one is gone (``removed``).
- ``path(ino)`` raises :class:`~tectofs.errors.StaleFile` (ESTALE) for an inode with no name
  left (unlinked, or forgotten): callers that have the file open answer from its handle.
- ``removed``, ``moved`` and ``exchanged`` follow this mount's own unlink, rmdir and rename;
  another client's changes are learned at the kernel's next lookup of the name.
- ``doubt(names)``: another client changed these names (a lease recall named them, or the
  leases were lost, or this mount's claim on their directory ended: ``named_in``): each goes
  last among its inode's names, and a path through a doubted name is *doubtful*
  (``path_doubtful``) until a lookup confirms it again: the mount checks such a path leads to
  the inode before it acts on it (``MountState.checked_path``), trying the inode's other names
  (``paths``), so a request never acts on another client's file by a name that no longer leads
  to the kernel's inode.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tectofs.errors import StaleFile

ROOT_INODE = 1             # pyfuse3.ROOT_INODE and tectofs's root inode number
names_per_inode_max = 64   # names remembered per inode (hard links); the oldest go first
depth_max = 4096           # a parent chain longer than this is taken for a loop: ESTALE

Name = tuple[int, str]     # (parent inode, name in it)


@dataclass(slots=True)
class _Node:
    names: list[Name] = field(default_factory=list)  # most recently confirmed first
    lookups: int = 0  # the kernel's lookup count
    children: int = 0  # names of known inodes in this directory (keep it while > 0)


class InodeTable:
    """Inode -> names and lookup count (see the module docstring). One event loop uses it."""

    def __init__(self) -> None:
        self._nodes: dict[int, _Node] = {ROOT_INODE: _Node(lookups=1)}
        self._by_name: dict[Name, int] = {}
        self._doubted: set[Name] = set()  # names another client changed since the kernel got them

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, ino: object) -> bool:
        return ino in self._nodes

    def parent_of(self, ino: int) -> int:
        """The directory ``ino`` was last named in (the root's: itself)."""
        node = self._nodes.get(ino)
        return node.names[0][0] if node is not None and node.names else ROOT_INODE

    def known_names(self) -> list[Name]:
        """Every (parent inode, name) the kernel may hold."""
        return list(self._by_name)

    def named_in(self, directories: set[int]) -> list[tuple[Name, int]]:
        """Every name the kernel may hold in ``directories``, with its inode."""
        return [(key, ino) for key, ino in self._by_name.items() if key[0] in directories]

    def known_inodes(self) -> list[int]:
        """Every inode the kernel may hold."""
        return list(self._nodes)

    def path(self, ino: int) -> str:
        """The tectofs path of ``ino`` now (its parents walked up to the root)."""
        parts: list[str] = []
        current = ino
        for _ in range(depth_max):
            if current == ROOT_INODE:
                return "/" + "/".join(reversed(parts))
            node = self._nodes.get(current)
            if node is None or not node.names:
                raise StaleFile(f"inode {ino} has no name this mount knows (removed, or forgotten)")
            parent, name = node.names[0]
            parts.append(name)
            current = parent
        raise StaleFile(f"inode {ino}: its parents do not lead to the root")

    def path_doubtful(self, ino: int) -> tuple[str, bool]:
        """``path(ino)``, and whether a name on it is doubted (it may lead elsewhere now)."""
        if not self._doubted:
            return self.path(ino), False
        doubtful = False
        current = ino
        for _ in range(depth_max):
            if current == ROOT_INODE:
                break
            node = self._nodes.get(current)
            if node is None or not node.names:
                break  # (path says why)
            doubtful = doubtful or node.names[0] in self._doubted
            current = node.names[0][0]
        return self.path(ino), doubtful

    def paths(self, ino: int) -> list[tuple[Name, str]]:
        """Each name of ``ino`` this mount knows, most trusted first, with the path through it."""
        node = self._nodes.get(ino)
        found = []
        for name in [] if node is None else list(node.names):
            try:
                found.append((name, self.child_path(name[0], name[1])))
            except StaleFile:
                continue
        return found

    def doubt(self, names: "list[Name] | None") -> None:
        """Another client changed ``names`` (None: every name may have changed): see the module."""
        if names is None:
            self._doubted.update(self._by_name)
            return
        for key in names:
            ino = self._by_name.get(key)
            if ino is None:
                continue
            self._doubted.add(key)
            node = self._nodes[ino]
            node.names.remove(key)
            node.names.append(key)

    def confirmed(self, ino: int, path: tuple[Name, str]) -> None:
        """``path`` (one of :meth:`paths`) was found to lead to ``ino``: it and the names above it
        are trusted again, and it is ``ino``'s path."""
        key = path[0]
        node = self._nodes.get(ino)
        if node is None or key not in node.names:
            return
        node.names.remove(key)
        node.names.insert(0, key)
        current = ino
        for _ in range(depth_max):
            node = self._nodes.get(current)
            if current == ROOT_INODE or node is None or not node.names:
                return
            self._doubted.discard(node.names[0])
            current = node.names[0][0]

    def child_path(self, parent: int, name: str) -> str:
        """The tectofs path of ``name`` in directory ``parent``."""
        base = self.path(parent)
        return base + name if base == "/" else base + "/" + name

    def ino_of(self, parent: int, name: str) -> int | None:
        """The inode last known by ``name`` in ``parent``, if any."""
        return self._by_name.get((parent, name))

    def looked_up(self, parent: int, name: str, ino: int, count: int = 1) -> None:
        """The kernel received entry ``name`` in ``parent`` -> ``ino`` (``count`` lookups)."""
        assert count >= 0
        assert ino != ROOT_INODE or parent == ROOT_INODE
        if ino == ROOT_INODE:
            return
        key = (parent, name)
        self._doubted.discard(key)
        previous = self._by_name.get(key)
        if previous is not None and previous != ino:
            self._unname(previous, key)
        node = self._nodes.get(ino)
        if node is None:
            node = self._nodes[ino] = _Node()
        if previous == ino and key in node.names:
            node.names.remove(key)
            node.names.insert(0, key)
        else:
            node.names.insert(0, key)
            self._by_name[key] = ino
            self._parent_node(parent).children += 1
            if len(node.names) > names_per_inode_max:
                self._unname(ino, node.names[-1])
        node.lookups += count

    def forget(self, ino: int, count: int) -> None:
        """The kernel dropped ``count`` of its lookups of ``ino``."""
        node = self._nodes.get(ino)
        if node is None or ino == ROOT_INODE:
            return
        node.lookups = max(0, node.lookups - count)
        self._drop_if_unused(ino)

    def removed(self, parent: int, name: str) -> None:
        """``name`` in ``parent`` is gone (unlink, rmdir, or replaced by a rename)."""
        ino = self._by_name.get((parent, name))
        if ino is not None:
            self._unname(ino, (parent, name))

    def moved(self, old_parent: int, old_name: str, new_parent: int, new_name: str) -> None:
        """``old_name`` in ``old_parent`` is now ``new_name`` in ``new_parent`` (what that
        named before is gone)."""
        ino = self._by_name.get((old_parent, old_name))
        if ino is None:
            self.removed(new_parent, new_name)
            return
        if self._by_name.get((new_parent, new_name)) == ino:
            return  # two names of one file: POSIX keeps both
        self._parent_node(new_parent).children += 1  # first: neither directory may go meanwhile
        self.removed(new_parent, new_name)
        node = self._nodes[ino]
        index = node.names.index((old_parent, old_name))
        node.names[index] = (new_parent, new_name)
        del self._by_name[(old_parent, old_name)]
        self._doubted.discard((old_parent, old_name))
        self._by_name[(new_parent, new_name)] = ino
        self._release_parent(old_parent)

    def exchanged(self, a_parent: int, a_name: str, b_parent: int, b_name: str) -> None:
        """The entries ``a_name`` in ``a_parent`` and ``b_name`` in ``b_parent`` swapped inodes."""
        a, b = self._by_name.get((a_parent, a_name)), self._by_name.get((b_parent, b_name))
        for ino, key in ((a, (a_parent, a_name)), (b, (b_parent, b_name))):
            if ino is not None:
                self._nodes[ino].lookups += 1  # held across the swap
                self._unname(ino, key)
        for ino, parent, name in ((a, b_parent, b_name), (b, a_parent, a_name)):
            if ino is not None:
                self.looked_up(parent, name, ino, count=0)
        for ino in (a, b):
            if ino is not None:
                self.forget(ino, 1)

    def _parent_node(self, parent: int) -> _Node:
        node = self._nodes.get(parent)
        if node is None:  # a directory the kernel reached before this mount learned its name
            node = self._nodes[parent] = _Node()
        return node

    def _unname(self, ino: int, key: Name) -> None:
        node = self._nodes.get(ino)
        if node is not None and key in node.names:
            node.names.remove(key)
        if self._by_name.get(key) == ino:
            del self._by_name[key]
            self._doubted.discard(key)
            self._release_parent(key[0])
        self._drop_if_unused(ino)

    def _release_parent(self, parent: int) -> None:
        node = self._nodes.get(parent)
        if node is not None:
            node.children -= 1
            self._drop_if_unused(parent)

    def _drop_if_unused(self, ino: int) -> None:
        node = self._nodes.get(ino)
        if node is None or ino == ROOT_INODE or node.lookups > 0 or node.children > 0:
            return
        del self._nodes[ino]
        for key in node.names:
            if self._by_name.get(key) == ino:
                del self._by_name[key]
                self._doubted.discard(key)
                self._release_parent(key[0])
