"""Trace loading: files in, normalized pandas tables out. Nothing past this package knows a file format."""

from sftprof.trace.load import load_trace
from sftprof.trace.tables import TraceTables

__all__ = ["TraceTables", "load_trace"]
