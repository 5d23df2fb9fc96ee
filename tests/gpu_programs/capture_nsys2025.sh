#!/usr/bin/env bash
# Real captures with Nsight Systems 2025.3.1 on the GPU machine (tests/fixtures/nsys2025/, issue 17
# part 1), and how long a 2025.3.1 export of a long capture takes (issue 22 part 3).
# Run from the checkout's root:
#   bash tests/gpu_programs/capture_nsys2025.sh PACK DEST
# PACK: debs/ (libdw1 and libelf1 .debs: `apt-get download libdw1 libelf1`; the 2025.3.1 importer
#   needs libdw.so.1), src/sftprof (the trainer used; default: the checkout's), site312.tar.xz
#   (duckdb + duckdb-ext-sqlite unpacked, for `sftprof analyze` on the device; optional),
#   check_reqs.py + nemo_reqs.txt (NeMo's requirements against the device's packages; optional).
# DEST gets: commands.log (every command, its exit code and wall time), device_env.txt,
#   captures.tar.xz (per capture: .nsys-rep, .sqlite, stats CSVs, metrics, logs; parquetdir of the
#   trainer's), long_timings.txt and long_extra.tar.xz (the long capture's stats CSVs and logs).
# Environment: N (nsys; default 2025.3.1 inside Nsight Compute), DEADLINE_S (default 565: later
#   steps are cut short or skipped), LONG_S (longest window of the long capture, default 100),
#   DRY=1 (a dry run on a CPU machine with nsys 2022.4: nvtx window, no CUDA, no plants).
set -uo pipefail
pack=$(cd "${1:?PACK}" && pwd)
mkdir -p "${2:?DEST}"; dest=$(cd "$2" && pwd)
repo=$(pwd)
W=${WORK:-/tmp/nsys2025}
rm -rf "$W"; mkdir -p "$W"/{caps,export,stats,log,long,help}
T0=$SECONDS
LOG=$dest/commands.log; : > "$LOG"
DEADLINE=${DEADLINE_S:-565}
left() { echo $((DEADLINE - (SECONDS - T0))); }
say() { echo "== [$((SECONDS - T0)) s] $*" | tee -a "$LOG"; }
now() { date +%s.%N; }
# run NAME CMD...: output to $W/log/NAME.log; a line in commands.log with exit code and wall time.
run() {
  local name=$1; shift
  local a b rc
  a=$(now); "$@" > "$W/log/$name.log" 2>&1; rc=$?; b=$(now)
  local wall; wall=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", b - a }')
  printf '%s\trc=%s\twall_s=%s\tat_s=%s\t%s\n' "$name" "$rc" "$wall" "$((SECONDS - T0))" "$*" | cut -c1-1500 >> "$LOG"
  echo "$wall" > "$W/log/$name.wall"
  if [ "$rc" != 0 ]; then echo "-- $name rc=$rc, log tail:"; tail -n 15 "$W/log/$name.log" | cut -c1-300; fi
  return $rc
}

if [ -n "${DRY:-}" ]; then
  N=${N:-nsys}; DEVICE=cpu; RANGE=nvtx; TRACE=nvtx,osrt; EXTRA_TRACE=nvtx,osrt
  REPORTS=${REPORTS:-nvtxsum,osrtsum}; LONG_REPORTS=nvtxsum,osrtsum
  CASE_ARGS=(--steps 4 --window 1 2 --long-start 1 --capture-range nvtx)
  export NSYS_NVTX_PROFILER_REGISTER_ONLY=0
else
  N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}; DEVICE=cuda; RANGE=cudaProfilerApi
  TRACE=cuda,nvtx,osrt; EXTRA_TRACE=cuda,nvtx,osrt,cublas,cudnn
  REPORTS=cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_mem_size_sum,cuda_api_sum,osrt_sum,nvtx_sum,nvtx_gpu_proj_sum
  LONG_REPORTS=cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum
  CASE_ARGS=()
  mkdir -p /tmp/dw
  for f in "$pack"/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
src=$repo; [ -d "$pack/src/sftprof" ] && src=$pack/src
export PYTHONPATH=$src PYTHONUNBUFFERED=1
site=/tmp/site312
if [ -f "$pack/site312.tar.xz" ] && [ -z "${DRY:-}" ]; then mkdir -p $site && tar xJf "$pack/site312.tar.xz" -C $site; fi
analyze_path=$src; [ -d $site/duckdb ] && analyze_path=$site:$src
say "start: nsys $N, sftprof from $src, PYTHONPATH for analyze $analyze_path"
run nsys_version "$N" --version; cat "$W/log/nsys_version.log"

