"""What every ``tectofs`` command shares: sizes, flags, the client connection, progress."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from tectofs import limits

DEFAULT_PORT = 7420
KEY_HELP = "cluster key file (default: $TECTOFS_KEY_FILE; 'tectofs init' or 'tectofs up' makes one)"


def _size(text: str) -> int:
    """``"64M"`` / ``"1GiB"`` / ``"4096"`` -> bytes."""
    units = {"": 1, "K": limits.KiB, "M": limits.MiB, "G": limits.GiB}
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1] if value and value[-1] in "KMG" else ""
    number = value[: len(value) - len(unit)]
    try:
        return int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r}: use e.g. 4096, 64M, 1G") from None


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def _metrics_listen(text: str) -> tuple[str, int]:
    from tectofs.metrics import parse_listen  # prometheus_client only for servers that export

    try:
        return parse_listen(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _write_atomically(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def add_tls_flags(p: argparse.ArgumentParser, serves: bool) -> None:
    if serves:
        p.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (default: $TECTOFS_TLS_CERT)")
        p.add_argument("--tls-key", metavar="FILE", help="... and this private key (default: $TECTOFS_TLS_KEY)")
    p.add_argument("--tls-ca", metavar="FILE",
                   help="connect with TLS, trusting servers this CA signed (default: $TECTOFS_TLS_CA)")


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics", metavar="HOST:PORT", type=_metrics_listen,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free one; default: off)")
    p.add_argument("--metrics-ready-file", metavar="FILE", help="write the metrics HOST:PORT here once serving")


def add_client_flags(p: argparse.ArgumentParser) -> None:
    add_tls_flags(p, serves=False)
    p.add_argument("--meta", help="metadata service HOST:PORT, or several (HOST:PORT,HOST:PORT: failover) (default: $TECTOFS_META)")
    p.add_argument("--credentials", metavar="FILE",
                   help="credential file of the user to act as (default: $TECTOFS_CREDENTIALS, else the one"
                   " 'tectofs up' wrote for this address under ~/.config/tectofs/credentials/)")


def client_command(sub: Any, name: str, fn: Callable[[argparse.Namespace], None], help_text: str) -> argparse.ArgumentParser:
    """A subcommand that talks to a cluster: the connection flags, and ``fn`` to run."""
    p = sub.add_parser(name, help=help_text, description=help_text)
    add_client_flags(p)
    p.set_defaults(fn=fn)
    return p


def _meta_address(args: argparse.Namespace) -> str:
    address = args.meta or os.environ.get("TECTOFS_META")
    if not address:
        raise SystemExit("tectofs: no metadata service given: use --meta HOST:PORT[,HOST:PORT...] or set TECTOFS_META")
    return str(address)


def _client(args: argparse.Namespace) -> Any:
    from tectofs.client import connect

    return connect(_meta_address(args), getattr(args, "credentials", None))


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc, disable=not enabled,
                file=sys.stderr, leave=False)


def _copy(src: Any, dst: Any, total: int, desc: str, show: bool) -> int:
    buffer = bytearray(8 * limits.MiB)
    view = memoryview(buffer)
    done = 0
    with _progress(total, desc, show) as bar:
        while True:
            n = src.readinto(view)
            if not n:
                break
            dst.write(view[:n])
            done += n
            bar.update(n)
    return done
