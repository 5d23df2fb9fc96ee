"""Candidate engines at the decode floor (issue 54): the two hardest pieces of `sftprof analyze`, computed straight
from the pages the numba decoder reads (sftprof/trace/nsys/sqlite_pages.py), with no copy into a store.

    .venv/bin/python benchmarks/engine_prototypes.py FILE.sqlite [FILE ...] [--candidates numba,duckdb-arrow,polars]
        [--pieces kernsum,projection] [--python /tmp/eng/venv/bin/python] [--check] [--out CSV]

The pieces:
  kernsum     nsys 2022.4's gpukernsum before its rounding: per kernel name and launch shape (grid, block), total,
              instances, mean, exact median, min, max, sample standard deviation
  projection  the NVTX projection: each kernel's GPU time to the NVTX ranges that contain its launching CUDA call on
              the launching thread (start <= the call's start, the call's end <= end): in the innermost one
              (exclusive) and in every one (inclusive), summed by range name; per thread for launches in no range;
              kernels whose launch was not traced apart. What analysis.nvtx.gpu_time_by_range computes.

The candidates (each reads the columns it needs with sqlite_pages.raw_columns, a chunk of pages at a time):
  numba         numpy/numba over the decoded column chunks. kernsum: groups found by an open-addressing hash as
                rows are decoded, durations held (12 bytes a kernel), medians by a counting sort into groups and
                np.partition. projection: kernels summed by correlation id into dense arrays (pass 1), then the
                runtime calls and the NVTX ranges (both stored in start order) merged in one sweep with a stack of
                open ranges per thread (pass 2): nothing is held per range or per launch.
  duckdb-arrow  each decoded chunk as an Arrow record batch (its columns copied out of the decoder's reused buffers),
                a pyarrow RecordBatchReader scanned by DuckDB (2 threads): GROUP BY with median() and stddev_samp();
                the projection as a hash join (kernels to calls) and a range join (launches to ranges, IEJoin), the
                innermost range by arg_max.
  polars        the same chunks as a polars LazyFrame (polars.io.plugins.register_io_source), collected by the
                streaming engine: group_by with median() and std(); the projection with join_where (an in-memory
                inequality join: polars' streaming engine has none).

Each candidate and piece runs in a fresh child process (numba's functions compiled beforehand into numba's cache, on
tests/fixtures/h200_tiny_llama_bf16.sqlite, untimed), timed as benchmarks/run.py times commands (wall, CPU and
peak RSS from wait4), after `nsys stats -r gpukernsum,gpumemtimesum,cudaapisum` on the same file (the reports of
run.py); the table gives each as a share of nsys' wall and CPU time (CPU: steadier on a shared machine), the time
inside the child from the call to the result ("in-process": no interpreter start or imports of sftprof and numba),
and the lines of code of each candidate's own functions.
Every candidate's result is checked equal to numba's (integers exact, floats to 0.1 ns); --check also checks numba's
against sftprof's own (load_trace, then analysis.gpu.kernel_summary and analysis.nvtx.gpu_time_by_range).
duckdb-arrow and polars need pyarrow and polars, which are not sftprof dependencies: a scratch venv that sees the
project's venv too, passed with --python:

    python3.11 -m venv /tmp/eng/venv && /tmp/eng/venv/bin/pip install polars pyarrow
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/eng/venv/lib/python3.11/site-packages/zz_sftprof.pth
    .venv/bin/python benchmarks/generate_export.py 1M -o /tmp/eng/trainer_1M.sqlite
    xz -dc tests/fixtures/nemo/h200_nemo_lora_llama2_7b.sqlite.xz > /tmp/eng/nemo_seed.sqlite
    .venv/bin/python benchmarks/generate_export.py 1M --seed /tmp/eng/nemo_seed.sqlite -o /tmp/eng/nemo_1M.sqlite
    .venv/bin/python benchmarks/engine_prototypes.py /tmp/eng/trainer_1M.sqlite /tmp/eng/nemo_1M.sqlite \\
        --python /tmp/eng/venv/bin/python --check

Prototype limits (each raises where met, none on the benchmark's shapes): one process's kernels (correlation ids
are matched without the pid), at most 2^15 kernel groups, 4,096 threads, 4,096 ranges open on a thread, 2^20 range
names. Range names are the decoder's text codes (emit_nvtx's numbering cut) or StringIds' value for a textId.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import os
import pickle
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
NVTX = "NVTX_EVENTS"
SHAPE = ["gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"]
KERNSUM_COLUMNS = ["start", "end", "demangledName", *SHAPE]
KERNEL_LAUNCH_COLUMNS = ["start", "end", "correlationId"]
CALL_COLUMNS = ["start", "end", "globalTid", "correlationId"]
NVTX_COLUMNS = ["start", "end", "eventType", "globalTid", "textId"]
RANGE_TYPES = (59, 60, 70, 71)  # nsys_sqlite.NVTX_RANGE_STYLES
NAMES_LIMIT = 1 << 20  # range name slots: text codes from 0 up, textIds' names from the top down
MAX_THREADS, MAX_DEPTH, MAX_GROUPS = 4096, 4096, 1 << 15
OPEN = np.iinfo(np.int64).max  # a range never closed: open to the end
WARMUP = HERE.parent / "tests" / "fixtures" / "h200_tiny_llama_bf16.sqlite"  # compiles numba's functions, untimed
CANDIDATES = ("numba", "duckdb-arrow", "polars")
PIECES = ("kernsum", "projection")


def _uri(path: Path) -> str:
    return f"{Path(path).resolve().as_uri()}?mode=ro"


def _string_ids(path: Path) -> dict[int, str]:
    with contextlib.closing(sqlite3.connect(_uri(path), uri=True)) as con:
        return dict(con.execute("SELECT id, value FROM StringIds"))


def _chunks(path: Path, table: str, columns: list[str], text=None):
    from sftprof.trace.nsys import sqlite_pages

    return sqlite_pages.raw_columns(path, table, columns, sqlite_pages.CHUNK_BYTES, text=text)


def _nvtx_text():
    from sftprof.trace.nsys.nsys_sqlite import nvtx_text_codes

    return nvtx_text_codes()


# --- shared by every candidate: the NVTX chunk as ranges with a name slot each --------------------------------------


class RangeNames:
    """Name slots of ranges: the decoder's text code, or (no text) a slot from the top for each textId."""

    def __init__(self, text):
        self.text, self.ids = text, {}

    def slots(self, codes: np.ndarray, text_id: np.ndarray, no_text_id: np.ndarray) -> np.ndarray:
        slots = codes.astype(np.int64)
        by_id = np.flatnonzero((codes < 0) & ~no_text_id)
        if len(by_id):
            for value in np.unique(text_id[by_id]).tolist():
                self.ids.setdefault(value, NAMES_LIMIT - 1 - len(self.ids))
            slots[by_id] = [self.ids[v] for v in text_id[by_id].tolist()]
        if codes.max(initial=-1) >= NAMES_LIMIT - len(self.ids):
            raise SystemExit("more range names than NAMES_LIMIT")
        return slots

    def names(self, path: Path) -> dict[int, str | None]:
        strings = _string_ids(path)
        names = {i: name.decode("utf-8", "replace") for i, name in enumerate(self.text.names())}
        names.update({slot: strings.get(value) for value, slot in self.ids.items()})
        names[-1] = None
        return names


