"""Client-side metrics (``tectofs.metrics``: the process-wide client registry): what the client
library, the PyTorch plugin and the S3 gateway count under real traffic on a local cluster,
the client endpoint served over HTTP, and the Grafana dashboard checked against the names
every role really exports."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tectofs import errors, metrics
from tests import test_metrics
from tests.test_metrics import scrape, value

MiB = 1 << 20
DASHBOARD = os.path.join(os.path.dirname(__file__), "..", "deploy", "grafana", "tectofs-dashboard.json")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def local() -> Samples:
    """This process's client registry, as a scrape would parse it."""
    from prometheus_client import generate_latest

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(generate_latest(metrics.client_registry()).decode())
            for s in family.samples}


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


# A cluster of this module's own whose servers serve metrics too (the dashboard test scrapes every role).
metrics_cluster = test_metrics.metrics_cluster


def test_bytes_and_request_latencies_of_a_write_and_a_read(metrics_cluster):
    fs = metrics_cluster.fs
    data = os.urandom(3 * MiB + 17)  # 4 blocks of 1 MiB, rs(4,2)
    before = local()
    fs.write_bytes("/counted", data)
    written = local()
    assert fs.read_bytes("/counted") == data
    after = local()

    assert moved(before, written, "tectofs_client_bytes_written_total") == len(data)
    assert moved(written, after, "tectofs_client_bytes_read_total") == len(data)
    assert moved(before, written, "tectofs_client_bytes_read_total") == 0
    for op in ("create", "allocate", "commit"):
        assert moved(before, written, "tectofs_client_meta_requests_total", op=op, outcome="ok") >= 1, op
        assert moved(before, written, "tectofs_client_meta_request_seconds_count", op=op) >= 1, op
    assert moved(before, written, "tectofs_client_meta_request_seconds_sum", op="commit") > 0
    # every block needs write_min (5) of its 6 chunks; parity makes the bytes sent 1.5x the data
    assert moved(before, written, "tectofs_client_chunk_requests_total", op="put_chunk", outcome="ok") >= 4 * 5
    assert moved(before, written, "tectofs_client_chunk_bytes_total", op="put_chunk") >= len(data) * 5 / 4
    assert moved(before, written, "tectofs_client_chunk_request_seconds_count", op="put_chunk") >= 4 * 5
    assert moved(written, after, "tectofs_client_chunk_bytes_total", op="get_chunk") >= len(data)
    assert moved(written, after, "tectofs_client_chunk_requests_total", op="get_chunk", outcome="ok") >= 4 * 4


def test_errors_are_counted_by_code(metrics_cluster):
    before = local()
    with pytest.raises(FileNotFoundError):
        metrics_cluster.fs.stat("/not-there")
    assert moved(before, local(), "tectofs_client_meta_requests_total", op="lookup", outcome="not_found") == 1


def test_a_corrupt_chunk_counts_a_checksum_failure_and_a_degraded_read(metrics_cluster):
    c = metrics_cluster
    data = os.urandom(MiB)
    c.fs.write_bytes("/corrupt", data)
    c.flip_chunk_byte("/corrupt", 0, 1, 100)  # a data chunk: read on every read
    before = local()
    assert c.fs.read_bytes("/corrupt") == data
    after = local()
    assert moved(before, after, "tectofs_client_checksum_failures_total") == 1
    assert moved(before, after, "tectofs_client_degraded_reads_total") == 1
    assert moved(before, after, "tectofs_client_bad_chunk_reports_total") == 1


