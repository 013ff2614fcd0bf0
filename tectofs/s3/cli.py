"""``tectofs s3``: serve the gateway, or print a user's S3 keys (``tectofs s3 keys``).

Kept beside the gateway so ``tectofs/cli.py`` only registers it (:func:`add_parser`).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from tectofs.s3_env import env_lines


def _listen(text: str) -> tuple[str, int]:
    """``--listen HOST:PORT`` (``:PORT``: 127.0.0.1), the port checked as every tectofs port option's."""
    from tectofs.arguments.numbers import PORT

    host, _, port = text.rpartition(":")
    try:
        return host or "127.0.0.1", PORT(port)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"bad --listen {text!r}: use HOST:PORT ({exc})") from None


def cmd_serve(args: argparse.Namespace, serve: Callable[..., None]) -> None:
    from tectofs.wire import auth

    try:
        from .server import S3Gateway
    except ImportError as exc:
        raise SystemExit(f"tectofs s3: {exc}: the gateway needs aiohttp (pip install 'tectofs[s3]')") from None

    meta = args.meta or os.environ.get("TECTOFS_META")
    key_file = auth.key_file_from(args.key_file)
    if not meta or not key_file:
        sys.stderr.write("tectofs s3: needs --meta HOST:PORT (or $TECTOFS_META) and --key-file (or $TECTOFS_KEY_FILE):"
                         " the gateway acts as each S3 user, which only a cluster key holder may" + "\n")
        raise SystemExit(2)  # a configuration error (README's exit table: tectofs.cli.exits.USAGE)
    args.host, args.port = args.listen
    serve(lambda: S3Gateway(meta, key_file), args,
          lambda address: f"tectofs S3 gateway on http://{address} (metadata {meta})")


def cmd_keys(args: argparse.Namespace) -> None:
    """Print the caller's S3 key pair (from their credential, or root's from a key file)."""
    from tectofs.wire import auth

    from .principals import keys_of

    if args.key_file:
        credential = auth.Credential.root_from_keys(auth.KeyRing(args.key_file))
    else:
        meta = getattr(args, "meta", None) or os.environ.get("TECTOFS_META") or ""
        found = auth.find_credential(meta, args.credentials) if (meta or args.credentials) else None
        if found is None:
            sys.stderr.write("tectofs s3 keys: no credential: pass --credentials FILE or --meta HOST:PORT (or --key-file"
                             " for root's keys)" + "\n")
            raise SystemExit(2)  # a configuration error (README's exit table: tectofs.cli.exits.USAGE)
        credential = found
    print(env_lines(*keys_of(credential)), end="")


def add_parser(sub: Any, serve: Callable[..., None]) -> None:
    """Register ``tectofs s3`` (``serve`` runs a server until SIGINT/SIGTERM: cli's ``_serve_bound``)."""
    p = sub.add_parser("s3", help="run the S3-compatible gateway; 'tectofs s3 keys' prints your S3 keys",
                       description="Serve S3 (SigV4, path-style) over the cluster: buckets are top-level directories,"
                       " objects are files. Access keys: a user's name and a secret derived from its credential"
                       " ('tectofs s3 keys').")
    p.add_argument("--meta", help="metadata service HOST:PORT[,HOST:PORT...] (default: $TECTOFS_META)")
    p.add_argument("--listen", type=_listen, default=("127.0.0.1", 9000), metavar="HOST:PORT",
                   help="address to serve S3 on (default 127.0.0.1:9000; port 0: any)")
    p.add_argument("--key-file", help="cluster key file (default: $TECTOFS_KEY_FILE)")
    p.add_argument("--ready-file", help="write the listening address here once serving")
    from tectofs.cli.common import add_metrics_flags  # here: tectofs.cli imports this module

    add_metrics_flags(p)  # the gateway's client registry: tectofs_s3_*, tectofs_client_*
    p.set_defaults(fn=lambda args: cmd_serve(args, serve))
    actions = p.add_subparsers(dest="s3_command", metavar="ACTION")
    k = actions.add_parser("keys", help="print your S3 keys as AWS_ACCESS_KEY_ID= / AWS_SECRET_ACCESS_KEY= lines",
                           description="Print the S3 key pair of the user your credential names, as"
                           " AWS_ACCESS_KEY_ID=... and AWS_SECRET_ACCESS_KEY=... lines (eval or source them for"
                           " awscli, boto3, s3fs). With --key-file, root's pair, derived from the cluster key.")
    k.add_argument("--meta", default=argparse.SUPPRESS, help="metadata service whose credential to use")
    k.add_argument("--credentials", metavar="FILE", help="credential file (default: as other client commands find it)")
    k.add_argument("--key-file", default=None, dest="key_file", help="print root's keys, derived from this cluster key")
    k.set_defaults(fn=cmd_keys)
