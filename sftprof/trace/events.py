"""Kernels, CUDA API calls, GPU metric samples, CPU context switches, NVTX ranges, OS-runtime calls, memory
operations and CUDA synchronizations: the tables that grow with a capture's length (tens of millions of rows
for minutes of a 7B fine-tuning job; `--gpu-metrics-devices` samples some twenty counters 10,000 times a
second; `--cpuctxsw` records every switch on every core; NeMo's emit_nvtx gives every op call a range, 60M at
10M kernels; a memset-heavy trainer makes 1.5M memory operations at 10M kernels),
kept in DuckDB so that analyses aggregate them in SQL or read them a batch at a time, never every row
at once.

The database is a temporary file (compressed on disk, under a memory limit, so memory stays
bounded whatever the trace size); an nsys export is copied in with one pass per table, reading
integer columns only, decoded straight from the file's pages (trace/nsys: store, sqlite_pages), or, from a
parquetdir export, by DuckDB's Parquet reader. Names are stored once,
as ids (benchmarks/ENGINE.md has the measurements behind these choices). This module knows no trace format:
the readers of each (trace/nsys, kineto.py) fill the store through its methods.

kernels   start, end, duration, name_id, short_name_id, mangled_name_id, device_id, stream_id,
          global_pid, pid, correlation_id, grid_x, grid_y, grid_z, block_x, block_y, block_z
cuda_api  start, end, duration, name_id, global_tid, pid, tid, correlation_id
gpu_metrics timestamp, device_id, metric_id, value   (empty where the samples stay in the export, an SQLite
          export's pages or a parquetdir's file, nsys.gpu_samples; metric_batches reads them from either)
sched     start, cpu, is_sched_in, global_tid, pid, tid   (a thread switched onto or off a core)
osrt      start, end, duration, name, name_id, global_tid, pid, tid, row   (OS-runtime calls: names from
          osrt_names by id; `row`, the order the export lists them in, breaks ties on start)
nvtx      start, end, duration, name_id, style_id, global_tid, pid, tid   (names and styles as the codes
          of the categories nvtx_categories() gives, NULL: no name; stored as the loader copied them,
          mostly by start; nvtx_frame lists them in NVTX_ORDER)
memops    start, end, duration, operation, bytes, device_id, stream_id, pid, correlation_id, copy_kind, src_kind,
          dst_kind, row   (tables.py's columns; labels stored as ids in memop_rows, named by memop_labels; `row`,
          the order the export lists them in, breaks ties on start)
sync      start, end, duration, sync_type, device_id, stream_id, pid, correlation_id, row   (as memops: sync_rows,
          sync_labels)
kernel_names, api_names, metric_names   id, name   (API names without the `_vNNNN` suffix that nsys
          stats strips; metric names as TARGET_INFO_GPU_METRICS gives them, e.g. "SM Issue [Throughput %]")
kernels, cuda_api, sched, osrt, memops and sync are views: duration, pid and tid are computed from the rows
stored in kernel_rows, cuda_api_rows, sched_rows, osrt_rows, memop_rows and sync_rows (as nsys lays out
globalTid; labels from their ids); nvtx adds duration, pid and tid to nvtx_rows, and, where the page reader wrote each range
once with codes of its own for names and styles (name_nvtx), maps them to their ids. Storing them, or declaring
them as generated columns, made the copy, the slowest part of loading, 10% slower.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import numpy as np
import pandas as pd

from sftprof import memory_budget, scratch
from sftprof.errors import SftprofError

# A time beyond ±2^53 ns (104 days) from the capture's origin belongs to no capture; keeping times
# within it keeps end - start, sums over a capture and their float64 copies exact.
MAX_TIME_NS = 2**53
MAX_THREADS = 8  # a login node is shared: do not take all its cores
# NVTX ranges of more threads than this are laid out by thread (EventStore.checkpoint). 6M ranges over 200 threads: a
# thread's window of ranges read in 2.2 ms, against 21 ms as loaded, for a sort of 1.2 s (about 60 reads of every
# range), where the analyses read each thread's ranges about 3 times over.
NVTX_THREADS_APART = 16
KERNEL_SHAPE = ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
KERNEL_NAME_IDS = ("name_id", "short_name_id", "mangled_name_id")
# A row's pid and tid, from its global_tid as every loader lays it out (pid << 24 | tid): computed in the views, not
# stored, since DuckDB pays per value inserted (NVTX ranges are the most numerous rows: NeMo's 60M at 10M kernels).
THREAD_IDS = "((global_tid >> 24) & 16777215)::INTEGER AS pid, (global_tid & 16777215)::INTEGER AS tid"
SCHEMA = {
    "kernel_rows": """start BIGINT, "end" BIGINT, name_id INTEGER, short_name_id INTEGER, mangled_name_id INTEGER,
                      device_id INTEGER, stream_id INTEGER, global_pid BIGINT, correlation_id BIGINT,
                      grid_x INTEGER, grid_y INTEGER, grid_z INTEGER, block_x INTEGER, block_y INTEGER,
                      block_z INTEGER""",
    "cuda_api_rows": """start BIGINT, "end" BIGINT, name_id INTEGER, global_tid BIGINT, correlation_id BIGINT""",
    "kernel_names": "id INTEGER PRIMARY KEY, name VARCHAR",
    "api_names": "id INTEGER PRIMARY KEY, name VARCHAR",
    "gpu_metrics": "timestamp BIGINT, device_id INTEGER, metric_id INTEGER, value DOUBLE",
    "metric_names": "id INTEGER PRIMARY KEY, name VARCHAR",
    "sched_rows": "start BIGINT, cpu BIGINT, is_sched_in BOOLEAN, global_tid BIGINT",
    "nvtx_rows": """start BIGINT, "end" BIGINT, name_id INTEGER, style_id TINYINT, global_tid BIGINT""",
    "osrt_rows": 'start BIGINT, "end" BIGINT, name_id BIGINT, global_tid BIGINT, "row" BIGINT',
    "osrt_names": "id BIGINT PRIMARY KEY, name VARCHAR",
    "memop_rows": """start BIGINT, "end" BIGINT, operation_id SMALLINT, bytes BIGINT, device_id BIGINT,
                     stream_id BIGINT, pid BIGINT, correlation_id BIGINT, copy_kind_id SMALLINT,
                     src_kind_id SMALLINT, dst_kind_id SMALLINT, "row" BIGINT""",
    "memop_labels": "id SMALLINT PRIMARY KEY, label VARCHAR",
    "sync_rows": """start BIGINT, "end" BIGINT, sync_type_id SMALLINT, device_id BIGINT, stream_id BIGINT,
                   pid BIGINT, correlation_id BIGINT, "row" BIGINT""",
    "sync_labels": "id SMALLINT PRIMARY KEY, label VARCHAR",
}
VIEWS = {
    "kernels": """SELECT *, "end" - start AS duration, ((global_pid >> 24) & 16777215)::INTEGER AS pid
                  FROM kernel_rows""",
    "cuda_api": f"""SELECT *, "end" - start AS duration, {THREAD_IDS} FROM cuda_api_rows""",
    "sched": f"""SELECT *, {THREAD_IDS} FROM sched_rows""",
    "nvtx": f"""SELECT start, "end", name_id, style_id, global_tid, {THREAD_IDS}, "end" - start AS duration
                FROM nvtx_rows""",
    "osrt": """SELECT r.start, r."end", r."end" - r.start AS duration, n.name, r.name_id, r.global_tid,
                      (r.global_tid >> 24) & 16777215 AS pid, r.global_tid & 16777215 AS tid, r."row"
               FROM osrt_rows r LEFT JOIN osrt_names n ON n.id = r.name_id""",
    "memops": """SELECT r.start, r."end", r."end" - r.start AS duration, o.label AS operation, r.bytes, r.device_id,
                        r.stream_id, r.pid, r.correlation_id, k.label AS copy_kind, s.label AS src_kind,
                        d.label AS dst_kind, r."row", r.operation_id, r.copy_kind_id, r.src_kind_id, r.dst_kind_id
                 FROM memop_rows r LEFT JOIN memop_labels o ON o.id = r.operation_id
                 LEFT JOIN memop_labels k ON k.id = r.copy_kind_id LEFT JOIN memop_labels s ON s.id = r.src_kind_id
                 LEFT JOIN memop_labels d ON d.id = r.dst_kind_id""",
    "sync": """SELECT r.start, r."end", r."end" - r.start AS duration, t.label AS sync_type, r.device_id, r.stream_id,
                      r.pid, r.correlation_id, r."row", r.sync_type_id
               FROM sync_rows r LEFT JOIN sync_labels t ON t.id = r.sync_type_id""",
}
# Their columns as tables.py lists them (the views add `row`, the order the export lists them in).
MEMOP_COLUMNS = (
    'start, "end", duration, operation, bytes, device_id, stream_id, pid, correlation_id, copy_kind, src_kind, dst_kind'
)
SYNC_COLUMNS = 'start, "end", duration, sync_type, device_id, stream_id, pid, correlation_id'
# Their text columns -> the id columns stored (EventStore.add_labelled)
MEMOP_LABELS = {
    "operation": "operation_id",
    "copy_kind": "copy_kind_id",
    "src_kind": "src_kind_id",
    "dst_kind": "dst_kind_id",
}
SYNC_LABELS = {"sync_type": "sync_type_id"}
# The order the loaders list NVTX ranges in (a missing name first): ties on start go to the longer range.
NVTX_ORDER = 'start, "end" DESC, global_tid, coalesce(name_id, -1), style_id'
NVTX_INSERT_ROWS = 1 << 22  # add_nvtx copies a frame into the store this many rows at a time
STORED_COLUMNS = {table: [part.split()[0].strip('"') for part in schema.split(",")] for table, schema in SCHEMA.items()}


# A GPU metric sample as EventStore.metric_batches gives it, a column each.
METRIC_SAMPLE = ("device_id", "timestamp", "metric_id", "value")
MEMSET_KIND = "memset"  # a memset's copy_kind
_KIND_IN_OPERATION = re.compile(r"memcpy (\w+)")
VECTOR_ROWS = 2048  # DuckDB's vector
BATCH_VECTORS = 256  # EventStore.batches: rows fetched at a time, in vectors (524k rows)


class EventStoreError(SftprofError, RuntimeError):
    """DuckDB or its sqlite extension is missing or unusable."""


def out_of_disk(error: Exception) -> EventStoreError | None:
    """The error to give for a DuckDB error or an OSError that says the disk under the store, its spill folder or
    the busy-time files (analysis.spilled) is full, a problem of the machine, not of the trace; None for any
    other error."""
    full = (
        isinstance(error, duckdb.Error) and "No space left on device" in str(error)  # IO, transaction or fatal
    ) or (isinstance(error, OSError) and error.errno == errno.ENOSPC)
    if not full:
        return None
    return EventStoreError(
        f"no space left on the disk of the temporary folder {tempfile.gettempdir()} for the analysis' database "
        "(about 30 MB per million kernels, 15 per million NVTX ranges, 16 per million busy intervals): free "
        "space there, or set TMPDIR to a folder on a larger disk"
    )


def _nullable(codes: np.ndarray) -> pd.arrays.IntegerArray:
    """Category codes as ids, NULL where -1 (none)."""
    return pd.arrays.IntegerArray(codes.astype(np.int64), codes < 0)


def copy_kind_of(operation) -> str:
    """A memory operation's copy kind ("HtoD"..., MEMSET_KIND) read from its name as nsys 2022.4 gives it
    ("[CUDA memcpy HtoD]", "[CUDA memset]"): for a source that names operations only (Kineto)."""
    text = str(operation)
    if "memset" in text:
        return MEMSET_KIND
    kind = _KIND_IN_OPERATION.search(text)
    return kind.group(1) if kind else "Unknown"


def labelled(frame: pd.DataFrame, columns: dict[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`frame` with each text column of `columns` (text column -> id column) as ids, and the labels they
    number (id, label): for memop_rows and sync_rows, whose few labels repeat over every row."""
    texts = [frame[column].astype("object") for column in columns]
    _, labels = pd.factorize(pd.concat([*texts, pd.Series(dtype=object)]).dropna().astype(str))
    ids = {label: i for i, label in enumerate(labels)}
    coded = frame.assign(
        **{
            ids_column: text.map(lambda v: ids.get(str(v)) if pd.notna(v) else None).astype("Int16")
            for text, ids_column in zip(texts, columns.values(), strict=True)
        }
    )
    return coded, pd.DataFrame({"id": np.arange(len(labels), dtype="int16"), "label": list(labels)})


