"""Prometheus metrics: one registry per service, served over HTTP on request.

Each service object owns its own :class:`prometheus_client.CollectorRegistry` (never the
process-wide default one), so several services in one process (the tests) keep separate
counts. Metrics are always counted (an increment is a lock and an add); they are exported
only when the process was started with ``--metrics HOST:PORT`` (:func:`serve`).

Client processes (a training job, the FUSE mount, the S3 gateway: anything that holds
``tectofs.client`` file systems) have one process-wide *client registry*
(:func:`client_registry`) that every client, the PyTorch plugin and the S3 gateway of the
process count in: :class:`ClientMetrics` (``tectofs_client_*``), :class:`CheckpointMetrics`
(``tectofs_checkpoint_*``), :class:`S3Metrics` (``tectofs_s3_*``). It is exported by
:func:`serve_client` (now), :func:`serve_client_on_connect` (at the process's first client
connection: after a daemon's fork), or, without code, ``TECTOFS_METRICS=HOST:PORT`` in the
environment (also at the first connection: :func:`serve_client_if_asked`).

Names: ``tectofs_<role>_...``; counters end in ``_total``, durations are in seconds and
sizes in bytes, as Prometheus conventions ask. Label values are bounded: operation names
come from the operation table (unknown operations are not counted here), outcomes are
``ok`` or an error's wire code (``tectofs.errors``), a fixed set; never a path or an address.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any, Callable, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger("tectofs.metrics")

# From 50 µs (a cached lookup) to 5 s (a metadata operation behind a long queue, a chunk put
# behind a slow disk); roughly three buckets per decade.
LATENCY_BUCKETS_S = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)
# Group-commit batches hold 1 .. limits.group_commit_batch_max operations.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


# A checkpoint phase takes from 10 ms (a small state dict's commit) to an hour (a huge upload).
CHECKPOINT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
                        1000.0, 2500.0)


class RequestMetrics:
    """Requests by operation and outcome, with their latency: those one RPC server served
    (``observe`` is what ``RpcServer`` calls once per request it dispatched), or those a
    client sent (``served=False``: the latency is the caller's, retries included)."""

    def __init__(self, registry: CollectorRegistry, prefix: str, served: bool = True) -> None:
        what = ("requests answered", "time from dispatch to reply") if served else (
            "requests sent", "time from the call to its reply, retries included")
        self.requests = Counter(f"{prefix}_requests", f"{what[0]}, by operation and outcome (ok or error code)",
                                ["op", "outcome"], registry=registry)
        self.latency = Histogram(f"{prefix}_request_seconds", f"{what[1]}, by operation",
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


# --------------------------------------------------------------------------- client processes

METRICS_ENV = "TECTOFS_METRICS"

_lock = threading.Lock()
_registry: CollectorRegistry | None = None
_families: dict[Any, Any] = {}
_counting = True
_asked: str | None = None  # HOST:PORT to serve at the first connection (serve_client_on_connect)
_served_once: dict[int, str | None] = {}  # pid -> the address serve_client_if_asked served (None: none)

T = TypeVar("T")


def client_registry() -> CollectorRegistry:
    """The process-wide registry of every client, plugin and gateway of this process."""
    global _registry
    with _lock:
        if _registry is None:
            _registry = CollectorRegistry(auto_describe=True)
        return _registry


def _process_wide(make: Callable[[CollectorRegistry], T]) -> T:
    """The one ``make(registry)`` of this process, its families in :func:`client_registry`."""
    found = _families.get(make)
    if found is None:
        registry = client_registry()
        with _lock:
            found = _families.get(make)
            if found is None:
                found = _families[make] = make(registry)
    return found  # type: ignore[no-any-return]


class ClientMetrics:
    """The client library's metrics (``tectofs_client_*``), shared by every client of the
    process (``tectofs.client`` file systems, the mount, fsspec, the plugin, the gateway).

    Requests: ``tectofs_client_meta_requests_total{op,outcome}`` and
    ``tectofs_client_meta_request_seconds{op}`` for metadata calls (the caller's latency,
    retries included), ``tectofs_client_chunk_requests_total{op,outcome}`` and
    ``tectofs_client_chunk_request_seconds{op}`` for ``put_chunk``/``get_chunk``. Bytes: what
    applications wrote and read (``bytes_written``/``bytes_read``), what went to and came from
    chunk servers (``chunk_bytes{op}``: parity and stand-ins included). Events of the data
    path: RPC retries by service and reason (``busy``: a BUSY answer backed off;
    ``connection``: a lost connection or timeout; ``failover``: the next member of a group;
    ``placement``: a new placement after servers failed; ``capability``: an expired read
    capability renewed), hedged requests (``op``: put_chunk, get_chunk), spare writes,
    degraded writes (blocks accepted below full width) and reads, checksum failures of
    chunks read, bad chunks reported. The event and byte series exist (at 0) from the start,
    so ``rate()`` works before the first event; request series appear with their first request."""

    RETRY_REASONS = ("busy", "connection", "failover", "placement", "capability")
    OPS = ("put_chunk", "get_chunk")

    def __init__(self, registry: CollectorRegistry) -> None:
        self.meta = RequestMetrics(registry, "tectofs_client_meta", served=False)
        self.chunk = RequestMetrics(registry, "tectofs_client_chunk", served=False)
        self.bytes_written = Counter("tectofs_client_bytes_written", "bytes applications wrote into files",
                                     registry=registry)
        self.bytes_read = Counter("tectofs_client_bytes_read", "bytes applications read from files", registry=registry)
        chunk_bytes = Counter("tectofs_client_chunk_bytes", "chunk bytes sent by puts and received by gets"
                              " (parity, hedges and stand-ins included)", ["op"], registry=registry)
        retries = Counter("tectofs_client_retries", "requests tried again, by service and reason",
                          ["service", "reason"], registry=registry)
        hedged = Counter("tectofs_client_hedged_requests", "chunk puts and gets also sent elsewhere because they were"
                         " much slower than their siblings", ["op"], registry=registry)
        self._chunk_bytes = {op: chunk_bytes.labels(op) for op in self.OPS}
        self._retries = {(service, reason): retries.labels(service, reason)
                         for service in ("meta", "chunk") for reason in self.RETRY_REASONS}

        def counter(name: str, text: str) -> Counter:
            return Counter(name, text, registry=registry)

        # BlockIO.stats keys -> their series
        self._events = {
            "hedged_writes": hedged.labels("put_chunk"),
            "hedged_reads": hedged.labels("get_chunk"),
            "hedges_refused": counter("tectofs_client_hedges_refused", "late chunk gets not hedged: the hedge budget"
                                      " (a share of gets) was spent"),
            "servers_set_aside": counter("tectofs_client_servers_set_aside", "chunk servers a client set aside for"
                                         " leaving a get unanswered past its deadline"),
            "spare_writes": counter("tectofs_client_spare_writes", "chunks sent to a spare after a server failed"),
            "degraded_writes": counter("tectofs_client_degraded_writes",
                                       "blocks accepted with fewer chunks than the policy's width"),
            "degraded_reads": counter("tectofs_client_degraded_reads", "blocks read around a missing, unreachable"
                                      " or corrupt chunk"),
            "checksum_failures": counter("tectofs_client_checksum_failures",
                                         "chunks read that failed their checksum (read around, reported)"),
            "bad_chunks": counter("tectofs_client_bad_chunk_reports", "bad chunks reported to the metadata service"),
            "skipped_down_servers": counter("tectofs_client_reads_around_down_servers",
                                            "blocks read from parity without asking a chunk server found down moments before"),
            "inline_writes": counter("tectofs_client_inline_writes", "small files committed inline (their bytes kept by"
                                     " the metadata service: no chunk put)"),
            "inline_reads": counter("tectofs_client_inline_reads", "blocks read from inline data (no chunk get)"),
            "partial_reads": counter("tectofs_client_partial_reads", "reads of part of a block that fetched only"
                                     " the bytes asked (the pieces holding them)"),
            "inline_checksum_failures": counter("tectofs_client_inline_checksum_failures",
                                                "inline data that failed its checksum on reading"),
        }

    def meta_done(self, op: str, outcome: str, seconds: float) -> None:
        self.meta.observe(op, outcome, seconds)

    def chunk_done(self, op: str, outcome: str, seconds: float, nbytes: int) -> None:
        """One ``put_chunk``/``get_chunk`` answered (``nbytes``: the chunk's, 0 if it failed)."""
        self.chunk.observe(op, outcome, seconds)
        if nbytes:
            self._chunk_bytes[op].inc(nbytes)

    def wrote(self, nbytes: int) -> None:
        self.bytes_written.inc(nbytes)

    def read(self, nbytes: int) -> None:
        self.bytes_read.inc(nbytes)

    def retried(self, service: str, reason: str) -> None:
        self._retries[service, reason].inc()

    def event(self, name: str) -> None:
        """One data-path event, named as in ``BlockIO.stats``."""
        self._events[name].inc()


class _NotCounting(ClientMetrics):
    """What clients made while counting is off (:func:`count_client`) report to: nothing."""

    def __init__(self) -> None:  # no families: nothing is registered
        pass

    def meta_done(self, op: str, outcome: str, seconds: float) -> None:
        pass

    def chunk_done(self, op: str, outcome: str, seconds: float, nbytes: int) -> None:
        pass

    def wrote(self, nbytes: int) -> None:
        pass

    def read(self, nbytes: int) -> None:
        pass

    def retried(self, service: str, reason: str) -> None:
        pass

    def event(self, name: str) -> None:
        pass


_NOT_COUNTING = _NotCounting()


def client_metrics() -> ClientMetrics:
    """The process's :class:`ClientMetrics`, for a client being made now (a do-nothing one
    while counting is off)."""
    return _process_wide(ClientMetrics) if _counting else _NOT_COUNTING


def count_client(on: bool) -> None:
    """Turn client counting on (the default) or off for clients made from now on (clients
    keep what they were made with). For measuring what counting costs."""
    global _counting
    _counting = on


class CheckpointMetrics:
    """The PyTorch plugin's per-checkpoint timings (``tectofs_checkpoint_*``), per rank.

    Saves: ``save_seconds{phase}``, ``phase`` one of ``stage`` (the copy into staging buffers
    of ``dcp.async_save``), ``upload`` (this rank's files written), ``commit`` (the
    coordinator's metadata file and atomic rename); loads: ``load_seconds{phase}``, ``read``
    (this rank's items fetched and checked) and ``verify`` (of which checking crc32c, summed
    over the reading threads); ``async_save_seconds{part}``: what ``dcp.async_save`` blocked
    the caller for (``blocking``) and the upload behind it (``background``). The
    ``last_*`` gauges hold the most recent checkpoint's numbers."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def histogram(name: str, text: str, label: str) -> Histogram:
            return Histogram(name, text, [label], registry=registry, buckets=CHECKPOINT_BUCKETS_S)

        self.save_seconds = histogram("tectofs_checkpoint_save_seconds", "time of each phase of a save", "phase")
        self.load_seconds = histogram("tectofs_checkpoint_load_seconds", "time of each phase of a load", "phase")
        self.async_seconds = histogram("tectofs_checkpoint_async_save_seconds",
                                       "dcp.async_save: time the caller was blocked, and the background upload", "part")
        self.saved_bytes = Counter("tectofs_checkpoint_saved_bytes", "bytes of checkpoint data this rank saved",
                                   registry=registry)
        self.loaded_bytes = Counter("tectofs_checkpoint_loaded_bytes", "bytes of checkpoint data this rank loaded",
                                    registry=registry)
        self.last_save = Gauge("tectofs_checkpoint_last_save_seconds", "the last save's time, by phase", ["phase"],
                               registry=registry)
        self.last_load = Gauge("tectofs_checkpoint_last_load_seconds", "the last load's time, by phase", ["phase"],
                               registry=registry)
        self.last_save_bytes = Gauge("tectofs_checkpoint_last_save_bytes", "bytes this rank saved in the last save",
                                     registry=registry)
        self.last_save_time = Gauge("tectofs_checkpoint_last_save_timestamp_seconds",
                                    "when the last save ended (Unix time)", registry=registry)
        for phase in ("stage", "upload", "commit"):
            self.save_seconds.labels(phase)
        for phase in ("read", "verify"):
            self.load_seconds.labels(phase)
        for part in ("blocking", "background"):
            self.async_seconds.labels(part)

    def saved(self, phases: dict[str, float], nbytes: int, ended: float) -> None:
        """A save ended on this rank: its phases' seconds (those it had), the bytes it wrote."""
        for phase, seconds in phases.items():
            self.save_seconds.labels(phase).observe(seconds)
            self.last_save.labels(phase).set(seconds)
        self.saved_bytes.inc(nbytes)
        self.last_save_bytes.set(nbytes)
        self.last_save_time.set(ended)

    def loaded(self, phases: dict[str, float], nbytes: int) -> None:
        for phase, seconds in phases.items():
            self.load_seconds.labels(phase).observe(seconds)
            self.last_load.labels(phase).set(seconds)
        self.loaded_bytes.inc(nbytes)

    def async_saved(self, part: str, seconds: float) -> None:
        self.async_seconds.labels(part).observe(seconds)


def checkpoint_metrics() -> CheckpointMetrics:
    return _process_wide(CheckpointMetrics)


class S3Metrics:
    """The S3 gateway's metrics (``tectofs_s3_*``): requests by operation (the handler's
    name, e.g. ``put_object``; ``unknown`` when none was chosen) and HTTP status, their
    latency (to the last byte of a streamed body), body bytes in and out."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter("tectofs_s3_requests", "S3 requests answered, by operation and HTTP status",
                                ["operation", "status"], registry=registry)
        self.latency = Histogram("tectofs_s3_request_seconds", "time to answer an S3 request, by operation",
                                 ["operation"], registry=registry, buckets=LATENCY_BUCKETS_S)
        self.bytes_in = Counter("tectofs_s3_bytes_in", "request body bytes received", registry=registry)
        self.bytes_out = Counter("tectofs_s3_bytes_out", "response body bytes sent", registry=registry)

    def observe(self, operation: str, status: int | str, seconds: float, bytes_in: int, bytes_out: int) -> None:
        self.requests.labels(operation, str(status)).inc()
        self.latency.labels(operation).observe(seconds)
        if bytes_in:
            self.bytes_in.inc(bytes_in)
        if bytes_out:
            self.bytes_out.inc(bytes_out)


def s3_metrics() -> S3Metrics:
    return _process_wide(S3Metrics)


def serve_client(host: str, port: int) -> str:
    """Serve this process's client registry at ``http://HOST:PORT/metrics`` (a daemon
    thread, as :func:`serve`); returns the bound ``HOST:PORT``. For a process that uses the
    client library: a mount, a gateway, a training job."""
    return serve(client_registry(), host, port)


def serve_client_on_connect(host: str, port: int) -> None:
    """Serve the client registry at ``HOST:PORT`` from the first client connection this
    process (or a child forked from it: a ``--daemon`` mount forks before any thread may
    exist) makes from now on, as :func:`serve_client_if_asked`."""
    global _asked
    _asked = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def serve_client_if_asked() -> str | None:
    """Serve the client registry where :func:`serve_client_on_connect` or ``$TECTOFS_METRICS``
    (``HOST:PORT``) asks, once per process: every client connection calls this, the first of
    a process serves. For ``$TECTOFS_METRICS`` with ``$LOCAL_RANK`` set (torchrun), the port is
    PORT + LOCAL_RANK, so the ranks of one host each have their own. Port 0 takes any free
    one. The URL is logged at INFO; an address that cannot be served is logged as a WARNING
    and never fails the client. Returns the address served (None: not asked, or failed)."""
    pid = os.getpid()
    if pid in _served_once:
        return _served_once[pid]
    with _lock:
        if pid in _served_once:
            return _served_once[pid]
        _served_once[pid] = None
    text = _asked or os.environ.get(METRICS_ENV)
    if not text:
        return None
    try:
        host, port = parse_listen(text)
        rank = os.environ.get("LOCAL_RANK", "")
        if port and rank.isdigit() and _asked is None:
            port += int(rank)
        address = serve_client(host, port)
    except (ValueError, OSError) as exc:
        log.warning("client metrics not served at %s: %s", text, exc)
        return None
    log.info("client metrics: %s", url(address))
    _served_once[pid] = address
    return address
