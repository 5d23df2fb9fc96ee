#!/usr/bin/env bash
# NeMo 2.2.1 fine-tuning of Llama 2 7B (random weights) on one H200 under nsys 2025.3.1, through
# sftprof's launch path. Run by the `run` tool from the repo root with .devicepack carried; writes $OUT.
# STEPS (5) and WINDOW_START..WINDOW_END (2..3): more steps give more unprofiled steps to set the window against.
set -u
PY=${PY:-/opt/torch/.venv/bin/python}
NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
D=$PWD/.devicepack; SITE=/tmp/nemosite; W=/tmp/nemowork
mkdir -p "$SITE" "$W" "$OUT"
exec > >(tee "$OUT/console.log") 2>&1
t0=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$D"/w312/*.whl
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --target "$SITE" "$D"/w312/antlr4-python3-runtime-4.9.3.tar.gz "$D"/w312/wget-3.2.zip
# wheels carried unpacked (an extracted pure-Python wheel, xz: the 64 MiB carry holds them so)
for packed in "$D"/unpacked/*.tar.xz; do [ -f "$packed" ] && tar xJf "$packed" -C "$SITE"; done
tar xzf "$D"/wheels/megatron_core-0.11.0.tar.gz -C /tmp && cp -r /tmp/megatron_core-0.11.0/megatron "$SITE"/
cp tests/gpu_programs/nemo_import_stubs.py "$SITE"/
printf 'import nemo_import_stubs\nnemo_import_stubs.install()\n' > "$SITE"/sitecustomize.py
mkdir -p /tmp/dw && for deb in "$D"/debs/*.deb; do dpkg -x "$deb" /tmp/dw; done
export PATH=$(dirname "$NSYS"):$PATH
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PYTHONPATH=$SITE:$PWD TOKENIZERS_PARALLELISM=false NEMO_HOME=$W/nemo_home HF_HUB_OFFLINE=1
echo "setup_s=$(( $(date +%s) - t0 ))"
"$NSYS" --version
"$PY" -c "import transformer_engine" 2>&1 | tail -1
timeout 90 "$PY" tests/gpu_programs/nemo_recipe_build.py "$W/probe" > "$OUT/probe.log" 2>&1; echo "probe_rc=$?"
grep -E "NEMO_RECIPE|Error|error" "$OUT/probe.log" | tail -5
run_one() {  # $1 = PEFT[+KNOB...][@TRACE], $2 = timeout, $3 = the run's number (OVERHEAD=1)
  local name=$1 cap=$W/cap-$1${3:+-$3}
  "$PY" - "$name" "$W" "$cap" > "$W/argv-$name.json" <<'PYEOF'
import json, sys
from sftprof.capture import model, rank, sft
name, work, cap = sys.argv[1:4]
# e.g. lora+cuda_graphs: a knob of sft.nemo switched on; +op_ranges: the window's; @cuda,nvtx: nsys --trace (none: no nsys)
name, _, trace = name.partition("@")
peft, *knobs = name.split("+")
import shutil, os
if not os.path.exists(f"{work}/model"):
    model.create_random_model({"architecture": "llama2-7b", "seed": 0}, f"{work}/model")
os.makedirs(f"{work}/sft", exist_ok=True)
shutil.copy(f"{work}/probe/sft/training.jsonl", f"{work}/sft/training.jsonl")
for split in ("validation", "test"):
    shutil.copy(f"{work}/probe/sft/training.jsonl", f"{work}/sft/{split}.jsonl")
steps, first, last = (int(os.environ.get(k, d)) for k, d in (("STEPS", 5), ("WINDOW_START", 2), ("WINDOW_END", 3)))
settings = {"backend": "nemo", "device": "cuda", "steps": steps, "micro_batch_size": 1, "grad_accum_steps": 2,
            "seq_length": 1024, "learning_rate": 1e-4, "precision": "bf16", "weight_decay": 0.01, "seed": 0,
            "num_threads": 0, "nemo": {"recipe": "llama2_7b", "tensor_parallel": 1, "pipeline_parallel": 1,
                                       "precision": "bf16-mixed", "peft": peft, "packed_sequence": False,
                                       "cuda_graphs": False, "overlap_grad_reduce": False,
                                       "overlap_param_gather": False,
                                       **{knob: True for knob in knobs if knob != "op_ranges"}}}
window = {"capture_range": "cudaProfilerApi", "start_step": first, "end_step": last, "capture_range_end": "stop",
          "op_ranges": "op_ranges" in knobs}
app = sft.command(f"{work}/model", f"{work}/sft/training.jsonl", f"{cap}/profile.rank{{rank}}.metrics.jsonl",
                  settings, window, python=sys.executable)
nsys = ["nsys", "profile",  # PATH starts with the 2025.3.1 folder
        f"--trace={trace or 'cuda,cudnn,cublas,osrt,nvtx'}", "--sample=none", "--cpuctxsw=none", "--cuda-graph-trace=node",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--show-output=true", "--force-overwrite=true",
        f"--output={cap}/profile"]
# @none: sftprof.capture.rank runs rank 0 without nsys when only rank 1 is profiled
print(json.dumps(rank.rank_argv(sys.executable, [1 if trace == "none" else 0], cap, {}) + nsys + app))
PYEOF
  mkdir -p "$cap"; local s=$(date +%s)
  timeout "$2" "$PY" -c "import json,subprocess,sys; sys.exit(subprocess.call(json.load(open('$W/argv-$name.json'))))" > "$OUT/train-$name.log" 2>&1
  echo "train_${name}_rc=$? wall_s=$(( $(date +%s) - s ))"
  grep -E "Error|error:|OutOfMemory|CUDA out of memory|layer_spec|Nsys profiling|Capture range|Generating" "$OUT/train-$name.log" | tail -8
  if [ -n "${OVERHEAD:-}" ]; then  # one line of overhead_matrix.py's form, no export: the step times are kept
    "$PY" tests/gpu_programs/overhead_matrix.py --line "$cap"/profile.rank0.metrics.jsonl "nemo_lora" "$name" "${3:-1}" \
      "${WINDOW_START:-2}" "${WINDOW_END:-3}" >> "$OUT/overhead.jsonl"; tail -1 "$OUT/overhead.jsonl" | cut -c1-160
    return
  fi
  cp "$cap"/*.metrics.jsonl "$OUT/nemo_$name.metrics.jsonl" 2>/dev/null; cat "$cap"/*.metrics.jsonl 2>/dev/null | cut -c1-200
  if ls "$cap"/profile*.nsys-rep >/dev/null 2>&1; then
    rep=$(ls "$cap"/profile*.nsys-rep | head -1); cp "$rep" "$OUT/nemo_$name.nsys-rep"
    "$NSYS" export --type=sqlite --force-overwrite=true -o "$OUT/nemo_$name.sqlite" "$rep" > "$OUT/export-$name.log" 2>&1; echo "export_rc=$?"
    "$NSYS" stats -r cuda_gpu_kern_sum,cuda_gpu_mem_time_sum --format csv -o "$OUT/nemo_$name" "$OUT/nemo_$name.sqlite" > /dev/null 2>&1
    ls -la "$OUT"
  fi
  cp "$cap"/*.json "$OUT/" 2>/dev/null
}
# RUNS: which to make (default LoRA with the window opened by cudaProfilerStart/Stop alone, then with op_ranges,
# emit_nvtx on: what op-level ranges cost NeMo; full fine-tuning of 7B ran out of the H200's memory on 2026-12-01);
# PEFT+KNOB (lora+cuda_graphs) switches a knob of sft.nemo on.
# OVERHEAD=1: each of RUNS REPEATS times (every run once, then again), its step times as one line of
# overhead_matrix.py's overhead.jsonl (the table: overhead_table.py), nothing exported; FIRST_RUN (1) numbers
# the first repeat, so that a second call's lines can join the first's.
for repeat in $(seq "${REPEATS:-1}"); do
  for name in ${RUNS:-lora lora+op_ranges}; do
    [ -f "$W/probe/sft/training.jsonl" ] && run_one "$name" \
      "$([[ $name == *+cuda_graphs* || $name == *+packed_sequence* ]] && echo 120 || echo 220)" "${OVERHEAD:+$(( ${FIRST_RUN:-1} + repeat - 1 ))}"
  done
done
echo "total_s=$(( $(date +%s) - t0 ))"
# PACK=1: the logs, metrics and kernel tables in one archive (what comes back from $OUT is at most 8 files)
if [ -n "${PACK:-}" ]; then
  (cd "$OUT" && tar -cJf /tmp/nemo_runs.tar.xz --exclude='*.sqlite' --exclude='*.nsys-rep' ./* && rm -f ./*.log ./*.csv ./*.json \
    && mv /tmp/nemo_runs.tar.xz .)
fi
