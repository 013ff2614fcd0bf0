"""Starting ``tectofs agent`` as a child process and waiting until it serves: for ``tectofs up
--agent``, the benchmarks and the tests (below the command line, which ``bench/`` never imports)."""

from __future__ import annotations

import os
import subprocess
import time

from tectofs import children


def start_agent(root: str, *args: str, name: str = "agent",
                timeout_s: float = 60.0) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``tectofs agent ARGS`` as a child process running this tectofs (``tectofs up
    --agent``, the benchmarks, the tests) and wait until it serves: its process and address.
    Its address file is ``ROOT/NAME.address``, its log ``ROOT/logs/NAME.log``; RuntimeError,
    naming the log, if it does not start within ``timeout_s``."""
    ready = os.path.join(root, f"{name}.address")
    if os.path.exists(ready):
        os.remove(ready)
    log_path = os.path.join(root, "logs", f"{name}.log")
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(children.cli_command("agent", "--ready-file", ready, *args), env=children.cli_env(),
                                stdout=log, stderr=log)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=10)
            raise RuntimeError(f"the memory agent did not start (see {log_path})")
        time.sleep(0.05)
    with open(ready) as f:
        return proc, f.read().strip()
