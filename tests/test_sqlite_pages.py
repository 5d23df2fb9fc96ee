"""The page decoder (sftprof/trace/nsys/sqlite_pages.py) against SQLite itself: same values, same order,
and Unsupported, never a wrong value, for anything it does not decode."""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof.trace.load import load_trace
from sftprof.trace.nsys import sqlite_pages
from sftprof.trace.nsys.nsys_export import EXPORT_KERNEL_COLUMNS

FIXTURES = Path(__file__).parent / "fixtures"
NSYS_EXPORTS = sorted(p for p in FIXTURES.glob("h200_*.sqlite"))
KERNEL_COLUMNS = list(EXPORT_KERNEL_COLUMNS)
# Every integer width SQLite stores (1, 2, 3, 4, 6, 8 bytes), both signs, each side of each boundary,
# the constants 0 and 1 (serial types 8 and 9), and NULL.
EDGES = [
    0,
    1,
    -1,
    2,
    127,
    -128,
    128,
    -129,
    32767,
    -32768,
    32768,
    2**23 - 1,
    -(2**23),
    2**23,
    2**31 - 1,
    -(2**31),
    2**31,
    2**47 - 1,
    -(2**47),
    2**47,
    2**63 - 1,
    -(2**63),
    None,
]


def decoded(path, table, columns, chunk_bytes=sqlite_pages.CHUNK_BYTES) -> pd.DataFrame:
    """Every chunk copied (the decoder reuses its buffers), as one frame with NULLs as <NA>."""
    chunks = [chunk.copy() for chunk in sqlite_pages.int_columns(path, table, columns, chunk_bytes)]
    return pd.concat(chunks, ignore_index=True).astype("Int64") if chunks else pd.DataFrame(columns=columns)


def sqlite_rows(path, table, columns) -> pd.DataFrame:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT {', '.join(f'[{c}]' for c in columns)} FROM {table} ORDER BY rowid").fetchall()
    return pd.DataFrame(rows, columns=columns, dtype="object").astype("Int64")


def make_table(path: Path, rows: list[tuple], page_size: int = 4096, columns: int = 6, extra_sql: str = "") -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA page_size = {page_size}")
        conn.execute(f"CREATE TABLE t ({', '.join(f'c{i} INTEGER' for i in range(columns))})")
        conn.executemany(f"INSERT INTO t VALUES ({', '.join('?' * columns)})", rows)
        if extra_sql:
            conn.executescript(extra_sql)


@pytest.mark.parametrize("export", NSYS_EXPORTS, ids=lambda p: p.stem)
def test_nsys_exports_decode_as_sqlite_reads_them(export):
    # 4-page chunks: many chunks, so reused buffers and chunk edges are exercised
    for table, columns in (
        ("CUPTI_ACTIVITY_KIND_KERNEL", KERNEL_COLUMNS),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", ["start", "end", "nameId", "globalTid", "correlationId"]),
    ):
        expected = sqlite_rows(export, table, columns)
        assert len(expected) > 100
        pd.testing.assert_frame_equal(decoded(export, table, columns, chunk_bytes=4 * 4096), expected)


@pytest.fixture(params=[1, 3], ids=["1 thread", "3 threads"])
def threads(request, monkeypatch):
    """Chunks decoded in turn, or cut into parts decoded side by side (sqlite_pages.Parts)."""
    monkeypatch.setattr(sqlite_pages, "usable_cores", lambda: request.param)
    return request.param


@pytest.mark.parametrize("page_size", [512, 4096, 65536])
def test_every_integer_width_null_and_deep_btrees(tmp_path, page_size, threads):
    rng = random.Random(page_size)
    rows = [
        tuple(rng.choice(EDGES) if rng.random() < 0.7 else rng.randint(-(2**63), 2**63 - 1) for _ in range(6))
        for _ in range(30_000)
    ]
    path = tmp_path / "t.sqlite"
    # deleted rows leave free blocks in their pages; 512-byte pages make a b-tree three levels deep
    make_table(path, rows, page_size, extra_sql="DELETE FROM t WHERE rowid % 7 = 3;")
    columns = ["c5", "c0", "c3"]  # out of order, and not every column
    pd.testing.assert_frame_equal(
        decoded(path, "t", columns, chunk_bytes=3 * page_size), sqlite_rows(path, "t", columns)
    )


