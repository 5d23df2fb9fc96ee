"""Analysis results on disk: one CSV per table plus analysis.json (findings and headline).

This is the hand-off between the analysis and report steps, and the machine-readable
output users script against.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import MISSING, fields
from pathlib import Path

import pandas as pd

from sftprof.analysis import Analysis
from sftprof.analysis.findings import Finding
from sftprof.errors import SftprofError
from sftprof.io import atomic_dir, open_regular, read_limited
from sftprof.text import read_csv, write_csv

SUMMARY_FILE = "analysis.json"
# analysis.json holds findings and a headline: kilobytes. This bounds what a link to /dev/zero reads.
MAX_SUMMARY_BYTES = 64 * 2**20
# No time (ns), count or share a capture gives is beyond 2^62 (146 years in ns): a larger one is a misread or
# hand-edited value, which a comparison would print as a 300-digit number.
MAX_VALUE = float(2**62)
TABLE_NAME = re.compile(r"\w+")  # a table is NAME.csv in the folder itself: no path in its name


class ResultsError(SftprofError, ValueError):
    """An analysis folder that cannot be read back: damaged, hand-edited or not sftprof's."""


def save(analysis: Analysis, out_dir: str | Path) -> Path:
    """Write into a temporary sibling folder, then swap it in: no half-written result folder."""
    with atomic_dir(out_dir) as tmp:
        for name, table in analysis.tables.items():
            write_csv(table, tmp / f"{name}.csv")
        summary = {
            "source_path": analysis.source_path,
            "span_ns": analysis.span_ns,
            "sources": analysis.sources,
            "headline": analysis.headline,
            "findings": [f.to_dict() for f in analysis.findings],
            "tables": sorted(analysis.tables),
        }
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return Path(out_dir)


def is_number(value) -> bool:
    """A JSON number that arithmetic can use: not a bool, and within a float's range (NaN is a
    blank, as pandas reads it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return not math.isinf(float(value))
    except OverflowError:
        return False


def _is_finding(value) -> bool:
    """What `Finding(**value)` accepts, with the texts that reports and comparisons show and a gain
    that ranks and subtracts: a share from 0 to 100, or null (no estimate), and few_steps a boolean. Findings
    saved before gains (or few_steps) existed have none, and load with the default."""
    if not isinstance(value, dict) or not set(value) <= {f.name for f in fields(Finding)}:
        return False
    texts = [
        f.name
        for f in fields(Finding)
        if f.name not in ("gain_pct", "few_steps") and (f.default is MISSING or f.name in value)
    ]
    gain = value.get("gain_pct")
    return (
        all(isinstance(value.get(name), str) for name in texts)
        and (gain is None or is_number(gain) and 0 <= gain <= 100)
        and isinstance(value.get("few_steps", False), bool)
    )


# What analysis.json must hold, each key with what it must be and a test of it, so that a damaged
# or hand-edited file is refused by name here rather than failing deep inside a comparison or report.
_SUMMARY_KEYS = {
    "source_path": ("a string", lambda v: isinstance(v, str)),
    "span_ns": ("a number from 0 to 2^62", lambda v: is_number(v) and 0 <= v <= MAX_VALUE),
    "sources": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(s, str) for s in v)),
    "headline": (
        "an object whose numbers are at most 2^62 either way",
        lambda v: isinstance(v, dict)
        and all(
            is_number(x) and not abs(x) > MAX_VALUE
            for x in v.values()
            if isinstance(x, (int, float)) and not isinstance(x, bool)
        ),
    ),
    "findings": (
        "a list of findings (objects with the strings rule, severity, title, evidence, a gain_pct "
        "from 0 to 100 or null, and a boolean few_steps if any)",
        lambda v: isinstance(v, list) and all(map(_is_finding, v)),
    ),
    "tables": (
        "a list of table names (letters, digits, _)",
        lambda v: isinstance(v, list) and all(isinstance(name, str) and TABLE_NAME.fullmatch(name) for name in v),
    ),
}


def load(out_dir: str | Path) -> Analysis:
    """What `save` wrote; a damaged or hand-edited folder is refused naming its file (and key)."""
    out_dir = Path(out_dir)
    path = out_dir / SUMMARY_FILE
    try:
        summary = json.loads(read_limited(path, MAX_SUMMARY_BYTES).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as error:
        raise ResultsError(f"{path}: cannot read it ({type(error).__name__}: {error})") from None
    if not isinstance(summary, dict):
        raise ResultsError(f"{path}: not a JSON object")
    for key, (wording, valid) in _SUMMARY_KEYS.items():
        if not valid(summary.get(key)):
            raise ResultsError(f"{path}: {key} must be {wording}")
    tables = {}
    for name in summary["tables"]:
        csv = out_dir / f"{name}.csv"
        try:
            with open_regular(csv) as handle:
                tables[name] = read_csv(handle)
        except pd.errors.EmptyDataError:
            tables[name] = pd.DataFrame()
        except (OSError, ValueError) as error:  # pandas' ParserError and UnicodeDecodeError are ValueErrors
            raise ResultsError(f"{csv}: cannot read it ({type(error).__name__}: {error})") from None
    return Analysis(
        source_path=summary["source_path"],
        span_ns=summary["span_ns"],
        sources=summary["sources"],
        tables=tables,
        findings=[Finding(**f) for f in summary["findings"]],
        headline=summary["headline"],
    )


def _natural_key(path: Path) -> list:
    """rank2 before rank10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def analysis_dirs(folder: Path) -> list[Path]:
    """The analysis folders a folder stands for: itself, FOLDER/analysis (`sftprof analyze -o FOLDER`),
    or the rank folders below either (the workflow's results/EXP/WINDOW/analysis/rankN)."""
    for candidate in (folder, folder / "analysis"):
        if (candidate / SUMMARY_FILE).is_file():
            return [candidate]
        ranks = [summary.parent for summary in candidate.glob(f"*/{SUMMARY_FILE}")]
        if ranks:
            return sorted(ranks, key=_natural_key)
    return []
