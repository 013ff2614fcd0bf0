"""tectofs.allocator: the malloc thresholds are set once per process, and can be turned off."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the thresholds are glibc's"),
              pytest.mark.slow]  # starts processes (the fast lane is in-process: tests/conftest.py)

PROBE = ("import tectofs.allocator as a; print(a.tune(), a.tune())")


def _run(**env: str) -> str:
    return subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def test_tuned_once_on_glibc_and_off_on_request():
    assert _run() == "True True"
    assert _run(TECTOFS_MALLOC_TUNING="0") == "False False"


def test_an_encode_after_tuning_takes_no_page_fault_per_segment():
    """Two threads encoding 64 MiB blocks through pyeclib (its per-segment buffers are what the
    setting is for), as the client's codec pool does: after a warm-up the tuned process faults
    in (almost) no page, the default one tens of thousands per GB."""
    script = os.path.join(os.path.dirname(__file__), "..", "bench", "encode_cpu.py")
    faults = {}
    for setting in ("0", "1"):
        out = subprocess.run([sys.executable, script, "--child", "--size", "256M"], capture_output=True, text=True,
                             check=True, timeout=300, env={**os.environ, "TECTOFS_MALLOC_TUNING": setting, "TECTOFS_ISAL": "0"}).stdout
        faults[setting] = json.loads(out.strip().splitlines()[-1])["faults_per_gb"]
    assert faults["1"] < 1000 < faults["0"], faults
