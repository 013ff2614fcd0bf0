#!/usr/bin/env bash
# Installs everything tectofs needs on a fresh Debian machine with Python 3.11 (as root):
# libfuse3 + fusermount3 for the mount, the CPU build of PyTorch from this machine's disk
# (pinned first, so no dependency can pull a multi-GB CUDA build), and tectofs itself in
# editable mode with its test and benchmark extras. Safe to run again: it skips what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v fusermount3 >/dev/null 2>&1 || ! ldconfig -p 2>/dev/null | grep -q libfuse3; then
    echo "install.sh: installing fuse3 (apt)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq fuse3 libfuse3-3 >/dev/null
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
python3 -c "import tectofs.client, mfusepy, pyeclib, crc32c, torch" || { echo "install.sh: import check failed" >&2; exit 1; }
command -v tectofs >/dev/null || { echo "install.sh: the tectofs command is not on PATH ($(python3 -m site --user-base)/bin?)" >&2; exit 1; }
