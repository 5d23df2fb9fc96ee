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
        return RunningUnion().result()
    starts = intervals["start"].to_numpy(dtype="int64")
    order = np.argsort(starts, kind="stable")
    merged = RunningUnion()
    merged.add(starts[order], intervals["end"].to_numpy(dtype="int64")[order])
    return merged.result()


class RunningUnion:
    """The union of intervals that arrive in start order, a batch at a time: memory holds the
    merged intervals (and one batch), so tens of millions of kernels can stream through."""

    def __init__(self):
        self._starts, self._ends = [], []  # merged, final
        self._open = None  # the last merged interval: the next batch may extend it

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if len(starts) == 0:
            return
        starts, ends = starts.astype("int64", copy=False), ends.astype("int64", copy=False)
        if self._open is not None:
            starts, ends = np.r_[self._open[0], starts], np.r_[self._open[1], ends]
        running_end = np.maximum.accumulate(ends)
        first = np.flatnonzero(np.r_[True, starts[1:] > running_end[:-1]])
        last = np.r_[first[1:] - 1, len(starts) - 1]
        merged_starts, merged_ends = starts[first], running_end[last]
        self._starts.append(merged_starts[:-1])
        self._ends.append(merged_ends[:-1])
        self._open = (merged_starts[-1], merged_ends[-1])

    def result(self) -> pd.DataFrame:
        """Sorted, disjoint start/end rows (columns share the arrays: no copy)."""
        if self._open is None:
            return pd.DataFrame({"start": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64")})
        # One column at a time, its pieces let go once joined: at 10M kernels each column is 80 MB.
        starts = np.concatenate([*self._starts, [self._open[0]]]).astype("int64", copy=False)
        self._starts = [starts[:-1]]
        ends = np.concatenate([*self._ends, [self._open[1]]]).astype("int64", copy=False)
        self._ends = [ends[:-1]]
        return pd.DataFrame({"start": starts, "end": ends}, copy=False)


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
    longer = np.flatnonzero(ends - starts > min_ns)
    holes = pd.DataFrame({"start": starts[longer], "end": ends[longer], "duration": ends[longer] - starts[longer]})
    return holes.sort_values(["duration", "start"], ascending=[False, True]).reset_index(drop=True)


def chunk_edges(start: int, end: int, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """`chunks` equal windows covering [start, end) (the last one absorbs the rounding)."""
    edges = np.linspace(start, end, chunks + 1).round().astype("int64")
    return edges[:-1], edges[1:]


def overlap_ns(starts, ends, window_start: int, window_end: int) -> np.ndarray:
    """How much of each [starts[i], ends[i]) lies inside one window."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    return np.clip(np.minimum(ends, window_end) - np.maximum(starts, window_start), 0, None)