def test_busy_answers_and_failovers_count_as_retries(metrics_cluster, monkeypatch):
    import tectofs.client
    from tectofs.wire.client import _ClientConnection

    real_call = _ClientConnection.call
    busy_once = {"left": 1}

    async def busy_first(self: _ClientConnection, header: dict[str, Any], payload: Any, timeout_s: float,
                         receive_into: Any = None) -> Any:
        if header.get("op") == "lookup" and busy_once["left"]:
            busy_once["left"] -= 1
            raise errors.Busy("store queue full (test)")
        return await real_call(self, header, payload, timeout_s, receive_into)

    monkeypatch.setattr(_ClientConnection, "call", busy_first)
    before = local()
    metrics_cluster.fs.stat("/")
    after_busy = local()
    assert moved(before, after_busy, "tectofs_client_retries_total", service="meta", reason="busy") == 1
    assert moved(before, after_busy, "tectofs_client_meta_requests_total", op="lookup", outcome="ok") == 1
    monkeypatch.undo()

    # a failover group whose first member is down: the call moves to the next one at once
    with tectofs.client.connect(f"127.0.0.1:1,{metrics_cluster.address}",
                                credentials=metrics_cluster.credential_file) as fs:
        fs.stat("/")
    assert moved(after_busy, local(), "tectofs_client_retries_total", service="meta", reason="failover") >= 1


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP: "torch.distributed is ... uninitialized"
def test_dcp_save_and_load_record_their_phases(metrics_cluster, caplog):
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    import tectofs.torch as tt

    run = f"tectofs://{metrics_cluster.address}/ckpt-metrics"
    state = {"w": torch.randn(256, 256), "b": torch.randn(256), "step": 3}
    nbytes = (256 * 256 + 256) * 4
    before = local()
    with caplog.at_level(logging.INFO, logger="tectofs.torch"):
        dcp.save(state, checkpoint_id=f"{run}/step_1")
        out = {"w": torch.zeros(256, 256), "b": torch.zeros(256), "step": 0}
        dcp.load(out, checkpoint_id=f"{run}/step_1")
        writer = tt.CheckpointWriter()
        future = dcp.async_save(state, checkpoint_id=f"{run}/step_2", storage_writer=writer)
        assert isinstance(future, Future)  # (an AsyncSaveResponse comes of a future-staging stager only)
        future.result(timeout=60)
        writer.close()
    after = local()
    assert torch.equal(out["w"], state["w"]) and out["step"] == 3

    assert moved(before, after, "tectofs_checkpoint_save_seconds_count", phase="upload") == 2
    assert moved(before, after, "tectofs_checkpoint_save_seconds_count", phase="commit") == 2
    assert moved(before, after, "tectofs_checkpoint_save_seconds_count", phase="stage") == 1  # the async one
    assert moved(before, after, "tectofs_checkpoint_save_seconds_sum", phase="upload") > 0
    assert moved(before, after, "tectofs_checkpoint_load_seconds_count", phase="read") == 1
    assert moved(before, after, "tectofs_checkpoint_load_seconds_count", phase="verify") == 1
    assert moved(before, after, "tectofs_checkpoint_async_save_seconds_count", part="blocking") == 1
    assert moved(before, after, "tectofs_checkpoint_saved_bytes_total") >= 2 * nbytes
    assert moved(before, after, "tectofs_checkpoint_loaded_bytes_total") >= nbytes
    assert value(after, "tectofs_checkpoint_last_save_seconds", phase="commit") > 0
    assert value(after, "tectofs_checkpoint_last_save_bytes") >= nbytes
    assert value(after, "tectofs_checkpoint_last_load_seconds", phase="read") > 0

    lines = [r.getMessage() for r in caplog.records if r.name == "tectofs.torch"]
    saved = [line for line in lines if line.startswith("checkpoint saved ")]
    assert len(saved) == 2
    assert f"uri={run}/step_1 rank=0 bytes=" in saved[0]
    assert re.search(r" upload_s=\d+\.\d{3} commit_s=\d+\.\d{3}$", saved[0]), saved[0]
    assert re.search(r" stage_s=\d+\.\d{3} upload_s=\d+\.\d{3} commit_s=\d+\.\d{3}$", saved[1]), saved[1]
    assert any(re.search(r"^checkpoint loaded .* read_s=\d+\.\d{3} verify_s=\d+\.\d{3}$", line) for line in lines)


def test_the_background_part_of_an_async_save_is_recorded_when_it_ends():
    from concurrent.futures import Future

    from tectofs.torch._timing import track_async_save

    class Writer:
        checkpoint_id, rank = "tectofs://h:1/x", 0

    before = local()
    upload: Future[None] = Future()
    track_async_save(upload, 0.0, Writer())
    assert moved(before, local(), "tectofs_checkpoint_async_save_seconds_count", part="background") == 0
    upload.set_result(None)
    assert moved(before, local(), "tectofs_checkpoint_async_save_seconds_count", part="background") == 1


