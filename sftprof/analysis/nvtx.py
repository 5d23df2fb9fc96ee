"""NVTX ranges as the frame for the rest of the trace: the range a call was made in, and the GPU
time launched from each range.

A kernel belongs to the NVTX ranges, on the thread that launched it, that contain its launching
CUDA API call (start and end inside the range), the rule of nsys's nvtxkernsum/nvtxgpuproj.
`inclusive` counts it in every such range, as nvtxkernsum does; the plain columns count it once,
in the innermost range, so that they add up to the kernel time.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np
import pandas as pd

from sftprof import memory_budget
from sftprof.analysis.intervals import CHUNK_ROWS, search_ordered
from sftprof.trace.events import EventStore, usable_cores

NOT_TRACED = "(launching call not traced)"
# Kernels joined to their launches a slice at a time, and ranges that start in one window of a thread's timeline
# (ThreadWindows, ~12 MB of ThreadRanges): 0.25M each. The projection alone over NeMo's 10M export held 159 MiB at
# its peak (tracemalloc) with two workers, against 317 MiB at 0.5M each, and the trainer's 4M export 89-100 MiB
# against 176-205, in the same time (benchmarks/ENGINE.md; at 1M NeMo's shape peaked higher for no gain).
SLICE_KERNELS = 1 << 18
WINDOW_RANGES = 1 << 18
FEW_KEYS = 16  # _groups finds up to this many distinct keys a pass each, more by sorting
# Launching threads projected side by side, a core in four at most: NeMo's main and autograd threads each hold
# 30M ranges at 10M kernels, and the other sections, DuckDB and the launch join want the other cores.
MAX_PROJECTION_THREADS = 4


def _outside(thread: str) -> str:
    return f"(no NVTX range, {thread})"


def _place(seg_starts: np.ndarray, seg_ends: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Calls (starts, ends) among one thread's sorted segments: the segment each starts in (`known`,
    valid where the call starts in one), which calls lie strictly inside it, and which touch its
    edge (start or end where a range does)."""
    at = search_ordered(seg_starts, starts, side="right") - 1
    known = np.maximum(at, 0)
    strictly_inside = (at >= 0) & (starts > seg_starts[known]) & (ends < seg_ends[known])
    return known, strictly_inside, (at >= 0) & ~strictly_inside


@numba.njit(cache=True, nogil=True)
def _sweep(first, last, query_segment, query_need, enclosing):  # pragma: no cover (compiled)
    """For each query (sorted by segment k, each with a least last segment m), the ranges with
    first <= k and last >= m: those that contain a call starting in segment k and ending before
    bound m. Ranges come in push order (ascending priority), so a stack of the ranges that began
    holds them by priority, and the first one found from the top is the innermost. Ranges that
    ended (last < k) are dropped from the top as the sweep passes them, and before a range is pushed.
    `enclosing` False: the innermost one's position per query (-1: none); True: (query, range) pairs,
    all of them."""
    stack = np.empty(len(first), np.int64)
    top, pushed, found = 0, 0, 0
    innermost = np.full(len(query_segment), -1, np.int64)
    pairs = np.empty((0, 2), np.int64)
    for rounds in range(2 if enclosing else 1):
        top, pushed = 0, 0
        if rounds == 1:
            pairs = np.empty((found, 2), np.int64)
            found = 0
        for q in range(len(query_segment)):
            k = query_segment[q]
            while pushed < len(first) and first[pushed] <= k:
                # ranges that ended before this one begins contain no call from here on: off the top before it
                # is pushed, or, under it, they stay to be scanned by every query (a range that ends where a
                # call in the gap after it starts, last == k, is kept for that query: a call of no length there)
                while top > 0 and last[stack[top - 1]] < first[pushed]:
                    top -= 1
                stack[top] = pushed
                top += 1
                pushed += 1
            while top > 0 and last[stack[top - 1]] < k:
                top -= 1
            i = top - 1
            while i >= 0:
                if last[stack[i]] >= query_need[q]:
                    if not enclosing:
                        innermost[q] = stack[i]
                        break
                    if rounds == 1:
                        pairs[found, 0] = q
                        pairs[found, 1] = stack[i]
                    found += 1
                i -= 1
    return innermost, pairs


@numba.njit(cache=True, nogil=True)
def _distinct_in_place(values):  # pragma: no cover (compiled)
    """Each distinct value of the sorted `values` once, moved to their front; how many there are."""
    count = min(len(values), 1)
    for i in range(1, len(values)):
        if values[i] != values[count - 1]:
            values[count] = values[i]
            count += 1
    return count


