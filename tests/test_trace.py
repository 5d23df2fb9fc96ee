"""Loaders and summaries against a real capture, checked against `nsys stats` on the same file."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from sftprof.analysis import cpu, cuda
from sftprof.trace import load_trace
from sftprof.trace.nsys.nsys_sqlite import TraceFormatError

from conftest import REPO, as_nsys_rows, nsys_stats

pytestmark = pytest.mark.e2e


def test_nvtx_ranges_of_every_step_and_phase_were_recorded(demo_sqlite):
    conn = sqlite3.connect(demo_sqlite)
    names = [row[0] for row in conn.execute("SELECT text FROM NVTX_EVENTS WHERE eventType = 59")]
    assert sorted(n for n in names if n.startswith("step")) == ["step 2", "step 3", "step 4"]
    for phase in ("forward", "backward", "data"):
        assert names.count(phase) == 3 * 2  # 3 captured steps x 2 accumulated micro-batches
    assert names.count("optimizer") == 3 and names.count("sftprof_capture") == 1


def test_nvtx_summary_equals_nsys_nvtxsum(demo_sqlite):
    ours = as_nsys_rows(cpu.nvtx_summary(load_trace(demo_sqlite).events), ["style", "name"])
    theirs = {tuple(row.values()) for row in nsys_stats("nvtxsum", demo_sqlite)}
    assert ours == theirs and len(ours) >= 7


def test_osrt_summary_equals_nsys_osrtsum(demo_sqlite):
    ours = as_nsys_rows(cpu.osrt_summary(load_trace(demo_sqlite).events), ["name"])
    theirs = {tuple(row.values()) for row in nsys_stats("osrtsum", demo_sqlite)}
    assert ours == theirs and ours


def test_threads_of_the_training_process_are_named(demo_sqlite):
    tables = load_trace(demo_sqlite)
    threads = cpu.thread_summary(tables, cuda.host_wait_calls(tables.events), cuda.calls_by_thread(tables.events))
    main = threads[threads["role"] == "main"]
    assert len(main) == 1 and main.iloc[0]["nvtx_ranges"] > 0
    assert not threads["thread_name"].str.startswith("[NSys").any()


def test_step_table_adds_up(demo_sqlite):
    steps = cpu.step_table(load_trace(demo_sqlite).nvtx)
    assert list(steps["step"]) == [2, 3, 4]
    phase_sum = sum(steps[f"{p}_ns"] for p in cpu.PHASES)
    assert ((phase_sum + steps["other_ns"]) == steps["duration"]).all()
    assert (steps["other_ns"] >= 0).all() and (steps["forward_ns"] > 0).all() and (steps["backward_ns"] > 0).all()


def test_report_without_cuda_has_empty_gpu_tables_with_columns(demo_sqlite):
    tables = load_trace(demo_sqlite)
    assert "cuda" not in tables.sources and tables.kernels.empty and "duration" in tables.kernels.columns


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "empty"),
        (b"this is not a database at all, just text" * 100, "not an SQLite database"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path, content, message):
    path = tmp_path / "bad.sqlite"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=message):
        load_trace(path)


def test_foreign_sqlite_and_truncated_export(tmp_path, demo_sqlite):
    foreign = tmp_path / "foreign.sqlite"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(TraceFormatError, match="not an nsys export"):
        load_trace(foreign)
    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(demo_sqlite.read_bytes()[: demo_sqlite.stat().st_size // 3])
    with pytest.raises(TraceFormatError):
        load_trace(truncated)
    with pytest.raises(TraceFormatError, match="unsupported trace type"):
        load_trace(foreign.rename(tmp_path / "trace.txt"))


# emit_nvtx's per-call numbering is cut as ranges are read; other names stay as they are
EMIT_NVTX_NAMES = {
    "aten::mm, seq = 12, op_id = 345, sizes = [[4, 8], [8, 2]]": "aten::mm",
    "aten::copy_, op_id = 5": "aten::copy_",
    "odd, seq = x, op_id = 7": "odd, seq = x",  # the first numbering is cut, wherever it is
    "two\nlines, op_id = 3\nmore": "two\nlines",
    "step = 3": "step = 3",
    "arabic digits, op_id = \u0663": "arabic digits, op_id = \u0663",  # ASCII digits only, in both engines
}


def test_nvtx_names_and_styles_are_the_same_categories_whichever_engine_reads_them(tmp_path):
    """The page decoder reads NVTX ranges as codes; a name that is not UTF-8 sends the read back to sqlite3
    (past DuckDB, which refuses it; tests/test_nvtx_read.py checks pages against DuckDB). Both give
    each range its name, with emit_nvtx's numbering cut the same way, and style (a StartEnd range among
    PushPop ones here), as categories."""
    path = tmp_path / "ranges.sqlite"
    shutil.copy(REPO / "tests" / "fixtures" / "h200_sft_clean.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute(
            "UPDATE NVTX_EVENTS SET eventType = 60 WHERE rowid = (SELECT max(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
        )
        rowids = [r[0] for r in con.execute("SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 20 OFFSET 5")]
        for rowid, name in zip(rowids[::3], EMIT_NVTX_NAMES):
            con.execute(
                "UPDATE NVTX_EVENTS SET text = ?, textId = NULL, domainId = NULL WHERE rowid = ?", (name, rowid)
            )
    by_duckdb = load_trace(path).nvtx
    assert set(EMIT_NVTX_NAMES.values()) <= set(by_duckdb["name"].dropna())
    assert not set(EMIT_NVTX_NAMES) - set(EMIT_NVTX_NAMES.values()) & set(by_duckdb["name"].dropna())
    with sqlite3.connect(path) as con:  # an application's NVTX text need not be UTF-8
        con.execute(
            "UPDATE NVTX_EVENTS SET text = CAST(X'66ff6f' AS TEXT), textId = NULL WHERE rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
        )
    by_sqlite = load_trace(path).nvtx
    for ranges in (by_duckdb, by_sqlite):
        assert ranges["name"].dtype == "category" and ranges["style"].dtype == "category"
        assert ranges["style"].value_counts().to_dict() == {"PushPop": len(ranges) - 1, "StartEnd": 1}
    changed = by_sqlite["name"].astype(str) != by_duckdb["name"].astype(str)
    assert changed.sum() == 1 and "\ufffd" in by_sqlite["name"][changed].iloc[0]


def test_ranges_that_never_end_in_a_file_read_by_sqlite3_are_left_out_and_counted(tmp_path):
    """No range has an end, so none can be closed at the last event's time, and a name that is not UTF-8
    sends the read to sqlite3: every range is left out, counted, and the rest of the capture loads."""
    path = tmp_path / "open.sqlite"
    shutil.copy(REPO / "tests" / "fixtures" / "h200_sft_clean.sqlite", path)
    with sqlite3.connect(path) as con:
        con.execute('UPDATE NVTX_EVENTS SET "end" = NULL')
        con.execute(
            "UPDATE NVTX_EVENTS SET text = CAST(X'66ff6f' AS TEXT), textId = NULL WHERE rowid = (SELECT min(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
        )
        (ranges,) = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60, 70, 71)").fetchone()
    tables = load_trace(path)
    assert tables.nvtx.empty and tables.dropped_rows["nvtx"] == ranges > 0 and len(tables.osrt)
