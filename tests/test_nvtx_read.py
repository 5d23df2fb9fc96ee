"""NVTX ranges read from the export's pages into the event store (nsys_sqlite._nvtx_from_pages) against the
SQL route (_coded_names, DuckDB) on the same file, and on the same tables as a parquetdir: the same rows, names,
styles and order, the same rows dropped; and the SQL route, never a different answer, for what the page route
does not read."""

from __future__ import annotations

import contextlib
import sqlite3

import duckdb
import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import analyze
from sftprof.trace import events as events_module
from sftprof.trace import load_trace
from sftprof.trace.events import EventStore
from sftprof.trace.nsys import nsys_sqlite, sqlite_pages
from sftprof.trace.nsys.nsys_export import ParquetExport, SqliteExport, read_only_uri

from conftest import REPO, as_parquetdir, edited_export

RANGE = "(SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY rowid LIMIT 1 OFFSET {})"
THREAD = "(SELECT globalTid FROM NVTX_EVENTS WHERE eventType = 59 LIMIT 1)"
EDITS = {
    "emit_nvtx names, a long one, a StartEnd range": [
        f"UPDATE NVTX_EVENTS SET text = 'aten::mm, seq = 12, op_id = 345, sizes = [[4, 8]]', textId = NULL WHERE rowid = {RANGE.format(3)}",
        f"UPDATE NVTX_EVENTS SET text = 'odd, seq = x, op_id = 7', textId = NULL WHERE rowid = {RANGE.format(4)}",
        f"UPDATE NVTX_EVENTS SET text = 'long ' || printf('%.300c', 'x') || ', op_id = 1', textId = NULL WHERE rowid = {RANGE.format(5)}",
        f"UPDATE NVTX_EVENTS SET eventType = 60 WHERE rowid = {RANGE.format(6)}",
    ],
    "domains and registered strings": [
        "INSERT INTO StringIds (id, value) VALUES (999999, 'aten::add, seq = 4, op_id = 2')",
        f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (-5, 75, 'mine', {THREAD}, 7)",
        f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (-4, 75, 'cut, op_id = 9 x', {THREAD}, 8)",
        f"UPDATE NVTX_EVENTS SET domainId = 7 WHERE rowid IN ({RANGE.format(1)}, {RANGE.format(2)})",
        f"UPDATE NVTX_EVENTS SET domainId = 7, textId = 999999, text = NULL WHERE rowid = {RANGE.format(3)}",
        f"UPDATE NVTX_EVENTS SET domainId = 7, textId = NULL, text = NULL WHERE rowid = {RANGE.format(4)}",
        f"UPDATE NVTX_EVENTS SET domainId = 8 WHERE rowid = {RANGE.format(5)}",
        f"UPDATE NVTX_EVENTS SET domainId = 9 WHERE rowid = {RANGE.format(6)}",  # a domain never created
        f"UPDATE NVTX_EVENTS SET textId = 999999, text = NULL WHERE rowid = {RANGE.format(7)}",
        # a text no range outside the domain has: its name is the domain's alone
        f"UPDATE NVTX_EVENTS SET domainId = 7, textId = NULL, text = 'only in mine' WHERE rowid = {RANGE.format(9)}",
    ],
    "ties on start": [
        f'UPDATE NVTX_EVENTS SET start = (SELECT start FROM NVTX_EVENTS WHERE rowid = {RANGE.format(2)}), "end" = "end" + 5 WHERE rowid IN ({RANGE.format(3)}, {RANGE.format(4)})',
        f"UPDATE NVTX_EVENTS SET text = 'b' WHERE rowid = {RANGE.format(3)}",
    ],
    "ties on start, one of them left open": [  # the tied rows move in place, their NULL masks with them
        f"UPDATE NVTX_EVENTS SET start = (SELECT start FROM NVTX_EVENTS WHERE rowid = {RANGE.format(2)}) WHERE rowid IN ({RANGE.format(3)}, {RANGE.format(4)})",
        f'UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid = {RANGE.format(3)}',
    ],
    "ranges left open": [f'UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid IN ({RANGE.format(0)}, {RANGE.format(8)})'],
    "no range ever ends": ['UPDATE NVTX_EVENTS SET "end" = NULL'],
    "marks, no range": [  # events, none of them a range: nothing to copy, by either route
        f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid) VALUES (5, 34, 'a mark', {THREAD})",
        "DELETE FROM NVTX_EVENTS WHERE eventType IN (59, 60)",
    ],
    "damaged values": [  # NOT NULL is taken off the schema first, as a hostile file may have it
        f"UPDATE NVTX_EVENTS SET start = NULL WHERE rowid = {RANGE.format(2)}",
        f"UPDATE NVTX_EVENTS SET eventType = NULL WHERE rowid = {RANGE.format(3)}",
        f'UPDATE NVTX_EVENTS SET "end" = {2**63 - 1} WHERE rowid = {RANGE.format(4)}',
        f"UPDATE NVTX_EVENTS SET start = {-(2**63) + 1} WHERE rowid = {RANGE.format(5)}",
        f'UPDATE NVTX_EVENTS SET "end" = start - 1 WHERE rowid = {RANGE.format(6)}',
        f"UPDATE NVTX_EVENTS SET eventType = {2**40} WHERE rowid = {RANGE.format(7)}",
    ],
}


