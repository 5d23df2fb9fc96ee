"""The copy of an nsys export's tables that grow with a capture (kernels, CUDA runtime calls, GPU metric samples,
CPU context switches) into the event store (trace/events.py), from either format: an SQLite file's pages
(sqlite_pages, or DuckDB's SQLite reader where the decoder does not read them) or a parquetdir's files
(DuckDB's Parquet reader). GPU metric samples stay in the export (gpu_samples).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from sftprof.trace.events import KERNEL_SHAPE, EventStore, frames_visible, valid_times_sql
from sftprof.trace.nsys.nsys_export import (
    EXPORT_KERNEL_COLUMNS,
    EXPORT_METRIC_COLUMNS,
    EXPORT_RUNTIME_COLUMNS,
    EXPORT_SCHED_COLUMNS,
    ParquetExport,
    SqliteExport,
    load_sqlite_extension,
    sqlite_scan,
)

MISSING_KERNEL_NAME = "(kernel name not in StringIds: id "  # the name of a kernel whose name id names nothing


def copy_export(
    export: SqliteExport | ParquetExport, strings: pd.DataFrame, metrics: pd.DataFrame | None, store: EventStore
) -> EventStore:
    """The export's kernels, runtime-API rows, GPU metric samples and context switches into `store`
    (from_nsys_sqlite or from_nsys_parquet, by the export's format)."""
    if isinstance(export, SqliteExport):
        return from_nsys_sqlite(export.path, export.tables, strings, metrics, store)
    return from_nsys_parquet(export.scans, strings, metrics, store, export.files)


def _copy_rows(
    cursor: duckdb.DuckDBPyConnection, path: Path, table: str, export_table: str, columns: tuple[str, ...], insert: str
) -> None:
    """Run `insert` (INSERT INTO `table` ... FROM {rows}) over `columns` of the export's
    `export_table`: decoded from the file's pages a chunk at a time (sqlite_pages), or, when the file
    holds something that decoder does not read, through DuckDB's SQLite reader."""
    from sftprof.trace.nsys import sqlite_pages  # imports numba (0.4 s): only when an export is read

    try:
        for chunk in sqlite_pages.int_columns(path, export_table, list(columns)):
            with frames_visible(cursor, {"export_rows": chunk}):
                cursor.execute(insert.format(rows="export_rows"))
    except sqlite_pages.Unsupported:
        cursor.execute(f"DELETE FROM {table}")
        cursor.execute(insert.format(rows=sqlite_scan(path, export_table)))


def from_nsys_sqlite(
    path: Path,
    present: set[str],
    strings: pd.DataFrame,
    metrics: pd.DataFrame | None,
    store: EventStore | None = None,
) -> EventStore:
    """Copy the kernels, runtime-API rows, GPU metric samples and context switches of an nsys SQLite export
    (`present`: its table names; `strings`: its StringIds as id, value; `metrics`: its metric names, as
    _from_nsys says, and `store`); each table read by _copy_rows, but for the GPU metric samples, which stay in
    the export (gpu_samples)."""
    from sftprof.trace.nsys.gpu_samples import PageSamples  # imports numba: only when an export is read

    return _from_nsys(
        present,
        strings,
        metrics,
        lambda cursor, table, export_table, columns, insert: _copy_rows(
            cursor, path, table, export_table, columns, insert
        ),
        load_sqlite_extension,
        store,
        read_samples=lambda cursor, named: PageSamples.read(path, named),
    )


def from_nsys_parquet(
    scans: dict[str, str],
    strings: pd.DataFrame,
    metrics: pd.DataFrame | None,
    store: EventStore | None = None,
    files: dict[str, Path] | None = None,
) -> EventStore:
    """The same from an nsys parquetdir export (`scans`: each of its tables -> the DuckDB subquery that
    reads it, nsys_export.ParquetExport.scans; `files`: each table's file): one INSERT ... SELECT per table,
    which DuckDB runs on every core it is given, but for the GPU metric samples, which DuckDB reads from
    their file when they are asked for (gpu_samples.ScanSamples)."""
    from sftprof.trace.nsys.gpu_samples import ScanSamples

    return _from_nsys(
        set(scans),
        strings,
        metrics,
        lambda cursor, table, export_table, columns, insert: cursor.execute(insert.format(rows=scans[export_table])),
        store=store,
        read_samples=lambda cursor, named: ScanSamples(cursor, scans["GPU_METRICS"], files["GPU_METRICS"])
        if files
        else None,
    )


def _from_nsys(
    present: set[str],
    strings: pd.DataFrame,
    metrics: pd.DataFrame | None,
    copy_rows,
    prepare=lambda con: None,
    store: EventStore | None = None,
    read_samples=None,
) -> EventStore:
    """Copy the kernels, runtime-API rows, GPU metric samples and context switches of an nsys export,
    whatever its format (`present`: its table names; `strings`: its StringIds as id, value; `metrics`:
    the distinct type_id, metric_id, name of its TARGET_INFO_GPU_METRICS, None without it;
    `copy_rows(cursor, table, export_table, columns, insert)` runs `insert` over the export table's
    `columns`, named in `{rows}`), leaving out rows whose times are not valid (valid_times_sql),
    counted in `dropped_rows` by table. A sample's device is its typeId's low byte (nsys's own recipes read
    typeId as <hardware:8><VM:8><source:16><event tag:24><GPU:8>); a sample whose (typeId, metricId) names
    no metric is left out, one that two names share is kept under each. Into `store` where given (its
    caller copies other tables into it meanwhile, and checkpoints it once they are in), else a new one.
    `read_samples(cursor, metrics)`, where given, leaves the samples in the export (gpu_samples: PageSamples or
    ScanSamples; None: they are copied after all)."""
    owned = store is None
    if store is None:
        store = EventStore(on_disk=True)
    con = store.con
    prepare(con)
    copies: list[tuple[str, str, tuple[str, ...], str]] = []
    if metrics is not None:
        named = metrics.assign(id=np.arange(len(metrics), dtype="int32"))
        with frames_visible(con, {"named": named}):
            con.execute("CREATE TABLE metric_of AS SELECT type_id, metric_id, id FROM named")
            con.execute("INSERT INTO metric_names SELECT id, name FROM named")
        metric_copy = (
            "gpu_metrics",
            "GPU_METRICS",
            EXPORT_METRIC_COLUMNS,
            """
            INSERT INTO gpu_metrics (timestamp, device_id, metric_id, value)
            SELECT r.timestamp, (r.typeId & 255)::INTEGER, m.id, r.value
            FROM {rows} r JOIN metric_of m ON m.type_id = r.typeId AND m.metric_id = r.metricId""",
        )
        if read_samples is None:
            copies.append(metric_copy)
    if "SCHED_EVENTS" in present:
        copies.append(
            (
                "sched_rows",
                "SCHED_EVENTS",
                EXPORT_SCHED_COLUMNS,
                """
            INSERT INTO sched_rows (start, cpu, is_sched_in, global_tid)
            SELECT start, cpu, coalesce(isSchedIn, 0) != 0, globalTid FROM {rows}""",
            )
        )
    with frames_visible(con, {"strings": strings}):
        con.execute("INSERT INTO kernel_names SELECT id, value FROM strings")
        if "CUPTI_ACTIVITY_KIND_RUNTIME" in present:
            # nsys stats strips a 5-character version (`_v7000`), not longer ones (`_v11060`).
            con.execute("""
                CREATE TABLE api_name_of AS
                SELECT id AS raw_id, dense_rank() OVER (ORDER BY stripped) AS name_id, stripped
                FROM (SELECT id, CASE WHEN value[-6:-5] = '_v' THEN value[:-7] ELSE value END AS stripped
                      FROM strings)""")
            con.execute("INSERT INTO api_names SELECT DISTINCT name_id, stripped FROM api_name_of")
    if "CUPTI_ACTIVITY_KIND_KERNEL" in present:
        columns = EXPORT_KERNEL_COLUMNS
        copies.append(
            (
                "kernel_rows",
                "CUPTI_ACTIVITY_KIND_KERNEL",
                columns,
                f"""
            INSERT INTO kernel_rows (start, "end", name_id, short_name_id, mangled_name_id, device_id, stream_id,
                                 global_pid, correlation_id, {", ".join(KERNEL_SHAPE)})
            SELECT {", ".join(f'"{c}"' for c in columns)} FROM {{rows}}""",
            )
        )
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in present:
        # a call whose name StringIds does not hold is damage (nsys writes none): its start is made NULL, so
        # that it is left out as not valid and counted
        copies.append(
            (
                "cuda_api_rows",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                EXPORT_RUNTIME_COLUMNS,
                """
            INSERT INTO cuda_api_rows (start, "end", name_id, global_tid, correlation_id)
            SELECT CASE WHEN n.raw_id IS NULL THEN NULL ELSE r.start END, r."end", n.name_id, r.globalTid,
                   r.correlationId
            FROM {rows} r LEFT JOIN api_name_of n ON n.raw_id = r.nameId""",
            )
        )
    # Side by side: the page decoder releases the GIL, and each copy inserts through its own cursor.
    with ThreadPoolExecutor(len(copies) + 1) as pool:
        samples = pool.submit(read_samples, con.cursor(), named) if read_samples and metrics is not None else None
        list(pool.map(lambda copy: copy_rows(con.cursor(), *copy), copies))
        store._samples = samples.result() if samples else None
    if samples and store._samples is None:
        copy_rows(con.cursor(), *metric_copy)
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in present:
        con.execute("DROP TABLE api_name_of")
    if "CUPTI_ACTIVITY_KIND_KERNEL" in present:
        # a kernel whose name StringIds does not hold is damage (nsys writes none), but its GPU time is real:
        # it keeps its time under a name that says so
        con.execute(f"""
            INSERT INTO kernel_names
            SELECT id, '{MISSING_KERNEL_NAME}' || id || ')' FROM (
                SELECT DISTINCT unnest([name_id, short_name_id, mangled_name_id]) AS id FROM kernel_rows)
            WHERE id IS NOT NULL AND id NOT IN (SELECT id FROM kernel_names)""")
    # Once, after the copy (whichever reader made it): one scan of two columns, nothing on the decoder's path.
    for table, rows, valid in (
        ("kernels", "kernel_rows", valid_times_sql()),
        # a call names its thread, or no thread or process can be said to have made it
        ("cuda_api", "cuda_api_rows", f"{valid_times_sql()} AND global_tid IS NOT NULL"),
        ("gpu_metrics", "gpu_metrics", valid_times_sql("timestamp", "timestamp")),
        # a switch names its thread and core, or it pairs with nothing
        (
            "sched",
            "sched_rows",
            f"{valid_times_sql('start', 'start')} AND global_tid IS NOT NULL AND cpu IS NOT NULL",
        ),
    ):
        dropped = store.delete_invalid(rows, valid)
        if dropped:
            store.dropped_rows[table] = int(dropped)
    if store._samples is not None and store._samples.dropped:
        store.dropped_rows["gpu_metrics"] = store._samples.dropped
    if owned:
        store.checkpoint()
    return store
