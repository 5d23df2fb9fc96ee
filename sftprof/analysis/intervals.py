"""Interval arithmetic on [start, end) nanosecond intervals: unions, coverage of windows, gaps.

Overlapping work (kernels on several streams, a thread's nested calls) must be merged before
it is summed: busy time is the length of the union, not the sum of durations.
"""

from __future__ import annotations

import numpy as np
import pandas as pd


def union(intervals: pd.DataFrame) -> pd.DataFrame:
    """The union of intervals as sorted, disjoint [start, end) rows."""
    if intervals.empty:
        return pd.DataFrame({"start": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64")})
    ordered = intervals.sort_values("start", kind="stable")
    starts = ordered["start"].to_numpy(dtype="int64")
    ends = ordered["end"].to_numpy(dtype="int64")
    running_end = np.maximum.accumulate(ends)
    new_block = np.concatenate([[True], starts[1:] > running_end[:-1]])
    block = np.cumsum(new_block) - 1
    merged = pd.DataFrame({"start": starts, "end": running_end, "block": block})
    return merged.groupby("block").agg(start=("start", "min"), end=("end", "max")).reset_index(drop=True)


def covered_ns(merged: pd.DataFrame, starts, ends) -> np.ndarray:
    """For each window [starts[i], ends[i]), how much of it the disjoint sorted `merged` covers."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if merged.empty:
        return np.zeros(len(starts), dtype="int64")
    interval_start = merged["start"].to_numpy(dtype="int64")
    interval_end = merged["end"].to_numpy(dtype="int64")
    before = np.concatenate([[0], np.cumsum(interval_end - interval_start)])

    def covered_before(t: np.ndarray) -> np.ndarray:
        # Intervals starting at or before t: all but the last lie wholly before t.
        count = np.searchsorted(interval_start, t, side="right")
        last = np.maximum(count - 1, 0)
        partial = np.clip(np.minimum(t, interval_end[last]) - interval_start[last], 0, None)
        return np.where(count > 0, before[last] + partial, 0)

    return covered_before(ends) - covered_before(starts)


def gaps(merged: pd.DataFrame, min_ns: int = 0) -> pd.DataFrame:
    """The holes between disjoint sorted intervals longer than `min_ns`, longest first."""
    starts = merged["end"].to_numpy(dtype="int64")[:-1]
    ends = merged["start"].to_numpy(dtype="int64")[1:]
    holes = pd.DataFrame({"start": starts, "end": ends, "duration": ends - starts})
    holes = holes[holes["duration"] > min_ns]
    return holes.sort_values(["duration", "start"], ascending=[False, True]).reset_index(drop=True)


def chunk_edges(start: int, end: int, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """`chunks` equal windows covering [start, end) (the last one absorbs the rounding)."""
    edges = np.linspace(start, end, chunks + 1).round().astype("int64")
    return edges[:-1], edges[1:]


def overlap_ns(starts, ends, window_start: int, window_end: int) -> np.ndarray:
    """How much of each [starts[i], ends[i]) lies inside one window."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    return np.clip(np.minimum(ends, window_end) - np.maximum(starts, window_start), 0, None)
