"""The duration summary that every `nsys stats` report prints, computed over a DataFrame.

Same statistics and rounding as nsys: integer totals, min and max; average, median (mean of
the two middle values for an even count) and sample standard deviation (0 for one instance)
rounded to 0.1 by SQLite's round(), which rounds halves away from zero, unlike Python's.
"""

from __future__ import annotations

import sqlite3
import threading

import pandas as pd

SUMMARY_COLUMNS = ["time_pct", "total_ns", "instances", "avg_ns", "med_ns", "min_ns", "max_ns", "stddev_ns"]

_rounders = threading.local()  # an SQLite connection per thread: analyses run on two


def sqlite_round(values: pd.Series, digits: int = 1) -> pd.Series:
    """SQLite's round(), value by value (summaries have one row per name, so this is cheap)."""
    if not hasattr(_rounders, "con"):
        _rounders.con = sqlite3.connect(":memory:")
    return values.map(lambda v: _rounders.con.execute("SELECT round(?, ?)", (float(v), digits)).fetchone()[0])


# The same statistics in SQL, for tables held in an EventStore (DuckDB's median interpolates an even
# count as SQLite's and pandas' do).
SQL_AGGREGATES = (
    "sum(duration)::BIGINT AS total_ns, count(*) AS instances, median(duration) AS med_ns, "
    "min(duration) AS min_ns, max(duration) AS max_ns, stddev_samp(duration) AS stddev_ns"
)


def duration_summary(rows: pd.DataFrame, keys: list[str], value: str = "duration") -> pd.DataFrame:
    """One row per distinct `keys`, ordered by total time descending (then by key)."""
    if rows.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS + keys)
    grouped = rows.groupby(keys, dropna=False, sort=False)[value]
    summary = grouped.agg(
        total_ns="sum", instances="count", med_ns="median", min_ns="min", max_ns="max", stddev_ns="std"
    ).reset_index()
    return finish_summary(summary, keys)


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