def test_rows_written_before_a_column_was_added_read_as_null(tmp_path):
    path = tmp_path / "t.sqlite"
    make_table(
        path,
        [(1, 2), (3, 4)],
        columns=2,
        extra_sql="ALTER TABLE t ADD COLUMN c2 INTEGER; INSERT INTO t VALUES (5, 6, 7);",
    )
    frame = decoded(path, "t", ["c0", "c2"])
    assert frame["c0"].tolist() == [1, 3, 5]
    assert frame["c2"].isna().tolist() == [True, True, False] and frame["c2"].iloc[2] == 7


@pytest.mark.parametrize("count", [1, 5, 64])
def test_leaves_are_listed_as_asked_for_a_few_parents_at_a_time(tmp_path, monkeypatch, count):
    path = tmp_path / "t.sqlite"
    make_table(path, [(i, -i) for i in range(30_000)], page_size=512, columns=2)  # three levels deep
    with sqlite3.connect(path) as conn:
        in_order = [
            page
            for (page,) in conn.execute(
                "SELECT pageno FROM dbstat WHERE name = 't' AND pagetype = 'leaf' ORDER BY path"
            )
        ]
    root = sqlite_pages._table(path, "t", ["c0"])[0]
    monkeypatch.setattr(sqlite_pages, "LEAF_PARENTS", 2)  # the leaves' parents, two at a time: many batches to cut
    handle = os.open(path, os.O_RDONLY)
    try:
        listed = list(sqlite_pages._leaves(handle, root, 512, 512, count))
    finally:
        os.close(handle)
    assert len(in_order) > 2 * count * 2
    assert [len(leaves) for leaves in listed[:-1]] == [count] * (len(listed) - 1) and 0 < len(listed[-1]) <= count
    assert np.concatenate(listed).tolist() == in_order
    pd.testing.assert_frame_equal(decoded(path, "t", ["c1"], chunk_bytes=count * 512), sqlite_rows(path, "t", ["c1"]))


def test_empty_table_yields_nothing(tmp_path):
    path = tmp_path / "t.sqlite"
    make_table(path, [])
    assert list(sqlite_pages.int_columns(path, "t", ["c0"])) == []


# Damage to the table's root, an interior page (2000 rows fill several leaves): (offset, bytes) written into it.
DAMAGED_ROOTS = {
    "root page its own child": None,  # no cells, and the rightmost child is the page itself: a walk that never ends
    "interior cell pointer out of its page": (12, b"\xff\xff"),
    "child page 0": (8, b"\0\0\0\0"),
}


def damage_root(path: Path, case: str) -> None:
    with sqlite3.connect(path) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 't'").fetchone()[0]
    data, at = bytearray(path.read_bytes()), (root - 1) * 4096
    assert data[at] == sqlite_pages.TABLE_INTERIOR
    offset, value = DAMAGED_ROOTS[case] or (3, b"\0\0\0\0\0" + root.to_bytes(4, "big"))
    data[at + offset : at + offset + len(value)] = value
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "case",
    [
        "text value",
        "real value",
        "overflowing record",
        "damaged cell pointer",
        *DAMAGED_ROOTS,
        "WAL file",
        "hot journal",
        "WITHOUT ROWID",
        "rowid alias",
        "default value",
        "no such table",
    ],
)
def test_what_it_does_not_decode_is_unsupported_not_misread(tmp_path, case, threads):
    path = tmp_path / "t.sqlite"
    rows = [(i, i * 3, -i) for i in range(2000)]
    table, columns = "t", ["c1", "c2"]
    if case == "text value":
        make_table(path, rows + [(1, "abc", 3)], columns=3)
    elif case == "real value":
        make_table(path, rows + [(1, 2.5, 3)], columns=3)
    elif case == "overflowing record":
        make_table(path, rows + [(b"x" * 10_000, 2, 3)], columns=3)
    elif case == "damaged cell pointer":
        make_table(path, rows, columns=3)
        data = bytearray(path.read_bytes())
        leaf = next(start for start in range(4096, len(data), 4096) if data[start] == sqlite_pages.TABLE_LEAF)
        data[leaf + 8 : leaf + 10] = b"\xff\xf0"  # the first cell "starts" 16 bytes before the page ends
        path.write_bytes(bytes(data))
    elif case in DAMAGED_ROOTS:
        make_table(path, rows, columns=3)
        damage_root(path, case)
    elif case == "WAL file":
        make_table(path, rows, columns=3)
        with sqlite3.connect(path) as conn:
            conn.execute("PRAGMA journal_mode = WAL")
    elif case == "hot journal":
        make_table(path, rows, columns=3)
        Path(f"{path}-journal").write_bytes(b"\0" * 512)
    elif case == "WITHOUT ROWID":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE w (c0 INTEGER PRIMARY KEY, c1 INTEGER, c2 INTEGER) WITHOUT ROWID")
            conn.executemany("INSERT INTO w VALUES (?, ?, ?)", rows)
        table = "w"
    elif case == "rowid alias":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE a (c0 INTEGER PRIMARY KEY, c1 INTEGER, c2 INTEGER)")
            conn.executemany("INSERT INTO a VALUES (?, ?, ?)", rows)
        table, columns = "a", ["c0", "c1"]
    elif case == "default value":
        make_table(path, rows, columns=3, extra_sql="ALTER TABLE t ADD COLUMN c3 INTEGER DEFAULT 9;")
        columns = ["c3"]
    else:
        make_table(path, rows, columns=3)
        table = "missing"
    with pytest.raises(sqlite_pages.Unsupported):
        decoded(path, table, columns)


