"""Dolly-format data: a generated sample, and conversion to the SFT jsonl the trainers read.

Records follow databricks-dolly-15k's fields (instruction, context, response, category). The
sample's text is generated here from small word banks, so nothing of dolly's text is copied.
The conversion takes any dolly-format jsonl (the sample, or databricks-dolly-15k as
sftprof.capture.hub fetches it) and writes training/validation/test jsonl files with `input` (the
prompt) and `output` (the response), the layout NeMo's fine-tuning data modules read, plus
stats: rows skipped and why, records per split, and length percentiles.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from sftprof.io import atomic_write_text

DOLLY_FIELDS = ("instruction", "context", "response", "category")
SPLITS = ("training", "validation", "test")
SKIP_REASONS = ("not_an_object", "missing_field", "empty_instruction", "empty_response")
# Lengths are counted without a tokenizer, so that data preparation does not depend on the model
# (a new checkpoint would otherwise redo it); model tokens differ from both measures.
LENGTH_MEASURE = (
    "whitespace-separated words and UTF-8 bytes of prompt + response (not model tokens); nearest-rank percentiles"
)
PERCENTILES = (50, 90, 99)

PROMPT_WITH_CONTEXT = "### Instruction:\n{instruction}\n\n### Context:\n{context}\n\n### Response:\n"
PROMPT_WITHOUT_CONTEXT = "### Instruction:\n{instruction}\n\n### Response:\n"


def build_prompt(instruction: str, context: str) -> str:
    """The prompt the model sees; the context block appears only when there is context."""
    instruction, context = instruction.strip(), context.strip()
    if context:
        return PROMPT_WITH_CONTEXT.format(instruction=instruction, context=context)
    return PROMPT_WITHOUT_CONTEXT.format(instruction=instruction)


_THINGS = [
    "a lighthouse",
    "a sourdough starter",
    "a bicycle chain",
    "a tide pool",
    "a glacier",
    "a beehive",
    "a pipe organ",
    "a compost heap",
    "a sundial",
    "a paper kite",
    "a river delta",
    "a violin bow",
    "a greenhouse",
    "a night train",
    "a coral reef",
]
_PLACES = ["Varnholm", "Quellport", "Ostrava Bay", "Mirelle", "Tarn Hollow", "Kesslow", "Brightwater"]
_TRAITS = ["durable", "fragile", "noisy", "slow", "bright", "cheap", "rare", "heavy"]
_VERBS = ["repair", "clean", "measure", "photograph", "explain", "build", "store"]
_CATEGORIES = [
    "open_qa",
    "closed_qa",
    "classification",
    "information_extraction",
    "summarization",
    "brainstorming",
    "creative_writing",
    "general_qa",
]


def _sample_record(rng: random.Random) -> dict[str, str]:
    thing, other = rng.sample(_THINGS, 2)
    place = rng.choice(_PLACES)
    trait = rng.choice(_TRAITS)
    verb = rng.choice(_VERBS)
    year = rng.randint(1820, 2020)
    count = rng.randint(2, 40)
    category = rng.choice(_CATEGORIES)
    context = ""
    if category == "closed_qa":
        context = f"In {year} the town of {place} built {thing}. It took {count} people to finish it."
        instruction = f"When did {place} build {thing}?"
        response = f"{place} built {thing} in {year}."
    elif category == "information_extraction":
        context = f"{place} keeps {count} examples of {thing}, most of them {trait}, first recorded in {year}."
        instruction = f"List the numbers mentioned about {thing} in {place}."
        response = f"The text mentions {count} examples and the year {year}."
    elif category == "summarization":
        context = (
            f"{thing.capitalize()} in {place} was {trait} for years. People learned to {verb} it. "
            f"By {year} the town had {count} of them."
        )
        instruction = f"Summarise the passage about {thing} in one sentence."
        response = f"{place} learned to {verb} {thing}, and had {count} of them by {year}."
    elif category == "classification":
        instruction = f"Is {thing} or {other} more likely to be {trait}? Answer with one of them."
        response = f"{rng.choice([thing, other]).capitalize()} is usually the more {trait} of the two."
    elif category == "brainstorming":
        instruction = f"Give three ways to {verb} {thing}."
        response = f"First, {verb} it slowly. Second, ask someone from {place}. Third, compare it with {other}."
    elif category == "creative_writing":
        instruction = f"Write two sentences about {thing} in {place}."
        response = (
            f"Every morning in {place}, {thing} looked a little more {trait}. "
            f"Nobody could say why, not even after {count} years."
        )
    else:  # open_qa, general_qa
        instruction = f"What is a good way to {verb} {thing}?"
        response = f"Start small: {verb} {thing} the way you would {verb} {other}, and keep notes."
    return {"instruction": instruction, "context": context, "response": response, "category": category}


def generate_sample(num_records: int, seed: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [_sample_record(rng) for _ in range(num_records)]


def read_jsonl(path: str | Path) -> Iterator[dict]:
    with open(path, encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{line_no}: not valid JSON ({exc.msg})") from None


def write_jsonl(path: str | Path, records: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def skip_reason(record) -> str | None:
    """Why a row cannot be trained on (one of SKIP_REASONS), or None. Dolly rows must carry
    every field as a string (`missing_field` also covers null and non-string values) and a
    non-empty instruction and response."""
    if not isinstance(record, dict):
        return "not_an_object"
    if not all(isinstance(record.get(field), str) for field in DOLLY_FIELDS):
        return "missing_field"
    if not record["instruction"].strip():
        return "empty_instruction"
    if not record["response"].strip():
        return "empty_response"
    return None


def is_valid_record(record: dict) -> bool:
    return skip_reason(record) is None


def to_sft_example(record: dict) -> dict[str, str]:
    return {
        "input": build_prompt(record["instruction"], record["context"]),
        "output": record["response"].strip(),
        "category": record["category"],
    }


def split_records(records: list[dict], fractions: dict[str, float], seed: int) -> dict[str, list[dict]]:
    """Shuffle with `seed` and cut into consecutive training/validation/test slices."""
    shuffled = list(records)
    random.Random(seed).shuffle(shuffled)
    n = len(shuffled)
    n_train = int(round(n * fractions["training"]))
    n_val = int(round(n * fractions["validation"]))
    return {
        "training": shuffled[:n_train],
        "validation": shuffled[n_train : n_train + n_val],
        "test": shuffled[n_train + n_val :],
    }


def percentiles(values: list[int]) -> dict[str, int] | None:
    """Nearest-rank percentiles and the maximum; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    picked = {f"p{q}": ordered[max(math.ceil(q / 100 * len(ordered)), 1) - 1] for q in PERCENTILES}
    return picked | {"max": ordered[-1]}


