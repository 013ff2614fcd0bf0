"""The ``tectofs`` command as a user runs it, against a real cluster."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import pytest

from tectofs.wire import messages

KiB, MiB = 1 << 10, 1 << 20


def tectofs(*args: str, address: str | None = None, check: bool = True, timeout: float = 60,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env or {})}
    if address:
        env["TECTOFS_META"] = address
    result = subprocess.run([sys.executable, "-m", "tectofs.cli", *args], capture_output=True, text=True, env=env,
                            timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"tectofs {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def one_line_error(result: subprocess.CompletedProcess, command: str) -> str:
    """The failure's stderr: exactly one line, 'tectofs COMMAND: ...', no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"tectofs {command}: "), lines[0]
    return lines[0]


def test_put_get_ls_stat_mv_rm_status(cluster, tmp_path):
    src = tmp_path / "in.bin"
    data = os.urandom(3 * MiB + 17)
    src.write_bytes(data)
    a = cluster.address
    tectofs("mkdir", "-p", "/cli/sub", "--policy", "rep(2)", address=a)
    out = tectofs("put", str(src), "/cli/sub/", address=a).stdout
    assert "/cli/sub/in.bin" in out and "MiB" in out
    listing = tectofs("ls", "-l", "/cli/sub", address=a).stdout
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


def test_ls_long_names_recursive_and_json(cluster):
    a, fs = cluster.address, cluster.fs
    fs.makedirs("/lsdir/inner")
    fs.write_bytes("/lsdir/data.bin", b"x" * (3 * MiB))
    fs.write_bytes("/lsdir/inner/small", b"abc")
    fs.write_bytes("/lsdir/.hidden", b"")
    fs.chmod("/lsdir/data.bin", 0o640)
    names = tectofs("ls", "/lsdir", address=a).stdout
    assert names.splitlines() == ["data.bin", "inner"]
    assert ".hidden" in tectofs("ls", "-a", "/lsdir", address=a).stdout.splitlines()
    long = tectofs("ls", "-l", "/lsdir", address=a).stdout.splitlines()
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d"
    assert re.fullmatch(rf"-rw-r----- +1 +\d+ +\d+ +{3 * MiB} {when} rs\(4,2\) +data\.bin", long[0]), long
    assert re.fullmatch(rf"drwxr-xr-x +\d+ +\d+ +\d+ +\d+ {when} rs\(4,2\) +inner", long[1]), long
    human = tectofs("ls", "/lsdir", "-lh", address=a).stdout  # options after the path too
    assert " 3.0M " in human and str(3 * MiB) not in human
    recursive = tectofs("ls", "-R", "/lsdir", address=a).stdout
    assert recursive.split("\n\n") == ["/lsdir:\ndata.bin\ninner", "/lsdir/inner:\nsmall\n"]
    for argv in (["ls", "--json", "-R", "/lsdir"], ["--json", "ls", "-R", "/lsdir"]):  # before or after the command
        entries = json.loads(tectofs(*argv, address=a).stdout)
        by_path = {e["path"]: e for e in entries}
        assert set(by_path) == {"/lsdir/data.bin", "/lsdir/inner", "/lsdir/inner/small"}
        data = by_path["/lsdir/data.bin"]
        assert (data["kind"], data["size"], data["mode_octal"], data["permissions"]) == ("file", 3 * MiB, "0640",
                                                                                       "-rw-r-----")
        assert data["name"] == "data.bin" and isinstance(data["mtime"], float) and data["mtime_iso"].endswith("Z")


def test_stat_is_readable_and_json(cluster):
    a, fs = cluster.address, cluster.fs
    fs.write_bytes("/stat.bin", b"y" * (2 * MiB + 5))
    fs.chmod("/stat.bin", 0o600)
    text = tectofs("stat", "/stat.bin", address=a).stdout
    assert "mode: 0600 (-rw-------)" in text and "kind: file" in text and "blocks: 3" in text
    assert not re.search(r"\b33152\b", text) and not re.search(r"\b\d{10}\.\d+\b", text)  # no raw mode, no epoch floats
    assert re.search(r"modified: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", text)
    st = json.loads(tectofs("stat", "--json", "tectofs:/stat.bin", address=a).stdout)
    assert (st["path"], st["size"], st["mode_octal"], st["kind"], st["blocks"]) == ("/stat.bin", 2 * MiB + 5, "0600",
                                                                                 "file", 3)


