"""OS-runtime calls read from the export's pages (nsys_sqlite._osrt_from_pages) against the SQL route
(_osrt_by_sql, DuckDB's SQLite reader) on the same file: the same calls, names and rows dropped; and the
SQL route, never a different answer, for what the page route does not read."""

from __future__ import annotations

import pandas as pd
import pytest

from sftprof.trace import nsys_sqlite, sqlite_pages
from sftprof.trace.nsys_export import SqliteExport
from sftprof.trace.tables import valid_rows

from conftest import edited_export

CALL = (
    f"(SELECT rowid FROM OSRT_API WHERE eventClass = {nsys_sqlite.OSRT_CALL_CLASS} ORDER BY rowid LIMIT 1 OFFSET {{}})"
)
EDITS = {
    "as captured": [],
    "damaged and foreign rows": [  # NOT NULL is taken off the schema first, as a hostile file may have it
        f"UPDATE OSRT_API SET start = NULL WHERE rowid = {CALL.format(0)}",
        f'UPDATE OSRT_API SET "end" = start - 1 WHERE rowid = {CALL.format(1)}',
        f"UPDATE OSRT_API SET eventClass = NULL WHERE rowid = {CALL.format(2)}",
        f"UPDATE OSRT_API SET nameId = 999999 WHERE rowid = {CALL.format(3)}",  # a name StringIds lacks
        f"UPDATE OSRT_API SET nameId = NULL WHERE rowid = {CALL.format(4)}",
        f"UPDATE OSRT_API SET start = 1 WHERE rowid = {CALL.format(8)}",  # out of start order
        f"UPDATE OSRT_API SET start = (SELECT start FROM OSRT_API WHERE rowid = {CALL.format(10)}) "
        f"WHERE rowid = {CALL.format(12)}",  # a tie, out of order too
    ],
}
NOT_READ = {  # what only the SQL route reads
    "a call without a thread": f"UPDATE OSRT_API SET globalTid = NULL WHERE rowid = {CALL.format(5)}",
    "a time that is not an integer": f"UPDATE OSRT_API SET start = start + 0.5 WHERE rowid = {CALL.format(6)}",
}


def _edited(tmp_path, edits) -> SqliteExport:
    return SqliteExport(edited_export(tmp_path, "OSRT_API", edits))


def _named(calls: pd.DataFrame, strings: pd.DataFrame, dropped: dict) -> pd.DataFrame:
    names = pd.Series(strings["value"].to_numpy(), index=strings["id"].to_numpy())
    rows = valid_rows(calls.assign(name=calls["name"].map(names[~names.index.duplicated()])), "osrt", dropped)
    return rows.sort_values(list(rows.columns), kind="stable").reset_index(drop=True)  # SQL's ties: any order


@pytest.mark.parametrize("case", EDITS)
def test_calls_read_from_pages_are_those_sql_reads(tmp_path, case):
    export = _edited(tmp_path, EDITS[case])
    try:
        strings = nsys_sqlite._strings(export)
        dropped_pages, dropped_sql = {}, {}
        ids = pd.Index(strings["id"]).drop_duplicates()
        pages = _named(nsys_sqlite._osrt_from_pages(export, ids), strings, dropped_pages)
        sql = _named(nsys_sqlite._osrt_by_sql(export, strings), strings, dropped_sql)
        whole = nsys_sqlite._osrt(export, strings, {})
    finally:
        export.close()
    pd.testing.assert_frame_equal(pages, sql)
    assert dropped_pages == dropped_sql
    assert len(whole) == len(pages) > 20 and whole["start"].is_monotonic_increasing
    if case != "as captured":
        assert dropped_pages["osrt"] == 2  # the NULL start, the end before its start


def _outcome(read):
    """What a read gives: its rows, or the type of what it raised."""
    try:
        return len(read())
    except Exception as error:  # the SQL route's own errors: the loader turns them into one line
        return type(error)


@pytest.mark.parametrize("case", NOT_READ)
def test_what_the_pages_do_not_read_goes_the_sql_route(tmp_path, case):
    export = _edited(tmp_path, [NOT_READ[case]])
    try:
        strings = nsys_sqlite._strings(export)
        with pytest.raises(sqlite_pages.Unsupported):
            nsys_sqlite._osrt_from_pages(export, pd.Index(strings["id"]).drop_duplicates())
        whole = _outcome(lambda: nsys_sqlite._osrt(export, strings, {}))
        sql = _outcome(lambda: nsys_sqlite._osrt_by_sql(export, strings))
    finally:
        export.close()
    assert whole == sql and (isinstance(sql, type) or sql > 20)
