#!/usr/bin/env bash
# The 2-GPU NCCL captures of tests/fixtures/ranks/nccl_*/ (issue 19) with Nsight Systems 2025.3.1, on the
# 2-GPU machine (device kind nvidia-h200-x2). Run from the checkout's root:
#   bash tests/gpu_programs/nccl_ranks.sh DEBS DEST [CASE...]
# DEBS: libdw1 and libelf1 .debs (the 2025.3.1 importer needs libdw.so.1; ../shared/nsys-lab/README.md).
# DEST gets device_env.txt (nvidia-smi, the GPUs' link matrix, nsys, torch and NCCL versions),
# allreduce_bandwidth.txt (tests/gpu_programs/allreduce_bandwidth.py), captures.log and nccl.tar.xz (per
# case: rank records, exports, metrics, and 2025.3.1's cuda_gpu_kern_sum CSV per rank).
# N: the nsys to use (default 2025.3.1 inside Nsight Compute); SITE: a folder of carried packages for
# PYTHONPATH; AGAIN: cases to capture once more, into again/; CAPTURE_S: the captures' time limit.
set -uo pipefail
debs=$(cd "${1:?DEBS}" && pwd); shift
mkdir -p "${1:?DEST}"; dest=$(cd "$1" && pwd); shift
# NVLink multicast stays off on these shared machines (KINDS.md), in every process started here.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
mkdir -p /tmp/dw /tmp/nbin
for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ln -sfn "${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}" /tmp/nbin/nsys
export PATH=/tmp/nbin:$PATH PYTHONPATH=$(pwd)${SITE:+:$SITE} PYTHONUNBUFFERED=1
{ nvidia-smi; nvidia-smi topo -m; nsys --version
  python3 -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version(), "gpus", torch.cuda.device_count())'
} > "$dest/device_env.txt" 2>&1
SECONDS=0
timeout 150 python3 tests/gpu_programs/allreduce_bandwidth.py > "$dest/allreduce_bandwidth.txt" 2>&1
echo "bandwidth: rc=$? ${SECONDS}s" | tee -a "$dest/captures.log"
W=/tmp/nccl; rm -rf $W
timeout "${CAPTURE_S:-400}" python3 tests/fixtures/ranks/make_nccl_captures.py $W "$@" >> "$dest/captures.log" 2>&1
echo "captures: rc=$? ${SECONDS}s" | tee -a "$dest/captures.log"
if [ -n "${AGAIN:-}" ]; then  # these cases once more, into again/, to see how a rerun differs
  timeout "${CAPTURE_S:-400}" python3 tests/fixtures/ranks/make_nccl_captures.py $W/again $AGAIN >> "$dest/captures.log" 2>&1
  echo "again: rc=$? ${SECONDS}s" | tee -a "$dest/captures.log"
fi
for export in $W/*/rank*.sqlite $W/again/*/rank*.sqlite; do
  [ -f "$export" ] || continue
  nsys stats --report cuda_gpu_kern_sum --format csv --output "${export%.sqlite}" "$export" > /dev/null 2>&1
done
tar cJf "$dest/nccl.tar.xz" -C $W .
echo "done: ${SECONDS}s; $(du -sh $W | cut -f1) of captures" | tee -a "$dest/captures.log"
