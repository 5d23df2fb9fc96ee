"""The trainer's metrics file as an input (sftprof.trace.metrics): the one reader, typed columns, the
run's facts, and every check the report and the CLI relied on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from sftprof.capture.sft.torch_backend import StepRecord
from sftprof.report import RankReport, html
from sftprof.trace import metrics
from sftprof.trace.metrics import STEP_COLUMNS, MetricsError, read_metrics

FIXTURES = Path(__file__).parent / "fixtures"
OLD_FILE = FIXTURES / "h200_tiny_llama_bf16.metrics.jsonl"  # written before the token and run facts existed
RUN = {
    "parameters": 6_738_415_616,
    "weight_dtype": "float32",
    "precision": "bfloat16",
    "model": {
        "architecture": "LlamaForCausalLM",
        "num_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_heads": 32,
        "num_kv_heads": 32,
        "vocab_size": 32000,
        "seq_length": 2048,
        "embedding_parameters": 131_072_000,
    },
    "padding": "longest",
    "pad_to_multiple_of": 64,
    "pin_memory": True,
    "fused_optimizer": True,
    "loss_every": 4,
    "compile": False,
    "device_name": "NVIDIA H200",
}


def trainer_lines() -> list[dict]:
    """Lines as the torch trainer writes them (its own StepRecord.line), the run's facts on step 0."""
    lines = []
    for step in range(3):
        record = StepRecord(step, loss=None if step == 1 else 2.5 - step, in_window=step == 1)
        record.padded_lengths, record.token_slots = [128, 64], 8 * 128 + 8 * 64
        record.real_tokens, record.label_tokens = 1000 + step, 400 + step
        line = record.line(rank=0, step_time=0.5)
        if step == 0:
            line["run"] = RUN
        lines.append(line)
    return lines


def write_lines(path: Path, lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_an_old_file_loads_with_the_new_columns_missing():
    read = read_metrics(OLD_FILE)
    raw = [json.loads(line) for line in OLD_FILE.read_text().splitlines()]
    assert list(read.steps.columns) == STEP_COLUMNS and len(read.steps) == len(raw) == 10
    assert read.steps["step"].tolist() == [line["step"] for line in raw]
    assert read.steps["tokens"].tolist() == [line["tokens"] for line in raw]
    assert read.steps["step_time_s"].tolist() == [line["step_time_s"] for line in raw]
    assert read.steps["in_window"].tolist() == [line["in_window"] for line in raw]
    for column in ("rank", "token_slots", "real_tokens", "label_tokens", "padded_lengths"):
        assert read.steps[column].isna().all(), column
    assert read.run == {}
    # what the report shows: the fields the file has, as before
    assert read.present_columns() == [c for c in STEP_COLUMNS if c in raw[0]]


def test_the_trainers_lines_load_typed_with_the_run_facts(tmp_path):
    read = read_metrics(write_lines(tmp_path / "m.jsonl", trainer_lines()))
    steps = read.steps
    assert steps["step"].dtype == "int64" and steps["in_window"].dtype == bool
    for column in ("rank", "tokens", "token_slots", "real_tokens", "label_tokens"):
        assert steps[column].dtype == "Int64", column
    assert steps["loss"].dtype == "Float64" and steps["loss"].isna().tolist() == [False, True, False]
    assert steps["token_slots"].tolist() == [1536] * 3 and steps["real_tokens"].tolist() == [1000, 1001, 1002]
    assert steps["tokens"].tolist() == steps["real_tokens"].tolist()  # `tokens` is real_tokens under its old name
    assert steps["padded_lengths"].tolist() == [[128, 64]] * 3
    assert read.run == RUN
    assert read.present_columns() == STEP_COLUMNS


def test_a_real_run_of_the_trainer_loads_with_its_facts():
    path = FIXTURES / "h200_sft_clean.metrics.jsonl"
    raw = [json.loads(line) for line in path.read_text().splitlines()]
    read = read_metrics(path)
    assert len(read.steps) == len(raw) == 30 and read.run == raw[0]["run"]
    for column in ("token_slots", "real_tokens", "label_tokens", "rank", "tokens"):
        assert read.steps[column].tolist() == [line[column] for line in raw], column
    assert read.steps["padded_lengths"].tolist() == [line["padded_lengths"] for line in raw]


def test_a_diverged_or_unread_loss_is_na_and_the_others_are_numbers(tmp_path):
    path = write_lines(
        tmp_path / "m.jsonl",
        [
            '{"step": 0, "loss": NaN, "step_time_s": 1, "tokens_per_s": 2, "in_window": false}',
            '{"step": 1, "loss": null, "step_time_s": 1, "tokens_per_s": 2, "in_window": false}',
            '{"step": 2, "loss": 1.5, "step_time_s": 1, "tokens_per_s": 2, "in_window": false}',
        ],
    )
    loss = read_metrics(path).steps["loss"]
    assert loss.dtype == "Float64" and loss.isna().tolist() == [True, True, False] and loss.iloc[2] == 1.5


def test_no_path_is_no_metrics():
    read = read_metrics(None)
    assert read.steps.empty and list(read.steps.columns) == STEP_COLUMNS and read.run == {}


GOOD = {"step": 0, "step_time_s": 0.1, "tokens_per_s": 1.0, "in_window": True}


@pytest.mark.parametrize(
    "line, message",
    [
        ({**GOOD, "token_slots": "4"}, "line 1: token_slots must be a non-negative integer"),
        ({**GOOD, "real_tokens": -1}, "real_tokens must be a non-negative integer"),
        ({**GOOD, "label_tokens": 2**63}, "label_tokens must be"),
        ({**GOOD, "padded_lengths": [128, 0]}, "padded_lengths must be a list of positive integers"),
        ({**GOOD, "padded_lengths": "128"}, "padded_lengths must be a list"),
        ({**GOOD, "run": [1]}, "line 1: run must be an object"),
        ({**GOOD, "run": {**RUN, "parameters": 1.5}}, "run.parameters must be a non-negative integer"),
        ({**GOOD, "run": {**RUN, "precision": 16}}, "run.precision must be a string or null"),
        (
            {**GOOD, "run": {**RUN, "model": {**RUN["model"], "hidden_size": "4096"}}},
            "run.model.hidden_size must be a non-negative integer",
        ),
        ({**GOOD, "step": True}, "step must be an integer"),
        ({**GOOD, "tokens_per_s": float("inf")}, "tokens_per_s must be a finite number"),
        ({**GOOD, "tokens_per_s": -5}, "tokens_per_s must be a finite number, 0 or more"),
        # a negative, zero or overflowing step time made the profiling overhead -198%, or the unprofiled step inf
        ({**GOOD, "step_time_s": -0.3}, "step_time_s must be a number of seconds above 0"),
        ({**GOOD, "step_time_s": 0}, "step_time_s must be a number of seconds above 0"),
        ({**GOOD, "step_time_s": 1e308}, "step_time_s must be a number of seconds above 0 and at most"),
    ],
)
def test_new_fields_are_checked_by_line_and_field(tmp_path, line, message):
    path = write_lines(tmp_path / "m.jsonl", [GOOD, line] if "line 1" not in message else [line])
    with pytest.raises(MetricsError, match=message.replace("(", r"\(")) as refused:
        read_metrics(path)
    assert str(path) in str(refused.value) and "\n" not in str(refused.value)


def test_a_path_that_is_not_a_regular_file_is_refused_without_opening_it(tmp_path):
    fifo = tmp_path / "metrics.jsonl"
    os.mkfifo(fifo)  # opening it for reading would block until a writer comes
    with pytest.raises(MetricsError, match="not a regular file"):
        read_metrics(fifo)
    with pytest.raises(MetricsError, match="not a regular file"):
        read_metrics(tmp_path)
    with pytest.raises(MetricsError, match="No such file"):
        read_metrics(tmp_path / "absent.jsonl")


def test_there_is_one_reader():
    """The report and the CLI read the metrics through the trace package's loader, not their own."""
    assert html.read_metrics is metrics.read_metrics
    assert not hasattr(html, "METRICS_FIELDS")
    import sftprof.cli

    source = Path(sftprof.cli.__file__).read_text()
    assert "from sftprof.trace.metrics import read_metrics" in source


def test_the_report_shows_the_new_columns_and_the_old_file_as_before(tmp_path):
    from sftprof.analysis import Analysis

    analysis = Analysis(source_path="x", span_ns=1, sources=[])
    old = html._rank_context(RankReport("", analysis, OLD_FILE), "")
    assert "token_slots" not in old["sections"]["metrics"] and "tokens_per_s" in old["sections"]["metrics"]
    assert old["window_tokens_per_s"] == pytest.approx(
        pd.Series([json.loads(line)["tokens_per_s"] for line in OLD_FILE.read_text().splitlines()][4:7]).median()
    )
    new = html._rank_context(RankReport("", analysis, write_lines(tmp_path / "m.jsonl", trainer_lines())), "")
    assert "token_slots" in new["sections"]["metrics"] and "[128, 64]" in new["sections"]["metrics"]
    assert new["window_tokens_per_s"] == pytest.approx(1001 / 0.5)
