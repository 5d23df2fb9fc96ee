"""Interval arithmetic on [start, end) nanosecond intervals: unions, coverage of windows, gaps.

Overlapping work (kernels on several streams, a thread's nested calls) must be merged before
it is summed: busy time is the length of the union, not the sum of durations.
"""

from __future__ import annotations

import weakref

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

    def take_final(self) -> tuple[np.ndarray, np.ndarray]:
        """The merged intervals no later batch can extend, since the last call, handed over (a union
        made without `capacity`): what is kept is the open interval only."""
        starts, ends = self._starts, self._ends
        self._starts, self._ends = [], []
        return np.concatenate([*starts, _NO_TIMES]), np.concatenate([*ends, _NO_TIMES])

    def final(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The merged intervals no later batch can extend, starts and ends (None once in pieces)."""
        return None if isinstance(self._starts, list) else (self._starts[: self._size], self._ends[: self._size])

    @property
    def open_interval(self) -> tuple[int, int] | None:
        """The last merged interval (start, end), which the next batch may extend; None before any."""
        return self._open

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


KEEP_LENGTHS_FROM = 100_000  # intervals: covered_ns keeps the block sums of a merged frame this long
LENGTH_BLOCK = 16  # intervals per kept sum: 0.5 bytes an interval, where every cumulative length took 8
_last_lengths: list = []  # [(weakref to a merged frame, its columns' addresses, its block sums)]


def _block_prefix(merged: pd.DataFrame, interval_start: np.ndarray, interval_end: np.ndarray) -> np.ndarray:
    """prefix[k]: the length of intervals 0 .. k * LENGTH_BLOCK - 1; kept for the last frame asked about
    (analyses ask again about the same busy time, ten million intervals at 10M kernels), while its columns
    are the same arrays. Small frames are not kept."""
    key = (
        interval_start.__array_interface__["data"][0],
        interval_end.__array_interface__["data"][0],
        len(interval_start),
    )
    if _last_lengths and _last_lengths[0][0]() is merged and _last_lengths[0][1] == key:
        return _last_lengths[0][2]
    prefix = np.zeros(-(-len(interval_start) // LENGTH_BLOCK) + 1, dtype="int64")
    step = CHUNK_ROWS - CHUNK_ROWS % LENGTH_BLOCK  # whole blocks per chunk
    for i in range(0, len(interval_start), step):
        lengths = interval_end[i : i + step] - interval_start[i : i + step]
        first = i // LENGTH_BLOCK
        prefix[first + 1 : first + 1 + -(-len(lengths) // LENGTH_BLOCK)] = np.add.reduceat(
            lengths, np.arange(0, len(lengths), LENGTH_BLOCK)
        )
    np.cumsum(prefix, out=prefix)
    if len(interval_start) < KEEP_LENGTHS_FROM:  # they cost little, and a test may change a small frame in place
        return prefix
    try:
        _last_lengths[:] = [(weakref.ref(merged), key, prefix)]
    except TypeError:  # not a frame that can be referred to weakly: not kept
        pass
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


def covered_ns(merged: pd.DataFrame, starts, ends) -> np.ndarray:
    """For each window [starts[i], ends[i]), how much of it the disjoint sorted `merged` covers."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if merged.empty:
        return np.zeros(len(starts), dtype="int64")
    interval_start = merged["start"].to_numpy(dtype="int64")
    interval_end = merged["end"].to_numpy(dtype="int64")
    prefix = _block_prefix(merged, interval_start, interval_end)

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


class Union:
    """A union (sorted, disjoint start/end arrays) read by position, as PatchedUnion is: the interface the
    consumers that walk a union in windows use."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray):
        self.starts, self.ends = starts, ends

    def __len__(self) -> int:
        return len(self.starts)

    def ending_by(self, time: int) -> int:
        """How many intervals end at or before `time`."""
        return int(np.searchsorted(self.ends, time, side="right"))

    def starting_before(self, time: int) -> int:
        """How many intervals start before `time`."""
        return int(np.searchsorted(self.starts, time, side="left"))

    def rows(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """Intervals first to last - 1: starts, ends."""
        return self.starts[first:last], self.ends[first:last]

    def overlapping(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The intervals that overlap any window [starts[i], ends[i])."""
        keep = _positions_overlapping(self.starts, self.ends, starts, ends)
        return self.starts[keep], self.ends[keep]


def _positions_overlapping(union_starts, union_ends, starts, ends) -> np.ndarray:
    """Positions of a union's intervals that overlap any window [starts[i], ends[i]), ascending."""
    first = np.searchsorted(union_ends, starts, side="right")
    counts = np.maximum(np.searchsorted(union_starts, ends, side="left") - first, 0)
    return _distinct(np.sort(_ranges(first, counts), kind="stable"))  # windows may share an interval


def _ranges(first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """first[i], first[i] + 1, ... counts[i] numbers from each, one after another."""
    offsets = np.cumsum(counts) - counts
    return np.repeat(first - offsets, counts) + np.arange(int(counts.sum()))


def _distinct(ordered: np.ndarray) -> np.ndarray:
    """The distinct values of a sorted array (np.unique hashes: slower on millions)."""
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if len(ordered) else ordered


def _merged(starts, ends, other_starts, other_ends) -> tuple[np.ndarray, np.ndarray]:
    """Two sets of disjoint intervals, each in order and apart from the other's, as one in order."""
    at = np.searchsorted(starts, other_starts)
    return np.insert(starts, at, other_starts), np.insert(ends, at, other_ends)


class PatchedUnion(Union):
    """A union kept as the few places where it differs from a larger union that holds it (`base`): the
    base's intervals at positions `touched` (ascending) are replaced by the intervals inside them
    (`piece_starts`, `piece_ends`, in order; `owner`: the touched position each lies in). A device's
    kernels' union differs from the union of its kernels and memory operations only inside the
    intervals that hold a memory operation: a trainer's copies touch a few of its millions of
    intervals, so the kernels' union costs as many rows as the copies, not a second union (0.64 GB at
    40M kernels)."""

    def __init__(self, base: Union, touched, piece_starts, piece_ends, owner):
        super().__init__(base.starts, base.ends)  # the base's arrays, shared
        self.touched, self.piece_starts, self.piece_ends, self.owner = touched, piece_starts, piece_ends, owner

    def _before(self, position: int) -> int:
        """How many intervals lie in the base's intervals before `position`."""
        replaced = np.searchsorted(self.touched, position, side="left")
        return int(position - replaced + np.searchsorted(self.owner, position, side="left"))

    def _pieces(self, position: int) -> tuple[int, int]:
        return int(np.searchsorted(self.owner, position, side="left")), int(
            np.searchsorted(self.owner, position, side="right")
        )

    def _is_touched(self, position: int) -> bool:
        at = np.searchsorted(self.touched, position)
        return bool(at < len(self.touched) and self.touched[at] == position)

    def __len__(self) -> int:
        return self._before(len(self.starts))

    def ending_by(self, time: int) -> int:
        position = int(np.searchsorted(self.ends, time, side="right"))  # base intervals ended: all inside too
        count = self._before(position)
        if position < len(self.starts) and self._is_touched(position):
            a, b = self._pieces(position)
            count += int(np.searchsorted(self.piece_ends[a:b], time, side="right"))
        return count

    def starting_before(self, time: int) -> int:
        position = int(np.searchsorted(self.starts, time, side="left"))  # base intervals started before `time`
        if position and self._is_touched(position - 1):  # the last of them may hold pieces that start later
            a, b = self._pieces(position - 1)
            return self._before(position - 1) + int(np.searchsorted(self.piece_starts[a:b], time, side="left"))
        return self._before(position)

    def _expand(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The intervals inside the base's intervals at `positions` (ascending), in order."""
        at = np.minimum(np.searchsorted(self.touched, positions), max(len(self.touched) - 1, 0))
        touched = self.touched[at] == positions if len(self.touched) else np.zeros(len(positions), bool)
        first = np.searchsorted(self.owner, positions[touched], side="left")
        pieces = _ranges(first, np.searchsorted(self.owner, positions[touched], side="right") - first)
        return _merged(
            self.starts[positions[~touched]],
            self.ends[positions[~touched]],
            self.piece_starts[pieces],
            self.piece_ends[pieces],
        )

    def rows(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        if last <= first:
            return np.empty(0, "int64"), np.empty(0, "int64")
        # the base positions holding intervals first and last - 1, and what they hold: a slice of each array
        lo, hi = self._position_of(first), self._position_of(last - 1) + 1
        kept = np.ones(hi - lo, dtype=bool)
        kept[self.touched[np.searchsorted(self.touched, lo) : np.searchsorted(self.touched, hi)] - lo] = False
        a, b = int(np.searchsorted(self.owner, lo)), int(np.searchsorted(self.owner, hi))
        starts, ends = _merged(
            self.starts[lo:hi][kept], self.ends[lo:hi][kept], self.piece_starts[a:b], self.piece_ends[a:b]
        )
        skip = first - self._before(lo)
        return starts[skip : skip + last - first], ends[skip : skip + last - first]

    def _position_of(self, k: int) -> int:
        """The base position whose intervals hold interval k (binary search on _before)."""
        lo, hi = 0, len(self.starts)  # _before(lo) <= k < _before(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._before(mid) <= k:
                lo = mid
            else:
                hi = mid
        return lo

    def overlapping(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found_starts, found_ends = self._expand(_positions_overlapping(self.starts, self.ends, starts, ends))
        keep = _positions_overlapping(found_starts, found_ends, starts, ends)
        return found_starts[keep], found_ends[keep]


class RunningPatch:
    """A PatchedUnion made while both unions stream by (gpu.busy_unions): `base` is fed every batch
    first, then add() the inner union's share of it; an inner interval is kept once the base interval
    holding it is final, and only if that one holds one of the `marks` (sorted times). The inner union
    is never whole: at 40M kernels it was 0.64 GB while the pass ran."""

    def __init__(self, base: RunningUnion, marks: np.ndarray):
        self.base, self.marks = base, marks
        self.inner = RunningUnion()
        self.pending: list[tuple[np.ndarray, np.ndarray]] = []  # inner intervals whose base one is not final, in order
        self.kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # starts, ends, owner
        self.last_end = None

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self.inner.add(starts, ends)
        final = self.inner.take_final()
        if len(final[0]):
            self.pending.append(final)
        final, opened = self.base.final(), self.base.open_interval
        if final is not None and opened is not None:
            self._place(*final, opened[0])

    def _place(self, base_starts: np.ndarray, base_ends: np.ndarray, before: int) -> None:
        """Keep or drop the pending inner intervals that start before `before` (in final base intervals)."""
        ready = []
        while self.pending and self.pending[0][0][-1] < before:  # whole pieces first: no copy of the rest
            ready.append(self.pending.pop(0))
        if self.pending and self.pending[0][0][0] < before:
            starts, ends = self.pending[0]
            n = int(np.searchsorted(starts, before, side="left"))
            ready.append((starts[:n], ends[:n]))
            self.pending[0] = (starts[n:], ends[n:])
        if not ready:
            return
        starts, ends = (np.concatenate(part) for part in zip(*ready, strict=True))
        # the base intervals from the one holding the first of them that hold a mark (marks sorted: a slice)
        first_base = base_starts[np.searchsorted(base_starts, starts[0], side="right") - 1]
        marks = self.marks[np.searchsorted(self.marks, first_base) : np.searchsorted(self.marks, before)]
        touched = _distinct(np.searchsorted(base_starts, marks, side="right") - 1)
        first = np.searchsorted(starts, base_starts[touched], side="left")
        counts = np.searchsorted(starts, base_ends[touched], side="right") - first
        inside = _ranges(first, counts)
        self.kept.append((starts[inside], ends[inside], np.repeat(touched, counts)))

    def result(self, base: pd.DataFrame) -> PatchedUnion:
        """The patch, once `base` (the base's result()) is final."""
        opened = self.inner.open_interval
        if opened is not None:
            self.pending.append((np.array([opened[0]], "int64"), np.array([opened[1]], "int64")))
            self.last_end = int(opened[1])
        starts = base["start"].to_numpy()
        self._place(starts, base["end"].to_numpy(), np.iinfo("int64").max)
        parts = [np.concatenate(part) for part in zip(*self.kept, strict=True)] if self.kept else [_NO_TIMES] * 3
        touched = _distinct(np.searchsorted(starts, self.marks, side="right") - 1)
        return PatchedUnion(Union(starts, base["end"].to_numpy()), touched, *parts)
