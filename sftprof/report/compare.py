"""The comparison written: comparison.csv (every row), findings.csv, compare.html and the terminal summary
(analysis/compare.py computes it)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from sftprof import __version__
from sftprof.analysis.compare import (
    BREAKDOWNS,
    DELTA,
    DELTA_PCT,
    GAIN,
    GAIN_UNIT,
    GAINS,
    HEADLINE,
    TOP_CHANGES,
    Comparison,
    largest_changes,
)
from sftprof.analysis.findings import gain_text
from sftprof.io import atomic_dir
from sftprof.report import pages
from sftprof.text import terminal_safe, write_csv

COMPARISON_CSV, FINDINGS_CSV, HTML_FILE = "comparison.csv", "findings.csv", "compare.html"
OUTPUT = (COMPARISON_CSV, FINDINGS_CSV, HTML_FILE)
SECTION_ROWS = 15  # rows per section in the HTML; the CSV keeps every row


def _number(value, signed: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    sign = "+" if signed else ""
    if float(value).is_integer():
        return f"{value:{sign},.0f}"
    decimals = 1 if abs(value) >= 100 else 2 if abs(value) >= 1 else 3
    return f"{value:{sign},.{decimals}f}"


def _delta_text(row, label: str) -> str:
    delta, pct = row[DELTA + label], row[DELTA_PCT + label]
    if isinstance(delta, float) and math.isnan(delta):
        return "–"
    text = _number(delta, signed=True)
    return text if isinstance(pct, float) and math.isnan(pct) else f"{text} ({pct:+.0f}%)"


def _item_label(row) -> str:
    unit = f" ({row['unit']})" if row["unit"] else ""
    return f"{row['section']}: {row['item']}{unit}" if row["section"] != HEADLINE else f"{row['item']}{unit}"


def summary_text(comparison: Comparison) -> str:
    """What the terminal shows: the headline side by side, the largest changes, findings that differ."""
    labels, baseline = comparison.labels, comparison.labels[0]
    lines = [f"baseline {baseline}: {comparison.paths[baseline]}"]
    lines += [f"compared {label}: {comparison.paths[label]}" for label in labels[1:]]
    headline = comparison.table[comparison.table["section"] == HEADLINE]
    grid = [["", *labels, *(f"Δ {label}" for label in labels[1:])]]
    grid += [
        [
            _item_label(row),
            *(_number(row[label]) for label in labels),
            *(_delta_text(row, label) for label in labels[1:]),
        ]
        for _, row in headline.iterrows()
    ]
    widths = [max(len(line[column]) for line in grid) for column in range(len(grid[0]))]
    lines.append("")
    lines += [
        "  ".join([line[0].ljust(widths[0]), *(cell.rjust(w) for cell, w in zip(line[1:], widths[1:]))])
        for line in grid
    ]
    gains = comparison.table[comparison.table["section"] == GAINS].head(TOP_CHANGES)
    if len(gains):
        lines += ["", f"attainable gains ({GAIN_UNIT}, from each analysis):"]
        for _, row in gains.iterrows():
            values = " | ".join(_number(row[label]) for label in labels)
            deltas = ", ".join(_delta_text(row, label) for label in labels[1:])
            lines.append(f"  {row['item']}: {values}  [{deltas}]")
    changes = largest_changes(comparison)
    if len(changes):
        lines += ["", "largest changes against the baseline:"]
        for _, row in changes.iterrows():
            values = " -> ".join(_number(row[label]) for label in labels)
            deltas = ", ".join(_delta_text(row, label) for label in labels[1:])
            lines.append(f"  {_item_label(row)}: {values}  [{deltas}]")
    differing = comparison.findings[comparison.findings["fired_in"] != "all"]
    if len(differing):
        lines += ["", "findings not in every input:"]
        lines += [f"  {row.rule}: only in {row.fired_in}" for row in differing.itertuples()]
    return "\n".join(map(terminal_safe, lines))  # names and paths come from traces and users


def _gain_cell(gain: float) -> str:
    return "" if math.isnan(gain) else gain_text(gain)


def _direction(delta: float) -> str:
    return "" if math.isnan(delta) or delta == 0 else ("up" if delta > 0 else "down")


def _html_rows(frame: pd.DataFrame, labels: list[str], highlighted: set[int]) -> list[dict]:
    rows = []
    for index, row in frame.iterrows():
        deltas = [
            {"text": _delta_text(row, label), "direction": _direction(row[DELTA + label])} for label in labels[1:]
        ]
        rows.append(
            {
                "item": str(row["item"]),
                "unit": row["unit"],
                "values": [_number(row[label]) for label in labels],
                "deltas": deltas,
                "highlight": index in highlighted,
            }
        )
    return rows


def render_html(comparison: Comparison, title: str) -> str:
    labels, table = comparison.labels, comparison.table
    changes = largest_changes(comparison)
    sections = []
    titles = [
        (HEADLINE, "Headline numbers"),
        (
            GAINS,
            f"Attainable gain by finding ({GAIN_UNIT}: the most fixing it could save, as each analysis "
            "bounds it; gains overlap and do not add up)",
        ),
        *((b.name, b.title) for b in BREAKDOWNS),
    ]
    for name, section_title in titles:
        rows = table[table["section"] == name]
        if rows.empty:
            continue
        shown = rows if name in (HEADLINE, GAINS) else rows.head(SECTION_ROWS)
        sections.append(
            {
                "name": name,
                "title": section_title,
                "total_rows": len(rows),
                "rows": _html_rows(shown, labels, set(changes.index)),
            }
        )
    findings = [
        {
            "rule": row["rule"],
            "severity": row["severity"],
            "fired_in": row["fired_in"],
            "titles": [row[label] for label in labels],
            "gains": [_gain_cell(row[GAIN + label]) for label in labels],
        }
        for _, row in comparison.findings.iterrows()
    ]
    inputs = [
        {
            "label": label,
            "path": comparison.paths[label],
            "span_s": _number(a.span_ns / 1e9),
            "sources": ", ".join(a.sources) or "nothing",
        }
        for label, a in comparison.analyses.items()
    ]
    return pages.render(
        "compare.html.j2",
        title=title,
        version=__version__,
        labels=labels,
        inputs=inputs,
        per_step=comparison.per_step,
        sections=sections,
        findings=findings,
        top_changes=len(changes),
        changes=_html_rows(
            changes.assign(item=[_item_label(r) for _, r in changes.iterrows()], unit=""), labels, set()
        ),
    )


def write(comparison: Comparison, out_dir: str | Path, title: str = "sftprof comparison") -> dict[str, Path]:
    """comparison.csv (every row), findings.csv and the self-contained compare.html, as one folder
    that appears whole (see atomic_dir)."""
    names = {"table": COMPARISON_CSV, "findings": FINDINGS_CSV, "html": HTML_FILE}
    with atomic_dir(out_dir, owned=names.values()) as tmp:
        write_csv(comparison.table, tmp / COMPARISON_CSV)
        write_csv(comparison.findings, tmp / FINDINGS_CSV)
        (tmp / HTML_FILE).write_text(render_html(comparison, title), encoding="utf-8")
    return {what: Path(out_dir) / name for what, name in names.items()}
