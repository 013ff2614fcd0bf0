"""Style as a test: things this code base never does."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _library_files() -> list[pathlib.Path]:
    files = []
    for directory in ("tectofs", "client", "server"):
        for path in (ROOT / directory).rglob("*.py"):
            rel = path.relative_to(ROOT).parts
            if rel[0] == "tectofs" and len(rel) > 1 and rel[1] in ("client", "server"):
                continue  # the symlinks: same files as client/ and server/
            files.append(path)
    return files


def test_no_top_level_client_or_server_imports():
    for path in _library_files() + list((ROOT / "tests").rglob("*.py")) + list((ROOT / "bench").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in ("client", "server"), f"{path}: import {name} (use tectofs.{name})"


def test_no_print_in_library_code():
    allowed = {"cli.py", "bench.py"}  # and the command modules under tectofs/cli/
    for path in _library_files():
        if path.name in allowed or path.parent.name == "cli":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                raise AssertionError(f"{path}:{node.lineno}: print() in library code (use logging)")


def test_modules_stay_small():
    for path in _library_files():
        lines = len(path.read_text().splitlines())
        assert lines <= 800, f"{path} has {lines} lines: split it"


def test_symlinks_are_in_place():
    assert (ROOT / "tectofs" / "client").resolve() == ROOT / "client"
    assert (ROOT / "tectofs" / "server").resolve() == ROOT / "server"
