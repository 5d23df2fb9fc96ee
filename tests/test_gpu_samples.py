"""GPU metric samples left in an nsys export (gpu_samples: PageSamples for SQLite, ScanSamples for a parquetdir):
read as the copy into the event store would hold them, copied where the pages or ids do not suit the page reader,
and refused in one line once the file has changed."""

from __future__ import annotations

import os
import shutil
import sqlite3
import tarfile
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from sftprof.analysis import boundness, gpu
from sftprof.trace import load_trace
from sftprof.trace.nsys import gpu_samples, sqlite_pages
from sftprof.trace.nsys.nsys_export import TraceFormatError

CAPTURE = Path(__file__).parent / "fixtures" / "nsys2025" / "h200_sft_clean_metrics.sqlite"


@pytest.fixture(scope="module")
def parquetdir(tmp_path_factory) -> Path:
    """The same capture's parquetdir export (nsys 2025.3.1's own), extracted."""
    folder = tmp_path_factory.mktemp("parquetdir")
    with tarfile.open(CAPTURE.with_suffix(".parquetdir.tar.xz")) as tar:
        tar.extractall(folder, filter="data")
    return folder / CAPTURE.with_suffix(".parquetdir").name


def _capture_copy(path: Path, loosened: str | None = None) -> Path:
    """The capture copied to `path`; with `loosened`, that table rebuilt without its NOT NULLs, in its row order, as an
    edited file may have it."""
    shutil.copyfile(CAPTURE, path)
    if loosened:
        with sqlite3.connect(path) as conn:
            conn.execute(f"CREATE TABLE edited AS SELECT * FROM {loosened}")
            conn.execute(f"DROP TABLE {loosened}")
            conn.execute(f"ALTER TABLE edited RENAME TO {loosened}")
    return path


def _copied(monkeypatch, path: Path):
    """The export loaded with its samples copied into the store, as before they were left in the export."""
    with monkeypatch.context() as patch:
        patch.setattr(gpu_samples.PageSamples, "read", classmethod(lambda cls, path, metrics: None))
        patch.setattr(gpu_samples, "ScanSamples", lambda cursor, scan, file: None)
        return load_trace(path)


def _in_store(tables) -> int:
    return int(tables.events.query("SELECT count(*) AS n FROM gpu_metrics")["n"].iloc[0])


def _assert_same_samples(left, right) -> None:
    pd.testing.assert_frame_equal(left.events.frame("gpu_metrics"), right.events.frame("gpu_metrics"), check_exact=True)
    assert left.events.count("gpu_metrics") == right.events.count("gpu_metrics")
    assert left.dropped_rows == right.dropped_rows
    means = [
        boundness.metric_means_while_busy(tables.events, gpu.busy_by_device(tables.events)) for tables in (left, right)
    ]
    assert means[0] == means[1] and len(means[0]) > 10


def _with_metric_row(tmp_path: Path, metric_id: int, copy_of: int) -> Path:
    """The capture with one more TARGET_INFO_GPU_METRICS row: `metric_id` named as metric `copy_of` is."""
    path = _capture_copy(tmp_path / "named.sqlite")
    with sqlite3.connect(path) as conn:
        conn.execute(
            """INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId, sourceId, typeName, ?, metricName || ' (again)'
               FROM TARGET_INFO_GPU_METRICS WHERE metricId = ?""",
            (metric_id, copy_of),
        )
    return path


@pytest.mark.parametrize("export", ["sqlite", "parquetdir"])
def test_samples_stay_in_the_export_and_read_as_the_copy_would(monkeypatch, request, export):
    path = CAPTURE if export == "sqlite" else request.getfixturevalue("parquetdir")
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == 0 and left.events.count("gpu_metrics") == _in_store(copied) > 30_000
    _assert_same_samples(left, copied)


