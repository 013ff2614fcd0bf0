"""Prometheus metrics (``tectofs.metrics``): every server's endpoint scraped over HTTP, before
and after a write, and the counters that must have moved checked."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tectofs import metrics

MiB = 1 << 20
SCRAPE_TIMEOUT_S = 10


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample at ``url``: (name, sorted labels) -> value."""
    with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
        assert response.status == 200
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def metrics_cluster(tmp_path_factory: pytest.TempPathFactory):
    from tests.conftest import _new_cluster

    c = _new_cluster(str(tmp_path_factory.mktemp("metrics")), metrics=True)
    try:
        yield c
    finally:
        c.stop()


def test_every_server_has_an_endpoint(metrics_cluster):
    assert sorted(metrics_cluster.metrics_urls) == ["chunk-0", "chunk-1", "chunk-2", "chunk-3", "chunk-4",
                                                    "chunk-5", "meta"]
    meta = scrape(metrics_cluster.metrics_urls["meta"])
    assert ("tectofs_meta_store_queue_depth", ()) in meta
    assert value(meta, "tectofs_meta_requests_total", op="register_server", outcome="ok") >= 6
    for i in range(6):
        chunk = scrape(metrics_cluster.metrics_urls[f"chunk-{i}"])
        assert value(chunk, "tectofs_chunk_disk_free_bytes") > 0


def test_counters_move_under_a_write(metrics_cluster):
    urls = metrics_cluster.metrics_urls
    chunk_urls = [url for name, url in urls.items() if name.startswith("chunk-")]
    meta_before = scrape(urls["meta"])
    chunks_before = [scrape(url) for url in chunk_urls]

    data = os.urandom(3 * MiB + 17)
    metrics_cluster.fs.write_bytes("/metrics-file", data)
    assert metrics_cluster.fs.read_bytes("/metrics-file") == data

    meta_after = scrape(urls["meta"])
    for op in ("create", "commit", "allocate"):
        requests = (value(meta_after, "tectofs_meta_requests_total", op=op, outcome="ok")
                    - value(meta_before, "tectofs_meta_requests_total", op=op, outcome="ok"))
        assert requests >= 1, op
    assert (value(meta_after, "tectofs_meta_request_seconds_count", op="create")
            > value(meta_before, "tectofs_meta_request_seconds_count", op="create"))
    assert (value(meta_after, "tectofs_meta_group_commit_batch_size_count")
            > value(meta_before, "tectofs_meta_group_commit_batch_size_count"))

    chunks_after = [scrape(url) for url in chunk_urls]

    def moved(name: str, **labels: str) -> float:
        return sum(value(after, name, **labels) - value(before, name, **labels)
                   for before, after in zip(chunks_before, chunks_after))

    assert moved("tectofs_chunk_bytes_in_total") >= len(data)  # plus parity: rs(4,2) stores 1.5x
    assert moved("tectofs_chunk_bytes_out_total") >= len(data)
    assert moved("tectofs_chunk_requests_total", op="put_chunk", outcome="ok") >= 6  # 4 blocks x 6 chunks
    assert moved("tectofs_chunk_requests_total", op="get_chunk", outcome="ok") >= 4
    assert moved("tectofs_chunk_fsync_seconds_count") >= 6  # the cluster syncs each chunk


def test_errors_are_counted_by_code(metrics_cluster):
    before = scrape(metrics_cluster.metrics_urls["meta"])
    with pytest.raises(FileNotFoundError):
        metrics_cluster.fs.stat("/no-such-file")
    after = scrape(metrics_cluster.metrics_urls["meta"])
    assert (value(after, "tectofs_meta_requests_total", op="lookup", outcome="not_found")
            > value(before, "tectofs_meta_requests_total", op="lookup", outcome="not_found"))


def test_off_unless_asked(cluster):
    """The shared test cluster starts without --metrics: no endpoint, nothing listening."""
    assert cluster.metrics_urls == {}
    assert not [name for name in os.listdir(cluster.root) if name.endswith(".metrics-address")]


def test_port_zero_reports_the_real_port_and_a_missing_endpoint_fails_fast():
    address = metrics.serve(metrics.MetaMetrics().registry, "127.0.0.1", 0)
    assert int(address.rsplit(":", 1)[1]) > 0
    assert ("tectofs_meta_store_queue_depth", ()) in scrape(metrics.url(address))
    with pytest.raises(urllib.error.URLError):  # nothing listens on port 1
        urllib.request.urlopen("http://127.0.0.1:1/metrics", timeout=SCRAPE_TIMEOUT_S)


def test_registries_are_per_service():
    """Two services in one process count separately (no clash on the default registry)."""
    a, b = metrics.MetaMetrics(), metrics.MetaMetrics()
    a.requests.observe("create", "ok", 0.001)
    a_samples = scrape(metrics.url(metrics.serve(a.registry, "127.0.0.1", 0)))
    b_samples = scrape(metrics.url(metrics.serve(b.registry, "127.0.0.1", 0)))
    assert value(a_samples, "tectofs_meta_requests_total", op="create", outcome="ok") == 1
    assert value(b_samples, "tectofs_meta_requests_total", op="create", outcome="ok") == 0


@pytest.mark.parametrize("listen", ["9100", "host:", ":9100", "127.0.0.1:port", "127.0.0.1:70000"])
@pytest.mark.slow  # starts processes
def test_a_bad_metrics_address_is_one_line(listen):
    result = subprocess.run([sys.executable, "-m", "tectofs.cli", "meta", "--metrics", listen], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "--metrics" in result.stderr and "HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr
