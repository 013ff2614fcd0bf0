"""The ``tectofs`` command as a user runs it, against a real cluster."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

MiB = 1 << 20


def tectofs(*args: str, address: str | None = None, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ}
    if address:
        env["TECTOFS_META"] = address
    result = subprocess.run([sys.executable, "-m", "tectofs.cli", *args], capture_output=True, text=True, env=env,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"tectofs {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def test_put_get_ls_stat_mv_rm_status(cluster, tmp_path):
    src = tmp_path / "in.bin"
    data = os.urandom(3 * MiB + 17)
    src.write_bytes(data)
    a = cluster.address
    tectofs("mkdir", "-p", "/cli/sub", "--policy", "rep(2)", address=a)
    out = tectofs("put", str(src), "/cli/sub/", address=a).stdout
    assert "/cli/sub/in.bin" in out and "MiB" in out
    listing = tectofs("ls", "/cli/sub", address=a).stdout
    assert "in.bin" in listing and str(len(data)) in listing and "rep(2)" in listing
    stat = tectofs("stat", "/cli/sub/in.bin", address=a).stdout
    assert f"size: {len(data)}" in stat
    tectofs("mv", "/cli/sub/in.bin", "/cli/moved.bin", address=a)
    dst = tmp_path / "out.bin"
    tectofs("get", "/cli/moved.bin", str(dst), address=a)
    assert dst.read_bytes() == data
    status = tectofs("status", address=a).stdout
    assert "6 live of 6" in status
    tectofs("rm", "-r", "/cli", address=a)
    assert not cluster.fs.exists("/cli")


def test_clear_errors(cluster, tmp_path):
    a = cluster.address
    missing = tectofs("get", "/no/such/file", str(tmp_path / "x"), address=a, check=False)
    assert missing.returncode != 0 and "no such file" in missing.stderr.lower()
    assert "Traceback" not in missing.stderr
    bad = tectofs("mkdir", "/a/../b", address=a, check=False)
    assert bad.returncode != 0 and "invalid name" in bad.stderr
    nodir = tectofs("rm", "/", address=a, check=False)
    assert nodir.returncode != 0 and "-r" in nodir.stderr
    no_meta = subprocess.run([sys.executable, "-m", "tectofs.cli", "ls"], capture_output=True, text=True, timeout=30,
                             env={k: v for k, v in os.environ.items() if k != "TECTOFS_META"})
    assert no_meta.returncode != 0 and "TECTOFS_META" in no_meta.stderr


def test_unreachable_metadata_service_is_a_clear_error():
    result = tectofs("ls", "/", address="127.0.0.1:1", check=False)
    assert result.returncode != 0 and "cannot connect to 127.0.0.1:1" in result.stderr


@pytest.mark.parametrize("command", ["up", "meta", "chunk", "put", "get", "ls", "mount", "status"])
def test_help_is_helpful(command):
    out = tectofs(command, "--help").stdout
    assert "usage: tectofs" in out and "--" in out


def test_up_check_smoke(tmp_path):
    result = tectofs("up", "--root", str(tmp_path / "root"), "--port", "0", "--servers", "6", "--check", timeout=120)
    assert "self-check" in result.stdout and "OK" in result.stdout
    assert "cluster stopped" in result.stdout
