#!/usr/bin/env bash
# `sftprof analyze` against `nsys stats` on the GPU machine (issue 22 part 2): exports generated from real
# 2025.3.1 captures to SIZES kernels, measured by benchmarks/run.py with every core and again held to two
# (taskset), so that one run says how much of the ratio is the cores. Run from the checkout's root:
#   bash tests/gpu_programs/scale_cores.sh PACK DEST
# PACK: the duckdb and duckdb-ext-sqlite wheels for the device's Python (pyproject.toml's releases;
#   the device has the rest), installed into SITE (default /tmp/scale-site), where wheels installed by an
#   earlier call stay: with the checkout, both wheels are more than one call carries. DEST gets, per seed
#   and core count, run.py's table (.csv) and log.
# Environment: N (nsys; default 2025.3.1 inside Nsight Compute), SIZES (default 10M), SEEDS (default: the
#   trainer and the pageable plant as 2025.3.1 captured them).
set -uo pipefail
pack=$(cd "${1:?PACK}" && pwd)
mkdir -p "${2:?DEST}"; dest=$(cd "$2" && pwd)
N=${N:-/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys}
W=${WORK:-/tmp/scale}
SITE=${SITE:-/tmp/scale-site}
SEEDS=${SEEDS:-"tests/fixtures/nsys2025/h200_sft_clean.sqlite tests/fixtures/nsys2025/h200_plant_pageable.sqlite"}
rm -rf "$W"; mkdir -p "$W/work" "$SITE"
for wheel in "$pack"/*.whl; do
  python3 -m pip install --quiet --no-deps --no-index --upgrade --target "$SITE" "$wheel" >> "$dest/pip.log" 2>&1 \
    || { tail "$dest/pip.log"; exit 1; }
done
export PYTHONPATH=$SITE
[ -n "${INSTALL_ONLY:-}" ] && { ls "$SITE"; exit 0; }
{ date -u; nproc; "$N" --version; python3 --version; } > "$dest/machine.txt" 2>&1
for seed in $SEEDS; do
  name=$(basename "$seed" .sqlite)
  for cores in all 2; do
    prefix=(); [ "$cores" = 2 ] && prefix=(taskset -c 0,1)
    # --keep: the export generated for the first run is measured again by the second
    "${prefix[@]}" python3 benchmarks/run.py --nsys "$N" --sizes "${SIZES:-10M}" --seed "$seed" --workdir "$W/work" \
      --keep --out "$dest/$name-$cores.csv" > "$dest/$name-$cores.log" 2>&1
    echo "$name, $cores cores: rc=$?"; grep -E "^\| $name|time .*x nsys" "$dest/$name-$cores.log"
  done
  rm -rf "$W/work"/*  # one seed's exports on disk at a time
done