def labelled_columns(table: str, alias: str = "") -> tuple[str, dict[str, str]]:
    """The memory operations' or synchronizations' ("memops", "sync") columns in tables.py's order, as SQL
    over the view (as `alias`, if given) with each label as its id, and the labels for EventStore.named."""
    columns, labels, label_table = (
        (MEMOP_COLUMNS, MEMOP_LABELS, "memop_labels")
        if table == "memops"
        else (SYNC_COLUMNS, SYNC_LABELS, "sync_labels")
    )
    prefix = f"{alias}." if alias else ""
    sql = ", ".join(
        f"coalesce({prefix}{labels[c]}, -1) AS {c}" if c in labels else f"{prefix}{c}" for c in columns.split(", ")
    )
    return sql, dict.fromkeys(labels, f"SELECT id, label FROM {label_table}")


def sql_text(value) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def sql_in(column: str, values) -> str:
    """SQL: `column` is one of `values` (integers or text); false for none."""
    values = [str(int(v)) if isinstance(v, int | np.integer) else sql_text(v) for v in dict.fromkeys(values)]
    return f"{column} IN ({', '.join(values)})" if values else "false"


def valid_times_sql(start: str = "start", end: str = '"end"') -> str:
    """SQL that holds for a row with both times known, in order and within ±MAX_TIME_NS; false for the
    rest (a damaged or edited export), which every loader leaves out and counts."""
    return f"coalesce({start} BETWEEN -{MAX_TIME_NS} AND {end} AND {end} <= {MAX_TIME_NS}, false)"


