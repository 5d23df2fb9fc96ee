"""An nsys export's GPU metric samples, read from the export each time they are asked for, never copied into
the event store: from an SQLite export's pages (PageSamples), or by DuckDB from a parquetdir's file (ScanSamples).

Why: one analysis reads them (the metrics' means while each GPU was busy, boundness.py), in one pass, and
`--gpu-metrics-devices` samples some twenty counters 10,000 times a second: 107M samples at 10M kernels
of the trainer's shape. Copying them into DuckDB took 9 s there, more than loading everything else; one
pass over the pages takes about 2 s (benchmarks/ENGINE.md).

Loading reads the samples once: to count those whose times are not valid (dropped_rows, as the copy
counts them) and, for SQLite, to know that every page decodes: a file whose pages this reader does not decode
gets None from `PageSamples.read`, and its samples are copied as before. A file changed after it was loaded (its size,
modification time or inode) is a TraceFormatError when the samples are read again, not another capture's
samples read as this one's.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numba
import numpy as np
import pandas as pd

from sftprof.trace.events import MAX_TIME_NS, METRIC_SAMPLE, out_of_disk, valid_times_sql
from sftprof.trace.nsys import sqlite_pages
from sftprof.trace.nsys.nsys_export import EXPORT_METRIC_COLUMNS, TraceFormatError, one_line

# A metric id at or beyond this is looked up in no table: nsys numbers a type's metrics from 0 (about 20 of
# them); an export naming one beyond it has its samples copied instead.
MAX_METRIC_ID = 1 << 16
# Metric types (a GPU's each) looked through per sample, and the lookup's entries: beyond them an edited export's
# names would cost more time or memory than its copy, which is made instead.
MAX_TYPES = 64
MAX_LOOKUP = 1 << 22


@numba.njit(cache=True, nogil=True)
def _select(values, missing, types, lookup, device, time, metric, value):  # pragma: no cover - compiled
    """Each sample once per metric name its (typeId, metricId) has in `lookup` (name level, type, metricId ->
    metric id, -1 none), into the output arrays from 0; how many rows were written, and how many were left
    out for times that are not valid. A sample of no named metric is neither."""
    written = dropped = 0
    for i in range(values.shape[1]):
        if missing[1, i] or missing[2, i] or values[2, i] < 0 or values[2, i] >= lookup.shape[2]:
            continue
        kind = -1
        for k in range(len(types)):
            if types[k] == values[1, i]:
                kind = k
                break
        if kind < 0:
            continue
        valid = not missing[0, i] and -MAX_TIME_NS <= values[0, i] <= MAX_TIME_NS
        for level in range(lookup.shape[0]):
            metric_id = lookup[level, kind, values[2, i]]
            if metric_id < 0:
                break
            if not valid:
                dropped += 1
                continue
            device[written] = values[1, i] & 255
            time[written] = values[0, i]
            metric[written] = metric_id
            value[written] = np.nan if missing[3, i] else values[3, i]
            written += 1
    return written, dropped


def _version(path: Path) -> tuple[int, int, int]:
    """What says a file is the one loaded: its size, modification time and inode."""
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns, status.st_ino


def _changed(path: Path, error: Exception) -> TraceFormatError:
    return TraceFormatError(f"{path}: changed since it was loaded ({one_line(error)})")


def _check_unchanged(path: Path, loaded: tuple[int, int, int]) -> None:
    """Before a pass: the file is still the one loaded (`loaded`: its _version then), or a TraceFormatError."""
    try:
        now = _version(path)
    except OSError as exc:
        raise _changed(path, exc) from None
    if now != loaded:
        raise _changed(path, ValueError("another size, time or inode"))


class PageSamples:
    """GPU_METRICS as (device_id, timestamp, metric_id, value) batches, valid rows only, decoded anew on
    every pass. `metrics`: type_id, metric_id and the store's id of every metric name (TARGET_INFO_GPU_METRICS);
    a sample's device is its typeId's low byte, as the copy reads it."""

    def __init__(self, path: Path, metrics: pd.DataFrame):
        self.path = Path(path).resolve()
        self._version = _version(self.path)
        self._types = np.unique(metrics["type_id"].to_numpy("int64"))
        kind = np.searchsorted(self._types, metrics["type_id"].to_numpy("int64"))
        metric = metrics["metric_id"].to_numpy("int64")
        level = pd.Series(0, index=metrics.index).groupby([kind, metric]).cumcount().to_numpy()
        self._lookup = np.full((level.max(initial=0) + 1, len(self._types), metric.max(initial=-1) + 1), -1, "int32")
        self._lookup[level, kind, metric] = metrics["id"].to_numpy("int32")
        self.rows = self.dropped = 0

    @classmethod
    def read(cls, path: Path, metrics: pd.DataFrame) -> PageSamples | None:
        """The samples, counted in one pass; None where the pages or the metric ids do not suit this reader (ids
        that are not all integers, as in an edited TARGET_INFO_GPU_METRICS, are matched by the copy's join)."""
        ids = metrics[["type_id", "metric_id"]]
        if len(metrics) == 0 or not all(pd.api.types.is_integer_dtype(kind) for kind in ids.dtypes):
            return None
        if ids["metric_id"].min() < 0 or ids["metric_id"].max() >= MAX_METRIC_ID:
            return None
        types, names_per_pair = ids["type_id"].nunique(), int(ids.value_counts().max())
        if types > MAX_TYPES or names_per_pair * types * (int(ids["metric_id"].max()) + 1) > MAX_LOOKUP:
            return None
        samples = cls(path, metrics)
        try:
            for batch in samples._decoded():
                samples.rows += len(batch["timestamp"])
        except sqlite_pages.Unsupported:
            return None
        return samples

    def batches(self, store=None) -> Iterator[dict[str, np.ndarray]]:
        """Every valid sample, a chunk of pages at a time, as arrays reused for the next batch (`store`: unused,
        as ScanSamples.batches takes it)."""
        _check_unchanged(self.path, self._version)
        try:
            yield from self._decoded()
        except (sqlite_pages.Unsupported, sqlite3.Error, OSError) as exc:
            raise out_of_disk(exc) or _changed(self.path, exc) from None

    def _decoded(self) -> Iterator[dict[str, np.ndarray]]:
        dropped, outputs = 0, None
        for values, missing, _, _ in sqlite_pages.raw_columns(self.path, "GPU_METRICS", list(EXPORT_METRIC_COLUMNS)):
            size = values.shape[1] * self._lookup.shape[0]
            if outputs is None or len(outputs[0]) < size:
                outputs = tuple(np.empty(size, dtype) for dtype in ("int64", "int64", "int64", "float64"))
            written, left_out = _select(values, missing, self._types, self._lookup, *outputs)
            dropped += left_out
            yield dict(zip(METRIC_SAMPLE, (column[:written] for column in outputs), strict=True))
        self.dropped = dropped


class ScanSamples:
    """A parquetdir's GPU_METRICS, read by DuckDB from its file (`scan`: the subquery that reads it) on every pass,
    named through the store's metric_of table as the copy names them. Counted at loading through `cursor`, one
    scan of three columns."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection, scan: str, file: Path):
        self.path = Path(file).resolve()
        self._version = _version(self.path)
        valid = valid_times_sql("r.timestamp", "r.timestamp")
        named = f"{scan} r JOIN metric_of m ON m.type_id = r.typeId AND m.metric_id = r.metricId"
        self._sql = f"""SELECT (r.typeId & 255) AS device_id, r.timestamp, m.id AS metric_id, r.value::DOUBLE AS value
                        FROM {named} WHERE {valid}"""
        self.rows, self.dropped = cursor.execute(
            f"SELECT count(*) FILTER ({valid}), count(*) FILTER (NOT {valid}) FROM {named}"
        ).fetchone()

    def batches(self, store) -> Iterator[dict[str, np.ndarray]]:
        """Every valid sample, a batch of the store's at a time."""
        _check_unchanged(self.path, self._version)
        try:
            yield from store.sample_batches(self._sql)
        except duckdb.OutOfMemoryException:
            raise  # not the file: the budget (pipeline.analyze_trace says so)
        except (duckdb.Error, OSError) as exc:
            raise out_of_disk(exc) or _changed(self.path, exc) from None
