"""tectofs.logs: one line per event as text, key=value or JSON; a log file that survives rotation."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Iterator

import pytest

from tectofs import logs


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in list(logs._installed):
            root.removeHandler(h)
            h.close()
        logs._installed.clear()
        root.handlers[:] = handlers
        root.setLevel(level)


def _emit(file: str, fmt: str) -> list[str]:
    logs.setup("info", fmt, file)
    log = logging.getLogger("tectofs.test")
    log.debug("below the level")
    log.info('said "hi" to %s', "x y", extra={"server_id": 3, "path": "/a b", "ok": True})
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.warning("failed", exc_info=True)
    with open(file) as f:
        return f.read().splitlines()


def test_kv_is_one_line_per_event_with_fields(tmp_path, restore_root):
    lines = _emit(str(tmp_path / "kv.log"), "kv")
    assert len(lines) == 2  # debug filtered; the traceback stays inside its event's line
    assert re.fullmatch(r'ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=info logger=tectofs\.test '
                        r'msg="said \\"hi\\" to x y" server_id=3 path="/a b" ok=true', lines[0]), lines[0]
    assert lines[1].startswith("ts=") and " level=warning " in lines[1] and 'exc="Traceback' in lines[1]
    assert "ValueError: bad\\nthing" in lines[1]


def test_json_is_one_object_per_line(tmp_path, restore_root):
    lines = _emit(str(tmp_path / "json.log"), "json")
    first, second = (json.loads(line) for line in lines)
    assert first["msg"] == 'said "hi" to x y' and first["level"] == "info" and first["logger"] == "tectofs.test"
    assert (first["server_id"], first["path"], first["ok"]) == (3, "/a b", True)
    assert second["level"] == "warning" and "ValueError: bad\nthing" in second["exc"]


def test_text_keeps_todays_format(tmp_path, restore_root):
    lines = _emit(str(tmp_path / "text.log"), "text")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} tectofs\.test INFO said \"hi\" to x y", lines[0])


def test_log_file_is_reopened_after_rotation(tmp_path, restore_root):
    path = str(tmp_path / "daemon.log")
    logs.setup("info", "json", path)
    assert logs.log_file() == path
    logging.getLogger("tectofs.test").info("before")
    os.rename(path, path + ".1")  # what logrotate does
    logging.getLogger("tectofs.test").info("after")
    assert [json.loads(x)["msg"] for x in open(path + ".1")] == ["before"]
    assert [json.loads(x)["msg"] for x in open(path)] == ["after"]


def test_setup_twice_replaces_its_handler_and_rejects_unknown_names(restore_root):
    logs.setup("warning", "text")
    logs.setup("error", "kv")
    assert len(logs._installed) == 1 and logging.getLogger().level == logging.ERROR
    with pytest.raises(ValueError, match="unknown log format"):
        logs.setup("info", "xml")
    with pytest.raises(ValueError, match="unknown log level"):
        logs.setup("loud", "text")


def test_environment_gives_the_defaults(monkeypatch, restore_root):
    monkeypatch.setenv(logs.LEVEL_ENV, "debug")
    monkeypatch.setenv(logs.FORMAT_ENV, "json")
    logs.setup()
    assert logging.getLogger().level == logging.DEBUG
    assert isinstance(logs._installed[0].formatter, logs.JsonFormatter)
