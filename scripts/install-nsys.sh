#!/usr/bin/env bash
# Install the Nsight Systems CLI and NVTX v2 from Debian 12's non-free archive (needs root).
#
# Why the symlink: Debian installs QdstrmImporter under /usr/lib/nsight-systems/host-linux-x64,
# but `nsys profile` looks for it next to its own target directory. Without the link every
# capture ends as a bare .qdstrm (sftprof salvages that too, but the link makes nsys do it).
# libnvtoolsext1 provides libnvToolsExt.so.1: the NVTX v2 library whose ranges nsys 2022.4
# records on a CPU-only machine (the `nvtx` PyPI package's ranges are not recorded there).
# --no-install-recommends: libcuda1 recommends the NVIDIA kernel driver, which dkms would build.
set -euo pipefail
importer_dir=/usr/lib/nsight-systems/host-linux-x64
expected=/usr/lib/x86_64-linux-gnu/nsight-systems/host-linux-x64
if command -v nsys >/dev/null && [ -e /usr/lib/x86_64-linux-gnu/libnvToolsExt.so.1 ] && [ -e "$expected" ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-nsys.sh: needs root to apt-get install nsight-systems (run it with sudo)" >&2
  exit 1
fi
sources=/etc/apt/sources.list.d/debian.sources
if [ -f "$sources" ] && ! grep -q '^Components:.*non-free' "$sources"; then
  sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$sources"
elif [ -f /etc/apt/sources.list ] && ! grep -q 'non-free' /etc/apt/sources.list; then
  sed -i -E 's/^(deb .* main)$/\1 contrib non-free non-free-firmware/' /etc/apt/sources.list
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nsight-systems nsight-systems-target libnvtoolsext1 >/dev/null
if [ -d "$importer_dir" ] && [ ! -e "$expected" ]; then
  ln -sfn "$importer_dir" "$expected"
fi
nsys --version