# The device's software, for the lead and for NeMo (issue 17 part 2): in the background.
env_info() {
  {
    echo "## date"; date -u; echo "## nproc"; nproc; echo "## memory"; free -g; echo "## uname"; uname -a
    echo "## python"; which python3; python3 --version
    echo "## nvidia-smi"; nvidia-smi
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
    echo "## gcc"; gcc --version | head -1; g++ --version | head -1; nvcc --version | tail -2
    echo "## nsys"; "$N" --version
    echo "## pip list"; python3 -m pip list 2>&1
    echo "## imports"
    for m in transformer_engine apex megatron.core nemo nemo_run lightning pytorch_lightning hydra omegaconf \
             pandas numpy yaml jinja2 matplotlib snakemake torch transformers sentencepiece numba rich duckdb; do
      timeout 120 python3 -c "
import importlib
try:
    m = importlib.import_module('$m'); print('import $m: OK', getattr(m, '__version__', '?'))
except BaseException as e:
    print('import $m: FAILS', type(e).__name__, str(e)[:200])" 2>&1 | tail -n 1
    done
    if [ -f "$pack/check_reqs.py" ]; then echo "## NeMo 2.2.1 / megatron-core 0.11.0 requirements"; python3 "$pack/check_reqs.py" "$pack/nemo_reqs.txt"; fi
  } > "$W/device_env.txt" 2>&1
  cp "$W/device_env.txt" "$dest/device_env.txt"
}
env_info & env_pid=$!
( "$N" profile --help > "$W/help/profile.txt" 2>&1; "$N" export --help > "$W/help/export.txt" 2>&1
  "$N" stats --help-reports > "$W/help/stats_reports.txt" 2>&1; "$N" stats --help > "$W/help/stats.txt" 2>&1 ) &

say "inputs"
run inputs python3 tests/gpu_programs/nsys2025_cases.py "$W/in" --device $DEVICE "${CASE_ARGS[@]}"
tail -n 4 "$W/log/inputs.log"