def _ranges(values, missing, codes, names: RangeNames):
    """One NVTX chunk's ranges (start, end: OPEN where NULL, thread, name slot: -1 none), in the file's order."""
    start, end, kind, tid, text_id = values
    keep = np.isin(kind, RANGE_TYPES) & ~missing[2] & ~missing[0] & ~missing[3]
    end = np.where(missing[1], OPEN, end)
    keep &= end >= start
    slots = names.slots(codes, text_id, missing[4])
    return start[keep], end[keep], tid[keep], slots[keep]


# --- candidate: numba over decoded chunks ---------------------------------------------------------------------------


@numba.njit(nogil=True, cache=True)
def _hash_rows(values, columns, rows, table, keys, count, codes):  # pragma: no cover (compiled)
    """Group code of each of `rows` rows of values[columns] (open addressing in `table`, keys kept in `keys`)."""
    mask = len(table) - 1
    width = len(columns)
    for i in range(rows):
        h = np.uint64(1469598103934665603)
        for c in range(width):
            h = (h ^ np.uint64(values[columns[c], i])) * np.uint64(1099511628211)
        slot = np.int64(h >> np.uint64(17)) & mask
        while True:
            g = table[slot]
            if g < 0:
                if count == len(keys):
                    return -1
                for c in range(width):
                    keys[count, c] = values[columns[c], i]
                table[slot] = count
                g = count
                count += 1
                break
            same = True
            for c in range(width):
                if keys[g, c] != values[columns[c], i]:
                    same = False
                    break
            if same:
                break
            slot = (slot + 1) & mask
        codes[i] = g
    return count


@numba.njit(nogil=True, cache=True)
def _thread_codes(tids, known, count, codes):  # pragma: no cover (compiled)
    """Each global thread id's place in `known` (a few threads: a linear search from the last one found)."""
    last = 0
    for i in range(len(tids)):
        t = tids[i]
        if count and known[last] == t:
            codes[i] = last
            continue
        j = 0
        while j < count and known[j] != t:
            j += 1
        if j == count:
            if count == len(known):
                return -1
            known[count] = t
            count += 1
        codes[i] = j
        last = j
    return count


class Threads:
    def __init__(self, capacity: int):
        self.known, self.count = np.empty(capacity, np.int64), 0

    def codes(self, tids: np.ndarray) -> np.ndarray:
        codes = np.empty(len(tids), np.int64)
        self.count = _thread_codes(tids, self.known, self.count, codes)
        if self.count < 0:
            raise SystemExit("more threads than MAX_THREADS")
        return codes


