"""The deterministic simulator: production roles on declared seams, driven by a seed.

- ``loop``: the virtual-time event loop (the clock seam; executors run inline);
- ``network``: the in-memory transport seam (latency, delay, reordering, drops, crashes,
  partitions) under the real wire protocols;
- ``disk``: the chunk disk (``server/chunk/disk.py``'s seam) that fails, lies and loses what
  was not durable when its machine crashes;
- ``cluster``: the real metadata service, chunk servers and client on those seams;
- ``schedule``: seeded fault schedules and the invariants they are checked against.

Replay a seed: ``python3 -m tectofs.testing --seed N``; many: ``--seeds A..B``.
"""

from tectofs.testing.schedule import SimulationFailed, replay_command, run

__all__ = ["SimulationFailed", "replay_command", "run"]
