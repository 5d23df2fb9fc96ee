#!/usr/bin/env bash
# A real capture with GPU metrics and CPU context switches, the two tables besides kernels and API calls
# that grow fastest with a capture (issue 22): Nsight Systems 2025.3.1 on the GPU machine, the trainer's
# clean case on the small model (tests/fixtures/nsys2025/README.md), the workflow's options plus
# --gpu-metrics-devices=all --cpuctxsw=process-tree. Where nsys refuses one of the two (no permission
# for GPU counters or perf events), the capture is made again without it, and the log says which.
# Run from the checkout's root:
#   bash tests/gpu_programs/capture_metrics_sched.sh DEBS DEST
# DEBS: the libdw1 and libelf1 .debs (../shared/nsys-lab/README.md). DEST gets NAME.sqlite, the stats
# CSVs as NAME.<report>.csv, NAME.parquetdir.tar.xz, NAME.metrics.jsonl and the logs.
set -uo pipefail
debs=$(cd "${1:?DEBS}" && pwd)
mkdir -p "${2:?DEST}"; dest=$(cd "$2" && pwd)
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
mkdir -p /tmp/dw; for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$(pwd) PYTHONUNBUFFERED=1
W=/tmp/metrics_sched; rm -rf "$W"; mkdir -p "$W"
name=h200_sft_clean_metrics
python3 tests/gpu_programs/nsys2025_cases.py "$W/in" --device cuda > "$dest/inputs.log" 2>&1 || tail -5 "$dest/inputs.log"
profile() {  # profile LOG EXTRA...: the workflow's options and EXTRA
  local log=$1; shift
  timeout 300 "$N" profile --trace=cuda,nvtx,osrt --sample=none --show-output=true --capture-range=cudaProfilerApi \
    --capture-range-end=stop --force-overwrite=true --output="$W/$name" "$@" \
    python3 -m sftprof.capture.sft "$(cat "$W/in/cases/clean.json")" > "$dest/$log" 2>&1
  local rc=$?; echo "profile $* rc=$rc"; grep -iE 'error|warning|permission|not supported' "$dest/$log" | head -5
  [ $rc = 0 ] && [ -f "$W/$name.nsys-rep" ]
}
profile profile.log --gpu-metrics-devices=all --cpuctxsw=process-tree \
  || profile profile_metrics_only.log --gpu-metrics-devices=all --cpuctxsw=none \
  || profile profile_sched_only.log --cpuctxsw=process-tree
"$N" export --type=sqlite --force-overwrite=true --output="$dest/$name.sqlite" "$W/$name.nsys-rep" > "$dest/export.log" 2>&1
echo "export sqlite rc=$?"
mkdir -p "$W/stats"
"$N" stats --format=csv --force-overwrite=true --output="$W/stats/$name" \
  -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,cuda_api_sum,osrt_sum,nvtx_sum,nvtx_gpu_proj_sum \
  "$dest/$name.sqlite" > "$dest/stats.log" 2>&1
echo "stats rc=$?"
for f in "$W/stats/$name"_*.csv; do r=$(basename "$f" .csv); cp "$f" "$dest/$name.${r#"${name}"_}.csv"; done
"$N" export --type=parquetdir --force-overwrite=true --output="$W/$name.parquetdir" "$W/$name.nsys-rep" >> "$dest/export.log" 2>&1
echo "export parquetdir rc=$?"; tar cJf "$dest/$name.parquetdir.tar.xz" -C "$W" "$name.parquetdir"
cp "$W/in/metrics/"*.metrics.jsonl "$dest/$name.metrics.jsonl" 2>/dev/null
"$N" --version > "$dest/nsys_version.txt" 2>&1
python3 - "$dest/$name.sqlite" <<'PY'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "GPU_METRICS", "TARGET_INFO_GPU_METRICS", "SCHED_EVENTS"):
    try:
        print(t, c.execute(f"SELECT count(*) FROM {t}").fetchone()[0])
    except sqlite3.Error as e:
        print(t, "absent:", e)
PY
