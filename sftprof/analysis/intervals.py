"""Interval arithmetic on [start, end) nanosecond intervals: unions, coverage of windows, gaps.

Overlapping work (kernels on several streams, a thread's nested calls) must be merged before
it is summed: busy time is the length of the union, not the sum of durations.
"""

from __future__ import annotations

import weakref

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
    merged intervals (and one batch), so tens of millions of kernels can stream through.
    `capacity`: how many intervals may arrive in all, when known: the merged ones are then written
    into arrays of that size, not gathered in pieces and joined at the end (which briefly held
    every interval twice: 0.3 GB at 10M kernels)."""

    def __init__(self, capacity: int | None = None):
        self._starts, self._ends = [], []  # merged, final (in pieces, without `capacity`)
        self._size = 0  # merged, final, in the arrays (with `capacity`)
        if capacity is not None:
            self._starts, self._ends = np.empty(capacity, dtype="int64"), np.empty(capacity, dtype="int64")
        self._open = None  # the last merged interval: the next batch may extend it

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if len(starts) == 0:
            return
        starts, ends = starts.astype("int64", copy=False), ends.astype("int64", copy=False)
        if self._open is not None:
            starts, ends = np.r_[self._open[0], starts], np.r_[self._open[1], ends]
        running_end = np.maximum.accumulate(ends)
        apart = starts[1:] > running_end[:-1]
        if apart.all():  # nothing to merge (kernels one after another on one stream): as they came
            merged_starts, merged_ends = starts, running_end
        else:
            first = np.flatnonzero(np.r_[True, apart])
            last = np.r_[first[1:] - 1, len(starts) - 1]
            merged_starts, merged_ends = starts[first], running_end[last]
        final = len(merged_starts) - 1  # all but the last merged interval: the next batch cannot extend them
        if not isinstance(self._starts, list) and self._size + final >= len(self._starts):
            # more arrived than announced (room is kept for the open interval): pieces from here on
            self._starts, self._ends = [self._starts[: self._size]], [self._ends[: self._size]]
        if isinstance(self._starts, list):
            self._starts.append(merged_starts[:-1])
            self._ends.append(merged_ends[:-1])
        else:
            self._starts[self._size : self._size + final] = merged_starts[:-1]
            self._ends[self._size : self._size + final] = merged_ends[:-1]
            self._size += final
        self._open = (merged_starts[-1], merged_ends[-1])

    def result(self) -> pd.DataFrame:
        """Sorted, disjoint start/end rows (columns share the arrays: no copy)."""
        if self._open is None:
            return pd.DataFrame({"start": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64")})
        if not isinstance(self._starts, list):
            size = self._size
            starts, ends = self._starts, self._ends
            starts[size], ends[size] = self._open
            if size + 1 < len(starts) // 2:  # mostly overlapping: do not keep the unused room
                starts, ends = starts[: size + 1].copy(), ends[: size + 1].copy()
            self._starts, self._ends = [starts[:size]], [ends[:size]]
            return pd.DataFrame({"start": starts[: size + 1], "end": ends[: size + 1]}, copy=False)
        # One column at a time, its pieces let go once joined: at 10M kernels each column is 80 MB.
        starts = np.concatenate([*self._starts, [self._open[0]]]).astype("int64", copy=False)
        self._starts = [starts[:-1]]
        ends = np.concatenate([*self._ends, [self._open[1]]]).astype("int64", copy=False)
        self._ends = [ends[:-1]]
        return pd.DataFrame({"start": starts, "end": ends}, copy=False)


KEEP_LENGTHS_FROM = 100_000  # intervals: covered_ns keeps the cumulative lengths of a merged frame this long
_last_lengths: list = []  # [(weakref to a merged frame, its columns' addresses, its cumulative lengths)]


def _cumulative_lengths(merged: pd.DataFrame, interval_start: np.ndarray, interval_end: np.ndarray) -> np.ndarray:
    """through[k]: the length of intervals 0..k, one array the size of `merged`, built in place;
    kept for the last frame asked about (analyses ask again about the same busy time, ten million
    intervals at 10M kernels), while its columns are the same arrays. Small frames are not kept."""
    key = (
        interval_start.__array_interface__["data"][0],
        interval_end.__array_interface__["data"][0],
        len(interval_start),
    )
    if _last_lengths and _last_lengths[0][0]() is merged and _last_lengths[0][1] == key:
        return _last_lengths[0][2]
    through = np.empty(len(interval_start), dtype="int64")
    for i in range(0, len(through), CHUNK_ROWS):
        np.subtract(
            interval_end[i : i + CHUNK_ROWS], interval_start[i : i + CHUNK_ROWS], out=through[i : i + CHUNK_ROWS]
        )
    np.cumsum(through, out=through)
    if len(through) < KEEP_LENGTHS_FROM:  # they cost little, and a test may change a small frame in place
        return through
    try:
        _last_lengths[:] = [(weakref.ref(merged), key, through)]
    except TypeError:  # not a frame that can be referred to weakly: not kept
        pass
    return through


def covered_ns(merged: pd.DataFrame, starts, ends) -> np.ndarray:
    """For each window [starts[i], ends[i]), how much of it the disjoint sorted `merged` covers."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if merged.empty:
        return np.zeros(len(starts), dtype="int64")
    interval_start = merged["start"].to_numpy(dtype="int64")
    interval_end = merged["end"].to_numpy(dtype="int64")
    through = _cumulative_lengths(merged, interval_start, interval_end)

    def covered_before(t: np.ndarray) -> np.ndarray:
        # Intervals starting at or before t: all but the last lie wholly before t.
        count = np.searchsorted(interval_start, t, side="right")
        last = np.maximum(count - 1, 0)
        partial = np.clip(np.minimum(t, interval_end[last]) - interval_start[last], 0, None)
        before = np.where(last > 0, through[np.maximum(last - 1, 0)], 0)
        return np.where(count > 0, before + partial, 0)

    return covered_before(ends) - covered_before(starts)


# Rows worked through at a time where a whole busy time (ten million intervals at 10M kernels) is
# scanned: each temporary then fits the memory the allocator keeps for reuse. An array of 80 MB is
# mapped afresh each time, and on the 2-core VM its page faults cost 15-170 ms (ENGINE.md).
CHUNK_ROWS = 1 << 20


def total_length(merged: pd.DataFrame) -> int:
    """The summed length of the intervals of `merged` (as int64, a chunk at a time)."""
    starts, ends = merged["start"].to_numpy(dtype="int64"), merged["end"].to_numpy(dtype="int64")
    return sum(
        int((ends[i : i + CHUNK_ROWS] - starts[i : i + CHUNK_ROWS]).sum()) for i in range(0, len(starts), CHUNK_ROWS)
    )


def gaps(merged: pd.DataFrame, min_ns: int = 0) -> pd.DataFrame:
    """The holes between disjoint sorted intervals longer than `min_ns`, longest first."""
    starts = merged["end"].to_numpy(dtype="int64")[:-1]
    ends = merged["start"].to_numpy(dtype="int64")[1:]
    longer = np.concatenate(
        [
            np.flatnonzero(ends[i : i + CHUNK_ROWS] - starts[i : i + CHUNK_ROWS] > min_ns) + i
            for i in range(0, len(starts), CHUNK_ROWS)
        ]
        + [np.zeros(0, dtype="int64")]
    )
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