class Hasher:
    def __init__(self, columns: list[int], capacity: int):
        self.columns = np.array(columns, np.int64)
        self.table = np.full(4 * capacity, -1, np.int64)
        self.keys = np.empty((capacity, len(columns)), np.int64)
        self.count = 0

    def codes(self, values: np.ndarray) -> np.ndarray:
        codes = np.empty(values.shape[1], np.int32)
        count = _hash_rows(values, self.columns, values.shape[1], self.table, self.keys, self.count, codes)
        if count < 0:
            raise SystemExit("more distinct keys than the prototype's capacity")
        self.count = count
        return codes


@numba.njit(nogil=True, cache=True)
def _group_stats(codes, durations, groups):  # pragma: no cover (compiled)
    """Per group: total, instances, min, max, median, sum of squared deviations (two passes, after a counting sort)."""
    n = np.zeros(groups, np.int64)
    total = np.zeros(groups, np.int64)
    low = np.full(groups, np.iinfo(np.int64).max, np.int64)
    high = np.full(groups, np.iinfo(np.int64).min, np.int64)
    for i in range(len(codes)):
        g, d = codes[i], durations[i]
        n[g] += 1
        total[g] += d
        low[g] = min(low[g], d)
        high[g] = max(high[g], d)
    at = np.zeros(groups + 1, np.int64)
    at[1:] = np.cumsum(n)
    fill = at[:-1].copy()
    ordered = np.empty(len(codes), np.int64)
    for i in range(len(codes)):
        ordered[fill[codes[i]]] = durations[i]
        fill[codes[i]] += 1
    median = np.zeros(groups)
    squares = np.zeros(groups)
    for g in range(groups):
        part = ordered[at[g] : at[g + 1]]
        k = len(part)
        half = k // 2
        part = np.partition(part, half)  # a copy of the group's values (numba has no in-place partition)
        upper = part[half]
        median[g] = upper if k % 2 else (np.max(part[:half]) + upper) / 2.0
        mean = total[g] / k
        s = 0.0
        for v in part:
            s += (v - mean) * (v - mean)
        squares[g] = s
    return total, n, low, high, median, squares


def numba_kernsum(path: Path):
    hasher = Hasher(list(range(2, 2 + 1 + len(SHAPE))), MAX_GROUPS)
    codes, durations = [], []
    for values, _missing, _, _ in _chunks(path, KERNEL, KERNSUM_COLUMNS):
        codes.append(hasher.codes(values))
        durations.append(values[1] - values[0])
    codes, durations = np.concatenate(codes), np.concatenate(durations)
    total, n, low, high, median, squares = _group_stats(codes, durations, hasher.count)
    stddev = np.sqrt(squares / np.maximum(n - 1, 1)) * (n > 1)
    keys = hasher.keys[: hasher.count]
    return [
        (
            *map(int, keys[g]),
            int(total[g]),
            int(n[g]),
            total[g] / n[g],
            float(median[g]),
            int(low[g]),
            int(high[g]),
            float(stddev[g]),
        )  # fmt: skip
        for g in range(hasher.count)
    ]


@numba.njit(nogil=True, cache=True)
def _add_kernels(corr, durations, rows, sums, counts):  # pragma: no cover (compiled)
    untraced_n, untraced_ns = 0, 0
    for i in range(rows):
        c = corr[i]
        if c < 0:
            untraced_n += 1
            untraced_ns += durations[i]
        else:
            sums[c] += durations[i]
            counts[c] += 1
    return untraced_n, untraced_ns


@numba.njit(nogil=True, cache=True)
def _sweep(rs, re, rt, rn, ri, ls, le, lt, lc, li, last, sums, counts, st_s, st_e, st_n, depth, excl, incl, outside):
    """Walk ranges (rs, re, thread rt, name slot rn) from ri and calls (ls, le, thread lt, correlation id lc) from li
    in start order: ranges that start at or before a call's start pushed onto their thread's stack, then the call,
    if it launched kernels, summed into the ranges that contain it. Stops where the calls end, or where the ranges
    do and more may come (`last` False). Returns (ri, li), or (-1, -1) where a stack is full."""
    while li < len(ls):
        s = ls[li]
        while ri < len(rs) and rs[ri] <= s:
            t = rt[ri]
            d = depth[t]
            while d > 0 and st_e[t, d - 1] < rs[ri]:
                d -= 1
            if d == st_s.shape[1]:
                return -1, -1
            st_s[t, d], st_e[t, d], st_n[t, d] = rs[ri], re[ri], rn[ri]
            depth[t] = d + 1
            ri += 1
        if ri == len(rs) and not last:
            break
        c = lc[li]
        if c >= 0 and c < len(counts) and counts[c] > 0:
            k, ns = counts[c], sums[c]
            counts[c] = 0
            t, e = lt[li], le[li]
            d = depth[t]
            while d > 0 and st_e[t, d - 1] < s:
                d -= 1
            depth[t] = d
            best = -1
            for j in range(d - 1, -1, -1):
                if st_e[t, j] >= e:
                    name = st_n[t, j]
                    if name >= 0:
                        incl[0, name] += k
                        incl[1, name] += ns
                    if (
                        best < 0
                        or st_s[t, j] > st_s[t, best]
                        or (st_s[t, j] == st_s[t, best] and st_e[t, j] < st_e[t, best])
                    ):
                        best = j
            if best >= 0 and st_n[t, best] >= 0:
                excl[0, st_n[t, best]] += k
                excl[1, st_n[t, best]] += ns
            else:
                outside[0, t] += k
                outside[1, t] += ns
        li += 1
    return ri, li


