#!/usr/bin/env bash
# Profile each case of sft_cases.py under Nsight Systems 2022.4 (the bundle of
# ../shared/nsys-lab: device-capture.sh and what make-device-bundle.sh packs), with the nsys
# options the workflow renders (sftprof.capture.nsys.profile_options) for
#   profile: {trace: [cuda, nvtx, osrt], sample: none, cpuctxsw: none, show_output: true}
#   window:  {capture_range: cudaProfilerApi, capture_range_end: stop, start_step: 10, end_step: 11}
# Usage: capture_sft_cases.sh BUNDLE WORK DEST [CASE...]
#   WORK as sft_cases.py wrote it; DEST gets CASE.nsys-rep and CASE.metrics.jsonl appended to
#   DEST/captures.tar after each case (so a run cut short keeps what it finished).
#   CAPTURE_RANGE=nvtx for a dry run on a CPU machine (then sft_cases.py --capture-range nvtx).
#   BUDGET_S: seconds this script may take (default 560): a case that would not finish in them,
#   judged by the longest case so far, is skipped.
set -uo pipefail
bundle=${1:?bundle}; work=${2:?work}; dest=${3:?dest}; shift 3
cases=("$@"); [ ${#cases[@]} -gt 0 ] || cases=(clean padding padding_fixed data_stall pageable foreach_adamw)
range=${CAPTURE_RANGE:-cudaProfilerApi}
opts=(--trace=cuda,nvtx,osrt --sample=none --cpuctxsw=none --show-output=true
      --capture-range="$range" --capture-range-end=stop)
[ "$range" = nvtx ] && { opts+=(--nvtx-capture=sftprof_capture); export NSYS_NVTX_PROFILER_REGISTER_ONLY=0; }
here=$(cd "$(dirname "$0")" && pwd)
start=$SECONDS longest=60
for case in "${cases[@]}"; do
  if (( SECONDS - start + longest * 6 / 5 > ${BUDGET_S:-560} )); then echo "== $case skipped: out of time"; continue; fi
  case_start=$SECONDS
  name=h200_sft_$case
  if [ "$case" = data_stall ]; then program=(python3 "$here/slow_data.py"); else program=(python3 -m sftprof.capture.sft); fi
  t0=$(date +%s.%N)
  # OUT emptied: device-capture.sh would put an .xz copy there too.
  OUT= bash "$bundle/device-capture.sh" "$bundle" "$name" "${opts[@]}" -- "${program[@]}" "$(cat "$work/cases/$case.json")" \
    > "$work/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  (( SECONDS - case_start > longest )) && longest=$((SECONDS - case_start))
  grep -E "training on|step (0|2|9|12|29) |Error|error|Traceback|nsys-rep|capture|Importer" "$work/$name.log" | cut -c1-300 | tail -n 25
  awk -v c="$case" -v r="$rc" -v a="$t0" -v b="$t1" 'BEGIN { printf "== %s rc=%s wall %.1f s\n", c, r, b - a }'
  cp "$work/metrics/$name.metrics.jsonl" "$work/$name.metrics.jsonl" 2>/dev/null
  cp "/tmp/$name.nsys-rep" "$work/$name.nsys-rep" 2>/dev/null
  files=(); for f in "$name.nsys-rep" "$name.metrics.jsonl" "$name.log"; do [ -f "$work/$f" ] && files+=("$f"); done
  tar -rf "$dest/captures.tar" -C "$work" "${files[@]}"
done
ls -la "$dest"