def test_s3_requests_by_operation_and_status(metrics_cluster):
    pytest.importorskip("aiohttp")
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config
    from botocore.exceptions import ClientError

    from tectofs.s3.principals import keys_of
    from tectofs.s3.server import S3Gateway
    from tectofs.wire import auth

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=30)

    async def make() -> S3Gateway:
        return S3Gateway(metrics_cluster.address, metrics_cluster.key_file)

    gateway = run(make())
    try:
        endpoint = f"http://{run(gateway.start('127.0.0.1', 0))}"
        access, secret = keys_of(auth.Credential.root_from_keys(auth.KeyRing(metrics_cluster.key_file)))
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                          region_name="us-east-1", config=Config(s3={"addressing_style": "path"},
                                                                 retries={"max_attempts": 1}))
        body = os.urandom(300_000)
        before = local()
        s3.create_bucket(Bucket="s3-counted")
        s3.put_object(Bucket="s3-counted", Key="a/b.bin", Body=body)
        assert s3.get_object(Bucket="s3-counted", Key="a/b.bin")["Body"].read() == body
        with pytest.raises(ClientError):
            s3.head_object(Bucket="s3-counted", Key="missing")
        with pytest.raises(urllib.error.HTTPError) as refused:  # unsigned: refused
            urllib.request.urlopen(f"{endpoint}/s3-counted/a/b.bin", timeout=30)
        assert refused.value.code == 403
    finally:
        after = local()
        run(gateway.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
    assert moved(before, after, "tectofs_s3_requests_total", operation="create_bucket", status="200") == 1
    assert moved(before, after, "tectofs_s3_requests_total", operation="put_object", status="200") == 1
    assert moved(before, after, "tectofs_s3_requests_total", operation="get_object", status="200") == 1
    assert moved(before, after, "tectofs_s3_requests_total", operation="head_object", status="404") == 1
    assert moved(before, after, "tectofs_s3_requests_total", operation="get_object", status="403") == 1
    assert moved(before, after, "tectofs_s3_request_seconds_count", operation="put_object") == 1
    assert moved(before, after, "tectofs_s3_bytes_in_total") >= len(body)
    assert len(body) <= moved(before, after, "tectofs_s3_bytes_out_total") < 2 * len(body)
    # the gateway's own client counts in the same registry
    assert moved(before, after, "tectofs_client_bytes_written_total") >= len(body)


def test_the_client_registry_is_served_over_http(metrics_cluster):
    metrics_cluster.fs.write_bytes("/served", b"x" * 1000)
    address = metrics.serve_client("127.0.0.1", 0)
    samples = scrape(metrics.url(address))
    assert value(samples, "tectofs_client_bytes_written_total") >= 1000
    assert value(samples, "tectofs_client_meta_request_seconds_count", op="commit") >= 1
    assert ("tectofs_client_retries_total", (("reason", "busy"), ("service", "chunk"))) in samples  # made at start


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_environment_variable_serves_once_per_process_at_the_ranks_port(monkeypatch):
    port = _free_port()
    monkeypatch.setattr(metrics, "_served_once", {})
    monkeypatch.setenv(metrics.METRICS_ENV, f"127.0.0.1:{port - 1}")
    monkeypatch.setenv("LOCAL_RANK", "1")
    address = metrics.serve_client_if_asked()
    assert address == f"127.0.0.1:{port}"
    assert metrics.serve_client_if_asked() == address  # once per process
    assert "tectofs_client_bytes_written_total" in {name for name, _ in scrape(metrics.url(address))}

    monkeypatch.setattr(metrics, "_served_once", {})
    monkeypatch.setenv(metrics.METRICS_ENV, "no-port")
    assert metrics.serve_client_if_asked() is None  # a warning, never a failure of the client


def test_serving_at_the_first_connection(metrics_cluster, monkeypatch):
    """What a --daemon mount needs: asked before its fork, served by its first client after it."""
    import tectofs.client

    port = _free_port()
    monkeypatch.setattr(metrics, "_served_once", {})
    monkeypatch.setattr(metrics, "_asked", None)
    monkeypatch.delenv(metrics.METRICS_ENV, raising=False)
    metrics.serve_client_on_connect("127.0.0.1", port)
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    with tectofs.client.connect(metrics_cluster.address, credentials=metrics_cluster.credential_file) as fs:
        fs.write_bytes("/first-connection", b"z" * 100)
        samples = scrape(f"http://127.0.0.1:{port}/metrics")
    assert value(samples, "tectofs_client_bytes_written_total") >= 100


def test_counting_off_costs_nothing_and_counts_nothing(metrics_cluster):
    import tectofs.client

    metrics.count_client(False)
    try:
        fs = tectofs.client.connect(metrics_cluster.address, credentials=metrics_cluster.credential_file)
    finally:
        metrics.count_client(True)
    with fs:
        before = local()
        fs.write_bytes("/uncounted", b"y" * 5000)
        assert moved(before, local(), "tectofs_client_bytes_written_total") == 0


def _dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    names: set[str] = set()

    def walk(panels: list[dict[str, Any]]) -> None:
        for panel in panels:
            walk(panel.get("panels", []))
            for target in panel.get("targets", []):
                names.update(re.findall(r"\btectofs_[a-z0-9_]+", target["expr"]))

    walk(dashboard["panels"])
    return names


def test_the_grafana_dashboard_uses_only_metrics_that_exist(metrics_cluster):
    """Every name in the dashboard's PromQL is a sample some role exports after a small
    workload (server endpoints scraped, the client registry of this process): the dashboard
    cannot drift from the code unnoticed."""
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    assert dashboard["schemaVersion"] >= 30 and dashboard["title"]
    panels = [p for p in dashboard["panels"] if p.get("type") != "row"]
    assert panels and all(p.get("targets") and p.get("gridPos") and p.get("datasource") for p in panels)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])

    metrics_cluster.fs.write_bytes("/dashboard", os.urandom(2 * MiB))
    metrics_cluster.fs.read_bytes("/dashboard")
    metrics.checkpoint_metrics().saved({"stage": 0.1, "upload": 0.2, "commit": 0.01}, 1, 0.0)
    metrics.checkpoint_metrics().loaded({"read": 0.2, "verify": 0.01}, 1)
    metrics.s3_metrics().observe("get_object", 200, 0.01, 0, 1)
    exported = {name for name, _ in local()}
    for url in metrics_cluster.metrics_urls.values():
        exported |= {name for name, _ in scrape(url)}

    used = _dashboard_metric_names(dashboard)
    roles = {name.split("_")[1] for name in used}
    assert roles == {"meta", "chunk", "client", "checkpoint", "s3"}, roles
    assert not used - exported, f"the dashboard uses metrics no role exports: {sorted(used - exported)}"


def test_small_rewrites_inside_a_full_block_put_it_once(metrics_cluster):
    """Rewriting part of a block that is already full (a header updated in place, ``dd
    conv=notrunc``) sends the block once, at its end or at the commit, not once per write."""
    fs = metrics_cluster.fs
    data = bytearray(os.urandom(3 * MiB))  # 3 full blocks of 1 MiB, rs(4,2)
    fs.write_bytes("/rewritten", bytes(data))
    before = local()
    with fs.open("/rewritten", "r+b") as f:
        for i in range(50):  # 500 KiB of block 0, in 10 KiB writes
            f.seek(i * 10240)
            f.write(b"r" * 10240)
    after = local()
    data[:50 * 10240] = b"r" * (50 * 10240)
    assert fs.read_bytes("/rewritten") == bytes(data)
    puts = moved(before, after, "tectofs_client_chunk_requests_total", op="put_chunk", outcome="ok")
    assert 5 <= puts <= 6, puts  # one block: write_min (5) to 6 of its chunks
    assert moved(before, after, "tectofs_client_chunk_bytes_total", op="put_chunk") <= 1.5 * MiB + 4096
