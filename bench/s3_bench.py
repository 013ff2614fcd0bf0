"""S3 GET/PUT through the gateway vs. the client library, same cluster, same file, same run.

    python bench/s3_bench.py --size 1G --repeats 3
    python bench/s3_bench.py --candidates        # the HTTP servers the gateway could be built on

Starts a local cluster (6 chunk servers, rs(4,2), 64 MiB blocks) with its S3 gateway, and per
repeat: writes the file with the client library, reads it back, PUTs the same bytes with boto3
(one PutObject, payload unsigned as over TLS; and optionally a multipart upload), GETs them
back. Reports medians and the gateway/client ratios. The gateway, the client, the chunk
servers and boto3 share this machine's cores: on 2 cores the ratios say what the HTTP hop
costs here, not on a host where the gateway has cores of its own.

``--candidates`` measures 1 GiB GET and PUT through a minimal streaming handler on aiohttp,
uvicorn + h11 and uvicorn + httptools (loopback, http.client, median of 3): how the gateway's
server was chosen.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

from tectofs.benchmarks.common import parse_size, print_table, write_results

CHUNK = 8 << 20


class _Reader(io.RawIOBase):
    """A file object over a memoryview (boto3 streams it; no copy of the whole)."""

    def __init__(self, data: memoryview) -> None:
        self.data, self.position = data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.position = {0: offset, 1: self.position + offset, 2: len(self.data) + offset}[whence]
        return self.position

    def tell(self) -> int:
        return self.position

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), len(self.data) - self.position)
        buffer[:n] = self.data[self.position:self.position + n]
        self.position += n
        return n


def _peak_rss_bytes(pid: int) -> int:
    """The process's peak resident memory (VmHWM), 0 where /proc cannot say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        return 0


def _timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _client_write(fs: Any, path: str, data: memoryview) -> None:
    with fs.open(path, "wb") as f:
        for i in range(0, len(data), CHUNK):
            f.write(data[i:i + CHUNK])


def _client_read(fs: Any, path: str) -> None:
    buffer = bytearray(CHUNK)
    with fs.open(path, "rb", buffering=0) as f:
        while f.readinto(buffer):
            pass


def _s3_get(s3: Any, key: str, size: int) -> None:
    body = s3.get_object(Bucket="bench", Key=key)["Body"]
    got = 0
    while data := body.read(CHUNK):
        got += len(data)
    assert got == size, (got, size)


def _s3_client(endpoint: str, keys: dict[str, str]) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(s3={"addressing_style": "path", "payload_signing_enabled": False},
                    request_checksum_calculation="when_required", response_checksum_validation="when_required",
                    read_timeout=600, retries={"max_attempts": 1})
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=config,
                        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"], aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"])