def numba_projection(path: Path):
    # pass 1: the kernels' GPU time and count by correlation id
    sums, counts = np.zeros(1 << 20, np.int64), np.zeros(1 << 20, np.int32)
    kernels, untraced_n, untraced_ns, total_ns = 0, 0, 0, 0
    for values, missing, _, _ in _chunks(path, KERNEL, KERNEL_LAUNCH_COLUMNS):
        corr = np.where(missing[2], -1, values[2])
        durations = values[1] - values[0]
        top = int(corr.max(initial=-1)) + 1
        if top > len(sums):
            size = 1 << top.bit_length()  # zeroed pages come from the kernel as they are touched
            grown_sums, grown_counts = np.zeros(size, np.int64), np.zeros(size, np.int32)
            grown_sums[: len(sums)], grown_counts[: len(counts)] = sums, counts
            sums, counts = grown_sums, grown_counts
        n, ns = _add_kernels(corr, durations, values.shape[1], sums, counts)
        untraced_n, untraced_ns = untraced_n + n, untraced_ns + ns
        kernels, total_ns = kernels + values.shape[1], total_ns + int(durations.sum())
    # pass 2: calls and ranges merged by start
    threads = Threads(MAX_THREADS)
    names = RangeNames(_nvtx_text())
    st_s, st_e = np.empty((MAX_THREADS, MAX_DEPTH), np.int64), np.empty((MAX_THREADS, MAX_DEPTH), np.int64)
    st_n, depth = np.empty((MAX_THREADS, MAX_DEPTH), np.int64), np.zeros(MAX_THREADS, np.int64)
    excl, incl = np.zeros((2, NAMES_LIMIT), np.int64), np.zeros((2, NAMES_LIMIT), np.int64)
    outside = np.zeros((2, MAX_THREADS), np.int64)
    range_chunks = _chunks(path, NVTX, NVTX_COLUMNS, text=names.text)

    def next_ranges():
        for values, missing, codes, _cut in range_chunks:
            rs, re, tid, slot = _ranges(values, missing, codes, names)
            return rs, re, threads.codes(tid), slot, False
        empty = np.empty(0, np.int64)
        return empty, empty, empty, empty, True

    *ranges, last = next_ranges()
    ri = 0
    for values, missing, _, _ in _chunks(path, RUNTIME, CALL_COLUMNS):
        keep = ~missing[0] & ~missing[2]
        ls, le, tid = values[0][keep], values[1][keep], values[2][keep]
        lc = np.where(missing[3][keep], -1, values[3][keep])
        lt = threads.codes(tid)
        li = 0
        while li < len(ls):
            ri, li = _sweep(*ranges, ri, ls, le, lt, lc, li, last, sums, counts, st_s, st_e, st_n, depth, excl, incl,
                            outside)  # fmt: skip
            if ri < 0:
                raise SystemExit("more ranges open on a thread than MAX_DEPTH")
            if li < len(ls):
                *ranges, last = next_ranges()
                ri = 0
    launched = int(outside[0].sum() + excl[0].sum())
    return _projection_result(path, names, excl, incl, outside, threads.known[: threads.count], kernels - launched,
                              total_ns - int(outside[1].sum() + excl[1].sum()))  # fmt: skip


def _projection_result(path, names, excl, incl, outside, tids, untraced_n, untraced_ns):
    """{name: (kernels, gpu ns, inclusive kernels, inclusive ns)}, ('outside', tid), and 'not traced'."""
    labels = names.names(path)
    out: dict = {}
    for slot in np.flatnonzero(excl[0] | incl[0]).tolist():
        held = out.setdefault(labels[slot], [0, 0, 0, 0])
        for i, v in enumerate((excl[0, slot], excl[1, slot], incl[0, slot], incl[1, slot])):
            held[i] += int(v)
    for t in np.flatnonzero(outside[0]).tolist():
        out[("outside", int(tids[t]))] = [int(outside[0, t]), int(outside[1, t]), 0, 0]
    if untraced_n:
        out["not traced"] = [int(untraced_n), int(untraced_ns), 0, 0]
    return {k: tuple(v) for k, v in out.items()}


# --- candidate: Arrow record batches scanned by DuckDB ------------------------------------------------------------