def test_a_leaf_claiming_more_cells_than_fit_is_unsupported_before_arrays_are_sized_by_it(tmp_path):
    path = tmp_path / "t.sqlite"
    make_table(path, [(i, i * 3, -i) for i in range(2000)], columns=3)
    data = bytearray(path.read_bytes())
    leaf = next(start for start in range(4096, len(data), 4096) if data[start] == sqlite_pages.TABLE_LEAF)
    data[leaf + 3 : leaf + 5] = b"\xff\xff"  # 65535 cells: a chunk of such pages would ask for gigabytes
    path.write_bytes(bytes(data))
    with pytest.raises(sqlite_pages.Unsupported, match="more cells than fit"):
        decoded(path, "t", ["c1"])


def test_fallback_reads_the_file_named_even_when_its_name_holds_uri_characters(monkeypatch, tmp_path):
    """`?` and `#` end the path of an unescaped SQLite URI, `%41` decodes to `A`: each opened another file."""
    export = tmp_path / "a?mode=rwc#b%41.sqlite"
    export.write_bytes((FIXTURES / "h200_plant_clean.sqlite").read_bytes())
    expected = load_trace(export).events.frame("kernels")

    def unsupported(*args, **kwargs):
        raise sqlite_pages.Unsupported("read it through SQLite")
        yield

    monkeypatch.setattr(sqlite_pages, "int_columns", unsupported)
    fallen_back = load_trace(export).events.frame("kernels")
    assert len(expected) > 1000
    pd.testing.assert_frame_equal(in_full_order(fallen_back), in_full_order(expected))
    assert sorted(p.name for p in tmp_path.iterdir()) == [export.name]


@pytest.mark.parametrize("export", ["h200_tiny_llama_bf16.sqlite", "nsys2025/h200_sft_clean_metrics.sqlite"])
def test_event_store_falls_back_to_sqlite_midway_with_the_same_tables(monkeypatch, export):
    """Every table the event store copies (the second capture: GPU metrics and context switches too)."""
    export = FIXTURES / export
    expected = load_trace(export)
    decode = sqlite_pages.int_columns

    def fails_after_one_chunk(*args, **kwargs):
        yield next(decode(*args, **{**kwargs, "chunk_bytes": 4 * 4096}))
        raise sqlite_pages.Unsupported("a value that is not an integer")

    monkeypatch.setattr(sqlite_pages, "int_columns", fails_after_one_chunk)
    fallen_back = load_trace(export)
    copied = ("kernels", "cuda_api") + (("gpu_metrics", "sched") if "metrics" in export.name else ())
    for table in copied:
        rows, rows_after_fallback = (tables.events.frame(table) for tables in (expected, fallen_back))
        assert len(rows) > 40
        pd.testing.assert_frame_equal(in_full_order(rows_after_fallback), in_full_order(rows))


