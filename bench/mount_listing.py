"""``ls -l`` and ``du -s`` of a directory through the tectofs mount, beside a local directory.

    python3 -m tectofs.benchmarks.mount_listing --files 1000 --repeats 3

Starts a local cluster (6 chunk servers, rs(4,2)) with metrics on, makes ``--files`` files
through the client library (as another node writing a checkpoint would: the mount has never
seen them), mounts it (default 1 s attribute timeout) and times ``ls -l`` and ``du -s`` of the
directory, each after the attribute timeout has expired, ``--repeats`` times; the same
commands on a local directory of as many files are the baseline. Reports medians, and the
metadata calls per file each command made (lookups and getattrs, getxattrs) from the metadata
service's metrics. To compare two revisions, run it from each checkout: ``python3 -m`` from a
checkout's root imports that checkout's tectofs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from tectofs.benchmarks.common import print_table, write_results

COMMANDS = {"ls -l": ["ls", "-l"], "du -s": ["du", "-s"]}
SETTLE_S = 1.1  # past the mount's attribute timeout (1 s): every run starts with nothing cached


def _meta_calls(url: str) -> dict[str, float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    calls = {"lookups": 0.0, "getxattrs": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != "tectofs_meta_requests_total":
                continue
            op = sample.labels.get("op")
            if op in ("lookup", "getattr"):
                calls["lookups"] += sample.value
            elif op == "getxattr":
                calls["getxattrs"] += sample.value
    return calls


def _timed(command: list[str], directory: str) -> float:
    started = time.perf_counter()
    subprocess.run([*command, directory], check=True, stdout=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - started


def run(out_dir: str, files: int = 1000, repeats: int = 3) -> dict[str, Any]:
    from tectofs.client import connect
    from tectofs.client.fuse import start_mount_process
    from tectofs.server.cluster import LocalCluster
    from tectofs.wire import messages

    times: dict[str, list[float]] = {}
    per_file: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tectofs-mount-listing-") as tmp:
        local = os.path.join(tmp, "local")
        os.mkdir(local)
        for n in range(files):
            open(os.path.join(local, f"__{n}_0.distcp"), "wb").close()
        with LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)", metrics=True) as cluster:
            fs = connect(cluster.address, credentials=cluster.credential_file)
            try:
                fs.mkdir("/ranks")

                async def create_all() -> None:
                    gate = asyncio.Semaphore(256)

                    async def create(n: int) -> None:
                        async with gate:
                            await fs.aio.metadata.create(messages.CreateRequest(path=f"/ranks/__{n}_0.distcp", mode=0o644))

                    await asyncio.gather(*(create(n) for n in range(files)))

                fs.run(create_all())
            finally:
                fs.close()
            mountpoint = os.path.join(tmp, "mnt")
            with start_mount_process(cluster.address, mountpoint, log_path=os.path.join(tmp, "mount.log")):
                for _ in range(repeats):
                    for what, command in COMMANDS.items():
                        times.setdefault(f"local {what}", []).append(_timed(command, local))
                        time.sleep(SETTLE_S)
                        before = _meta_calls(cluster.metrics_urls["meta"])
                        times.setdefault(f"mount {what}", []).append(_timed(command, mountpoint + "/ranks"))
                        after = _meta_calls(cluster.metrics_urls["meta"])
                        for kind in before:
                            per_file.setdefault(f"mount {what} {kind}", []).append((after[kind] - before[kind]) / files)
    rows = []
    for what in COMMANDS:
        mount, local_s = statistics.median(times[f"mount {what}"]), statistics.median(times[f"local {what}"])
        rows.append({"what": f"{what} of {files:,} files", "mount s (median)": round(mount, 3),
                     "local s (median)": round(local_s, 4), "mount runs s": [round(t, 3) for t in times[f"mount {what}"]],
                     "lookups per file": round(statistics.median(per_file[f"mount {what} lookups"]), 3),
                     "getxattrs per file": round(statistics.median(per_file[f"mount {what} getxattrs"]), 3)})
    result = {"benchmark": "mount_listing", "files": files, "repeats": repeats, "rows": rows}
    write_results(out_dir, "mount_listing", result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000, help="files in the directory (default 1000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each command; medians reported")
    parser.add_argument("--out", default="bench/results", help="directory for mount_listing.json")
    args = parser.parse_args(argv)
    result = run(args.out, args.files, args.repeats)
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
