#!/usr/bin/env bash
# From a long capture's .nsys-rep to answers, on the GPU machine (issue 22 part 3): `nsys stats` against
# `nsys export` + `sftprof analyze`, through SQLite and through parquetdir, each step timed alone, and
# whether the two routes give the same analysis. Run from the checkout's root:
#   bash tests/gpu_programs/export_routes.sh PACK DEST
# PACK: debs/ (libdw1 and libelf1 .debs for 2025.3.1's importer) and site312.tar.xz (duckdb and
#   duckdb-ext-sqlite for the device's Python 3.12, unpacked). DEST gets timings.txt, each step's log,
#   and analyses.tar.xz (both routes' analysis folders).
# Environment: N (nsys; default 2025.3.1 inside Nsight Compute), LONG_S (the window, default 100 s),
#   RUNS (sftprof analyze runs per route, default 2).
set -uo pipefail
pack=$(cd "${1:?PACK}" && pwd)
mkdir -p "${2:?DEST}"; dest=$(cd "$2" && pwd)
repo=$(pwd)
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
W=${WORK:-/tmp/routes}
rm -rf "$W"; mkdir -p "$W"/{in,a,b,c,site,dw}
for f in "$pack"/debs/*.deb; do dpkg -x "$f" "$W/dw"; done
export LD_LIBRARY_PATH=$W/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tar xJf "$pack/site312.tar.xz" -C "$W/site"
export PYTHONPATH=$repo PYTHONUNBUFFERED=1
T=$dest/timings.txt
{ date -u; nproc; "$N" --version; python3 --version; } > "$T" 2>&1
. "$repo/tests/gpu_programs/timed.sh"
analyze() { timed "$1" env PYTHONPATH="$W/site:$repo" python3 -c 'import sys; from sftprof.cli import main; sys.exit(main())' analyze "$2" -o "$3"; }

python3 tests/gpu_programs/nsys2025_cases.py "$W/in" --device cuda > "$dest/inputs.log" 2>&1 || { tail "$dest/inputs.log"; exit 1; }
long_s=${LONG_S:-100}
timed capture env SFTPROF_LONG_S="$long_s" timeout $((long_s + 240)) "$N" profile --trace=cuda,nvtx,osrt --sample=none \
  --cpuctxsw=none --show-output=true --capture-range=cudaProfilerApi --capture-range-end=stop --force-overwrite=true \
  --output="$W/long" python3 tests/gpu_programs/long_sft.py "$(cat "$W/in/cases/long.json")"
rep=$W/long.nsys-rep
[ -f "$rep" ] || { echo "no .nsys-rep"; tail -20 "$dest/capture.log"; exit 1; }
ls -la "$rep" >> "$T"
cp "$rep" "$W/a/"
timed a_stats "$N" stats --format=csv --output="$W/a/stats" -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_api_sum "$W/a/long.nsys-rep"
timed b_export_sqlite "$N" export --type=sqlite --force-overwrite=true --output="$W/b/long.sqlite" "$rep"
timed c_export_parquetdir "$N" export --type=parquetdir --force-overwrite=true --output="$W/c/long.parquetdir" "$rep"
for run in $(seq "${RUNS:-2}"); do
  analyze "b_analyze_sqlite_$run" "$W/b/long.sqlite" "$W/b/out$run"
  analyze "c_analyze_parquetdir_$run" "$W/c/long.parquetdir" "$W/c/out$run"
done
echo "sqlite $(stat -c %s "$W/b/long.sqlite") B; parquetdir $(du -sb "$W/c/long.parquetdir" | cut -f1) B" >> "$T"
python3 - "$W/b/out1/analysis" "$W/c/out1/analysis" >> "$T" 2>&1 <<'PY'
import json, sys
from pathlib import Path
a, b = map(Path, sys.argv[1:])
names = sorted(p.name for p in a.iterdir())
differ = [n for n in names if n != "analysis.json" and (a / n).read_bytes() != (b / n).read_bytes()]
summary = [{k: v for k, v in json.loads((d / "analysis.json").read_text()).items() if k != "source_path"} for d in (a, b)]
print(f"routes agree: {len(names) - 1} tables, {len(differ)} differ {differ}; analysis.json (less source_path) equal: {summary[0] == summary[1]}")
print("kernels", summary[0]["headline"].get("kernels"), "top", summary[0]["headline"].get("top_kernel"))
PY
( cd "$W" && tar cf - b/out1/analysis c/out1/analysis a/stats*.csv | xz -T0 > "$dest/analyses.tar.xz" )
cat "$T"