def _edited(tmp_path, edits) -> SqliteExport:
    return SqliteExport(edited_export(tmp_path, "NVTX_EVENTS", edits))


def _from_pages(export: SqliteExport, dropped: dict) -> pd.DataFrame:
    """The ranges _nvtx_from_pages copies into a store, as the store gives them back."""
    store = EventStore(on_disk=False)
    nsys_sqlite._nvtx_from_pages(export, nsys_sqlite._strings(export), store, dropped)
    return store.nvtx_frame()


def _from_sql(export: SqliteExport | ParquetExport, dropped: dict) -> pd.DataFrame:
    """The ranges the SQL route (_coded_names) copies into a store, as it gives them back."""
    store = EventStore(on_disk=False)
    nsys_sqlite._nvtx_by_sql(export, store, dropped)
    return store.nvtx_frame()


def _through_sqlite3(export: SqliteExport, dropped: dict) -> pd.DataFrame:
    """The ranges the last route (sqlite3, for text DuckDB refuses) copies into a store, as it gives them back."""
    store = EventStore(on_disk=False)
    nsys_sqlite._nvtx_through_sqlite3(export, store, dropped)
    return store.nvtx_frame()


def _out_of_memory(*args):
    raise duckdb.OutOfMemoryException("Out of Memory Error: as DuckDB's share runs out")


@pytest.mark.parametrize("case", EDITS)
def test_ranges_read_from_pages_are_those_sql_reads(tmp_path, monkeypatch, case):
    """By every route: the pages, DuckDB over the SQLite file and over a parquetdir, and sqlite3 a few
    ranges a batch; and by DuckDB where its share cannot group every name at once (names a slice at a time)."""
    export = _edited(tmp_path, EDITS[case])
    try:
        dropped_pages, dropped_sql, dropped_parquet, dropped_sqlite3 = {}, {}, {}, {}
        pages = _from_pages(export, dropped_pages)
        sql = _from_sql(export, dropped_sql)
        monkeypatch.setattr(nsys_sqlite, "SQLITE3_BATCH_ROWS", 7)
        through_sqlite3 = _through_sqlite3(export, dropped_sqlite3)
        parquet = ParquetExport(as_parquetdir(export.path, tmp_path / "export.parquetdir"))
        try:
            from_parquet = _from_sql(parquet, dropped_parquet)
        finally:
            parquet.close()
        monkeypatch.setattr(nsys_sqlite, "_range_kinds", _out_of_memory)  # too many names to group at once
        monkeypatch.setattr(nsys_sqlite.memory_budget, "summary_groups", lambda: 2)
        dropped_sliced = {}
        sliced = _from_sql(export, dropped_sliced)
    finally:
        export.close()
    pd.testing.assert_frame_equal(pages, sql)
    pd.testing.assert_frame_equal(pages, from_parquet)
    pd.testing.assert_frame_equal(pages, through_sqlite3)
    pd.testing.assert_frame_equal(pages, sliced)
    assert dropped_pages == dropped_sql == dropped_parquet == dropped_sqlite3 == dropped_sliced
    if case == "domains and registered strings":  # the edits reached the names
        assert {"mine:aten::add", "cut", "aten::add"} <= set(pages["name"].dropna()) and pages["name"].isna().sum() == 1
        assert "mine:only in mine" in set(pages["name"]) and "only in mine" not in pages["name"].cat.categories
    if case == "no range ever ends":
        assert pages.empty and dropped_pages["nvtx"] > 0
    if case == "marks, no range":
        assert pages.empty and not dropped_pages
    if case == "damaged values":
        # NULL start, no event type (nsys writes none), end at 2^63 - 1, start at -(2^63 - 1), end before start;
        # an unknown event type is no range, not damage
        assert dropped_pages["nvtx"] == 5


