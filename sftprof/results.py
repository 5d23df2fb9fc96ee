"""Analysis results on disk: one CSV per table plus analysis.json (findings and headline).

This is the hand-off between the analysis and report steps, and the machine-readable
output users script against.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from sftprof.analysis import Analysis
from sftprof.analysis.findings import Finding
from sftprof.io import atomic_dir

SUMMARY_FILE = "analysis.json"


def save(analysis: Analysis, out_dir: str | Path) -> Path:
    """Write into a temporary sibling folder, then swap it in: no half-written result folder."""
    with atomic_dir(out_dir) as tmp:
        for name, table in analysis.tables.items():
            table.to_csv(tmp / f"{name}.csv", index=False)
        summary = {"source_path": analysis.source_path, "span_ns": analysis.span_ns, "sources": analysis.sources,
                   "headline": analysis.headline, "findings": [f.to_dict() for f in analysis.findings],
                   "tables": sorted(analysis.tables)}
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return Path(out_dir)


def load(out_dir: str | Path) -> Analysis:
    out_dir = Path(out_dir)
    summary = json.loads((out_dir / SUMMARY_FILE).read_text())
    tables = {}
    for name in summary["tables"]:
        try:
            tables[name] = pd.read_csv(out_dir / f"{name}.csv")
        except pd.errors.EmptyDataError:
            tables[name] = pd.DataFrame()
    return Analysis(source_path=summary["source_path"], span_ns=summary["span_ns"], sources=summary["sources"],
                    tables=tables, findings=[Finding(**f) for f in summary["findings"]],
                    headline=summary["headline"])
