"""Inputs for real captures of sftprof's built-in SFT loop (`python -m sftprof.capture.sft`): one clean
run and runs that each carry one problem the trainer's `sft` switches fix. The committed
fixtures tests/fixtures/h200_sft_*.sqlite were made with this file (see tests/fixtures/README.md).

  clean          long records, padding longest + pad_to_multiple_of 64, pinned batches, fused AdamW
  padding        short records padded to seq_length (padding max_length): mostly padding
  padding_fixed  the same short records, padding longest + pad_to_multiple_of 64
  foreach_adamw  clean with fused_optimizer false (torch's foreach AdamW)
  pageable       clean with pin_memory false (batches copied from pageable host memory)
  data_stall     clean's settings, run by slow_data.py (a sleep in the data path)
  bf16_true      clean with precision bf16-true (bf16 weights, no autocast): the fix of clean's float32 weights

The fixes of foreach_adamw, pageable and data_stall are clean itself.

    python tests/gpu_programs/sft_cases.py WORK [--size h200|tiny] [--steps 30] [--window 10 11]
        [--capture-range cudaProfilerApi|nvtx]

writes WORK/data/{short,long}/{training,validation,test}.jsonl (dolly-format records made by
sftprof.capture.data's generator; long ones join several into one multi-part request), WORK/model/ (a
randomly initialised Llama made by sftprof.capture.model.create_tiny_llama; `h200` is TinyLlama-1.1B's
shape) and WORK/cases/CASE.json, the settings argument of `python -m sftprof.capture.sft`.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import yaml

from sftprof.capture.data import build_prompt, generate_sample, prepare_sft_splits, write_jsonl

CASES = ("clean", "padding", "padding_fixed", "foreach_adamw", "pageable", "data_stall", "bf16_true")
SPLITS = {"training": 0.8, "validation": 0.15, "test": 0.05}
SAMPLE_RECORDS, SAMPLE_SEED, SPLIT_SEED = 300, 0, 1234
MODELS = {
    # TinyLlama-1.1B's shape (with full multi-head attention) and sftprof's byte tokenizer (vocab 260).
    "h200": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_layers": 16,
        "num_heads": 16,
        "num_kv_heads": 16,
        "max_position_embeddings": 2048,
        "seed": 0,
    },
    # h200_tiny_llama_bf16's model (tests/fixtures/README.md): launch-bound, where host costs show most.
    "small": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_layers": 4,
        "num_heads": 8,
        "num_kv_heads": 4,
        "max_position_embeddings": 2048,
        "seed": 0,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_layers": 2,
        "num_heads": 4,
        "num_kv_heads": 2,
        "max_position_embeddings": 2048,
        "seed": 0,
    },
}


def _schema_sft_defaults() -> dict:
    """Every `sft` key of the torch backend, at config.schema.yaml's default (a key the schema gains comes too)."""
    # the schema file itself: sftprof.capture.config needs jsonschema, which the GPU machine lacks
    schema = Path(__file__).resolve().parents[2] / "sftprof" / "capture" / "config.schema.yaml"
    properties = yaml.safe_load(schema.read_text())["definitions"]["sft"]["properties"]
    return {name: spec["default"] for name, spec in properties.items() if "default" in spec and name != "nemo"}


SFT = {  # the schema's defaults, then ours
    **_schema_sft_defaults(),
    "precision": "bf16",
    "steps": 30,
    "seq_length": 2048,
    "padding": "longest",
    "pad_to_multiple_of": 64,
    "pin_memory": True,
    "fused_optimizer": True,
}
OVERRIDES = {
    "clean": {},
    "padding": {"padding": "max_length", "pad_to_multiple_of": 1},
    "padding_fixed": {},
    "foreach_adamw": {"fused_optimizer": False},
    "pageable": {"pin_memory": False},
    "data_stall": {},
    "bf16_true": {"precision": "bf16-true"},
}
SHORT_DATA = ("padding", "padding_fixed")


