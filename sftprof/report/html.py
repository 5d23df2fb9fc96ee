"""HTML rendering with Jinja2 (StrictUndefined: a missing value is a bug, not a blank)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd

from sftprof import __version__
from sftprof.analysis import Analysis
from sftprof.analysis.findings import CAPTURE_NOTES, Finding, gain_text
from sftprof.analysis.memory import MEGABYTE
from sftprof.analysis.registry import SAVED_TABLES
from sftprof.analysis.sched import CPU_SCHED_SWITCH
from sftprof.analysis.utilisation import IDLE_GAP_NS, LOW_UTILISATION_PCT
from sftprof.io import atomic_write_text
from sftprof.report import pages, plots
from sftprof.trace.metrics import read_metrics

# Nanosecond columns are shown in µs or ms: every `*_ns` column and `duration`; timestamps
# (`start`, `end`, `gap_start`) always in ms since the capture began. Byte counts in MB, as nsys prints them.
_TIMESTAMP_COLUMNS = ("start", "end", "gap_start")


def _is_duration(column: str) -> bool:
    return column.endswith("_ns") or column == "duration"


def _is_bytes(column: str) -> bool:
    return column.endswith("_bytes") or column == "bytes"


def _time_unit(values: pd.Series) -> tuple[str, float]:
    """Microseconds for short things (kernels, API calls), milliseconds for long ones (steps)."""
    return ("µs", 1e3) if values.abs().median() < 1e6 else ("ms", 1e6)


def _table_html(frame: pd.DataFrame, drop: tuple[str, ...] = (), limit: int = 25) -> str:
    if frame is None or frame.empty:
        return ""
    shown = frame.drop(columns=[c for c in drop if c in frame.columns]).head(limit).copy()
    renamed = {}
    for column in shown.columns:
        numeric = pd.api.types.is_numeric_dtype(shown[column])
        if numeric and _is_duration(column):
            unit, scale = _time_unit(shown[column])
            shown[column] = shown[column] / scale
            renamed[column] = f"{column.removesuffix('_ns')} ({unit})"
        elif numeric and column in _TIMESTAMP_COLUMNS:
            shown[column] = shown[column] / 1e6
            renamed[column] = f"{column} (ms)"
        elif numeric and _is_bytes(column):
            shown[column] = shown[column].map(lambda v: f"{v / MEGABYTE:,.3f}")
            renamed[column] = f"{column.removesuffix('_bytes')} (MB)"
        elif not numeric:
            shown[column] = shown[column].map(lambda v: "" if v is None or v is pd.NA or v != v else v)
    shown = shown.rename(columns=renamed)
    return shown.to_html(index=False, classes="data", border=0, na_rep="", float_format=lambda v: f"{v:,.1f}")


@dataclass
class RankReport:
    """One profiled rank's part of a report: `label` names it ("" when it is the only one)."""

    label: str
    analysis: Analysis
    metrics_path: str | Path | None = None


def _absent(sources: list[str]) -> dict[str, str]:
    """Why a section is empty, and which nsys switch fills it."""
    cuda = (
        "CUDA was traced, but no GPU work ran in the capture window."
        if "cuda" in sources
        else "No CUDA calls were recorded: the run used no GPU, or CUDA was not traced (profile.trace needs cuda, "
        "its default; nsys --trace=cuda,...)."
    )
    return {
        "cuda": cuda,
        "nvtx": "No NVTX ranges: trace nvtx (--trace=...,nvtx) and annotate the steps (sftprof's trainer does).",
        "osrt": "OS-runtime calls were not traced: add osrt to profile.trace (--trace=...,osrt).",
        "sched": f"CPU scheduling was not traced: add {CPU_SCHED_SWITCH} to nsys profile (profile.cpuctxsw).",
        "threads": "No application threads found in the capture.",
    }


def _tables(t: dict) -> dict:
    """Tables by name; an analysis saved by an older sftprof may lack some (they render as absent)."""
    return {name: t.get(name, pd.DataFrame()) for name in SAVED_TABLES}


def _active_threads(threads: pd.DataFrame) -> pd.DataFrame:
    """The threads worth a row in the report: the training threads and those that left any event
    (the CSV keeps every thread, idle pool workers included)."""
    if threads.empty or "role" not in threads:
        return threads
    counts = [c for c in ("osrt_calls", "cuda_api_calls", "nvtx_ranges") if c in threads]
    active = threads[counts].fillna(0).sum(axis=1) > 0
    return threads[active | threads["role"].fillna("").astype(bool)]


