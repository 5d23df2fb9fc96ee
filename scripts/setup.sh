#!/usr/bin/env bash
# Set up sftprof on Debian 12 (as root, or with sudo rights for apt): Nsight Systems from
# Debian non-free, then a virtual environment .venv with the pinned Python packages.
# With --tests, also what the tests drive for real: OpenSSH (client and server, for the
# transfer tests) and headless Chromium (for the report). The tests start Slurm themselves
# (scripts/slurm-up.sh installs it). Safe to run again: each step skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--tests" ]; then
  missing=()
  command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
  command -v ssh-keygen >/dev/null || missing+=(openssh-client)
  command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)
  if [ "${#missing[@]}" -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

# On a cluster login node nsys usually comes from a module (`module load nsight-systems`) and
# there is no root: then use that one. Otherwise install Debian's.
if command -v nsys >/dev/null && [ "$(id -u)" -ne 0 ]; then
  echo "using $(command -v nsys) ($(nsys --version))"
else
  scripts/install-nsys.sh
fi

if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv python3-pip >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
# CPU PyTorch, pinned: an unpinned resolve would pull a multi-GB CUDA build. On a machine
# without a local copy of this wheel, point PIP_EXTRA_INDEX_URL at PyTorch's CPU index.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
.venv/bin/sftprof --version
scripts/install-slurm-profile.sh
