#!/usr/bin/env bash
# What each Nsight Systems setting costs the built-in trainer's step, on the H200 with its nsys 2025.3.1
# (../shared/nsys-lab/README.md): overhead_matrix.py's runs, one JSON line each into $OUT/overhead.jsonl.
# Usage: overhead_matrix.sh DEBS [WORK]           on the GPU machine, in one call of at most 590 s
#        overhead_matrix.sh --dry-run [WORK]      on a CPU machine: the tiny CPU model, nsys command lines printed
# DEBS holds libdw1 and libelf1 (.deb), which 2025.3.1's importer needs there. WORK defaults to /tmp/overhead.
# BUDGET_S (default 540): no run starts that would not end by then; SIZES (default "small 1b"), REPEATS (2);
# SETTINGS (default: all of overhead_matrix.py's), space-separated.
# The table for docs: python3 tests/gpu_programs/overhead_table.py $OUT/overhead.jsonl
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=$(cd "$here/../.." && pwd)${PYTHONPATH:+:$PYTHONPATH}
out=${OUT:-/tmp/overhead_out}
if [ "${1:-}" = --dry-run ]; then
  exec python3 "$here/overhead_matrix.py" "${2:-/tmp/overhead}" "$out" --dry-run --repeats 1 --budget-s "${BUDGET_S:-300}"
fi
debs=${1:?debs}; work=${2:-/tmp/overhead}
mkdir -p /tmp/dw "$work" "$out"
for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nsys=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
"$nsys" --version
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# shellcheck disable=SC2086  # SIZES is a list of words
python3 "$here/overhead_matrix.py" "$work" "$out" --nsys "$nsys" --budget-s "${BUDGET_S:-540}" \
  --sizes ${SIZES:-small 1b} --repeats "${REPEATS:-2}" ${SETTINGS:+--settings $SETTINGS}
python3 "$here/overhead_table.py" "$out/overhead.jsonl" | tee "$out/overhead.md"
