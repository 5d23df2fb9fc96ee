"""Integer columns of an SQLite table read straight from the file's table b-tree (the documented
file format: https://www.sqlite.org/fileformat2.html), decoded by numba-compiled loops.

Why: copying kernels and CUDA API calls out of an nsys export was the slowest part of analysing
it. At 10M kernels (22M API calls) DuckDB's SQLite reader spent 22 s of CPU on the two tables; this
decoder spends 5 s, and the whole copy into DuckDB fell from 16-19 s to 9-10 s (benchmarks/ENGINE.md).

Only the files nsys writes take this path: a rollback-journal database with no hot journal, a
rowid table whose records fit in their page and hold integers or NULLs in the columns up to the last
one read. Anything else raises Unsupported, before or during the read, and the caller reads the
table through SQLite instead; so does damage (a page number, cell pointer or record out of its
bounds, an interior page reached twice): every offset is checked, and every walk ends.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numba
import numpy as np
import pandas as pd

from sftprof.trace.events import read_only_uri

# Pages decoded and inserted at a time: 64 MiB, ~1M kernels or ~2.4M API calls. DuckDB pays per
# INSERT: at 10M kernels, 16 MiB chunks took 15 s to copy, 64 MiB 9.4 s, 128 MiB 9.7 s.
CHUNK_BYTES = 64 << 20
HEADER = b"SQLite format 3\x00"
TABLE_INTERIOR, TABLE_LEAF = 0x05, 0x0D
INTERIOR_HEADER = 12  # bytes: type, first free block, cells, cell content start, fragmented bytes, rightmost child


class Unsupported(Exception):
    """The file or table uses something this reader does not decode: read it through SQLite."""


@numba.njit(cache=True, nogil=True)  # compiled on first use, then loaded from numba's cache
def _decode(pages, page_size, usable, slot, out, missing):
    """Decode every cell of the leaf pages in `pages` (concatenated) into `out` (one row per
    wanted column; `slot[c]` is column c's row, or -1) and `missing` (NULLs). Returns the number
    of records, or -1 for a page that is not a table leaf, -2 for a record that overflows its
    page, -3 for a value that is not an integer or NULL, -4 for a cell outside its page (every
    offset is checked: compiled code does not check its indexes)."""
    row = 0
    for base in range(0, len(pages), page_size):
        if pages[base] != TABLE_LEAF:
            return -1
        cells = (np.int64(pages[base + 3]) << 8) | pages[base + 4]
        if 8 + 2 * cells > usable:
            return -4
        for i in range(cells):
            offset = (np.int64(pages[base + 8 + 2 * i]) << 8) | pages[base + 9 + 2 * i]
            if offset < 8 + 2 * cells or offset >= usable:
                return -4
            pos, end = base + offset, base + usable
            payload = np.int64(0)
            for k in range(9):  # payload size: a varint
                if pos >= end:
                    return -4
                byte = pages[pos]
                pos += 1
                if k == 8:
                    payload = (payload << 8) | byte
                    break
                payload = (payload << 7) | (byte & 0x7F)
                if byte < 0x80:
                    break
            if payload > usable - 35:
                return -2
            for k in range(9):  # the rowid: skipped
                if pos >= end:
                    return -4
                byte = pages[pos]
                pos += 1
                if k == 8 or byte < 0x80:
                    break
            if pos >= end:
                return -4
            header_size = np.int64(pages[pos])
            if header_size >= 0x80:
                return -3
            body = pos + header_size
            if body > end:
                return -4
            for column in range(len(slot)):
                # serial types 0-9 are single header bytes: NULL, big-endian integers of
                # 1, 2, 3, 4, 6 and 8 bytes, a float (7), and the constants 0 and 1
                kind = pages[pos + 1 + column] if column < header_size - 1 else 0
                if kind == 7 or kind > 9:
                    return -3
                size = kind if kind <= 4 else (6 if kind == 5 else (8 if kind == 6 else 0))
                if body + size > end:
                    return -4
                target = slot[column]
                if target >= 0:
                    if kind == 0:
                        missing[target, row] = True
                        out[target, row] = 0
                    elif kind >= 8:
                        out[target, row] = kind - 8
                    else:
                        value = np.int64(np.int8(pages[body]))  # sign from the first byte
                        for q in range(1, size):
                            value = (value << 8) | pages[body + q]
                        out[target, row] = value
                body += size
            row += 1
    return row


def _read_into(handle: int, buffer, offset: int) -> None:
    if os.preadv(handle, [buffer], offset) != len(buffer):
        raise Unsupported("the file ends inside a page")


def _read(handle: int, offset: int, size: int) -> bytearray:
    buffer = bytearray(size)
    _read_into(handle, buffer, offset)
    return buffer


def _table(path: Path, table: str, columns: list[str]) -> tuple[int, np.ndarray]:
    """The table's root page, and for each of its columns up to the last wanted one, the position
    of that column in `columns` (or -1)."""
    with sqlite3.connect(read_only_uri(path), uri=True) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    if root is None or not root[0]:
        raise Unsupported(f"no table {table}")
    names = [row[1] for row in info]
    for name in columns:
        if name not in names:
            raise Unsupported(f"{table} has no column {name}")
        _, _, declared, _, default, primary_key = info[names.index(name)]
        if primary_key and declared.upper() == "INTEGER":
            raise Unsupported(f"{table}.{name} is the rowid (not stored in the record)")
        if default is not None:  # records written before an ALTER TABLE ADD COLUMN hold no value
            raise Unsupported(f"{table}.{name} has a default value")
    slot = np.full(max(names.index(name) for name in columns) + 1, -1, dtype=np.int64)
    for position, name in enumerate(columns):
        slot[names.index(name)] = position
    return int(root[0]), slot


def _leaves(handle: int, root: int, page_size: int, usable: int) -> np.ndarray:
    """The table's leaf pages in rowid order. All leaves of a b-tree are at the same depth, so the
    walk reads the interior pages level by level (a few hundred for millions of rows) and stops at
    the first level whose pages are leaves (the decoder checks each of them). Every page number and
    cell pointer is checked, and no page is visited twice, so a damaged b-tree (a page that is its own
    child, a pointer out of its page) raises Unsupported rather than looping or reading elsewhere."""
    level, seen, pages_in_file = np.array([root], dtype=np.int64), set(), os.fstat(handle).st_size // page_size
    while True:
        if level.min() < 2 or level.max() > pages_in_file:
            raise Unsupported("a damaged b-tree (a child page out of the file)")
        if _read(handle, (level[0] - 1) * page_size, 1)[0] == TABLE_LEAF:
            return level
        interior = set(level.tolist())  # the interior levels are small: a few hundred pages at 10M rows
        if len(interior) < len(level) or seen & interior:
            raise Unsupported("a damaged b-tree (an interior page reached twice)")
        seen |= interior
        children = []
        for number in level.tolist():
            page = np.frombuffer(_read(handle, (number - 1) * page_size, page_size), dtype=np.uint8)
            if page[0] != TABLE_INTERIOR:
                raise Unsupported(f"page {number} is not a table b-tree page (a WITHOUT ROWID table?)")
            cells = int(page[3]) << 8 | int(page[4])
            pointers = page[INTERIOR_HEADER : INTERIOR_HEADER + 2 * cells].view(">u2").astype(np.int64)
            # a cell is a 4-byte child page number, then its key (a varint)
            if (
                INTERIOR_HEADER + 2 * cells > usable
                or (pointers < INTERIOR_HEADER + 2 * cells).any()
                or (pointers > usable - 5).any()
            ):
                raise Unsupported(f"page {number}: a cell pointer out of its page")
            left = np.stack([page[pointers + k].astype(np.int64) for k in range(4)])
            children.extend(((left[0] << 24) | (left[1] << 16) | (left[2] << 8) | left[3]).tolist())
            children.append(int.from_bytes(page[8:12].tobytes(), "big"))  # the rightmost child
        level = np.array(children, dtype=np.int64)


def _runs(pages: np.ndarray) -> list[tuple[int, int]]:
    """Consecutive page numbers grouped as (first, count): one read each."""
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    return [(int(run[0]), len(run)) for run in np.split(pages, breaks)]


def int_columns(
    path: str | Path, table: str, columns: list[str], chunk_bytes: int = CHUNK_BYTES
) -> Iterator[pd.DataFrame]:
    """The table's `columns`, in rowid order, as DataFrames of the rows of `chunk_bytes` of leaf
    pages each; int64 columns, or nullable Int64 where a chunk holds NULLs. A chunk's arrays are
    reused for the next one: use (or copy) each chunk before asking for the next."""
    path = Path(path)
    for suffix in ("-journal", "-wal"):
        if Path(f"{path}{suffix}").exists():
            raise Unsupported(f"{path.name}{suffix} exists: SQLite would replay it")
    root, slot = _table(path, table, columns)
    handle = os.open(path, os.O_RDONLY)
    try:
        header = _read(handle, 0, 100)
        if header[:16] != HEADER or header[18] != 1 or header[19] != 1:
            raise Unsupported("not a rollback-journal SQLite 3 file")
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        usable = page_size - header[20]
        if page_size & (page_size - 1) or not 512 <= page_size <= 65536 or usable < 480:
            raise Unsupported("a page size SQLite does not write")
        leaves = _leaves(handle, root, page_size, usable)
        pages_per_chunk = max(chunk_bytes // page_size, 1)
        # One buffer of pages and one of columns, reused for every chunk: fresh arrays of this size
        # would cost a page fault per 4 KiB on each chunk.
        pages = np.empty(min(pages_per_chunk, len(leaves)) * page_size, dtype=np.uint8)
        out, missing = np.empty((len(columns), 0), dtype=np.int64), np.empty((len(columns), 0), dtype=np.bool_)
        for first in range(0, len(leaves), pages_per_chunk):
            size = 0
            for start, count in _runs(leaves[first : first + pages_per_chunk]):
                _read_into(handle, pages[size : size + count * page_size], (start - 1) * page_size)
                size += count * page_size
            headers = pages[:size].reshape(-1, page_size)
            cells = (headers[:, 3].astype(np.int64) << 8) | headers[:, 4]
            if (cells > (page_size - 8) // 6).any():  # SQLite's own bound (MX_CELL): before sizing `out` by it
                raise Unsupported("a page with more cells than fit in it")
            rows = int(cells.sum())
            if not rows:  # an empty table is one leaf with no cells
                continue
            if rows > out.shape[1]:
                out = np.empty((len(columns), rows), dtype=np.int64)
                missing = np.empty((len(columns), rows), dtype=np.bool_)
            missing[:, :rows] = False
            decoded = _decode(pages[:size], page_size, usable, slot, out, missing)
            if decoded != rows:
                raise Unsupported(
                    {
                        -1: "a page that is not a table leaf",
                        -2: "a record larger than its page",
                        -3: "a value that is not an integer",
                    }.get(decoded, "a damaged page")
                )
            yield pd.DataFrame(
                {
                    name: pd.arrays.IntegerArray(out[i, :rows], missing[i, :rows])
                    if missing[i, :rows].any()
                    else out[i, :rows]
                    for i, name in enumerate(columns)
                },
                copy=False,
            )
    finally:
        os.close(handle)