def _ranked(findings: list[Finding]) -> list[dict]:
    """The first screen's table: findings with an attainable gain, largest first (the analysis ranked
    them), and warnings without one."""
    return [
        {"rule": f.rule, "severity": f.severity, "title": f.title, "gain": gain_text(f.gain_pct), "basis": f.gain_basis}
        for f in findings
        if f.rule not in CAPTURE_NOTES and (f.gain_pct is not None or f.severity == "warning")
    ]


def _rank_context(part: RankReport, anchor: str) -> dict:
    t = _tables(part.analysis.tables)
    run_metrics = read_metrics(part.metrics_path)
    metrics = run_metrics.steps[run_metrics.present_columns()]
    window_metrics = metrics[metrics["in_window"]] if not metrics.empty else metrics
    findings = {f.rule: f for f in part.analysis.findings}
    return {
        "label": part.label,
        "anchor": anchor,
        "analysis": part.analysis,
        "ranked": _ranked(part.analysis.findings),
        "top": next((f for f in part.analysis.findings if f.rule not in CAPTURE_NOTES and f.gain_pct), None),
        "steps_found_by": part.analysis.headline.get("steps_found_by"),
        "overhead_pct": part.analysis.headline.get("profiling_overhead_pct"),  # None: older analyses too
        "notes": [f for f in part.analysis.findings if f.rule in CAPTURE_NOTES],
        "findings": [f for f in part.analysis.findings if f.rule not in CAPTURE_NOTES],
        "verdict": findings.get("bound_verdict"),
        "absent": _absent(part.analysis.sources),
        "idle_gap_ms": IDLE_GAP_NS / 1e6,
        "headline_json": json.dumps(part.analysis.headline, indent=1),
        "sections": {
            "kernels": _table_html(t["kernels"]),
            "kernel_families": _table_html(t["kernel_families"]),
            "gemm_precision": _table_html(t["gemm_precision"]),
            "memops": _table_html(t["memops"]),
            "memops_by_size": _table_html(t["memops_by_size"]),
            "memop_kinds": _table_html(t["memop_kinds"]),
            "host_memory": _table_html(t["host_memory"]),
            "bound_evidence": _table_html(t["bound_evidence"]),
            "gpu_busy": _table_html(t["gpu_busy"]),
            "step_gpu": _table_html(t["step_gpu"]),
            "gpu_gaps": _table_html(t["gpu_gaps"], limit=10),
            "gap_causes": _table_html(t["gap_causes"], drop=("device_id", "gap_start", "gap_ns"), limit=60),
            "cuda_api": _table_html(t["cuda_api"]),
            "launch_overhead": _table_html(t["launch_overhead"]),
            "sync_calls": _table_html(t["sync_calls"]),
            "sync_activity": _table_html(t["sync_activity"]),
            "steps": _table_html(t["steps"], drop=("start", "end")),
            "threads": _table_html(_active_threads(t["threads"]), drop=("global_tid",)),
            "thread_osrt": _table_html(t["thread_osrt"], drop=("tid",), limit=30),
            "osrt": _table_html(t["osrt"]),
            "cpu_cores": _table_html(t["cpu_cores"], limit=256),
            "nvtx": _table_html(t["nvtx"]),
            "nvtx_gpu": _table_html(t["nvtx_gpu"]),
            "metrics": _table_html(metrics, limit=1000),
        },
        "plots": {
            "kernel_share": plots.share_bars(t["kernels"], "kernel", "Kernel time share"),
            "kernel_families": plots.family_bars(t["kernel_families"]),
            "memop_share": plots.share_bars(t["memops"], "operation", "Memory-operation time share"),
            "memop_breakdown": plots.memop_breakdown(t["memop_kinds"]),
            "gpu_timeline": plots.utilisation_timeline(t["gpu_timeline"], LOW_UTILISATION_PCT),
            "step_phases": plots.step_phases(t["steps"]),
            "timeline": plots.phase_timeline(t["phases"], t["steps"]),
            "thread_states": plots.thread_states(t["thread_states"]),
            "osrt_share": plots.share_bars(t["osrt"], "name", "OS-runtime call time share"),
            "cpu_cores": plots.core_timeline(t["cpu_timeline"]),
            "training_curve": plots.training_curve(metrics),
        },
        "window_tokens_per_s": float(window_metrics["tokens_per_s"].median()) if len(window_metrics) else None,
        "run_tokens_per_s": float(metrics["tokens_per_s"].median()) if len(metrics) else None,
    }


def render_html(parts: list[RankReport], title: str) -> str:
    context = {
        "title": title,
        "version": __version__,
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "ranks": [_rank_context(part, f"r{index}-" if len(parts) > 1 else "") for index, part in enumerate(parts)],
    }
    return pages.render("report.html.j2", **context)


def write_html(parts: list[RankReport], out_path: str | Path, title: str) -> Path:
    atomic_write_text(out_path, render_html(parts, title))
    return Path(out_path)
