"""The ``s3.env`` file: a credential's S3 keys as ``source``-able lines, what ``--env-file``
options read. Below both its writers: the local cluster (``tectofs up`` writes the root
user's) and the S3 command line (``tectofs s3 keys``), so the cluster does not depend on the
S3 gateway's command line."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a file is written: `tectofs --help` stays fast
    from tectofs.wire import auth

ENV_FILE_NAME = "s3.env"


def env_lines(access_key: str, secret_key: str) -> str:
    """The lines of an ``s3.env`` file (``source``-able, and what ``--env-file`` options read)."""
    return f"AWS_ACCESS_KEY_ID={access_key}\nAWS_SECRET_ACCESS_KEY={secret_key}\n"


def write_env_file(path: str, credential: auth.Credential) -> str:
    """Write the credential's S3 keys to ``path`` (mode 0600, atomically) as :func:`env_lines`:
    its user is the access key id, :func:`tectofs.wire.auth.s3_secret_key` of its secret the
    secret access key (``tectofs.s3.principals.keys_of``)."""
    from tectofs.wire import auth

    auth._write_private(path, env_lines(credential.user, auth.s3_secret_key(credential.secret)))  # 0600, never half-written
    return path