def _arrow_reader(chunks, columns: list[str], convert=None):
    """The decoded chunks as a pyarrow RecordBatchReader: each chunk's columns copied (the decoder reuses them)."""
    import pyarrow as pa

    def batches():
        for chunk in chunks:
            arrays = convert(*chunk) if convert else {c: chunk[0][i].copy() for i, c in enumerate(columns)}
            yield pa.RecordBatch.from_pydict(arrays)

    schema = pa.schema([(c, pa.int64()) for c in columns])
    return pa.RecordBatchReader.from_batches(schema, batches())


def _duckdb():
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2; SET memory_limit = '1GB'; SET preserve_insertion_order = false")
    con.execute(f"SET temp_directory = '{tempfile.mkdtemp(prefix='proto-duckdb-')}'")
    return con


def duckdb_kernsum(path: Path):
    con = _duckdb()
    kernels = _arrow_reader(_chunks(path, KERNEL, KERNSUM_COLUMNS), KERNSUM_COLUMNS)  # noqa: F841 (scanned by name)
    shape = ", ".join(SHAPE)
    return con.execute(f"""
        SELECT demangledName, {shape}, sum(d)::BIGINT, count(*), avg(d), median(d)::DOUBLE, min(d), max(d),
               coalesce(stddev_samp(d), 0)
        FROM (SELECT demangledName, {shape}, "end" - start AS d FROM kernels) GROUP BY ALL""").fetchall()


def duckdb_projection(path: Path):
    con = _duckdb()
    names = RangeNames(_nvtx_text())
    kernels = _arrow_reader(_chunks(path, KERNEL, KERNEL_LAUNCH_COLUMNS), KERNEL_LAUNCH_COLUMNS)  # noqa: F841
    calls = _arrow_reader(_chunks(path, RUNTIME, CALL_COLUMNS), CALL_COLUMNS)  # noqa: F841

    def as_ranges(values, missing, codes, _cut):
        rs, re, tid, slot = _ranges(values, missing, codes, names)
        return {"rs": rs, "re": re, "rtid": tid, "slot": slot}

    ranges = _arrow_reader(_chunks(path, NVTX, NVTX_COLUMNS, text=names.text), ["rs", "re", "rtid", "slot"], as_ranges)  # noqa: F841
    con.execute("""
        CREATE TEMP TABLE per_call AS
        SELECT correlationId, count(*) AS n, sum("end" - start)::BIGINT AS ns FROM kernels GROUP BY ALL""")
    con.execute("""
        CREATE TEMP TABLE launch AS
        SELECT c.correlationId AS id, c.globalTid AS tid, c.start AS s, c."end" AS e, k.n, k.ns
        FROM calls c JOIN per_call k ON c.correlationId = k.correlationId""")
    con.execute("""
        CREATE TEMP TABLE pair AS
        SELECT l.id, r.slot, r.rs, r.re FROM launch l JOIN ranges r ON r.rs <= l.s AND r.re >= l.e
        WHERE r.rtid - l.tid = 0""")
    rows = con.execute("""
        WITH inner_most AS (SELECT id, arg_max(slot, (rs, -re)) AS slot FROM pair GROUP BY id),
        excl AS (SELECT i.slot, sum(l.n)::BIGINT AS n, sum(l.ns)::BIGINT AS ns FROM inner_most i JOIN launch l USING (id)
                 WHERE i.slot >= 0 GROUP BY ALL),
        incl AS (SELECT p.slot, sum(l.n)::BIGINT AS n, sum(l.ns)::BIGINT AS ns FROM pair p JOIN launch l USING (id)
                 WHERE p.slot >= 0 GROUP BY ALL)
        SELECT slot, coalesce(excl.n, 0), coalesce(excl.ns, 0), coalesce(incl.n, 0), coalesce(incl.ns, 0)
        FROM excl FULL JOIN incl USING (slot)""").fetchall()
    outside = con.execute("""
        SELECT tid, sum(n)::BIGINT, sum(ns)::BIGINT FROM launch l
        WHERE NOT EXISTS (SELECT 1 FROM pair p WHERE p.id = l.id) GROUP BY ALL""").fetchall()
    launched = con.execute("SELECT count(*), sum(n)::BIGINT, sum(ns)::BIGINT FROM launch").fetchone()
    kernel_total = con.execute("SELECT sum(n)::BIGINT, sum(ns)::BIGINT FROM per_call").fetchone()
    excl, incl = np.zeros((2, NAMES_LIMIT), np.int64), np.zeros((2, NAMES_LIMIT), np.int64)
    for slot, n, ns, i_n, i_ns in rows:
        excl[:, slot], incl[:, slot] = (n, ns), (i_n, i_ns)
    return _from_rows(path, names, excl, incl, outside, kernel_total, launched)


def _from_rows(path, names, excl, incl, outside, kernel_total, launched):
    tids = np.array([t for t, _, _ in outside] or [0], np.int64)
    held = np.zeros((2, len(tids)), np.int64)
    for i, (_, n, ns) in enumerate(outside):
        held[:, i] = (n, ns)
    return _projection_result(path, names, excl, incl, held, tids, kernel_total[0] - int(launched[1] or 0),
                              kernel_total[1] - int(launched[2] or 0))  # fmt: skip