def test_status_json_passes_every_server_field_through(cluster):
    out = json.loads(tectofs("status", "--json", address=cluster.address).stdout)
    servers = out["servers"]
    assert len(servers) == 6 and all(s["live"] for s in servers)
    library = {s["server_id"]: s for s in messages.to_plain(cluster.fs.servers())}
    for s in servers:  # the same fields the library's servers() call returns, none dropped
        assert set(s) == set(library[s["server_id"]])
        assert {"server_id", "address", "used", "capacity", "chunks", "last_heartbeat"} <= set(s)
    assert out["meta"]["address"] == cluster.address and "counts" in out["meta"]
    assert out["statfs"]["capacity"] > 0


def test_status_shows_the_space_deleted_packed_chunks_still_hold(cluster):
    """Chunks are packed by default; a delete marks their records dead, and until compaction
    returns the space each chunk server reports it, so ``status`` can say why a disk is fuller
    than ``used``."""
    def dead() -> dict[int, int]:
        out = json.loads(tectofs("status", "--json", address=cluster.address).stdout)
        return {s["server_id"]: s["stats"].get("pack_dead_bytes", 0) for s in out["servers"]}

    cluster.fs.write_bytes("/dead.bin", os.urandom(MiB))  # one block: a 256 KiB chunk on each server
    time.sleep(1)  # a heartbeat after the write
    before = dead()
    cluster.fs.remove("/dead.bin")
    deadline = time.monotonic() + 30  # the chunks' deletion orders (gc delay 1 s), then a heartbeat
    while True:
        after = dead()
        if all(after[i] - before[i] >= 256 * KiB for i in before):
            break
        assert time.monotonic() < deadline, f"dead packed bytes per server: {before} -> {after}"
        time.sleep(0.3)
    text = tectofs("status", address=cluster.address).stdout
    assert re.search(r"\bused\s+capacity\s+dead\s+chunks\b", text), text


def _tree(root, rng_seed: int = 7) -> dict[str, bytes]:
    import random

    rng = random.Random(rng_seed)
    files = {"a.bin": rng.randbytes(2 * MiB + 333), "empty": b"", "sub/b.txt": b"hello\n",
             "sub/deeper/c.bin": rng.randbytes(70_000), "other/d": rng.randbytes(10)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "emptydir").mkdir()
    return files


def test_recursive_put_and_get_round_trip(cluster, tmp_path):
    a = cluster.address
    files = _tree(tmp_path / "tree")
    quiet = tectofs("put", "-r", "-q", str(tmp_path / "tree"), "/rput", address=a)
    assert quiet.stdout == "" and quiet.stderr == ""
    assert cluster.fs.stat("/rput/emptydir").is_dir
    out = tectofs("get", "/rput", str(tmp_path / "back"), "-r", address=a).stdout
    assert out.startswith(f"{len(files)} files, ") and "MiB" in out
    for rel, data in files.items():
        assert (tmp_path / "back" / rel).read_bytes() == data, rel
    assert (tmp_path / "back" / "emptydir").is_dir()
    assert not [p for p in (tmp_path / "back").rglob("*.part")]  # no temporary files left behind
    into = tectofs("put", "-r", str(tmp_path / "tree"), "/rput", address=a, check=False)  # an existing dir: copied into it
    assert into.returncode == 0 and cluster.fs.read_bytes("/rput/tree/sub/b.txt") == b"hello\n"
    no_r = tectofs("get", "/rput", str(tmp_path / "x"), address=a, check=False)
    assert no_r.returncode == 1 and "use -r" in one_line_error(no_r, "get")


def test_cp_in_every_direction_and_cat(cluster, tmp_path):
    a = cluster.address
    data = os.urandom(MiB + 99)
    (tmp_path / "local.bin").write_bytes(data)
    tectofs("cp", str(tmp_path / "local.bin"), "tectofs:/cp-one.bin", address=a)
    assert cluster.fs.read_bytes("/cp-one.bin") == data
    tectofs("cp", "tectofs:/cp-one.bin", f"tectofs://{a}/cp-two.bin", address=a)  # within tectofs, explicit cluster
    assert cluster.fs.read_bytes("/cp-two.bin") == data
    tectofs("cp", "-q", "tectofs:/cp-two.bin", str(tmp_path / "back.bin"), address=a)
    assert (tmp_path / "back.bin").read_bytes() == data
    _tree(tmp_path / "t")
    tectofs("cp", "-r", str(tmp_path / "t"), "tectofs:/cpdir", address=a)
    tectofs("cp", "-r", "tectofs:/cpdir", "tectofs:/cpdir2", address=a)
    tectofs("cp", "-r", "tectofs:/cpdir2", str(tmp_path / "t2"), address=a)
    assert (tmp_path / "t2" / "sub" / "deeper" / "c.bin").read_bytes() == (tmp_path / "t" / "sub/deeper/c.bin").read_bytes()
    into_itself = tectofs("cp", "-r", "tectofs:/cpdir", "tectofs:/cpdir/inside", address=a, check=False)
    assert into_itself.returncode == 2 and "into itself" in one_line_error(into_itself, "cp")
    cat = subprocess.run([sys.executable, "-m", "tectofs.cli", "cat", "/cp-one.bin", "tectofs:/cpdir/sub/b.txt"],
                         capture_output=True, timeout=60, env={**os.environ, "TECTOFS_META": a})
    assert cat.returncode == 0 and cat.stdout == data + b"hello\n"