# capture NAME TRACE PROGRAM...: the workflow's options (sftprof.capture.nsys.profile_options), as capture_sft_cases.sh.
capture() {
  local name=$1 trace=$2; shift 2
  local opts=(--trace="$trace" --sample=none --cpuctxsw=none --show-output=true --capture-range=$RANGE
              --capture-range-end=stop --force-overwrite=true --output="$W/caps/$name")
  [ "$RANGE" = nvtx ] && opts+=(--nvtx-capture=sftprof_capture)
  run "profile_$name" timeout "${CAPTURE_TIMEOUT:-240}" "$N" profile "${opts[@]}" "$@"
  local rc=$?
  ls -la "$W/caps/" | grep -F "$name" >> "$LOG"
  return $rc
}
# post NAME [parquet]: sqlite export, the stats CSVs, and for `parquet` a parquetdir export.
post() {
  local name=$1 rep=$W/caps/$1.nsys-rep
  [ -f "$rep" ] || { echo "$name: no .nsys-rep" >> "$LOG"; return 1; }
  run "export_sqlite_$name" "$N" export --type=sqlite --force-overwrite=true --output="$W/export/$name.sqlite" "$rep"
  run "stats_$name" "$N" stats --format=csv --force-overwrite=true --output="$W/stats/$name" -r "$REPORTS" "$W/export/$name.sqlite" \
    || for r in ${REPORTS//,/ }; do
         run "stats_${name}_$r" "$N" stats --format=csv --force-overwrite=true --output="$W/stats/$name" -r "$r" "$W/export/$name.sqlite"
       done
  if [ "${2:-}" = parquet ]; then
    run "export_parquetdir_$name" "$N" export --type=parquetdir --force-overwrite=true --output="$W/export/$name.parquetdir" "$rep"
    ls -la "$W/export/" >> "$LOG"
  fi
}
posts=()

say "capture: trainer, clean case, small model"
capture h200_sft_clean $TRACE python3 -m sftprof.capture.sft "$(cat "$W/in/cases/clean.json")"
cp "$W/in/metrics/h200_sft_clean.metrics.jsonl" "$W/export/" 2>/dev/null
post h200_sft_clean parquet & posts+=($!)
if [ -z "${DRY:-}" ]; then
  for plant in pageable device_sync elementwise; do
    say "capture: plant $plant"
    capture h200_plant_$plant $TRACE python3 tests/gpu_programs/plants.py $plant
    post h200_plant_$plant & posts+=($!)
  done
  say "capture: plant gemm with $EXTRA_TRACE"
  if ! capture h200_plant_gemm $EXTRA_TRACE python3 tests/gpu_programs/plants.py gemm \
       && [ ! -f "$W/caps/h200_plant_gemm.nsys-rep" ]; then
    say "retry gemm without cudnn"
    capture h200_plant_gemm cuda,nvtx,osrt,cublas python3 tests/gpu_programs/plants.py gemm
  fi
  post h200_plant_gemm & posts+=($!)
fi

# The long capture: the trainer, tiny model, window closed by time (long_sft.py).
long_s=${LONG_S:-100}; budget=$(( $(left) - ${LONG_RESERVE_S:-330} ))
(( budget < long_s )) && long_s=$budget
(( long_s < 20 )) && long_s=20
say "long capture: window of $long_s s (time left $(left) s)"
CAPTURE_TIMEOUT=$((long_s + 240)) capture h200_sft_long $TRACE env SFTPROF_LONG_S=$long_s \
  python3 tests/gpu_programs/long_sft.py "$(cat "$W/in/cases/long.json")"
grep -E "long_sft:|training on" "$W/log/profile_h200_sft_long.log" | cut -c1-300
say "waiting for the exports of the short captures"
wait "${posts[@]}"
# A first analysis on the device (also compiles and caches numba's page decoder).
run analyze_h200_sft_clean env PYTHONPATH="$analyze_path" python3 -c 'import sys; from sftprof.cli import main; sys.exit(main())' \
  analyze "$W/export/h200_sft_clean.sqlite" -o "$W/export/h200_sft_clean.analysis" \
  --metrics "$W/export/h200_sft_clean.metrics.jsonl"
say "packing the short captures"
( cd "$W" && rm -rf pack && mkdir pack && for f in caps/*.nsys-rep; do b=$(basename "$f"); [ "$b" = h200_sft_long.nsys-rep ] || cp "$f" pack/; done
  cp export/*.sqlite export/*.jsonl stats/*.csv pack/ 2>/dev/null
  for d in export/*.parquetdir*; do [ -e "$d" ] && tar cf "pack/$(basename "$d").tar" -C export "$(basename "$d")"; done
  tar cf pack/logs.tar log help export/h200_sft_clean.analysis 2>/dev/null
  tar cf - pack | xz -T0 -6 > "$dest/captures.tar.xz" )
ls -la "$dest" >> "$LOG"

# Timings of the long capture, from its .nsys-rep; each step alone on the machine.
T=$dest/long_timings.txt
rep=$W/caps/h200_sft_long.nsys-rep
{ echo "nsys: $(head -n 1 "$W/log/nsys_version.log")"; echo "nproc: $(nproc)"
  echo "long capture: $(grep -h 'long_sft:' "$W/log/profile_h200_sft_long.log")"
  echo "profile wall_s (program start to report written): $(cat "$W/log/profile_h200_sft_long.wall" 2>/dev/null)"
  ls -la "$W/caps/" | grep h200_sft_long; } > "$T"
timed() {  # timed NAME CMD...: with what is left of the deadline, less 30 s for packing
  local name=$1; shift
  local limit=$(( $(left) - 30 ))
  if (( limit < 10 )); then echo "$name: skipped, out of time" >> "$T"; return 1; fi
  run "$name" timeout "$limit" "$@"; local rc=$?
  echo "$name: rc=$rc wall_s=$(cat "$W/log/$name.wall") (limit $limit s)$( ((rc == 124)) && echo ' TIMED OUT')" >> "$T"
  return $rc
}
if [ -f "$rep" ]; then
  mkdir -p "$W/long/a" "$W/long/b" "$W/long/c"
  cp "$rep" "$W/long/a/"; rm -f "$W/long/a/h200_sft_long.sqlite"
  say "long (a): stats from the .nsys-rep"
  timed long_a_stats "$N" stats --format=csv --output="$W/long/a/stats" -r "$LONG_REPORTS" "$W/long/a/h200_sft_long.nsys-rep"
  ls -la "$W/long/a" >> "$T"
  say "long: sftprof analyze of the export stats made"
  timed long_analyze env PYTHONPATH="$analyze_path" python3 -c 'import sys; from sftprof.cli import main; sys.exit(main())' \
    analyze "$W/long/a/h200_sft_long.sqlite" -o "$W/long/analysis"
  say "long (b): export --type sqlite"
  timed long_b_export_sqlite "$N" export --type=sqlite --force-overwrite=true --output="$W/long/b/h200_sft_long.sqlite" "$rep"
  ls -la "$W/long/b" >> "$T"
  say "long (c): export --type parquetdir"
  timed long_c_export_parquetdir "$N" export --type=parquetdir --force-overwrite=true --output="$W/long/c/h200_sft_long.parquetdir" "$rep"
  echo "parquetdir: $(du -sb "$W/long/c" | cut -f1) bytes in $(find "$W/long/c" -type f | wc -l) files" >> "$T"
  db=$W/long/a/h200_sft_long.sqlite; [ -f "$db" ] || db=$W/long/b/h200_sft_long.sqlite
  timeout 60 python3 - "$db" >> "$T" 2>&1 <<'EOF'
import sqlite3, sys
conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_MEMCPY",
          "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "NVTX_EVENTS", "OSRT_API"):
    print(f"rows {t}: {conn.execute(f'SELECT count(*) FROM {t}').fetchone()[0] if t in tables else 'absent'}")
print("sqlite bytes:", conn.execute("PRAGMA page_count").fetchone()[0] * conn.execute("PRAGMA page_size").fetchone()[0])
EOF
else
  echo "no long .nsys-rep" >> "$T"
fi
grep -E "kernels|busy|error|Error" "$W/log/long_analyze.log" 2>/dev/null | head -n 5 | cut -c1-300 >> "$T"
( cd "$W" && tar cf - log/long_* log/profile_h200_sft_long.log long/a/*.csv long/analysis/analysis 2>/dev/null | xz -T0 > "$dest/long_extra.tar.xz" )
kill "$env_pid" 2>/dev/null; wait "$env_pid" 2>/dev/null
[ -f "$dest/device_env.txt" ] || cp "$W/device_env.txt" "$dest/device_env.txt" 2>/dev/null
say "done"; cat "$T"; ls -la "$dest"