# --- candidate: polars' streaming engine ----------------------------------------------------------------------------


def _polars_frame(chunks, columns: list[str], convert=None):
    """The decoded chunks as a LazyFrame that polars pulls a chunk at a time (an IO plugin)."""
    import polars as pl
    from polars.io.plugins import register_io_source

    schema = {c: pl.Int64 for c in columns}

    def source(with_columns, predicate, n_rows, batch_size):
        for chunk in chunks:
            arrays = convert(*chunk) if convert else {c: chunk[0][i].copy() for i, c in enumerate(columns)}
            frame = pl.DataFrame(arrays)
            yield frame.select(with_columns) if with_columns else frame

    return register_io_source(source, schema=schema)


def polars_kernsum(path: Path):
    import polars as pl

    d = pl.col("end") - pl.col("start")
    frame = _polars_frame(_chunks(path, KERNEL, KERNSUM_COLUMNS), KERNSUM_COLUMNS)
    result = (
        frame.group_by(["demangledName", *SHAPE])
        .agg(
            d.sum(),
            d.len().alias("n"),
            d.mean().alias("mean"),
            d.median().alias("med"),
            d.min().alias("lo"),
            d.max().alias("hi"),
            d.std().fill_null(0).alias("sd"),
        )  # fmt: skip
        .collect(engine="streaming")
    )
    return result.rows()


def polars_projection(path: Path):
    import polars as pl

    names = RangeNames(_nvtx_text())

    def as_ranges(values, missing, codes, _cut):
        rs, re, tid, slot = _ranges(values, missing, codes, names)
        return {"rs": rs, "re": re, "rtid": tid, "slot": slot}

    kernels = _polars_frame(_chunks(path, KERNEL, KERNEL_LAUNCH_COLUMNS), KERNEL_LAUNCH_COLUMNS)
    calls = _polars_frame(_chunks(path, RUNTIME, CALL_COLUMNS), CALL_COLUMNS)
    ranges = _polars_frame(_chunks(path, NVTX, NVTX_COLUMNS, text=names.text), ["rs", "re", "rtid", "slot"], as_ranges)
    per_call = (
        kernels.group_by("correlationId")
        .agg(pl.len().alias("n"), (pl.col("end") - pl.col("start")).sum().alias("ns"))
        .collect(engine="streaming")
    )
    launch = (
        calls.join(per_call.lazy(), on="correlationId")
        .select(
            pl.col("correlationId").alias("id"),
            pl.col("globalTid").alias("tid"),
            pl.col("start").alias("s"),
            pl.col("end").alias("e"),
            "n",
            "ns",
        )  # fmt: skip
        .collect(engine="streaming")
    )
    ranges = ranges.collect(engine="streaming")
    pair = (
        launch.lazy()
        .join_where(ranges.lazy(), pl.col("rs") <= pl.col("s"), pl.col("re") >= pl.col("e"))
        .filter(pl.col("rtid") == pl.col("tid"))
        .select("id", "slot", "rs", "re", "n", "ns")
        .collect()
    )
    incl = pair.filter(pl.col("slot") >= 0).group_by("slot").agg(pl.col("n").sum(), pl.col("ns").sum())
    inner = pair.sort(["id", "rs", "re"], descending=[False, True, False]).group_by("id").first()
    excl = inner.filter(pl.col("slot") >= 0).group_by("slot").agg(pl.col("n").sum(), pl.col("ns").sum())
    outside = (
        launch.join(pair.select("id").unique(), on="id", how="anti")
        .group_by("tid")
        .agg(pl.col("n").sum(), pl.col("ns").sum())
    )
    e, i = np.zeros((2, NAMES_LIMIT), np.int64), np.zeros((2, NAMES_LIMIT), np.int64)
    for slot, n, ns in excl.rows():
        e[:, slot] = (n, ns)
    for slot, n, ns in incl.rows():
        i[:, slot] = (n, ns)
    launched = (len(launch), int(launch["n"].sum()), int(launch["ns"].sum()))
    kernel_total = (int(per_call["n"].sum()), int(per_call["ns"].sum()))
    return _from_rows(path, names, e, i, outside.rows(), kernel_total, launched)


# --- the reference: sftprof as it is -------------------------------------------------------------------------------


def sftprof_reference(path: Path):
    """kernsum and projection as sftprof computes them (load_trace into the store, then the analyses)."""
    from sftprof.analysis.gpu import kernel_summary
    from sftprof.analysis.nvtx import gpu_time_by_range
    from sftprof.trace import load_trace

    events = load_trace(path).events
    summary = kernel_summary(events)
    projection = gpu_time_by_range(events, {})
    return {"kernsum": summary.to_dict("records"), "projection": projection.to_dict("records")}


# --- comparing results ------------------------------------------------------------------------------------------


