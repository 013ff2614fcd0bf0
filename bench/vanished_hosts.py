"""Vanished chunk hosts (issue 53): what a read costs when chunk hosts' links are cut (no RST,
no FIN: their peers just hear nothing, as with a dead switch port, a kernel panic or a hung
NIC), against the same read with every host reachable, in the same run.

    python3 -m tectofs.benchmarks.vanished_hosts --size 200M --repeats 5

The layout, on one machine (``tectofs.testing.netns``: needs root and network namespaces): a
metadata host, six chunk hosts and two client hosts, each in its own network namespace, joined
by a bridge; nothing is shared over loopback or Unix sockets. The store is ``rs(4,2)`` with
``--block-size`` blocks (default 64M, the default of a new store), so every block has a chunk on
every chunk host and any four rebuild it. Client host ``a`` writes one ``--size`` file
(``tectofs put``); then, ``--repeats`` times, for 0, 1 and 2 chunk hosts cut (in turn, so a
drift of the machine hits each alike), the hosts' bridge ports go down just before client host
``b`` runs a new ``tectofs get FILE /dev/null`` (a new process: it knows nothing of the cut),
and come back up after it. Figures are the wall time of that command, medians of the repeats;
ratios are against the median with every host reachable. A last read with the most hosts cut
goes to a file and is checked bit-exact. ``--baseline REV``: the same reads by the client of
another revision too (a git worktree of it), alternating with this tree's, against the same
servers.

Issue 53's goal: one host cut at most 1.3x the time with all reachable, two at most 1.5x.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tectofs.benchmarks.common import parse_size, print_table, work_dir, write_results
from tectofs.benchmarks.report import print_targets
from tectofs.benchmarks.report import target as goal

HERE = os.path.dirname(os.path.realpath(__file__))
MiB = 1 << 20
SUBNET = "10.79.0"
META = f"{SUBNET}.1"
CHUNK_HOSTS = [f"{SUBNET}.{11 + i}" for i in range(6)]
CLIENTS = {"a": f"{SUBNET}.101", "b": f"{SUBNET}.102"}
CUT_ORDER = ["c1", "c4"]  # the first n of these are cut (c1 holds a data chunk of every block, c4 parity)
GOALS = {1: 1.3, 2: 1.5}  # hosts cut -> at most this many times the read with all reachable
THIS = "this tree"  # the client of the tree this benchmark runs from
READ_TIMEOUT_S = 300.0  # one `tectofs get`, however slow the code under test


def _source_tree() -> str:
    """The directory processes run from (a source tree's top, or where the package is installed),
    so that ``python3 -m tectofs.cli`` runs this code."""
    import tectofs

    return os.path.dirname(os.path.dirname(os.path.realpath(tectofs.__file__)))


def run(size: int, block_size: str, repeats: int, cuts: list[int], root: str | None = None,
        baseline: str | None = None) -> dict[str, Any]:
    """The figures (and, with ``baseline``, a git revision: the same reads by that revision's
    client, alternating with this tree's, against the same servers)."""
    if baseline is None:
        return _run(size, block_size, repeats, cuts, root, {})
    from tectofs.benchmarks.common import baseline_tree

    with baseline_tree(baseline) as tree:
        return _run(size, block_size, repeats, cuts, root, {baseline: tree})


def _run(size: int, block_size: str, repeats: int, cuts: list[int], root: str | None,
         others: dict[str, str]) -> dict[str, Any]:
    from tectofs.server.cluster import wait_for_file
    from tectofs.testing import netns
    from tectofs.wire import auth

    reason = netns.why_not()
    if reason is not None:
        raise RuntimeError(f"this benchmark needs network namespaces: {reason}")
    with tempfile.TemporaryDirectory(prefix="tectofs-vanished-", dir=root) as tmp:
        base = Path(tmp)
        key_file = str(base / "cluster.key")
        auth.create_key_file(key_file)
        meta_address = f"{META}:7420"
        credentials = str(base / "root.credentials")
        auth.Credential.root_from_keys(auth.KeyRing(key_file), meta_address).save(credentials)
        source = base / "source.bin"
        with open(source, "wb") as f:
            for _ in range(0, size, 16 * MiB):
                f.write(os.urandom(min(16 * MiB, size - f.tell())))
        net = netns.Network("tfv")
        processes = netns.Processes(base, cwd=_source_tree())
        nodes = {"meta": META, **{f"c{i}": a for i, a in enumerate(CHUNK_HOSTS)}, **CLIENTS}
        client = ["--meta", meta_address, "--credentials", credentials]
        readers = {THIS: processes, **{name: netns.Processes(base, cwd=tree, env={**os.environ, "PYTHONPATH": tree})
                                       for name, tree in others.items()}}
        seconds: dict[str, dict[int, list[float]]] = {name: {n: [] for n in cuts} for name in readers}
        try:
            net.build(nodes)
            meta = processes.start(
                net.ns("meta"), "meta", "meta", "--store", str(base / "meta.db"), "--host", META, "--port", "7420",
                "--policy", "rs(4,2)", "--block-size", block_size, "--key-file", key_file,
                "--ready-file", str(base / "meta.address"))
            wait_for_file(str(base / "meta.address"), netns.STEP_TIMEOUT_S, meta)
            for i, host in enumerate(CHUNK_HOSTS):
                chunk = processes.start(
                    net.ns(f"c{i}"), f"chunk-{i}", "chunk", "--data", str(base / f"chunk-{i}"), "--meta",
                    meta_address, "--key-file", key_file, "--host", host, "--port", "7421",
                    "--ready-file", str(base / f"chunk-{i}.address"))
                wait_for_file(str(base / f"chunk-{i}.address"), netns.STEP_TIMEOUT_S, chunk)
            _wait_for_servers(processes, net.ns("a"), meta_address, credentials, len(CHUNK_HOSTS))
            put = processes.run(net.ns("a"), "-m", "tectofs.cli", "put", "-q", *client, str(source), "/f.bin",
                                timeout_s=READ_TIMEOUT_S)
            if put.returncode != 0:
                raise RuntimeError(f"tectofs put: {put.stderr.strip()[-2000:]}")

            def get(cut: int, into: str = "/dev/null", reader: str = THIS) -> float:
                for node in CUT_ORDER[:cut]:
                    net.link(node, up=False)
                try:
                    started = time.perf_counter()
                    done = readers[reader].run(net.ns("b"), "-m", "tectofs.cli", "get", "-q", *client, "/f.bin", into,
                                         timeout_s=READ_TIMEOUT_S)
                    took = time.perf_counter() - started
                finally:
                    for node in CUT_ORDER[:cut]:
                        net.link(node, up=True)
                if done.returncode != 0:
                    raise RuntimeError(f"{reader}: tectofs get with {cut} hosts cut: {done.stderr.strip()[-2000:]}")
                return took

            get(0)  # warm: the page caches of the chunk hosts
            for r in range(repeats):
                for reader in (list(readers) if r % 2 == 0 else list(readers)[::-1]):
                    for n in cuts:
                        seconds[reader][n].append(get(n, reader=reader))
            copy = str(base / "copy.bin")
            get(max(cuts), copy)
            if _sha256(copy) != _sha256(str(source)):
                raise RuntimeError(f"the read with {max(cuts)} hosts cut is not bit-exact")
        except BaseException:
            for name in ["meta"] + [f"chunk-{i}" for i in range(len(CHUNK_HOSTS))]:
                log = processes.log(name)
                if log:
                    print(f"--- {name}.log (last lines)\n{log}")
            raise
        finally:
            processes.stop()
            net.delete()
    return _result(size, block_size, repeats, seconds)


WAIT_SCRIPT = """
import sys, time
from tectofs.client import connect

meta, credentials, count, timeout_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with connect(meta, credentials=credentials) as fs:
    deadline = time.monotonic() + timeout_s
    while sum(s.live for s in fs.servers()) < count:
        if time.monotonic() > deadline:
            sys.exit(f"fewer than {count} chunk servers live: {fs.servers()}")
        time.sleep(0.2)
"""


def _wait_for_servers(processes: Any, namespace: str, meta: str, credentials: str, count: int) -> None:
    from tectofs.testing import netns

    done = processes.run(namespace, "-c", WAIT_SCRIPT, meta, credentials, str(count), str(netns.STEP_TIMEOUT_S),
                         timeout_s=2 * netns.STEP_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-2000:])


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(16 * MiB):
            digest.update(piece)
    return digest.hexdigest()


def _result(size: int, block_size: str, repeats: int, seconds: dict[str, dict[int, list[float]]]) -> dict[str, Any]:
    rows, ratios = [], {}
    for reader, by_cut in seconds.items():
        medians = {n: statistics.median(s) for n, s in by_cut.items()}
        whole = medians.get(0)
        for n, m in medians.items():
            rows.append({"client": reader, "chunk hosts cut": n, "median s": f"{m:.2f}",
                         "runs s": " ".join(f"{s:.2f}" for s in by_cut[n]),
                         "x all reachable": "-" if whole is None else f"{m / whole:.2f}"})
            if n and whole:
                ratios[f"{n} cut / all reachable" + ("" if reader == THIS else f" ({reader})")] = round(m / whole, 3)
    targets = [goal(f"{n} cut / all reachable", ratios.get(f"{n} cut / all reachable"), at_most=at_most)
               for n, at_most in GOALS.items() if n in seconds[THIS] and 0 in seconds[THIS]]
    return {"benchmark": "vanished_hosts", "size_bytes": size, "block_size": block_size, "policy": "rs(4,2)",
            "repeats": repeats, "seconds": {reader: {str(n): s for n, s in by_cut.items()}
                                            for reader, by_cut in seconds.items()},
            "rows": rows, "ratios": ratios, "targets": targets}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m tectofs.benchmarks.vanished_hosts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=parse_size, default=200 * MiB, help="bytes of the file read (default 200M)")
    parser.add_argument("--block-size", default="64M", help="block size of the store (default 64M)")
    parser.add_argument("--repeats", type=int, default=5, help="reads per figure, the median reported (default 5)")
    parser.add_argument("--cuts", default="0,1,2", help="numbers of chunk hosts cut, comma-separated (default 0,1,2;"
                                                        " at most 2: rs(4,2) rebuilds from any 4 of 6)")
    parser.add_argument("--baseline", metavar="REV", default=None,
                        help="also read with the client of this git revision (e.g. 334700f), alternating with this "
                             "tree's, against the same servers: a same-run A/B")
    parser.add_argument("--work-dir", default=None, help="where the hosts' files live (default: a temp dir)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON result goes")
    args = parser.parse_args(argv)
    cuts = sorted({int(n) for n in args.cuts.split(",")})
    if not cuts or cuts[0] < 0 or cuts[-1] > len(CUT_ORDER) or args.repeats < 1:
        parser.error(f"--cuts: numbers from 0 to {len(CUT_ORDER)}; --repeats: at least 1")
    result = run(args.size, args.block_size, args.repeats, cuts, work_dir(args.work_dir), args.baseline)
    print_table(result)
    print_targets(result)
    print("wrote", write_results(args.out, "vanished_hosts", result))


if __name__ == "__main__":
    main()
