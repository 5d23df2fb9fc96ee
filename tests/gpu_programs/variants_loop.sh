#!/usr/bin/env bash
# Issue 20's loop on the GPU machine: the padding-heavy baseline of sft_cases.py and the variants that
# `sftprof suggest` printed for its committed capture (tests/fixtures/h200_sft_padding.*), each run by the
# built-in trainer under Nsight Systems 2025.3.1 with the workflow's options, in one start of the machine.
# Run from the checkout's root:  bash tests/gpu_programs/variants_loop.sh PACK DEST
#   PACK: debs/ (libdw1, libelf1: the 2025.3.1 importer needs libdw.so.1). DEST gets loop.tar.xz
#   (per run: NAME.sqlite, NAME.metrics.jsonl, NAME.log) and commands.log.
# Environment: N (nsys), DEADLINE_S (default 540), STEPS (40), WINDOW ("30 31"), DRY=1 (CPU, nsys 2022.4).
set -uo pipefail
pack=$(cd "${1:?PACK}" && pwd); mkdir -p "${2:?DEST}"; dest=$(cd "$2" && pwd)
W=${WORK:-/tmp/variants}; rm -rf "$W"; mkdir -p "$W/out"
T0=$SECONDS; DEADLINE=${DEADLINE_S:-540}; LOG=$dest/commands.log; : > "$LOG"
if [ -n "${DRY:-}" ]; then
  N=${N:-nsys}; SIZE=tiny; OPTS=(--trace=nvtx,osrt --capture-range=nvtx --nvtx-capture=sftprof_capture)
  RANGE=nvtx; export NSYS_NVTX_PROFILER_REGISTER_ONLY=0; PY=${PY:-$(pwd)/.venv/bin/python}
else
  N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}; SIZE=h200
  OPTS=(--trace=cuda,nvtx,osrt --capture-range=cudaProfilerApi); RANGE=cudaProfilerApi
  mkdir -p /tmp/dw; for f in "$pack"/debs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
PY=${PY:-python3}; export PYTHONPATH=$(pwd) PYTHONUNBUFFERED=1
$PY tests/gpu_programs/sft_cases.py "$W" --size $SIZE --steps "${STEPS:-40}" --window ${WINDOW:-30 31} \
  --capture-range $RANGE > "$W/out/cases.log" 2>&1 || { tail "$W/out/cases.log"; exit 1; }
# NAME OVERRIDES(JSON of sft keys): the baseline's settings with those switches changed.
runs=("baseline {}" 'pad-longest {"padding": "longest"}' 'loss-every-50 {"loss_every": 50}' 'compiled {"compile": true}'
      'pad-longest-64 {"padding": "longest", "pad_to_multiple_of": 64}')
for entry in "${runs[@]}"; do
  name=${entry%% *}; overrides=${entry#* }
  # ONLY: the runs to make, by name (default: the first four, the variants suggest printed).
  if [ -n "${ONLY:-}" ]; then [[ " $ONLY " == *" $name "* ]] || continue; elif [ "$name" = pad-longest-64 ]; then continue; fi
  if (( SECONDS - T0 > DEADLINE - 90 )); then echo "== $name skipped: out of time" | tee -a "$LOG"; continue; fi
  $PY - "$W/cases/padding.json" "$W/$name.json" "$W/out/$name.metrics.jsonl" "$overrides" <<'PY'
import json, os, sys
settings = json.load(open(sys.argv[1]))
settings["sft"].update(json.loads(sys.argv[4]))
settings["metrics_path"] = sys.argv[3]
if os.environ.get("DRY"):
    settings["sft"]["device"] = "cpu"
json.dump(settings, open(sys.argv[2], "w"))
PY
  a=$SECONDS
  timeout $((DEADLINE - (SECONDS - T0))) "$N" profile "${OPTS[@]}" --sample=none --cpuctxsw=none --capture-range-end=stop \
    --force-overwrite=true --output="$W/$name" $PY -m sftprof.capture.sft "$(cat "$W/$name.json")" > "$W/out/$name.log" 2>&1
  rc=$?
  "$N" export --type=sqlite --force-overwrite=true --output="$W/out/$name.sqlite" "$W/$name.nsys-rep" >> "$W/out/$name.log" 2>&1
  printf '%s\trc=%s\twall_s=%s\n' "$name" "$rc" "$((SECONDS - a))" | tee -a "$LOG"
  grep -E "step (3|20|39) |Error|Traceback" "$W/out/$name.log" | cut -c1-200 | tail -n 5
done
tar -cJf "$dest/loop.tar.xz" -C "$W/out" .
ls -la "$dest"