def test_du_and_df(cluster, tmp_path):
    a, fs = cluster.address, cluster.fs
    fs.makedirs("/du/x")
    fs.write_bytes("/du/one", b"1" * 1000)
    fs.write_bytes("/du/x/two", b"2" * (2 * MiB))
    assert tectofs("du", "-s", "/du", address=a).stdout == f"{1000 + 2 * MiB}\t/du\n"
    assert tectofs("du", "/du", address=a).stdout.splitlines() == [f"{2 * MiB}\t/du/x", f"{1000 + 2 * MiB}\t/du"]
    assert tectofs("du", "-sh", "/du", address=a).stdout == "2.0M\t/du\n"
    rows = json.loads(tectofs("du", "-s", "--json", "/du", address=a).stdout)
    assert rows == [{"path": "/du", "bytes": 1000 + 2 * MiB, "files": 2, "dirs": 2}]
    # Blocks shared between files (incremental checkpoints) count once in the unique bytes.
    fs.write_bytes("/du/x/three", b"")
    fs.truncate("/du/x/three", 2 * MiB)
    blocks = -(-2 * MiB // fs.stat("/du/x/two").block_size)
    fs.reference_blocks("/du/x/three", "/du/x/two", [(i, i) for i in range(blocks)])
    assert tectofs("du", "--unique", "/du", address=a).stdout.splitlines() == [
        f"{4 * MiB}\t{2 * MiB}\t/du/x", f"{1000 + 4 * MiB}\t{1000 + 2 * MiB}\t/du"]
    rows = json.loads(tectofs("du", "-s", "--unique", "--json", "/du/x/three", address=a).stdout)
    assert rows == [{"path": "/du/x/three", "bytes": 2 * MiB, "unique": 2 * MiB, "files": 1, "dirs": 0}]
    fs.remove("/du/x/three")
    assert tectofs("du", "-s", "--unique", "/du", address=a).stdout == f"{1000 + 2 * MiB}\t{1000 + 2 * MiB}\t/du\n"
    assert fs.read_bytes("/du/x/two") == b"2" * (2 * MiB)
    df = json.loads(tectofs("df", "--json", address=a).stdout)
    assert df["capacity"] > df["used"] > 0 and df["free"] == df["capacity"] - df["used"] and df["meta"] == a
    text = tectofs("df", "-h", address=a).stdout.splitlines()
    assert text[0].split()[:5] == ["Cluster", "Size", "Used", "Avail", "Use%"] and text[1].startswith(a)


@contextlib.contextmanager
def _reaped(*processes: subprocess.Popen) -> Iterator[None]:
    """Processes a test started are killed and reaped however it ends."""
    try:
        yield
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def _piped_to_head(argv: list[str], address: str, head: list[str]) -> tuple[int, str]:
    """Run tectofs ARGV | HEAD; the exit status of tectofs and its stderr."""
    env = {**os.environ, "TECTOFS_META": address}
    producer = subprocess.Popen([sys.executable, "-m", "tectofs.cli", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
    consumer = subprocess.Popen(head, stdin=producer.stdout, stdout=subprocess.DEVNULL)
    assert producer.stdout is not None
    producer.stdout.close()  # only head reads it now
    with _reaped(producer, consumer):
        consumer.wait(timeout=60)
        _, stderr = producer.communicate(timeout=60)
    return producer.returncode, stderr.decode()


def _on_terminals(argv: list[str], address: str) -> tuple[int, str, str]:
    """Run tectofs ARGV with stdout and stderr on two pseudo-terminals (so both are ttys to
    it); its exit status and what each terminal received (CR LF read back as LF)."""
    out_master, out_slave = os.openpty()
    err_master, err_slave = os.openpty()
    received = {out_master: b"", err_master: b""}
    try:
        process = subprocess.Popen([sys.executable, "-m", "tectofs.cli", *argv], stdin=subprocess.DEVNULL,
                                   stdout=out_slave, stderr=err_slave, env={**os.environ, "TECTOFS_META": address})
        os.close(out_slave)
        os.close(err_slave)
        with _reaped(process):
            reading, deadline = set(received), time.monotonic() + 60
            while reading and time.monotonic() < deadline:
                for fd in select.select(list(reading), [], [], 1.0)[0]:
                    try:
                        data = os.read(fd, 1 << 16)
                    except OSError:  # EIO: the process closed its end of the terminal
                        data = b""
                    received[fd] += data
                    if not data:
                        reading.discard(fd)
            process.wait(timeout=30)
    finally:
        for fd in (out_master, err_master):
            os.close(fd)
    out, err = (received[fd].decode().replace("\r\n", "\n") for fd in (out_master, err_master))
    return process.returncode, out, err


def test_names_with_control_characters_are_escaped_on_a_terminal_only(cluster):
    """A name carrying an ESC sequence and a newline reaches a terminal as '?'s (ls -q, as
    coreutils ls does on a tty), in every command that shows it; through a pipe and in
    --json it is exact."""
    a, fs = cluster.address, cluster.fs
    evil = "red\x1b[31mname\nline"
    shown = "red?[31mname?line"
    fs.makedirs(f"/esc/{evil}dir")
    fs.write_bytes(f"/esc/{evil}", b"x")
    fs.symlink(f"/{evil}", "/esc/link")
    for argv in (["ls", "/esc"], ["ls", "-l", "/esc"], ["ls", "-R", "/esc"], ["stat", f"/esc/{evil}"],
                 ["stat", "/esc/link"], ["du", "/esc"]):
        code, out, err = _on_terminals(argv, a)
        assert code == 0, (argv, err)
        assert "\x1b" not in out and shown in out, (argv, out)
    assert f"-> /{shown}" in _on_terminals(["ls", "-l", "/esc"], a)[1]  # the symlink's target
    assert f"/esc/{shown}dir:" in _on_terminals(["ls", "-R", "/esc"], a)[1]  # -R's directory header
    code, out, err = _on_terminals(["cat", f"/esc/{evil}dir/none"], a)  # an error message quoting the path
    assert code == 1 and "\x1b" not in err and shown in err and len(err.splitlines()) == 1, err
    piped = tectofs("ls", "/esc", address=a).stdout
    assert piped == f"link\n{evil}\n{evil}dir\n"  # a pipe or a script gets the names as they are
    code, out, _ = _on_terminals(["ls", "--json", "/esc"], a)
    assert code == 0 and {e["name"] for e in json.loads(out)} == {evil, f"{evil}dir", "link"}


def test_broken_pipe_ends_quietly(cluster):
    a, fs = cluster.address, cluster.fs
    fs.write_bytes("/pipe.bin", os.urandom(4 * MiB))  # far more than a pipe holds: the writer must see EPIPE
    code, stderr = _piped_to_head(["cat", "/pipe.bin"], a, ["head", "-c", "10"])
    assert code == 141 and stderr == "", stderr
    for argv in (["status"], ["ls", "-lR", "/"]):
        code, stderr = _piped_to_head(argv, a, ["head", "-1"])
        assert code in (0, 141) and stderr == "", (argv, code, stderr)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as at a terminal, even when the suite runs in the background


def test_ctrl_c_exits_130_with_one_line_and_publishes_nothing(cluster):
    """Ctrl-C in the middle of a large put (from standard input, which keeps coming)."""
    put = subprocess.Popen([sys.executable, "-m", "tectofs.cli", "put", "-", "/ctrl-c.bin", "--meta", cluster.address],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=_default_sigint)
    assert put.stdin is not None
    with _reaped(put):
        put.stdin.write(os.urandom(6 * MiB))  # whole blocks go out; then the input stalls, open
        put.stdin.flush()
        deadline = time.monotonic() + 30
        while not cluster.fs.exists("/ctrl-c.bin") and time.monotonic() < deadline:
            time.sleep(0.05)  # the name appears (empty) once put is writing
        time.sleep(0.5)
        put.send_signal(signal.SIGINT)
        _, stderr = put.communicate(timeout=60)
    assert put.returncode == 130
    line = one_line_error(subprocess.CompletedProcess([], 130, "", stderr.decode()), "put")
    assert "interrupted" in line and "nothing" in line
    assert not cluster.fs.exists("/ctrl-c.bin")
    one = subprocess.run([sys.executable, "-m", "tectofs.cli", "put", "-q", "-", "/stdin.bin", "--meta", cluster.address],
                         input=b"from a pipe", capture_output=True, timeout=60)
    assert one.returncode == 0 and cluster.fs.read_bytes("/stdin.bin") == b"from a pipe"


def test_expected_errors_are_one_line_with_an_exit_status(cluster, tmp_path):
    a = cluster.address
    unreachable = tectofs("ls", "/", address="127.0.0.1:1", check=False)
    assert unreachable.returncode == 3 and "cannot connect to 127.0.0.1:1" in one_line_error(unreachable, "ls")
    missing = tectofs("get", "/no/such/file", str(tmp_path / "x"), address=a, check=False)
    assert missing.returncode == 1 and "no such file" in one_line_error(missing, "get").lower()
    cluster.fs.write_bytes("/plain", b"")
    not_dir = tectofs("ls", "/plain/x", address=a, check=False)
    assert not_dir.returncode == 1 and "not a directory" in one_line_error(not_dir, "ls")
    local_missing = tectofs("put", str(tmp_path / "nothing"), "/", address=a, check=False)
    assert local_missing.returncode == 1 and "no such file" in one_line_error(local_missing, "put").lower()
    bad = tectofs("mkdir", "/a/../b", address=a, check=False)
    assert bad.returncode == 1 and "invalid name" in one_line_error(bad, "mkdir")
    root = tectofs("rm", "-r", "/", address=a, check=False)
    assert root.returncode == 2 and "root directory" in one_line_error(root, "rm")
    nodir = tectofs("rm", "/", address=a, check=False)
    assert nodir.returncode == 1 and "-r" in one_line_error(nodir, "rm")
    no_meta = subprocess.run([sys.executable, "-m", "tectofs.cli", "ls"], capture_output=True, text=True, timeout=30,
                             env={**{k: v for k, v in os.environ.items() if k != "TECTOFS_META"},
                                  "TECTOFS_CONFIG": os.devnull})
    assert no_meta.returncode == 2 and "TECTOFS_META" in one_line_error(no_meta, "ls")
    # a FUSE mount without the 'fuse' extra: pyfuse3 made unimportable
    (tmp_path / "mnt").mkdir()
    code = ("import sys; sys.modules['pyfuse3'] = None; sys.argv = ['tectofs', 'mount', sys.argv[1]];"
            " from tectofs.cli import main; main()")
    no_fuse = subprocess.run([sys.executable, "-c", code, str(tmp_path / "mnt")], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "TECTOFS_META": a})
    assert no_fuse.returncode == 1 and "pip install 'tectofs[fuse]'" in one_line_error(no_fuse, "mount")


def test_port_in_use_is_one_line_and_server_logs_follow_the_format(cluster, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tectofs("meta", "--port", str(port), "--store", str(tmp_path / "m.db"), "--key-file",
                         cluster.key_file, "-v", "--log-format", "json", check=False)
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert lines[-1].startswith("tectofs meta: ") and "address already in use" in lines[-1]
    events = [json.loads(line) for line in lines[:-1]]  # the server's own log lines, as JSON (-v: INFO and up)
    assert events and all({"ts", "level", "logger", "msg"} <= set(e) for e in events)


@pytest.mark.slow  # starts processes
def test_up_on_a_port_in_use_says_why_in_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = tectofs("up", "--root", str(tmp_path / "root"), "--port", str(port), "--servers", "1", "--policy",
                         "rep(1)", "--check", "--no-metrics", check=False, timeout=120)
    error = one_line_error(result, "up")
    assert result.returncode == 1
    assert "the metadata service exited with code 1" in error and "address already in use" in error
    assert "tectofs.cli meta --store" not in error and str(tmp_path / "root" / "logs" / "meta.log") in error


@pytest.mark.slow  # starts processes
def test_up_refuses_fewer_servers_than_its_policy_writes_to(tmp_path):
    result = tectofs("up", "--root", str(tmp_path / "root"), "--servers", "3", "--check", check=False)
    error = one_line_error(result, "up")
    assert result.returncode == 2 and "3 chunk servers cannot take a write under rs(4,2)" in error
    assert "--policy rep(3)" in error and not (tmp_path / "root").exists()


def test_config_file_and_precedence(cluster, tmp_path):
    a = cluster.address
    config = tmp_path / "config.toml"
    config.write_text('meta = "127.0.0.1:1"\n')
    env = {"TECTOFS_CONFIG": str(config)}
    base = {k: v for k, v in os.environ.items() if k != "TECTOFS_META"}
    run = lambda *argv, **kw: subprocess.run([sys.executable, "-m", "tectofs.cli", *argv], capture_output=True,  # noqa: E731
                                             text=True, timeout=60, env={**base, **env, **kw})
    from_file = run("ls", "/")
    assert from_file.returncode == 3 and "127.0.0.1:1" in from_file.stderr  # the file is used ...
    assert run("ls", "/", TECTOFS_META=a).returncode == 0  # ... the environment beats it ...
    assert run("ls", "/", "--meta", a, TECTOFS_META="127.0.0.1:1").returncode == 0  # ... and the flag beats both
    assert run("--meta", a, "ls", "/", TECTOFS_META="127.0.0.1:1").returncode == 0  # before the command too
    config.write_text(f'meta = "{a}"\ncredentials = "{tmp_path}/missing.credentials"\n')
    missing = run("whoami")
    assert missing.returncode != 0 and "missing.credentials" in missing.stderr
    assert "root" in run("whoami", TECTOFS_CREDENTIALS=cluster.credential_file).stdout
    config.write_text('metaa = "typo"\n')
    typo = run("ls", "/", TECTOFS_META=a)
    assert typo.returncode == 2 and "unknown key" in one_line_error(typo, "ls")


def test_log_formats_and_log_file(cluster, tmp_path):
    a = cluster.address
    kv = tectofs("ls", "/", "--log-level", "debug", "--log-format", "kv", address=a).stderr.splitlines()
    assert kv and all(re.match(r'ts=\S+ level=\w+ logger=\S+ msg=".*"', line) for line in kv), kv
    js = tectofs("--log-format", "json", "ls", "/", "--log-level", "debug", address=a).stderr.splitlines()
    assert js and all(json.loads(line)["level"] in ("debug", "info", "warning") for line in js), js
    log = tmp_path / "client.log"
    quiet = tectofs("ls", "/", "--log-level", "debug", "--log-format", "json", "--log-file", str(log), address=a)
    assert quiet.stderr == "" and all("msg" in json.loads(line) for line in log.read_text().splitlines())


def test_mount_daemon_logs_to_a_file(cluster, tmp_path):
    from tests.test_fuse import _REASON

    if _REASON is not None:
        pytest.skip(_REASON)
    where, log = tmp_path / "mnt", tmp_path / "mount.log"
    where.mkdir()
    tectofs("mount", str(where), "--daemon", "-v", "--log-format", "json", "--log-file", str(log),
            address=cluster.address)
    try:
        assert os.path.ismount(where)
    finally:
        subprocess.run(["fusermount3", "-u", str(where)], capture_output=True, timeout=60)
    events = [json.loads(line) for line in log.read_text().splitlines()]  # the daemon's events, not /dev/null
    assert any(e["logger"] == "tectofs.fuse" for e in events), events


@pytest.mark.slow  # starts processes
def test_version_and_completion():
    from importlib.metadata import version

    assert tectofs("--version").stdout == f"tectofs {version('tectofs')}\n"
    script = tectofs("completion", "bash").stdout
    assert "complete -o default -F _tectofs tectofs" in script and '" put") words="' in script
    assert "--recursive" in script.split('" put") words="')[1].split(";")[0]
    complete = ('source /dev/stdin; for words in "tectofs pu" "tectofs put --rec" "tectofs user a"'
                ' "tectofs --log-format json ls --hum"; do COMP_WORDS=($words); COMP_CWORD=$((${#COMP_WORDS[@]}-1));'
                ' _tectofs; echo "${COMPREPLY[*]}"; done')
    done = subprocess.run(["bash", "-c", complete], input=script, capture_output=True, text=True, timeout=30)
    assert done.stdout.splitlines() == ["put", "--recursive", "add", "--human-readable"], done.stderr


@pytest.mark.parametrize("command", ["up", "meta", "chunk", "put", "get", "cp", "cat", "ls", "stat", "du", "df",
                                     "mount", "status", "fsck", "gc", "completion"])
@pytest.mark.slow  # starts processes
def test_help_is_helpful(command):
    out = tectofs(command, "--help").stdout
    assert "usage: tectofs" in out and "--log-format" in out and "--" in out


@pytest.mark.slow  # starts processes
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
