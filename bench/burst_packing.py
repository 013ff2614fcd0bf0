"""Packed chunks vs a file per chunk, on the checkpoint burst, in the same run.

    python3 -m tectofs.benchmarks.burst_packing --ranks 1024 --shard 1M --pack-max 1M --repeats 3

Runs ``bench/burst.py`` alternately with chunk servers storing a file per chunk and packing
chunks up to ``--pack-max`` into segment files (``tectofs chunk --pack-max``), ``--repeats``
times each, and reports medians: the burst's save and load against one large writer and
reader of the same run, the wall time of each phase, and the chunk servers' CPU seconds per
GB saved and loaded. Each burst starts its own cluster.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from tectofs.benchmarks import burst
from tectofs.benchmarks.burst_report import figures, medians
from tectofs.benchmarks.common import parse_size, work_dir, write_results

MiB = 1 << 20
MODES = (("files", 0), ("packed", None))  # None: --pack-max


def run(out_dir: str, ranks: int, shard_bytes: int, pack_max_bytes: int, repeats: int,
        work: str | None = None) -> dict[str, Any]:
    """Alternate the two modes ``repeats`` times; return (and write) every sample and the medians."""
    if repeats < 3:
        raise SystemExit("--repeats must be at least 3 (figures are medians)")
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in MODES}
    errors: list[str] = []
    for i in range(repeats):
        for name, pack in MODES:
            result = burst.run(out_dir, ranks, shard_bytes, dir_block_size=shard_bytes, work_dir=work,
                               metadata_files_per_rank=0, name=f"burst-{name}-{i}",
                               pack_max_bytes=pack_max_bytes if pack is None else pack)
            if result["error_count"]:
                errors.extend(f"{name} run {i}: {e}" for e in result["errors"][:5])
                continue
            samples[name].append(figures(result))
            print(f"  {name} run {i + 1}/{repeats}: " + ", ".join(f"{k} {v:.3g}" for k, v in samples[name][-1].items()))
    median = {name: medians(runs) for name, runs in samples.items() if runs}
    rows = []
    if len(median) == len(MODES):
        for key in median["files"]:
            files, packed = median["files"][key], median["packed"].get(key, float("nan"))
            rows.append({"what": key, "files": round(files, 3), "packed": round(packed, 3),
                         "packed / files": round(packed / files, 3) if files else None})
    result = {"benchmark": "burst_packing", "ranks": ranks, "shard_bytes": shard_bytes, "pack_max_bytes": pack_max_bytes,
              "repeats": repeats, "samples": samples, "medians": median, "rows": rows, "errors": errors}
    write_results(out_dir, "burst_packing", result)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=1024)
    parser.add_argument("--shard", type=parse_size, default=1 * MiB, help="bytes each rank saves (default 1M)")
    parser.add_argument("--pack-max", type=parse_size, default=1 * MiB, help="chunks packed up to this size (default 1M)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode, alternated (at least 3)")
    parser.add_argument("--work-dir", default=None, help="where clusters go, created if missing (default: $TMPDIR)")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    result = run(args.out, args.ranks, args.shard, args.pack_max, args.repeats, work_dir(args.work_dir))
    widths = (42, 10, 10, 15)
    print("".join(h.ljust(w) for h, w in zip(("median of runs", "files", "packed", "packed / files"), widths)))
    for row in result["rows"]:
        print("".join(str(v).ljust(w) for v, w in zip(row.values(), widths)))
    for error in result["errors"]:
        print(f"error: {error}")
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
