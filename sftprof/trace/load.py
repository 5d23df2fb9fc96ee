"""Pick the loader for a trace by its type: Nsight Systems (.nsys-rep, .sqlite, a .parquetdir folder)
or the PyTorch profiler's Kineto Chrome trace (.json, .json.gz)."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import duckdb

from sftprof import scratch
from sftprof.io import open_regular
from sftprof.trace.events import read_only_uri
from sftprof.trace.kineto import load_kineto_json
from sftprof.trace.nsys_export import ParquetExport, SqliteExport, TraceFormatError, require_file
from sftprof.trace.nsys_sqlite import load_nsys_parquetdir, load_nsys_sqlite
from sftprof.trace.tables import TraceTables

KINETO_SUFFIXES = (".json", ".json.gz")  # tensorboard_trace_handler writes NAME.pt.trace.json[.gz]
PARQUETDIR_SUFFIX = ".parquetdir"  # `nsys export --type=parquetdir` writes NAME.parquetdir/, a folder
NSYS_SUFFIXES = (".nsys-rep", ".sqlite", PARQUETDIR_SUFFIX)  # what an nsys capture can come as
SOURCE_TABLE = "SFTPROF_SOURCE"  # in an export sftprof made of a report: the report's fingerprint


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


FINGERPRINT_BYTES = 1 << 20


def report_fingerprint(report: Path) -> dict:
    """What tells one report from another, also a copy that kept its time (`cp -p`, `rsync -a`): its size, its
    time and a hash of its first and last MiB (a capture's header and its last data differ)."""
    with open_regular(report) as handle:
        info = os.fstat(handle.fileno())
        digest = hashlib.sha256(handle.read(FINGERPRINT_BYTES))
        if info.st_size > FINGERPRINT_BYTES:
            handle.seek(max(FINGERPRINT_BYTES, info.st_size - FINGERPRINT_BYTES))
            digest.update(handle.read(FINGERPRINT_BYTES))
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns, "sha256_ends": digest.hexdigest()}


def export_source(sqlite_path: Path) -> dict | None:
    """The fingerprint of the report an export was made from (export_report's `source`), None if it has none."""
    try:
        with closing(sqlite3.connect(read_only_uri(sqlite_path), uri=True)) as conn:
            row = conn.execute(f"SELECT size, mtime_ns, sha256_ends FROM {SOURCE_TABLE}").fetchone()
    except sqlite3.Error:
        return None
    return dict(zip(("size", "mtime_ns", "sha256_ends"), row)) if row else None


def sqlite_for_report(report: Path) -> tuple[Path, str | None]:
    """The SQLite export of a .nsys-rep: the one beside it where it was made from this very report (its
    fingerprint says so), else a new one beside it, or, where the report's folder cannot be written, in a
    temporary folder (returned second: remove it when done)."""
    from sftprof.capture.nsys import export_report

    sqlite_path = report.with_suffix(".sqlite")
    source = report_fingerprint(report)
    if sqlite_path.is_file() and export_source(sqlite_path) == source:
        return sqlite_path, None
    try:
        return export_report(report, sqlite_path, source=source), None
    except OSError as error:
        if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
    folder = scratch.folder("export")
    try:
        return export_report(report, Path(folder) / sqlite_path.name, source=source), folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def load_trace(path: str | Path) -> TraceTables:
    path = Path(path)
    if path.suffix == PARQUETDIR_SUFFIX:
        return load_nsys_parquetdir(path)  # a folder: checked there
    require_file(path)
    if path.suffix == ".nsys-rep":
        sqlite_path, temporary = sqlite_for_report(path)
        try:
            tables = load_nsys_sqlite(sqlite_path)
        except BaseException:
            if temporary:
                shutil.rmtree(temporary, ignore_errors=True)
            raise
        if temporary:
            tables.events.remove_on_close(temporary)
        return tables
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
