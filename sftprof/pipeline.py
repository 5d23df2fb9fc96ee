"""The one place that chains the reading side: load a trace -> analyze -> save the results -> render.

The CLI (`sftprof analyze`), the workflow's analyze and report rules and `compare` all call these,
so each runs the same steps in the same order and releases the same resources.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sftprof import results
from sftprof.analysis import Analysis, analyze
from sftprof.capture import rank
from sftprof.io import atomic_dir
from sftprof.report import RankReport, write_html
from sftprof.trace import load_trace
from sftprof.trace.metrics import read_metrics

ANALYSIS_DIR, REPORT_HTML = "analysis", "report.html"  # what `sftprof analyze` writes into its output folder
log = logging.getLogger(__name__)


def analyze_trace(trace: str | Path, metrics: str | Path | None = None,
                  progress: Callable[[str], None] = lambda step: None) -> Analysis:
    """Load one trace (nsys .sqlite/.nsys-rep, Kineto JSON) and analyze it with the trainer's metrics."""
    run_metrics = read_metrics(metrics)  # a bad metrics file is refused before any work
    tables = load_trace(trace)
    try:
        return analyze(tables, progress=progress, metrics=run_metrics)
    finally:
        tables.events.close()  # its temporary database: as large as the trace's kernels and calls


def analyze_into(trace: str | Path, out_dir: str | Path, metrics: str | Path | None, title: str,
                 progress: Callable[[str], None] = lambda step: None) -> Analysis:
    """`sftprof analyze`: OUT_DIR/analysis/ and OUT_DIR/report.html, which appear together or not at all."""
    analysis = analyze_trace(trace, metrics, progress)
    progress("writing tables and HTML")
    with atomic_dir(out_dir, owned=(ANALYSIS_DIR, REPORT_HTML)) as partial:
        results.save(analysis, partial / ANALYSIS_DIR)
        write_html([RankReport("", analysis, metrics)], partial / REPORT_HTML, title)
    return analysis


def _rank_paths(capture_dir: Path, output_name: str, record: dict) -> tuple[Path, str]:
    metrics = capture_dir / rank.METRICS_PATTERN.format(output_name=output_name).format(rank=record["rank"])
    return metrics, rank.RANK_DIR_PATTERN.format(rank=record["rank"])


def analyze_capture(capture_dir: str | Path, sqlite_dir: str | Path, output_name: str, out_dir: str | Path) -> None:
    """The workflow's analyze step: every profiled rank of one capture folder, each into its own folder of
    OUT_DIR, which appears whole or not at all."""
    capture_dir, sqlite_dir = Path(capture_dir), Path(sqlite_dir)
    with atomic_dir(out_dir) as partial:
        for record in rank.profiled_records(capture_dir):
            metrics, folder = _rank_paths(capture_dir, output_name, record)
            analysis = analyze_trace(sqlite_dir / rank.SQLITE_PATTERN.format(rank=record["rank"]),
                                     metrics if metrics.exists() else None,
                                     lambda step: log.info("rank %d: %s", record["rank"], step))
            results.save(analysis, partial / folder)
            for finding in analysis.findings:
                log.info("rank %d [%s] %s", record["rank"], finding.severity, finding.title)


def render_capture(capture_dir: str | Path, analysis_dir: str | Path, output_name: str, html: str | Path,
                   title: str) -> None:
    """The workflow's report step: one HTML report with a section per profiled rank."""
    capture_dir, analysis_dir = Path(capture_dir), Path(analysis_dir)
    parts = []
    for record in rank.profiled_records(capture_dir):
        metrics, folder = _rank_paths(capture_dir, output_name, record)
        parts.append(RankReport(f"Rank {record['rank']} on {record['host']}", results.load(analysis_dir / folder),
                                metrics))
    write_html(parts, html, title)
    log.info("report %s (%d rank(s))", html, len(parts))
