#!/usr/bin/env bash
# Where checkpointing's cost goes, on the GPU machine: foreign_loop.py's clean and checkpointed loops without the
# profiler, alternating, each pass timed (--phases) and not (the saving itself); then both loops captured back
# to back (foreign_cases.sh), so that their launch costs come from one machine state.
# Usage: checkpoint_phases.sh DEBS WORK   (WORK gets phases.jsonl, measured.jsonl, foreign_*.sqlite; with OUT
# set, all of it is packed into $OUT/foreign_captures.tar.xz)
set -uo pipefail
debs=${1:?debs}; work=${2:?work}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
loop=(python3 "$here/foreign_loop.py")
for round in $(seq "${ROUNDS:-3}"); do
  t0=$SECONDS
  "${loop[@]}" clean checkpointing clean checkpointing_nonreentrant --phases --iterations 12 \
    --out "$work/phases.jsonl" || echo "== phases round failed"
  "${loop[@]}" clean checkpointing clean checkpointing_nonreentrant --iterations 12 \
    --out "$work/measured.jsonl" || echo "== measure round failed"
  echo "== round $round $((SECONDS - t0)) s"
done
OUT= BUDGET_S=${BUDGET_S:-400} bash "$here/foreign_cases.sh" "$debs" "$work" capture clean checkpointing
[ -n "${OUT:-}" ] && (cd "$work" && tar -cJf "$OUT/foreign_captures.tar.xz" ./*.sqlite ./*.jsonl ./*.log 2>/dev/null)
exit 0
