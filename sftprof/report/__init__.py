"""The report: renders an Analysis (and the trainer's metrics) into one self-contained HTML file."""

from sftprof.report.html import render_html, write_html

__all__ = ["render_html", "write_html"]
