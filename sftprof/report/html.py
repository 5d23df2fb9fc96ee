"""HTML rendering with Jinja2 (StrictUndefined: a missing value is a bug, not a blank)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import pandas as pd

from sftprof import __version__
from sftprof.analysis import Analysis
from sftprof.io import atomic_write_text
from sftprof.report import plots

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("sftprof.report", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=jinja2.select_autoescape(["html", "j2"]),
)

# Columns shown in the report (CSV files keep all of them); nanoseconds shown as milliseconds.
_NS_COLUMNS = ("total_ns", "avg_ns", "med_ns", "min_ns", "max_ns", "stddev_ns", "duration", "data_ns",
               "forward_ns", "backward_ns", "optimizer_ns", "other_ns", "osrt_ns", "top_osrt_ns",
               "cuda_api_ns", "span_ns", "busy_ns")


def _time_unit(values: pd.Series) -> tuple[str, float]:
    """Microseconds for short things (kernels, API calls), milliseconds for long ones (steps)."""
    return ("µs", 1e3) if values.abs().max() < 1e6 else ("ms", 1e6)


def _table_html(frame: pd.DataFrame, drop: tuple[str, ...] = (), limit: int = 25) -> str:
    if frame is None or frame.empty:
        return ""
    shown = frame.drop(columns=[c for c in drop if c in frame.columns]).head(limit).copy()
    renamed = {}
    for column in shown.columns:
        if column in _NS_COLUMNS:
            unit, scale = _time_unit(shown[column])
            shown[column] = shown[column] / scale
            renamed[column] = f"{column.removesuffix('_ns')} ({unit})"
    shown = shown.rename(columns=renamed)
    return shown.to_html(index=False, classes="data", border=0, na_rep="", float_format=lambda v: f"{v:,.1f}")


def read_metrics(path: str | Path | None) -> pd.DataFrame:
    if path is None or not Path(path).exists():
        return pd.DataFrame(columns=["step", "loss", "step_time_s", "tokens", "tokens_per_s", "in_window"])
    return pd.read_json(path, lines=True)


@dataclass
class RankReport:
    """One profiled rank's part of a report: `label` names it ("" when it is the only one)."""

    label: str
    analysis: Analysis
    metrics_path: str | Path | None = None


def _rank_context(part: RankReport, anchor: str) -> dict:
    t = part.analysis.tables
    metrics = read_metrics(part.metrics_path)
    window_metrics = metrics[metrics["in_window"]] if not metrics.empty else metrics
    return {
        "label": part.label,
        "anchor": anchor,
        "analysis": part.analysis,
        "headline_json": json.dumps(part.analysis.headline, indent=1),
        "sections": {
            "kernels": _table_html(t["kernels"]),
            "memops": _table_html(t["memops"]),
            "gpu_busy": _table_html(t["gpu_busy"]),
            "cuda_api": _table_html(t["cuda_api"]),
            "steps": _table_html(t["steps"], drop=("start", "end")),
            "threads": _table_html(t["threads"], drop=("global_tid",)),
            "osrt": _table_html(t["osrt"]),
            "nvtx": _table_html(t["nvtx"]),
            "metrics": _table_html(metrics, limit=1000),
        },
        "plots": {
            "kernel_share": plots.share_bars(t["kernels"], "kernel", "Kernel time share"),
            "memop_share": plots.share_bars(t["memops"], "operation", "Memory-operation time share"),
            "step_phases": plots.step_phases(t["steps"]),
            "timeline": plots.phase_timeline(t["phases"], t["steps"]),
            "osrt_share": plots.share_bars(t["osrt"], "name", "OS-runtime call time share"),
            "training_curve": plots.training_curve(metrics),
        },
        "window_tokens_per_s": float(window_metrics["tokens_per_s"].median()) if len(window_metrics) else None,
        "run_tokens_per_s": float(metrics["tokens_per_s"].median()) if len(metrics) else None,
    }


def render_html(parts: list[RankReport], title: str) -> str:
    context = {
        "title": title,
        "version": __version__,
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "ranks": [_rank_context(part, f"r{index}-" if len(parts) > 1 else "") for index, part in enumerate(parts)],
    }
    return _ENV.get_template("report.html.j2").render(**context)


def write_html(parts: list[RankReport], out_path: str | Path, title: str) -> Path:
    atomic_write_text(out_path, render_html(parts, title))
    return Path(out_path)