def test_a_pair_two_names_share_counts_under_each(monkeypatch, tmp_path):
    path = _with_metric_row(tmp_path, metric_id=3, copy_of=3)
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == 0
    with sqlite3.connect(path) as conn:
        (shared,) = conn.execute("SELECT count(*) FROM GPU_METRICS WHERE metricId = 3").fetchone()
    assert left.events.count("gpu_metrics") == load_trace(CAPTURE).events.count("gpu_metrics") + shared
    _assert_same_samples(left, copied)


def test_samples_of_a_second_gpu_are_named_and_kept_apart(monkeypatch, tmp_path):
    """Another typeId (GPU 1: its low byte) with its own metric names, interleaved with GPU 0's samples."""
    path = _capture_copy(tmp_path / "two_gpus.sqlite")
    with sqlite3.connect(path) as conn:
        conn.execute("""INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId + 1, sourceId, typeName, metricId,
                        metricName || ' (GPU 1)' FROM TARGET_INFO_GPU_METRICS""")
        conn.execute("""INSERT INTO GPU_METRICS SELECT rawTimestamp, timestamp + 1, typeId + 1, metricId, value + 1
                        FROM GPU_METRICS""")
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert set(left.events.frame("gpu_metrics")["device_id"]) == {0, 1}
    assert left.events.count("gpu_metrics") == 2 * load_trace(CAPTURE).events.count("gpu_metrics")
    _assert_same_samples(left, copied)


def test_a_metric_id_beyond_the_lookup_is_copied(monkeypatch, tmp_path):
    path = _with_metric_row(tmp_path, metric_id=gpu_samples.MAX_METRIC_ID, copy_of=3)
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == _in_store(copied) > 30_000
    _assert_same_samples(left, copied)


def test_metric_names_without_their_ids_are_copied(monkeypatch, tmp_path):
    """An edited TARGET_INFO_GPU_METRICS (its NOT NULLs gone) with a name of no type and one of no metric id."""
    path = _capture_copy(tmp_path / "unnamed.sqlite", loosened="TARGET_INFO_GPU_METRICS")
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO TARGET_INFO_GPU_METRICS VALUES (NULL, 0, '', 3, 'no type')")
        conn.execute("INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId, 0, '', NULL, 'no id' FROM GPU_METRICS LIMIT 1")
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == _in_store(copied) == load_trace(CAPTURE).events.count("gpu_metrics")
    _assert_same_samples(left, copied)


@pytest.mark.parametrize("limit", ["MAX_TYPES", "MAX_LOOKUP"])
def test_more_names_than_the_lookup_holds_are_copied(monkeypatch, tmp_path, limit):
    """A second type (GPU 1) named as the first is, against limits lowered to one type, or to a lookup of less
    than two names for each of the first type's 22 metric ids."""
    path = _capture_copy(tmp_path / "many.sqlite")
    with sqlite3.connect(path) as conn:
        conn.execute("""INSERT INTO TARGET_INFO_GPU_METRICS SELECT typeId + 1, sourceId, typeName, metricId,
                        metricName || ' (GPU 1)' FROM TARGET_INFO_GPU_METRICS""")
    expected = load_trace(path)
    assert _in_store(expected) == 0
    monkeypatch.setattr(gpu_samples, limit, 1 if limit == "MAX_TYPES" else 2 * 22 - 1)
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == _in_store(copied) > 30_000
    _assert_same_samples(left, copied)
    _assert_same_samples(left, expected)


def test_pages_the_reader_does_not_decode_are_copied(monkeypatch):
    raw_columns = sqlite_pages.raw_columns

    def refuses_metrics(path, table, *args, **kwargs):
        if table == "GPU_METRICS":
            raise sqlite_pages.Unsupported("a value that is not an integer")
        return raw_columns(path, table, *args, **kwargs)

    expected = load_trace(CAPTURE)
    with monkeypatch.context() as patch:
        patch.setattr(sqlite_pages, "raw_columns", refuses_metrics)
        copied = load_trace(CAPTURE)
    assert _in_store(copied) == expected.events.count("gpu_metrics") > 30_000
    _assert_same_samples(expected, copied)


