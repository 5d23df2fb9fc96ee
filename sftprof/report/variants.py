"""The verdict on an experiment's variants, written: variants.csv (every number) and variants.html."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from sftprof import __version__
from sftprof.analysis.variants import MIN_STEPS, WARMUP_STEPS
from sftprof.io import atomic_write_text
from sftprof.report import pages
from sftprof.text import write_csv

CSV_FILE, HTML_FILE = "variants.csv", "variants.html"


def _number(value, fmt: str) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def _row(r) -> dict:
    return {
        "variant": r.variant,
        "motivated_by": r.motivated_by,
        "predicted": _number(r.predicted_gain_pct, "{:.1f}%"),
        "measured": _number(r.measured_gain_pct, "{:+.1f}%"),
        "base_ms": _number(r.baseline_median_step_ms, "{:.1f} ms"),
        "ms": _number(r.median_step_ms, "{:.1f} ms")
        + (_number(r.p25_step_ms, " [{:.1f}, ") + _number(r.p75_step_ms, "{:.1f}]") if r.steps_measured else ""),
        "steps": r.steps_measured,
        "base_tps": _number(r.baseline_real_tokens_per_s, "{:,.0f}"),
        "tps": _number(r.real_tokens_per_s, "{:,.0f}"),
        "gone": "" if r.finding_gone is None else "yes" if r.finding_gone else "no",
        "loss": ""
        if r.loss_changed is None
        else _number(r.loss_shift_pct, "{:+.2f}%") + (" (moved)" if r.loss_changed else " (within noise)"),
        "loss_moved": bool(r.loss_changed),
        "verdict": r.verdict,
    }


def write(table: pd.DataFrame, out_dir: str | Path, title: str, baseline: str) -> None:
    """OUT_DIR/variants.csv and OUT_DIR/variants.html (the caller makes OUT_DIR appear whole)."""
    out_dir = Path(out_dir)
    write_csv(table, out_dir / CSV_FILE)
    rows = [_row(r) for r in table.astype(object).where(table.notna(), None).itertuples()]
    atomic_write_text(
        out_dir / HTML_FILE,
        pages.render(
            "variants.html.j2",
            title=title,
            rows=rows,
            baseline=baseline,
            version=__version__,
            warmup=WARMUP_STEPS,
            min_steps=MIN_STEPS,
        ),
    )
