"""TLS on every connection (``tectofs up --tls``, ``--tls-cert/--tls-key/--tls-ca``): a
cluster that serves TLS works end to end, with authentication on top, and a client that does
not speak TLS, or does not trust the cluster's CA, gets nothing from it."""

from __future__ import annotations

import os
from typing import Any

import pytest

from tectofs.client import connect
from tectofs.errors import ConnectionLost
from tectofs.wire import tls

MiB = 1 << 20


def test_a_tls_cluster_serves_tls_clients_only(make_cluster: Any, tmp_path: Any, monkeypatch: Any) -> None:
    c = make_cluster(tls=True)
    data = os.urandom(3 * MiB + 11)
    c.fs.write_bytes("/over-tls", data)  # the cluster's own client trusts its CA
    assert c.fs.read_bytes("/over-tls") == data
    # Chunks of 2 MiB, which a chunk server sends from the file (sendfile) where it can: over
    # TLS the bytes must pass through the encrypting transport instead.
    c.fs.mkdir("/large-chunks", block_size=8 * MiB)
    large = os.urandom(9 * MiB + 5)
    c.fs.write_bytes("/large-chunks/f", large)
    assert c.fs.read_bytes("/large-chunks/f") == large
    with open(c.tls_files["cert"], "rb") as f:
        assert b"BEGIN CERTIFICATE" in f.read()
    monkeypatch.delenv(tls.CA_ENV)
    with pytest.raises(ConnectionLost, match="TLS"):
        connect(c.address, credentials=c.credential_file)
    other = tls.make_test_certificates(str(tmp_path / "other-ca"))  # a CA that did not sign the cluster's servers
    monkeypatch.setenv(tls.CA_ENV, other["ca"])
    with pytest.raises(ConnectionLost, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        connect(c.address, credentials=c.credential_file)
    monkeypatch.setenv(tls.CA_ENV, c.tls_files["ca"])
    with connect(c.address, credentials=c.credential_file) as fs:
        assert fs.read_bytes("/over-tls") == data
