#!/usr/bin/env bash
# Makes the folder that tests/gpu_programs/nemo_h200.sh installs on the GPU machine (git-ignored,
# carried by the `run` tool): NeMo 2.2.1 and what `nemo.collections.llm` needs at import and for a
# Llama LoRA fine-tune, for the device's Python 3.12 (torch 2.11.0+cu130, no internet), minus what the
# device already has (/work/.library/device/KINDS.md, "Python packages already there") and minus what
# tests/gpu_programs/nemo_import_stubs.py stubs (fabric, paramiko, cryptography, jieba, modelopt, zarr,
# nltk, ...). Run on a machine that reaches PyPI:  tests/gpu_programs/make_nemo_pack.sh [OUT] [DEBS]
#   OUT  (default .devicepack): gets w312/, wheels/, unpacked/, debs/
#   DEBS (default .devcarry):   holds libdw1 and libelf1 .debs (nsys 2025.3.1 needs them on the device)
# The tracked tree (about 52 MB) plus OUT must fit the run tool's 64 MiB, so OUT stays near 12 MB:
# most packages travel as extracted wheels packed with xz (unpacked/), megatron-core as its sdist (only
# its Python tree is used: the C++ helper is for pretraining data). Idempotent: run it again to refresh;
# packed files already there are kept, files of pins no longer listed are removed.
set -euo pipefail
OUT=${1:-.devicepack}
DEBS=${2:-.devcarry}
PY=${PYTHON:-python3}
mkdir -p "$OUT"/w312 "$OUT"/wheels "$OUT"/unpacked "$OUT"/debs

# One pin a line: NAME==VERSION  # why. Pinned where NeMo 2.2.1 (its wheel's Requires-Dist, extras
# "core"/"common") or a carried package bounds the version below the device's, else the version tested.
# SITE comes first on PYTHONPATH, so each package here wins over the device's copy.
# Left out on purpose (none is imported by `nemo.collections.llm`, the recipe build or the backend;
# checked with tests/gpu_programs/nemo_recipe_build.py): sacremoses, inflect, mediapy (NeMo "common"),
# docker, InquirerPy/prompt_toolkit (nemo_run's CLI and torchx's docker scheduler), wcwidth,
# ruamel.yaml.clib (ruamel.yaml runs without it), and everything nemo_import_stubs.py stubs.
# Carried as wheels in w312/ (small: xz gains little); nemo_h200.sh pip-installs w312/*.whl
W312_PINS=(
  "braceexpand==0.1.7"             # webdataset's dep
  "catalogue==2.0.10"              # nemo_run's import-time dep
  "docstring-parser==0.16"         # torchx's dep (nemo_run imports torchx.specs)
  "importlib_metadata==8.5.0"      # nemo_run.cli imports importlib_metadata (not on the device)
  "graphviz==0.20.3"               # fiddle's import-time dep
)
# Carried extracted and xz-packed in unpacked/ (nemo_h200.sh untars each into SITE), so that the
# repo (about 52 MB tracked) plus the pack fits the run tool's 64 MiB: xz of the files is about 40%
# smaller than the wheels' zip. tests/, __pycache__/ and *.data/ (scripts) are dropped.
UNPACKED_PINS=(
  "nemo_toolkit==2.2.1"            # the toolkit itself (5.4 MB as a wheel, 2.3 MB packed)
  "transformers==4.48.3"           # NeMo 2.2.1: transformers>=4.48.0,<=4.48.3; fails with the device's 5.x
  "tokenizers==0.21.4"             # transformers 4.48.3 checks tokenizers>=0.21,<0.22 at import (device: 0.23)
  "huggingface_hub==0.36.0"        # transformers 4.48.3 checks huggingface-hub>=0.24,<1.0 at import (device: 1.x)
  "lightning==2.4.0"               # NeMo 2.2.1: lightning>2.2.1,<=2.4.0 (device: 2.6.6)
  "hydra-core==1.3.2"              # NeMo: hydra-core>1.3,<=1.3.2 (nemo.core.config); not on the device
  "omegaconf==2.3.0"               # NeMo: omegaconf<=2.3; hydra, nemo_run and NeMo's configs
  "fiddle==0.3.1"                  # NeMo 2 configs (fdl.build, run.Partial); sftprof's nemo backend
  "libcst==1.5.1"                  # fiddle's import-time dep (codegen), imported at load; cp312 manylinux
  "nemo_run==0.3.0"                # `import nemo_run as run` (llm.finetune, recipes); oldest on PyPI, as on CPU
  "torchx==0.7.0"                  # nemo_run imports torchx.specs at load
  "pydantic==1.10.27"              # llm/__init__ imports finetune & recipes inside try: without pydantic
                                   #   (nemo.collections.llm.evaluation.api: BaseModel, Field) llm.finetune
                                   #   is silently missing. Not on the device; v1 is pure Python (v2 + core: 1.8 MB)
  "datasets==3.2.0"                # nemo.collections.llm.gpt.data imports it at load; as on CPU
  "dill==0.3.8"                    # datasets 3.2.0's dep (<0.3.9)
  "multiprocess==0.70.16"          # datasets 3.2.0's dep (py312 wheel)
  "webdataset==0.2.100"            # NeMo core: webdataset>=0.2.86, imported at load (nemo.collections.common)
  "text-unidecode==1.3"            # NeMo core requirement
  "ruamel.yaml==0.18.6"            # NeMo core requirement
)
# sdists (no wheel on PyPI); nemo_h200.sh builds them on the device with --no-build-isolation
W312_SDISTS=(
  "antlr4-python3-runtime==4.9.3"  # omegaconf 2.3.0 / hydra 1.3.2 need exactly 4.9.3 (generated parsers)
  "wget==3.2"                      # NeMo core requirement (nemo.utils), imported at load
)

