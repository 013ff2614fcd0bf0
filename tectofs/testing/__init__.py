"""The deterministic simulator: production roles on declared seams, driven by a seed.

- ``loop``: the virtual-time event loop (the clock seam; executors run inline);
- ``network``: the in-memory transport seam (latency, delay, reordering, drops, crashes,
  partitions) under the real wire protocols;
- ``disk``: the chunk disk (``server/chunk/disk.py``'s seam) that fails, lies and loses what
  was not durable when its machine crashes;
- ``cluster``: the real metadata service, chunk servers and client on those seams;
- ``schedule``: seeded fault schedules and the invariants they are checked against.

Replay a seed: ``python3 -m tectofs.testing --seed N``; many: ``--seeds A..B``.

The package itself imports nothing: its modules are imported when named (the history checker's
modules, used by ``tectofs check``, must not pull the simulator and the whole cluster into the
command line's ``--help``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["SimulationFailed", "replay_command", "run"]


def __getattr__(name: str) -> Any:
    """``tectofs.testing.run`` and the others of ``__all__``, imported from ``schedule`` on first use."""
    if name in __all__:
        from tectofs.testing import schedule

        return getattr(schedule, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
