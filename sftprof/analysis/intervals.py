"""Interval arithmetic on [start, end) nanosecond intervals: unions, coverage of windows, gaps.

Overlapping work (kernels on several streams, a thread's nested calls) must be merged before
it is summed: busy time is the length of the union, not the sum of durations.
"""

from __future__ import annotations

import numba
import numpy as np
import pandas as pd

_NO_TIMES = np.empty(0, "int64")


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
    merged intervals (and one batch), so tens of millions of kernels can stream through; or, where
    they are handed over as they settle (take_final: spilled.SpilledUnion), one batch only."""

    def __init__(self):
        self._starts, self._ends = [], []  # merged, final, in pieces
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
        # all but the last merged interval: the next batch cannot extend them
        self._starts.append(merged_starts[:-1])
        self._ends.append(merged_ends[:-1])
        self._open = (merged_starts[-1], merged_ends[-1])

    def take_final(self, last: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The merged intervals no later batch can extend, since the last call, handed over: what is
        kept is the open interval only. `last`: no batch is to come, so the open interval is handed over too."""
        starts, ends = self._starts, self._ends
        if last and self._open is not None:
            starts, ends = [*starts, np.array([self._open[0]], "int64")], [*ends, np.array([self._open[1]], "int64")]
            self._open = None
        self._starts, self._ends = [], []
        return np.concatenate([*starts, _NO_TIMES]), np.concatenate([*ends, _NO_TIMES])

    def result(self) -> pd.DataFrame:
        """Sorted, disjoint start/end rows."""
        if self._open is None:
            return pd.DataFrame({"start": pd.Series(dtype="int64"), "end": pd.Series(dtype="int64")})
        # One column at a time, its pieces let go once joined.
        starts = np.concatenate([*self._starts, [self._open[0]]]).astype("int64", copy=False)
        self._starts = [starts[:-1]]
        ends = np.concatenate([*self._ends, [self._open[1]]]).astype("int64", copy=False)
        self._ends = [ends[:-1]]
        return pd.DataFrame({"start": starts, "end": ends}, copy=False)


LENGTH_BLOCK = 16  # intervals per block sum: 0.5 bytes an interval, where every cumulative length took 8


