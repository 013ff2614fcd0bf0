"""Where the gloo ranks a test spawns meet: a file of the test's own (torch's ``FileStore``),
not a TCP port found free and bound later by rank 0, which a test running beside it (the
suite runs on two pytest-xdist workers) may take in between (``EADDRINUSE``)."""

from __future__ import annotations

import itertools
import os

_numbers = itertools.count()


def rendezvous(directory: os.PathLike[str] | str) -> str:
    """A new ``init_method`` for ``dist.init_process_group``: a file in ``directory`` (the
    test's ``tmp_path``) that no other group used."""
    return "file://" + os.path.join(os.fspath(directory), f"rendezvous-{os.getpid()}-{next(_numbers)}")
