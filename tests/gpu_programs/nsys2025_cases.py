"""Inputs for the Nsight Systems 2025.3.1 captures of tests/fixtures/nsys2025/ (capture_nsys2025.sh):
sft_cases.py's data and `sft` settings, with two small models so the exports stay small.

  clean  sft_cases.py's clean case (long data, seq_length 2048, micro-batch 4, 2 accumulation
         steps, 30 steps, window 10-11) on the "small" Llama below instead of TinyLlama's shape
  long   the "tiny" Llama of sft_cases.py on the short data with seq_length 512, a window from
         step 3 that long_sft.py closes after a time limit (the step count is only an upper bound)

    python tests/gpu_programs/nsys2025_cases.py WORK [--device cuda|cpu] [--steps 30] [--window 10 11]
        [--capture-range cudaProfilerApi|nvtx]

writes WORK/data/..., WORK/model_small/, WORK/model_tiny/ and WORK/cases/{clean,long}.json (the
settings argument of `python -m sftprof.capture.sft` and of long_sft.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sft_cases import MODELS, SFT, case_settings, write_data  # noqa: E402

LONG_STEPS = 10_000_000  # an upper bound: long_sft.py stops the run after its time limit
LONG_SFT = {"seq_length": 512}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu", "auto"), default="cuda")
    parser.add_argument("--steps", type=int, default=SFT["steps"])
    parser.add_argument("--window", type=int, nargs=2, default=(10, 11))
    parser.add_argument("--long-start", type=int, default=3)
    parser.add_argument("--capture-range", choices=("cudaProfilerApi", "nvtx"), default="cudaProfilerApi")
    args = parser.parse_args()
    work = args.work.resolve()
    for folder in ("cases", "metrics"):
        (work / folder).mkdir(parents=True, exist_ok=True)
    data = write_data(work)
    clean = case_settings("clean", work, data, args.steps, tuple(args.window), args.capture_range, args.device)
    clean["model_dir"] = str(work / "model_small")
    long = case_settings(
        "clean",
        work,
        {"short": data["short"], "long": data["short"]},
        LONG_STEPS,
        (args.long_start, LONG_STEPS - 1),
        args.capture_range,
        args.device,
    )
    long["sft"].update(LONG_SFT)
    long["model_dir"] = str(work / "model_tiny")
    long["metrics_path"] = str(work / "metrics" / "h200_sft_long.metrics.jsonl")
    for name, settings in (("clean", clean), ("long", long)):
        (work / "cases" / f"{name}.json").write_text(json.dumps(settings))
    from sftprof.capture.model import create_tiny_llama

    for name, shape in (("small", MODELS["small"]), ("tiny", MODELS["tiny"])):
        summary = create_tiny_llama(shape, work / f"model_{name}")
        print(f"model_{name}: {summary['parameters']:,} parameters, vocab {summary['vocab_size']}")


if __name__ == "__main__":
    main()
