"""The report: renders each profiled rank's Analysis (and the trainer's metrics) into one
self-contained HTML file."""

from sftprof.report.html import RankReport, render_html, write_html

__all__ = ["RankReport", "render_html", "write_html"]