PURE_ONLY=(pydantic)  # PyPI also has cp312 Cython builds of pydantic 1.10 (1.7 MB packed): take the pure wheel
dl() {  # dl DIR NAME==VER: a wheel for the device (cp312 manylinux x86_64, or pure Python)
  local plats=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  [[ " ${PURE_ONLY[*]} " == *" ${2%%==*} "* ]] && plats=()
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plats[@]}" --platform any -d "$1" "$2"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for pin in "${W312_PINS[@]}"; do dl "$tmp"/w312 "$pin"; done
rm -f "$OUT"/w312/*.whl && mv "$tmp"/w312/*.whl "$OUT"/w312/  # nemo_h200.sh installs every w312/*.whl
for pin in "${W312_SDISTS[@]}"; do "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$OUT"/w312 "$pin"; done
rm -f "$OUT"/wheels/nemo_toolkit-*.whl  # an older pack's wheel: NeMo travels in unpacked/
"$PY" -m pip download -q --no-deps --no-binary=:all: -d "$OUT"/wheels megatron_core==0.11.0

for pin in "${UNPACKED_PINS[@]}"; do
  name=${pin%%==*}; ver=${pin##*==}; packed="$OUT/unpacked/$name-$ver.tar.xz"
  [ -f "$packed" ] && continue
  rm -rf "$tmp"/whl "$tmp"/x && dl "$tmp"/whl "$pin"
  whl=$(ls "$tmp"/whl/*.whl); [ "$(echo "$whl" | wc -l)" = 1 ]
  "$PY" -m zipfile -e "$whl" "$tmp"/x
  find "$tmp"/x -depth -type d \( -name tests -o -name __pycache__ -o -name '*.data' \) -exec rm -rf {} +
  tar cf - -C "$tmp"/x . | xz -9e > "$packed.part" && mv "$packed.part" "$packed"
done
# only the versions named above (a changed pin leaves its old file behind otherwise)
for f in "$OUT"/unpacked/*.tar.xz; do
  keep=0; for pin in "${UNPACKED_PINS[@]}"; do [ "$(basename "$f")" = "${pin%%==*}-${pin##*==}.tar.xz" ] && keep=1; done
  [ $keep = 1 ] || rm -v "$f"
done

# libdw1/libelf1 for nsys on the device (dpkg -x there); from DEBS, else from Debian's apt
for pkg in libdw1 libelf1; do
  if ls "$DEBS"/${pkg}_*.deb >/dev/null 2>&1; then cp "$DEBS"/${pkg}_*.deb "$OUT"/debs/
  elif ! ls "$OUT"/debs/${pkg}_*.deb >/dev/null 2>&1; then (cd "$OUT"/debs && apt-get download "$pkg"); fi
done
ls -l "$OUT"/*/
du -cb "$OUT"/*/* | tail -1
echo "with the tracked tree: $(( $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) + $(du -cb "$OUT"/*/* | tail -1 | cut -f1) )) bytes (limit 67108864)"