def long_records(parts: list[dict], seed: int, min_bytes: int = 1900, max_bytes: int = 2600) -> list[dict]:
    """Dolly-format records of about min_bytes..max_bytes of prompt + response (the byte tokenizer
    makes a byte a token), each a multi-part request joined from consecutive generated records:
    numbered instructions, their contexts, and numbered answers."""
    rng, records, start = random.Random(seed), [], 0
    while start < len(parts):
        target, end = rng.randint(min_bytes, max_bytes), start + 1
        while True:
            group = parts[start:end]
            instruction = f"Answer each of these {len(group)} requests in order, numbering the answers.\n" + "\n".join(
                f"{i}. {part['instruction']}" for i, part in enumerate(group, 1)
            )
            context = "\n".join(part["context"] for part in group if part["context"])
            response = "\n".join(f"{i}. {part['response']}" for i, part in enumerate(group, 1))
            size = len((build_prompt(instruction, context) + response).encode())
            if size >= target or end >= len(parts):
                break
            end += 1
        if size >= min_bytes:
            records.append(
                {"instruction": instruction, "context": context, "response": response, "category": "general_qa"}
            )
        start = end
    return records


def write_data(work: Path) -> dict[str, Path]:
    """WORK/data/short (the project's own sample: 300 records, seed 0, split 80/15/5 with seed 1234,
    as the demo experiment makes it) and WORK/data/long (4,000 generated records joined into
    multi-part ones); returns each training.jsonl."""
    made = {}
    for name, records in (
        ("short", generate_sample(SAMPLE_RECORDS, SAMPLE_SEED)),
        ("long", long_records(generate_sample(4000, SAMPLE_SEED + 1), SAMPLE_SEED + 1)),
    ):
        folder = work / "data" / name
        folder.mkdir(parents=True, exist_ok=True)
        write_jsonl(folder / "dolly.jsonl", records)
        stats = prepare_sft_splits(
            folder / "dolly.jsonl", {split: folder / f"{split}.jsonl" for split in SPLITS}, SPLITS, SPLIT_SEED
        )
        (folder / "stats.json").write_text(json.dumps(stats, indent=2))
        print(f"data {name}: {stats['records_per_split']}, bytes {stats['lengths']['training']['bytes']}")
        made[name] = folder / "training.jsonl"
    return made


def case_settings(
    case: str, work: Path, data: dict[str, Path], steps: int, window: tuple[int, int], capture_range: str, device: str
) -> dict:
    sft = dict(SFT, steps=steps, device=device, **OVERRIDES[case])
    return {
        "model_dir": str(work / "model"),
        "train_jsonl": str(data["short" if case in SHORT_DATA else "long"]),
        "metrics_path": str(work / "metrics" / f"h200_sft_{case}.metrics.jsonl"),
        "sft": sft,
        "window": {
            "capture_range": capture_range,
            "capture_range_end": "stop",
            "start_step": window[0],
            "end_step": window[1],
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", type=Path)
    parser.add_argument("--size", choices=MODELS, default="h200")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--window", type=int, nargs=2, default=(10, 11))
    parser.add_argument("--capture-range", choices=("cudaProfilerApi", "nvtx"), default="cudaProfilerApi")
    parser.add_argument("--device", choices=("cuda", "cpu", "auto"), default="cuda")
    parser.add_argument("--no-model", action="store_true", help="leave WORK/model as it is")
    args = parser.parse_args()
    work = args.work.resolve()
    (work / "cases").mkdir(parents=True, exist_ok=True)
    (work / "metrics").mkdir(parents=True, exist_ok=True)
    data = write_data(work)
    for case in CASES:
        settings = case_settings(case, work, data, args.steps, tuple(args.window), args.capture_range, args.device)
        (work / "cases" / f"{case}.json").write_text(json.dumps(settings))
    if not args.no_model:
        from sftprof.capture.model import create_tiny_llama

        summary = create_tiny_llama(MODELS[args.size], work / "model")
        print(f"model: {summary['parameters']:,} parameters, vocab {summary['vocab_size']}")


if __name__ == "__main__":
    main()
