#!/usr/bin/env bash
# benchmarks/floor.py on the GPU machine's cores: an export generated from each SEED to KERNELS, decoded alone,
# loaded, analysed, and `nsys stats` (2025.3.1) on it, one after the other. Run from the checkout's root with
# duckdb and duckdb-ext-sqlite in SITE:
#   bash tests/gpu_programs/floor.sh DEBS SITE DEST KERNELS SEED [SEED...]
set -uo pipefail
debs=$(cd "${1:?DEBS}" && pwd); site=${2:?SITE}
mkdir -p "${3:?DEST}"; dest=$(cd "$3" && pwd); kernels=${4:?KERNELS}; shift 4
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
mkdir -p /tmp/dw; for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 PYTHONPATH=$site:$(pwd)
W=/tmp/floor; rm -rf $W; mkdir -p $W
T=$dest/timings.txt; { date -u; nproc; "$N" --version; python3 --version; } >> "$T" 2>&1
. tests/gpu_programs/timed.sh
for seed in "$@"; do
  name=$(basename "${seed%.xz}" .sqlite)
  case $seed in *.xz) xz -dc "$seed" > $W/seed.sqlite; seed=$W/seed.sqlite ;; esac
  timed "generate_$name" python3 benchmarks/generate_export.py "$kernels" -o "$W/$name.sqlite" --seed "$seed"
  python3 benchmarks/floor.py --nsys "$N" --runs "${ROUNDS:-1}" --out "$dest/floor_$name.csv" "$W/$name.sqlite" \
    2>> "$dest/floor_$name.err" | tee -a "$T"
  rm -f "$W/$name.sqlite"
done
