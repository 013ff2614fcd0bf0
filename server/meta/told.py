"""What an answer of the metadata service tells its caller: the lease keys it grants
(:func:`granted`), the directory each file it carries was made in (:func:`parents`), and a
listing's file handles (:func:`with_handles`).

The listing rule (issue 51): a listing needs read permission on the directory, a lookup there
search permission. A caller with only the first gets each entry's name, inode number and type
(``tectofs.store.access.names_only``, as ``getdents(2)``) and no handle: a handle lets its
holder name the inode by number (getattr, layout: its bytes), which must be no more than a
lookup would have allowed. Nor does such a listing grant leases on its entries' attributes:
it tells none.
"""

from __future__ import annotations

from typing import Callable

import msgspec

from tectofs.store.access import is_names_only
from tectofs.wire import messages
from tectofs.wire.leases import ATTRS, ENTRY, LISTING, LeaseKey


def granted(walked: list[LeaseKey], reached: int, result: object) -> list[LeaseKey]:
    """What an operation's answer told its caller, as lease keys: the names its paths walked
    (present or absent), and what the answer holds: attributes, a listing and its entries (the
    attributes of those it tells), the extended attributes of the inode reached."""
    if isinstance(result, tuple):  # (attributes, the directories walked): a lookup's
        result = result[0]
    if isinstance(result, messages.Attrs):
        return [*walked, (ATTRS, result.ino)]
    if isinstance(result, (messages.CreateReply, messages.LayoutSegment, messages.AttrsReply)):
        return [*walked, (ATTRS, result.attrs.ino)]
    if isinstance(result, messages.ReaddirReply):
        return [*walked, (LISTING, reached), *((ENTRY, reached, e.name) for e in result.entries),
                *((ATTRS, e.attrs.ino) for e in result.entries if not is_names_only(e.attrs))]
    if isinstance(result, (bytes, list)) and reached:  # extended attributes (a value, the names)
        return [*walked, (ATTRS, reached)]
    return walked


def parents(result: object) -> dict[int, int]:
    """The directory each regular file an answer carries the attributes of was made or renamed
    into (what a claim there covers: ``LeaseTable.claimed_by_other``); 0 for anything else."""
    if isinstance(result, tuple):  # (attributes, the directories walked): a lookup's
        result = result[0]
    if isinstance(result, (messages.CreateReply, messages.LayoutSegment, messages.AttrsReply)):
        result = result.attrs
    if isinstance(result, messages.Attrs):
        return {result.ino: result.parent if result.kind == "file" else 0}
    if isinstance(result, messages.ReaddirReply):
        return {e.attrs.ino: e.attrs.parent if e.attrs.kind == "file" else 0 for e in result.entries}
    return {}


def with_handles(page: messages.ReaddirReply, handle: Callable[[int], bytes]) -> messages.ReaddirReply:
    """``page`` with the caller's handle (``handle(ino)``) in each entry it may look up: none in
    a names-only entry (a directory the caller may read but not search)."""
    replace = msgspec.structs.replace
    return replace(page, entries=[
        e if is_names_only(e.attrs) else replace(e, attrs=replace(e.attrs, handle=handle(e.attrs.ino)))
        for e in page.entries])
