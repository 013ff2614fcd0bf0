"""The ``tectofs`` command: servers (``up``, ``meta``, ``chunk``, ``mount``) and client commands.

Client commands find the metadata service through ``--meta HOST:PORT[,HOST:PORT...]`` (a failover group) or
``$TECTOFS_META``. One module per family of commands: ``servers``, ``files``, ``admin``; what they share is in
``common``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tectofs.errors import TectofsError

from . import admin, files, servers
from .servers import _serve_bound


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tectofs",
        description="Distributed checkpoint storage: erasure-coded chunk servers, a metadata service, "
        "a client library, a FUSE mount and a PyTorch plugin.",
        epilog="Start here: 'tectofs up --root /tmp/tectofs' runs a local cluster; then "
        "'export TECTOFS_META=127.0.0.1:7420' and use put/get/ls.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    servers.add_parsers(sub)
    files.add_parsers(sub)
    admin.add_parsers(sub)
    from tectofs.s3 import cli as s3_cli

    s3_cli.add_parser(sub, _serve_bound)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its own parser, options and --help included
        from tectofs.bench import main as bench_main

        raise SystemExit(bench_main(argv[1:]))
    args = build_parser().parse_args(argv)
    for flag, env in (("tls_cert", "TECTOFS_TLS_CERT"), ("tls_key", "TECTOFS_TLS_KEY"), ("tls_ca", "TECTOFS_TLS_CA")):
        if getattr(args, flag, None):
            os.environ[env] = getattr(args, flag)  # every connection this process makes or serves
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    try:
        args.fn(args)
    except TectofsError as exc:
        raise SystemExit(f"tectofs {args.command}: {exc}") from None
    except (FileNotFoundError, PermissionError, IsADirectoryError) as exc:
        raise SystemExit(f"tectofs {args.command}: {exc}") from None
    except KeyboardInterrupt:
        # What was being written was aborted on the way out (nothing half-written is published).
        print(f"\ntectofs {args.command}: interrupted; nothing it was writing was published", file=sys.stderr)
        raise SystemExit(130) from None