@pytest.mark.parametrize("export", ["sqlite", "parquetdir"])
@pytest.mark.parametrize("change", ["rewritten", "touched", "removed"])
def test_a_file_changed_after_loading_is_refused_in_one_line(request, tmp_path, export, change):
    if export == "sqlite":
        path = loaded = _capture_copy(tmp_path / "capture.sqlite")
    else:
        loaded = tmp_path / "capture.parquetdir"
        shutil.copytree(request.getfixturevalue("parquetdir"), loaded)
        path = loaded / "GPU_METRICS.parquet"
    tables = load_trace(loaded)
    assert sum(len(batch["timestamp"]) for batch in tables.events.metric_batches()) > 30_000
    if change == "rewritten":
        path.write_bytes(b"\x1b[31mnot a capture\n" * 100)
    elif change == "touched":
        os.utime(path, ns=(0, 0))
    else:
        path.unlink()
    with pytest.raises(TraceFormatError, match="changed since it was loaded") as refused:
        list(tables.events.metric_batches())
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("export", ["sqlite", "parquetdir"])
def test_samples_whose_times_are_not_valid_or_without_a_value_are_read_as_the_copy_reads_them(
    monkeypatch, request, tmp_path, export
):
    if export == "sqlite":
        path = _capture_copy(tmp_path / "damaged.sqlite", loosened="GPU_METRICS")
        with sqlite3.connect(path) as conn:
            rows = conn.execute("SELECT * FROM GPU_METRICS WHERE rowid % 100 = 0").fetchall()
            for raw, timestamp, type_id, metric_id, value in rows:
                timestamp = None if metric_id == 1 else 2**60 if metric_id == 3 else timestamp
                value = None if metric_id == 5 else value  # kept, counted for nothing
                conn.execute(
                    "INSERT INTO GPU_METRICS VALUES (?, ?, ?, ?, ?)", (raw, timestamp, type_id, metric_id, value)
                )
    else:
        path = tmp_path / "damaged.parquetdir"
        shutil.copytree(request.getfixturevalue("parquetdir"), path)
        table = path / "GPU_METRICS.parquet"
        damaged = f"""SELECT * REPLACE (CASE WHEN metricId = 1 THEN NULL WHEN metricId = 3 THEN {2**60} ELSE timestamp END
                      AS timestamp, CASE WHEN metricId = 5 THEN NULL ELSE value END AS value)
                      FROM GPU_METRICS WHERE rowid % 100 = 0"""
        with duckdb.connect() as con:
            con.execute(f"CREATE VIEW GPU_METRICS AS SELECT *, row_number() OVER () AS rowid FROM '{table}'")
            con.execute(f"""CREATE TABLE both_ AS SELECT * EXCLUDE (rowid) FROM GPU_METRICS
                            UNION ALL SELECT * EXCLUDE (rowid) FROM ({damaged})""")
            con.execute(f"COPY both_ TO '{table}' (FORMAT parquet)")
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == 0 and left.dropped_rows["gpu_metrics"] > 20
    assert left.events.frame("gpu_metrics")["value"].isna().sum() > 10
    _assert_same_samples(left, copied)


@pytest.mark.parametrize(
    "edit",
    [
        "typeId = NULL",
        "metricId = NULL",
        "metricId = -1",
        f"metricId = {1 << 40}",
        "typeId = typeId + 7",
        "value = NULL",
    ],
)
def test_edited_samples_are_read_as_the_copy_reads_them(monkeypatch, tmp_path, edit):
    """Every 50th sample edited (the table's NOT NULLs gone first): a sample of no named metric is left out and not
    counted, one without a value is kept, as the copy's join has them."""
    path = _capture_copy(tmp_path / "edited.sqlite", loosened="GPU_METRICS")
    with sqlite3.connect(path) as conn:
        assert conn.execute(f"UPDATE GPU_METRICS SET {edit} WHERE rowid % 50 = 0").rowcount > 500
    left, copied = load_trace(path), _copied(monkeypatch, path)
    assert _in_store(left) == 0
    _assert_same_samples(left, copied)