def test_ranges_read_a_page_at_a_time_are_those_read_at_once(tmp_path, monkeypatch):
    """Ranges over many pages, read a page a chunk and copied into the store a few chunks at a time (the last
    batch a part of one), NULLs in some chunks only (half way, a range without a domain; the last range left
    open)."""
    edits = ["INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS"] * 7  # 128 times the rows
    last = "(SELECT max(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
    middle = "(SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY rowid LIMIT 1 OFFSET 1500)"
    edits += [f"UPDATE NVTX_EVENTS SET domainId = NULL WHERE rowid = {middle}"]
    edits += [f'UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid = {last}']
    export = _edited(tmp_path, edits)
    try:
        whole = _from_pages(export, {})
        monkeypatch.setattr(nsys_sqlite, "NVTX_CHUNK_BYTES", 1)
        monkeypatch.setattr(nsys_sqlite, "NVTX_INSERT_ROWS", 250)
        paged = _from_pages(export, {})
        chunks = sum(1 for _ in sqlite_pages.raw_columns(export.path, "NVTX_EVENTS", ["start"], chunk_bytes=1))
        sql = _from_sql(export, {})
    finally:
        export.close()
    assert chunks > 20 and len(whole) > 2_000
    pd.testing.assert_frame_equal(paged, whole)
    pd.testing.assert_frame_equal(paged, sql)


@pytest.mark.parametrize("named_first", [True, False])
def test_a_domain_named_before_or_after_its_ranges_names_them_alike(tmp_path, monkeypatch, named_first):
    """Ranges are written once, coded as they are read: a range in a domain its process named is `DOMAIN:NAME`,
    whether the domain was named pages before its ranges or pages after them (the table is then read again)."""
    create = (
        f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (-5, 75, 'late', {THREAD}, 7)"
    )
    edits = ([create] if named_first else []) + ["INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS"] * 6
    early = "(SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY rowid LIMIT 40)"
    edits += [f"UPDATE NVTX_EVENTS SET domainId = 7 WHERE rowid IN {early}"] + ([] if named_first else [create])
    export = _edited(tmp_path, edits)
    reads = []
    monkeypatch.setattr(nsys_sqlite, "_read_nvtx", _counted(nsys_sqlite._read_nvtx, reads))
    try:
        monkeypatch.setattr(nsys_sqlite, "NVTX_CHUNK_BYTES", 1)
        pages = _from_pages(export, {})
        sql = _from_sql(export, {})
    finally:
        export.close()
    pd.testing.assert_frame_equal(pages, sql)
    assert (pages["name"].astype(str).str.startswith("late:")).sum() == 40
    assert len(reads) == (1 if named_first else 2)


def _counted(function, calls: list):
    def counted(*args, **kwargs):
        calls.append(1)
        return function(*args, **kwargs)

    return counted


@pytest.mark.parametrize(
    "case, edits",
    [
        (
            "a domain named twice in one process",
            [
                f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (-5, 75, 'a', {THREAD}, 7)",
                f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (-4, 75, 'b', {THREAD} + 1, 7)",
                f"UPDATE NVTX_EVENTS SET domainId = 7 WHERE rowid = {RANGE.format(1)}",
            ],
        ),
        ("a range without a thread", [f"UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid = {RANGE.format(1)}"]),
        ("a domain id below 0", [f"UPDATE NVTX_EVENTS SET domainId = -3 WHERE rowid = {RANGE.format(1)}"]),
        ("a domain id from 2^39", [f"UPDATE NVTX_EVENTS SET domainId = {2**39} WHERE rowid = {RANGE.format(1)}"]),
        (
            "a name too long for its page",
            [f"UPDATE NVTX_EVENTS SET text = printf('%.9000c', 'n') WHERE rowid = {RANGE.format(1)}"],
        ),
    ],
)
def test_what_the_page_route_does_not_read_goes_the_sql_way(tmp_path, case, edits):
    export = _edited(tmp_path, edits)
    try:
        with pytest.raises(sqlite_pages.Unsupported):
            _from_pages(export, {})
    finally:
        export.close()
    ranges = load_trace(export.path).nvtx  # loads, by DuckDB (or sqlite3 for the bytes DuckDB refuses)
    assert len(ranges) and ranges["name"].dtype == "category"


