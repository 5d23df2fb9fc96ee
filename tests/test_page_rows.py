"""OS-runtime calls, memory operations and sync events are read by one SQL each, run by DuckDB on the
table's pages as sqlite_pages decodes them (nsys_sqlite._page_chunks), a chunk at a time into the event store, or
on the table through DuckDB's SQLite reader where the decoder does not read it: both give the same rows, names
and rows dropped, on the export as captured and on damaged rows."""

from __future__ import annotations

import inspect

import pandas as pd
import pytest

from sftprof.trace.events import EventStore
from sftprof.trace.nsys import nsys_sqlite, sqlite_pages
from sftprof.trace.nsys.nsys_export import SqliteExport

from conftest import REPO, edited_export

FIXTURES = REPO / "tests" / "fixtures"

ROW = "(SELECT rowid FROM {table} {where} ORDER BY rowid LIMIT 1 OFFSET {n})"
CALL = {"table": "OSRT_API", "where": f"WHERE eventClass = {nsys_sqlite.OSRT_CALL_CLASS}"}
COPY = {"table": "CUPTI_ACTIVITY_KIND_MEMSET", "where": ""}
EDITS = {
    "as captured": ("OSRT_API", []),
    "damaged calls": (  # NOT NULL is taken off the schema first, as a hostile file may have it
        "OSRT_API",
        [
            f"UPDATE OSRT_API SET start = NULL WHERE rowid = {ROW.format(n=0, **CALL)}",
            f'UPDATE OSRT_API SET "end" = start - 1 WHERE rowid = {ROW.format(n=1, **CALL)}',
            f"UPDATE OSRT_API SET eventClass = NULL WHERE rowid = {ROW.format(n=2, **CALL)}",
            f"UPDATE OSRT_API SET nameId = 999999 WHERE rowid = {ROW.format(n=3, **CALL)}",  # not in StringIds
            f"UPDATE OSRT_API SET globalTid = NULL WHERE rowid = {ROW.format(n=4, **CALL)}",
            f"UPDATE OSRT_API SET start = 1 WHERE rowid = {ROW.format(n=8, **CALL)}",  # out of start order
        ],
    ),
    "damaged memsets": (
        "CUPTI_ACTIVITY_KIND_MEMSET",
        [
            f"UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET start = NULL WHERE rowid = {ROW.format(n=0, **COPY)}",
            f"UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET memKind = NULL WHERE rowid = {ROW.format(n=1, **COPY)}",
            f"UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET memKind = 77 WHERE rowid = {ROW.format(n=2, **COPY)}",
            f"UPDATE CUPTI_ACTIVITY_KIND_MEMSET SET start = 1 WHERE rowid = {ROW.format(n=9, **COPY)}",
        ],
    ),
    "a time that is not an integer": (  # the decoder does not read it: the SQL route, whatever it says
        "OSRT_API",
        [f"UPDATE OSRT_API SET start = start + 0.5 WHERE rowid = {ROW.format(n=6, **CALL)}"],
    ),
}


def _outcome(read):
    """What a read gives: its rows, or the type of what it raised (the loader turns it into one line)."""
    try:
        return read()
    except Exception as error:
        return type(error)


def _tables(path) -> dict:
    export = SqliteExport(path)
    try:
        strings, dropped = nsys_sqlite._strings(export), {}
        read = {
            "osrt": _outcome(lambda: _osrt(export, strings, dropped)),
            "memops": _outcome(lambda: _labelled(nsys_sqlite._memops, "memops", export, 2022, dropped=dropped)),
            "sync": _outcome(lambda: _labelled(nsys_sqlite._sync, "sync", export, dropped=dropped)),
        }
    finally:
        export.close()
    return {**read, "dropped": dropped}


def _osrt(export, strings, dropped) -> pd.DataFrame:
    """The OS-runtime calls the loader copies into a store, as the store gives them back."""
    store = EventStore(on_disk=False)
    nsys_sqlite._osrt(export, strings, store, dropped)
    return store.osrt_frame()


def _labelled(copy, table: str, *args, dropped) -> pd.DataFrame:
    """The memory operations or syncs the loader copies into a store, as the store gives them back."""
    store = EventStore(on_disk=False)
    copy(*args, store, dropped)
    return store.labelled_frame(table)


def _not_decoded(*args, **kwargs):
    raise sqlite_pages.Unsupported("the SQL route, for this test")


@pytest.mark.parametrize("case", EDITS)
def test_the_pages_and_the_sqlite_reader_give_the_same_rows(tmp_path, monkeypatch, case):
    table, edits = EDITS[case]
    path = edited_export(tmp_path, table, edits)
    monkeypatch.setattr(nsys_sqlite, "PAGE_ROWS_CHUNK_BYTES", 1)  # a page at a time: many chunks to join
    pages = _tables(path)
    monkeypatch.setattr(sqlite_pages, "int_columns", _not_decoded)
    sql = _tables(path)
    for name in ("osrt", "memops", "sync"):
        if isinstance(sql[name], type):
            assert pages[name] is sql[name], name
        else:
            pd.testing.assert_frame_equal(pages[name], sql[name])
            assert len(pages[name]) > 20 and pages[name]["start"].is_monotonic_increasing
    assert pages["dropped"] == sql["dropped"]
    if case.startswith("damaged"):
        assert sum(pages["dropped"].values()) >= 1


def test_page_reads_lists_what_the_loader_decodes(monkeypatch):
    """benchmarks/floor.py decodes nsys_sqlite.PAGE_READS as the floor under loading: it must be what load_trace
    decodes, table for table, with the same columns and chunks, on a capture that has every such table."""
    from sftprof.trace import load_trace

    export = FIXTURES / "nsys2025" / "h200_sft_clean_metrics.sqlite"
    decoded, raw_columns = set(), sqlite_pages.raw_columns
    signature = inspect.signature(raw_columns)

    def recording(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        table, columns, chunk = call.arguments["table"], call.arguments["columns"], call.arguments["chunk_bytes"]
        decoded.add((table, tuple(columns), chunk, call.arguments["text"] is not None))
        return raw_columns(*args, **kwargs)

    monkeypatch.setattr(sqlite_pages, "raw_columns", recording)
    load_trace(export)
    listed = {
        (table, tuple(columns), chunk or sqlite_pages.CHUNK_BYTES, table == "NVTX_EVENTS")
        for table, columns, chunk in nsys_sqlite.PAGE_READS
    }
    assert len(decoded) == len(nsys_sqlite.PAGE_READS)
    assert decoded == listed
