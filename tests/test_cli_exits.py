"""Exit statuses of every ``tectofs`` command, as README's table gives them: 2 for usage and
configuration errors (a bad option, a missing credential file, ``--meta`` without a port, an
address where no tectofs server answers the hello), ``tectofs fsck`` 16 instead (its 1 and 2
are its findings); each failure one line, ``tectofs CMD: message``, no traceback.

One test walks every command the parser has. It stays cheap: one child process runs
``tectofs.cli.main`` for every case in turn (each a fresh parse, as a separate run would be),
against a socket that answers like no tectofs server; no cluster is started. ``fsck`` on a
path that does not exist (8, not its "under-redundant" 1): tests/test_cli_safety.py."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
from typing import Iterator

import pytest

from tectofs.cli import build_parser
from tectofs.cli.exits import FSCK_USAGE, USAGE
from tectofs.wire import auth

# A value for each positional argument, by its dest (any value that gets the command as far
# as connecting: the configuration is checked first).
POSITIONAL: dict[str, str | list[str]] = {"src": ["tectofs:/a"], "dst": "/tmp/tectofs-exits-never-written", "paths": ["/"], "path": "/",
                                          "server": "1", "name": "alice", "id": "k1", "shell": "bash"}
REQUIRED: dict[str, str] = {"--uid": "1", "--gid": "1", "--key-file": "/nonexistent.key", "--root": "/nonexistent",
                            "--data": "/nonexistent"}
EXTRA: dict[tuple[str, ...], list[str]] = {("set-policy",): ["/", "--policy", "rep(3)"], ("put",): ["/etc/hostname", "/a"],
                                           ("get",): ["/a", "-"],
                                           ("cp",): ["tectofs:/a", "/tmp/tectofs-exits-never-written"]}


def commands() -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
    """Every command (``ls``, ``admin drain`` ...) and its parser."""
    def walk(parser: argparse.ArgumentParser, words: list[str]) -> Iterator[tuple[list[str], argparse.ArgumentParser]]:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    yield from walk(child, [*words, name])
                return
        yield words, parser

    yield from walk(build_parser(), [])


def arguments(words: list[str], parser: argparse.ArgumentParser, mountpoint: str) -> list[str]:
    if tuple(words) in EXTRA:
        return EXTRA[tuple(words)]
    out: list[str] = []
    for action in parser._actions:
        if action.option_strings:
            if action.required:
                out += [action.option_strings[0], REQUIRED[action.option_strings[0]]]
        elif action.dest == "mountpoint":
            out.append(mountpoint)
        elif action.dest in POSITIONAL:
            value = POSITIONAL[action.dest]
            out += value if isinstance(value, list) else [value]
    return out


_CHILD = r"""
import contextlib, io, json, sys
import tectofs.cli
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    code = 0
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.TextIOWrapper(io.BytesIO())):
        try:
            tectofs.cli.main(argv)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if not isinstance(exc.code, int) and exc.code is not None:
                err.write(str(exc.code) + "\n")
    results.append({"argv": argv, "code": code, "stderr": err.getvalue()})
print(json.dumps(results))
"""


def _not_tectofs() -> tuple[str, socket.socket]:
    """A listening socket whose peer answers every connection with HTTP (and then waits for
    the client to hang up): no tectofs server."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)

    def answer(conn: socket.socket) -> None:
        with conn:
            try:
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                while conn.recv(1 << 16):  # until the client hangs up
                    pass
            except OSError:
                pass

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return f"127.0.0.1:{listener.getsockname()[1]}", listener


@pytest.mark.slow  # starts a process
@pytest.mark.timeout(180)
def test_every_command_exits_as_the_table_says_on_usage_and_configuration_errors(tmp_path):
    (tmp_path / "config.toml").write_text("")  # not the user's
    credential = str(tmp_path / "someone.credentials")
    auth.Credential(user="someone", secret=b"\x01" * 32).save(credential)
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    address, listener = _not_tectofs()
    cases: list[tuple[list[str], int, str]] = []  # argv, status, what the message says
    walked = []
    for words, parser in commands():
        walked.append(" ".join(words))
        usage = FSCK_USAGE if words == ["fsck"] else USAGE
        if words != ["bench"]:  # bench passes every argument to its own parser (checked below)
            cases.append(([*words, "--no-such-option"], usage, ""))  # or what it is missing: one line all the same
        if "--credentials" not in parser._option_string_actions:
            continue  # not a client command
        args = arguments(words, parser, str(mountpoint))
        cases.append(([*words, *args, "--meta", address, "--credentials", str(tmp_path / "missing")], usage,
                      "credential file"))
        cases.append(([*words, *args, "--meta", "127.0.0.1", "--credentials", credential], usage, "bad address"))
        if words != ["s3", "keys"]:  # it shows the credential's S3 keys without asking the cluster
            cases.append(([*words, *args, "--meta", address, "--credentials", credential], usage, "not a tectofs server"))
    cases.append((["bench", "--no-such-option"], USAGE, "bench"))
    assert {"ls", "put", "get", "fsck", "admin drain", "user add", "mount", "gc", "s3 keys", "up", "completion",
            "check"} <= set(walked)
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps([argv for argv, _, _ in cases])], capture_output=True,
                              text=True, timeout=150, env={**os.environ, "TECTOFS_CONFIG": str(tmp_path / "config.toml"),
                                                           "TECTOFS_META": "", "TECTOFS_CREDENTIALS": ""})
    finally:
        listener.close()
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    wrong = []
    for (argv, status, says), result in zip(cases, results):
        lines = result["stderr"].strip().splitlines()
        if result["code"] != status or "Traceback" in result["stderr"] or says not in result["stderr"] or (
                argv[0] != "bench" and len(lines) != 1) or not lines[-1].startswith("tectofs"):
            wrong.append((" ".join(argv), result["code"], status, result["stderr"][-500:]))
    assert not wrong, "\n".join(map(str, wrong))