def run(out_dir: str, size_bytes: int, repeats: int = 3, multipart: bool = False, work_dir: str | None = None,
        progress: Any = None) -> dict[str, Any]:
    """Measure and return ``{"rows": [...], "ratios": {...}}``; writes ``s3_bench.json``."""
    from boto3.s3.transfer import TransferConfig

    from tectofs.client import connect
    from tectofs.server.cluster import LocalCluster

    data = memoryview(os.urandom(size_bytes))
    names = ["client write", "client read", "S3 PUT", "S3 GET"] + (["S3 multipart PUT (64 MiB parts)"] if multipart else [])
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        with LocalCluster(os.path.join(tmp, "cluster"), s3_port=0) as cluster, connect(cluster.address) as fs:
            with open(cluster.s3_env_file) as f:
                keys = dict(line.split("=", 1) for line in f.read().split())
            s3 = _s3_client(f"http://{cluster.s3_address}", keys)
            s3.create_bucket(Bucket="bench")
            for i in range(repeats):
                times["client write"].append(_timed(lambda: _client_write(fs, f"/bench/client-{i}", data)))
                times["client read"].append(_timed(lambda: _client_read(fs, f"/bench/client-{i}")))
                times["S3 PUT"].append(_timed(lambda: s3.put_object(Bucket="bench", Key=f"s3-{i}", Body=_Reader(data),
                                                                    ContentLength=size_bytes)))
                times["S3 GET"].append(_timed(lambda: _s3_get(s3, f"s3-{i}", size_bytes)))
                if multipart:
                    config = TransferConfig(multipart_threshold=64 << 20, multipart_chunksize=64 << 20, max_concurrency=4)
                    times[names[-1]].append(_timed(lambda: s3.upload_fileobj(_Reader(data), "bench", f"mp-{i}",
                                                                             Config=config)))
                    s3.delete_object(Bucket="bench", Key=f"mp-{i}")
                fs.remove(f"/bench/client-{i}")
                s3.delete_object(Bucket="bench", Key=f"s3-{i}")
                if progress is not None:
                    progress(1)
            assert cluster.s3_process is not None
            gateway_peak_rss = _peak_rss_bytes(cluster.s3_process.pid)
    gbps = {name: size_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
    ratios = {"S3 PUT / client write": gbps["S3 PUT"] / gbps["client write"],
              "S3 GET / client read": gbps["S3 GET"] / gbps["client read"]}
    rows = [{"what": name, "GB/s (median)": round(v, 3), "runs_s": [round(t, 3) for t in times[name]]}
            for name, v in gbps.items()]
    result = {"benchmark": "s3_bench", "size_bytes": size_bytes, "repeats": repeats, "rows": rows,
              "ratios": {k: round(v, 3) for k, v in ratios.items()},
              "gateway_peak_rss_mib": round(gateway_peak_rss / (1 << 20), 1),
              "note": "same cluster and bytes; the gateway computes the MD5 ETag of every PUT"}
    write_results(out_dir, "s3_bench", result)
    return result


# ---------------------------------------------------------------------------- HTTP server candidates

_CANDIDATE_SERVER = r'''
import sys
kind, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
CHUNK = 1 << 20
block = bytes(CHUNK)
if kind == "aiohttp":
    from aiohttp import web
    async def get(request):
        response = web.StreamResponse(headers={"Content-Length": str(size)})
        await response.prepare(request)
        for _ in range(size // CHUNK):
            await response.write(block)
        await response.write_eof()
        return response
    async def put(request):
        n = 0
        async for data in request.content.iter_any():
            n += len(data)
        return web.Response(text=str(n))
    app = web.Application()
    app.router.add_get("/x", get)
    app.router.add_put("/x", put)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
else:
    import uvicorn
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", str(size).encode())]})
            for _ in range(size // CHUNK):
                await send({"type": "http.response.body", "body": block, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        n = 0
        while True:
            message = await receive()
            n += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = str(n).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    uvicorn.run(app, host="127.0.0.1", port=port, http=kind, log_level="warning", access_log=False)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _candidate_get(port: int, size: int) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("GET", "/x")
    response = connection.getresponse()
    buffer = memoryview(bytearray(1 << 20))
    got, started = 0, time.perf_counter()
    while n := response.readinto(buffer):
        got += n
    elapsed = time.perf_counter() - started
    connection.close()
    assert got == size
    return size / elapsed / 1e9


def _candidate_put(port: int, size: int) -> float:
    block = bytes(1 << 20)
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    started = time.perf_counter()
    connection.request("PUT", "/x", body=(block for _ in range(size // len(block))),
                       headers={"Content-Length": str(size)})
    received = int(connection.getresponse().read())
    elapsed = time.perf_counter() - started
    connection.close()
    assert received == size
    return size / elapsed / 1e9


def candidates(size_bytes: int, repeats: int = 3) -> list[dict[str, Any]]:
    """GET and PUT GB/s (median of ``repeats``) through each candidate server."""
    rows = []
    for kind in ("aiohttp", "h11", "httptools"):
        port = _free_port()
        server = subprocess.Popen([sys.executable, "-c", _CANDIDATE_SERVER, kind, str(port), str(size_bytes)])
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            gets = [_candidate_get(port, size_bytes) for _ in range(repeats)]
            puts = [_candidate_put(port, size_bytes) for _ in range(repeats)]
            rows.append({"server": "aiohttp" if kind == "aiohttp" else f"uvicorn+{kind}",
                         "GET GB/s": round(statistics.median(gets), 2), "PUT GB/s": round(statistics.median(puts), 2),
                         "GET runs": [round(g, 2) for g in gets], "PUT runs": [round(p, 2) for p in puts]})
        finally:
            server.terminate()
            server.wait(timeout=30)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("1G"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--multipart", action="store_true", help="also time a multipart upload (64 MiB parts)")
    parser.add_argument("--candidates", action="store_true", help="compare the HTTP servers instead")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    if args.candidates:
        print_table({"rows": candidates(args.size, args.repeats)})
        return
    result = run(args.out, args.size, args.repeats, args.multipart)
    print_table(result)
    print(json.dumps(result["ratios"], indent=2))
    print(f"gateway peak RSS: {result['gateway_peak_rss_mib']} MiB")


if __name__ == "__main__":
    main()
