"""NVTX ranges read from the export's pages (nsys_sqlite._nvtx_from_pages) against the SQL route
(_coded_names, DuckDB) on the same file: the same rows, names, styles and order, the same rows dropped;
and the SQL route, never a different answer, for what the page route does not read."""

from __future__ import annotations

import mmap

import numpy as np
import pandas as pd
import pytest

from sftprof.trace import load_trace, nsys_sqlite, sqlite_pages
from sftprof.trace.nsys_export import SqliteExport
from sftprof.trace.tables import valid_rows

from conftest import edited_export

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


@pytest.mark.parametrize("case", EDITS)
def test_ranges_read_from_pages_are_those_sql_reads(tmp_path, case):
    export = _edited(tmp_path, EDITS[case])
    try:
        dropped_pages, dropped_sql = {}, {}
        pages = valid_rows(nsys_sqlite._nvtx_from_pages(export, nsys_sqlite._strings(export)), "nvtx", dropped_pages)
        sql = nsys_sqlite._narrow_thread_ids(nsys_sqlite._nvtx_by_sql(export, dropped_sql))
    finally:
        export.close()
    pd.testing.assert_frame_equal(pages, sql)
    assert dropped_pages == dropped_sql
    if case == "domains and registered strings":  # the edits reached the names
        assert {"mine:aten::add", "cut", "aten::add"} <= set(pages["name"].dropna()) and pages["name"].isna().sum() == 1
        assert "mine:only in mine" in set(pages["name"]) and "only in mine" not in pages["name"].cat.categories
    if case == "no range ever ends":
        assert pages.empty and dropped_pages["nvtx"] > 0
    if case == "damaged values":
        assert dropped_pages["nvtx"] == 4  # NULL start, end at 2^63 - 1, start at -(2^63 - 1), end before start


def test_ranges_read_a_page_at_a_time_are_those_read_at_once(tmp_path, monkeypatch):
    """Ranges over many pages, read a page a chunk: each kept column grows chunk by chunk from 8 bytes, and
    a NULL mask starts where its first NULL is (half way, a range without a domain) and grows on."""
    edits = ["INSERT INTO NVTX_EVENTS SELECT * FROM NVTX_EVENTS"] * 7  # 128 times the rows
    last = "(SELECT max(rowid) FROM NVTX_EVENTS WHERE eventType = 59)"
    middle = "(SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY rowid LIMIT 1 OFFSET 1500)"
    edits += [f"UPDATE NVTX_EVENTS SET domainId = NULL WHERE rowid = {middle}"]
    edits += [f'UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid = {last}']
    export = _edited(tmp_path, edits)
    try:
        whole = nsys_sqlite._nvtx_from_pages(export, nsys_sqlite._strings(export))
        monkeypatch.setattr(sqlite_pages, "CHUNK_BYTES", 1)
        monkeypatch.setattr(nsys_sqlite, "KEPT_START_BYTES", 8)
        paged = nsys_sqlite._nvtx_from_pages(export, nsys_sqlite._strings(export))
        chunks = sum(1 for _ in sqlite_pages.raw_columns(export.path, "NVTX_EVENTS", ["start"], chunk_bytes=1))
        sql = nsys_sqlite._nvtx_by_sql(export, {})
    finally:
        export.close()
    assert chunks > 20 and len(whole) > 2_000
    pd.testing.assert_frame_equal(paged, whole)
    pd.testing.assert_frame_equal(valid_rows(paged, "nvtx", {}), nsys_sqlite._narrow_thread_ids(sql))


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
        (
            "text not in UTF-8",
            [f"UPDATE NVTX_EVENTS SET text = CAST(X'66ff6f' AS TEXT) WHERE rowid = {RANGE.format(1)}"],
        ),
        ("a range without a thread", [f"UPDATE NVTX_EVENTS SET globalTid = NULL WHERE rowid = {RANGE.format(1)}"]),
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
            nsys_sqlite._nvtx_from_pages(export, nsys_sqlite._strings(export))
    finally:
        export.close()
    ranges = load_trace(export.path).nvtx  # loads, by DuckDB (or sqlite3 for the bytes DuckDB refuses)
    assert len(ranges) and ranges["name"].dtype == "category"


@pytest.mark.parametrize("mremap", [True, False], ids=["grown in place", "no mremap"])
def test_kept_columns_hold_each_chunks_rows_in_order(monkeypatch, mremap):
    """_Kept grows its mapping in place (Linux's mremap) or, where the system has none, into a new one with a
    copy; a NULL mask holds nothing until its first NULL, and reads False before it."""
    if not mremap:

        class NoMremap(mmap.mmap):
            def resize(self, size):
                raise SystemError("mmap: resizing not available--no mremap()")

        monkeypatch.setattr(nsys_sqlite.mmap, "mmap", NoMremap)
    monkeypatch.setattr(nsys_sqlite, "KEPT_START_BYTES", 8)
    rng = np.random.default_rng(2)
    values, mask = nsys_sqlite._Kept(np.int64, masks=False), nsys_sqlite._Kept(bool, masks=True)
    expected, expected_mask = [], []
    for chunk in range(40):
        rows, keep = rng.integers(-(2**62), 2**62, 300), rng.random(300) < 0.4
        nulls = rng.random(300) < 0.1 if chunk in (11, 30) else None  # NULLs in two chunks only
        values.add(rows, keep, int(keep.sum()))
        mask.add(nulls, keep, int(keep.sum()))
        expected.append(rows[keep])
        expected_mask.append(np.zeros(int(keep.sum()), bool) if nulls is None else nulls[keep])
    assert (values.array() == np.concatenate(expected)).all()
    assert (mask.array() == np.concatenate(expected_mask)).all() and mask.array().any()
    assert nsys_sqlite._Kept(bool, masks=True).array() is None
