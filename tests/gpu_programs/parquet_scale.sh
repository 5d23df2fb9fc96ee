#!/usr/bin/env bash
# The analysis of one generated 10M-kernel export through SQLite and through a parquetdir (written by
# benchmarks/to_parquetdir.py), against `nsys stats` on the same SQLite, on the GPU machine's cores
# (benchmarks/ENGINE.md). Run from the checkout's root with duckdb and duckdb-ext-sqlite in SITE:
#   bash tests/gpu_programs/parquet_scale.sh DEBS SITE DEST [KERNELS]
set -uo pipefail
debs=$(cd "${1:?DEBS}" && pwd); site=${2:?SITE}
mkdir -p "${3:?DEST}"; dest=$(cd "$3" && pwd); kernels=${4:-10M}
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
mkdir -p /tmp/dw; for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$site:$(pwd) PYTHONUNBUFFERED=1
W=/tmp/pqscale; rm -rf $W; mkdir -p $W
T=$dest/timings.txt; { date -u; nproc; "$N" --version; python3 --version; } > "$T" 2>&1
. tests/gpu_programs/timed.sh
timed generate python3 benchmarks/generate_export.py "$kernels" -o $W/x.sqlite
timed to_parquet python3 benchmarks/to_parquetdir.py $W/x.sqlite $W/x.parquetdir
analyze=(python3 -c 'import sys; from sftprof.cli import main; sys.exit(main())' analyze)
for i in 1 2; do
  timed "parquetdir_$i" "${analyze[@]}" $W/x.parquetdir -o $W/p$i
  timed "sqlite_$i" "${analyze[@]}" $W/x.sqlite -o $W/s$i
done
timed nsys_stats "$N" stats -q -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum --format csv -o $W/st --force-overwrite true $W/x.sqlite
for i in 1 2; do diff -rq -x analysis.json $W/p$i/analysis $W/s$i/analysis && echo "run $i: routes identical ($(ls $W/p$i/analysis | wc -l) files)"; done | tee -a "$T"
