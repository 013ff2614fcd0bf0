#!/usr/bin/env bash
# Installs everything tectofs needs on a fresh Debian machine with Python 3.11 (as root):
# libfuse3 + fusermount3 for the mount (and libfuse3-dev, pkg-config and gcc: pip builds pyfuse3
# from source), the PostgreSQL server binaries for the store tests
# (tests/postgres.py starts a throwaway server; the system service is never started), the CPU
# build of PyTorch from this machine's disk (pinned first, so no dependency can pull a
# multi-GB CUDA build), and tectofs itself in editable mode with its test and benchmark
# extras. Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_UPDATED=""
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$APT_UPDATED" ]; then apt-get update -qq; APT_UPDATED=1; fi
    apt-get install -y -qq "$@" >/dev/null
}

if ! command -v fusermount3 >/dev/null 2>&1 || ! command -v pkg-config >/dev/null 2>&1 \
        || ! pkg-config --exists fuse3 || ! command -v gcc >/dev/null 2>&1; then
    echo "install.sh: installing fuse3, libfuse3-dev, pkg-config, gcc (apt; pyfuse3 builds against libfuse3)" >&2
    apt_install fuse3 libfuse3-3 libfuse3-dev pkg-config gcc
fi

if ! command -v openssl >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then
    # openssl: certificates for 'tectofs up --tls' and the TLS tests; setpriv: the multi-user mount tests
    echo "install.sh: installing openssl, util-linux (apt)" >&2
    apt_install openssl util-linux
fi

if ! command -v ip >/dev/null 2>&1; then
    # ip netns, veth, bridges: the multi-host test runs each server in its own network namespace
    echo "install.sh: installing iproute2 (apt)" >&2
    apt_install iproute2
fi

if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || ! command -v runuser >/dev/null 2>&1; then
    echo "install.sh: installing postgresql (apt; its service is not started)" >&2
    # policy-rc.d exit 101: Debian maintainer scripts must not start the service.
    policy=/usr/sbin/policy-rc.d
    made_policy=""
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; made_policy=1; fi
    apt_install postgresql util-linux || { [ -n "$made_policy" ] && rm -f "$policy"; exit 1; }
    if [ -n "$made_policy" ]; then rm -f "$policy"; fi
    compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || { echo "install.sh: postgresql installed no server binary" >&2; exit 1; }
fi

PIP="python3 -m pip"
if ! python3 -c "import torch, sys; sys.exit(0 if torch.__version__.startswith('2.13.0') else 1)" 2>/dev/null; then
    echo "install.sh: installing torch==2.13.0 (CPU)" >&2
    $PIP install -q --disable-pip-version-check "torch==2.13.0"
fi
echo "install.sh: installing tectofs (editable) with extras dev,torch" >&2
log=$(mktemp)
if ! $PIP install -q --disable-pip-version-check -e ".[dev,torch]" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi
rm -f "$log"
# pyenv only creates a shim for a new console script on rehash.
if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
python3 -c "import tectofs.client, tectofs.s3, tectofs.tensor_codec, pyfuse3, pyfuse3.asyncio, pyeclib, crc32c, torch, psycopg, fsspec, aiohttp, boto3, s3fs, pyarrow" || { echo "install.sh: import check failed" >&2; exit 1; }
command -v tectofs >/dev/null || { echo "install.sh: the tectofs command is not on PATH ($(python3 -m site --user-base)/bin?)" >&2; exit 1; }