def _numbers(values: pd.Series) -> pd.Series:
    """`values` as numbers, NaN for anything else; int64 as it is (to_numeric copies: 60M NVTX ranges)."""
    return values if values.dtype == np.int64 else pd.to_numeric(values, errors="coerce")


def valid_times(start: pd.Series, end: pd.Series | None = None) -> np.ndarray:
    """valid_times_sql for a pandas table (`end` None: point events); anything not a number is invalid."""
    start = _numbers(start)
    end = start if end is None else _numbers(end)
    return ((start >= -MAX_TIME_NS) & (start <= end) & (end <= MAX_TIME_NS)).fillna(False).to_numpy(bool)


def usable_cores() -> int:
    """The cores this process may run on: a Slurm step's, a container's or taskset's share, not the
    machine's (os.cpu_count, which DuckDB's own default follows: `srun -c 2` on a 72-core node would
    have had 8 threads)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform (macOS)
        return os.cpu_count() or 1


def bound(con: duckdb.DuckDBPyConnection, spill_folder: str | None) -> None:
    """Hold DuckDB to its share of the memory budget and to the usable cores, at most MAX_THREADS and as many as
    that share holds; what does not fit spills into `spill_folder` (a private temporary folder: DuckDB's default
    for an in-memory database is `.tmp` in the working directory)."""
    settings = {
        "threads": memory_budget.duckdb_threads(min(usable_cores(), MAX_THREADS)),
        "memory_limit": memory_budget.duckdb_limit(),
    }
    if spill_folder:
        settings["temp_directory"] = spill_folder
    for name, value in settings.items():
        con.execute(f"SET {name} = '{value}'")


def _launch_shape(x, y, z) -> str | None:
    if any(pd.isna(v) for v in (x, y, z)):
        return None
    return f"{int(x):4d} {int(y):4d} {int(z):4d}"


def with_launch_shapes(frame: pd.DataFrame) -> pd.DataFrame:
    """`grid` and `block` as nsys stats prints them ("%4d %4d %4d"), in place of the six
    KERNEL_SHAPE columns."""
    for prefix in ("grid", "block"):
        axes = [frame[f"{prefix}_{axis}"] for axis in "xyz"]
        frame[prefix] = [_launch_shape(x, y, z) for x, y, z in zip(*axes)]
    return frame.drop(columns=list(KERNEL_SHAPE))


@contextmanager
def frames_visible(con, frames: dict[str, pd.DataFrame]):
    """Pandas frames registered as tables of `con` for the duration of a query."""
    for name, frame in frames.items():
        con.register(name, frame)
    try:
        yield
    finally:
        for name in frames:
            con.unregister(name)


class EventStore:
    """The kernels and cuda_api tables of one trace (see the module docstring)."""

    def __init__(self, on_disk: bool):
        self._folder = scratch.folder("events") if on_disk else None
        database = os.path.join(self._folder, "events.duckdb") if on_disk else ":memory:"
        self.con = duckdb.connect(database)
        # One cursor per thread that reads: a DuckDB connection object must not run two queries at once,
        # and analyses run side by side.
        self._cursors: dict[int, duckdb.DuckDBPyConnection] = {}
        self._cursors_lock = threading.Lock()
        self.dropped_rows: dict[str, int] = {}  # rows left out by nsys.store, by table (kernels, cuda_api)
        self._names: dict[str, pd.DataFrame] = {}  # used_names, by table
        self._names_lock = threading.Lock()
        self._nvtx_categories: tuple[list, list] = ([], [])  # NVTX names and styles, by name_id and style_id
        self._samples = None  # GPU metric samples left in the export (nsys.gpu_samples), if they were
        self._also: list[str] = []  # folders the store's rows are read from while it lives (remove_on_close)
        self._finalizer = weakref.finalize(self, EventStore._release, self.con, self._cursors, self._folder, self._also)
        bound(self.con, self._folder)
        self.con.execute("SET preserve_insertion_order = false")
        for table, schema in SCHEMA.items():
            self.con.execute(f"CREATE TABLE {table} ({schema})")
        for view, sql in VIEWS.items():
            self.con.execute(f"CREATE VIEW {view} AS {sql}")

    @staticmethod
    def _release(con, cursors, folder, also):
        for cursor in cursors.values():
            cursor.close()
        con.close()
        for path in [folder, *also] if folder else also:
            shutil.rmtree(path, ignore_errors=True)

    def close(self) -> None:
        self._finalizer()

    def remove_on_close(self, folder: str) -> None:
        """Remove `folder` with the store: a temporary export whose pages the analysis still reads."""
        self._also.append(folder)

    # ------------------------------------------------------------------ filling

    @classmethod
    def from_frames(
        cls,
        kernels: pd.DataFrame | None = None,
        cuda_api: pd.DataFrame | None = None,
        gpu_metrics: pd.DataFrame | None = None,
        sched: pd.DataFrame | None = None,
        nvtx: pd.DataFrame | None = None,
        osrt: pd.DataFrame | None = None,
        memops: pd.DataFrame | None = None,
        sync: pd.DataFrame | None = None,
    ) -> EventStore:
        """From normalized pandas tables (tables.py's columns, names as text): traces small enough
        to hold in memory (PyTorch profiler traces, tests). A memory operation without a copy_kind gets
        the one its name says (copy_kind_of)."""
        store = cls(on_disk=False)
        if memops is not None and len(memops):
            given = memops["copy_kind"] if "copy_kind" in memops else pd.Series(None, index=memops.index, dtype=object)
            memops = memops.assign(
                copy_kind=given.astype("object").fillna(memops["operation"].map(copy_kind_of)),
                **{c: memops[c] if c in memops else None for c in ("src_kind", "dst_kind")},
            )
            store.add_labelled("memop", memops, MEMOP_LABELS)
        if sync is not None and len(sync):
            store.add_labelled("sync", sync, SYNC_LABELS)
        if osrt is not None and len(osrt):
            codes, names = pd.factorize(osrt["name"])
            store.append(
                "osrt_names", pd.DataFrame({"id": np.arange(len(names)), "name": pd.Series(names, dtype=object)})
            )
            rows = osrt[["start", "end", "global_tid"]].assign(name_id=_nullable(codes), row=np.arange(len(osrt)))
            store.append("osrt_rows", rows)
        if nvtx is not None and len(nvtx):
            store.add_nvtx(nvtx)
        if sched is not None and len(sched):
            store._insert("sched_rows", sched)
        if gpu_metrics is not None and len(gpu_metrics):
            codes, uniques = pd.factorize(gpu_metrics["metric"].astype(str))
            rows = gpu_metrics[["timestamp", "device_id", "value"]].assign(metric_id=codes)
            store._insert("gpu_metrics", rows)
            store._insert("metric_names", pd.DataFrame({"id": range(len(uniques)), "name": list(uniques)}))
        if kernels is not None and len(kernels):
            kernels = kernels.reset_index(drop=True)
            names = pd.concat(
                [kernels[c] for c in ("name", "short_name", "mangled_name") if c in kernels]
                + [pd.Series(dtype="object")]
            )
            _, uniques = pd.factorize(names.dropna().astype(str))
            ids = {name: i for i, name in enumerate(uniques)}
            rows = pd.DataFrame(
                {
                    c: kernels[c] if c in kernels else None
                    for c in ("start", "end", "device_id", "stream_id", "correlation_id")
                }
            )
            rows["global_pid"] = (
                (pd.to_numeric(kernels["pid"]).astype("Int64") * (1 << 24)) if "pid" in kernels else None
            )
            for column, name_column in zip(KERNEL_NAME_IDS, ("name", "short_name", "mangled_name")):
                text = kernels[name_column] if name_column in kernels else pd.Series(None, index=kernels.index)
                rows[column] = text.map(lambda v: ids.get(str(v)) if pd.notna(v) else None).astype("Int64")
            for prefix in ("grid", "block"):
                shape = kernels[prefix] if prefix in kernels else pd.Series(None, index=kernels.index)
                parts = shape.astype("string").str.split(expand=False)
                for i, axis in enumerate("xyz"):
                    rows[f"{prefix}_{axis}"] = pd.to_numeric(parts.str[i], errors="coerce").astype("Int64")
            store._insert("kernel_rows", rows)
            store._insert("kernel_names", pd.DataFrame({"id": range(len(uniques)), "name": list(uniques)}))
        if cuda_api is not None and len(cuda_api):
            cuda_api = cuda_api.reset_index(drop=True)
            codes, uniques = pd.factorize(cuda_api["name"].astype(str))
            rows = pd.DataFrame(
                {c: cuda_api[c] if c in cuda_api else None for c in ("start", "end", "global_tid", "correlation_id")}
            )
            rows["name_id"] = codes
            store._insert("cuda_api_rows", rows)
            store._insert("api_names", pd.DataFrame({"id": range(len(uniques)), "name": list(uniques)}))
        return store

    def add_labelled(self, table: str, rows: pd.DataFrame, columns: dict[str, str]) -> None:
        """`rows` (tables.py's memops or sync columns, labels as text) into {table}_rows and {table}_labels,
        numbered in their order."""
        coded, labels = labelled(rows.reset_index(drop=True), columns)
        self.append(f"{table}_labels", labels)
        numbered = coded.assign(**{"row": np.arange(len(coded))})
        self.append(
            f"{table}_rows",
            numbered.assign(**{c: numbered[c] if c in numbered else None for c in STORED_COLUMNS[f"{table}_rows"]}),
        )

    def add_nvtx(self, ranges: pd.DataFrame) -> None:
        """Copy NVTX ranges (tables.py's nvtx columns; names and styles categorical, as the loaders make
        them, or text) into the store, in the order given, NVTX_INSERT_ROWS at a time: the loaders list
        them by start, so DuckDB skips the row groups outside a window of time (analysis.nvtx's windows).
        Through a cursor of its own: a loader may copy other tables in meanwhile."""
        codes, categories = {}, {}
        for column in ("name", "style"):
            values = ranges[column]
            if not isinstance(values.dtype, pd.CategoricalDtype):
                values = values.astype("category")  # text: its distinct values, sorted
            codes[column], categories[column] = values.cat.codes.to_numpy(), list(values.cat.categories)
        self.name_nvtx(categories["name"], categories["style"])
        for lo in range(0, len(ranges), NVTX_INSERT_ROWS):
            part = slice(lo, lo + NVTX_INSERT_ROWS)
            rows = ranges.iloc[part][["start", "end", "global_tid"]]
            self.append(
                "nvtx_rows",
                rows.assign(name_id=_nullable(codes["name"][part]), style_id=_nullable(codes["style"][part])),
            )

    def name_nvtx(self, names: list, styles: list, coded: tuple | None = None) -> None:
        """The NVTX names and styles that the rows' name_id and style_id number (a loader that copied the rows
        itself). `coded`: where the rows hold the loader's own codes instead (the page reader writes each range
        once, before the names are known): (every name code the rows use, the name id of each, -1 for none;
        style codes, in the order of `styles`), through which the nvtx view then maps them (an inner join:
        a third of a left join's time over NeMo's 60M ranges)."""
        self._nvtx_categories = (list(names), list(styles))
        if coded is None or not len(coded[0]):  # no rows: nothing to map
            return
        codes, name_ids, style_codes = coded
        mapped = pd.DataFrame({"code": codes, "name_id": pd.arrays.IntegerArray(name_ids, name_ids < 0)})
        style_ids = " ".join(f"WHEN {int(code)} THEN {i}" for i, code in enumerate(style_codes))
        with self.con.cursor() as cursor, frames_visible(cursor, {"mapped": mapped}):
            cursor.execute(
                "CREATE OR REPLACE TABLE nvtx_name_codes AS SELECT code::INTEGER AS code, name_id::INTEGER AS name_id "
                "FROM mapped"
            )
            cursor.execute(f"""
                CREATE OR REPLACE VIEW nvtx AS
                SELECT r.start, r."end", n.name_id,
                       (CASE r.style_id {style_ids} END)::TINYINT AS style_id,
                       r.global_tid, {THREAD_IDS}, r."end" - r.start AS duration
                FROM nvtx_rows r JOIN nvtx_name_codes n ON n.code = r.name_id""")  # every code: no row lost

    def clear(self, table: str) -> None:
        """No rows in `table`: a loader's copy given up part way (its own cursor, as append)."""
        with self.con.cursor() as cursor:
            cursor.execute(f"DELETE FROM {table}")

    def delete_invalid(self, table: str, valid: str | None = None) -> int:
        """Delete the rows of `table` for which `valid` (SQL; default: valid_times_sql) does not hold; how many
        there were (its own cursor, as append)."""
        with self.con.cursor() as cursor:
            return int(cursor.execute(f"DELETE FROM {table} WHERE NOT ({valid or valid_times_sql()})").fetchone()[0])

    def clear_nvtx(self) -> None:
        """No NVTX ranges: a loader's copy given up part way."""
        self.clear("nvtx_rows")
        with self.con.cursor() as cursor:
            cursor.execute(f"CREATE OR REPLACE VIEW nvtx AS {VIEWS['nvtx']}")
            cursor.execute("DROP TABLE IF EXISTS nvtx_name_codes")
        self._nvtx_categories = ([], [])

    def append(self, table: str, frame: pd.DataFrame) -> None:
        """Add `frame`'s rows (the table's stored columns) to `table`, through a cursor of its own: a loader
        may copy other tables in meanwhile."""
        columns = ", ".join(f'"{c}"' for c in STORED_COLUMNS[table])
        with self.con.cursor() as cursor, frames_visible(cursor, {"incoming": frame}):
            cursor.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM incoming")

    def insert_select(self, table: str, select: str, cursor: duckdb.DuckDBPyConnection, **frames: pd.DataFrame) -> int:
        """Add the rows of `select` (SQL giving the table's stored columns; keyword frames visible to it) to `table`,
        through `cursor`, one of this store's (`select` may read its temporary tables); how many."""
        columns = ", ".join(f'"{c}"' for c in STORED_COLUMNS[table])
        with frames_visible(cursor, frames):
            return int(
                cursor.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM ({select})").fetchone()[0]
            )

    def _insert(self, table: str, frame: pd.DataFrame) -> None:
        columns = STORED_COLUMNS[table]
        self.con.register("incoming", frame[columns])
        try:
            quoted = ", ".join(f'"{c}"' for c in columns)
            self.con.execute(f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM incoming")
        finally:
            self.con.unregister("incoming")

    def checkpoint(self) -> None:
        """Write what was copied in to the database file, compressed: the analyses then read it from there. NVTX
        ranges of more than NVTX_THREADS_APART threads are first laid out by thread: the analyses read a thread's
        ranges a window at a time, and each read then finds the thread in its own row groups, not in every one."""
        threads = self.con.execute("SELECT count(DISTINCT global_tid) FROM nvtx_rows").fetchone()[0]
        if threads > NVTX_THREADS_APART:
            self.con.execute('CREATE TABLE nvtx_by_thread AS SELECT * FROM nvtx_rows ORDER BY global_tid, start, "end"')
            self.con.execute("DROP TABLE nvtx_rows")  # the nvtx view reads it by name
            self.con.execute("ALTER TABLE nvtx_by_thread RENAME TO nvtx_rows")
        self.con.execute("CHECKPOINT")

    # ------------------------------------------------------------------ reading

    def _reader(self) -> duckdb.DuckDBPyConnection:
        """The calling thread's cursor (frames registered on it are visible to that thread only)."""
        with self._cursors_lock:
            thread = threading.get_ident()
            if thread not in self._cursors:
                self._cursors[thread] = self.con.cursor()
            return self._cursors[thread]

    def query(self, sql: str, **frames: pd.DataFrame) -> pd.DataFrame:
        """Run `sql`; keyword frames are visible to it as tables of that name. Safe from several threads."""
        reader = self._reader()
        with frames_visible(reader, frames):
            return reader.sql(sql).df()

    def arrays(self, sql: str, **frames: pd.DataFrame) -> dict[str, np.ndarray]:
        """The result of `sql`, which must hold no NULLs, as one numpy array per column: for rows that
        numpy works through faster than SQL (binary search, running unions)."""
        reader = self._reader()
        with frames_visible(reader, frames):
            return {name: np.asarray(values) for name, values in reader.sql(sql).fetchnumpy().items()}

    def sorted_arrays(self, key: str, sql: str, **frames: pd.DataFrame) -> dict[str, np.ndarray]:
        """arrays(sql) with its rows in a stable order by column `key` (ties in the order fetched). Sorted
        here, not by DuckDB: rows that come nearly in order (kernels are stored as the export lists them)
        are found so by numpy's stable sort, 3x faster than ORDER BY at 4M kernels; they are moved only
        when out of order, a column at a time."""
        rows = self.arrays(sql, **frames)
        order = np.argsort(rows[key], kind="stable")
        if (order[1:] < order[:-1]).any():
            for column in list(rows):
                rows[column] = rows.pop(column)[order]
        return rows

    def batches(self, sql: str, **frames: pd.DataFrame) -> Iterator[pd.DataFrame]:
        """The result of `sql` a batch of rows at a time (BATCH_VECTORS), in its order: for sums
        over more rows than memory should hold at once. Through a cursor of its own: a query the
        caller runs between two batches (on its thread's cursor) would end this one's result."""
        with self.con.cursor() as cursor, frames_visible(cursor, frames):
            result = cursor.execute(sql)
            while len(batch := result.fetch_df_chunk(BATCH_VECTORS)):
                yield batch

    def used_names(self, table: str) -> pd.DataFrame:
        """The names the rows of `table` use, worked out once per store (one scan of the table; several
        analyses ask): for "cuda_api", id and name; for "kernels", each distinct name_id and
        short_name_id (-1 for NULL) with their `name` and `short_name` (None where unknown). A few
        dozen rows, whatever the trace size. Safe from several threads."""
        with self._names_lock:
            if table not in self._names:
                if table == "cuda_api":
                    sql = "SELECT id, name FROM api_names WHERE id IN (SELECT DISTINCT name_id FROM cuda_api)"
                elif table == "kernels":
                    sql = """SELECT coalesce(t.name_id, -1)::BIGINT AS name_id,
                                    coalesce(t.short_name_id, -1)::BIGINT AS short_name_id,
                                    n.name, s.name AS short_name
                             FROM (SELECT DISTINCT name_id, short_name_id FROM kernels) t
                             LEFT JOIN kernel_names n ON n.id = t.name_id
                             LEFT JOIN kernel_names s ON s.id = t.short_name_id"""
                else:
                    raise KeyError(table)
                self._names[table] = self.query(sql)
            return self._names[table].copy(deep=False)

    def nvtx_categories(self) -> tuple[list, list]:
        """Every NVTX range name at its name_id (a few hundred once emit_nvtx's numbering is cut), and every
        style at its style_id."""
        return self._nvtx_categories

    def nvtx_frame(self, where: str = "true", **frames: pd.DataFrame) -> pd.DataFrame:
        """The NVTX ranges for which `where` holds (SQL over the nvtx view; keyword frames visible to it), in
        tables.py's nvtx columns and NVTX_ORDER, names and styles categorical as the loaders made them."""
        rows = self.query(
            f"""SELECT start, "end", duration, coalesce(name_id, -1) AS name_id, coalesce(style_id, -1) AS style_id,
                       global_tid, pid, tid FROM nvtx WHERE {where} ORDER BY {NVTX_ORDER}""",
            **frames,
        )
        for column, categories in zip(("name", "style"), self._nvtx_categories, strict=True):
            rows[column] = pd.Categorical.from_codes(rows.pop(f"{column}_id").to_numpy("int64"), categories)
        return rows[["start", "end", "duration", "name", "style", "global_tid", "pid", "tid"]]

    def osrt_frame(self, where: str = "true") -> pd.DataFrame:
        """The OS-runtime calls for which `where` holds (SQL over the osrt view), in tables.py's osrt columns,
        by start (ties in the export's order)."""
        return self.query(f"""SELECT start, "end", duration, name, global_tid, pid, tid FROM osrt WHERE {where}
                              ORDER BY start, "row" """)

    def labelled_frame(self, table: str, where: str = "true") -> pd.DataFrame:
        """The memory operations or synchronizations ("memops", "sync") for which `where` holds (SQL over the
        view), in tables.py's columns, by start (ties in the export's order)."""
        columns, labels = labelled_columns(table)
        return self.named(f'SELECT {columns} FROM {table} WHERE {where} ORDER BY start, "row"', labels)

    def named(self, sql: str, labels: dict[str, str], **frames: pd.DataFrame) -> pd.DataFrame:
        """`sql`'s result with each column of `labels`, ids (-1: none), replaced by the text its SQL (id, label)
        gives each id. DuckDB makes a Python string of each row's text (72 bytes: 0.12 GB for the four label
        columns of 0.4M copies), where here one of a few repeats."""
        frame = self.query(sql, **frames)
        known = {label_sql: self.query(label_sql) for label_sql in set(labels.values())}  # each label table once
        for column, label_sql in labels.items():
            ids, ids_known = frame[column].to_numpy("int64"), known[label_sql]["id"].to_numpy("int64")
            text = np.full(max(ids.max(initial=-1), ids_known.max(initial=-1)) + 2, None, dtype=object)
            text[ids_known] = known[label_sql]["label"].to_numpy(object)  # the last slot stays None: id -1
            frame[column] = pd.array(text[ids], dtype="str")
        return frame

    def count(self, table: str) -> int:
        if table == "gpu_metrics" and self._samples is not None:
            return self._samples.rows
        return int(self._reader().execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    def metric_batches(self) -> Iterator[dict[str, np.ndarray]]:
        """The GPU metric samples a batch at a time, as device_id, timestamp, metric_id (int64) and value
        (float64, NaN for none): from the export where the loader left them there, else from the store.
        Each batch's arrays may be reused for the next."""
        if self._samples is not None:
            yield from self._samples.batches(self)
        else:
            yield from self.sample_batches(f"SELECT {', '.join(METRIC_SAMPLE)} FROM gpu_metrics")

    def sample_batches(self, sql: str) -> Iterator[dict[str, np.ndarray]]:
        """batches(sql), whose columns are METRIC_SAMPLE's, as metric_batches gives them."""
        for batch in self.batches(sql):
            yield {name: batch[name].to_numpy("float64" if name == "value" else "int64") for name in METRIC_SAMPLE}

    def frame(self, table: str) -> pd.DataFrame:
        """A whole table with its names as text, in tables.py's columns: for small traces and tests
        (analyses aggregate in SQL instead)."""
        if table == "kernels":
            frame = self.query(f"""
                SELECT k.start, k."end", k.duration, n.name, s.name AS short_name, m.name AS mangled_name,
                       k.device_id, k.stream_id, k.pid, k.correlation_id, {", ".join(KERNEL_SHAPE)}
                FROM kernels k LEFT JOIN kernel_names n ON n.id = k.name_id
                LEFT JOIN kernel_names s ON s.id = k.short_name_id LEFT JOIN kernel_names m ON m.id = k.mangled_name_id
                ORDER BY k.start""")
            return with_launch_shapes(frame)
        if table == "cuda_api":
            return self.query("""
                SELECT a.start, a."end", a.duration, n.name, a.global_tid, a.pid, a.tid, a.correlation_id
                FROM cuda_api a LEFT JOIN api_names n ON n.id = a.name_id ORDER BY a.start""")
        if table == "sched":
            return self.query("SELECT start, cpu, is_sched_in, global_tid, pid, tid FROM sched ORDER BY start")
        if table == "nvtx":
            return self.nvtx_frame()
        if table == "osrt":
            return self.osrt_frame()
        if table in ("memops", "sync"):
            return self.labelled_frame(table)
        if table == "gpu_metrics":
            samples = pd.concat(
                [pd.DataFrame(batch).copy() for batch in self.metric_batches()]
                or [
                    pd.DataFrame(
                        {name: np.empty(0, "float64" if name == "value" else "int64") for name in METRIC_SAMPLE}
                    )
                ]
            )
            return self.query(
                """SELECT g.timestamp, g.device_id::INTEGER AS device_id, n.name AS metric, g.value::DOUBLE AS value
                   FROM samples g LEFT JOIN metric_names n ON n.id = g.metric_id
                   ORDER BY g.timestamp, g.device_id, n.name, g.value""",
                samples=samples,
            )
        raise KeyError(table)
