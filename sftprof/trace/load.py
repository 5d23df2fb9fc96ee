"""Pick the loader for a trace by its type: Nsight Systems (.nsys-rep, .sqlite, a .parquetdir folder)
or the PyTorch profiler's Kineto Chrome trace (.json, .json.gz)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb

from sftprof.trace.kineto import load_kineto_json
from sftprof.trace.nsys.nsys_export import ParquetExport, SqliteExport, TraceFormatError, require_file
from sftprof.trace.nsys.nsys_sqlite import load_nsys_parquetdir, load_nsys_sqlite
from sftprof.trace.tables import TraceTables

KINETO_SUFFIXES = (".json", ".json.gz")  # tensorboard_trace_handler writes NAME.pt.trace.json[.gz]
PARQUETDIR_SUFFIX = ".parquetdir"  # `nsys export --type=parquetdir` writes NAME.parquetdir/, a folder
NSYS_SUFFIXES = (".nsys-rep", ".sqlite", PARQUETDIR_SUFFIX)  # what an nsys capture can come as


def trace_stem(path: str | Path) -> str:
    """A trace's file name without its known suffix: `profile.JOB.N.R.HOST.nsys-rep` keeps all its dots, so
    the ranks of one job keep names of their own."""
    name = Path(path).name
    kineto = tuple(f".pt.trace{suffix}" for suffix in KINETO_SUFFIXES)  # tensorboard_trace_handler's names
    for suffix in sorted((*NSYS_SUFFIXES, *KINETO_SUFFIXES, *kineto), key=len, reverse=True):
        if name.endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def from_nsys(path: str | Path) -> bool:
    """Whether a trace came from Nsight Systems (other recorders, e.g. Kineto, cannot trace CPU scheduling)."""
    return Path(path).suffix in NSYS_SUFFIXES


def load_trace(path: str | Path) -> TraceTables:
    path = Path(path)
    if path.suffix == PARQUETDIR_SUFFIX:
        return load_nsys_parquetdir(path)  # a folder: checked there
    require_file(path)
    if path.suffix == ".nsys-rep":
        raise TraceFormatError(
            f"{path}: an nsys report; export it first (nsys export --type=sqlite), as `sftprof analyze` does"
        )
    if path.suffix == ".sqlite":
        return load_nsys_sqlite(path)
    if path.name.endswith(KINETO_SUFFIXES):
        return load_kineto_json(path)
    if path.suffix == ".qdstrm":
        raise TraceFormatError(
            f"{path}: a raw nsys capture; import it first (QdstrmImporter -i NAME.qdstrm -o NAME.nsys-rep)"
        )
    raise TraceFormatError(
        f"{path}: unsupported trace type {path.suffix!r}; give an nsys .nsys-rep, .sqlite or .parquetdir "
        "folder, or a PyTorch profiler trace .json or .json.gz"
    )


def clock_origin(path: str | Path) -> int | None:
    """The capture's time 0 on its host's clock (nsys's TARGET_INFO_SESSION_START_TIME.utcEpochNs), where an
    nsys export (or the SQLite export beside a .nsys-rep) has it; None otherwise. The cross-rank analysis
    lines start times up only for captures made on one host."""
    path = Path(path)
    if path.suffix == ".nsys-rep":
        path = path.with_suffix(".sqlite")
    try:
        export = ParquetExport(path) if path.suffix == PARQUETDIR_SUFFIX else SqliteExport(path)
    except (TraceFormatError, OSError):
        return None
    try:
        if "TARGET_INFO_SESSION_START_TIME" not in export.tables:
            return None
        rows = export.fetch("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1")
    except (sqlite3.Error, duckdb.Error):
        return None
    finally:
        export.close()
    return int(rows[0][0]) if rows and isinstance(rows[0][0], int) else None
