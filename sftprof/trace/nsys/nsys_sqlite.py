"""Load an nsys export into TraceTables: the SQLite file (`nsys export --type=sqlite`) or the
parquetdir folder (`--type=parquetdir`, nsys 2024+), through the same SQL (nsys_export.Export runs it
on either format; the results are identical, tests/test_parquetdir.py).

Opened read-only. Kernels, CUDA API calls, GPU metric samples, context switches and NVTX ranges go to an
EventStore (DuckDB); the other tables, to pandas. Tables are looked up first: nsys exports a table only when its trace
source produced rows, so a missing table means "not traced", not an error. The SQL here keeps
the selection rules of `nsys stats` (OSRT eventClass 27, NVTX range event types, the
`globalTid` bit layout), so summaries computed from these tables match nsys's own.

Exports of 2022.4 and newer both load: the metadata table is EXPORT_META_DATA (2022.4) or
META_DATA_EXPORT (newer), and enum labels come from the file's ENUM_* tables when it has them.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from sftprof import memory_budget
from sftprof.trace.events import (
    BATCH_VECTORS,
    MAX_TIME_NS,
    MEMSET_KIND,
    EventStore,
    frames_visible,
    out_of_disk,
    valid_times_sql,
)
from sftprof.trace.nsys.nsys_export import (
    EXPORT_KERNEL_COLUMNS,
    EXPORT_METRIC_COLUMNS,
    EXPORT_RUNTIME_COLUMNS,
    EXPORT_SCHED_COLUMNS,
    Export,
    ParquetExport,
    SqliteExport,
    TraceFormatError,
    connect_sqlite,
    load_sqlite_extension,
    one_line,
    sqlite_scan,
    sqlite_text,
)
from sftprof.trace.nsys.store import copy_export
from sftprof.trace.tables import COLUMNS, TraceTables, count_dropped, empty, gpu_rows, valid_rows

# NVTX_EVENTS.eventType values for ranges: push/pop and start/end, native and NVTXT-imported.
NVTX_RANGE_STYLES = {59: "PushPop", 60: "StartEnd", 70: "PushPop", 71: "StartEnd"}
NVTX_STYLES = sorted(set(NVTX_RANGE_STYLES.values()))  # style ids number these
# torch.autograd.profiler.emit_nvtx (on under NeMo's NsysCallback) names each op's range once per call:
# "aten::mm, seq = 12, op_id = 345, sizes = [...]". The numbering is cut as ranges are read, so that a
# name says which op; otherwise every range has a name of its own (60M at 10M kernels), and so do the
# tables by name. The same cut in Python (the sqlite3 route) and in DuckDB's RE2 (ASCII digits in both).
EMIT_NVTX_KEYS = ("seq", "op_id")
EMIT_NVTX_NUMBERING = f", (?:{'|'.join(EMIT_NVTX_KEYS)}) = [0-9]+.*"
_EMIT_NVTX_SUFFIX = re.compile(EMIT_NVTX_NUMBERING, re.DOTALL)
NVTX_DOMAIN_CREATE = 75
OSRT_CALL_CLASS = 27  # other OSRT_API classes are zero-length "profiling started/stopped" markers
# copyKind -> the operation names nsys 2022.4's gpumemtimesum prints (from an inline list; newer
# versions print '[CUDA memcpy ' || ENUM_CUDA_MEMCPY_OPER.label || ']' instead).
MEMCPY_OPERATIONS = {
    0: "[CUDA memcpy Unknown]",
    1: "[CUDA memcpy HtoD]",
    2: "[CUDA memcpy DtoH]",
    3: "[CUDA memcpy HtoA]",
    4: "[CUDA memcpy AtoH]",
    5: "[CUDA memcpy AtoA]",
    6: "[CUDA memcpy AtoD]",
    7: "[CUDA memcpy DtoA]",
    8: "[CUDA memcpy DtoD]",
    9: "[CUDA memcpy HtoH]",
    10: "[CUDA memcpy PtoP]",
    11: "[CUDA Unified Memory memcpy HtoD]",
    12: "[CUDA Unified Memory memcpy DtoH]",
    13: "[CUDA Unified Memory memcpy DtoD]",
}
MEMSET_OPERATION = "[CUDA memset]"
# copyKind -> the direction, whatever the naming: what analyses group and test on.
MEMCPY_KINDS = {
    0: "Unknown",
    1: "HtoD",
    2: "DtoH",
    3: "HtoA",
    4: "AtoH",
    5: "AtoA",
    6: "AtoD",
    7: "DtoA",
    8: "DtoD",
    9: "HtoH",
    10: "PtoP",
    11: "UVM HtoD",
    12: "UVM DtoH",
    13: "UVM DtoD",
}
# Enum labels for files without the ENUM_* table (values are stable across versions).
MEMORY_KIND_LABELS = {
    0: "Pageable",
    1: "Pinned",
    2: "Device",
    3: "Array",
    4: "Managed",
    5: "Device Static",
    6: "Managed Static",
    7: "Unknown",
}
SYNC_TYPE_LABELS = {0: "Unknown", 1: "Event sync", 2: "Stream wait sync", 3: "Stream sync", 4: "Context sync"}
# The first nsys release whose stats name memcpys by the ENUM_CUDA_MEMCPY_OPER label.
ENUM_MEMCPY_NAMES_SINCE = 2023
METADATA_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")  # newer name first
CAPTURE_SPAN = "capture span"  # ANALYSIS_DETAILS.duration, counted in dropped_rows beside the tables

# globalTid = [hwId:8][vmId:8][pid:24][tid:24]
_PID = "((globalTid >> 24) & 16777215)"
_TID = "(globalTid & 16777215)"


def check_export(path: str | Path) -> None:
    """Raise TraceFormatError unless `path` is a whole nsys export: it opens as one, and its size is
    what its header says (nsys exits 0 after a full disk cut its file short or left it empty)."""
    path = Path(path)
    conn = connect_sqlite(path)
    try:
        (page_size,) = conn.execute("PRAGMA page_size").fetchone()
        (page_count,) = conn.execute("PRAGMA page_count").fetchone()
    except sqlite3.DatabaseError as exc:
        raise TraceFormatError(f"{path}: damaged export ({one_line(exc)})") from None
    finally:
        conn.close()
    size = path.stat().st_size
    if page_size * page_count != size:
        raise TraceFormatError(f"{path}: truncated export ({size:,} bytes; its header says {page_size * page_count:,})")


def _rows(export: Export, sql: str) -> pd.DataFrame:
    """A query over the tables that grow with the capture, read by DuckDB (vectorized: several
    times faster than sqlite3's row tuples)."""
    return export.reader.execute(sql).df()


def _query_chunks(export: Export, sql: str) -> Iterator[pd.DataFrame]:
    """`sql` over the export's tables, read by DuckDB, a batch of rows at a time (BATCH_VECTORS) in the order it
    gives them: where the page decoder does not read a table (a parquetdir's, every one), what is held is a batch,
    not the table (NeMo's 40M export as a parquetdir peaked at 1.58 GiB holding its 17M OS-runtime calls whole)."""
    result = export.reader.execute(sql)
    while len(batch := result.fetch_df_chunk(BATCH_VECTORS)):
        yield batch


# _page_chunks decodes this much of a table's pages at a time (1.5M memory operations fill 60 MB of pages).
PAGE_ROWS_CHUNK_BYTES = 8 << 20


def _page_chunks(export: Export, table: str, columns: list[str], select: str) -> Iterator[pd.DataFrame]:
    """`select` (FROM `{rows}`) over `columns` of the export's `table`, in its rows' order, a chunk at a time:
    run by DuckDB on the table's pages decoded a chunk at a time (sqlite_pages: a few times faster than
    DuckDB's SQLite reader over millions of rows). Unsupported where the decoder does not read the table
    (another format, a value that is not an integer): the caller runs the same SQL on the table itself."""
    from sftprof.trace.nsys import sqlite_pages  # imports numba: only when an export is read

    if not isinstance(export, SqliteExport):
        raise sqlite_pages.Unsupported("not an SQLite export")
    for chunk in sqlite_pages.int_columns(export.path, table, columns, chunk_bytes=PAGE_ROWS_CHUNK_BYTES):
        with frames_visible(export.reader, {"page_rows": chunk}):
            rows = _rows(export, select.format(rows="page_rows"))
        yield rows


def _metadata(export: Export) -> dict[str, str]:
    for table in METADATA_TABLES:
        if table in export.tables:
            return {str(name): str(value) for name, value in export.fetch(f"SELECT name, value FROM {table}")}
    return {}


# nsys 2024+ records how the capture was taken (trace kinds, sampling rate, CUDA graph tracing) in this table.
CAPTURE_SETTINGS_TABLE = "META_DATA_CAPTURE"
# Keys of it left out: the environment and the command line can hold secrets, and no analysis reads them.
_PRIVATE_SETTING = re.compile(r"ENVIRONMENT_VARIABLE|:COMMAND$|:ARGUMENT_\d+$|:WORKING_DIR$|:USER_NAME$")


def _capture_settings(export: Export) -> dict[str, tuple[str, ...]]:
    """The capture's own settings (key -> its values, in the table's order), for what the capture cost the run."""
    if CAPTURE_SETTINGS_TABLE not in export.tables:
        return {}
    settings: dict[str, list[str]] = {}
    for name, value in export.fetch(f"SELECT CAST(name AS TEXT), CAST(value AS TEXT) FROM {CAPTURE_SETTINGS_TABLE}"):
        if name is not None and not _PRIVATE_SETTING.search(str(name)):
            settings.setdefault(str(name), []).append("" if value is None else str(value))
    return {name: tuple(values) for name, values in settings.items()}


def _nsys_release(metadata: dict[str, str], tables: set[str]) -> int:
    """The year of the nsys release that wrote the file (2022 for 2022.4.2.1); 0 when unknown."""
    version = metadata.get("EXPORT_PRODUCT_VERSION") or metadata.get("NSIGHT_SYSTEMS_VERSION", "")
    year = version.split(".")[0]
    if year.isdigit():
        return int(year)
    return ENUM_MEMCPY_NAMES_SINCE if "META_DATA_EXPORT" in tables else 0


# Holds for an integer id only (SQLite: not for text, a real, a blob or NULL; the same as typeof(id) = 'integer').
INTEGER_ID = "id = CAST(id AS BIGINT)"


def _strings(export: Export) -> pd.DataFrame:
    """StringIds as id, value: read once, as text whatever a value holds (DuckDB refuses a BLOB in a TEXT column)."""
    return export.query(f"SELECT id, CAST(value AS TEXT) AS value FROM StringIds WHERE {INTEGER_ID}")


# nsys's own diagnostic for a requested trace kind that recorded nothing, kept among the export's strings.
NOTHING_COLLECTED = re.compile(r"No (\w+) events collected\.(?: Does the process use \1\?)?")


def _empty_trace_kinds(strings: pd.DataFrame) -> dict[str, str]:
    """Trace kinds the capture itself says recorded nothing (kind -> nsys's message)."""
    values = strings["value"].dropna().astype(str)
    return {
        match.group(1): f'nsys says "{match.group(0)}"'
        for match in map(NOTHING_COLLECTED.fullmatch, values[values.str.startswith("No ")])
        if match
    }


def _enum_labels(export: Export, enum_table: str, fallback: dict[int, str]) -> dict:
    if enum_table not in export.tables:
        return fallback
    return {
        code: str(label)
        for code, label in export.fetch(f"SELECT id, CAST(label AS TEXT) FROM {enum_table} WHERE {INTEGER_ID}")
    }


class _Labels:
    """Text columns read as small integer codes (an SQL CASE over the code column, as _case), stored as
    such with the labels they number (EventStore's memop_labels, sync_labels): a row holds no string of its
    own (at 1.5M memory operations, four text columns took 0.35 GB while they loaded)."""

    def __init__(self):
        self.labels: list[str] = []

    def code(self, label: str) -> int:
        if label not in self.labels:
            self.labels.append(label)
        return self.labels.index(label)

    def case(self, column: str, labels: dict[int, str], default: str | None = None) -> str:
        whens = " ".join(f"WHEN {code} THEN {self.code(label)}" for code, label in labels.items())
        otherwise = self.constant(default)
        return f"coalesce(CASE {column} {whens} ELSE {otherwise} END, -1)" if whens else otherwise

    def constant(self, label: str | None) -> str:
        return str(-1 if label is None else self.code(label))


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _span_ns(export: Export, dropped: dict[str, int]) -> int:
    """The capture's length; 0 (unknown) when not recorded, or recorded as no length can be (counted in `dropped`)."""
    if "ANALYSIS_DETAILS" in export.tables:
        row = next(iter(export.fetch("SELECT duration FROM ANALYSIS_DETAILS")), None)
        if row and row[0] is not None:
            if isinstance(row[0], int) and 0 <= row[0] <= MAX_TIME_NS:
                return row[0]
            dropped[CAPTURE_SPAN] = 1
    return 0


def _threads(export: Export, strings: pd.DataFrame) -> pd.DataFrame:
    """One row per thread, with the last name the export records for it and for its process (scan order:
    a thread renames itself; nsys's launcher process execs the program, so its pid is named twice)."""
    if "ThreadNames" not in export.tables:
        return empty("threads")
    threads = export.query(f"SELECT globalTid AS global_tid, {_PID} AS pid, {_TID} AS tid, nameId FROM ThreadNames")
    names = pd.Series(strings["value"].to_numpy(), index=strings["id"].to_numpy())
    threads["thread_name"] = threads.pop("nameId").map(names[~names.index.duplicated()])
    threads = threads.dropna(subset=["thread_name"]).drop_duplicates("global_tid", keep="last")
    if "PROCESSES" in export.tables:
        processes = export.query("SELECT pid, CAST(name AS TEXT) AS process_name FROM PROCESSES")
        threads = threads.merge(processes.drop_duplicates("pid", keep="last"), on="pid", how="left")
    else:
        threads["process_name"] = None
    return threads.sort_values("global_tid", kind="stable")[COLUMNS["threads"]].reset_index(drop=True)


def _nvtx_ranges(source: str, strings: str = "StringIds") -> str:
    """The ranges in NVTX_EVENTS (or a copy of its rows, `source`), as nsys stats selects and names them
    (`strings`: the StringIds table, or a query that reads it)."""
    types = ",".join(map(str, NVTX_RANGE_STYLES))
    style = " ".join(f"WHEN {code} THEN '{name}'" for code, name in NVTX_RANGE_STYLES.items())
    # SQLite's max(a, b) is NULL when either is: so is this CASE, which DuckDB runs too.
    return f"""
        WITH domains AS (
            SELECT domainId AS id, globalTid, min(CAST(text AS TEXT)) AS name FROM {source}
            WHERE eventType = {NVTX_DOMAIN_CREATE} GROUP BY domainId, globalTid),
        maxts AS (SELECT CASE WHEN max(start) IS NULL OR max("end") IS NULL THEN NULL
                              WHEN max(start) >= max("end") THEN max(start) ELSE max("end") END AS m
                  FROM {source})
        SELECT ne.start AS start, coalesce(ne."end", (SELECT m FROM maxts)) AS "end",
               CASE WHEN d.name IS NOT NULL THEN d.name || ':' || CAST(coalesce(sid.value, ne.text) AS TEXT)
                    ELSE CAST(coalesce(sid.value, ne.text) AS TEXT) END AS name,
               CASE ne.eventType {style} END AS style,
               ne.globalTid AS global_tid, ((ne.globalTid >> 24) & 16777215) AS pid,
               (ne.globalTid & 16777215) AS tid
        FROM {source} ne
        LEFT JOIN domains d ON ne.domainId = d.id
             AND ((ne.globalTid >> 24) & 16777215) = ((d.globalTid >> 24) & 16777215)
        LEFT JOIN {strings} sid ON ne.textId = sid.id
        WHERE ne.eventType IN ({types})"""


def _first_failure(error: duckdb.Error, copy: Future) -> Exception:
    """What made a store fail: the copy's own error where the copy failed too and `error` only says the store
    has been given up (DuckDB invalidates a database after a fatal error, such as a full disk)."""
    copied = copy.exception()
    return copied if copied is not None and isinstance(error, duckdb.FatalException) else error


def _nvtx(export: Export, strings: pd.DataFrame, store: EventStore, dropped) -> None:
    """NVTX ranges into `store` (EventStore.nvtx): a capture of NeMo's emit_nvtx holds millions of ranges (60M
    at 10M kernels) but, once their numbering is cut, a few hundred names. Read from the file's pages where
    the decoder can, a chunk at a time; else through DuckDB; else, for text that is not UTF-8, sqlite3."""
    from sftprof.trace.nsys import sqlite_pages  # imports numba: only when an export is read

    if "NVTX_EVENTS" not in export.tables:
        return
    try:
        _nvtx_from_pages(export, strings, store, dropped)
    except sqlite_pages.Unsupported:
        store.clear_nvtx()
        _nvtx_by_sql(export, store, dropped)
    # a range names its thread, or no thread can be said to have pushed it (a step range with none broke the
    # step accounting): left out and counted, whichever route read it
    count_dropped(dropped, "nvtx", store.delete_invalid("nvtx_rows", "global_tid IS NOT NULL"))


def _nvtx_by_sql(export: Export, store: EventStore, dropped) -> None:
    """The ranges that _nvtx_from_pages does not read, into `store`: through DuckDB (_coded_names), or, for
    text not in UTF-8 (which DuckDB refuses) in an export whose pages were not read either, through sqlite3."""
    try:
        return _coded_names(export, store, dropped)
    # SQLite holds any bytes in a TEXT column, DuckDB refuses what is not UTF-8 text: read those as SQLite gives them
    except (duckdb.InvalidInputException, duckdb.TypeMismatchException):
        if not isinstance(export, SqliteExport):
            raise
        store.clear_nvtx()
    _nvtx_through_sqlite3(export, store, dropped)


# Ranges fetched by sqlite3 at a time, as Python tuples of a few hundred bytes: NeMo's 2M export (12M ranges)
# peaked at 1.63 GB a million at a time, 0.79 GB at this, in 42-44 s either way (benchmarks/ENGINE.md).
SQLITE3_BATCH_ROWS = 1 << 17


def _nvtx_through_sqlite3(export: SqliteExport, store: EventStore, dropped) -> None:
    """_nvtx_ranges read by sqlite3 (text as sqlite_text reads it) a batch at a time, so that no more than a
    batch is held: each range is stored with a code of its name, emit_nvtx's numbering cut, numbered as the
    names are met; the names are sorted and the codes mapped to them once, at the end (EventStore.name_nvtx)."""
    codes: dict[str | None, int] = {}
    style_ids = {style: i for i, style in enumerate(NVTX_STYLES)}
    used_styles: set[int] = set()
    for batch in export.query_batches(_nvtx_ranges("NVTX_EVENTS"), SQLITE3_BATCH_ROWS):
        # names and styles coded before the rows whose times are not valid go: the SQL routes list their names too
        raw, met = pd.factorize(batch["name"])  # each distinct name of the batch cut once; -1: no name
        met_codes = [codes.setdefault(_EMIT_NVTX_SUFFIX.sub("", str(name)), len(codes)) for name in met]
        name_codes = np.array([*met_codes, codes.setdefault(None, len(codes))], dtype=np.int32)[raw]
        styles = batch["style"].map(style_ids)
        used_styles.update(styles.unique().tolist())
        rows = valid_rows(batch.assign(name=name_codes, style=styles), "nvtx", dropped)
        stored = rows[["start", "end", "global_tid"]]
        store.append("nvtx_rows", stored.assign(name_id=rows["name"], style_id=rows["style"]))
    untyped = export.query("SELECT count(*) AS n FROM NVTX_EVENTS WHERE eventType IS NULL")["n"].iloc[0]
    count_dropped(dropped, "nvtx", int(untyped))
    names = sorted(name for name in codes if name is not None)
    name_id = {name: i for i, name in enumerate(names)} | {None: -1}
    styles = sorted(used_styles)
    coded = (np.array(list(codes.values()), dtype=np.int64), np.array([name_id[n] for n in codes], dtype=np.int64))
    store.name_nvtx(names, [NVTX_STYLES[style] for style in styles], coded=(*coded, styles))


NVTX_PAGE_COLUMNS = ["start", "end", "eventType", "globalTid", "textId", "domainId"]
# NVTX pages decoded at a time: half the other tables' (sqlite_pages.CHUNK_BYTES), beside the copy of kernels and
# calls: loading NeMo's 20M export (120M ranges) peaked at 0.74-0.78 GiB with 16 MiB, 0.82 with 32, in the same time
# (benchmarks/ENGINE.md).
NVTX_CHUNK_BYTES = 16 << 20
# NVTX ranges inserted at a time (a few chunks' rows, held while the batch before is inserted: loading peaked
# 0.05 GiB higher at 60M): DuckDB pays per INSERT, the more so the more threads it has. On the GPU machine's 16
# cores 12M of NeMo's ranges went in in 2.1-2.2 s a chunk at a time, 1.0-1.1 s four at a time (benchmarks/ENGINE.md).
NVTX_INSERT_ROWS = 1 << 20


def _kept(values: np.ndarray, missing: np.ndarray, keep: np.ndarray):
    """values[keep], NULL where `missing`: a nullable array where some are."""
    kept, nulls = values[keep], missing[keep]
    return pd.arrays.IntegerArray(kept, nulls) if nulls.any() else kept


def _nvtx_from_pages(export: Export, strings: pd.DataFrame, store: EventStore, dropped) -> None:
    """What _coded_names gives, read from NVTX_EVENTS' pages (sqlite_pages) in one pass and copied into `store`
    a chunk at a time, so that no more than a chunk of ranges is held. Each range is written once, before
    the names are known (a domain may be named after its ranges, and name ids follow the names' order): its
    name_id holds a code of what names it (_NameCodes), its style_id the style's place in NVTX_RANGE_STYLES'
    sorted styles, and an open range no end. Then names from StringIds (textId) and domains (eventType 75, by
    domain and process), as _nvtx_ranges joins them, are worked out once per code, and the store's nvtx
    view maps codes to name and style ids (EventStore.name_nvtx). Unsupported, so that the caller reads the
    table through DuckDB, for what this does not read exactly as that SQL does: another format, a range
    without a thread, a domain named twice in one process, an id twice in StringIds, a domain id below 0 or
    from 2^39 on (nsys numbers domains from 0). Text not in UTF-8, which DuckDB refuses, is read here as
    sqlite3 reads it."""
    from sftprof.trace.nsys import sqlite_pages

    if not isinstance(export, SqliteExport):
        raise sqlite_pages.Unsupported("not an SQLite export")
    with store.con.cursor() as cursor:  # its own: the store's other tables are copied in meanwhile
        _copy_nvtx(export, strings, store, dropped, cursor)


_PAIR_SHIFT = 24  # a (domain, pid) pair as one int64: domain << 24 | pid, for domain ids below 2^39


class _NameCodes:
    """What names a range, as one code. A range outside a domain, or in one its process has not named, is named
    by its label alone (a text's code, or -2 - the StringIds row of the value that names it, or -1: none): its
    code is the label. In a domain its process named, the name is `DOMAIN:NAME`: each (label, domain, pid) met
    gets a code of its own, below every label's. `named`: the (domain, pid) pairs named so far (a chunk's
    creations are added before its ranges are coded); `plain_pairs`: the pairs of ranges coded by label, of
    which none may turn out named (then the table is read again with every named pair known); `used`: every
    code handed out."""

    def __init__(self, strings: int, named: np.ndarray | None = None):
        self.first = -3 - strings  # below -2 - the last StringIds row
        self.named = np.empty(0, np.int64) if named is None else np.unique(named)
        self.in_domain: dict[tuple[int, int], int] = {}  # (pair, label) -> code
        self.plain_pairs = np.empty(0, np.int64)
        # the codes handed out, marked as they are: code c at [c] of the first, at [-1 - c] of the second. Asking
        # the store for its distinct codes ran out of DuckDB's share where each range had a name of its own (6M)
        self._handed_out = [np.zeros(0, bool), np.zeros(0, bool)]

    @staticmethod
    def pairs(domain: np.ndarray, pid: np.ndarray) -> np.ndarray:
        from sftprof.trace.nsys import sqlite_pages

        if len(domain) and (domain.min() < 0 or domain.max() >= 1 << (63 - _PAIR_SHIFT)):
            raise sqlite_pages.Unsupported("a domain id out of range")
        return (domain.astype(np.int64) << _PAIR_SHIFT) | pid

    def add_named(self, pairs: np.ndarray) -> None:
        self.named = np.union1d(self.named, pairs)

    def of(self, label: np.ndarray, domain: np.ndarray, has_domain: np.ndarray, pid: np.ndarray) -> np.ndarray:
        from sftprof.trace.nsys import sqlite_pages

        code = label.astype(np.int64)
        at = np.flatnonzero(has_domain)
        if len(at):
            pair = self.pairs(domain[at], pid[at])
            keyed = np.isin(pair, self.named)
            plain = pair[~keyed]
            if len(plain):  # its distinct values: most ranges share one pair (the default domain's)
                others = plain[plain != plain[0]]
                self.plain_pairs = np.union1d(self.plain_pairs, np.r_[plain[:1], np.unique(others)])
            if keyed.any():
                at = at[keyed]
                which, keys = pd.factorize(
                    (np.searchsorted(self.named, pair[keyed]) << 32) | (label[at].astype(np.int64) + (1 << 31))
                )
                codes = []
                for key in keys.tolist():
                    named = (int(self.named[key >> 32]), (key & 0xFFFFFFFF) - (1 << 31))  # (pair, label)
                    if named not in self.in_domain:
                        self.in_domain[named] = self.first - len(self.in_domain)
                    codes.append(self.in_domain[named])
                code[at] = np.asarray(codes, dtype=np.int64)[which]
        if code.min(initial=0) < np.iinfo(np.int32).min:
            raise sqlite_pages.Unsupported("more names than an INTEGER numbers")
        below = code < 0
        for side, at in enumerate((code[~below], -1 - code[below])):
            marks = self._handed_out[side]
            if len(at) and at.max() >= len(marks):
                grown = np.zeros(max(int(at.max()) + 1, 2 * len(marks)), bool)
                grown[: len(marks)] = marks
                self._handed_out[side] = marks = grown
            marks[at] = True
        return code.astype(np.int32)

    def used(self) -> np.ndarray:
        """Every code handed out, once, in ascending order."""
        above, below = (np.flatnonzero(marks) for marks in self._handed_out)
        return np.concatenate([-1 - below[::-1], above]).astype(np.int32)

    def parts(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(label, domain, in_domain, pid) of each code (in_domain: a named domain's)."""
        in_domain = codes <= self.first
        label, domain, pid = codes.astype(np.int64), np.zeros(len(codes), np.int64), np.zeros(len(codes), np.int64)
        if in_domain.any():
            listed = np.zeros((len(self.in_domain), 2), np.int64)  # at first - code: pair, label
            for (pair, base), code in self.in_domain.items():
                listed[self.first - code] = pair, base
            pair, label[in_domain] = listed[self.first - codes[in_domain]].T
            domain[in_domain], pid[in_domain] = pair >> _PAIR_SHIFT, pair & ((1 << _PAIR_SHIFT) - 1)
        return label, domain, in_domain, pid


def _chunk_rows(values, missing, text_code, text_cut, ids, valued, style_of, codes, created, latest) -> pd.DataFrame:
    """One chunk of NVTX_EVENTS' decoded columns as nvtx_rows (name_id: _NameCodes' code; style_id: the style's
    place; end NULL while open); the domains it creates go to `created`, its latest times to `latest`."""
    from sftprof.trace.nsys import sqlite_pages

    start, end, kind, thread, text_id, domain = values  # NVTX_PAGE_COLUMNS
    for i, maxima in enumerate(latest.values()):  # start, end
        if not missing[i].all():
            maxima.append(int(values[i][~missing[i]].max()))
    kind = np.where(missing[2], -1, kind)  # NULL: no event type, not a range
    is_created = kind == NVTX_DOMAIN_CREATE
    if is_created.any():
        named = is_created & (text_code >= 0) & ~missing[5] & ~missing[3]
        codes.add_named(codes.pairs(domain[named], (thread[named] >> 24) & 0xFFFFFF))
        created.append(
            pd.DataFrame(
                {
                    "domainId": pd.arrays.IntegerArray(domain[is_created], missing[5][is_created]),
                    "globalTid": pd.arrays.IntegerArray(thread[is_created], missing[3][is_created]),
                    "text_code": text_code[is_created],
                    "text_cut": text_cut[is_created],
                }
            )
        )
    style = style_of[np.where((kind >= 0) & (kind < len(style_of)), kind, len(style_of) - 1)]
    is_range = style >= 0
    if missing[3][is_range].any():
        raise sqlite_pages.Unsupported("a range without a thread")
    # the name: StringIds' value where textId finds one with a value (label -2 - its row), else the text
    with_id = np.flatnonzero(is_range & ~missing[4])
    if len(ids) and len(with_id):
        found = ids.get_indexer(text_id[with_id])
        named = found >= 0
        named[named] = valued[found[named]]
        text_code[with_id[named]] = -2 - found[named]  # text_code is the chunk's own
    thread = thread[is_range]
    return pd.DataFrame(  # copies: the decoder reuses its arrays while this chunk is copied in
        {
            "start": _kept(start, missing[0], is_range),
            "end": _kept(end, missing[1], is_range),
            "name_id": codes.of(
                text_code[is_range], domain[is_range], ~missing[5][is_range], (thread >> 24) & 0xFFFFFF
            ),
            "style_id": style[is_range],
            "global_tid": thread,
        },
        copy=False,
    )


def _copy_nvtx(export: Export, strings: pd.DataFrame, store: EventStore, dropped, cursor) -> None:
    """_nvtx_from_pages through `cursor`: once, or, where a domain was named after ranges in it were coded
    by their labels alone (_NameCodes), again with every named domain known."""
    from sftprof.trace.nsys import sqlite_pages

    ids = pd.Index(strings["id"])
    if not ids.is_unique:
        raise sqlite_pages.Unsupported("StringIds holds an id twice")
    codes, text, created, last, untyped = _read_nvtx(export, strings, ids, store, None)
    # as sqlite3 reads them: bytes that are not UTF-8 replaced (names that then read alike are one name)
    text_names = [sqlite_text(name) for name in text.names()]
    domains = _domain_names(pd.concat(created) if created else None, text_names)
    named = codes.pairs(domains["domainId"].to_numpy(np.int64), domains["pid"].to_numpy(np.int64))
    if np.isin(codes.plain_pairs, named).any():
        store.clear_nvtx()
        codes, text, created, last, untyped = _read_nvtx(export, strings, ids, store, named)
    used = codes.used()  # every code once (names of ranges whose times are not valid too, as the SQL route lists)
    label, domain, in_domain, pid = codes.parts(used)
    names, name_ids = _range_names(
        label.astype(np.int32), domain, in_domain, pid << 24, domains, text_names, strings["value"]
    )
    used_styles = sorted(
        int(style) for style in cursor.execute("SELECT DISTINCT style_id FROM nvtx_rows").fetchnumpy()["style_id"]
    )
    # an open range ends at the latest time of any event; with none, it stays open, and is left out as not valid
    if last is not None:
        cursor.execute(f'UPDATE nvtx_rows SET "end" = {last} WHERE "end" IS NULL')
    count_dropped(dropped, "nvtx", store.delete_invalid("nvtx_rows") + untyped)
    store.name_nvtx(names, [NVTX_STYLES[style] for style in used_styles], coded=(used, name_ids, used_styles))


def nvtx_text_codes():
    """NVTX_EVENTS' text read as codes (sqlite_pages.TextCodes), emit_nvtx's numbering cut off (EMIT_NVTX_KEYS)."""
    from sftprof.trace.nsys import sqlite_pages

    return sqlite_pages.TextCodes("text", tuple(f", {key} = ".encode() for key in EMIT_NVTX_KEYS))


def _read_nvtx(export: Export, strings: pd.DataFrame, ids: pd.Index, store: EventStore, named: np.ndarray | None):
    """One pass over NVTX_EVENTS' pages into nvtx_rows (`named`: the (domain, pid) pairs named, where known):
    its _NameCodes, TextCodes, the domain creations, the latest time of any event (None: no time) and the
    number of events without an event type (nsys writes none: damage, left out and counted)."""
    from sftprof.trace.nsys import sqlite_pages

    valued = strings["value"].notna().to_numpy()
    text = nvtx_text_codes()
    style_of = np.full(max(NVTX_RANGE_STYLES) + 2, -1, dtype=np.int8)  # the last: any other event type
    for event_type, style in NVTX_RANGE_STYLES.items():
        style_of[event_type] = NVTX_STYLES.index(style)
    codes, created, latest = _NameCodes(len(strings), named), [], {"start": [], "end": []}
    untyped = 0
    chunks = sqlite_pages.raw_columns(
        export.path, "NVTX_EVENTS", NVTX_PAGE_COLUMNS, chunk_bytes=NVTX_CHUNK_BYTES, text=text
    )
    inserting, inserted, held = ThreadPoolExecutor(1), None, []  # rows are copied in while the next are decoded

    def insert(rows: list[pd.DataFrame], previous: Future | None) -> Future:
        if previous is not None:
            previous.result()
        return inserting.submit(store.append, "nvtx_rows", pd.concat(rows, ignore_index=True))

    try:
        for values, missing, text_code, text_cut in chunks:
            untyped += int(np.count_nonzero(missing[2]))
            held.append(
                _chunk_rows(values, missing, text_code, text_cut, ids, valued, style_of, codes, created, latest)
            )
            if sum(map(len, held)) >= NVTX_INSERT_ROWS:
                inserted, held = insert(held, inserted), []
        if held:
            inserted = insert(held, inserted)
        if inserted is not None:
            inserted.result()
    finally:
        inserting.shutdown()
    last = max(max(latest["start"]), max(latest["end"])) if latest["start"] and latest["end"] else None
    return codes, text, created, last, untyped


def _domain_names(created: pd.DataFrame | None, text_names: list[str]) -> pd.DataFrame:
    """The domains created (eventType 75) by (domainId, pid), with `name` (the text's name, cut) and `cut`
    (the domain's own name held emit_nvtx's numbering, so it is the whole name, as the SQL's cut of
    `DOMAIN:TEXT` gives); domains without a name are left out, as the SQL's CASE leaves them."""
    from sftprof.trace.nsys import sqlite_pages

    if created is None or created.empty:
        return pd.DataFrame({"domainId": [], "pid": [], "name": [], "cut": []})
    # a NULL domainId or thread joins no range
    created = created[created["domainId"].notna() & created["globalTid"].notna()]
    created = created.astype({"domainId": "int64", "globalTid": "int64"})
    created = created.assign(pid=(created["globalTid"].to_numpy() >> 24) & 16777215)
    named = created[created["text_code"] >= 0]
    if (
        named.groupby(["domainId", "globalTid"])[["text_code", "text_cut"]].nunique().gt(1).any().any()
        or created.groupby(["domainId", "pid"])["globalTid"].nunique().gt(1).any()
    ):  # SQL takes the least of a domain's names, and joins each range to every thread that created it
        raise sqlite_pages.Unsupported("a domain named twice in one process")
    named = named.drop_duplicates(["domainId", "pid"])
    return pd.DataFrame(
        {
            "domainId": named["domainId"].to_numpy(),
            "pid": named["pid"].to_numpy(),
            "name": [text_names[code] for code in named["text_code"]],
            "cut": named["text_cut"].to_numpy(),
        }
    )


_LABEL_CHUNK = 1 << 20  # _range_names' labels numbered a chunk at a time


def _range_names(label, domain, in_domain, global_tid, domains, text_names: list[str], values: pd.Series):
    """The sorted names the ranges use and each range's code (-1: none): `label` is a text's code, or
    -2 - the StringIds row of the value that names it, or -1; a range in a domain its process named
    (`in_domain`: its domainId is not NULL) is `DOMAIN:NAME`."""
    numbered: dict[str, int] = {}  # name -> its number in order of meeting

    def number(name: str) -> int:
        return numbered.setdefault(name, len(numbered))

    def name_of(base: int) -> str | None:
        if base >= 0:
            return text_names[base]
        return _EMIT_NVTX_SUFFIX.sub("", str(values.iloc[-2 - base])) if base <= -2 else None

    def base_numbers(labels: np.ndarray, outside: np.ndarray | None = None) -> np.ndarray:
        # one table over every label: StringIds rows (-2 - row), none (-1), texts (0...), shifted to start at 0;
        # int32 where it fits, a mask of the labels used, not a bincount, and a chunk of labels at a time: 60M
        # ranges at 10M kernels of NeMo's. `outside`: the rows named so (None: all)
        shift = len(values) + 1
        used = np.zeros(shift + len(text_names), dtype=bool)
        kind = np.int32 if len(used) < 2**31 else np.int64
        chunks = [slice(i, i + _LABEL_CHUNK) for i in range(0, len(labels), _LABEL_CHUNK)]
        for chunk in chunks:
            at = labels[chunk].astype(kind) + kind(shift)
            used[at if outside is None else at[outside[chunk]]] = True
        lookup = np.full(len(used), -1, dtype=kind)
        for i in np.flatnonzero(used):
            if i != shift - 1:
                lookup[i] = number(name_of(int(i) - shift))
        numbers = np.empty(len(labels), dtype=kind)  # the rows not `outside`: their caller's to number
        for chunk in chunks:
            numbers[chunk] = lookup[labels[chunk].astype(kind) + kind(shift)]
        return numbers

    inside = np.empty(0, dtype=np.int64)  # the ranges whose domain and process find a row of `domains` (`row`)
    if len(domains):
        candidates = np.isin(domain, domains["domainId"].to_numpy(dtype=np.int64))
        candidates = np.flatnonzero(candidates if in_domain is None else candidates & in_domain)
        index = pd.MultiIndex.from_arrays([domains["domainId"].to_numpy(), domains["pid"].to_numpy()])
        pid = (global_tid[candidates] >> 24) & 16777215
        row = index.get_indexer(pd.MultiIndex.from_arrays([domain[candidates], pid]))
        inside, row = candidates[row >= 0], row[row >= 0]
    if not len(inside):
        code = base_numbers(label)
    else:
        outside = np.ones(len(label), dtype=bool)
        outside[inside] = False
        code = base_numbers(label, outside)
        pairs, which = np.unique(np.stack([row, label[inside]]), axis=1, return_inverse=True)
        numbers = np.full(pairs.shape[1], -1, dtype=np.int64)
        for i, (at, base) in enumerate(pairs.T):
            part, own = name_of(base), domains["name"].iat[at]
            # SQL cuts `DOMAIN:NAME`: where the domain's own name holds the numbering, the cut ends there
            if part is not None:
                numbers[i] = number(own if domains["cut"].iat[at] else f"{own}:{part}")
        code[inside] = numbers[which.ravel()]
    names = sorted(numbered)
    rank = np.empty(len(names) + 1, dtype=np.int32)
    rank[[numbered[name] for name in names]] = np.arange(len(names), dtype=np.int32)
    rank[-1] = -1  # code -1 stays -1
    for i in range(0, len(code), _LABEL_CHUNK):  # in place
        code[i : i + _LABEL_CHUNK] = rank[code[i : i + _LABEL_CHUNK]]
    return names, code


def _range_kinds(con: duckdb.DuckDBPyConnection, ranges: str) -> pd.DataFrame:
    """Each name and style of `ranges` with how many (n), in one GROUP BY."""
    return con.execute(f"SELECT name, style, count(*) AS n FROM ({ranges}) GROUP BY ALL").df()


def _coded_names(export: Export, store: EventStore, dropped) -> None:
    """The ranges with emit_nvtx's numbering cut from their names, read by the store's own connection in two
    passes: the names and styles used, then the ranges, their names joined to codes, inserted into the store, those
    whose times are not valid left out and counted. A parquetdir is read where it lies; an SQLite export's events
    are first copied (the ranges' query reads them three times a pass, each a walk of the file). Through
    temporary tables of every range's text and a copy a batch at a time, NeMo's 60M ranges at 10M kernels took
    51 s from a parquetdir and 67 s from SQLite, 1.4 GB at the peak; so, 26 and 51 s, 0.3 GB (benchmarks/ENGINE.md).
    Where the names are more than DuckDB's share groups at once (1.2M names, one a range, ran out), the ranges are
    cut once into a temporary table, and their names listed and joined a slice of their hash at a time."""
    styles = NVTX_STYLES
    style_codes = " ".join(f"WHEN '{style}' THEN {code}" for code, style in enumerate(styles))
    numbering = _quote(f"(?s){EMIT_NVTX_NUMBERING}")
    con = store.con.cursor()
    try:
        if isinstance(export, SqliteExport):
            load_sqlite_extension(con)
            con.execute(
                f"""CREATE TEMP TABLE nvtx_events AS SELECT start, "end", eventType, text, globalTid, textId, domainId
                    FROM {sqlite_scan(export.path, "NVTX_EVENTS")}"""  # every event: an open range ends at the last
            )
            source, strings = "temp.nvtx_events", sqlite_scan(export.path, "StringIds")
        else:
            source, strings = export.scans["NVTX_EVENTS"], export.scans["StringIds"]
        untyped = con.execute(f"SELECT count(*) FROM {source} WHERE eventType IS NULL").fetchone()[0]
        ranges = f"""SELECT * REPLACE (
                         CASE WHEN contains(name, ' = ') THEN regexp_replace(name, {numbering}, '') ELSE name END AS name,
                         CASE style {style_codes} ELSE -1 END AS style)
                     FROM ({_nvtx_ranges(source, strings)})"""
        slices = 1  # of the names' hash, each read and joined apart
        try:
            kinds = _range_kinds(con, ranges)
        except duckdb.OutOfMemoryException:  # more names than DuckDB's share groups: each range may have its own
            con.execute(f"CREATE TEMP TABLE nvtx_named AS {ranges}")  # cut once, then read a slice at a time
            ranges = "SELECT * FROM temp.nvtx_named"
            kinds = con.execute(
                f"SELECT style, count(*) AS n, approx_count_distinct(name) AS names FROM ({ranges}) GROUP BY ALL"
            ).df()
            slices = 1 + int(kinds["names"].sum() * 1.25) // memory_budget.summary_groups()  # HyperLogLog: +-2%
            kinds = pd.concat(
                [kinds]
                + [
                    con.execute(f"SELECT DISTINCT name FROM ({ranges}) WHERE hash(name) % {slices} = {part}").df()
                    for part in range(slices)
                ]
            )
        names = sorted(set(kinds["name"].dropna()))
        used = sorted(set(kinds["style"].dropna().astype(int)))
        total, kept = int(kinds["n"].sum()), 0
        if used:  # a range, so a style: a CASE needs a WHEN (events that are none of them ranges leave none)
            renumbered = " ".join(f"WHEN {style} THEN {i}" for i, style in enumerate(used))
            codes = pd.DataFrame({"name": pd.Series(names, dtype=object), "code": np.arange(len(names), dtype="int32")})
            for part in range(slices):
                sliced = f"hash(name) % {slices} = {part}" if slices > 1 else "true"
                kept += store.insert_select(
                    "nvtx_rows",
                    f"""SELECT r.start, r."end", n.code AS name_id, CASE r.style {renumbered} END AS style_id,
                            r.global_tid
                        FROM (SELECT * FROM ({ranges}) WHERE {sliced}) r
                        LEFT JOIN (SELECT * FROM nvtx_names WHERE {sliced}) n ON n.name = r.name
                        WHERE {valid_times_sql()}""",
                    con,
                    nvtx_names=codes,
                )
    finally:
        con.close()  # its temporary table with it
    count_dropped(dropped, "nvtx", total - kept + int(untyped))
    store.name_nvtx(names, [styles[style] for style in used])


# The columns each copy below decodes from the export's pages (_page_chunks).
OSRT_PAGE_COLUMNS = ["start", "end", "nameId", "globalTid", "eventClass"]
MEMOP_PAGE_COLUMNS = ["start", "end", "bytes", "deviceId", "streamId", "globalPid", "correlationId"]
MEMCPY_PAGE_COLUMNS = ["copyKind", "srcKind", "dstKind", *MEMOP_PAGE_COLUMNS]
MEMSET_PAGE_COLUMNS = ["memKind", *MEMOP_PAGE_COLUMNS]
SYNC_PAGE_COLUMNS = ["start", "end", "syncType", "deviceId", "streamId", "globalPid", "correlationId"]
# Every table the loader decodes from an SQLite export's pages: its columns and the bytes of pages a chunk (None:
# sqlite_pages.CHUNK_BYTES); NVTX_EVENTS' text too, as nvtx_text_codes. benchmarks/floor.py decodes them all.
PAGE_READS = (
    ("CUPTI_ACTIVITY_KIND_KERNEL", list(EXPORT_KERNEL_COLUMNS), None),
    ("CUPTI_ACTIVITY_KIND_RUNTIME", list(EXPORT_RUNTIME_COLUMNS), None),
    ("GPU_METRICS", list(EXPORT_METRIC_COLUMNS), None),
    ("SCHED_EVENTS", list(EXPORT_SCHED_COLUMNS), None),
    ("NVTX_EVENTS", NVTX_PAGE_COLUMNS, NVTX_CHUNK_BYTES),
    ("OSRT_API", OSRT_PAGE_COLUMNS, PAGE_ROWS_CHUNK_BYTES),
    ("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_PAGE_COLUMNS, PAGE_ROWS_CHUNK_BYTES),
    ("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET_PAGE_COLUMNS, PAGE_ROWS_CHUNK_BYTES),
    ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", SYNC_PAGE_COLUMNS, PAGE_ROWS_CHUNK_BYTES),
)


def _osrt(export: Export, strings: pd.DataFrame, store: EventStore, dropped) -> None:
    """OS-runtime calls into `store` (EventStore.osrt), a chunk at a time (_copy_numbered): NeMo's data workers
    make 4M calls at 10M kernels. Their names are StringIds' (the first value of an id given twice)."""
    if "OSRT_API" not in export.tables:
        return
    store.append("osrt_names", strings.drop_duplicates("id").rename(columns={"value": "name"}))
    # a call with no event class or a name that StringIds does not hold is damage (nsys writes neither): its
    # start is made NULL, so that it is left out as not valid and counted
    select = f"""SELECT CASE WHEN o.eventClass IS NULL OR NOT EXISTS (SELECT 1 FROM string_ids s WHERE s.id = o.nameId)
                             THEN NULL ELSE o.start END AS start,
                        o."end", o.nameId AS name_id, o.globalTid AS global_tid
                 FROM {{rows}} o WHERE o.eventClass = {OSRT_CALL_CLASS} OR o.eventClass IS NULL"""
    with frames_visible(export.reader, {"string_ids": strings[["id"]]}):
        _copy_numbered(export, store, "osrt_rows", [("OSRT_API", OSRT_PAGE_COLUMNS, select)])
    count_dropped(dropped, "osrt", store.delete_invalid("osrt_rows"))


def _memcpy_operations(export: Export, release: int) -> dict[int, str]:
    """The names `nsys stats` of the release that wrote the file gives each copyKind."""
    if release >= ENUM_MEMCPY_NAMES_SINCE and "ENUM_CUDA_MEMCPY_OPER" in export.tables:
        labels = _enum_labels(export, "ENUM_CUDA_MEMCPY_OPER", {})
        return {code: f"[CUDA memcpy {label}]" for code, label in labels.items()}
    return MEMCPY_OPERATIONS


def _memops(export: Export, release: int, store: EventStore, dropped) -> None:
    """Memory copies and sets into `store` (EventStore.memops), a chunk at a time (_copy_labelled): a
    memset-heavy trainer makes 1.5M at 10M kernels. Their kinds are read as codes (_Labels)."""
    common = (
        'start, "end", {op} AS operation_id, bytes, deviceId AS device_id, '
        "streamId AS stream_id, ((globalPid >> 24) & 16777215) AS pid, correlationId AS correlation_id, "
        "{kind} AS copy_kind_id, {src} AS src_kind_id, {dst} AS dst_kind_id"
    )
    memory_kinds = _enum_labels(export, "ENUM_CUDA_MEM_KIND", MEMORY_KIND_LABELS)
    labels = _Labels()
    parts = []
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in export.tables:
        op = labels.case("copyKind", _memcpy_operations(export, release), MEMCPY_OPERATIONS[0])
        columns = common.format(
            op=op,
            kind=labels.case("copyKind", MEMCPY_KINDS, MEMCPY_KINDS[0]),
            src=labels.case("srcKind", memory_kinds),
            dst=labels.case("dstKind", memory_kinds),
        )
        parts.append(("CUPTI_ACTIVITY_KIND_MEMCPY", MEMCPY_PAGE_COLUMNS, f"SELECT {columns} FROM {{rows}}"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in export.tables:
        columns = common.format(
            op=labels.constant(MEMSET_OPERATION),
            kind=labels.constant(MEMSET_KIND),
            src=labels.constant(None),
            dst=labels.case("memKind", memory_kinds),
        )
        parts.append(("CUPTI_ACTIVITY_KIND_MEMSET", MEMSET_PAGE_COLUMNS, f"SELECT {columns} FROM {{rows}}"))
    _copy_labelled(
        export, store, "memop", parts, labels, ("operation_id", "copy_kind_id", "src_kind_id", "dst_kind_id")
    )
    count_dropped(dropped, "memops", store.delete_invalid("memop_rows"))


def _sync(export: Export, store: EventStore, dropped) -> None:
    """CUDA synchronizations into `store` (EventStore.sync), a chunk at a time, as _memops."""
    if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" not in export.tables:
        return
    sync_types = _enum_labels(export, "ENUM_CUPTI_SYNC_TYPE", SYNC_TYPE_LABELS)
    labels = _Labels()
    select = f"""SELECT start, "end", {labels.case("syncType", sync_types, "Unknown")} AS sync_type_id,
                        deviceId AS device_id, streamId AS stream_id, ((globalPid >> 24) & 16777215) AS pid,
                        correlationId AS correlation_id FROM {{rows}}"""
    _copy_labelled(
        export,
        store,
        "sync",
        [("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", SYNC_PAGE_COLUMNS, select)],
        labels,
        ("sync_type_id",),
    )
    count_dropped(dropped, "sync", store.delete_invalid("sync_rows"))


def _copy_labelled(
    export: Export, store: EventStore, table: str, parts, labels: _Labels, coded: tuple[str, ...]
) -> None:
    """Each part's rows ((export table, columns read, select FROM {rows}), in order) into {table}_rows, as
    _copy_numbered copies them, `coded` columns' -1 (no label) as NULL; and `labels` into {table}_labels."""
    if not parts:
        return
    store.append(f"{table}_labels", pd.DataFrame({"id": np.arange(len(labels.labels)), "label": labels.labels}))
    _copy_numbered(
        export,
        store,
        f"{table}_rows",
        parts,
        lambda rows: rows.assign(**{c: rows[c].mask(rows[c] < 0).astype("Int16") for c in coded}),
    )


def _copy_numbered(export: Export, store: EventStore, table: str, parts, prepare=lambda rows: rows) -> None:
    """Each part's rows ((export table, columns read, select FROM {rows}), in order) into `table`, each made by
    `prepare` and numbered in that order (`row`): a page chunk at a time (_page_chunks), or, where the decoder does
    not read a table, a batch of the query over it at a time (_query_chunks)."""
    from sftprof.trace.nsys import sqlite_pages

    def copy(chunks) -> None:
        copied = 0
        for rows in chunks:
            store.append(table, prepare(rows).assign(row=np.arange(copied, copied + len(rows))))
            copied += len(rows)

    try:
        copy(
            chunk for export_table, read, select in parts for chunk in _page_chunks(export, export_table, read, select)
        )
    except sqlite_pages.Unsupported:
        store.clear(table)
        copy(
            chunk
            for export_table, _, select in parts
            for chunk in _query_chunks(export, select.format(rows=export_table))
        )


def _metric_names(export: Export) -> pd.DataFrame | None:
    """Newer exports' GPU metric names (TARGET_INFO_GPU_METRICS): type_id, metric_id, name, for the event
    store's copy of GPU_METRICS; None without both tables (2022.4 keeps GPU metrics as JSON in
    GENERIC_EVENTS, not read here)."""
    if not {"GPU_METRICS", "TARGET_INFO_GPU_METRICS"} <= export.tables:
        return None
    return export.query(
        """SELECT DISTINCT typeId AS type_id, metricId AS metric_id, CAST(metricName AS TEXT) AS name
           FROM TARGET_INFO_GPU_METRICS"""
    )


# TARGET_INFO_GPU column -> gpus column (nsys 2022.4 has them all; a column a release lacks is NA).
GPU_INFO_COLUMNS = {
    "id": "device_id",
    "name": "name",
    "chipName": "chip_name",
    "smCount": "sm_count",
    "totalMemory": "memory_bytes",
    "memoryBandwidth": "memory_bandwidth_bytes_per_s",
    "clockRate": "clock_hz",
    "computeMajor": "compute_major",
    "computeMinor": "compute_minor",
}


def _gpus(export: Export) -> pd.DataFrame:
    """The GPUs nsys saw on the target (TARGET_INFO_GPU): name, SMs, memory, clock. Empty without
    the table (a capture without CUDA). Names are read as text; anything in a number column that is
    not a non-negative integer is NA."""
    if "TARGET_INFO_GPU" not in export.tables:
        return empty("gpus")
    have = export.columns("TARGET_INFO_GPU")
    if "id" not in have:
        return empty("gpus")
    selected = ", ".join(
        f"CAST({column} AS TEXT) AS {name}" if name in ("name", "chip_name") else f"{column} AS {name}"
        for column, name in GPU_INFO_COLUMNS.items()
        if column in have
    )
    rows = export.query(f"SELECT {selected} FROM TARGET_INFO_GPU")
    major, minor = (
        pd.to_numeric(rows[c], errors="coerce") if c in rows else pd.Series(float("nan"), index=rows.index)
        for c in ("compute_major", "compute_minor")
    )
    rows["compute_capability"] = [
        f"{int(a)}.{int(b)}" if pd.notna(a) and pd.notna(b) and 0 <= a < 100 and 0 <= b < 100 else None
        for a, b in zip(major, minor, strict=True)
    ]
    return gpu_rows(rows)


def _sources(tables: set[str]) -> set[str]:
    sources = set()
    if "OSRT_API" in tables:
        sources.add("osrt")
    if "NVTX_EVENTS" in tables:
        sources.add("nvtx")
    if tables & {"CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL"}:
        sources.add("cuda")
    if "SCHED_EVENTS" in tables:
        sources.add("cpuctxsw")
    if "COMPOSITE_EVENTS" in tables:
        sources.add("sample")
    if "GPU_METRICS" in tables:
        sources.add("gpu_metrics")
    return sources


def load_nsys_sqlite(path: str | Path) -> TraceTables:
    """An `nsys export --type=sqlite` file's tables (see _load)."""
    path = Path(path)
    return _load(SqliteExport(path))


def load_nsys_parquetdir(path: str | Path) -> TraceTables:
    """An `nsys export --type=parquetdir` folder's tables (see _load): the same as its SQLite export's."""
    path = Path(path)
    return _load(ParquetExport(path))


def _load(export: Export) -> TraceTables:
    """The export's tables, without the rows whose times are not valid (events.valid_times_sql): those are
    counted in `dropped_rows`. An export SQLite or DuckDB cannot read is a TraceFormatError."""
    path = export.path
    dropped: dict[str, int] = {}
    try:
        tables = export.tables
        release = _nsys_release(_metadata(export), tables)
        strings = _strings(export)
        # The copy of kernels and API calls leaves part of a core idle: the small tables load meanwhile.
        with ThreadPoolExecutor(1) as copying:
            store = EventStore(on_disk=True)
            events = copying.submit(copy_export, export, strings, _metric_names(export), store)
            try:
                _nvtx(export, strings, store, dropped)
                _osrt(export, strings, store, dropped)
                _memops(export, release, store, dropped)
                _sync(export, store, dropped)
            except duckdb.Error as exc:  # the copy may have failed first (a full disk), and this for that reason
                raise _first_failure(exc, events) from None
            loaded = TraceTables(
                source_path=str(path),
                span_ns=_span_ns(export, dropped),
                sources=_sources(tables),
                threads=_threads(export, strings),
                gpus=_gpus(export),
                empty_trace_kinds=_empty_trace_kinds(strings),
                capture_settings=_capture_settings(export),
                events=events.result(),
            )
            store.checkpoint()
    except duckdb.OutOfMemoryException as exc:  # not damage: the budget's share was too small
        raise memory_budget.exceeded(exc) from None
    # UnicodeDecodeError: an error of SQLite or DuckDB whose message quotes damaged bytes
    except (sqlite3.DatabaseError, duckdb.Error, UnicodeDecodeError) as exc:  # a full disk is not damage either
        raise out_of_disk(exc) or TraceFormatError(f"{path}: damaged or truncated export ({one_line(exc)})") from None
    finally:
        export.close()
    loaded.dropped_rows = {**dropped, **loaded.events.dropped_rows}
    loaded.empty_trace_kinds = _still_empty(loaded, tables)
    return loaded


# The export's tables that hold each kind's rows, for kinds sftprof does not load itself.
_KIND_TABLES = {"cuDNN": ("CUDNN_EVENTS",), "cuBLAS": ("CUBLAS_EVENTS",), "OpenMP": ("OPENMP_EVENTS",)}


def _still_empty(loaded: TraceTables, tables: set[str]) -> dict[str, str]:
    """nsys writes "No X events collected" per process: a capture of a launcher and the trainer it starts
    (NeMo's data workers, torchrun) says so for every process that did not use X. Only kinds with no rows
    at all in the export recorded nothing."""
    recorded = {
        "CUDA": bool(
            loaded.events.count("kernels") or loaded.events.count("cuda_api") or loaded.events.count("memop_rows")
        ),
        "NVTX": bool(loaded.events.count("nvtx_rows")),
        "OSRT": bool(loaded.events.count("osrt_rows")),
    }
    recorded |= {kind: any(name in tables for name in names) for kind, names in _KIND_TABLES.items()}
    return {kind: message for kind, message in loaded.empty_trace_kinds.items() if not recorded.get(kind, False)}
