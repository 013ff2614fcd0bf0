"""What every ``tectofs`` command shares: flags, the client connection, usage errors (numbers: :mod:`.numbers`)."""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable

from .output import human as _human  # noqa: F401  # servers and admin print sizes with it

DEFAULT_PORT = 7420
KEY_HELP = "cluster key file (default: $TECTOFS_KEY_FILE; 'tectofs init' or 'tectofs up' makes one)"


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
    p.add_argument("--meta", metavar="HOST:PORT[,...]",
                   help="metadata service HOST:PORT, or several (HOST:PORT,HOST:PORT: failover) (default:"
                   " $TECTOFS_META, else 'meta' in the config file)")
    p.add_argument("--credentials", metavar="FILE",
                   help="credential file of the user to act as (default: $TECTOFS_CREDENTIALS, else 'credentials' in"
                   " the config file, else the one 'tectofs up' wrote for this address under"
                   " ~/.config/tectofs/credentials/)")


def client_command(sub: Any, name: str, fn: Callable[[argparse.Namespace], None], help_text: str,
                   json_output: bool = False, short_help_flag: bool = True) -> argparse.ArgumentParser:
    """A subcommand that talks to a cluster: the connection flags, ``--json`` if it has such
    output, and ``fn`` to run. ``short_help_flag=False``: only ``--help`` (``-h`` means
    human-readable sizes there, as in ls, du and df)."""
    p = sub.add_parser(name, help=help_text, description=help_text, add_help=short_help_flag)
    if not short_help_flag:
        p.add_argument("--help", action="help", help="show this help message and exit")
    add_client_flags(p)
    if json_output:
        p.add_argument("--json", action="store_true", help="print JSON instead of text (for scripts)")
    p.set_defaults(fn=fn)
    return p


def _meta_address(args: argparse.Namespace) -> str:
    """``--meta``, else ``$TECTOFS_META``, else the config file's (``options.apply`` resolved it)."""
    address = getattr(args, "meta", None) or os.environ.get("TECTOFS_META")
    if not address:
        raise UsageError("no metadata service given: use --meta HOST:PORT[,HOST:PORT...], set TECTOFS_META, or put"
                         " meta = \"HOST:PORT\" in the config file")
    return checked_address(str(address))


def checked_address(address: str) -> str:
    """``address`` if it is ``HOST:PORT[,HOST:PORT...]``; else a usage error (exit status 2)."""
    from tectofs.errors import InvalidArgument
    from tectofs.wire.transport import parse_group

    try:
        parse_group(address)
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None
    return address


def check_credentials(path: str) -> None:
    """A usage error (exit status 2) unless ``path`` can be read as a credential file."""
    from tectofs.errors import InvalidArgument
    from tectofs.wire.auth import Credential

    try:
        Credential.load(path)
    except InvalidArgument as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # unreadable: permissions, a directory ...
        raise UsageError(f"credential file {path}: {exc.strerror or exc}") from None


def _client(args: argparse.Namespace, address: str | None = None) -> Any:
    """A connected ``tectofs.client.FileSystem`` (use it in ``with``): to ``address``, else the command's cluster."""
    from tectofs.client import connect

    address = checked_address(address) if address else _meta_address(args)
    return connect(address, getattr(args, "credentials", None))  # checked by options.apply


class UsageError(Exception):
    """The command line cannot work as given (exit status 2, one line, no traceback)."""