def test_text_not_in_utf8_is_read_from_pages_as_sqlite3_reads_it(tmp_path):
    """DuckDB refuses such text and sqlite3 (the SQL route's last resort) holds every range at once; the pages
    read it as sqlite3 does, the bytes replaced: two names that then read alike are one name, by either route."""
    export = _edited(
        tmp_path,
        [
            f"UPDATE NVTX_EVENTS SET text = CAST(X'66ff6f' AS TEXT), textId = NULL WHERE rowid = {RANGE.format(1)}",
            f"UPDATE NVTX_EVENTS SET text = CAST(X'66fe6f' AS TEXT), textId = NULL WHERE rowid = {RANGE.format(2)}",
            # an emit_nvtx name, cut at its numbering, and a domain's name
            f"UPDATE NVTX_EVENTS SET text = CAST(X'ff' AS TEXT) || ', seq = 3, op_id = 4', textId = NULL WHERE rowid = {RANGE.format(3)}",
            f"INSERT INTO NVTX_EVENTS (start, eventType, text, globalTid, domainId) VALUES (-5, 75, CAST(X'64ff' AS TEXT), {THREAD}, 7)",
            f"UPDATE NVTX_EVENTS SET domainId = 7 WHERE rowid = {RANGE.format(4)}",
        ],
    )
    try:
        dropped_pages, dropped_sql = {}, {}
        pages = _from_pages(export, dropped_pages)
        sql = _from_sql(export, dropped_sql)
    finally:
        export.close()
    pd.testing.assert_frame_equal(pages, sql)
    assert dropped_pages == dropped_sql
    names = pages["name"].astype(str)
    assert (names == "f\ufffdo").sum() == 2 and (names == "\ufffd").sum() == 1
    assert names.str.startswith("d\ufffd:").sum() == 1


@pytest.mark.parametrize("capture", ["h200_sft_data_stall.sqlite", "nsys2025/h200_sft_clean_metrics.sqlite"])
def test_a_ranges_pid_and_tid_are_its_threads(capture):
    """The store keeps a range's global_tid only; its pid is the process nsys lists for that thread (PROCESSES,
    by globalPid), its tid the global_tid's low 24 bits, for every thread with ranges."""
    path = REPO / "tests" / "fixtures" / capture
    ranges = load_trace(path).nvtx
    with contextlib.closing(sqlite3.connect(read_only_uri(path), uri=True)) as con:
        pids = dict(con.execute("SELECT globalPid, pid FROM PROCESSES"))
    threads = ranges[["global_tid", "pid", "tid"]].drop_duplicates()
    assert len(threads) >= 2
    for global_tid, pid, tid in threads.itertuples(index=False):
        assert pid == pids[global_tid >> 24 << 24]
        assert tid == global_tid & 0xFFFFFF and 0 < tid < 1 << 24


def test_ranges_of_many_threads_are_laid_out_by_thread_and_read_alike(tmp_path, monkeypatch):
    """Ranges of more threads than NVTX_THREADS_APART are stored by thread and start (the analyses read a thread's
    ranges a window at a time), and every table and finding is what the ranges as loaded give."""
    spread = "UPDATE NVTX_EVENTS SET globalTid = (globalTid >> 24 << 24) | (1000 + rowid % 24)"
    path = edited_export(tmp_path, "NVTX_EVENTS", ["INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS"] * 6 + [spread])

    def stored(tables) -> dict[str, np.ndarray]:
        tables.events.con.execute("SET threads = 1")  # a scan on one thread gives the rows as they are stored
        rows = tables.events.con.execute("SELECT global_tid, start FROM nvtx_rows").fetchnumpy()
        events_module.bound(tables.events.con, None)  # its threads again
        return rows

    def by_thread(rows) -> bool:
        return (np.lexsort((rows["start"], rows["global_tid"])) == np.arange(len(rows["start"]))).all()

    monkeypatch.setattr(events_module, "NVTX_THREADS_APART", 10**9)
    loaded = load_trace(path)
    assert not by_thread(stored(loaded))
    as_loaded = analyze(loaded)
    monkeypatch.setattr(events_module, "NVTX_THREADS_APART", 16)
    tables = load_trace(path)
    rows = stored(tables)
    assert len(np.unique(rows["global_tid"])) == 24 and len(rows["start"]) > 1_000 and by_thread(rows)
    laid_out = analyze(tables)
    assert laid_out.tables.keys() == as_loaded.tables.keys() and laid_out.findings == as_loaded.findings
    for name, table in as_loaded.tables.items():
        pd.testing.assert_frame_equal(laid_out.tables[name], table, obj=name)
