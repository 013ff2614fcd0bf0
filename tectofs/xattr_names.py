"""Which extended attribute names tectofs keeps: ``user.*``, ``trusted.*`` and ``security.*``
(rules for each in ``store/xattrs.py``). ``system.*`` (POSIX ACLs) and any other namespace
are not supported (EOPNOTSUPP, which tells ``cp -a`` and ``tar`` to go on without them).

Nor is ``security.selinux``: the kernel labels a FUSE file system from the host's policy
(``genfscon``), and with SELinux on it answers and refuses that name itself, never asking the
file system; without SELinux nothing reads a stored label. Saying so (EOPNOTSUPP) rather than
"no such attribute" lets ``ls -l``, which probes it on every file it lists for the ``.`` after
the mode, learn once per mount that labels are not supported (coreutils caches that per
device): a tree of 5,000 files cost 5,080 kernel requests per ``ls -lR`` before.

One rule for both sides: the metadata service enforces it, and the client applies it before
asking, so a name that cannot exist costs no round trip (``ls -l`` probes
``system.posix_acl_access`` on every file it lists).
"""

from __future__ import annotations

from . import limits
from .errors import AttributeNameTooLong, NotSupported

NAMESPACES = ("user.", "trusted.", "security.")
NOT_KEPT = frozenset({"security.selinux"})
CAPABILITY = "security.capability"  # file capabilities: a write by an unprivileged process drops them


def namespace_of(name: str) -> str:
    """The namespace of ``name`` (``"user."`` ...); raises ``AttributeNameTooLong`` for a name
    of more than ``limits.xattr_name_max_bytes`` (ERANGE, as Linux) and ``NotSupported`` for
    a name outside ``NAMESPACES``, with nothing after its namespace, or in ``NOT_KEPT``."""
    encoded = len(name.encode("utf-8", "surrogateescape"))
    if encoded > limits.xattr_name_max_bytes:
        raise AttributeNameTooLong(
            f"extended attribute name of {encoded} bytes: at most {limits.xattr_name_max_bytes}")
    if name in NOT_KEPT:
        raise NotSupported(f"extended attribute {name}: a FUSE file system's SELinux labels come from the host's"
                           " policy, not from the file system")
    for namespace in NAMESPACES:
        if name.startswith(namespace) and len(name) > len(namespace):
            return namespace
    raise NotSupported(f"extended attribute {name[:60]!r}: tectofs keeps the namespaces {', '.join(NAMESPACES)}")
