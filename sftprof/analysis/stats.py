"""The duration summary that every `nsys stats` report prints, computed in an EventStore.

Same statistics and rounding as nsys: integer totals, min and max; average, median (mean of
the two middle values for an even count) and sample standard deviation (0 for one instance)
rounded to 0.1 by SQLite's round(), which rounds halves away from zero, unlike Python's.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from fractions import Fraction

import numpy as np
import pandas as pd

from sftprof import memory_budget

SUMMARY_COLUMNS = ["time_pct", "total_ns", "instances", "avg_ns", "med_ns", "min_ns", "max_ns", "stddev_ns"]

_rounders = threading.local()  # an SQLite connection per thread: analyses run on two


def sqlite_round(values: pd.Series, digits: int = 1) -> pd.Series:
    """SQLite's round() of each value (NaN stays NaN), in one statement over the distinct values: a summary has
    a row per name, and names that carry an id each (3M NVTX names) took 74 s at a statement per value."""
    if not hasattr(_rounders, "con"):
        _rounders.con = sqlite3.connect(":memory:")
        _rounders.con.execute("CREATE TEMP TABLE rounding (value REAL)")
    con = _rounders.con
    floats = values.to_numpy("float64", copy=True)
    # an integer below 2^52 prints as itself and ".0..." and reads back as itself (SQLite returns any larger
    # value as it is); -0.0 comes back as 0.0. Medians, totals and a single call's average are such integers.
    to_round = ~((floats == np.floor(floats)) & (np.abs(floats) < 2.0**52) & ~((floats == 0) & np.signbit(floats)))
    bits, where = np.unique(floats[to_round].view("int64"), return_inverse=True)  # distinct doubles
    con.execute("DELETE FROM rounding")
    con.executemany("INSERT INTO rounding (rowid, value) VALUES (?, ?)", enumerate(bits.view("float64").tolist()))
    rounded = con.execute("SELECT round(value, ?) FROM rounding ORDER BY rowid", (digits,)).fetchall()
    distinct = np.array([value for (value,) in rounded], dtype="float64")  # NULL (a NaN bound): NaN
    floats[to_round] = distinct[where.reshape(-1)]
    return pd.Series(floats, index=values.index, dtype="float64")


# The same statistics in SQL, for tables held in an EventStore, but the median (grouped_summary): every
# one of these is a running aggregate, which keeps a few numbers per group whatever the rows. The
# standard deviation comes from exact integer sums (text: pandas would make floats of 128-bit integers),
# not stddev_samp, whose floating-point result depends on the order rows arrive in: the same capture
# through SQLite and parquetdir differed in the 16th digit. A square is taken as a BIGINT where it fits one
# (summed into a 128-bit integer all the same): squaring every value as a HUGEINT took 0.26-0.31 s per 22M
# rows grouped, this 0.12-0.15 s.
_SQUARE_FITS = math.isqrt(2**63 - 1)  # the largest |duration| whose square is a BIGINT
# The sums are text only where a deviation is taken (two values or more): 6M NVTX names of one range each made
# 12M strings, 0.7 GB, for NaNs.
SQL_AGGREGATES = (
    "sum(duration)::BIGINT AS total_ns, count(*) AS instances, min(duration) AS min_ns, max(duration) AS max_ns, "
    "count(duration) AS n_values, CASE WHEN count(duration) > 1 THEN sum(duration)::VARCHAR END AS sum_values, "
    "CASE WHEN count(duration) > 1 THEN "
    f"(coalesce(sum(CASE WHEN abs(duration::BIGINT) <= {_SQUARE_FITS} THEN duration::BIGINT * duration::BIGINT END), 0)"
    f" + coalesce(sum(CASE WHEN abs(duration::BIGINT) > {_SQUARE_FITS} THEN duration::HUGEINT * duration::HUGEINT END),"
    " 0))::VARCHAR END AS sum_squares"
)
# The exact median in bounded memory (grouped_medians): DuckDB's median() keeps every value of every
# group while it runs (+1.15 GB over 88M CUDA API calls), so values are counted by bucket of their
# range instead, a pass at a time, each pass narrowing every wanted rank's range to one bucket, until
# the values left in those ranges are few enough to fetch and pick from.
MEDIAN_BUCKET_ROWS = memory_budget.DUCKDB_GROUPS  # the most (range, bucket) counts one query may make
MEDIAN_FETCH_ROWS = 1 << 20  # values left in the wanted ranges that are fetched, not counted again


def grouped_summary(
    events, source: str, keys: list[str], coded: tuple[str, int] | None = None, **frames: pd.DataFrame
) -> pd.DataFrame:
    """SQL_AGGREGATES and the exact median (med_ns) of `duration` per group of `keys` in the EventStore
    table or view `source` (or one of `frames`, registered for every query), in memory that does not
    grow with its rows. `coded`: a key and how many codes (0...) it holds, where that can be millions (names an
    application writes); the groups are then summed a slice of its codes at a time (memory_budget.summary_groups)."""
    group = f"{', '.join(keys)}, " if keys else ""
    parts = [""]
    if coded is not None and coded[1] > memory_budget.summary_groups():
        key, step = coded[0], memory_budget.summary_groups()
        parts = [f"WHERE {key} < {step} OR {key} IS NULL"]  # every row in one slice: codes outside too
        parts += [f"WHERE {key} >= {first} AND {key} < {first + step}" for first in range(step, coded[1] - step, step)]
        parts.append(f"WHERE {key} >= {len(parts) * step}")
    summary = pd.concat(
        [
            events.query(
                f"SELECT {group}{SQL_AGGREGATES} FROM {source} {part} {'GROUP BY ALL' if keys else ''}", **frames
            )
            for part in parts
        ],
        ignore_index=True,
    )
    summary = summary[summary["instances"] > 0].reset_index(drop=True)
    n, total, squares = (summary.pop(column) for column in ("n_values", "sum_values", "sum_squares"))
    stddev = np.full(len(summary), np.nan)  # fewer than two values: NaN, as stddev_samp's NULL
    taken = np.flatnonzero(n.to_numpy("int64") > 1)
    stddev[taken] = [_sample_stddev(int(n.iat[i]), total.iat[i], squares.iat[i]) for i in taken]
    return summary.assign(stddev_ns=stddev, med_ns=grouped_medians(events, source, keys, summary, **frames))


def _sample_stddev(n: int, total: str, squares: str) -> float:
    """The sample standard deviation of n >= 2 integers from their sum and sum of squares (as text), exactly
    (Python's integers), rounded once."""
    total_value = int(total)
    return math.sqrt(Fraction(n * int(squares) - total_value * total_value, n * (n - 1)))


def grouped_medians(events, source: str, keys: list[str], groups: pd.DataFrame, **frames: pd.DataFrame) -> np.ndarray:
    """The median of `duration` in each row of `groups` (its `keys`, and instances, min_ns and max_ns
    of that group in `source`): the mean of the two middle values for an even count, as DuckDB's,
    SQLite's and pandas' medians. Radix selection over the value range (MEDIAN_BUCKET_ROWS)."""
    counts = groups["instances"].to_numpy("int64")
    # each group's two middle ranks (1-based; one rank twice for an odd count), found a range at a time
    rank = np.stack([(counts + 1) // 2, counts // 2 + 1], axis=1).ravel()
    wanted_range = np.repeat(np.arange(len(groups)), 2)  # the range each wanted rank lies in: a row of `ranges`
    ranges = groups[keys].assign(base=groups["min_ns"].astype("int64"), top=groups["max_ns"].astype("int64"), n=counts)
    on_keys = " AND ".join(
        [f"r.{key} IS NOT DISTINCT FROM t.{key}" for key in keys] + ["t.duration BETWEEN r.base AND r.top"]
    )
    values = np.zeros(len(rank), dtype="int64")
    pending = np.arange(len(rank))  # the wanted ranks not yet found, at `wanted_range` and `rank`
    part = max(MEDIAN_BUCKET_ROWS // 2, 1)  # the ranges one query counts, each in 2 buckets at least
    while len(pending):
        # a range of one value is settled, and ranges of few values, where more ranges are left than a query
        # counts, are fetched a batch of MEDIAN_FETCH_ROWS values at a time: counting 8k ranges a pass over every
        # range made 366 passes for 3M NVTX names that each name one range or two
        done = (ranges["base"] == ranges["top"]).to_numpy(copy=True)
        found = done[wanted_range]
        values[pending[found]] = ranges["base"].to_numpy("int64")[wanted_range[found]]
        counts = ranges["n"].to_numpy("int64")
        few = ~done & (counts <= MEDIAN_FETCH_ROWS // part) if len(ranges) > part else np.zeros(len(ranges), bool)
        if counts[~done].sum() <= MEDIAN_FETCH_ROWS:
            few = ~done
        batch = np.full(len(ranges), -1)
        batch[few] = (np.cumsum(counts[few]) - 1) // max(MEDIAN_FETCH_ROWS, 1)
        for number in np.unique(batch[few]):
            these = batch == number
            at = these[wanted_range]
            values[pending[at]] = _pick(
                events,
                source,
                on_keys,
                ranges[these].reset_index(drop=True),
                (np.cumsum(these) - 1)[wanted_range[at]],
                rank[at],
                frames,
            )
        done |= few
        kept = ~done[wanted_range]
        pending, wanted_range, rank = pending[kept], (np.cumsum(~done) - 1)[wanted_range[kept]], rank[kept]
        ranges = ranges[~done].reset_index(drop=True)
        if not len(pending):
            break
        # the bit length of each range's widest offset (frexp's exponent), less the bits of a bucket number
        width_bits = np.frexp((ranges["top"] - ranges["base"]).to_numpy("float64"))[1].astype("int64")
        counts = ranges["n"].to_numpy("int64")
        shifts, histograms = [], []
        for first in range(0, len(ranges), part):
            these = slice(first, first + part)
            shift = np.maximum(width_bits[these] - _bucket_bits(width_bits[these], counts[these]), 0)
            histograms.append(
                events.query(
                    f"""SELECT r.range, (t.duration - r.base) >> r.shift AS bucket, count(*) AS n
                        FROM {source} t JOIN ranges r ON {on_keys} GROUP BY ALL ORDER BY range, bucket""",
                    ranges=ranges.iloc[these].assign(range=np.arange(first, first + len(shift)), shift=shift),
                    **frames,
                )
            )
            shifts.append(shift)
        shift, histogram = np.concatenate(shifts), pd.concat(histograms, ignore_index=True)
        ranges, wanted_range, rank = _narrow(ranges, shift, histogram, wanted_range, rank)
    lo, hi = values[0::2].astype("float64"), values[1::2].astype("float64")
    return lo + (hi - lo) * 0.5


def _bucket_bits(width_bits: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Bits of bucket number for each range one query counts, so that the buckets it can fill, at most its count
    each, come to MEDIAN_BUCKET_ROWS at most: a range that cannot fill its share is counted value by value (all
    its width's bits: settled in one pass), the others share what is left evenly, 2 buckets at least. NeMo's
    1,300 NVTX names, most of them with few calls, had 6 buckets a range when shared evenly: 5.3 s for the
    medians of 60M ranges, against 3.4 s with 2^21 buckets in all."""
    groups = np.minimum(np.ldexp(1.0, width_bits), counts)  # what each range fills when counted value by value
    bits = np.zeros(len(counts), "int64")
    left = MEDIAN_BUCKET_ROWS
    for place, i in enumerate(np.argsort(groups, kind="stable")):
        share = left // (len(counts) - place)
        if groups[i] <= share:
            bits[i], used = width_bits[i], int(groups[i])
        else:
            bits[i] = min(max(share.bit_length() - 1, 1), width_bits[i])
            used = 1 << int(bits[i])
        left -= used
    return bits


def _narrow(ranges: pd.DataFrame, shift: np.ndarray, histogram: pd.DataFrame, wanted_range, rank):
    """Each wanted rank's bucket of its range, as the new ranges (one per distinct bucket), and the
    rank within it."""
    owner, bucket, n = (histogram[column].to_numpy("int64") for column in ("range", "bucket", "n"))
    upto = np.cumsum(n)
    first = np.searchsorted(owner, np.arange(len(ranges)))  # each range's first histogram row
    before = np.where(first > 0, upto[first - 1], 0)  # counted before each range's first row
    row = np.searchsorted(upto, before[wanted_range] + rank)  # the first row whose running count reaches the rank
    rank = rank - (upto[row] - n[row] - before[wanted_range])
    rows, wanted_range = np.unique(row, return_inverse=True)
    source = owner[rows]
    base = ranges["base"].to_numpy("int64")[source] + (bucket[rows] << shift[source])
    top = np.minimum(ranges["top"].to_numpy("int64")[source], base + (np.int64(1) << shift[source]) - 1)
    return ranges.iloc[source].reset_index(drop=True).assign(base=base, top=top, n=n[rows]), wanted_range, rank


def _pick(events, source: str, on_keys: str, ranges: pd.DataFrame, wanted_range, rank, frames) -> np.ndarray:
    """The value at each wanted rank of its range, from the values in the ranges (few: MEDIAN_FETCH_ROWS)."""
    rows = events.arrays(
        f"SELECT r.range, t.duration FROM {source} t JOIN ranges r ON {on_keys}",
        ranges=ranges.assign(range=np.arange(len(ranges))),
        **frames,
    )
    order = np.lexsort((rows["duration"], rows["range"]))
    first = np.searchsorted(rows["range"][order], np.arange(len(ranges)))
    return rows["duration"][order][first[wanted_range] + rank - 1]


def finish_summary(summary: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """From per-group total_ns, instances, med_ns, min_ns, max_ns and stddev_ns (SQL_AGGREGATES or
    pandas): the average, the share of the total, nsys's rounding and order."""
    if summary.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS + keys)
    summary = summary.copy()
    summary["stddev_ns"] = summary["stddev_ns"].astype("float64").fillna(0.0)
    summary["avg_ns"] = summary["total_ns"] / summary["instances"]
    grand_total = summary["total_ns"].sum()
    summary["time_pct"] = summary["total_ns"] * 100.0 / grand_total if grand_total else 0.0
    for column in ("time_pct", "avg_ns", "med_ns", "stddev_ns"):
        summary[column] = sqlite_round(summary[column])
    for column in ("total_ns", "instances", "min_ns", "max_ns"):
        summary[column] = summary[column].astype("int64")
    summary = summary.sort_values(["total_ns", *keys], ascending=[False] + [True] * len(keys), kind="stable")
    return summary[SUMMARY_COLUMNS + keys].reset_index(drop=True)
