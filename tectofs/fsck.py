"""``tectofs fsck``: the health of every block below a path, per file and in total.

A block is *healthy* when every chunk its policy places is readable now (stored, not
reported corrupt or missing, on a live server), *under-redundant* when it can be read but
lost at least one chunk (a rebuild is due), *unreadable* when fewer chunks than a read needs
are readable. The metadata service grades the blocks (``block_health``, up to
``limits.health_inos_per_call_max`` files per call); this module walks the namespace a
directory page at a time, so a tree of any size is checked in bounded memory per page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from tectofs.wire import messages

from . import limits

if TYPE_CHECKING:
    from .client.core import Stat

GRADES = ("healthy", "under_redundant", "unreadable")


@dataclass
class FsckReport:
    files: int = 0
    blocks: int = 0
    healthy: int = 0
    under_redundant: int = 0
    unreadable: int = 0
    damaged: list[dict[str, Any]] = field(default_factory=list)  # files with any block not healthy

    @property
    def exit_code(self) -> int:
        """0: everything fully redundant; 1: some blocks under-redundant; 2: some unreadable."""
        return 2 if self.unreadable else 1 if self.under_redundant else 0

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "blocks": self.blocks, "healthy": self.healthy,
                "under_redundant": self.under_redundant, "unreadable": self.unreadable,
                "damaged_files": self.damaged, "clean": self.exit_code == 0}


async def check(fs: Any, path: str = "/", progress: Callable[[int], None] | None = None) -> FsckReport:
    """Grade every block of every file at or below ``path`` (``fs``: an AsyncFileSystem)."""
    report = FsckReport()
    batch: list[tuple[Stat, str]] = []

    async def flush() -> None:
        if not batch:
            return
        files = [messages.FileRef(ino=st.ino, handle=st.handle) for st, _ in batch]
        reply = await fs.metadata.block_health(messages.BlockHealthRequest(files=files))
        paths = {st.ino: path for st, path in batch}
        for health in reply.files:
            report.files += 1
            report.blocks += health.blocks
            for grade in GRADES:
                setattr(report, grade, getattr(report, grade) + getattr(health, grade))
            if health.under_redundant or health.unreadable:
                report.damaged.append({"path": paths[health.ino], "blocks": health.blocks, "healthy": health.healthy,
                                       "under_redundant": health.under_redundant, "unreadable": health.unreadable})
        batch.clear()
        if progress is not None:
            progress(report.files)

    top = await fs.stat(path)
    if top.is_file:
        batch.append((top, path))
    directories = [path] if top.is_dir else []
    while directories:
        directory = directories.pop()
        async for page in fs.scandir_pages(directory):
            for name, st in page:
                child = directory.rstrip("/") + "/" + name
                if st.is_dir:
                    directories.append(child)
                elif st.is_file:
                    batch.append((st, child))
                    if len(batch) >= limits.health_inos_per_call_max:
                        await flush()
    await flush()
    return report
