"""Optional TLS on every connection, for networks you do not trust (the hello's
authentication keeps strangers out, but without TLS the bytes themselves travel in the clear
and an on-path attacker could read or alter them).

Each role takes ``--tls-cert FILE --tls-key FILE`` (what it serves with) and ``--tls-ca FILE``
(the certificate authority that signed the cluster's servers: what it trusts when it
connects), or the same through ``$TECTOFS_TLS_CERT``, ``$TECTOFS_TLS_KEY``,
``$TECTOFS_TLS_CA``. Clients need only the CA. Every server of a cluster must use TLS once one
does. Certificates are checked against the CA, not against host names: the cluster's own CA
is what names its servers (servers register by address, often an IP).
"""

from __future__ import annotations

import os
import ssl
import subprocess

from tectofs.errors import InvalidArgument

CERT_ENV, KEY_ENV, CA_ENV = "TECTOFS_TLS_CERT", "TECTOFS_TLS_KEY", "TECTOFS_TLS_CA"


def server_context(cert: str | None = None, key: str | None = None) -> ssl.SSLContext | None:
    """What a server listens with: None (plain TCP) unless a certificate is given."""
    cert, key = cert or os.environ.get(CERT_ENV), key or os.environ.get(KEY_ENV)
    if not cert and not key:
        return None
    if not cert or not key:
        raise InvalidArgument("TLS needs both a certificate and its key (--tls-cert and --tls-key)")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"cannot load the TLS certificate {cert} / key {key}: {exc}") from None
    return context


def client_context(ca: str | None = None) -> ssl.SSLContext | None:
    """What connections are made with: None (plain TCP) unless a CA is given."""
    ca = ca or os.environ.get(CA_ENV)
    if not ca:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the cluster's CA names its servers (see the module docstring)
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        context.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise InvalidArgument(f"cannot load the TLS CA {ca}: {exc}") from None
    return context


def make_test_certificates(directory: str) -> dict[str, str]:
    """A throwaway CA and one server certificate signed by it (openssl), for a local cluster
    with TLS (``LocalCluster(tls=True)``, tests, benchmarks). Returns the paths: ca, cert, key."""
    os.makedirs(directory, exist_ok=True)
    paths = {name: os.path.join(directory, f"{name}.pem") for name in ("ca", "ca-key", "cert", "key", "csr")}
    if os.path.exists(paths["cert"]):
        return {k: paths[k] for k in ("ca", "cert", "key")}

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "30",
            "-subj", "/CN=tectofs test CA", "-keyout", paths["ca-key"], "-out", paths["ca"])
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj",
            "/CN=tectofs server", "-keyout", paths["key"], "-out", paths["csr"])
    openssl("x509", "-req", "-in", paths["csr"], "-CA", paths["ca"], "-CAkey", paths["ca-key"], "-CAcreateserial",
            "-days", "30", "-out", paths["cert"])
    for name in ("ca-key", "key"):
        os.chmod(paths[name], 0o600)
    return {k: paths[k] for k in ("ca", "cert", "key")}
