"""The cross-rank report: ranks.html, and the tables and findings behind it on disk (ranks/NAME.csv and
ranks/ranks.json, the machine-readable output: see docs/RANKS.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from sftprof import __version__
from sftprof.analysis.findings import gain_text
from sftprof.analysis.ranks import STRAGGLER_MIN_PCT, STRAGGLER_STEPS_SHARE, CrossRank
from sftprof.io import atomic_dir, atomic_write_text
from sftprof.report import pages
from sftprof.report.html import _table_html
from sftprof.text import write_csv

SUMMARY_FILE = "ranks.json"


def save(result: CrossRank, out_dir: str | Path) -> Path:
    """OUT_DIR/NAME.csv per table and OUT_DIR/ranks.json (ranks, headline, findings), all or nothing."""
    with atomic_dir(out_dir) as tmp:
        for name, table in result.tables.items():
            write_csv(table, tmp / f"{name}.csv")
        summary = {
            "ranks": result.ranks,
            "headline": result.headline,
            "findings": [f.to_dict() for f in result.findings],
            "tables": sorted(result.tables),
        }
        (tmp / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return Path(out_dir)


def render_html(result: CrossRank, title: str, rank_links: dict[int, str] | None = None) -> str:
    """The page: ranked findings first, then the ranks, the per-step skew, each rank's phases and the
    collectives. `rank_links`: rank -> address of its section in the per-rank report."""
    links = rank_links or {}
    t = result.tables
    context = {
        "title": title,
        "version": __version__,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "ranks": [{**r, "link": links.get(r["rank"])} for r in result.ranks],
        "ranked": [
            {
                "rule": f.rule,
                "severity": f.severity,
                "title": f.title,
                "gain": gain_text(f.gain_pct),
                "basis": f.gain_basis,
            }
            for f in result.findings
        ],
        "findings": result.findings,
        "headline": result.headline,
        "headline_json": json.dumps(result.headline, indent=1, default=str),
        "straggler_min_pct": STRAGGLER_MIN_PCT,
        "straggler_steps_pct": 100 * STRAGGLER_STEPS_SHARE,
        "sections": {
            "step_skew": _table_html(t["step_skew"], limit=500),
            "rank_phases": _table_html(t["rank_phases"], limit=1000),
            "rank_steps": _table_html(t["rank_steps"], limit=400),
            "rank_collectives": _table_html(t["rank_collectives"], limit=400),
        },
    }
    return pages.render("ranks.html.j2", **context)


def write_html(result: CrossRank, out_path: str | Path, title: str, rank_links: dict[int, str] | None = None) -> Path:
    atomic_write_text(out_path, render_html(result, title, rank_links))
    return Path(out_path)
