"""Global options: accepted before and after the subcommand, and what they set up.

Logging and verbosity options (``-v``, ``-q``, ``--log-level``, ``--log-format``,
``--log-file``) are added to the top-level parser and to every subcommand's parser (servers'
included, without touching their modules: :func:`spread`), each with a suppressed default, so
whichever position gives them wins and an absent one never overwrites a present one.

The client's connection options (``--meta``, ``--credentials``, ``--tls-ca``) and ``--json``
live on each client command; the top-level parser accepts them too (``tectofs --meta X ls``)
under their own ``top_*`` names, and :func:`apply` moves them over unless the subcommand's own
copy was given. Then, for client commands: flag > environment > configuration file
(:mod:`tectofs.cli.config`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from tectofs import logs
from tectofs.arguments.parser import HelpFormatter as HelpFormatter
from tectofs.arguments.parser import Parser as Parser

from . import config
from .common import UsageError, check_credentials, checked_address

# dest -> default when no position gave it
_LOGGING_DEFAULTS: dict[str, bool | None] = {"verbose": False, "quiet": False, "log_level": None,
                                             "log_format": None, "log_file": None}
_TOP_CLIENT = ("meta", "credentials", "tls_ca", "json")


class _Version(argparse.Action):
    """``--version``: the installed package's version, read only when asked (keeps ``--help`` fast)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: Any = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("tectofs")
        except PackageNotFoundError:  # a source tree on sys.path, not installed
            from tectofs import __version__ as text
        print(f"tectofs {text}")
        parser.exit()


def add_logging_options(p: argparse.ArgumentParser) -> None:
    """The logging options, with suppressed defaults, skipping any option string ``p`` already has."""
    group = p.add_argument_group("global options (before or after the command)")
    specs: list[tuple[tuple[str, ...], dict[str, Any]]] = [  # loose dict: add_argument's keyword arguments
        (("-v", "--verbose"), dict(action="store_true", help="log at INFO level (same as --log-level info)")),
        (("-q", "--quiet"), dict(action="store_true",
                                 help="print only errors and what was asked for: no progress, no summaries, "
                                      "log at ERROR level")),
        (("--log-level",), dict(choices=logs.LEVELS, type=str.lower,
                                help=f"log events at this level and above (default: ${logs.LEVEL_ENV}, else warning)")),
        (("--log-format",), dict(choices=logs.FORMATS,
                                 help=f"text (default), kv (key=value, one line per event) or json (one object per "
                                      f"line) (default: ${logs.FORMAT_ENV}, else text)")),
        (("--log-file",), dict(metavar="FILE",
                               help="append log events to FILE instead of stderr (reopened after logrotate moves it)")),
    ]
    for strings, kwargs in specs:
        fresh = tuple(s for s in strings if s not in p._option_string_actions)
        if fresh:
            group.add_argument(*fresh, default=argparse.SUPPRESS, **kwargs)


def add_top_level(p: argparse.ArgumentParser) -> None:
    """``--version``, the logging options and the client options given before the command."""
    p.add_argument("--version", action=_Version, help="print the version and exit")
    add_logging_options(p)
    client = p.add_argument_group("client options (also accepted after the command)")
    client.add_argument("--meta", dest="top_meta", metavar="HOST:PORT[,...]", default=argparse.SUPPRESS,
                        help="metadata service (default: $TECTOFS_META, else 'meta' in the config file)")
    client.add_argument("--credentials", dest="top_credentials", metavar="FILE", default=argparse.SUPPRESS,
                        help="credential file (default: $TECTOFS_CREDENTIALS, else the config file, else the one"
                             " 'tectofs up' wrote)")
    client.add_argument("--tls-ca", dest="top_tls_ca", metavar="FILE", default=argparse.SUPPRESS,
                        help="trust servers this CA signed (default: $TECTOFS_TLS_CA, else the config file)")
    client.add_argument("--json", dest="top_json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output (ls, stat, status, fsck, du, df)")


def subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``p`` (subcommands, their subcommands ...), each once."""
    found: dict[int, argparse.ArgumentParser] = {}
    todo = [p]
    while todo:
        for action in todo.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    if id(child) not in found:
                        found[id(child)] = child
                        todo.append(child)
    return list(found.values())


def spread(p: argparse.ArgumentParser) -> None:
    """Add the logging options to every parser below ``p``, except those without ``--help``
    (``bench``: all its arguments pass through to its own parser)."""
    for child in subparsers(p):
        if "--help" in child._option_string_actions:
            add_logging_options(child)


def apply(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill in what no position gave, set up logging, and resolve the client settings.

    Raises ``config.ConfigError`` (a bad configuration file), ``UsageError`` (a bad
    ``$TECTOFS_LOG_*`` value) and ``OSError`` (a log file that cannot be opened)."""
    for dest, default in _LOGGING_DEFAULTS.items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
    for name in _TOP_CLIENT:
        top = getattr(args, f"top_{name}", None)
        if top and not getattr(args, name, None):
            if name == "json" and not hasattr(args, "json"):
                parser.error(f"--json: 'tectofs {args.command}' has no JSON output")
            setattr(args, name, top)
    level = args.log_level or ("info" if args.verbose else "error" if args.quiet else None)
    try:
        logs.setup(level, args.log_format, args.log_file)
    except ValueError as exc:  # from $TECTOFS_LOG_LEVEL / $TECTOFS_LOG_FORMAT: the flags have choices
        raise UsageError(str(exc)) from None
    for value, env in ((level, logs.LEVEL_ENV), (args.log_format, logs.FORMAT_ENV)):
        if value:  # the servers 'tectofs up' starts log the same way
            os.environ[env] = value
    if getattr(args, "tls_ca", None):
        os.environ["TECTOFS_TLS_CA"] = args.tls_ca
    if hasattr(args, "credentials"):  # a client command: the config file applies
        settings = config.load()
        if hasattr(args, "meta"):
            args.meta = config.resolve("meta", args.meta, settings)
            if args.meta:  # a configuration error (2) now, not a failed connection later
                checked_address(args.meta)
        args.credentials = config.resolve("credentials", args.credentials, settings)
        if args.credentials:
            check_credentials(args.credentials)
        tls_ca = config.resolve("tls_ca", None, settings)
        if tls_ca:
            os.environ["TECTOFS_TLS_CA"] = tls_ca