def _block_prefix(interval_start: np.ndarray, interval_end: np.ndarray) -> np.ndarray:
    """prefix[k]: the length of intervals 0 .. k * LENGTH_BLOCK - 1."""
    prefix = np.zeros(-(-len(interval_start) // LENGTH_BLOCK) + 1, dtype="int64")
    step = CHUNK_ROWS - CHUNK_ROWS % LENGTH_BLOCK  # whole blocks per chunk
    for i in range(0, len(interval_start), step):
        lengths = interval_end[i : i + step] - interval_start[i : i + step]
        first = i // LENGTH_BLOCK
        prefix[first + 1 : first + 1 + -(-len(lengths) // LENGTH_BLOCK)] = np.add.reduceat(
            lengths, np.arange(0, len(lengths), LENGTH_BLOCK)
        )
    np.cumsum(prefix, out=prefix)
    return prefix


@numba.njit(cache=True, nogil=True)
def _lengths_before(prefix, interval_start, interval_end, count):  # pragma: no cover (compiled)
    """The length of intervals 0 .. count[i] - 1, for each i: a block sum and at most LENGTH_BLOCK - 1 lengths."""
    out = np.empty(len(count), dtype=np.int64)
    for i in range(len(count)):
        first = count[i] - count[i] % LENGTH_BLOCK
        total = prefix[count[i] // LENGTH_BLOCK]
        for k in range(first, count[i]):
            total += interval_end[k] - interval_start[k]
        out[i] = total
    return out


@numba.njit(cache=True, nogil=True)
def _search_ordered(haystack, needles, right):  # pragma: no cover (compiled)
    """np.searchsorted's answers, each found by galloping from the previous one: a few steps where
    the needles come in order (times, segment numbers), a binary search's where they do not."""
    out = np.empty(len(needles), np.int64)
    n, at = len(haystack), 0
    for i in range(len(needles)):
        x = needles[i]
        if at < n and (haystack[at] <= x if right else haystack[at] < x):  # after `at`: gallop forward
            lo, step = at + 1, 1
            while lo + step - 1 < n and (haystack[lo + step - 1] <= x if right else haystack[lo + step - 1] < x):
                lo += step
                step *= 2
            hi = min(lo + step - 1, n)
        else:  # at or before `at`: gallop backward
            hi, step = at, 1
            while hi - step >= 0 and not (haystack[hi - step] <= x if right else haystack[hi - step] < x):
                hi -= step
                step *= 2
            lo = max(hi - step + 1, 0)
        while lo < hi:
            mid = (lo + hi) >> 1
            if haystack[mid] <= x if right else haystack[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo
        at = lo
    return out


def search_ordered(haystack: np.ndarray, needles: np.ndarray, side: str = "left") -> np.ndarray:
    """np.searchsorted(haystack, needles, side) (int64 positions) for needles that come mostly in order, as a
    thread's range edges and launches do: 2-3x faster there, where numpy starts each binary search afresh
    (0.5M times among 1M took 14 ms, against 5 ms); as fast on needles in no order."""
    haystack = np.ascontiguousarray(haystack, dtype=np.int64)
    return _search_ordered(haystack, np.ascontiguousarray(needles, dtype=np.int64), side == "right")


def covered_ns(merged: pd.DataFrame, starts, ends) -> np.ndarray:
    """For each window [starts[i], ends[i]), how much of it the disjoint sorted `merged` covers."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if merged.empty:
        return np.zeros(len(starts), dtype="int64")
    interval_start = merged["start"].to_numpy(dtype="int64")
    interval_end = merged["end"].to_numpy(dtype="int64")
    prefix = _block_prefix(interval_start, interval_end)

    def covered_before(t: np.ndarray) -> np.ndarray:
        # Intervals starting at or before t: all but the last lie wholly before t.
        count = np.searchsorted(interval_start, t, side="right")
        last = np.maximum(count - 1, 0)
        partial = np.clip(np.minimum(t, interval_end[last]) - interval_start[last], 0, None)
        before = _lengths_before(prefix, interval_start, interval_end, last)
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


def chunk_edges(start: int, end: int, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """`chunks` equal windows covering [start, end) (the last one absorbs the rounding)."""
    edges = np.linspace(start, end, chunks + 1).round().astype("int64")
    return edges[:-1], edges[1:]


def overlap_ns(starts, ends, window_start: int, window_end: int) -> np.ndarray:
    """How much of each [starts[i], ends[i]) lies inside one window."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    return np.clip(np.minimum(ends, window_end) - np.maximum(starts, window_start), 0, None)


def overlaps(a_start, a_end, b_start, b_end) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every overlapping pair of sorted disjoint intervals a and sorted intervals b (as starts and ends), by binary
    search (no pair is compared one by one): the overlap's start and end, its index in a and its index in b."""
    first = np.searchsorted(a_end, b_start, side="right")
    last = np.searchsorted(a_start, b_end, side="left")
    counts = np.maximum(last - first, 0)
    a_index = np.repeat(first, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    b_index = np.repeat(np.arange(len(b_start)), counts)
    return np.maximum(a_start[a_index], b_start[b_index]), np.minimum(a_end[a_index], b_end[b_index]), a_index, b_index


def position_ranges(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """first[i], first[i] + 1, ... counts[i] numbers from each, one after another."""
    offsets = np.cumsum(counts) - counts
    return np.repeat(first - offsets, counts) + np.arange(int(counts.sum()))


def distinct_sorted(ordered: np.ndarray) -> np.ndarray:
    """The distinct values of a sorted array (np.unique hashes: slower on millions)."""
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered
