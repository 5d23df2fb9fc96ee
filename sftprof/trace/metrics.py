"""The trainer's metrics file (`profile.rankN.metrics.jsonl`) as an input: the one reader of it.

sftprof's trainers (sftprof.capture.sft) write one JSON object per optimizer step:

  step, rank, loss (null on steps whose loss was not read; NaN for a diverged run), step_time_s,
  tokens (real tokens, under its original name), tokens_per_s, in_window   -- every trainer
  token_slots, real_tokens, label_tokens, padded_lengths (one per micro-batch)  -- the torch trainer
  run (step 0's line only): the run's facts (parameters, weight_dtype, precision, model shape,
  device_name, switches), what an MFU estimate needs (torch_backend.run_facts)

Older files lack the fields of the second group; they load, with those columns NA. Every line is
checked before anything is drawn from it: a bad file is refused with one line naming the file, the
line and the field, not drawn as a wrong curve or failing halfway through a report.
"""

from __future__ import annotations

import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sftprof.errors import SftprofError
from sftprof.io import InputError, open_regular


class MetricsError(SftprofError, ValueError):
    """A trainer's metrics file that is missing or not what the trainers write."""


_INT64 = 2**63


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_INT64 <= value < _INT64


def _is_float(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _is_count(value) -> bool:
    return _is_int(value) and value >= 0


# A step longer than this is no step a trainer timed (11.6 days): beyond it, milliseconds and shares overflow.
LONGEST_STEP_S = 1e6


def _is_step_time(value) -> bool:
    return _is_float(value) and 0 < value <= LONGEST_STEP_S


# The fields every line must have.
METRICS_REQUIRED = ("step", "step_time_s", "tokens_per_s", "in_window")
# Each known field of a line: how it must be (for the error message), its test, and its column's dtype.
# Integers fit int64 and floats are finite; the loss may be null (or NaN: a diverged run).
METRICS_FIELDS = {
    "step": ("an integer", _is_int, "int64"),
    "rank": ("an integer", _is_int, "Int64"),
    "loss": (
        "a number or null",
        lambda v: v is None or _is_float(v) or (isinstance(v, float) and math.isnan(v)),
        "Float64",
    ),
    "step_time_s": (f"a number of seconds above 0 and at most {LONGEST_STEP_S:g}", _is_step_time, "float64"),
    "tokens": ("an integer", _is_int, "Int64"),
    "tokens_per_s": ("a finite number, 0 or more", lambda v: _is_float(v) and v >= 0, "float64"),
    "in_window": ("true or false", lambda v: isinstance(v, bool), "bool"),
    "token_slots": ("a non-negative integer", _is_count, "Int64"),
    "real_tokens": ("a non-negative integer", _is_count, "Int64"),
    "label_tokens": ("a non-negative integer", _is_count, "Int64"),
    "padded_lengths": (
        "a list of positive integers",
        lambda v: isinstance(v, list) and all(_is_count(x) and x > 0 for x in v),
        "object",
    ),
}
STEP_COLUMNS = list(METRICS_FIELDS)

# The run facts an analysis reads (torch_backend.run_facts), each with its test: a file whose `run`
# holds one of them in another form is refused, so analyses can take them as they are.
# Facts not listed here are kept as they are.
_RUN_FACTS = {
    "parameters": ("a non-negative integer", _is_count),
    "weight_dtype": ("a string", lambda v: isinstance(v, str)),
    "precision": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "device_name": ("a string", lambda v: isinstance(v, str)),
    "model": ("an object", lambda v: isinstance(v, dict)),
    "backend": ("a string", lambda v: isinstance(v, str)),
    "layer_spec": ("a string", lambda v: isinstance(v, str)),
}
_MODEL_FACTS = (
    "num_layers",
    "hidden_size",
    "intermediate_size",
    "num_heads",
    "num_kv_heads",
    "vocab_size",
    "seq_length",
    "embedding_parameters",
)


@dataclass
class RunMetrics:
    """A metrics file, read: `steps` has one row per line, in file order, with every column of
    STEP_COLUMNS typed (NA where a line or an older trainer left a field out); `run` holds the run's
    facts from step 0's line ({} when there are none)."""

    steps: pd.DataFrame = field(default_factory=lambda: _typed([]))
    run: dict = field(default_factory=dict)

    def present_columns(self) -> list[str]:
        """The columns the file had in at least one line (the required ones always): what a table
        of the metrics shows, so an older file looks as it did."""
        return [c for c in STEP_COLUMNS if c in METRICS_REQUIRED or self.steps[c].notna().any()]


def _typed(records: list[dict]) -> pd.DataFrame:
    columns = {}
    for name, (_, _, dtype) in METRICS_FIELDS.items():
        values = [record.get(name) for record in records]
        if dtype == "object":
            columns[name] = pd.Series(values, dtype="object")
        elif dtype == "Float64":  # null (loss not read) and NaN (a diverged run) are both NA, as before
            columns[name] = pd.array([pd.NA if v is None else float(v) for v in values], dtype="Float64")
        else:
            columns[name] = pd.Series(values, dtype=dtype if dtype != "Int64" else "object").astype(dtype)
    return pd.DataFrame(columns, columns=STEP_COLUMNS)


def _check_run(run, where: str) -> None:
    if not isinstance(run, dict):
        raise MetricsError(f"{where}: run must be an object")
    for name, (wording, valid) in _RUN_FACTS.items():
        if name in run and not valid(run[name]):
            raise MetricsError(f"{where}: run.{name} must be {wording}")
    for name in _MODEL_FACTS:
        if name in run.get("model", {}) and not _is_count(run["model"][name]):
            raise MetricsError(f"{where}: run.model.{name} must be a non-negative integer")


def _record(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as error:  # ValueError: JSONDecodeError and over-long integers
        raise MetricsError(f"{where}: not JSON ({error})") from None
    if not isinstance(record, dict):
        raise MetricsError(f"{where}: not a JSON object")
    missing = [name for name in METRICS_REQUIRED if name not in record]
    if missing:
        raise MetricsError(f"{where}: no {', '.join(missing)}")
    for name, (wording, valid, _) in METRICS_FIELDS.items():
        if name in record and not valid(record[name]):
            raise MetricsError(f"{where}: {name} must be {wording}")
    if "run" in record:
        _check_run(record["run"], where)
    return record


def read_metrics(path: str | Path | None) -> RunMetrics:
    """The trainer's metrics file, every line checked (see the module docstring); an empty
    RunMetrics without a path. A missing, unreadable or malformed file is a MetricsError naming the
    file, and the line and field where there is one."""
    if path is None:
        return RunMetrics()
    records, run = [], None
    try:
        with io.TextIOWrapper(open_regular(path), encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                record = _record(line, f"{path}, line {number}")
                records.append(record)
                if run is None and "run" in record and record["step"] == 0:
                    run = record["run"]
    except InputError as error:
        raise MetricsError(f"{path}: cannot read the metrics ({error.reason})") from None
    except (OSError, UnicodeDecodeError) as error:
        raise MetricsError(f"{path}: cannot read the metrics ({getattr(error, 'strerror', None) or error})") from None
    return RunMetrics(steps=_typed(records), run=dict(run or {}))
