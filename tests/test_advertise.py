"""Advertised addresses and metrics URLs (``server/addresses.py``): the rules, the registry's
new column (and its migration), old peers, the bound of the ``servers`` reply, and a cluster
whose ``servers``/``stats`` replies name every metrics endpoint. The multi-host case itself is
``test_multihost_netns.py``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import msgspec
import pytest

from tectofs import limits
from tectofs.cli.servers import _without_password
from tectofs.errors import InvalidArgument
from tectofs.server import addresses
from tectofs.server.cluster import LocalCluster
from tectofs.store import SqlStore
from tectofs.store.dialect import SqliteDialect
from tectofs.store.registry import SERVER_STATS_KEPT
from tectofs.wire import auth, messages
from tests.test_reply_bounds import _fits, _long_address, _register

REPO = Path(__file__).resolve().parent.parent


def test_address_rules() -> None:
    assert addresses.split("10.0.0.5") == ("10.0.0.5", None)
    assert addresses.split("host.example:7421") == ("host.example", 7421)
    assert addresses.split("[fd00::5]:7421") == ("fd00::5", 7421)
    assert addresses.split("fd00::5") == ("fd00::5", None)
    for bad in ("0.0.0.0", "0.0.0.0:7421", "[::]:1", ":7421", "h:0", "h:70000", "h:x", "[fd00::5"):
        with pytest.raises(InvalidArgument):
            addresses.split(bad)
    # The address given out: --advertise (port defaulting to the bound one), else the bound one.
    assert addresses.advertised("0.0.0.0:7421", "10.0.0.5") == "10.0.0.5:7421"
    assert addresses.advertised("0.0.0.0:7421", "10.0.0.5:17421") == "10.0.0.5:17421"
    assert addresses.advertised("[::]:7421", "fd00::5") == "[fd00::5]:7421"
    assert addresses.advertised("10.0.0.5:7421", None) == "10.0.0.5:7421"
    assert addresses.advertised("0.0.0.0:7421", None) is None
    # The metrics URL: the metrics host if specific, else the advertised host, else refused.
    assert addresses.metrics_url("10.0.0.9:9101", "10.0.0.5:7421") == "http://10.0.0.9:9101/metrics"
    assert addresses.metrics_url("0.0.0.0:9101", "10.0.0.5:7421") == "http://10.0.0.5:9101/metrics"
    assert addresses.metrics_url("[::]:9101", "[fd00::5]:7421") == "http://[fd00::5]:9101/metrics"
    with pytest.raises(InvalidArgument, match="--advertise"):
        addresses.metrics_url("0.0.0.0:9101", None)


def test_local_cluster_on_a_wildcard_needs_advertise(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="--advertise HOST"):
        LocalCluster(str(tmp_path), host="0.0.0.0")


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tectofs.cli", *args], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, **env})


@pytest.mark.slow  # starts processes
def test_servers_on_a_wildcard_refuse_in_one_line(tmp_path: Path) -> None:
    key = str(tmp_path / "cluster.key")
    auth.create_key_file(key)
    # --meta from $TECTOFS_META; refused before listening (nothing is bound to 0.0.0.0 here)
    done = _cli("chunk", "--data", str(tmp_path / "d"), "--key-file", key, "--host", "0.0.0.0",
                TECTOFS_META="127.0.0.1:9")
    assert done.returncode not in (0, None)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--advertise HOST[:PORT]" in lines[0] and "Traceback" not in done.stderr, done.stderr
    refused = _cli("chunk", "--data", str(tmp_path / "d"), "--meta", "127.0.0.1:9", "--key-file", key,
                   "--advertise", "0.0.0.0:7421")
    assert refused.returncode == 2 and "not a wildcard" in refused.stderr
    up = _cli("up", "--root", str(tmp_path / "up"), "--host", "0.0.0.0")
    assert up.returncode != 0 and up.stderr.count("\n") == 1 and "--advertise HOST" in up.stderr, up.stderr
    assert not (tmp_path / "up").exists()
    up = _cli("up", "--root", str(tmp_path / "up"), "--host", "0.0.0.0", "--advertise", "10.0.0.5:7420")
    assert up.returncode == 2 and "host only" in up.stderr


def test_store_passwords_are_not_printed() -> None:
    assert _without_password("postgresql://u:s%40cret@db:5432/t") == "postgresql://u:***@db:5432/t"
    assert _without_password("postgresql://u@db/t") == "postgresql://u@db/t"
    assert _without_password("/var/lib/tectofs/meta.db") == "/var/lib/tectofs/meta.db"


def _store(path: Path) -> SqlStore:
    store = SqlStore(SqliteDialect(str(path)), gc_delay_s=0)
    return store


def test_registry_keeps_metrics_urls_and_migrates_an_older_store(tmp_path: Path) -> None:
    db = tmp_path / "meta.db"
    store = _store(db)
    store.tx_begin()
    a = store.register_server("uuid-a", "10.0.0.1:7421", 1 << 40, 0, "http://10.0.0.1:9101/metrics")
    b = store.register_server("uuid-b", "10.0.0.2:7421", 1 << 40, 0)
    store.tx_commit()
    store.conn.close()
    # An older release's store: no metrics_url column.
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE servers DROP COLUMN metrics_url")
    store = _store(db)  # the column is added when the store opens
    store.tx_begin()
    assert [s.metrics_url for s in store.servers()] == [None, None]
    store.heartbeat(a, 1 << 40, 0, 0, 0, "10.0.0.1:7421", metrics_url="http://10.0.0.1:9101/metrics")
    store.heartbeat(b, 1 << 40, 0, 0, 0)
    urls = {s.server_id: s.metrics_url for s in store.servers()}
    assert urls == {a: "http://10.0.0.1:9101/metrics", b: None}
    store.heartbeat(a, 1 << 40, 0, 0, 0)  # a heartbeat without one (a server of 0.1.0) changes nothing
    assert store.servers()[0].metrics_url == "http://10.0.0.1:9101/metrics"
    store.register_server("uuid-a", "10.0.0.1:7421", 1 << 40, 0)  # restarted with metrics off
    assert store.servers()[0].metrics_url is None
    store.tx_commit()


def test_old_and_new_peers_understand_each_other() -> None:
    old_heartbeat = {"server_id": 1, "address": "10.0.0.1:7421", "capacity": 1}
    assert messages.convert(old_heartbeat, messages.HeartbeatRequest).metrics_url is None
    old_info = {"server_id": 1, "uuid": "u", "address": "10.0.0.1:7421", "capacity": 0, "used": 0, "inflight": 0,
                "chunks": 0, "last_heartbeat": 0.0, "live": True}
    assert messages.convert(old_info, messages.ServerInfo).metrics_url is None
    old_stats = {"uptime_s": 1.0, "store": {}, "counts": {}, "bad_chunk_reports": 0, "busy_answers": 0,
                 "invalid_requests": 0, "queued": 0}
    stats = messages.convert(old_stats, messages.StatsReply)
    assert stats.metrics_url is None and stats.address is None

    class OldRegister(messages.Message, frozen=True, kw_only=True):  # what a metadata service of 0.1.0 declares
        uuid: str
        address: str

    new = msgspec.to_builtins(messages.RegisterServerRequest(uuid="u", address="10.0.0.1:7421",
                                                             metrics_url="http://10.0.0.1:9101/metrics"))
    assert messages.convert(new, OldRegister).address == "10.0.0.1:7421"  # the new field is ignored
    with pytest.raises(msgspec.ValidationError, match="metrics_url"):
        messages.convert({**old_heartbeat, "metrics_url": "file:///etc/passwd"}, messages.HeartbeatRequest)


def test_servers_reply_with_every_metrics_url_fits(tmp_path: Path) -> None:
    store = _store(tmp_path / "meta.db")
    store.tx_begin()
    _register(store, limits.servers_max)
    longest_url = "http://" + "h" * (limits.address_length_max_bytes + 32 - len("http://"))
    for server_id in range(1, limits.servers_max + 1):  # every server reporting all it may
        store.heartbeat(server_id, 2**62, 2**62, 2**62, 2**62, _long_address(server_id),
                        stats={f"key{i:060d}": 2**62 for i in range(64)} | dict.fromkeys(SERVER_STATS_KEPT, 2**62),
                        metrics_url=messages.convert(longest_url, messages.MetricsUrl))
    _fits(messages.ServersReply(servers=store.servers()))


def test_servers_and_stats_name_every_metrics_endpoint(make_cluster) -> None:
    cluster = make_cluster(servers=3, policy="rs(2,1)", metrics=True)
    servers = cluster.fs.servers()
    by_address = {s.address: s.metrics_url for s in servers}
    for i in range(3):
        address = (Path(cluster.root) / f"chunk-{i}.address").read_text().strip()
        assert by_address[address] == cluster.metrics_urls[f"chunk-{i}"]
    stats = cluster.fs.run(cluster.fs.aio.metadata.stats())
    assert stats.metrics_url == cluster.metrics_urls["meta"] and stats.address == cluster.address
    for url in [stats.metrics_url, *by_address.values()]:
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
    plain = make_cluster(servers=3, policy="rs(2,1)")
    assert [s.metrics_url for s in plain.fs.servers()] == [None] * 3
    assert plain.fs.run(plain.fs.aio.metadata.stats()).metrics_url is None
