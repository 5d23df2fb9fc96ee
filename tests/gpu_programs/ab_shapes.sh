#!/usr/bin/env bash
# Two checkouts' `sftprof analyze` on one export generated from SEED to KERNELS, one run after the other
# (alternating, ROUNDS times, through SQLite and, with PARQUET=1, through a parquetdir written by
# benchmarks/to_parquetdir.py), against `nsys stats` on the same SQLite, on the GPU machine's cores; then
# whether both checkouts' saved tables are identical. Run from the new checkout's root with duckdb (and
# duckdb-ext-sqlite) in SITE and the old checkout's sftprof/ under OLD:
#   bash tests/gpu_programs/ab_shapes.sh DEBS SITE DEST OLD SEED [KERNELS]
set -uo pipefail
debs=$(cd "${1:?DEBS}" && pwd); site=${2:?SITE}
mkdir -p "${3:?DEST}"; dest=$(cd "$3" && pwd); old=$(cd "${4:?OLD}" && pwd); seed=${5:?SEED}; kernels=${6:-10M}
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
mkdir -p /tmp/dw; for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
W=/tmp/abshapes; rm -rf $W; mkdir -p $W
T=$dest/timings.txt; { date -u; nproc; "$N" --version; python3 --version; echo "seed $seed, $kernels"; } >> "$T" 2>&1
. tests/gpu_programs/timed.sh
case $seed in *.xz) xz -dc "$seed" > $W/seed.sqlite; seed=$W/seed.sqlite ;; esac
PYTHONPATH=$site:$(pwd) timed generate python3 benchmarks/generate_export.py "$kernels" -o $W/x.sqlite --seed "$seed"
inputs=(x.sqlite)
if [ "${PARQUET:-0}" = 1 ]; then
  PYTHONPATH=$site:$(pwd) timed to_parquet python3 benchmarks/to_parquetdir.py $W/x.sqlite $W/x.parquetdir
  inputs+=(x.parquetdir)
fi
analyze=(python3 -c 'import sys; from sftprof.cli import main; sys.exit(main())' analyze)
for i in $(seq "${ROUNDS:-2}"); do
  for input in "${inputs[@]}"; do
    PYTHONPATH=$site:$old timed "old_${input}_$i" "${analyze[@]}" $W/$input -o $W/old_${input}_$i
    PYTHONPATH=$site:$(pwd) timed "new_${input}_$i" "${analyze[@]}" $W/$input -o $W/new_${input}_$i
  done
done
timed nsys_stats "$N" stats -q -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum --format csv -o $W/st --force-overwrite true $W/x.sqlite
for run in $W/new_*; do
  diff -rq "${run/new_/old_}/analysis" "$run/analysis" && echo "${run##*/}: identical to old ($(ls $run/analysis | wc -l) files)"
done | tee -a "$T"