class ThreadRanges:
    """One thread's NVTX ranges on its timeline cut at every start and end: segment k runs from
    bounds[k] to bounds[k+1] (the last to the end of time), and within one segment the same ranges
    are open. Range i (in push order: start ascending, then the longer and the later-listed first,
    so that later means more inner) is open in segments first[i] to last[i] - 1; `rows` say which range
    each is (positions in an NVTX table, or ThreadWindows' name codes), in that order."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, rows: np.ndarray, label_rank: np.ndarray):
        # np.unique hashes: several times slower on millions of times. Starts come sorted and ends nearly so:
        # timsort ("stable") merges those runs, 4-8x faster than quicksort on a NeMo capture's 3M ranges a thread
        times = np.empty(len(starts) + len(ends) + 1, np.int64)
        times[: len(starts)], times[len(starts) : -1] = starts, ends
        times[:-1].sort(kind="stable")  # in place: a thread of NeMo's emit_nvtx holds 33M ranges at 10M kernels
        # each distinct time once, then the end of time: bounds and each segment's end are views of it. Made in
        # place: a mask and np.compress's indices took 82 bytes a range at the peak, where this takes 48
        distinct = _distinct_in_place(times[:-1])
        times[distinct] = np.iinfo("int64").max
        edges = times[: distinct + 1].copy()
        del times
        self.bounds, self.seg_ends = edges[:-1], edges[1:]
        order = _push_order(starts, ends, label_rank)
        if order is not None:
            rows, starts, ends = rows[order], starts[order], ends[order]
        self.rows = rows
        # segment numbers as int32 (a thread would need 2^31 range edges): 60M ranges hold 0.5 GB less
        self.first = search_ordered(self.bounds, starts).astype(np.int32)
        self.last = search_ordered(self.bounds, ends).astype(np.int32)

    @classmethod
    def of(cls, ranges: pd.DataFrame) -> ThreadRanges:
        """From one thread's rows of an NVTX table (`rows`: positions in `ranges`)."""
        starts, ends = ranges["start"].to_numpy("int64"), ranges["end"].to_numpy("int64")
        return cls(starts, ends, np.arange(len(ranges)), _label_rank(ranges))

    def queries(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For calls (starts, ends): which start in a segment (`valid`), and for those the segment
        and the least `last` of a range that contains the call (the query _sweep answers)."""
        segment = search_ordered(self.bounds, starts, side="right") - 1
        valid = segment >= 0
        return valid, segment[valid], search_ordered(self.bounds, ends[valid])

    def _sweep(self, segment: np.ndarray, need: np.ndarray, enclosing: bool):
        """_sweep's answers and the order it took the queries in: None where they came sorted by segment (the
        projection's segments do), so that nothing as long as the queries is sorted or copied."""
        order = None if (segment[1:] >= segment[:-1]).all() else np.argsort(segment, kind="stable")
        if order is not None:
            segment, need = segment[order], need[order]
        innermost, pairs = _sweep(self.first, self.last, segment, need, enclosing)
        return order, innermost, pairs

    def innermost(self, segment: np.ndarray, need: np.ndarray) -> np.ndarray:
        """Per query, the innermost containing range's position in push order (-1: none)."""
        order, innermost, _ = self._sweep(segment, need, False)
        if order is None:
            return innermost
        result = np.empty(len(segment), np.int64)
        result[order] = innermost
        return result

    def enclosing(self, segment: np.ndarray, need: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(query, range in push order) for every range containing each query's call."""
        order, _, pairs = self._sweep(segment, need, True)
        return pairs[:, 0] if order is None else order[pairs[:, 0]], pairs[:, 1]


def _push_order(starts: np.ndarray, ends: np.ndarray, label_rank: np.ndarray) -> np.ndarray | None:
    """Positions in push order (start ascending, then end descending, then label rank descending), or None
    where the rows are in it already. The loader lists ranges by start, then end descending, then name:
    then only each run of identical (start, end) is out of order, and is reversed, without a sort."""
    if len(starts) < 2:
        return None
    same_start = starts[1:] == starts[:-1]
    listed = (
        (starts[1:] >= starts[:-1]).all()
        and (~same_start | (ends[1:] <= ends[:-1])).all()
        and (label_rank[1:] > label_rank[:-1]).all()
    )
    if not listed:
        return np.lexsort((-label_rank, -ends, starts))
    run_starts = np.flatnonzero(np.r_[True, ~same_start | (ends[1:] != ends[:-1])])
    if len(run_starts) == len(starts):
        return None
    run_ends = np.r_[run_starts[1:], len(starts)]
    return np.repeat(run_starts + run_ends - 1, run_ends - run_starts) - np.arange(len(starts))


def _groups(keys: np.ndarray):
    """(key, positions of its rows, ascending) for each distinct key, in key order. Positions are int32 where
    they fit: the NVTX windows keep them (60M ranges: 240 MB less). A few keys (threads) are found a pass
    each: a stable argsort of 30M keys took 1.1 s and 0.39 GB, two passes 0.2 s and 0.26 GB."""
    if not len(keys):
        return []
    kind = np.int32 if len(keys) < 2**31 else np.int64
    distinct = pd.unique(keys)
    if len(distinct) <= FEW_KEYS:
        return ((key, np.flatnonzero(keys == key).astype(kind)) for key in np.sort(distinct))
    order = np.argsort(keys, kind="stable")
    if kind is np.int32:
        order = order.astype(np.int32)
    ordered = keys[order]
    first = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    return zip(ordered[first], np.split(order, first[1:]), strict=True)


def _label_rank(nvtx: pd.DataFrame) -> np.ndarray:
    """Each row's rank among the table's index labels (ties between identical ranges go to the smaller label)."""
    if nvtx.index.is_monotonic_increasing:
        return np.arange(len(nvtx))
    rank = np.empty(len(nvtx), np.int64)
    rank[np.argsort(nvtx.index.to_numpy(), kind="stable")] = np.arange(len(nvtx))
    return rank


def range_names(events: EventStore) -> list:
    """The names that ThreadWindows' ranges stand for, by code: the store's NVTX names, and None (no name) last."""
    return [*events.nvtx_categories()[0], None]


class ThreadWindows:
    """One thread's NVTX ranges in the store, a window of time at a time: window w holds the ranges that start
    in [window_starts[w], window_starts[w + 1]) and those that began before and are still open at its first
    start. A call that starts in window w's time lies only in ranges of window w, so their ThreadRanges answer
    for it, and no more than a window's ranges are fetched and cut into segments at once (NeMo's emit_nvtx:
    60M ranges at 10M kernels). Windows are cut where about WINDOW_RANGES ranges have started (window_cuts).
    Not changed once made: each caller walks the windows with a walk() of its own (analyses run side by side)."""

    def __init__(self, events: EventStore, tid: int, window_starts: np.ndarray):
        self.events, self.tid, self.window_starts = events, tid, window_starts
        self.missing_name = len(events.nvtx_categories()[0])  # the code of a range without a name

    def window_of(self, times: np.ndarray) -> np.ndarray:
        """The window each time falls in (-1: before the thread's first range)."""
        return np.searchsorted(self.window_starts, times, side="right") - 1

    def fetch(self, window: int, to_end: bool = False) -> dict[str, np.ndarray]:
        """The ranges of `window` (`to_end`: and of every later one) in no order: start, end, the code of each
        name (range_names), style."""
        within = f'"end" >= {int(self.window_starts[window])}'
        if not to_end and window + 1 < len(self.window_starts):
            within += f" AND start < {int(self.window_starts[window + 1])}"
        return self.events.arrays(f"""
            SELECT start, "end", coalesce(name_id, {self.missing_name}) AS name, coalesce(style_id, -1) AS style
            FROM nvtx WHERE global_tid = {self.tid} AND {within}""")

    def walk(self) -> WindowWalk:
        return WindowWalk(self)


class WindowWalk:
    """One caller's way through a thread's windows: the last window's ThreadRanges (slices of the launch join
    meet in a window), and the window from which on the rest of the thread is one."""

    def __init__(self, thread: ThreadWindows):
        self.thread = thread
        self._last: tuple[int, ThreadRanges] | None = None
        self._tail: int | None = None  # see ranges

    def ranges(self, window: int, around: tuple[np.ndarray, np.ndarray] | None = None) -> ThreadRanges:
        """Window `window`'s ranges (0 <= window < len(window_starts)) as ThreadRanges whose `rows` are the
        ranges' name codes (range_names). `around`: calls' (starts, ends): only the ranges that contain one of
        them (a rule asks about a few calls in a window of a million ranges: cutting them all took 2 s a rule
        at 60M ranges)."""
        if self._tail is not None:
            window = min(window, self._tail)
            around = None if window == self._tail else around  # the rest of the thread: cut once, and kept
        if around is None and self._last is not None and self._last[0] == window:
            return self._last[1]
        rows = self.thread.fetch(window)
        carried = np.count_nonzero(rows["start"] < self.thread.window_starts[window])
        if carried > WINDOW_RANGES and window + 1 < len(self.thread.window_starts):
            # more ranges carried in than a window starts (ranges left open, ended at the capture's end): fetched
            # again for every window, they would be cut into segments again each time; the rest is one window
            self._tail, around = window, None
            rows = self.thread.fetch(window, to_end=True)
        if around is not None:  # the few kept are put in order, not the whole window
            keep = _containing_one(rows["start"], rows["end"], *around)
            rows = {column: values[keep] for column, values in rows.items()}
        order = _listed(rows)
        starts, ends, names = (rows[column][order] for column in ("start", "end", "name"))
        timeline = ThreadRanges(starts, ends, names, np.arange(len(starts)))
        if around is None:
            self._last = (window, timeline)
        return timeline


def _listed(rows: dict[str, np.ndarray]) -> np.ndarray:
    """The order the loaders list ranges in (NVTX_ORDER: start, then end descending, then name and style; what
    ThreadRanges' ties follow): a stable sort by start, which finds the store's runs of ranges in order, and
    the rest of the keys for the rows that share a start only (a sort of every key took 0.65 s at 12M ranges)."""
    order = np.argsort(rows["start"], kind="stable")
    starts = rows["start"][order]
    ties = np.flatnonzero(starts[1:] == starts[:-1])
    if len(ties):
        tied = np.zeros(len(order), dtype=bool)
        tied[ties], tied[ties + 1] = True, True
        at = np.flatnonzero(tied)
        rows_at = order[at]
        keys = (rows["style"][rows_at], rows["name"][rows_at], -rows["end"][rows_at], rows["start"][rows_at])
        order[at] = rows_at[np.lexsort(keys)]
    return order


def _containing_one(starts: np.ndarray, ends: np.ndarray, call_starts: np.ndarray, call_ends: np.ndarray) -> np.ndarray:
    """Which ranges (starts, ends) contain at least one of the calls (start <= the call's start, the call's end
    <= end): the calls that start in a range or after it, and the least end among them."""
    order = np.argsort(call_starts, kind="stable")
    least_end = np.minimum.accumulate(call_ends[order][::-1])[::-1]  # over the calls from each on, by start
    at = np.searchsorted(call_starts[order], starts, side="left")
    found = at < len(order)
    found[found] = least_end[at[found]] <= ends[found]
    return found


# window_cuts counts the starts of a thread by this many buckets of its time, to cut it into windows
WINDOW_BUCKETS = memory_budget.DUCKDB_GROUPS


def window_cuts(events: EventStore, tid: int, count: int, first: int, last: int) -> np.ndarray:
    """Where a thread's windows start (`count` ranges starting from `first` to `last`): a new window at the first
    bucket of its time (WINDOW_BUCKETS in all) at which more than WINDOW_RANGES ranges would have started in
    the window so far. A bucket in which more than that start makes a window of its own."""
    if count <= WINDOW_RANGES:
        return np.array([first], np.int64)
    shift = max((last - first).bit_length() - WINDOW_BUCKETS.bit_length() + 1, 0)
    buckets = events.arrays(f"""
        SELECT (start - {first}) >> {shift} AS bucket, count(*) AS n FROM nvtx_rows
        WHERE global_tid = {tid} GROUP BY bucket ORDER BY bucket""")
    cuts, held = [first], 0
    for bucket, n in zip(buckets["bucket"].tolist(), buckets["n"].tolist(), strict=True):
        if held and held + n > WINDOW_RANGES:
            cuts.append(first + (bucket << shift))
            held = 0
        held += n
    return np.array(cuts, np.int64)


_last_windows: list = []  # [(weakref to a store, WINDOW_RANGES, its windows)]: analyses ask again


def thread_windows(events: EventStore) -> dict[int, ThreadWindows]:
    """Each thread's ThreadWindows (global_tid -> ...), worked out once per store (and WINDOW_RANGES)."""
    if _last_windows and _last_windows[0][0]() is events and _last_windows[0][1] == WINDOW_RANGES:
        return _last_windows[0][2]
    threads = events.query(
        "SELECT global_tid, count(*) AS n, min(start) AS first, max(start) AS last FROM nvtx_rows GROUP BY global_tid"
    )
    windows = {
        int(t.global_tid): ThreadWindows(events, int(t.global_tid), window_cuts(events, *map(int, t)))
        for t in threads.sort_values("global_tid").itertuples(index=False)
    }
    _last_windows[:] = [(weakref.ref(events), WINDOW_RANGES, windows)]
    return windows


def _by_window(walk: WindowWalk, times: np.ndarray, ends: np.ndarray | None = None):
    """(window's ThreadRanges, positions in `times`) for each window that `times` fall in, in time order;
    (None, positions) for the times before the thread's first range, which are in no range. `ends`: the
    calls' ends, to take only the ranges that contain one of the calls (WindowWalk.ranges' `around`)."""
    for window, positions in _groups(walk.thread.window_of(times)):
        if window < 0:
            yield None, positions
            continue
        around = None if ends is None else (times[positions], ends[positions])
        yield walk.ranges(int(window), around), positions


def _calls_in_ranges(events: EventStore, calls: pd.DataFrame, enclosing: bool) -> tuple[np.ndarray, ...]:
    """(call, range name code, range start, range end) arrays, calls as positions in `calls`: every range that
    contains each call on its thread (`enclosing`), or the innermost one; in the calls' order."""
    windows = thread_windows(events)
    starts, ends = calls["start"].to_numpy("int64"), calls["end"].to_numpy("int64")
    found = [tuple(np.empty(0, np.int64) for _ in range(4))]
    for tid, thread_rows in (
        pd.Series(0, index=range(len(calls))).groupby(calls["global_tid"].to_numpy()).indices.items()
    ):
        thread = windows.get(int(tid))
        if thread is None:
            continue
        for timeline, positions in _by_window(thread.walk(), starts[thread_rows], ends[thread_rows]):
            if timeline is None:
                continue
            rows = thread_rows[positions]
            valid, segment, need = timeline.queries(starts[rows], ends[rows])
            rows = rows[valid]
            if enclosing:
                query, ranges = timeline.enclosing(segment, need)
                rows = rows[query]
            else:
                ranges = timeline.innermost(segment, need)
                rows, ranges = rows[ranges >= 0], ranges[ranges >= 0]
            bounds = timeline.bounds
            found.append((rows, timeline.rows[ranges], bounds[timeline.first[ranges]], bounds[timeline.last[ranges]]))
    found = [np.concatenate(parts) for parts in zip(*found, strict=True)]
    order = np.argsort(found[0], kind="stable")
    return tuple(values[order] for values in found)


def enclosing_ranges(events: EventStore, calls: pd.DataFrame) -> pd.DataFrame:
    """Every (call, range) pair where the range, on the call's thread, contains the call: `call` (index labels
    of `calls`) and the range's `name`, `start` and `end`."""
    call, codes, starts, ends = _calls_in_ranges(events, calls, enclosing=True)
    names = np.array(range_names(events), dtype=object)
    return pd.DataFrame({"call": calls.index.to_numpy()[call], "name": names[codes], "start": starts, "end": ends})


def innermost_ranges(events: EventStore, calls: pd.DataFrame) -> pd.Series:
    """For each call (by index label), the name of the innermost NVTX range containing it on its thread: the
    one that started last (the shorter one on a tie; None: a range without a name). Calls in no range are
    absent."""
    call, codes, _, _ = _calls_in_ranges(events, calls, enclosing=False)
    names = np.array(range_names(events), dtype=object)
    return pd.Series(names[codes], index=calls.index.to_numpy()[call], dtype=object).rename("name").rename_axis("call")


def innermost_range_codes(events: EventStore, starts: np.ndarray, ends: np.ndarray, tids: np.ndarray) -> np.ndarray:
    """For each interval [starts[i], ends[i]) on thread tids[i], the name code (range_names) of the innermost NVTX
    range containing it; -1 where none does."""
    calls = pd.DataFrame({"start": starts, "end": ends, "global_tid": tids})
    call, codes, _, _ = _calls_in_ranges(events, calls, enclosing=False)
    found = np.full(len(starts), -1, dtype="int64")
    found[call] = codes
    return found


class _RangeSums:
    """Kernels and their GPU time summed by range name as windows of launches pass: `exclusive` in the
    innermost range that holds a launch, `inclusive` in every range that does, `outside` per thread for
    launches in no range. Nothing is kept per launch, per segment or per range. Threads add to it side by
    side: each addition holds a lock, so that one set of sums serves them all (integer sums: the same in
    any order)."""

    def __init__(self, names: int):
        self.exclusive = np.zeros((2, names), "int64")  # kernels, GPU ns
        self.inclusive = np.zeros((2, names), "int64")
        self.outside: dict[int, list[int]] = {}
        self._lock = threading.Lock()

    def add_thread(self, thread: ThreadWindows | None, walk: WindowWalk | None, tid: int, starts, ends, durations):
        """One thread's launches of a slice (`thread`, `walk`: its ranges; None where it has none)."""
        if thread is None:
            self.add_outside(tid, len(starts), int(durations.sum()))
            return
        for timeline, at in _by_window(walk, starts):
            if timeline is None:  # before the thread's first range
                self.add_outside(tid, len(at), int(durations[at].sum()))
            else:
                self.add_window(tid, timeline, starts[at], ends[at], durations[at])

    def _add(self, into: np.ndarray, codes: np.ndarray, kernels: np.ndarray, gpu_ns: np.ndarray) -> None:
        with self._lock:
            np.add.at(into[0], codes, kernels)
            np.add.at(into[1], codes, gpu_ns)

    def add_outside(self, tid: int, kernels: int, gpu_ns: int) -> None:
        if kernels:
            with self._lock:
                held = self.outside.setdefault(tid, [0, 0])
                held[0], held[1] = held[0] + int(kernels), held[1] + int(gpu_ns)

    def add_window(self, tid: int, timeline: ThreadRanges, starts, ends, durations) -> None:
        """Launches (their calls' starts and ends, their kernels' durations) that start in one window
        (`timeline`: its ranges, `rows` their name codes). Calls strictly inside a segment are summed per
        segment; a segment's kernels go to its innermost open range, and to every range open in it (a range's
        inclusive sum: a difference of the running sums over the window's segments); calls on a segment's edge
        are placed exactly. Each call starts in a segment: the window's first range starts at or before it."""
        known, inside, on_edge = _place(timeline.bounds, timeline.seg_ends, starts, ends)
        used, kernels, gpu_ns = _sums_per_key(known[inside], np.ones(int(inside.sum()), "int64"), durations[inside])
        inner = timeline.innermost(used, used + 1)
        ranged = inner >= 0
        self._add(self.exclusive, timeline.rows[inner[ranged]], kernels[ranged], gpu_ns[ranged])
        self.add_outside(tid, int(kernels[~ranged].sum()), int(gpu_ns[~ranged].sum()))
        running_kernels, running_ns = np.r_[0, np.cumsum(kernels)], np.r_[0, np.cumsum(gpu_ns)]
        for i in range(0, len(timeline.rows), CHUNK_ROWS):  # a chunk of ranges at a time
            lo = search_ordered(used, timeline.first[i : i + CHUNK_ROWS])
            hi = search_ordered(used, timeline.last[i : i + CHUNK_ROWS])
            self._add(
                self.inclusive,
                timeline.rows[i : i + CHUNK_ROWS],
                running_kernels[hi] - running_kernels[lo],
                running_ns[hi] - running_ns[lo],
            )
        if on_edge.any():
            segment, need = known[on_edge], search_ordered(timeline.bounds, ends[on_edge])
            edge_ns, ones = durations[on_edge], np.ones(int(on_edge.sum()), "int64")
            inner = timeline.innermost(segment, need)
            ranged = inner >= 0
            self._add(self.exclusive, timeline.rows[inner[ranged]], ones[ranged], edge_ns[ranged])
            self.add_outside(tid, int((~ranged).sum()), int(edge_ns[~ranged].sum()))
            query, ranges = timeline.enclosing(segment, need)
            self._add(self.inclusive, timeline.rows[ranges], ones[query], edge_ns[query])


# A call's pid (24 bits) and correlation id, offset from its slice's first, as one int64 key.
_KEY_SHIFT = 38
_LAUNCH_COLUMNS = ("launch_tid", "launch_start", "launch_end", "start", "duration", "pid", "name_id", "short_name_id")


def launch_slices(events: EventStore):
    """Every kernel with the CUDA API call that launched it, as numpy arrays (_LAUNCH_COLUMNS), in
    slices of about SLICE_KERNELS kernels by correlation id: ids grow with time, so DuckDB skips the
    other slices' row groups, and one slice fits in memory. A kernel whose launch was not traced
    has launch_tid -1 and its own start as the launch's start and end; NULL pids and name ids are -1.

    Correlation ids are unique within a process, so kernels and calls are matched on (pid,
    correlation_id), as nsys's own scripts do: both sides of a slice are fetched as arrays and
    matched in numpy, through an array indexed by correlation id (one process) or by binary search
    (several). A DuckDB join of the same slices took 2-3x as long: fetching is cheap, the join's
    result is not. A slice whose calls repeat a key (a damaged export) is joined by DuckDB instead,
    duplicates and all."""
    count, low, high = events.query(
        "SELECT count(*) AS n, min(correlation_id) AS lo, max(correlation_id) AS hi FROM kernels"
    ).iloc[0]
    kernel_columns = """correlation_id, coalesce(global_pid, -1) AS global_pid, start, duration,
                        coalesce(name_id, -1) AS name_id, coalesce(short_name_id, -1) AS short_name_id"""
    if not pd.isna(low):
        step = (int(high) - int(low)) // -(-int(count) // SLICE_KERNELS) + 1
        for lo in range(int(low), int(high) + 1, step):
            within = f"correlation_id >= {lo} AND correlation_id < {lo + step}"
            kernels = _with_pid(events.arrays(f"SELECT {kernel_columns} FROM kernels WHERE {within}"))
            calls = events.arrays(f"""SELECT correlation_id, global_tid, start, "end" FROM cuda_api
                                      WHERE {within} AND global_tid IS NOT NULL""")
            joined = _matched(kernels, calls, lo, step)
            yield joined if joined is not None else _joined_by_duckdb(events, within)
    rest = events.arrays(f"SELECT {kernel_columns} FROM kernels WHERE correlation_id IS NULL")
    if len(rest["start"]):
        yield _unlaunched(_with_pid(rest))


def _one_ahead(items: Iterator) -> Iterator:
    """`items`, the next one fetched on a thread of its own while this one is used (DuckDB and numpy release
    the GIL): the launch join's fetches and matching overlap the windows' sums."""
    with ThreadPoolExecutor(1, thread_name_prefix="ahead") as fetching:
        following = fetching.submit(next, items, None)
        while (item := following.result()) is not None:
            following = fetching.submit(next, items, None)
            yield item


def _with_pid(kernels: dict) -> dict[str, np.ndarray]:
    """The kernels' pid from global_pid (as the kernels view computes it; -1 for none), name ids as int64."""
    global_pid = kernels.pop("global_pid")
    kernels["pid"] = np.where(global_pid >= 0, (global_pid >> 24) & 0xFFFFFF, -1)
    for column in ("name_id", "short_name_id"):
        kernels[column] = kernels[column].astype("int64", copy=False)
    return kernels


def _unlaunched(kernels: dict) -> dict[str, np.ndarray]:
    none = np.full(len(kernels["start"]), -1, dtype="int64")
    return {
        "launch_tid": none,
        "launch_start": kernels["start"],
        "launch_end": kernels["start"],
        **{c: kernels[c] for c in ("start", "duration", "pid", "name_id", "short_name_id")},
    }


def _matched(kernels: dict, calls: dict, lo: int, step: int) -> dict[str, np.ndarray] | None:
    """Each kernel of a slice with its call (launch_slices), or None where a call repeats a key."""
    joined = _unlaunched(kernels)
    if not len(calls["correlation_id"]):
        return joined
    call_pid = (calls["global_tid"] >> 24) & 0xFFFFFF
    offsets, kernel_offsets = calls["correlation_id"] - lo, kernels["correlation_id"] - lo
    pid = int(call_pid[0])
    if (call_pid == pid).all() and step <= 2 * len(offsets) + 1024:
        # one process: each call's row, at its correlation id
        row_of = np.full(step, -1, dtype="int64")
        row_of[offsets] = np.arange(len(offsets))
        if (row_of[offsets] != np.arange(len(offsets))).any():
            return None
        call = np.where(kernels["pid"] == pid, row_of[kernel_offsets], -1)
        found = call >= 0
    else:
        call_keys = (call_pid << _KEY_SHIFT) | offsets
        if (call_keys[1:] >= call_keys[:-1]).all():  # usually: ids grow with time, calls are stored in time order
            order, sorted_keys = np.arange(len(call_keys)), call_keys
        else:
            order = np.argsort(call_keys, kind="stable")
            sorted_keys = call_keys[order]
        if (sorted_keys[1:] == sorted_keys[:-1]).any() or step >= 1 << _KEY_SHIFT:
            return None
        kernel_keys = np.where(kernels["pid"] >= 0, (kernels["pid"] << _KEY_SHIFT) | kernel_offsets, -1)
        at = np.minimum(search_ordered(sorted_keys, kernel_keys), len(sorted_keys) - 1)
        found = sorted_keys[at] == kernel_keys
        call = order[at]
    if found.any():
        call = np.where(found, call, 0)
        joined["launch_tid"] = np.where(found, calls["global_tid"][call], -1)
        joined["launch_start"] = np.where(found, calls["start"][call], kernels["start"])
        joined["launch_end"] = np.where(found, calls["end"][call], kernels["start"])
    return joined


def _joined_by_duckdb(events: EventStore, within: str) -> dict[str, np.ndarray]:
    joined = events.arrays(f"""
        SELECT coalesce(a.global_tid, -1) AS launch_tid, coalesce(a.start, k.start) AS launch_start,
               coalesce(a."end", k.start) AS launch_end, k.start, k.duration, coalesce(k.pid, -1) AS pid,
               coalesce(k.name_id, -1) AS name_id, coalesce(k.short_name_id, -1) AS short_name_id
        FROM (SELECT * FROM kernels WHERE {within}) k
        LEFT JOIN (SELECT pid, correlation_id, global_tid, start, "end" FROM cuda_api WHERE {within}) a
          ON a.pid = k.pid AND a.correlation_id = k.correlation_id""")
    return {column: joined[column].astype("int64") for column in _LAUNCH_COLUMNS}


def _sums_per_key(key: np.ndarray, kernels: np.ndarray, gpu_ns: np.ndarray):
    """(each key once, ascending: a segment or a thread; its kernels; its GPU time), summed over the rows given.
    Keys come nearly sorted (launches in time order): a stable sort (timsort: near linear on such runs) and sums
    over runs of equal keys, where np.unique's quicksort and np.add.at made the projection's windows take 0.69 s
    at 10M kernels, not 0.16 s."""
    if not len(key):
        return key, kernels[:0], gpu_ns[:0]
    if not (key[1:] >= key[:-1]).all():
        order = np.argsort(key, kind="stable")
        key, kernels, gpu_ns = key[order], kernels[order], gpu_ns[order]
    runs = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    return key[runs], np.add.reduceat(kernels, runs), np.add.reduceat(gpu_ns, runs)


def gpu_time_by_range(events: EventStore, thread_labels: dict, also=None) -> pd.DataFrame:
    """Kernel time per NVTX range name. Kernels launched outside every range are listed per thread,
    so that backward kernels launched by an unannotated autograd thread show up as such.

    Kernels are joined to their launches a slice at a time (launch_slices); each thread's launches are
    summed window by window of its ranges (ThreadWindows, _RangeSums.add_window), so that neither the
    launches nor the whole timelines are held; a slice's threads side by side (MAX_PROJECTION_THREADS).
    `also`: another tally of the same join (accounting.LaunchSums), fed every slice as it passes
    (`also.add`) and closed at the end (`also.finish`), so that the kernels are joined to their launches
    once for both."""
    columns = ["range", "kernels", "gpu_ns", "gpu_pct", "inclusive_kernels", "inclusive_gpu_ns"]
    totals = events.query("SELECT count(*) AS n, coalesce(sum(duration), 0)::BIGINT AS ns FROM kernels").iloc[0]
    if not totals["n"]:
        if also is not None:
            also.finish()
        return pd.DataFrame(columns=columns)
    windows = thread_windows(events)
    walks = {tid: thread.walk() for tid, thread in windows.items()}
    names = range_names(events)
    sums = _RangeSums(len(names))
    workers = min(MAX_PROJECTION_THREADS, max(1, usable_cores() // 4))
    with ThreadPoolExecutor(workers, thread_name_prefix="projection") as projecting:
        for launches in _one_ahead(launch_slices(events)):
            if also is not None:
                also.add(launches)
            launched = launches["launch_tid"] >= 0
            tids, starts, ends, durations = (
                launches[c][launched] for c in ("launch_tid", "launch_start", "launch_end", "duration")
            )
            threads = [
                projecting.submit(
                    sums.add_thread,
                    windows.get(int(tid)),
                    walks.get(int(tid)),
                    int(tid),
                    starts[rows],
                    ends[rows],
                    durations[rows],
                )
                for tid, rows in _groups(tids)
            ]
            for thread in threads:  # a thread's walk goes one slice at a time
                thread.result()
    if also is not None:
        also.finish()

    def outside(tid) -> str:
        return _outside(thread_labels.get(tid, f"tid {int(tid) & 0xFFFFFF}"))

    def by_name(held: np.ndarray) -> list:
        return [(names[i], held[0, i], held[1, i]) for i in np.flatnonzero(held[0])]

    exclusive = by_name(sums.exclusive) + [(outside(tid), n, ns) for tid, (n, ns) in sorted(sums.outside.items())]
    exclusive = pd.DataFrame(exclusive, columns=["range", "kernels", "gpu_ns"]).groupby("range").sum()
    launched_n, launched_ns = int(exclusive["kernels"].sum()), int(exclusive["gpu_ns"].sum())
    if totals["n"] > launched_n:
        exclusive.loc[NOT_TRACED] = [int(totals["n"]) - launched_n, int(totals["ns"]) - launched_ns]
    inclusive = pd.DataFrame(by_name(sums.inclusive), columns=["range", "inclusive_kernels", "inclusive_gpu_ns"])
    inclusive = inclusive.groupby("range").sum()
    frame = exclusive.join(inclusive, how="outer").fillna(0).astype("int64").reset_index()
    frame = frame.rename(columns={"index": "range"})
    frame["gpu_pct"] = 100.0 * frame["gpu_ns"] / totals["ns"] if totals["ns"] else 0.0
    return frame[columns].sort_values(["gpu_ns", "inclusive_gpu_ns"], ascending=False).reset_index(drop=True)
