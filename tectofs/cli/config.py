"""The client configuration file, and the precedence flag > environment > file.

The file is ``$TECTOFS_CONFIG``, else ``config.toml`` in the user's tectofs config directory
(``tectofs.wire.auth.config_dir()``: ``$TECTOFS_CONFIG_DIR``, ``$XDG_CONFIG_HOME/tectofs`` or
``~/.config/tectofs``). It is TOML with these keys, all optional::

    meta = "10.0.0.1:7420,10.0.0.2:7420"     # like --meta / $TECTOFS_META
    credentials = "~/tectofs/alice.credentials"  # like --credentials / $TECTOFS_CREDENTIALS
    tls_ca = "/etc/tectofs/ca.pem"           # like --tls-ca / $TECTOFS_TLS_CA

A missing default file is no error; a missing ``$TECTOFS_CONFIG``, a file that is not valid
TOML, an unknown key or a value that is not a string is (:class:`ConfigError`), so a typo
never silently sends commands to another cluster.
"""

from __future__ import annotations

import os

CONFIG_ENV = "TECTOFS_CONFIG"
# key in the file -> the environment variable that overrides it
KEYS = {"meta": "TECTOFS_META", "credentials": "TECTOFS_CREDENTIALS", "tls_ca": "TECTOFS_TLS_CA"}
_PATH_KEYS = ("credentials", "tls_ca")


class ConfigError(Exception):
    """The configuration file cannot be used; the message names the file and the problem."""


def path() -> tuple[str, bool]:
    """The configuration file to read, and whether it was asked for explicitly (``$TECTOFS_CONFIG``)."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return os.path.expanduser(explicit), True
    from tectofs.wire.auth import config_dir

    return os.path.join(config_dir(), "config.toml"), False


def load() -> dict[str, str]:
    """The file's settings (paths ``~``-expanded); ``{}`` when there is no default file."""
    import tomllib

    file, explicit = path()
    try:
        with open(file, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        if explicit:
            raise ConfigError(f"{file} (from ${CONFIG_ENV}) does not exist") from None
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{file}: {exc}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{file}: unknown key {unknown[0]!r} (known: {', '.join(KEYS)})")
    settings: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(value, str):
            raise ConfigError(f"{file}: {key} must be a string, not {type(value).__name__}")
        settings[key] = os.path.expanduser(value) if key in _PATH_KEYS else value
    return settings


def resolve(key: str, flag: str | None, settings: dict[str, str]) -> str | None:
    """``flag`` if given, else the environment variable for ``key``, else the file's value."""
    return flag or os.environ.get(KEYS[key]) or settings.get(key) or None