def in_full_order(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


def test_columns_not_read_are_skipped_whatever_they_hold(tmp_path):
    """Text, a blob, a float and a long text (whose serial type takes two header bytes) before or between
    the integer columns read: skipped by their sizes, the integers read as SQLite reads them."""
    path = tmp_path / "t.sqlite"
    values = ["abc", b"\x00\x01", 2.5, "x" * 300, None, 7]
    rows = [(values[i % len(values)], i, values[(i + 1) % len(values)], -i) for i in range(3000)]
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (a, b INTEGER, c, d INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    pd.testing.assert_frame_equal(decoded(path, "t", ["b", "d"]), sqlite_rows(path, "t", ["b", "d"]))


CUT_BEFORE = (b", seq = ", b", op_id = ")


def _cut(text: str) -> str:
    from sftprof.trace.nsys.nsys_sqlite import _EMIT_NVTX_SUFFIX

    return _EMIT_NVTX_SUFFIX.sub("", text)


def test_text_codes_cut_as_the_pattern_does_and_name_each_text_once(tmp_path, threads):
    """Seeded random texts made of the markers' own pieces, digits and multi-byte characters: each code
    names the text the regex cut leaves (nsys_sqlite.EMIT_NVTX_NUMBERING), one code per distinct name, in
    small chunks so names recur across them; NULL is -1."""
    rng = random.Random(7)
    pieces = [", seq = ", ", op_id = ", ", seq", " = ", ",", "1", "42", "x", "é", "\u0663", "\n", "aten::mm"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 8))) for _ in range(4000)]
    texts[::97] = [None] * len(texts[::97])
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (n INTEGER, text TEXT)")
        conn.executemany("INSERT INTO t VALUES (?, ?)", list(enumerate(texts)))
    codes = sqlite_pages.TextCodes("text", CUT_BEFORE)
    chunks = [
        (values[0].copy(), code, cut)
        for values, _, code, cut in sqlite_pages.raw_columns(path, "t", ["n"], 4096, text=codes)
    ]
    numbers, text_codes, text_cut = (np.concatenate(column) for column in zip(*chunks))
    names = [name.decode("utf-8") for name in codes.names()]
    assert len(chunks) > 3 and len(names) == len(set(names))
    assert list(numbers) == list(range(len(texts)))
    for text, code, cut in zip(texts, text_codes, text_cut):
        if text is None:
            assert code == -1
        else:
            assert names[code] == _cut(text) and cut == (_cut(text) != text)


@pytest.mark.parametrize("case", ["blob in the text column", "overflowing text", "UTF-16 file"])
def test_a_text_column_it_cannot_read_as_text_is_unsupported(tmp_path, case):
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        if case == "UTF-16 file":
            conn.execute("PRAGMA encoding = 'UTF-16le'")
        conn.execute("CREATE TABLE t (n INTEGER, text TEXT)")
        value = {"blob in the text column": b"abc", "overflowing text": "y" * 10_000}.get(case, "abc")
        conn.executemany("INSERT INTO t VALUES (?, ?)", [(1, "a"), (2, value)])
    with pytest.raises(sqlite_pages.Unsupported):
        list(sqlite_pages.raw_columns(path, "t", ["n"], text=sqlite_pages.TextCodes("text", CUT_BEFORE)))


def test_a_text_that_shares_its_hash_with_another_name_is_found():
    """Two names with one hash (forced here: FNV-1a's 64 bits rarely meet): the second text is given the first
    name's code, and the check of every text against its code's name fails, so the caller reads another way."""
    pages = np.frombuffer(b"aten::mmaten::mv", dtype=np.uint8)
    text_at, lengths = np.array([0, 8]), np.array([8, 8])
    slots, hashes = np.full(8, -1, np.int64), np.zeros(2, np.int64)
    names, offsets, codes = np.zeros(16, np.uint8), np.zeros(3, np.int64), np.empty(2, np.int64)
    for digests, count, same in (([7, 7], 1, False), ([7, 9], 2, True)):
        slots[:] = -1
        assert (
            sqlite_pages._intern(pages, text_at, lengths, np.array(digests), 2, slots, hashes, names, offsets, 0, codes)
            == count
        )
        assert sqlite_pages._verify(pages, text_at, lengths, codes, names, offsets, 0, 2) is same
