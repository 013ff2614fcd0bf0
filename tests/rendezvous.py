"""Where the gloo ranks a test spawns meet, and how they leave.

They meet at a file of the test's own (torch's ``FileStore``), not a TCP port found free and
bound later by rank 0, which a test running beside it (the suite runs on two pytest-xdist
workers) may take in between (``EADDRINUSE``). A rank that passed its checks leaves with
:func:`leave`."""

from __future__ import annotations

import itertools
import os
import sys
from typing import NoReturn

_numbers = itertools.count()


def rendezvous(directory: os.PathLike[str] | str) -> str:
    """A new ``init_method`` for ``dist.init_process_group``: a file in ``directory`` (the
    test's ``tmp_path``) that no other group used."""
    return "file://" + os.path.join(os.fspath(directory), f"rendezvous-{os.getpid()}-{next(_numbers)}")


def leave() -> NoReturn:
    """End a spawned rank that finished its checks and destroyed its process group: flush its
    output and exit at once with status 0, skipping the interpreter's finalization.

    In that finalization torch's C++ distributed state is torn down, and now and then a rank
    died there with SIGABRT after every check had passed ("terminate called without an active
    exception": CI, stop 24, in ``test_four_ranks_save_two_ranks_load``; a SIGABRT of rank 1
    in ``test_metadata_is_read_once_and_broadcast_to_every_rank``, stop 48), which failed the
    test for torch's exit, not for anything tested. A rank whose check fails raises before
    this, and ``torch.multiprocessing.spawn`` reports its exception as before."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
