"""Logging for rule scripts and the CLI: to the rule's log file and to stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from sftprof.text import terminal_safe

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _TerminalSafeFormatter(logging.Formatter):
    """Messages quote names from traces (findings, kernels, threads) and paths: their control
    characters are written as escapes; the lines of a multi-line message stay lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return terminal_safe(super().formatMessage(record), multiline=True)


def setup(log_path: str | Path | None = None, level: int = logging.INFO) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    for handler in handlers:
        handler.setFormatter(_TerminalSafeFormatter(FORMAT))
    logging.basicConfig(level=level, handlers=handlers, force=True)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    # paramiko logs every dropped connection as an ERROR with a traceback; sftprof.capture.transfer
    # reports the drop and its retry itself, in one line.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)


def one_line_errors(function, *args, **kwargs):
    """Call a rule script's step: sftprof's own errors end the script with their one-line message (Snakemake
    shows it beside the rule), not a traceback."""
    from sftprof.errors import SftprofError

    try:
        return function(*args, **kwargs)
    except SftprofError as error:
        raise SystemExit(terminal_safe(str(error))) from None
