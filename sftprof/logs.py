"""Logging for rule scripts and the CLI: to the rule's log file and to stderr."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup(log_path: str | Path | None = None, level: int = logging.INFO) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="w"))
    logging.basicConfig(level=level, format=FORMAT, handlers=handlers, force=True)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    # paramiko logs every dropped connection as an ERROR with a traceback; sftprof.transfer
    # reports the drop and its retry itself, in one line.
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
