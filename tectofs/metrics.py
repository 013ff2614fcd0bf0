"""Prometheus metrics: one registry per service, served over HTTP on request.

Each service object owns its own :class:`prometheus_client.CollectorRegistry` (never the
process-wide default one), so several services in one process (the tests) keep separate
counts. Metrics are always counted (an increment is a lock and an add); they are exported
only when the process was started with ``--metrics HOST:PORT`` (:func:`serve`).

Names: ``tectofs_<role>_...``; counters end in ``_total``, durations are in seconds and
sizes in bytes, as Prometheus conventions ask. Label values are bounded: operation names
come from the operation table (unknown operations are not counted here), outcomes are
``ok`` or an error's wire code (``tectofs.errors``), a fixed set.
"""

from __future__ import annotations

from typing import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# From 50 µs (a cached lookup) to 5 s (a metadata operation behind a long queue, a chunk put
# behind a slow disk); roughly three buckets per decade.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)
# Group-commit batches hold 1 .. limits.group_commit_batch_max operations.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class RequestMetrics:
    """Requests served by one RPC server, by operation and outcome, with their latency.
    ``observe`` is what ``RpcServer`` calls once per request it dispatched."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.requests = Counter(f"{prefix}_requests", "requests answered, by operation and outcome (ok or error code)",
                                ["op", "outcome"], registry=registry)
        self.latency = Histogram(f"{prefix}_request_seconds", "time from dispatch to reply, by operation",
                                 ["op"], registry=registry, buckets=LATENCY_BUCKETS_S)

        # The labelled children, looked up once each (labels() takes a lock and builds a tuple).
        self._counters: dict[tuple[str, str], Counter] = {}
        self._latencies: dict[str, Histogram] = {}

    def observe(self, op: str, outcome: str, seconds: float) -> None:
        counter = self._counters.get((op, outcome))
        if counter is None:
            counter = self._counters.setdefault((op, outcome), self.requests.labels(op, outcome))
        latency = self._latencies.get(op)
        if latency is None:
            latency = self._latencies.setdefault(op, self.latency.labels(op))
        counter.inc()
        latency.observe(seconds)


class MetaMetrics:
    """The metadata service's metrics (``tectofs_meta_*``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestMetrics(self.registry, "tectofs_meta")
        self.busy_answers = Counter("tectofs_meta_busy_answers", "requests refused as BUSY (store queue full)",
                                    registry=self.registry)
        self.batch_sizes = Histogram("tectofs_meta_group_commit_batch_size", "operations per group commit",
                                     registry=self.registry, buckets=BATCH_SIZE_BUCKETS)
        self.queue_depth = Gauge("tectofs_meta_store_queue_depth", "operations waiting for the store thread",
                                 registry=self.registry)

    def watch_queue(self, depth: Callable[[], float]) -> None:
        """Report ``depth()`` as the queue depth, read at each scrape."""
        self.queue_depth.set_function(depth)


class ChunkMetrics:
    """A chunk server's metrics (``tectofs_chunk_*``). Puts and gets are counted by
    ``tectofs_chunk_requests_total{op="put_chunk"|"get_chunk"}``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestMetrics(self.registry, "tectofs_chunk")
        self.bytes_in = Counter("tectofs_chunk_bytes_in", "chunk bytes stored by puts", registry=self.registry)
        self.bytes_out = Counter("tectofs_chunk_bytes_out", "chunk bytes sent by gets", registry=self.registry)
        self.busy_answers = Counter("tectofs_chunk_busy_answers", "puts refused as BUSY (in-flight bytes limit)",
                                    registry=self.registry)
        self.checksum_errors = Counter("tectofs_chunk_checksum_errors", "puts and gets that failed a checksum",
                                       registry=self.registry)
        self.sync_seconds = Histogram("tectofs_chunk_fsync_seconds", "time to make one chunk write durable"
                                      " (fdatasync, or the shared syncfs in group mode)",
                                      registry=self.registry, buckets=LATENCY_BUCKETS_S)
        self.disk_free = Gauge("tectofs_chunk_disk_free_bytes", "free bytes on the data directory's file system",
                               registry=self.registry)

    def watch_disk_free(self, free_bytes: Callable[[], float]) -> None:
        """Report ``free_bytes()`` as the disk free, read at each scrape."""
        self.disk_free.set_function(free_bytes)


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (port 0: any free one) for ``--metrics``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--metrics {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9100 (port 0: any free one)")
    return host.strip("[]"), int(port)


def serve(registry: CollectorRegistry, host: str, port: int) -> str:
    """Serve ``registry`` at ``http://HOST:PORT/metrics`` from a daemon thread (prometheus_client's
    threaded WSGI server, request logs silenced); returns the bound ``HOST:PORT`` (the real port
    when ``port`` is 0). Lives as long as the process."""
    httpd, _thread = start_http_server(port, host, registry=registry)
    bound_host, bound_port = httpd.socket.getsockname()[:2]
    return f"[{bound_host}]:{bound_port}" if ":" in str(bound_host) else f"{bound_host}:{bound_port}"


def url(address: str) -> str:
    return f"http://{address}/metrics"
