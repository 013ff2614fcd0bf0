"""The ``tectofs`` command: servers (``up``, ``meta``, ``chunk``, ``mount``) and client commands.

Client commands find the metadata service through ``--meta HOST:PORT[,HOST:PORT...]`` (a failover group),
``$TECTOFS_META`` or the config file (:mod:`.config`). One module per family of commands: ``servers``,
``files`` (copying), ``listing`` (ls, stat, du, df), ``admin``; what they share is in ``common``, ``output``,
``options`` (global options), ``exits`` (exit statuses and error messages).

Contract of :func:`main`: every expected failure is one line ``tectofs CMD: message`` on stderr and an exit
status from :mod:`.exits`; Ctrl-C exits 130 and a closed stdout 141, without a traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from . import admin, agent, completion, exits, files, listing, options, output, servers
from .servers import _serve_bound


def build_parser() -> argparse.ArgumentParser:
    parser = options.Parser(
        prog="tectofs",
        description="Distributed checkpoint storage: erasure-coded chunk servers, a metadata service,\n"
        "a client library, a FUSE mount and a PyTorch plugin. 'tectofs COMMAND --help' for each command.",
        epilog="start here:\n  tectofs up --root /tmp/tectofs      # a local cluster, in one terminal\n"
        "  export TECTOFS_META=127.0.0.1:7420  # in another; then put, get, ls, cp ...\n\n"
        "configuration:\n  $TECTOFS_CONFIG, default ~/.config/tectofs/config.toml (TOML): meta, credentials, tls_ca;\n"
        "  a flag beats the environment, which beats the file.\n\n" + exits.EPILOG,
    )
    options.add_top_level(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    servers.add_parsers(sub)
    files.add_parsers(sub)
    listing.add_parsers(sub)
    admin.add_parsers(sub)
    agent.add_parser(sub, _serve_bound)
    from tectofs.s3 import cli as s3_cli

    s3_cli.add_parser(sub, _serve_bound)
    from . import check  # tectofs check (tectofs/check): records and checks histories of many clients

    check.add_parser(sub)
    completion.add_parser(sub, parser)
    options.spread(parser)
    return parser


def _command_name(args: argparse.Namespace) -> str:
    """``put``, ``user add``, ``admin drain``: what the error messages start with."""
    words = [args.command]
    for dest in ("admin_command", "user_command", "key_command", "s3_command"):
        if getattr(args, dest, None):
            words.append(getattr(args, dest))
    return " ".join(words)


def _command_word(parser: argparse.ArgumentParser, argv: list[str]) -> str:
    """The command ``argv`` names (its first word that is one), for a command line that did not parse."""
    commands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return next((word for word in argv if word in commands), "")


def _fail(name: str, message: str, status: int) -> None:
    """``tectofs NAME: message`` on stderr, as one line (escaped on a terminal), and exit ``status``."""
    print(f"tectofs {name}: {exits.one_line(output.shown(message, sys.stderr))}", file=sys.stderr)
    raise SystemExit(status)


def _quiet_after_interrupt() -> None:
    """Ctrl-C ends the command with one line. What it cut off is otherwise reported again as
    the interpreter exits: a client call's coroutine the interrupt caught before the client's
    event loop started it ("coroutine ... was never awaited", tectofs.client.sync) and any
    failure of an aborted send or read nobody waits for any more (asyncio's "Future exception
    was never retrieved"; the known one is retrieved in tectofs.wire.transport)."""
    import warnings

    warnings.filterwarnings("ignore", message="coroutine .* was never awaited", category=RuntimeWarning)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)


def _stdout_closed() -> None:
    """The reader of stdout went away: exit like coreutils under SIGPIPE, silently. Later
    writes (and the interpreter's final flush) go to /dev/null instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(exits.BROKEN_PIPE)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its own parser, options and --help included
        from tectofs.benchmarks.run import main as bench_main

        raise SystemExit(bench_main(argv[1:]))
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # a usage error (2), or --help / --version (0)
        raise SystemExit(exits.for_command(_command_word(parser, argv), exc.code) if isinstance(exc.code, int)
                         else exc.code) from None
    name = _command_name(args)
    for flag, env in (("tls_cert", "TECTOFS_TLS_CERT"), ("tls_key", "TECTOFS_TLS_KEY")):
        if getattr(args, flag, None):
            os.environ[env] = getattr(args, flag)  # every connection this process makes or serves
    try:
        options.apply(args, parser)
        args.fn(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
    except KeyboardInterrupt:
        # What was being written was aborted on the way out (nothing half-written is published).
        _quiet_after_interrupt()
        _fail(name, "interrupted; nothing it was writing was published", exits.INTERRUPTED)
    except BrokenPipeError:
        _stdout_closed()
    except Exception as exc:
        known = exits.describe(exc)
        if known is not None:
            logging.getLogger("tectofs.cli").debug("%s failed", name, exc_info=True)
            _fail(name, known[0], exits.for_command(args.command, known[1]))
        if logging.getLogger().isEnabledFor(logging.INFO):
            logging.getLogger("tectofs.cli").exception("%s: internal error", name)
        _fail(name, f"internal error (a bug, please report it): {type(exc).__name__}: {exc}"
              f"{'' if logging.getLogger().isEnabledFor(logging.INFO) else ' (-v shows the traceback)'}",
              exits.INTERNAL)
