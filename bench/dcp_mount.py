"""DCP through the tectofs FUSE mount vs. the native plugin vs. DCP on a local disk, same run.

    python3 -m tectofs.benchmarks.dcp_mount --size 512M --repeats 3

What users do without a plugin: point DCP's own ``FileSystemWriter(sync_files=True)`` /
``FileSystemReader`` at a mounted file system. One state dict of ``--size`` bytes (the
checkpoint benchmark's mixed-precision Adam shape) is saved and loaded, ``--repeats`` times
each way, alternating:

- DCP on a local directory of the same disk (the baseline of every ratio);
- DCP through the tectofs mount (``tectofs mount``, multi-threaded, default options) of a
  local cluster (6 chunk servers, ``rs(4,2)``);
- DCP with ``tectofs.torch.CheckpointWriter``/``CheckpointReader`` on the same cluster.

The page cache is dropped before every load (root only). Target: the native plugin ahead of
the mount for both save and load (``plugin / mount >= 1``). Every load is checked against the
saved state.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import warnings
from typing import Any, Callable

from tectofs.benchmarks.checkpoint_bench import _timed, empty_like_state, make_state_dict, same_state, tensor_bytes
from tectofs.benchmarks.common import drop_caches, parse_size, print_table, work_dir, write_results
from tectofs.benchmarks.report import print_targets, target

MiB = 1 << 20
WAYS = ("dcp local", "dcp through tectofs mount", "tectofs plugin")


def run(out_dir: str, size_bytes: int = 512 * MiB, repeats: int = 3, work: str | None = None) -> dict[str, Any]:
    """Measure the three ways; returns (and writes) rows of median GB/s, ratios and targets."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    import tectofs.torch as tt
    from tectofs.client.fuse import start_mount_process
    from tectofs.server.cluster import LocalCluster

    warnings.simplefilter("ignore")
    sd = make_state_dict(size_bytes)
    nbytes = tensor_bytes(sd)
    into = empty_like_state(sd)
    times: dict[str, list[float]] = {}
    errors: list[str] = []

    def load_checked(way: str, load: Callable[[], Any]) -> None:
        drop_caches()
        times.setdefault(f"{way} load", []).append(_timed(load))
        if not same_state(sd, into):
            errors.append(f"{way}: a load returned different data")

    def dcp_files(path: str) -> tuple[str, Callable[[], Any], Callable[[], Any]]:
        """DCP's own writer and reader on a directory (local or mounted)."""
        return (path, lambda: dcp.save(sd, storage_writer=FileSystemWriter(path, sync_files=True)),
                lambda: dcp.load(into, storage_reader=FileSystemReader(path)))

    with tempfile.TemporaryDirectory(dir=work, prefix="tectofs-dcp-mount-") as tmp:
        cluster = LocalCluster(os.path.join(tmp, "cluster"), servers=6, policy="rs(4,2)", log_to_files=True)
        cluster.start()
        mount = None
        try:
            mountpoint = os.path.join(tmp, "mnt")
            mount = start_mount_process(cluster.address, mountpoint, log_path=os.path.join(tmp, "mount.log"))

            def local(i: int) -> tuple[str, Callable[[], Any], Callable[[], Any]]:
                return dcp_files(os.path.join(tmp, "local", f"step_{i}"))

            def mounted(i: int) -> tuple[str, Callable[[], Any], Callable[[], Any]]:
                return dcp_files(os.path.join(mountpoint, f"mount_step_{i}"))

            def plugin(i: int) -> tuple[str, Callable[[], Any], Callable[[], Any]]:
                uri = f"tectofs://{cluster.address}/plugin_step_{i}"
                return (uri, lambda: dcp.save(sd, storage_writer=tt.CheckpointWriter(uri)),
                        lambda: dcp.load(into, storage_reader=tt.CheckpointReader(uri)))

            ways = dict(zip(WAYS, (local, mounted, plugin)))
            for i in range(repeats):
                for way in WAYS:
                    path, save, load = ways[way](i)
                    times.setdefault(f"{way} save", []).append(_timed(save))
                    load_checked(way, load)
                    if way == "tectofs plugin":
                        tt.filesystem(cluster.address).rmtree(tt.parse(path).path)
                    else:
                        shutil.rmtree(path)
                print(f"  run {i + 1}/{repeats}: " + ", ".join(
                    f"{k} {nbytes / v[-1] / 1e9:.3f} GB/s" for k, v in times.items()), flush=True)
        finally:
            if mount is not None:
                mount.stop()
            tt.close_all()
            cluster.stop()

    gbps = {k: nbytes / statistics.median(v) / 1e9 for k, v in times.items()}
    rows = [{"what": way, "save GB/s": round(gbps[f"{way} save"], 3), "load GB/s": round(gbps[f"{way} load"], 3),
             "save / dcp local": round(gbps[f"{way} save"] / gbps["dcp local save"], 3),
             "load / dcp local": round(gbps[f"{way} load"] / gbps["dcp local load"], 3)} for way in WAYS]
    ratios = {f"plugin {op} / mount {op}": gbps[f"tectofs plugin {op}"] / gbps[f"dcp through tectofs mount {op}"]
              for op in ("save", "load")}
    result = {"benchmark": "dcp_mount", "bytes": nbytes, "repeats": repeats, "times_s": times, "rows": rows,
              "ratios": {k: round(v, 3) for k, v in ratios.items()},
              "targets": [target(k, v, at_least=1.0) for k, v in ratios.items()], "errors": errors}
    write_results(out_dir, "dcp_mount", result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=512 * MiB, help="state dict bytes (default 512M)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each way, alternated (at least 3)")
    parser.add_argument("--work-dir", default=None, help="where the cluster, mount and local directory go")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    if args.repeats < 3:
        parser.error("--repeats must be at least 3 (figures are medians)")
    result = run(args.out, args.size, args.repeats, work_dir(args.work_dir))
    print(f"{result['bytes'] / 2**20:.0f} MiB state dict, medians of {args.repeats} runs")
    print_table(result)
    print_targets(result)
    for error in result["errors"]:
        print(f"error: {error}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