def length_stats(examples: list[dict]) -> dict:
    texts = [example["input"] + example["output"] for example in examples]
    return {
        "words": percentiles([len(text.split()) for text in texts]),
        "bytes": percentiles([len(text.encode("utf-8")) for text in texts]),
    }


def prepare_sft_splits(
    dolly_jsonl: str | Path, out_paths: dict[str, str | Path], fractions: dict[str, float], seed: int
) -> dict:
    """Convert a dolly-format jsonl into SFT split files; return stats: the source's sha256, rows
    read and skipped (by reason), records per split and length percentiles per split."""
    records = list(read_jsonl(dolly_jsonl))
    reasons = [skip_reason(r) for r in records]
    valid = [r for r, reason in zip(records, reasons) if reason is None]
    splits = split_records([to_sft_example(r) for r in valid], fractions, seed)
    if not splits["training"]:
        raise ValueError(f"{dolly_jsonl}: no valid records to train on")
    for split, path in out_paths.items():
        write_jsonl(path, splits[split])
    with open(dolly_jsonl, "rb") as handle:
        source_sha256 = hashlib.file_digest(handle, "sha256").hexdigest()
    return {
        "source_sha256": source_sha256,
        "records_read": len(records),
        "records_skipped": len(records) - len(valid),
        "records_skipped_by_reason": {reason: reasons.count(reason) for reason in SKIP_REASONS},
        "split_seed": seed,
        "records_per_split": {split: len(rows) for split, rows in splits.items()},
        "length_measure": LENGTH_MEASURE,
        "lengths": {split: length_stats(rows) for split, rows in splits.items()},
    }
