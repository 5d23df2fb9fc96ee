#!/usr/bin/env bash
# foreign_loop.py's cases on the H200 with its Nsight Systems 2025.3.1 (../shared/nsys-lab/README.md).
# Usage: foreign_cases.sh DEBS WORK capture CASE...   each CASE under nsys (iterations 10-13 of 16),
#                                                     exported to WORK/foreign_CASE.sqlite
#        foreign_cases.sh DEBS WORK measure ROUNDS    no profiler: every case against clean,
#                                                     alternating, ROUNDS times, into WORK/measured.jsonl
#        foreign_cases.sh DEBS WORK all CASE...       the captures, then measure rounds while one can
#                                                     start by ROUND2_BY seconds (420)
# With OUT set, WORK's exports, timings and logs are packed into $OUT/foreign_captures.tar.xz after each
# capture and round, so a run cut off at its time limit keeps what it finished.
# BUDGET_S (default 470): no capture starts after that many seconds; CASE_TIMEOUT_S (150) ends one that hangs.
# LOOP_ARGS (say "--family opt --range-name batch") go to every run of the loop; MEASURE_CASES (default: the
# GPT-NeoX cases of docs/DIAGNOSIS.md) are the cases each measure round runs, each after a clean run (in one
# process; a case that must run alone, after a clean process of its own).
# NSYS_CPU=process-tree samples the process tree's CPUs and traces its context switches (the write-up's -s cpu
# --cpuctxsw=process-tree); by default neither.
# DEBS holds libdw1 and libelf1 (.deb), which 2025.3.1's importer needs there.
set -uo pipefail
debs=${1:?debs}; work=${2:?work}; mode=${3:?mode}; shift 3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/dw "$work"
for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nsys=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
read -ra loop_args <<< "${LOOP_ARGS:-}"
loop=(python3 "$here/foreign_loop.py" "${loop_args[@]}")
# each reads a variable when CUDA starts, or caps the process's memory: one process per run
alone="no_cache_alloc launch_blocking deterministic deterministic_nofill memory_tight"
measure_round() {
  local t0=$SECONDS
  local pairs=() singles=()
  for case in ${MEASURE_CASES:-eager_attention fp32 tokenize_no_nvtx foreach_off checkpointing no_cache_alloc}; do
    if [[ " $alone " == *" $case "* ]]; then singles+=(clean "$case"); else pairs+=(clean "$case"); fi
  done
  if (( ${#pairs[@]} )); then
    "${loop[@]}" "${pairs[@]}" --iterations "${MEASURE_ITERATIONS:-25}" --out "$work/measured.jsonl" || echo "== round failed"
  fi
  for case in "${singles[@]}"; do
    "${loop[@]}" "$case" --iterations "${MEASURE_ITERATIONS:-25}" --out "$work/measured.jsonl" \
      || echo "== $case failed"
  done
  echo "== measure round $((SECONDS - t0)) s"
}

snapshot() {
  [ -n "${OUT:-}" ] || return 0
  (cd "$work" && tar -cJf "$OUT/foreign_captures.tar.xz.part" ./*.sqlite ./*.jsonl ./*.log 2>/dev/null \
    && mv "$OUT/foreign_captures.tar.xz.part" "$OUT/foreign_captures.tar.xz")
}
if [ "$mode" = capture ] || [ "$mode" = all ]; then
  for case in "$@"; do
    (( SECONDS > ${BUDGET_S:-470} )) && { echo "== $case skipped: out of time"; continue; }
    t0=$SECONDS
    timeout "${CASE_TIMEOUT_S:-150}" "$nsys" profile --trace=cuda,nvtx,osrt --sample="${NSYS_CPU:-none}" --cpuctxsw="${NSYS_CPU:-none}" \
      --capture-range=cudaProfilerApi --capture-range-end=stop -f true -o "$work/foreign_$case" \
      "${loop[@]}" "$case" --iterations 16 --window 10 13 --out "$work/profiled.jsonl" > "$work/$case.log" 2>&1
    echo "== $case capture rc=$? $((SECONDS - t0)) s"; tail -n 3 "$work/$case.log"
    "$nsys" export --type sqlite -f true -o "$work/foreign_$case.sqlite" "$work/foreign_$case.nsys-rep" > /dev/null 2>&1
    echo "   export rc=$? $(du -h "$work/foreign_$case.sqlite" 2>/dev/null | cut -f1)"
    snapshot
  done
fi
if [ "$mode" = measure ]; then
  for round in $(seq "${1:-2}"); do measure_round; done
elif [ "$mode" = all ]; then
  while (( SECONDS < ${ROUND2_BY:-420} )); do measure_round; snapshot; done
fi
