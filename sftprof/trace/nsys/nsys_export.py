"""An nsys export in either format nsys writes, as the loader (nsys_sqlite) reads it: the SQLite file
(`nsys export --type=sqlite`) or the folder of Parquet files (`--type=parquetdir`, nsys 2024 and
later: one TABLE.parquet per SQLite table, same table and column names).

The loader's SQL is written once, in what SQLite and DuckDB both run; an Export runs it on either
format. `query` and `fetch` read the small tables (through sqlite3 for an SQLite file: each value keeps
its own type, which the rules for damaged rows rely on), `reader` is a DuckDB connection naming the
export's tables (for the tables that grow with the capture; store.copy_export copies kernels and CUDA
API calls). A Parquet table is a view that gives its integer columns as BIGINT, SQLite's INTEGER, so
the same SQL returns the same values and pandas types from both formats.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing
from functools import cached_property
from pathlib import Path

import duckdb
import pandas as pd

from sftprof import scratch
from sftprof.errors import SftprofError
from sftprof.io import open_regular
from sftprof.trace.events import EventStoreError, bound, sql_text

# The columns of CUPTI_ACTIVITY_KIND_KERNEL that the copy (store._from_nsys) reads, in the order kernel_rows takes them.
EXPORT_KERNEL_COLUMNS = (
    "start",
    "end",
    "demangledName",
    "shortName",
    "mangledName",
    "deviceId",
    "streamId",
    "globalPid",
    "correlationId",
    "gridX",
    "gridY",
    "gridZ",
    "blockX",
    "blockY",
    "blockZ",
)
# The columns of CUPTI_ACTIVITY_KIND_RUNTIME that the copy reads.
EXPORT_RUNTIME_COLUMNS = ("start", "end", "nameId", "globalTid", "correlationId")
# The columns of GPU_METRICS that the copy reads (nsys 2023+: 2022.4 keeps metrics in GENERIC_EVENTS, not read).
EXPORT_METRIC_COLUMNS = ("timestamp", "typeId", "metricId", "value")
# The columns of SCHED_EVENTS that the copy reads.
EXPORT_SCHED_COLUMNS = ("start", "cpu", "isSchedIn", "globalTid")


class TraceFormatError(SftprofError, ValueError):
    """The file is not a readable nsys export."""


def require_file(path: Path) -> None:
    """Refuse a path that is not a readable, non-empty regular file (a directory named x.sqlite, a FIFO)."""
    if not path.exists():
        raise TraceFormatError(f"{path}: no such file")
    if not path.is_file():
        raise TraceFormatError(f"{path}: not a regular file")
    if path.stat().st_size == 0:
        raise TraceFormatError(f"{path}: file is empty")


def one_line(exc: Exception) -> str:
    """The first line of an error from SQLite or DuckDB (DuckDB's go on with the query and hints)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _sqlite_extension() -> Path:
    """The sqlite extension shipped by the duckdb-ext-sqlite wheel: `LOAD sqlite` would download it."""
    spec = importlib.util.find_spec("duckdb_ext")
    roots = list(spec.submodule_search_locations or []) if spec else []
    found = sorted(
        p
        for root in roots
        for p in Path(root).glob(f"extensions/v{duckdb.__version__}/*/sqlite_scanner.duckdb_extension")
    )
    if not found:
        raise EventStoreError(
            f"no DuckDB sqlite extension for duckdb {duckdb.__version__}: "
            f"pip install duckdb-ext-sqlite (the release matching duckdb {duckdb.__version__})"
        )
    return found[0]


def load_sqlite_extension(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(f"LOAD {sql_text(_sqlite_extension())}")


def attach_export(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Make an nsys SQLite export readable, read-only, as database `export` of `con`."""
    load_sqlite_extension(con)
    con.execute(f"ATTACH {sql_text(Path(path).resolve())} AS export (TYPE sqlite, READ_ONLY)")


def sqlite_scan(path: Path, table: str) -> str:
    """The DuckDB table function that reads `table` of the SQLite export at `path` (load_sqlite_extension first)."""
    return f"sqlite_scan({sql_text(Path(path).resolve())}, {sql_text(table)})"


def read_only_uri(path: Path) -> str:
    """The URI that opens `path` read-only in SQLite, whatever its name holds (`?`, `#`, `%` are escaped:
    unescaped, they cut the name and open, or create, another file)."""
    return f"{Path(path).resolve().as_uri()}?mode=ro"


def sqlite_text(value: bytes) -> str:
    """Text as SQLite returns it, whatever bytes the export holds (an application's NVTX names need not be UTF-8)."""
    return value.decode("utf-8", errors="replace")


def connect_sqlite(path: Path) -> sqlite3.Connection:
    """`path` opened read-only, once it is known to be an SQLite nsys export (it has StringIds)."""
    require_file(path)
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
    except sqlite3.Error as exc:
        raise TraceFormatError(f"{path}: cannot open ({one_line(exc)})") from None
    conn.text_factory = sqlite_text
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # the latter: SQLite's message quotes damaged bytes
        conn.close()
        raise TraceFormatError(f"{path}: not an SQLite database ({one_line(exc)})") from None
    if "StringIds" not in tables:
        conn.close()
        raise TraceFormatError(f"{path}: SQLite, but not an nsys export (no StringIds table)")
    return conn


SOURCE_TABLE = "SFTPROF_SOURCE"  # in an export sftprof made of a report: the report's fingerprint
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
    """The fingerprint of the report an SQLite export was made from (record_source), None if it has none."""
    try:
        with closing(sqlite3.connect(read_only_uri(sqlite_path), uri=True)) as conn:
            row = conn.execute(f"SELECT size, mtime_ns, sha256_ends FROM {SOURCE_TABLE}").fetchone()
    except sqlite3.Error:
        return None
    return dict(zip(("size", "mtime_ns", "sha256_ends"), row)) if row else None


def record_source(sqlite_path: Path, source: dict) -> None:
    """Keep `source`, the fingerprint of the report an SQLite export was made from (report_fingerprint), in the
    export, so that it is later known to be that report's (export_source)."""
    with closing(sqlite3.connect(sqlite_path)) as conn, conn:
        conn.execute(f"CREATE TABLE {SOURCE_TABLE} (size INTEGER, mtime_ns INTEGER, sha256_ends TEXT)")
        conn.execute(
            f"INSERT INTO {SOURCE_TABLE} VALUES (?, ?, ?)", (source["size"], source["mtime_ns"], source["sha256_ends"])
        )


class SqliteExport:
    """An SQLite export, read-only."""

    def __init__(self, path: Path):
        self.path = path
        self.conn = connect_sqlite(path)

    @cached_property
    def tables(self) -> set[str]:
        return {row[0] for row in self.conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table','view')")}

    def fetch(self, sql: str) -> list[tuple]:
        return self.conn.execute(sql).fetchall()

    def query(self, sql: str) -> pd.DataFrame:
        try:
            return pd.read_sql_query(sql, self.conn)
        except pd.errors.DatabaseError as exc:  # pandas wraps SQLite's error in one that quotes the whole query
            raise (exc.__cause__ or exc) from None

    def query_batches(self, sql: str, rows: int) -> Iterator[pd.DataFrame]:
        """The result of `sql` through sqlite3 (text as sqlite_text reads it), `rows` rows at a time."""
        cursor = self.conn.execute(sql)
        names = [column[0] for column in cursor.description]
        while batch := cursor.fetchmany(rows):
            yield pd.DataFrame.from_records(batch, columns=names)

    def columns(self, table: str) -> set[str]:
        return {row[1] for row in self.conn.execute(f"PRAGMA table_info({table})")}

    @cached_property
    def reader(self) -> duckdb.DuckDBPyConnection:
        """DuckDB's SQLite reader: vectorized, several times faster than sqlite3's row tuples."""
        self._spill = tempfile.TemporaryDirectory(prefix=scratch.prefix("reader"))
        reader = duckdb.connect()
        bound(reader, self._spill.name)
        attach_export(reader, self.path)
        reader.execute("USE export")
        return reader

    def close(self) -> None:
        self.conn.close()
        if "reader" in self.__dict__:
            self.reader.close()
            self._spill.cleanup()


# Parquet types as SQLite holds them (integers, booleans included, as INTEGER: 64 bits; floats as REAL).
_INTEGER_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "BOOLEAN")
SQLITE_TYPES = {
    **{t: "BIGINT" for t in _INTEGER_TYPES},
    **{f"U{t}": "BIGINT" for t in _INTEGER_TYPES[:5]},
    "FLOAT": "DOUBLE",
    "DOUBLE": "DOUBLE",
    "VARCHAR": "VARCHAR",
    "BLOB": "BLOB",
}
# Columns that must hold integers. In SQLite a value has its own type, so one that is not an integer is
# a damaged row, left out; a Parquet column has one type for all its rows: a wrong one refuses the file.
TIME_COLUMNS = ("start", "end", "timestamp")
INTEGER_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": EXPORT_KERNEL_COLUMNS,
    "CUPTI_ACTIVITY_KIND_RUNTIME": EXPORT_RUNTIME_COLUMNS,
    "StringIds": ("id",),
}
TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # other files in the folder are not nsys tables
GLOB_CHARACTERS = set("*?[]{}")  # DuckDB's read_parquet expands them: a name holding one could read another file


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class ParquetExport:
    """A parquetdir folder, each TABLE.parquet a view of that name (integers as BIGINT) in `reader`.
    Only regular files in the folder itself are read: a link (to anything, anywhere) is refused."""

    def __init__(self, path: Path):
        self.path = path
        if not path.exists():
            raise TraceFormatError(f"{path}: no such folder")
        if not path.is_dir():
            raise TraceFormatError(f"{path}: not a folder (nsys export --type=parquetdir writes one)")
        folder = path.resolve()
        if GLOB_CHARACTERS & set(str(folder)):
            raise TraceFormatError(f"{path}: a parquetdir path must not hold any of {''.join(sorted(GLOB_CHARACTERS))}")
        files = {p.stem: p for p in sorted(folder.iterdir()) if p.suffix == ".parquet" and TABLE_NAME.fullmatch(p.stem)}
        if not files:
            raise TraceFormatError(f"{path}: no .parquet tables in the folder")
        if "StringIds" not in files:
            raise TraceFormatError(f"{path}: Parquet tables, but not an nsys export (no StringIds.parquet)")
        for file in files.values():
            if file.is_symlink() or not file.is_file():
                raise TraceFormatError(f"{path}: {file.name} is not a regular file (nsys writes only files)")
        self.tables = set(files)
        self.files = files
        self._columns: dict[str, set[str]] = {}
        self.scans: dict[str, str] = {}  # table -> a DuckDB subquery that reads it, in any connection
        self._spill = tempfile.TemporaryDirectory(prefix=scratch.prefix("reader"))
        self._con = duckdb.connect()
        bound(self._con, self._spill.name)
        try:
            for table, file in files.items():
                self.scans[table] = self._scan(table, file)
                self._con.execute(f"CREATE VIEW {_quoted(table)} AS SELECT * FROM {self.scans[table]}")
        except duckdb.Error as exc:
            self.close()
            raise TraceFormatError(f"{path}: {file.name} is not a readable Parquet table ({one_line(exc)})") from None
        except TraceFormatError:
            self.close()
            raise

    def _scan(self, table: str, file: Path) -> str:
        source = f"read_parquet({sql_text(file)}, hive_partitioning = false)"
        schema = self._con.execute(f"DESCRIBE SELECT * FROM {source}").fetchall()
        selected = []
        for column, kind, *_ in schema:
            cast = SQLITE_TYPES.get(kind)
            integer = column in TIME_COLUMNS or column in INTEGER_COLUMNS.get(table, ())
            if cast is None or (integer and cast != "BIGINT"):
                expected = "an integer type" if integer else "a type an nsys export holds"
                raise TraceFormatError(f"{self.path}: {file.name}: column {column!r} is {kind}, not {expected}")
            selected.append(f"CAST({_quoted(column)} AS {cast}) AS {_quoted(column)}")
        self._columns[table] = {row[0] for row in schema}
        return f"(SELECT {', '.join(selected)} FROM {source})"

    def fetch(self, sql: str) -> list[tuple]:
        return self._con.execute(sql).fetchall()

    def query(self, sql: str) -> pd.DataFrame:
        """As pandas builds an SQLite query's result (pd.read_sql_query), so that types match."""
        cursor = self._con.execute(sql)
        columns = [column[0] for column in cursor.description]
        return pd.DataFrame.from_records(cursor.fetchall(), columns=columns, coerce_float=True)

    def columns(self, table: str) -> set[str]:
        return self._columns[table]

    @property
    def reader(self) -> duckdb.DuckDBPyConnection:
        return self._con

    def close(self) -> None:
        self._con.close()
        self._spill.cleanup()


Export = SqliteExport | ParquetExport
