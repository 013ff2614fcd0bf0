"""How fast this host moves bytes between two processes' worth of sockets over loopback TCP: the
ceiling of a restore from a peer agent's memory when the "nodes" are one host (the memory tier's
peer path: the sender's ``sendfile`` from a shared-memory file, the receiver's ``recv_into`` the
destination), against which ``tectofs bench checkpoint``'s peer restore is judged.

    python3 -m tectofs.benchmarks.loopback --size 1G --streams 1 2 4 --repeats 3

A file of ``--size`` random bytes in ``/dev/shm`` is sent over 127.0.0.1 in ``N`` equal parts
on ``N`` connections at once (threads: ``sendfile`` and ``recv_into`` release the GIL), each
part into its place in one buffer touched beforehand; no checksum, no decoding. Prints the median GB/s per stream
count, and a bare copy of the same bytes between two touched buffers for scale.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import struct
import tempfile
import threading
import time

from tectofs.benchmarks.common import parse_size

_INDEX = struct.Struct("!I")  # each connection first says which part of the file it carries


def _send(port: int, path: str, index: int, offset: int, count: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as sock, open(path, "rb") as f:
        sock.sendall(_INDEX.pack(index))
        while count:
            sent = os.sendfile(sock.fileno(), f.fileno(), offset, count)
            offset, count = offset + sent, count - sent


def _receive(listener: socket.socket, into: memoryview, part: int) -> None:
    conn, _ = listener.accept()
    with conn:
        header = b""
        while len(header) < _INDEX.size:
            more = conn.recv(_INDEX.size - len(header))
            if not more:
                raise ConnectionError("the sender closed before saying which part it sends")
            header += more
        index = _INDEX.unpack(header)[0]
        into = into[index * part:(index + 1) * part]
        got = 0
        while got < len(into):
            n = conn.recv_into(into[got:])
            if not n:
                raise ConnectionError(f"the sender closed after {got} of {len(into)} bytes")
            got += n


def transfer_gbps(path: str, into: memoryview, streams: int) -> float:
    """One transfer of the file at ``path`` into ``into`` over ``streams`` loopback connections."""
    part = len(into) // streams
    with socket.create_server(("127.0.0.1", 0), backlog=streams) as listener:
        port = listener.getsockname()[1]
        threads = [threading.Thread(target=_send, args=(port, path, i, i * part, part)) for i in range(streams)]
        threads += [threading.Thread(target=_receive, args=(listener, into, part)) for _ in range(streams)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return streams * part / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="1G", help="bytes per transfer (default 1G)")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4], help="connections at once (default 1 2 4)")
    parser.add_argument("--repeats", type=int, default=3, help="transfers per stream count (default 3)")
    args = parser.parse_args()
    size = parse_size(args.size) >> 20 << 20
    if size <= 0 or args.repeats < 1 or min(args.streams) < 1:
        raise SystemExit("loopback: --size of at least 1M, --repeats and --streams of at least 1")
    chunk = os.urandom(1 << 20)
    with tempfile.NamedTemporaryFile(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as f:
        for _ in range(size >> 20):
            f.write(chunk)
        f.flush()
        into = memoryview(bytearray(b"\1" * size))  # touched: no page faults in the measurement
        for streams in args.streams:
            runs = [transfer_gbps(f.name, into, streams) for _ in range(args.repeats)]
            print(f"{streams} stream(s): {statistics.median(runs):.2f} GB/s (runs: {', '.join(f'{r:.2f}' for r in runs)})")
        source = memoryview(bytearray(b"\2" * size))
        copies = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            into[:] = source
            copies.append(size / (time.perf_counter() - started) / 1e9)
        print(f"bare copy between touched buffers: {statistics.median(copies):.2f} GB/s")


if __name__ == "__main__":
    main()
