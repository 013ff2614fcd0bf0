"""Which extended attribute names tectofs keeps: ``user.*``, ``trusted.*`` and ``security.*``
(rules for each in ``store/xattrs.py``). ``system.*`` (POSIX ACLs) and any other namespace
are not supported (EOPNOTSUPP, which tells ``cp -a`` and ``tar`` to go on without them).

One rule for both sides: the metadata service enforces it, and the client applies it before
asking, so a name that cannot exist costs no round trip (``ls -l`` probes
``system.posix_acl_access`` on every file it lists).
"""

from __future__ import annotations

from . import limits
from .errors import AttributeNameTooLong, NotSupported

NAMESPACES = ("user.", "trusted.", "security.")


def namespace_of(name: str) -> str:
    """The namespace of ``name`` (``"user."`` ...); raises ``AttributeNameTooLong`` for a name
    of more than ``limits.xattr_name_max_bytes`` (ERANGE, as Linux) and ``NotSupported`` for
    a name outside ``NAMESPACES`` or with nothing after its namespace."""
    encoded = len(name.encode("utf-8", "surrogateescape"))
    if encoded > limits.xattr_name_max_bytes:
        raise AttributeNameTooLong(
            f"extended attribute name of {encoded} bytes: at most {limits.xattr_name_max_bytes}")
    for namespace in NAMESPACES:
        if name.startswith(namespace) and len(name) > len(namespace):
            return namespace
    raise NotSupported(f"extended attribute {name[:60]!r}: tectofs keeps the namespaces {', '.join(NAMESPACES)}")