def kernsum_key(rows) -> list[tuple]:
    """Rows as (name id, shape..., total, n, min, max, mean, median, stddev), integers exact, floats to 0.1."""
    out = []
    for r in rows:
        ints = [int(v) for v in r[:9]]  # name id, 6 shape columns, total, instances
        out.append(
            (*ints, int(r[11]), int(r[12]), round(float(r[9]), 1), round(float(r[10]), 1), round(float(r[13]), 1))
        )
    return sorted(out)


def matches_reference(path: Path, kernsum, projection, reference) -> list[str]:
    """What differs between numba's results and sftprof's (names by string, nsys' rounding to 0.1)."""
    strings = _string_ids(path)
    problems = []
    mine = {
        (strings[r[0]], f"{r[1]:4d} {r[2]:4d} {r[3]:4d}", f"{r[4]:4d} {r[5]:4d} {r[6]:4d}"): (r[7], r[8], r[11], r[12],
                                                                                                    r[10], r[13])
        for r in kernsum
    }  # fmt: skip
    theirs = {
        (r["kernel"], r["grid"], r["block"]): (r["total_ns"], r["instances"], r["min_ns"], r["max_ns"], r["med_ns"],
                                               r["stddev_ns"])
        for r in reference["kernsum"]
    }  # fmt: skip
    if mine.keys() != theirs.keys():
        problems.append(f"kernsum groups differ: {len(mine)} against {len(theirs)}")
    for key in mine.keys() & theirs.keys():
        a, b = mine[key], theirs[key]
        if a[:4] != tuple(b[:4]) or abs(a[4] - b[4]) > 0.051 or abs(a[5] - b[5]) > 0.051:
            problems.append(f"kernsum {key[0][:40]}: {a} against {b}")
            break
    theirs_p = {}
    for r in reference["projection"]:
        name = r["range"]
        if name.startswith("(no NVTX range"):
            name = "outside"
        elif name.startswith("(launching call not traced"):
            name = "not traced"
        held = theirs_p.setdefault(name, [0, 0, 0, 0])
        for i, c in enumerate(("kernels", "gpu_ns", "inclusive_kernels", "inclusive_gpu_ns")):
            held[i] += int(r[c])
    mine_p = {}
    for key, v in projection.items():
        key = "outside" if isinstance(key, tuple) else key
        held = mine_p.setdefault(key, [0, 0, 0, 0])
        for i in range(4):
            held[i] += v[i]
    differ = {k for k in mine_p.keys() | theirs_p.keys() if mine_p.get(k) != theirs_p.get(k)}
    if differ:
        k = sorted(differ, key=str)[0]
        problems.append(f"projection: {len(differ)} of {len(theirs_p)} names differ, e.g. {k!r}: "
                        f"{mine_p.get(k)} against {theirs_p.get(k)}")  # fmt: skip
    return problems


# --- running -----------------------------------------------------------------------------------------------------


RUNS = {
    ("numba", "kernsum"): numba_kernsum,
    ("numba", "projection"): numba_projection,
    ("duckdb-arrow", "kernsum"): duckdb_kernsum,
    ("duckdb-arrow", "projection"): duckdb_projection,
    ("polars", "kernsum"): polars_kernsum,
    ("polars", "projection"): polars_projection,
}
OWN = {
    "numba": (Hasher, _hash_rows, _group_stats, _add_kernels, _sweep, Threads, _thread_codes),
    "duckdb-arrow": (_arrow_reader, _duckdb),
    "polars": (_polars_frame,),
}


def code_lines(candidate: str) -> int:
    """Lines of the candidate's own functions (shared decoding and result shaping not counted), blanks and
    comments left out."""
    functions = [RUNS[(candidate, p)] for p in PIECES] + list(OWN[candidate])
    lines = [line.strip() for f in functions for line in inspect.getsource(f).splitlines()]
    return sum(1 for line in lines if line and not line.startswith("#"))


