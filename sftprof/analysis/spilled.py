"""A union of intervals kept in files, not in memory: a device's busy time.

A GPU that runs kernels back to back has about as many busy intervals as kernels: 40M kernels made
a union of 0.64 GB, held whole while the analyses read it (benchmarks/ENGINE.md). The
union is written to two unlinked temporary files under $TMPDIR (starts, ends) as it is merged, and
read back by position a block at a time. Memory holds each block's first start and end, and the
length of the intervals before it: 24 bytes per BLOCK intervals. Every question the analyses ask
(how much of a window is covered, where a time falls, the gaps, a slice) is answered from those
and the few blocks it touches.
"""

from __future__ import annotations

import os
import tempfile
from collections import OrderedDict

import numpy as np
import pandas as pd

from sftprof.analysis import intervals

BLOCK = 1 << 13  # intervals per block: 64 KB of starts and ends read at a time
CACHED_BLOCKS = 64  # blocks kept after a read (8 MB): the questions come in time order, mostly
_INT64 = np.dtype("int64").itemsize
_NO_TIMES = np.zeros(0, "int64")


class SpilledUnion:
    """Sorted, disjoint [start, end) intervals, fed in start order by add() (merged as
    intervals.RunningUnion merges them), then read by position or time once finish() is called, from one
    thread at a time: the block cache is not locked (the sections that read busy time run on the main
    thread, none beside it: registry.Section.beside)."""

    def __init__(self, block: int = BLOCK):
        self.block = block
        self._merging = intervals.RunningUnion()
        self._files = tuple(tempfile.TemporaryFile(prefix="sftprof-busy-") for _ in range(2))  # starts, ends
        self._n = 0
        self._firsts: list[tuple[int, int, int]] = []  # per block: first start, first end, length before it
        self._length = 0  # of every interval written
        self._cache: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self.first_starts = self.first_ends = self.lengths_before = np.zeros(0, "int64")

    # ------------------------------------------------------------------ writing

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        self._merging.add(starts, ends)
        self._write(*self._merging.take_final())

    def finish(self) -> SpilledUnion:
        """Write the last interval; the union is read-only from here on."""
        self._write(*self._merging.take_final(last=True))
        self._merging = None
        for file in self._files:
            file.flush()
        firsts = np.array(self._firsts, dtype="int64").reshape(-1, 3)
        self.first_starts, self.first_ends, self.lengths_before = firsts[:, 0], firsts[:, 1], firsts[:, 2]
        return self

    def _write(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if not len(starts):
            return
        starts, ends = starts.astype("int64", copy=False), ends.astype("int64", copy=False)
        for file, values in zip(self._files, (starts, ends), strict=True):
            file.write(values.tobytes())
        lengths = ends - starts
        new = np.arange(-self._n % self.block, len(starts), self.block)  # positions that begin a block
        before = self._length + np.r_[0, np.cumsum(lengths)][new]
        self._firsts.extend(zip(starts[new].tolist(), ends[new].tolist(), before.tolist(), strict=True))
        self._n += len(starts)
        self._length += int(lengths.sum())

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return self._n

    @property
    def empty(self) -> bool:
        return self._n == 0

    def total_length(self) -> int:
        return self._length

    @property
    def first_start(self) -> int:
        """The first interval's start (the union must not be empty)."""
        return int(self.first_starts[0])

    @property
    def last_end(self) -> int:
        """The last interval's end (the union must not be empty)."""
        return int(self.rows(self._n - 1, self._n)[1][0])

    def rows(self, first: int, last: int) -> tuple[np.ndarray, np.ndarray]:
        """Intervals first to last - 1: starts, ends."""
        first, last = max(int(first), 0), min(int(last), self._n)
        if last <= first:
            return np.zeros(0, "int64"), np.zeros(0, "int64")
        return tuple(  # type: ignore[return-value]
            _read(file, first * _INT64, (last - first) * _INT64) for file in self._files
        )

    def chunks(self, size: int = intervals.CHUNK_ROWS):
        """(starts, ends) of every interval, `size` at a time, in order."""
        for first in range(0, self._n, size):
            yield self.rows(first, first + size)

    def _block(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Block k's starts, ends, and the length of the union's intervals before each of them."""
        cached = self._cache.get(k)
        if cached is not None:
            self._cache.move_to_end(k)
            return cached
        starts, ends = self.rows(k * self.block, (k + 1) * self.block)
        lengths = ends - starts
        before = self.lengths_before[k] + np.cumsum(lengths) - lengths
        self._cache[k] = cached = (starts, ends, before)
        if len(self._cache) > CACHED_BLOCKS:
            self._cache.popitem(last=False)
        return cached

    def _by_block(self, blocks: np.ndarray):
        """Each distinct block of `blocks` once, with the rows of `blocks` that name it."""
        if not len(blocks):
            return
        in_order = bool((blocks[1:] >= blocks[:-1]).all())  # times asked in order: nothing to sort
        order = np.arange(len(blocks)) if in_order else np.argsort(blocks, kind="stable")
        ordered = blocks if in_order else blocks[order]
        edges = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1], True])
        for a, b in zip(edges[:-1], edges[1:], strict=True):
            yield int(ordered[a]), order[a:b]

    def positions(self, times, column: str = "start", side: str = "left") -> np.ndarray:
        """np.searchsorted(column's values, times, side), the column read only in the blocks it needs."""
        times = np.asarray(times, dtype="int64")
        firsts = self.first_starts if column == "start" else self.first_ends
        index = 0 if column == "start" else 1
        blocks = np.searchsorted(firsts, times, side=side) - 1  # the block holding the answer; -1: before all
        found = np.zeros(len(times), dtype="int64")
        for k, rows in self._by_block(blocks):
            if k >= 0:
                found[rows] = k * self.block + np.searchsorted(self._block(k)[index], times[rows], side=side)
        return found

    def covering(self, times) -> np.ndarray:
        """Whether each time falls inside an interval: one block read per block named (GPU-metric samples
        taken while busy: 107M at 10M kernels)."""
        times = np.asarray(times, dtype="int64")
        inside = np.zeros(len(times), dtype=bool)
        # samples come in time order: searches that go on from the last answer
        for k, rows in self._by_block(intervals.search_ordered(self.first_starts, times, side="right") - 1):
            if k >= 0:  # the last interval of block k starting at or before each time
                starts, ends, _ = self._block(k)
                asked = times[rows]
                inside[rows] = asked < ends[intervals.search_ordered(starts, asked, side="right") - 1]
        return inside

    def at(self, positions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The starts and ends of the intervals at `positions` (each < len), and the length of all the
        intervals before each."""
        positions = np.asarray(positions, dtype="int64")
        out = [np.zeros(len(positions), dtype="int64") for _ in range(3)]
        for k, rows in self._by_block(positions // self.block):
            block = self._block(k)
            offsets = positions[rows] - k * self.block
            for column, values in zip(out, block, strict=True):
                column[rows] = values[offsets]
        return out[0], out[1], out[2]

    def covered_ns(self, starts, ends) -> np.ndarray:
        """For each window [starts[i], ends[i]), how much of it the union covers (intervals.covered_ns)."""
        return self._covered_before(np.asarray(ends, "int64")) - self._covered_before(np.asarray(starts, "int64"))

    def _covered_before(self, times: np.ndarray) -> np.ndarray:
        if self.empty:
            return np.zeros(len(times), dtype="int64")
        count = self.positions(times, "start", "right")  # all but the last of these lie wholly before t
        last_start, last_end, before = self.at(np.maximum(count - 1, 0))
        partial = np.clip(np.minimum(times, last_end) - last_start, 0, None)
        return np.where(count > 0, before + partial, 0)

    def overlapping(self, starts, ends) -> tuple[np.ndarray, np.ndarray]:
        """The intervals that overlap any window [starts[i], ends[i])."""
        first = self.positions(starts, "end", "right")
        counts = np.maximum(self.positions(ends, "start", "left") - first, 0)
        ordered = np.sort(intervals.position_ranges(first, counts), kind="stable")  # windows may share an interval
        found = intervals.distinct_sorted(ordered)
        found_starts, found_ends, _ = self.at(found)
        return found_starts, found_ends

    def ending_by(self, time: int) -> int:
        """How many intervals end at or before `time`."""
        return int(self.positions([time], "end", "right")[0])

    def starting_before(self, time: int) -> int:
        """How many intervals start before `time`."""
        return int(self.positions([time], "start", "left")[0])

    def holes(self):
        """(starts, ends) of the holes between consecutive intervals, in order, a chunk of intervals at a time."""
        previous_end = None
        for starts, ends in self.chunks():
            if previous_end is None:
                yield ends[:-1], starts[1:]
            else:
                yield np.r_[previous_end, ends[:-1]], starts
            previous_end = ends[-1]

    def gaps(self, min_ns: int = 0) -> pd.DataFrame:
        """The holes between the intervals longer than `min_ns`, longest first."""
        found_starts, found_ends = [], []
        for hole_starts, hole_ends in self.holes():
            longer = hole_ends - hole_starts > min_ns
            found_starts.append(hole_starts[longer])
            found_ends.append(hole_ends[longer])
        hole_starts = np.concatenate([*found_starts, _NO_TIMES])
        hole_ends = np.concatenate([*found_ends, _NO_TIMES])
        holes = pd.DataFrame({"start": hole_starts, "end": hole_ends, "duration": hole_ends - hole_starts})
        return holes.sort_values(["duration", "start"], ascending=[False, True]).reset_index(drop=True)

    def frame(self) -> pd.DataFrame:
        """Every interval as start/end rows: for small unions and tests."""
        starts, ends = self.rows(0, self._n)
        return pd.DataFrame({"start": starts, "end": ends})

    @classmethod
    def of(cls, merged: pd.DataFrame, block: int = BLOCK) -> SpilledUnion:
        """A union of sorted disjoint start/end rows."""
        union = cls(block)
        union.add(merged["start"].to_numpy("int64"), merged["end"].to_numpy("int64"))
        return union.finish()

    @classmethod
    def merged(cls, unions: list[SpilledUnion], rows: int = intervals.CHUNK_ROWS) -> SpilledUnion:
        """The union of several unions (each device's: when any GPU ran), merged a window of time at a
        time: the windows are cut where any of them begins a chunk of `rows`, so each brings at most that many of each."""
        if len(unions) == 1:
            return unions[0]
        result = cls()
        cuts = [u.at(np.arange(0, len(u), rows))[0] for u in unions]
        inner = np.unique(np.concatenate([_NO_TIMES, *cuts]))[1:]  # the first window starts at any time
        edges = np.r_[np.iinfo("int64").min, inner, np.iinfo("int64").max]
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            parts = [u.rows(u.starting_before(lo), u.starting_before(hi)) for u in unions]
            starts = np.concatenate([p[0] for p in parts])
            ends = np.concatenate([p[1] for p in parts])
            order = np.argsort(starts, kind="stable")
            result.add(starts[order], ends[order])
        return result.finish()


def _read(file, offset: int, size: int) -> np.ndarray:
    values = np.empty(size // _INT64, dtype="int64")
    if os.preadv(file.fileno(), [values], offset) != size:
        raise OSError(f"a busy-time file under {tempfile.gettempdir()} ends early")
    return values
