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
    assert "metrics of meta: http://127.0.0.1:" in result.stdout and "metrics of chunk-5: http://" in result.stdout


def test_users_and_keys_as_an_administrator_makes_them(cluster, tmp_path):
    """`tectofs user add` writes a private credential file that works at once; `whoami` names
    its user; the user gets what POSIX gives them; `user remove` ends it; `tectofs init` and
    `tectofs key` make and rotate a key file."""
    a = cluster.address
    cred = tmp_path / "carol.credentials"
    out = tectofs("user", "add", "carol", "--uid", "2000", "--gid", "2000", "--groups", "27,100", "--out", str(cred),
                  address=a).stdout
    assert "carol" in out and str(cred) in out and "S3 access key: TFS" in out
    assert os.stat(cred).st_mode & 0o777 == 0o600
    assert "carol (uid 2000, gid 2000, groups 27,100)" in tectofs("whoami", "--credentials", str(cred), address=a).stdout
    assert "carol" in tectofs("user", "list", address=a).stdout
    tectofs("mkdir", "/carol-only", address=a)
    denied = tectofs("mkdir", "/carol-only/x", "--credentials", str(cred), address=a, check=False)
    assert denied.returncode != 0 and "permission denied" in denied.stderr
    refused = tectofs("user", "add", "dave", "--uid", "1", "--gid", "1", "--out", str(tmp_path / "d"),
                      "--credentials", str(cred), address=a, check=False)
    assert refused.returncode != 0 and "not an administrator" in refused.stderr
    tectofs("user", "remove", "carol", address=a)
    gone = tectofs("whoami", "--credentials", str(cred), address=a, check=False)
    assert gone.returncode != 0 and "unknown user" in gone.stderr
    anonymous = tectofs("ls", "/", "--credentials", str(tmp_path / "missing.credentials"), address=a, check=False)
    assert anonymous.returncode != 0 and "does not exist" in anonymous.stderr

    root = tmp_path / "site"
    out = tectofs("init", "--root", str(root)).stdout
    assert "cluster.key" in out and os.stat(root / "cluster.key").st_mode & 0o777 == 0o600
    assert os.stat(root / "root.credentials").st_mode & 0o777 == 0o600
    out = tectofs("key", "add", "--key-file", str(root / "cluster.key")).stdout
    first, second = out.split("keys ")[1].split(" (")[0].split(", ")
    out = tectofs("key", "use", second, "--key-file", str(root / "cluster.key")).stdout
    assert f"({second} signs)" in out
    out = tectofs("key", "remove", first, "--key-file", str(root / "cluster.key")).stdout
    assert first not in out.split("keys ")[1].split(" (")[0]
    last = tectofs("key", "remove", second, "--key-file", str(root / "cluster.key"), check=False)
    assert last.returncode != 0 and "only key" in last.stderr