def child(candidate: str, piece: str, path: Path, out: Path) -> None:
    import sftprof.trace.nsys.nsys_sqlite  # noqa: F401  (imports before the clock starts: not the engine's work)
    import sftprof.trace.nsys.sqlite_pages  # noqa: F401

    if candidate in ("duckdb-arrow", "polars"):
        import duckdb  # noqa: F401
        import pyarrow  # noqa: F401
    if candidate == "polars":
        import polars  # noqa: F401
        import polars.io.plugins  # noqa: F401
    started = time.perf_counter()
    result = sftprof_reference(path) if candidate == "sftprof" else RUNS[(candidate, piece)](path)
    with out.open("wb") as f:
        pickle.dump((result, time.perf_counter() - started), f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="*", type=Path, help="nsys SQLite exports (benchmarks/generate_export.py)")
    parser.add_argument(
        "--candidates", default=",".join(CANDIDATES), help=f"comma-separated (default: all: {CANDIDATES})"
    )
    parser.add_argument("--pieces", default=",".join(PIECES), help=f"comma-separated (default: {','.join(PIECES)})")
    parser.add_argument(
        "--skip", default="", help="candidate:piece pairs not to run, comma-separated (e.g. polars:projection)"
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter for duckdb-arrow and polars")
    parser.add_argument("--check", action="store_true", help="also check numba's results against sftprof's")
    parser.add_argument("--no-nsys", action="store_true", help="skip nsys stats (no ratio)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per child (default 1200)")
    parser.add_argument("--out", type=Path, help="write the table as CSV too")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        candidate, piece, path, out = args.child
        child(candidate, piece, Path(path), Path(out))
        return 0
    if not args.files:
        parser.error("no files given")
    import run  # benchmarks/run.py: measure, the nsys reports

    from sftprof.capture import nsys as nsys_tool

    candidates, pieces = args.candidates.split(","), args.pieces.split(",")
    reports = None
    if not args.no_nsys:
        nsys = shutil.which("nsys")
        version = nsys_tool.nsys_version(nsys) if nsys else None
        if version is None:
            raise SystemExit("no nsys on PATH (or pass --no-nsys)")
        reports = ",".join(report for report, *_ in run.comparisons(version[1]))
    table = []
    with tempfile.TemporaryDirectory(prefix="engine-prototypes-") as folder:
        work = Path(folder)

        def measure(name: str, command: list[str]) -> dict:
            m = run.measure(command, work / "out", work / "err", args.timeout, f"[{name}]")
            if m["rc"] != 0:
                print(f"{name}: exit {m['rc']}: {(work / 'err').read_text()[-2000:]}", file=sys.stderr)
            return m

        if "numba" in candidates:  # numba compiles once into its cache beside this file: not timed
            for piece in pieces:
                warm = [sys.executable, __file__, "--child", "numba", piece, str(WARMUP), str(work / "warm")]
                if measure(f"numba {piece} warm-up", warm)["rc"]:
                    raise SystemExit("the numba warm-up failed")
        for path in args.files:
            with path.open("rb") as f:  # into the page cache: every step reads it from memory
                while f.read(64 << 20):
                    pass
            nsys_m = None
            if reports:
                nsys_m = measure(f"{path.name} nsys", ["nsys", "stats", "-r", reports, "-f", "csv", "--force-export",
                                                       "false", str(path)])  # fmt: skip
                table.append(_row(path, "nsys stats", "", nsys_m, nsys_m, ""))
            results = {}
            for piece in pieces:
                for candidate in candidates:
                    if f"{candidate}:{piece}" in args.skip.split(","):
                        continue
                    python = sys.executable if candidate == "numba" else args.python
                    out = work / f"{candidate}-{piece}.pickle"
                    m = measure(f"{path.name} {candidate} {piece}", [python, __file__, "--child", candidate, piece,
                                                                    str(path), str(out)])  # fmt: skip
                    agree = ""
                    if m["rc"] == 0:
                        results[(candidate, piece)], m["work_s"] = pickle.loads(out.read_bytes())
                        base = results.get(("numba", piece))
                        agree = _agree(piece, results[(candidate, piece)], base) if candidate != "numba" else "-"
                    else:
                        agree = f"failed ({'timeout' if m['timed_out'] else 'exit ' + str(m['rc'])})"
                    table.append(_row(path, f"{candidate} {piece}", code_lines(candidate), m, nsys_m, agree))
            if args.check and ("numba", "kernsum") in results and ("numba", "projection") in results:
                out = work / "sftprof.pickle"
                m = measure(f"{path.name} sftprof", [sys.executable, __file__, "--child", "sftprof", "-", str(path),
                                                     str(out)])  # fmt: skip
                problems = ["sftprof failed"]
                if m["rc"] == 0:
                    reference, m["work_s"] = pickle.loads(out.read_bytes())
                    problems = matches_reference(path, results[("numba", "kernsum")],
                                                 results[("numba", "projection")], reference)  # fmt: skip
                table.append(_row(path, "sftprof load + both pieces", "", m, nsys_m, "; ".join(problems) or "yes"))
    run.print_table(table, args.out)
    return 0


def _row(path: Path, what: str, lines, m: dict, nsys_m: dict | None, agree: str) -> dict:
    return {
        "file": path.name,
        "what": what,
        "wall s": round(m["wall_s"], 2),
        "CPU s": round(m["cpu_s"], 2),
        "peak RSS GB": round(m["peak_rss_gb"], 2),
        "wall / nsys": round(m["wall_s"] / nsys_m["wall_s"], 3) if nsys_m else "",
        "CPU / nsys CPU": round(m["cpu_s"] / nsys_m["cpu_s"], 3) if nsys_m else "",
        "in-process s": round(m["work_s"], 2) if "work_s" in m else "",
        "lines": lines,
        "same as numba": agree,
    }


def _agree(piece: str, result, base) -> str:
    if base is None:
        return "no numba result"
    if piece == "kernsum":
        return "yes" if kernsum_key(result) == kernsum_key(base) else "NO"
    return "yes" if result == base else "NO"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
