"""What each Nsight Systems setting costs the built-in trainer's step (issue 51, deliverable 2).

For each model size and each trace setting, one run of `python -m sftprof.capture.sft` (emit_nvtx through the
window's op_ranges) under nsys, and runs without nsys for the unprofiled step. One
JSON line per run goes to OUT/overhead.jsonl as soon as the run ends, so a run cut off at its time limit
keeps what it measured. Step times are the trainer's own (metrics file, CUDA events): the window's steps,
and the steps outside it after WARMUP steps.

    python tests/gpu_programs/overhead_matrix.py WORK OUT [--budget-s 560] [--sizes small 1b] [--repeats 2]
        [--nsys PATH] [--dry-run]

Runs are ordered so that the first pass over every setting of every size comes before any repeat: a
short budget still gives one measurement of each. A run that would not finish in the budget left, judged
by the longest run of its size so far, is skipped and said so. --dry-run: the tiny CPU model, every nsys
command line printed and the runs made without nsys (what a CPU machine can check; the emit_nvtx run fails
there in one line, as op ranges need CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

WARMUP = 3  # sftprof.analysis.variants.WARMUP_STEPS: allocator growth, autotuning, compilation
# The window's first and last steps hold cudaProfilerStart/Stop and nsys starting and stopping the capture, in
# the trainer's timer, so only its inner steps are timed (`window_ms`), and their median: one of them can be slow
# in every run, with or without nsys (the 1B model's step 7: 384-435 ms against 225 ms with neither nsys nor
# cudaProfilerStart/Stop, H100, cause not found; tests/fixtures/overhead/h100_profiler_api.jsonl). Every step has
# one shape (PADDING), so a new batch length's first-time costs (cuDNN plans, allocator growth) fall in no step.
STEPS, WINDOW = 16, (6, 11)
PADDING = {"padding": "max_length", "pad_to_multiple_of": 1}
# The settings measured: nsys options (None: no nsys), and whether emit_nvtx wraps the window's steps.
BASE = ["--sample=none", "--cpuctxsw=none"]
RANGE = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
SETTINGS = {
    "unprofiled": (None, False),
    # No nsys, and the trainer's window calls no cudaProfilerStart/Stop: what those calls cost alone.
    "unprofiled,no_profiler_api": (None, False),
    "cuda": (["--trace=cuda", *BASE, *RANGE], False),
    "cuda,nvtx": (["--trace=cuda,nvtx", *BASE, *RANGE], False),
    "cuda,nvtx,osrt": (["--trace=cuda,nvtx,osrt", *BASE, *RANGE], False),
    "cuda,nvtx,osrt,cublas,cudnn": (["--trace=cuda,nvtx,osrt,cublas,cudnn", *BASE, *RANGE], False),
    "cuda,nvtx+emit_nvtx": (["--trace=cuda,nvtx", *BASE, *RANGE], True),
    "cuda,nvtx+graph_node": (["--trace=cuda,nvtx", *BASE, "--cuda-graph-trace=node", *RANGE], False),
    "cuda,nvtx+sampling": (["--trace=cuda,nvtx", "--sample=process-tree", "--cpuctxsw=process-tree", *RANGE], False),
    "cuda,nvtx,no_capture_range": (["--trace=cuda,nvtx", *BASE], False),
}
# The model sizes: how the model folder is made, and the trainer's batch shape.
SIZES = {
    # h200_tiny_llama_bf16's model (tests/fixtures/README.md): launch-bound, where host costs show most.
    "small": {
        "model": "small",
        "data": "short",
        "sft": {"micro_batch_size": 8, "grad_accum_steps": 2, "seq_length": 256},
    },
    # Llama 3.2 1B's shape, random weights (1.24B parameters): GPU-bound at these shapes.
    "1b": {
        "architecture": "llama3.2-1b",
        "data": "long",
        "sft": {"micro_batch_size": 2, "grad_accum_steps": 2, "seq_length": 2048},
    },
    # --dry-run's model: what a CPU runs in seconds.
    "cpu": {
        "model": "tiny",
        "data": "short",
        "sft": {"micro_batch_size": 2, "grad_accum_steps": 1, "seq_length": 256, "precision": "fp32"},
    },
}


def prepare(work: Path, size: str) -> Path:
    """WORK/model_SIZE (made once) and WORK/data (sft_cases.write_data's short and long records)."""
    from sft_cases import MODELS, write_data

    from sftprof.capture.model import create_random_model, create_tiny_llama

    if not (work / "data" / "long" / "training.jsonl").exists():
        write_data(work)
    folder = work / f"model_{size}"
    if not folder.exists():
        spec = SIZES[size]
        if "architecture" in spec:
            create_random_model({"architecture": spec["architecture"], "seed": 0}, folder)
        else:
            create_tiny_llama(MODELS[spec["model"]], folder)
    return folder


def settings_json(work: Path, size: str, name: str, run: int, device: str, emit: bool) -> tuple[dict, Path]:
    """The trainer's settings argument (sft_cases.SFT with the size's shapes) and its metrics file."""
    from sft_cases import SFT

    spec = SIZES[size]
    metrics = work / "metrics" / f"{size}.{name}.{run}.metrics.jsonl"
    sft = dict(SFT, steps=STEPS, device=device, ddp_overlap=True, **PADDING, **spec["sft"])
    return {
        "model_dir": str(work / f"model_{size}"),
        "train_jsonl": str(work / "data" / spec["data"] / "training.jsonl"),
        "metrics_path": str(metrics),
        "sft": sft,
        "window": {
            "capture_range": "none" if device == "cpu" or name.endswith("no_profiler_api") else "cudaProfilerApi",
            "capture_range_end": "stop",
            "start_step": WINDOW[0],
            "end_step": WINDOW[1],
            "op_ranges": emit,
        },
    }, metrics


def median(values: list[float]) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def step_times(metrics: Path, window: tuple[int, int] = WINDOW) -> tuple[float | None, float | None, int, list[float]]:
    """(median inner window step, median step outside the window after WARMUP, steps outside, every step) in ms,
    by step number (the window's edge steps are in neither median)."""
    lines = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    first, last = window
    inside = [1e3 * r["step_time_s"] for r in lines if first < r["step"] < last]
    outside = [1e3 * r["step_time_s"] for r in lines if r["step"] >= WARMUP and not first <= r["step"] <= last]
    return median(inside), median(outside), len(outside), [round(1e3 * r["step_time_s"], 2) for r in lines]


def command(nsys: str, options: list[str] | None, settings: dict, report: Path) -> list[str]:
    program = [sys.executable, "-m", "sftprof.capture.sft", json.dumps(settings)]
    if options is None:
        return program
    return [nsys, "profile", *options, "--show-output=true", "-f", "true", "-o", str(report), *program]


def run_once(argv: list[str], output, env: dict, timeout_s: float) -> int | str:
    """Run argv in a session of its own; past timeout_s, kill that session (nsys leaves agents behind that a
    kill of nsys alone does not end: ../shared/nsys-lab/README.md)."""
    child = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        return child.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        return "timeout"


def plan(sizes: list[str], repeats: int, settings: list[str]) -> list[tuple[int, str, str]]:
    """(run, size, setting): every setting of every size once, then again, in SETTINGS' order (unprofiled first)."""
    chosen = [name for name in SETTINGS if name in settings]
    return [(run, size, name) for run in range(1, repeats + 1) for size in sizes for name in chosen]


def nemo_line(argv: list[str]) -> int:
    """`--line METRICS SIZE RUN_NAME RUN FIRST LAST`: one overhead.jsonl line for a run of nemo_h200.sh (OVERHEAD=1),
    whose RUN_NAME is PEFT[+KNOB...][@TRACE]: `@none` is the unprofiled run, +op_ranges adds `+emit_nvtx`."""
    metrics, size, name, run, first, last = argv
    knobs, _, trace = name.partition("@")
    setting = "unprofiled" if trace == "none" else (trace or "cuda,cudnn,cublas,osrt,nvtx")
    emit = "+op_ranges" in knobs
    setting += "+emit_nvtx" if emit and trace != "none" else ""
    window = (int(first), int(last))
    found = Path(metrics).exists()
    inside, outside, n_outside, every = step_times(Path(metrics), window) if found else (None, None, 0, [])
    line = {"size": size, "setting": setting, "run": int(run), "emit_nvtx": emit, "rc": 0 if inside else "no metrics"}
    line.update(window_ms=inside, outside_ms=outside, outside_steps=n_outside, step_ms=every, window=list(window))
    print(json.dumps(line))
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--line"]:
        return nemo_line(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--budget-s", type=float, default=560.0)
    parser.add_argument("--sizes", nargs="+", choices=sorted(SIZES), default=["small", "1b"])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--nsys", default="/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys")
    parser.add_argument("--run-timeout-s", type=float, default=150.0)
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny model, nsys command lines only printed")
    args = parser.parse_args()
    start = time.monotonic()
    work, out = args.work.resolve(), args.out.resolve()
    (work / "metrics").mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    sizes, device = (["cpu"], "cpu") if args.dry_run else (args.sizes, "cuda")
    for size in sizes:
        prepare(work, size)
    print(f"== prepared in {time.monotonic() - start:.0f} s", flush=True)
    longest: dict[str, float] = {}
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for run, size, name in plan(sizes, args.repeats, args.settings):
        options, emit = SETTINGS[name]
        left = args.budget_s - (time.monotonic() - start)
        if longest.get(size, 0.0) * 1.2 > left:
            print(
                f"== {size} {name} run {run} skipped: {left:.0f} s left, a run took {longest[size]:.0f} s", flush=True
            )
            continue
        settings, metrics = settings_json(work, size, name, run, device, emit)
        report = work / f"{size}.{name}.{run}"
        argv = command(args.nsys, options, settings, report)
        if args.dry_run and options is not None:
            print("   would run:", shlex.join(argv[: argv.index(sys.executable)]), "...", flush=True)
            argv = argv[argv.index(sys.executable) :]
        t0 = time.monotonic()
        log = work / f"{size}.{name}.{run}.log"
        with open(log, "w") as output:
            rc = run_once(argv, output, env, min(args.run_timeout_s, left))
        wall = time.monotonic() - t0
        longest[size] = max(longest.get(size, 0.0), wall)
        inside, outside, n_outside, every = step_times(metrics) if metrics.exists() else (None, None, 0, [])
        line = {
            "size": size,
            "setting": name,
            "run": run,
            "nsys_options": options,
            "emit_nvtx": emit,
            "rc": rc,
            "wall_s": round(wall, 1),
            "window_ms": inside,
            "outside_ms": outside,
            "outside_steps": n_outside,
            "step_ms": every,
            "steps": STEPS,
            "window": list(WINDOW),
            "warmup": WARMUP,
            "dry_run": args.dry_run,
        }
        with open(out / "overhead.jsonl", "a") as lines:
            lines.write(json.dumps(line) + "\n")
        print(f"== {size} {name} run {run}: rc={rc} {wall:.0f} s, window {inside} ms, outside {outside} ms", flush=True)
        if rc != 0:
            print("   " + "   ".join(log.read_text(errors="replace").splitlines(True)[-5:]), flush=True)
        for leftover in (Path(f"{report}.nsys-rep"), Path(f"{report}.qdstrm")):
            leftover.unlink(missing_ok=True)  # only the step times are kept: disk stays free
    print(f"== done in {time.monotonic() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
