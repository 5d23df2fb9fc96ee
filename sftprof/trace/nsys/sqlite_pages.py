"""Integer columns of an SQLite table, and at most one text column as codes, read straight from the
file's table b-tree (the documented file format: https://www.sqlite.org/fileformat2.html), decoded by
numba-compiled loops.

Why: copying kernels and CUDA API calls out of an nsys export was the slowest part of analysing
it. At 10M kernels (22M API calls) DuckDB's SQLite reader spent 22 s of CPU on the two tables; this
decoder spends 5 s, and the whole copy into DuckDB fell from 16-19 s to 9-10 s (benchmarks/ENGINE.md).
NVTX ranges, which NeMo's emit_nvtx writes by the million, each with a name of its own, read with
their names as codes (TextCodes): 1.3 s for 6M where DuckDB's copy and cut took 9 s (section 7 there).

Only the files nsys writes take this path: a rollback-journal UTF-8 database with no hot journal, a
rowid table whose records fit in their page and hold integers or NULLs in the columns read (text in
the text column). Anything else raises Unsupported, before or during the read, and the caller reads the
table through SQLite instead; so does damage (a page number, cell pointer or record out of its
bounds, an interior page reached twice): every offset is checked, and every walk ends.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numba
import numpy as np
import pandas as pd

from sftprof.trace.events import usable_cores
from sftprof.trace.nsys.nsys_export import read_only_uri

# Pages decoded and inserted at a time: 32 MiB, ~0.4M kernels or ~1.2M API calls, held with their decoded columns
# (about 1.5x the pages' size for kernels) while they are inserted. DuckDB pays per INSERT, more with more threads:
# loading the trainer's 10M export peaked at 0.56-0.58 GiB on this VM's 2 cores in 6.3-7.5 s, against 0.74-0.76 in
# 7.2-8.2 s with 64 MiB; on the GPU machine's 16 cores 0.70-0.74 GiB in 9.0-9.6 s, against 0.83-0.88 in 5.9-6.4 s.
# The budget comes first (benchmarks/ENGINE.md).
CHUNK_BYTES = 32 << 20
# Threads that decode a chunk's pages, a part each: NeMo's 12M NVTX ranges decoded in 0.58 s on 2 threads
# against 0.92 s on one (benchmarks/ENGINE.md).
MAX_DECODE_THREADS = 4
HEADER = b"SQLite format 3\x00"
TABLE_INTERIOR, TABLE_LEAF = 0x05, 0x0D
INTERIOR_HEADER = 12  # bytes: type, first free block, cells, cell content start, fragmented bytes, rightmost child
LEAF_PARENTS = 256  # interior pages whose children (leaves) are listed at a time: about 100K leaves at 4 KiB pages


class Unsupported(Exception):
    """The file or table uses something this reader does not decode: read it through SQLite."""


@numba.njit(cache=True, nogil=True)  # compiled on first use, then loaded from numba's cache
def _decode(pages, first, stop, row, page_size, usable, slot, out, missing, text_slot, text_at, text_size):
    """Decode every cell of the leaf pages at bytes [first, stop) of `pages` (concatenated) into `out` from
    column `row` on (one row per wanted column; `slot[c]` is column c's row, or -1) and `missing` (NULLs);
    for the column `text_slot` (or none, -1), where its text starts in `pages` and its length in bytes (-1:
    NULL) into `text_at`/`text_size`. Columns not read are skipped whatever they hold. Returns the row after
    the last record, or -1 for a page that is not a table leaf, -2 for a record that overflows its page,
    -3 for a value of another type than the column is read as, -4 for a cell outside its page (every
    offset is checked: compiled code does not check its indexes)."""
    for base in range(first, stop, page_size):
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
            body, serial, header_end = pos + header_size, pos + 1, pos + header_size
            if body > end:
                return -4
            for column in range(len(slot)):
                # each column's serial type, a varint: 0 NULL; 1-6 big-endian integers of 1, 2, 3, 4, 6 and
                # 8 bytes; 7 a float; 8 and 9 the constants 0 and 1; from 12 a blob (even) or text (odd)
                kind = np.int64(0)  # columns past the header's end are NULL
                if serial < header_end and pages[serial] < 0x80:  # one byte: every type but long text or blobs
                    kind = np.int64(pages[serial])
                    serial += 1
                elif serial < header_end:  # written out, not a helper: this loop runs for every value read
                    for k in range(9):
                        if serial >= header_end:
                            return -4  # a type cut short by the header's end
                        byte = pages[serial]
                        serial += 1
                        if k == 8:
                            kind = (kind << 8) | byte
                            break
                        kind = (kind << 7) | (byte & 0x7F)
                        if byte < 0x80:
                            break
                if kind >= 12:
                    size = (kind - 12) >> 1
                elif kind == 10 or kind == 11:
                    return -3
                else:
                    size = kind if kind <= 4 else (6 if kind == 5 else (8 if kind <= 7 else 0))
                if body + size > end:
                    return -4
                target = slot[column]
                if column == text_slot:
                    if kind == 0:
                        text_size[row] = -1
                    elif kind >= 13 and kind & 1:
                        text_at[row] = body
                        text_size[row] = size
                    else:
                        return -3
                elif target >= 0:
                    if kind == 7 or kind >= 12:
                        return -3
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


@numba.njit(cache=True, nogil=True)
def _measure(pages, text_at, text_size, lo, hi, cut_before, lengths, digests):
    """For the texts of rows [lo, hi) (at `text_at`, `text_size` bytes in `pages`; -1: NULL) the length of
    its name, the text cut at the first of the `cut_before` markers (rows of bytes, 0-padded) that an ASCII
    digit follows, and the name's FNV-1a hash, found in the same pass. Rows apart: run on several threads."""
    for row in range(lo, hi):
        size = text_size[row]
        if size < 0:
            lengths[row], digests[row] = -1, 0
            continue
        start = text_at[row]
        length = size
        digest = np.uint64(14695981039346656037)
        for i in range(size):
            byte = pages[start + i]
            if byte == 44:  # ","
                for m in range(cut_before.shape[0]):
                    k, matched = 0, True
                    while cut_before[m, k] != 0:  # each row ends in at least one 0
                        if i + k >= size or pages[start + i + k] != cut_before[m, k]:
                            matched = False
                            break
                        k += 1
                    if matched and i + k < size and 48 <= pages[start + i + k] <= 57:  # an ASCII digit
                        length = i
                        break
                if length < size:
                    break
            digest = (digest ^ np.uint64(byte)) * np.uint64(1099511628211)
        lengths[row], digests[row] = length, np.int64(digest)


@numba.njit(cache=True, nogil=True)
def _intern(pages, text_at, lengths, digests, rows, slots, hashes, names, offsets, count, codes):
    """Give each of the `rows` names (_measure's lengths and hashes) the code of the first name met with its
    hash: new ones are appended to `names` (their ends in `offsets`, their hashes in `hashes`) and found again
    through `slots`, an open-addressing table of codes (-1: free) indexed by hash. Returns the number of
    names. A text that shares a hash with another name gets its code: _verify finds it. Plain arrays, not a
    numba dict: that one is compiled anew in each process."""
    mask = len(slots) - 1  # a power of two, at least twice the names there can be
    for row in range(rows):
        length = lengths[row]
        if length < 0:
            codes[row] = -1
            continue
        key = digests[row]
        slot = key & mask
        while slots[slot] >= 0 and hashes[slots[slot]] != key:
            slot = (slot + 1) & mask
        code = slots[slot]
        if code < 0:
            code = count
            first, start = offsets[count], text_at[row]
            names[first : first + length] = pages[start : start + length]
            offsets[count + 1] = first + length
            hashes[count] = key
            slots[slot] = code
            count += 1
        codes[row] = code
    return count


@numba.njit(cache=True, nogil=True)
def _verify(pages, text_at, lengths, codes, names, offsets, lo, hi):
    """Whether the name of each of rows [lo, hi) is, byte for byte, the name of its code. Rows apart."""
    for row in range(lo, hi):
        code = codes[row]
        if code < 0:
            continue
        first, start, length = offsets[code], text_at[row], lengths[row]
        if offsets[code + 1] - first != length:
            return False
        for i in range(length):
            if names[first + i] != pages[start + i]:
                return False
    return True


@numba.njit(cache=True, nogil=True)
def _rehash(hashes, count, size):
    """The open-addressing table of _intern, `size` slots (a power of two), for the first `count` names."""
    slots = np.full(size, -1, dtype=np.int64)
    for code in range(count):
        slot = hashes[code] & (size - 1)
        while slots[slot] >= 0:
            slot = (slot + 1) & (size - 1)
        slots[slot] = code
    return slots


class TextCodes:
    """One text column of a table read as codes (raw_columns' `text`): each text cut before the first of
    `cut_before` that an ASCII digit follows (a numbering to drop), then the same name, the same code.
    The names are kept once each, as bytes (`names()`), in the order first met."""

    def __init__(self, column: str, cut_before: tuple[bytes, ...] = ()):
        self.column = column
        width = max((len(marker) for marker in cut_before), default=0)
        self._cut_before = np.zeros((len(cut_before), width + 1), dtype=np.uint8)
        for row, marker in enumerate(cut_before):
            if not marker.startswith(b",") or b"\0" in marker:
                raise ValueError(f"a cut marker starts with a comma and holds no NUL: {marker!r}")
            self._cut_before[row, : len(marker)] = np.frombuffer(marker, dtype=np.uint8)
        self._slots = np.full(1024, -1, dtype=np.int64)
        self._hashes = np.empty(0, dtype=np.int64)
        self._names = np.empty(0, dtype=np.uint8)
        self._offsets = np.zeros(1, dtype=np.int64)
        self._count = 0

    def _room(self, rows: int, size: int) -> None:
        """Arrays long enough for `rows` more names of `size` more bytes, whatever the chunk holds."""
        used = int(self._offsets[self._count])
        if used + size > len(self._names):
            self._names = np.concatenate([self._names[:used], np.empty(max(size, used), dtype=np.uint8)])
        if self._count + rows + 1 > len(self._offsets):
            grown = np.empty(self._count + rows + 1 + len(self._offsets), dtype=np.int64)
            grown[: self._count + 1] = self._offsets[: self._count + 1]
            self._offsets = grown
            self._hashes = np.concatenate([self._hashes[: self._count], np.empty(len(grown), dtype=np.int64)])
        if 2 * (self._count + rows) > len(self._slots):  # at most half full: probes stay short
            size = 1 << int(2 * (self._count + rows)).bit_length()
            self._slots = _rehash(self._hashes, self._count, size)

    def encode(self, pages, text_at, text_size, rows: int, parts: Parts) -> tuple[np.ndarray, np.ndarray]:
        """Codes (int32, -1 for NULL) and whether each text was cut, for a chunk's `rows` texts: the names
        measured and checked in `parts`, given codes in turn."""
        sizes = text_size[:rows]
        self._room(rows, int(sizes[sizes > 0].sum()))
        lengths, digests, codes = np.empty(rows, np.int64), np.empty(rows, np.int64), np.empty(rows, np.int64)
        edges, cut_before, names, offsets = parts.edges(rows), self._cut_before, self._names, self._offsets
        parts.run(lambda lo, hi: _measure(pages, text_at, text_size, lo, hi, cut_before, lengths, digests), edges)
        self._count = _intern(
            pages, text_at, lengths, digests, rows, self._slots, self._hashes, names, offsets, self._count, codes
        )
        if not all(parts.run(lambda lo, hi: _verify(pages, text_at, lengths, codes, names, offsets, lo, hi), edges)):
            raise Unsupported(f"two {self.column} values share a hash")
        return codes.astype(np.int32), (lengths >= 0) & (lengths < sizes)

    def names(self) -> list[bytes]:
        return [
            bytes(self._names[a:b]) for a, b in zip(self._offsets[: self._count], self._offsets[1 : self._count + 1])
        ]


def _read_into(handle: int, buffer, offset: int) -> None:
    if os.preadv(handle, [buffer], offset) != len(buffer):
        raise Unsupported("the file ends inside a page")


def _read(handle: int, offset: int, size: int) -> bytearray:
    buffer = bytearray(size)
    _read_into(handle, buffer, offset)
    return buffer


def _table(path: Path, table: str, columns: list[str], text: str | None = None) -> tuple[int, np.ndarray]:
    """The table's root page, and for each of its columns up to the last wanted one, the position
    of that column in `columns` (or -1); the text column `text`, if any, is at len(columns)."""
    with sqlite3.connect(read_only_uri(path), uri=True) as conn:
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        info = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    if root is None or not root[0]:
        raise Unsupported(f"no table {table}")
    names = [row[1] for row in info]
    columns = [*columns, text] if text else columns
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


def _children(handle: int, numbers: np.ndarray, page_size: int, usable: int) -> np.ndarray:
    """The child pages of interior pages `numbers`, in order; Unsupported where one is not an interior table page
    or a cell pointer is out of its page."""
    children = []
    for number in numbers.tolist():
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
        children.append((left[0] << 24) | (left[1] << 16) | (left[2] << 8) | left[3])
        children.append(np.array([int.from_bytes(page[8:12].tobytes(), "big")], dtype=np.int64))  # rightmost
    return np.concatenate(children) if children else np.empty(0, dtype=np.int64)


def _leaves(handle: int, root: int, page_size: int, usable: int, count: int) -> Iterator[np.ndarray]:
    """The table's leaf pages in rowid order, `count` at a time (the last fewer). All leaves of a b-tree are at the
    same depth, so the walk reads the interior pages level by level (a few thousand at 100M rows) down to the
    leaves' parents, whose children it lists as they are asked for: a table's leaf numbers are never held whole
    (5.6M at NeMo's 240M NVTX ranges). The decoder checks that each is a leaf. Every page number and cell pointer
    is checked, and no interior page is visited twice, so a damaged b-tree (a page that is its own child, a pointer
    out of its page) raises Unsupported rather than looping or reading elsewhere."""
    pages_in_file = os.fstat(handle).st_size // page_size

    def in_file(level: np.ndarray) -> np.ndarray:
        if len(level) and (level.min() < 2 or level.max() > pages_in_file):
            raise Unsupported("a damaged b-tree (a child page out of the file)")
        return level

    def is_leaf(number: int) -> bool:
        return _read(handle, (number - 1) * page_size, 1)[0] == TABLE_LEAF

    level, seen = in_file(np.array([root], dtype=np.int64)), set()
    if is_leaf(root):
        yield level
        return
    while True:
        interior = set(level.tolist())
        if len(interior) < len(level) or seen & interior:
            raise Unsupported("a damaged b-tree (an interior page reached twice)")
        seen |= interior
        if is_leaf(int(in_file(_children(handle, level[:1], page_size, usable))[0])):
            break
        level = in_file(_children(handle, level, page_size, usable))
    # `level` holds the leaves' parents: their children, a few hundred parents at a time, cut into `count`s
    held = np.empty(0, dtype=np.int64)
    for first in range(0, len(level), LEAF_PARENTS):
        held = np.concatenate(
            [held, in_file(_children(handle, level[first : first + LEAF_PARENTS], page_size, usable))]
        )
        while len(held) >= count:
            yield held[:count]
            held = held[count:]
    if len(held):
        yield held


class Parts:
    """Work on consecutive items (pages, rows) cut into parts of about the same size, run side by side on threads
    of its own (the compiled loops release the GIL), or in turn where it has one thread. Close it when done."""

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="decode") if threads > 1 else None

    def edges(self, count: int) -> list[int]:
        """Where to cut `count` items: one part a thread, none empty."""
        return sorted({count * part // self.threads for part in range(self.threads + 1)})

    def run(self, work, edges: list[int]) -> list:
        """work(lo, hi) for each pair of consecutive `edges`."""
        pairs = list(zip(edges[:-1], edges[1:]))
        if self._pool is None or len(pairs) < 2:
            return [work(lo, hi) for lo, hi in pairs]
        return list(self._pool.map(lambda pair: work(*pair), pairs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def _read_pages(parts: Parts, handle: int, pages: np.ndarray, numbers: np.ndarray, page_size: int) -> int:
    """Pages `numbers` into `pages`, in order, in parts (a read releases the GIL); returns the bytes read."""

    def read(lo: int, hi: int) -> None:
        at = lo * page_size
        for start, count in _runs(numbers[lo:hi]):
            _read_into(handle, pages[at : at + count * page_size], (start - 1) * page_size)
            at += count * page_size

    parts.run(read, parts.edges(len(numbers)))
    return len(numbers) * page_size


def _decode_chunk(parts: Parts, pages, cells, page_size, usable, slot, out, missing, text_slot, text_at, text_size):
    """_decode of a chunk's pages (`cells` records each) in parts; Unsupported where one fails."""
    page_edges = parts.edges(len(cells))
    row_at = dict(zip(page_edges, np.r_[0, np.cumsum(cells)][page_edges].tolist()))

    def decode(first: int, stop: int) -> int:
        args = (page_size, usable, slot, out, missing, text_slot, text_at, text_size)
        ends = _decode(pages, first * page_size, stop * page_size, row_at[first], *args)
        return ends - row_at[stop] if ends >= 0 else ends  # 0: every record of the pages decoded

    failed = [decoded for decoded in parts.run(decode, page_edges) if decoded != 0]
    if failed:
        raise Unsupported(
            {
                -1: "a page that is not a table leaf",
                -2: "a record larger than its page",
                -3: "a value that is not an integer",
            }.get(failed[0], "a damaged page")
        )


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
    for values, missing, _, _ in raw_columns(path, table, columns, chunk_bytes):
        yield pd.DataFrame(
            {
                name: pd.arrays.IntegerArray(values[i], missing[i]) if missing[i].any() else values[i]
                for i, name in enumerate(columns)
            },
            copy=False,
        )


def raw_columns(
    path: str | Path, table: str, columns: list[str], chunk_bytes: int = CHUNK_BYTES, text: TextCodes | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]]:
    """What int_columns reads, as arrays: per chunk, the values (int64, 0 for NULL) and NULLs, one row per
    column, views of buffers reused for the next chunk; with `text`, that text column too, as codes (int32,
    -1 for NULL) and whether each was cut (see TextCodes), fresh arrays."""
    path = Path(path)
    for suffix in ("-journal", "-wal"):
        if Path(f"{path}{suffix}").exists():
            raise Unsupported(f"{path.name}{suffix} exists: SQLite would replay it")
    root, slot = _table(path, table, columns, text.column if text else None)
    handle = os.open(path, os.O_RDONLY)
    parts = Parts(min(usable_cores(), MAX_DECODE_THREADS))
    try:
        header = _read(handle, 0, 100)
        if header[:16] != HEADER or header[18] != 1 or header[19] != 1:
            raise Unsupported("not a rollback-journal SQLite 3 file")
        if text and int.from_bytes(header[56:60], "big") != 1:
            raise Unsupported("text not in UTF-8")
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        usable = page_size - header[20]
        if page_size & (page_size - 1) or not 512 <= page_size <= 65536 or usable < 480:
            raise Unsupported("a page size SQLite does not write")
        pages_per_chunk = max(chunk_bytes // page_size, 1)
        pages = np.empty(0, dtype=np.uint8)
        out, missing = np.empty((len(columns), 0), dtype=np.int64), np.empty((len(columns), 0), dtype=np.bool_)
        text_at, text_size = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        text_slot = int(np.flatnonzero(slot == len(columns))[0]) if text else -1
        for leaves in _leaves(handle, root, page_size, usable, pages_per_chunk):
            # One buffer of pages and one of columns, reused for every chunk (the first chunk is the largest):
            # fresh arrays of this size would cost a page fault per 4 KiB on each chunk.
            if len(pages) < len(leaves) * page_size:
                pages = np.empty(len(leaves) * page_size, dtype=np.uint8)
            size = _read_pages(parts, handle, pages, leaves, page_size)
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
                if text:
                    text_at, text_size = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.int64)
            missing[:, :rows] = False
            _decode_chunk(parts, pages, cells, page_size, usable, slot, out, missing, text_slot, text_at, text_size)
            codes, cut = text.encode(pages[:size], text_at, text_size, rows, parts) if text else (None, None)
            yield out[:, :rows], missing[:, :rows], codes, cut
    finally:
        os.close(handle)
        parts.close()
