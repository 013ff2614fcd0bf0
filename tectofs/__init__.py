"""tectofs: distributed checkpoint storage for large-scale PyTorch training.

Roles: the metadata service (``tectofs meta``), chunk servers (``tectofs chunk``), the client
library (:mod:`tectofs.client`), the FUSE mount (``tectofs mount``) and the PyTorch plugin
(:mod:`tectofs.torch`). ``tectofs up`` runs a whole cluster on one machine.
"""

__version__ = "0.1.0"


def connect(address: str | None = None, credentials: str | None = None):  # type: ignore[no-untyped-def]
    """Shortcut for :func:`tectofs.client.connect`."""
    from .client import connect as _connect

    return _connect(address, credentials)
