"""Dolly-format sample, prompt template and the seeded split."""

from __future__ import annotations

import json

from sftprof.capture import data


def test_sample_has_dolly_fields_and_is_deterministic():
    first, again, other = data.generate_sample(50, 7), data.generate_sample(50, 7), data.generate_sample(50, 8)
    assert first == again and first != other
    assert all(set(r) == set(data.DOLLY_FIELDS) and data.is_valid_record(r) for r in first)
    assert any(r["context"] for r in first) and any(not r["context"] for r in first)


def test_prompt_template_shows_context_only_when_present():
    with_context = data.build_prompt("  Say hi. ", " Greeting rules. ")
    assert with_context == "### Instruction:\nSay hi.\n\n### Context:\nGreeting rules.\n\n### Response:\n"
    assert data.build_prompt("Say hi.", "  ") == "### Instruction:\nSay hi.\n\n### Response:\n"


def test_split_is_80_15_5_and_seeded(tmp_path):
    source = tmp_path / "dolly.jsonl"
    records = data.generate_sample(200, 1)
    records += [
        {"instruction": "x", "context": "", "response": "   ", "category": "open_qa"},
        {"instruction": "y", "context": "", "category": "open_qa"},
    ]
    data.write_jsonl(source, records)
    out = {split: tmp_path / f"{split}.jsonl" for split in data.SPLITS}
    stats = data.prepare_sft_splits(source, out, {"training": 0.8, "validation": 0.15, "test": 0.05}, seed=3)
    assert stats["records_read"] == 202 and stats["records_skipped"] == 2
    assert stats["records_per_split"] == {"training": 160, "validation": 30, "test": 10}
    rows = {split: [json.loads(line) for line in out[split].read_text().splitlines()] for split in data.SPLITS}
    assert all(set(row) == {"input", "output", "category"} for split in rows.values() for row in split)
    every_output = sorted(row["output"] for split in rows.values() for row in split)
    assert every_output == sorted(r["response"].strip() for r in records[:200])
    first_order = out["training"].read_text()
    data.prepare_sft_splits(source, out, {"training": 0.8, "validation": 0.15, "test": 0.05}, seed=3)
    assert out["training"].read_text() == first_order
    data.prepare_sft_splits(source, out, {"training": 0.8, "validation": 0.15, "test": 0.05}, seed=4)
    assert out["training"].read_text() != first_order


def test_bad_json_names_the_line(tmp_path):
    source = tmp_path / "dolly.jsonl"
    source.write_text('{"instruction": "a"}\n{broken\n')
    try:
        list(data.read_jsonl(source))
    except ValueError as error:
        assert f"{source}:2" in str(error)
    else:
        raise AssertionError("malformed jsonl was accepted")
