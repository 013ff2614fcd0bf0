"""The memory tier of checkpoints (Gemini, SOSP'23): a per-host agent that holds recent
checkpoint steps in host memory, outside the training process, replicates each to peer agents
and persists it to the cluster behind the training.

* ``messages``: the agent's operations, as declared types with bounds.
* ``store``: the steps one agent holds (shared-memory files), their states and the memory bound.
* ``persist``: writing a held step to the cluster with the plugin's atomic commit.
* ``identity``, ``rules``: who calls an agent, which saves it takes (a step bound to its
  directory and to a saver the cluster lets write there) and each saver's share of its memory.
* ``service``: the agent's server (``tectofs agent``): puts, seals, replication, persistence.
* ``client``: the synchronous client the writer, the reader and ``latest()`` use.
"""
