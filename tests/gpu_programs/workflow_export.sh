#!/usr/bin/env bash
# The workflow's export choice on the GPU machine: with nsys 2025.3.1 first on PATH, the demo workflow
# (snakemake, local executor, the built-in trainer on CUDA) exports each rank as a parquetdir; the same
# capture's SQLite export, analysed by `sftprof analyze`, must give the same saved tables. Run from the
# checkout's root, after the wheels are installed into SITE (duckdb, duckdb-ext-sqlite, snakemake and its
# dependencies for the device's Python 3.12):
#   bash tests/gpu_programs/workflow_export.sh DEBS SITE DEST
# DEBS: libdw1 and libelf1 .debs (2025.3.1's importer needs libdw.so.1). DEST gets export_help.txt
# (`nsys export --help` of that release), workflow logs, the export folder's listing and the comparison.
set -uo pipefail
debs=$(cd "${1:?DEBS}" && pwd); site=${2:?SITE}
mkdir -p "${3:?DEST}"; dest=$(cd "$3" && pwd)
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
mkdir -p /tmp/dw /tmp/nsysbin
for f in "$debs"/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ln -sfn "$N" /tmp/nsysbin/nsys
export PATH=/tmp/nsysbin:$site/bin:$PATH PYTHONPATH=$site:$(pwd) PYTHONUNBUFFERED=1
nsys --version | tee "$dest/versions.txt"; python3 --version >> "$dest/versions.txt"
nsys export --help > "$dest/export_help.txt" 2>&1
python3 -c 'from sftprof.capture import nsys; print("export_kind:", nsys.export_kind("nsys"))' | tee -a "$dest/versions.txt"
cat > /tmp/device.yaml <<'YAML'
experiments:
  demo:
    sft: {device: cuda}
    profile: {trace: [cuda, nvtx, osrt]}
YAML
snakemake() { python3 -m snakemake --workflow-profile profiles/local --configfile config.yaml /tmp/device.yaml --scheduler greedy "$@"; }
SECONDS=0
snakemake > "$dest/workflow1.log" 2>&1; echo "workflow rc=$? wall_s=$SECONDS" | tee -a "$dest/versions.txt"
snakemake > "$dest/workflow2.log" 2>&1; echo "second run rc=$?: $(grep -c 'Nothing to be done' "$dest/workflow2.log") 'Nothing to be done'" | tee -a "$dest/versions.txt"
win=results/demo/steady
ls -la "$win/export" "$win"/export/* > "$dest/export_listing.txt" 2>&1
cat logs/demo/steady/export.log >> "$dest/export_listing.txt" 2>&1
# The workflow's analyze step again, on the same capture exported as SQLite by the same nsys.
rm -rf /tmp/sqlite_export /tmp/sqlite_analysis; mkdir -p /tmp/sqlite_export
nsys export --type=sqlite --force-overwrite=true --output=/tmp/sqlite_export/rank0.sqlite "$win"/capture/*.nsys-rep > /dev/null 2>&1
python3 -c 'import sys; from sftprof import pipeline; pipeline.analyze_capture(*sys.argv[1:])' \
  "$win/capture" /tmp/sqlite_export profile /tmp/sqlite_analysis > "$dest/analyze_sqlite.log" 2>&1
{ echo "parquetdir route (the workflow's) against the SQLite route (analyze_capture), saved tables:"
  diff -r -x analysis.json "$win/analysis" /tmp/sqlite_analysis && echo "IDENTICAL: $(ls "$win/analysis/rank0" | wc -l) files"
  python3 - "$win/analysis/rank0/analysis.json" /tmp/sqlite_analysis/rank0/analysis.json <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
differ = [key for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
print("analysis.json keys that differ:", differ or "none", "| sources:", a.get("source_path"), b.get("source_path"))
PY
} > "$dest/comparison.txt" 2>&1
cat "$dest/comparison.txt" | tail -20
tar cJf "$dest/results.tar.xz" "$win/analysis" "$win/export" logs 2>/dev/null
