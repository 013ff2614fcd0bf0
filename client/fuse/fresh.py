"""Attributes a change already answered, for the kernel's next question.

After a create or an unlink the kernel drops its cached attributes of the directory, and
with ``default_permissions`` its next permission check there (the next create's or unlink's)
asks for them again: one metadata call per file. The metadata service returns the
directory's attributes with the create or unlink reply (post-operation attributes, as
NFSv3's ``wcc_data``), so the mount keeps them here and answers that one ``getattr``
itself. Entries are keyed by inode number. (A ``setattr``'s reply carries the attributes
itself: nothing is kept for it.)

Correctness rests on a change counter (the *epoch*): every request of the mount that may
change a directory (anything but reads, ``getattr``, ``statfs`` and the like) moves it when
it starts and when it ends. A create or unlink keeps the directory's attributes only if
no other change started or ended while it ran, and a ``getattr`` is answered from them only
if nothing changed since, for the same caller, within the attribute timeout, and only once
(the kernel caches the answer itself for that long). Changes made by other clients are
seen as through the kernel's own attribute cache: within ``attr_timeout_s``.
"""

from __future__ import annotations

import time
from typing import Any

from tectofs.client.core import Stat


class FreshAttributes:
    """Post-operation attributes (of a directory or a file), keyed by inode number, valid
    until the next change. One event loop uses it."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._epoch = 0
        self._fresh: dict[int, tuple[int, float, Any, Stat]] = {}  # inode -> (epoch, expiry, caller, attrs)

    def begin_change(self) -> int:
        """A request that may change directories starts; pass the result to ``end_change``."""
        self._epoch += 1
        return self._epoch

    def end_change(self, started: int, inode: int | None = None, caller: Any = None,
                   attrs: Stat | None = None) -> None:
        """The request begun at ``started`` ended; its reply said ``inode`` (a directory, or
        the file it changed) now has ``attrs``, kept if no other change overlapped it."""
        alone = self._epoch == started
        self._epoch += 1
        if not alone or inode is None or attrs is None or self.timeout_s <= 0:
            return
        self._fresh[inode] = (self._epoch, time.monotonic() + self.timeout_s, caller, attrs)
        if len(self._fresh) > 64:  # only the latest can be current: drop the others
            self._fresh = {inode: self._fresh[inode]}

    def forget_all(self) -> None:
        """Another client changed something (a lease recall): nothing kept here may be current."""
        self._fresh.clear()
        self._epoch += 1

    def take(self, inode: int, caller: Any) -> Stat | None:
        """The attributes of ``inode`` if a change's reply gave them and nothing changed since
        (once: the kernel caches the answer)."""
        entry = self._fresh.pop(inode, None)
        if entry is None:
            return None
        epoch, expiry, owner, attrs = entry
        if epoch != self._epoch or owner != caller or time.monotonic() > expiry:
            return None
        return attrs
