"""What security costs: one large file written and read through a cluster serving TLS vs. the
same cluster layout without it, in the same run, plus the per-request cost of a chunk
capability (HMAC-SHA256, signed by the metadata service, checked by a chunk server).

    python3 -m tectofs.benchmarks.security_cost --size 256M --repeats 5

Both clusters (6 chunk servers, rs(4,2), 64 MiB blocks) run at once on this machine; writes
and reads alternate between them, so drift hits both alike. Authentication itself is on in
both (it cannot be turned off); ``bench/checkpoint_bench.py`` run on the commit before and
after measures what it and the capabilities cost a checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import timeit
from typing import Any

from tectofs.benchmarks.client_io import _client_read, _client_write
from tectofs.benchmarks.common import parse_size, print_table, write_results
from tectofs.client import connect
from tectofs.server.cluster import LocalCluster
from tectofs.wire import auth


def _capability_us() -> dict[str, float]:
    ring = auth.KeyRing.from_keys([("k1", os.urandom(32))])
    expiry = int(time.time()) + 3600
    key, tag = auth.sign_capability(ring, 12345, "r", expiry)
    n = 100_000
    sign = min(timeit.repeat(lambda: auth.sign_capability(ring, 12345, "r", expiry), number=n, repeat=5)) / n
    check = min(timeit.repeat(lambda: auth.check_capability(ring, 12345, "r", expiry, key, tag), number=n,
                              repeat=5)) / n
    return {"sign": sign * 1e6, "check": check * 1e6}


def run(out_dir: str, size_bytes: int = 256 << 20, repeats: int = 5, work_dir: str | None = None,
        progress: Any = None) -> dict[str, Any]:
    """Measure and return ``{"rows": [...], "ratios": {...}}``; writes ``security_cost.json``."""
    data = memoryview(os.urandom(size_bytes))
    times: dict[str, list[float]] = {"plain write": [], "plain read": [], "TLS write": [], "TLS read": []}
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        # The plain cluster's client is made first: a TLS cluster makes this process trust TLS.
        with LocalCluster(os.path.join(tmp, "plain")) as plain, connect(plain.address, plain.credential_file) as fs_plain:
            with LocalCluster(os.path.join(tmp, "tls"), tls=True) as secure, \
                    connect(secure.address, secure.credential_file) as fs_tls:
                for i in range(repeats):
                    for name, fs in (("plain", fs_plain), ("TLS", fs_tls)):
                        times[f"{name} write"].append(_client_write(fs, f"/bench-{i}.bin", data))
                        times[f"{name} read"].append(_client_read(fs, f"/bench-{i}.bin", size_bytes))
                        fs.remove(f"/bench-{i}.bin")
                    if progress is not None:
                        progress(1)
    gbps = {name: size_bytes / statistics.median(t) / 1e9 for name, t in times.items()}
    cap = _capability_us()
    ratios = {"TLS write / plain write": gbps["TLS write"] / gbps["plain write"],
              "TLS read / plain read": gbps["TLS read"] / gbps["plain read"]}
    rows = [{"what": name, "GB/s (median)": round(v, 3), "runs_s": [round(t, 3) for t in times[name]]}
            for name, v in gbps.items()]
    rows += [{"what": f"capability {what} (µs, best of 5)", "GB/s (median)": None, "runs_s": [round(us, 2)]}
             for what, us in cap.items()]
    result = {"benchmark": "security_cost", "size_bytes": size_bytes, "repeats": repeats, "rows": rows,
              "ratios": {k: round(v, 3) for k, v in ratios.items()}, "capability_us": cap}
    write_results(out_dir, "security_cost", result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args()
    result = run(args.out, args.size, args.repeats)
    print_table(result)
    print(json.dumps(result["ratios"], indent=2))


if __name__ == "__main__":
    main()
