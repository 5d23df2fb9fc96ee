"""Per-step accounting: where each training step's GPU time went, by phase, and what bounds the step.

For each step (cpu.training_steps: the loop's step ranges, or steps inferred from the GPU timeline):

GPU time by phase. A kernel belongs to the step and phase (cpu.PHASES: data, forward, backward,
optimizer) whose ranges were open on its launching thread when its launching CUDA call started
(launches are joined to kernels by correlation id, a slice of kernels at a time, and placed among
the thread's NVTX segments, nvtx's cut of each thread's timeline, by binary search). A kernel
launched by a thread that has no step ranges (PyTorch's pt_autograd_* threads run the backward pass
and carry no NVTX range) is placed by time on its process's training thread (the thread with the
step ranges): the ranges open there when it was launched; a kernel whose launch was not traced, by
its own start. Kernels inside a step but outside every phase range are `other`; inferred steps have no
ranges, so each kernel is placed by its own start, in `other`. So `kernel_ns`
(every kernel launched in the step, on any device) = data + forward + backward + optimizer + other,
by construction; a step's kernels may run after its range ends (the host runs ahead of the GPU).

Busy and idle time. Inside the step's wall-clock window, on ONE device: the one whose SMs were
busy longest in that step (`device_id`; a rank drives one GPU, and summing devices would count
parallel work twice):
  sm_busy_ns    union of kernel intervals (any stream)
  copy_busy_ns  union of memcpy/memset intervals (copy engines)
  copy_only_ns  copies running while no kernel runs
  idle_ns       neither; sm_busy_ns + copy_only_ns + idle_ns = duration
SM idle time (duration - sm_busy_ns) is split by cause:
  sm_idle_data_ns  inside the step thread's `data` ranges: the host was getting the next batch
  sm_idle_sync_ns  outside them, while a thread of the training process waited in a host-sync call
                   (cuda.host_wait_calls: the host could not launch), and the rest of every SM gap
                   that began during such a wait (the wait drained the GPU's queue, so it idles until
                   the host has launched again)
  sm_idle_host_ns  the rest: the host did not launch work fast enough (launch overhead, Python)
short_gap_idle_ns is the SM idle time in gaps shorter than SHORT_GAP_NS, and comm_exposed_ns the time
NCCL kernels ran with no other kernel beside them.

One class per step (BOUND_CLASSES), decided in this order, with the numbers in `evidence`:
  communication-bound  exposed NCCL time >= COMM_EXPOSED_PCT of the step
  compute-bound /      SMs busy >= GPU_BOUND_PCT of the step: the GPU's own work sets the pace, and the
  memory-bound kernels kernel mix of the step (by kernel family, kernels.py) says which: GEMM/attention
                       time against memory-bound families (MEMORY_BOUND_FAMILIES), the larger wins
  sync-bound /         otherwise the SMs idle most of the step, and the largest of the idle causes
  data-bound /         above names it
  launch/host-bound
A step with no GPU work on any device (a CPU capture) has no class.

Large traces (benchmarks/ENGINE.md): nothing is pulled whole into pandas. Two passes over the kernels,
as numpy arrays: by correlation-id slices joined to their launches (phases, kernel mix), and per
device by windows of start time (busy intervals, merged as they stream; each merged interval that no
later kernel can extend is summed into its steps and dropped). Memory holds one slice or window and
a few numbers per step. On a generated export of 10M kernels (benchmarks/generate_export.py, 7,098
steps) it took 3.4 s on the 2-core machine, 0.6 s at 1M.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sftprof.analysis import cpu, cuda, gpu, intervals, kernels, nvtx
from sftprof.analysis.findings import ms, pct
from sftprof.analysis.gpu import TINY_KERNEL_NS
from sftprof.analysis.spilled import SpilledUnion
from sftprof.analysis.utilisation import IDLE_GAP_NS
from sftprof.trace.events import EventStore, sql_in

# SMs busy at least this share of a step: the GPU's own work sets the step's pace, and at most a fifth
# of the step could be won by feeding it better. The line the capture-wide gpu_busy finding draws
# (analysis._gpu_findings warns below 80%: "the GPU waits on the CPU"). Below it, what the GPU waits
# for is named first: a 100 ms sleep per micro-batch in the data range of an 823M-parameter run
# (tests/fixtures/h200_sft_data_stall) leaves the SMs 58% busy, and that step is data-bound (1.5x
# slower than without the sleep), not bound by its kernels.
GPU_BOUND_PCT = 80.0
# NCCL kernels running alone for this share of a step: data-parallel training overlaps its gradient
# all-reduce with the backward pass, so exposed communication should be near zero; a fifth of the step
# spent waiting on the network outweighs what kernel tuning could win, and is named first.
COMM_EXPOSED_PCT = 20.0
# SM gaps shorter than this are launch latency between kernels, not stalls (utilisation.IDLE_GAP_NS:
# 1 ms of nothing is a stall); `short_gap_idle_ns` is the idle time in such gaps, the mark of a
# launch-bound step (many tiny kernels with gaps between them).
SHORT_GAP_NS = IDLE_GAP_NS
COMMUNICATION_MARKER = gpu.COMMUNICATION_MARKER  # kernels whose name holds it are collective communication

BOUND_CLASSES = (
    "compute-bound",
    "memory-bound kernels",
    "launch/host-bound",
    "data-bound",
    "sync-bound",
    "communication-bound",
)
OTHER_PHASE = "other"
PHASE_COLUMNS = [f"{phase}_gpu_ns" for phase in (*cpu.PHASES, OTHER_PHASE)]
MIX_CLASSES = ("compute", "memory", "communication", "other")  # kernel classes, by name
COMPUTE, MEMORY, COMMUNICATION, OTHER = range(len(MIX_CLASSES))
COLUMNS = [
    "step",
    "start",
    "end",
    "duration",
    "device_id",
    "kernels",
    "tiny_kernels",
    "kernel_ns",
    *PHASE_COLUMNS,
    "compute_kernel_ns",
    "memory_kernel_ns",
    "comm_kernel_ns",
    "sm_busy_ns",
    "copy_busy_ns",
    "copy_only_ns",
    "idle_ns",
    "sm_idle_sync_ns",
    "sm_idle_data_ns",
    "sm_idle_host_ns",
    "short_gap_idle_ns",
    "comm_exposed_ns",
    "sm_busy_pct",
    "idle_pct",
    "bound_class",
    "evidence",
]
_FAR = 2**62  # beyond any capture (events.MAX_TIME_NS is 2^53): the open ends of the first and last SM gap
_EMPTY = np.zeros(0, dtype="int64")


# ---------------------------------------------------------------- kernels: names, slices


def _mix_class(frame: pd.DataFrame) -> np.ndarray:
    """Each kernel name's MIX_CLASSES index: communication when the name holds COMMUNICATION_MARKER,
    else by family (kernels.kernel_families)."""
    families = kernels.kernel_families(frame)
    code = np.where(
        families.isin(kernels.COMPUTE_BOUND_FAMILIES),
        COMPUTE,
        np.where(families.isin(kernels.MEMORY_BOUND_FAMILIES), MEMORY, OTHER),
    )
    return np.where(gpu.is_communication(frame["name"], frame["short_name"]), COMMUNICATION, code).astype("int64")


def _name_classes(events: EventStore) -> pd.DataFrame:
    """(name_id, short_name_id) -> class, for the few dozen distinct kernel names (NULL ids as -1)."""
    names = events.used_names("kernels")
    return pd.DataFrame(
        {
            "name_id": names["name_id"].astype("int64"),
            "short_name_id": names["short_name_id"].astype("int64"),
            "cls": _mix_class(names) if len(names) else _EMPTY,
        }
    )


def _class_of(classes: pd.DataFrame, name_id: np.ndarray, short_name_id: np.ndarray) -> np.ndarray:
    """Each kernel's MIX_CLASSES index from its name ids (-1: NULL): looked up by name id where that
    alone decides the class (as a rule), else by binary search over the pairs in `classes`."""
    ids = classes["name_id"].to_numpy("int64")
    if len(ids) and ids.max() < 1 << 22 and not pd.Series(ids).duplicated().any():
        by_name = np.full(int(ids.max()) + 2, OTHER, dtype="int64")
        by_name[ids + 1] = classes["cls"].to_numpy("int64")
        known = (name_id >= -1) & (name_id + 1 < len(by_name))
        return np.where(known, by_name[np.where(known, name_id + 1, 0)], OTHER)
    keys = ((ids + 1) << 32) + classes["short_name_id"].to_numpy("int64") + 1
    order = np.argsort(keys)
    keys, cls = keys[order], classes["cls"].to_numpy("int64")[order]
    wanted = ((name_id + 1) << 32) + short_name_id + 1
    if not len(keys):
        return np.full(len(wanted), OTHER, dtype="int64")
    at = np.minimum(np.searchsorted(keys, wanted), len(keys) - 1)
    return np.where(keys[at] == wanted, cls[at], OTHER)


# ---------------------------------------------------------------- phases by launch


class _Timeline:
    """A training thread's NVTX timeline as nvtx cuts it into segments, with the step (row of the
    steps table, -1: none) and innermost phase (cpu.PHASES index, len(PHASES): none) open in each."""

    def __init__(self, seg_starts: np.ndarray, seg_step: np.ndarray, seg_phase: np.ndarray):
        self.seg_starts, self.seg_step, self.seg_phase = seg_starts, seg_step, seg_phase

    def place(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(step, phase) open at each time (ranges open at t: start <= t < end)."""
        at = intervals.search_ordered(self.seg_starts, times, side="right") - 1
        known = np.maximum(at, 0)
        return np.where(at >= 0, self.seg_step[known], -1), np.where(at >= 0, self.seg_phase[known], len(cpu.PHASES))


def _timelines(ranges: pd.DataFrame, step_rows: pd.Series) -> dict[int, _Timeline]:
    """Per thread with step ranges (global_tid), its _Timeline. `step_rows`: nvtx index label of each
    step range -> its row in the steps table. Only step and phase ranges cut the timeline (no other
    range changes which of them is open)."""
    phase_of = {name: i for i, name in enumerate(cpu.PHASES)}
    wanted = ranges[ranges["name"].isin(list(phase_of)) | ranges.index.isin(step_rows.index)]
    timelines = {}
    for tid in ranges.loc[step_rows.index, "global_tid"].unique():
        thread_ranges = wanted[wanted["global_tid"] == tid]
        thread = nvtx.ThreadRanges.of(thread_ranges)
        labels = thread_ranges.index[thread.rows]  # push order: outer before inner
        step = step_rows.reindex(labels).to_numpy()
        phase = thread_ranges["name"].map(phase_of).to_numpy()[thread.rows]
        seg_step = np.full(len(thread.bounds), -1, dtype="int64")
        seg_phase = np.full(len(thread.bounds), len(cpu.PHASES), dtype="int64")
        for i in np.flatnonzero(~pd.isna(step))[::-1]:  # the outermost step range where two are open
            seg_step[thread.first[i] : thread.last[i]] = step[i]
        for i in np.flatnonzero(~pd.isna(phase)):  # the innermost phase
            seg_phase[thread.first[i] : thread.last[i]] = phase[i]
        timelines[int(tid)] = _Timeline(thread.bounds, seg_step, seg_phase)
    return timelines


def _step_ranges(ranges: pd.DataFrame, steps: pd.DataFrame) -> pd.Series:
    """nvtx index label of each step range -> its row in `steps` (cpu.step_table's rows: the step ranges
    (cpu.step_ranges) with the same start and end; the first where two threads have one). Steps inferred
    from the GPU timeline match none."""
    step_ranges = cpu.step_ranges(ranges)
    rows = pd.Series(np.arange(len(steps)), index=pd.MultiIndex.from_arrays([steps["start"], steps["end"]]))
    rows = rows[~rows.index.duplicated()]
    found = (
        pd.Series(
            rows.reindex(pd.MultiIndex.from_arrays([step_ranges["start"], step_ranges["end"]])).to_numpy(),
            index=step_ranges.index,
        )
        .dropna()
        .astype("int64")
    )
    return found[~found.duplicated()]


class LaunchSums:
    """Per step: kernels, tiny kernels, kernel time by phase (n x PHASES+1) and by class (n x
    MIX_CLASSES), summed over the slices of the launch join (nvtx.launch_slices) as they pass: fed by
    step_accounting itself, or by nvtx.gpu_time_by_range (its `also`) so that one join serves both.
    Built from the NVTX ranges alone (the steps, each thread's timeline) and the kernel names. `marked`:
    cpu.marked_ranges(tables.events), where the caller has it; kept for step_accounting's data ranges."""

    def __init__(self, tables, marked: pd.DataFrame | None = None, steps: pd.DataFrame | None = None):
        self.marked = ranges = cpu.marked_ranges(tables.events) if marked is None else marked
        self.steps = (cpu.step_table(ranges) if steps is None else steps).reset_index(drop=True)
        self.n = n = len(self.steps)
        self.finished = False
        phases = len(cpu.PHASES) + 1
        self.kernels, self.tiny = np.zeros(n, "int64"), np.zeros(n, "int64")
        self.phase_ns, self.class_ns = np.zeros(n * phases, "int64"), np.zeros(n * len(MIX_CLASSES), "int64")
        self.thread_of_step = np.full(n, -1, dtype="int64")
        self.timelines: dict[int, _Timeline] = {}
        self.training_thread: dict[int, int] = {}
        if not n:
            return
        self.classes = _name_classes(tables.events)
        step_rows = _step_ranges(ranges, self.steps)
        if step_rows.empty:  # steps inferred from the GPU timeline: kernels placed by their own start
            return
        self.thread_of_step[step_rows.to_numpy()] = ranges.loc[step_rows.index, "global_tid"].to_numpy("int64")
        # each process's training thread: the one with the most steps (a rank has one)
        for tid in pd.Series(self.thread_of_step[self.thread_of_step >= 0]).value_counts().index:
            self.training_thread.setdefault(int(tid) >> 24 & 0xFFFFFF, int(tid))
        self.timelines = _timelines(ranges, step_rows)

    def add(self, k: dict[str, np.ndarray]) -> None:
        """One slice of nvtx.launch_slices."""
        launch_tid = k["launch_tid"]
        if not self.n or not len(launch_tid):
            return
        at = k["launch_start"]  # the kernel's own start where its launch was not traced
        # the thread whose ranges place the kernel: its launching thread when that one has steps,
        # else the training thread of its process
        placer = np.full(len(launch_tid), -1, dtype="int64")
        for tid in self.timelines:
            placer[launch_tid == tid] = tid
        unplaced = placer < 0
        if unplaced.any():
            process = np.where(launch_tid >= 0, (launch_tid >> 24) & 0xFFFFFF, k["pid"])
            for pid, tid in self.training_thread.items():  # a process without one: its kernels stay unplaced
                placer[unplaced & (process == pid)] = tid
        if not self.timelines:  # no step ranges: the step whose window the kernel starts in, no phase
            starts, ends = self.steps["start"].to_numpy("int64"), self.steps["end"].to_numpy("int64")
            step = np.searchsorted(starts, k["start"], side="right") - 1
            step = np.where((step >= 0) & (k["start"] < ends[np.maximum(step, 0)]), step, -1)
            phase = np.full(len(step), len(cpu.PHASES), dtype="int64")
        elif len(self.timelines) == 1 and (placer == next(iter(self.timelines))).all():  # one thread places all
            step, phase = next(iter(self.timelines.values())).place(at)
        else:
            step = np.full(len(placer), -1, dtype="int64")
            phase = np.full(len(placer), len(cpu.PHASES), dtype="int64")
            for tid, timeline in self.timelines.items():
                rows = placer == tid
                if rows.any():
                    step[rows], phase[rows] = timeline.place(at[rows])
        inside = np.flatnonzero(step >= 0)
        step, phase, duration = step[inside], phase[inside], k["duration"][inside]
        cls = _class_of(self.classes, k["name_id"][inside], k["short_name_id"][inside])
        n, phases = self.n, len(cpu.PHASES) + 1
        self.phase_ns += np.bincount(step * phases + phase, weights=duration, minlength=n * phases).astype("int64")
        self.class_ns += np.bincount(
            step * len(MIX_CLASSES) + cls, weights=duration, minlength=n * len(MIX_CLASSES)
        ).astype("int64")
        self.kernels += np.bincount(step, minlength=n)
        self.tiny += np.bincount(step[duration < TINY_KERNEL_NS], minlength=n)

    def finish(self) -> None:
        self.finished = True

    def run(self, events: EventStore) -> LaunchSums:
        """Fed by a join of its own, unless it was fed already."""
        if not self.finished:
            for k in nvtx.launch_slices(events):
                self.add(k)
            self.finish()
        return self


# ---------------------------------------------------------------- busy and idle time, streamed


def _frame(starts, ends) -> pd.DataFrame:
    return pd.DataFrame(
        {"start": np.asarray(starts, dtype="int64"), "end": np.asarray(ends, dtype="int64")}, copy=False
    )


def _intersect(merged: pd.DataFrame, starts, ends) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces of sorted disjoint `merged` inside each window [starts[i], ends[i]): (piece starts,
    piece ends, the window's index i), by binary search (intervals.overlaps)."""
    starts, ends = np.asarray(starts, dtype="int64"), np.asarray(ends, dtype="int64")
    if merged.empty or not len(starts):
        return _EMPTY, _EMPTY, _EMPTY
    piece_starts, piece_ends, _, window = intervals.overlaps(
        merged["start"].to_numpy("int64"), merged["end"].to_numpy("int64"), starts, ends
    )
    return piece_starts, piece_ends, window


class _Pieces:
    """Intervals cut to the steps' windows, each piece with its step's row: what is summed per step.
    Kept in order of start, with the latest end so far, so that a window of busy time meets only the
    pieces it can cover (_DeviceTime's batches each meet a few of the step thread's data ranges)."""

    def __init__(self, start: np.ndarray = _EMPTY, end: np.ndarray = _EMPTY, row: np.ndarray = _EMPTY):
        if len(start) and not (start[1:] >= start[:-1]).all():
            order = np.argsort(start, kind="stable")
            start, end, row = start[order], end[order], row[order]
        self.start, self.end, self.row = start, end, row
        self.reach = np.maximum.accumulate(end) if len(end) else end  # the latest end up to each piece

    @classmethod
    def cut(cls, merged: pd.DataFrame, steps_start: np.ndarray, steps_end: np.ndarray, rows=None) -> _Pieces:
        """`merged` (sorted disjoint) inside the windows of the steps `rows` (all steps by default)."""
        rows = np.arange(len(steps_start)) if rows is None else rows
        start, end, window = _intersect(merged, steps_start[rows], steps_end[rows])
        return cls(start, end, rows[window])

    @classmethod
    def joined(cls, parts: list[_Pieces]) -> _Pieces:
        if not parts:
            return cls()
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("start", "end", "row")))

    def per_step(self, values: np.ndarray, n: int) -> np.ndarray:
        return np.bincount(self.row, weights=values, minlength=n).astype("int64")

    def lengths(self, n: int) -> np.ndarray:
        """Per step, the pieces' total length."""
        return self.per_step(self.end - self.start, n)

    def covered(self, merged: pd.DataFrame, n: int) -> np.ndarray:
        """Per step, how much of its pieces `merged` (sorted disjoint) covers."""
        if not len(self.row) or merged.empty:
            return np.zeros(n, "int64")
        # only the pieces that reach into [first start, last end) of `merged`
        first = np.searchsorted(self.reach, merged["start"].iat[0], side="right")
        last = np.searchsorted(self.start, merged["end"].iat[-1], side="left")
        if first >= last:
            return np.zeros(n, "int64")
        near = slice(first, last)
        covered = intervals.covered_ns(merged, self.start[near], self.end[near])
        return np.bincount(self.row[near], weights=covered, minlength=n).astype("int64")


class _CopyTime:
    """One device's copy time (the union of its memory operations, spilled.SpilledUnion) inside the steps'
    windows: per step, its length, and how much of it a window of busy time covers, reading only the
    copies near that window (a trainer may set memory millions of times)."""

    def __init__(self, union: SpilledUnion, steps_start: np.ndarray, steps_end: np.ndarray):
        self.union, self.starts, self.ends = union, steps_start, steps_end

    def lengths(self, n: int) -> np.ndarray:
        """Per step, the copies' total length in it."""
        return self.union.covered_ns(self.starts, self.ends)

    def covered(self, merged: pd.DataFrame, n: int) -> np.ndarray:
        """Per step, how much of its copy time `merged` (sorted disjoint) covers."""
        if merged.empty or self.union.empty:
            return np.zeros(n, "int64")
        lo, hi = int(merged["start"].iat[0]), int(merged["end"].iat[-1])
        copy_starts, copy_ends = self.union.rows(self.union.ending_by(lo), self.union.starting_before(hi))
        both_starts, both_ends, _ = _intersect(merged, copy_starts, copy_ends)  # sorted and disjoint
        return intervals.covered_ns(_frame(both_starts, both_ends), self.starts, self.ends)


class _Settled:
    """The union of intervals arriving in start order, a window at a time: each window hands back the
    merged intervals that no later interval can extend (all but the last), so memory holds one window.
    The merge is intervals.RunningUnion's."""

    def __init__(self):
        self.open: tuple[int, int] | None = None

    def add(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.open is not None:
            starts, ends = np.r_[self.open[0], starts], np.r_[self.open[1], ends]
        if not len(starts):
            return _EMPTY, _EMPTY
        running_end = np.maximum.accumulate(ends)
        first = np.flatnonzero(np.r_[True, starts[1:] > running_end[:-1]])
        merged_starts, merged_ends = starts[first], running_end[np.r_[first[1:] - 1, len(starts) - 1]]
        self.open = (int(merged_starts[-1]), int(merged_ends[-1]))
        return merged_starts[:-1], merged_ends[:-1]

    def close(self) -> tuple[np.ndarray, np.ndarray]:
        if self.open is None:
            return _EMPTY, _EMPTY
        (start, end), self.open = self.open, None
        return np.array([start], dtype="int64"), np.array([end], dtype="int64")


class _DeviceTime:
    """Per-step sums over one device's settled busy intervals (kernel union), fed in time order: SM busy
    time, and, with `gaps`, the time its SM gaps were sync, short, and kernels overlapped copies or
    data ranges (`copies`: _CopyTime, `data`: _Pieces)."""

    def __init__(
        self,
        steps_start,
        steps_end,
        last_end: int,
        waited: SpilledUnion = None,
        copies: _CopyTime = None,
        data: _Pieces = None,
        gaps: bool = True,
    ):
        self.starts, self.ends, self.n = steps_start, steps_end, len(steps_start)
        self.waited, self.copies, self.data, self.gaps = waited, copies, data, gaps
        self.previous_end = last_end  # where the current SM gap began
        zeros = lambda: np.zeros(self.n, "int64")  # noqa: E731
        self.sm, self.sm_in_copies, self.sm_in_data = zeros(), zeros(), zeros()
        self.sync, self.sync_in_data, self.short = zeros(), zeros(), zeros()

    def add(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if not len(starts):
            return
        busy = _frame(starts, ends)
        self.sm += intervals.covered_ns(busy, self.starts, self.ends)
        if not self.gaps:
            return
        self.sm_in_copies += self.copies.covered(busy, self.n)
        self.sm_in_data += self.data.covered(busy, self.n)
        self._gaps(np.r_[self.previous_end, ends[:-1]], starts)
        self.previous_end = int(ends[-1])

    def close(self) -> None:
        if self.gaps:
            self._gaps(np.array([self.previous_end]), np.array([_FAR]))

    def _gaps(self, gap_starts: np.ndarray, gap_ends: np.ndarray) -> None:
        """Sum SM gaps (sorted, disjoint) into the steps: short ones, and the sync part (see the module
        docstring), found from the waits' side: a few waits, many gaps."""
        short = gap_ends - gap_starts < SHORT_GAP_NS
        self.short += intervals.covered_ns(_frame(gap_starts[short], gap_ends[short]), self.starts, self.ends)
        wait_starts, wait_ends = self.waited.rows(
            self.waited.ending_by(int(gap_starts[0])), self.waited.starting_before(int(gap_ends[-1]))
        )
        if not len(wait_starts):
            return
        # gaps that began during a wait, whole; and the part of every gap during a wait
        first = np.searchsorted(gap_starts, wait_starts, side="left")
        counts = np.searchsorted(gap_starts, wait_ends, side="left") - first
        drained = np.repeat(first, counts) + np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        during_starts, during_ends, _ = _intersect(_frame(gap_starts, gap_ends), wait_starts, wait_ends)
        synced = intervals.union(
            _frame(np.r_[gap_starts[drained], during_starts], np.r_[gap_ends[drained], during_ends])
        )
        self.sync += intervals.covered_ns(synced, self.starts, self.ends)
        self.sync_in_data += self.data.covered(synced, self.n)


def _union_windows(unions: gpu.BusyUnions, span: tuple[int, int]):
    """Per device whose kernels overlap `span`: the end of its last merged kernel interval before
    `span`, and lazily its merged kernel intervals that overlap `span` (gpu.busy_unions), a window
    of about gpu.BUSY_WINDOW_ROWS at a time, each with the union of its kernels but NCCL's cut at
    the same start times (None without NCCL kernels)."""
    lo, hi = span
    for device, busy in unions.kernels.items():
        union = busy.union
        first, last = union.ending_by(lo), union.starting_before(hi)
        if first >= last:
            continue
        own = unions.not_communication.get(device) if unions.not_communication is not None else None
        own = own.merged if own is not None else SpilledUnion().finish()
        own_first, own_last = own.ending_by(lo), own.starting_before(hi)

        def windows(
            union=union,
            first=first,
            last=last,
            own=own,
            own_first=own_first,
            own_last=own_last,
            nccl=unions.not_communication is not None,
        ):
            cuts = np.r_[first : last : gpu.BUSY_WINDOW_ROWS, last]
            own_cut = own_first
            for a, b in zip(cuts[:-1], cuts[1:], strict=True):
                starts, ends = union.rows(a, b)
                # the other union cut at the same start times: both merge in order, window by window
                next_cut = (
                    max(own_last, own_first)
                    if b == last
                    else int(np.clip(own.starting_before(union.rows(b, b + 1)[0][0]), own_first, own_last))
                )
                yield (starts, ends, *(own.rows(own_cut, next_cut) if nccl else (None, None)))
                own_cut = next_cut

        yield int(device), int(union.rows(first - 1, first)[1][0]) if first else -_FAR, windows()


def _busy_and_idle(
    result: pd.DataFrame,
    tables,
    sums: LaunchSums,
    waits: cuda.WaitCalls,
    unions: gpu.BusyUnions | None = None,
) -> None:
    """Fill the busy, idle and idle-cause columns of `result` (see the module docstring) from the LaunchSums of
    its steps. `unions`: gpu.busy_unions of the capture, when the caller has them (step_accounting's `busy`)."""
    classes, thread_of_step = sums.classes, sums.thread_of_step
    n = len(result)
    starts, ends = result["start"].to_numpy("int64"), result["end"].to_numpy("int64")
    no_copies = SpilledUnion().finish()
    # the step thread's data ranges inside its steps
    data_ranges = sums.marked[sums.marked["name"] == cpu.PHASES[0]]
    data = _Pieces.joined(
        [
            _Pieces.cut(intervals.union(ranges), starts, ends, np.flatnonzero(thread_of_step == tid))
            for tid, ranges in data_ranges.groupby("global_tid")
        ]
    )
    # waits of the training processes only: another process's sync does not stall this one
    pids = sorted({(int(tid) >> 24) & 0xFFFFFF for tid in thread_of_step if tid >= 0})
    events = tables.events
    # steps inferred from the GPU timeline have no thread: every process's waits
    waited = cuda.calls_union(events, f"{waits.where()} AND {sql_in('a.pid', pids)}" if pids else waits.where())
    copy_unions = gpu.memop_unions(events)
    nccl = bool((classes["cls"] == COMMUNICATION).any())
    measured: dict[int, _DeviceTime] = {}
    exposed: dict[int, np.ndarray] = {}
    span = (int(starts.min()), int(ends.max()))
    unions = unions if unions is not None else gpu.busy_unions(events, memops=False)
    for device, last_end, windows in _union_windows(unions, span):
        copies = _CopyTime(copy_unions.get(device, no_copies), starts, ends)
        time = _DeviceTime(starts, ends, last_end, waited, copies, data)
        settled = _Settled()
        without_nccl = (_DeviceTime(starts, ends, last_end, gaps=False), _Settled()) if nccl else None
        for window_starts, window_ends, own_starts, own_ends in windows:
            time.add(*settled.add(window_starts, window_ends))
            if without_nccl:
                without_nccl[0].add(*without_nccl[1].add(own_starts, own_ends))
        time.add(*settled.close())
        time.close()
        measured[device] = time
        if without_nccl:
            without_nccl[0].add(*without_nccl[1].close())
            exposed[device] = time.sm - without_nccl[0].sm
    for device, union in copy_unions.items():  # a device with copies and no kernels
        if device not in measured:
            time = _DeviceTime(starts, ends, -_FAR, waited, _CopyTime(union, starts, ends), data)
            time.close()
            measured[device] = time
    devices = sorted(measured)
    columns = {
        c: np.zeros(n, dtype="int64")
        for c in (
            "sm_busy_ns",
            "copy_busy_ns",
            "copy_only_ns",
            "comm_exposed_ns",
            "sm_idle_sync_ns",
            "sm_idle_data_ns",
            "short_gap_idle_ns",
        )
    }
    device_of = np.full(n, -1, dtype="int64")
    if devices:
        copy_busy = {d: measured[d].copies.lengths(n) for d in devices}
        # the busiest device per step: most SM time, then most copy time, then the lowest id
        order = np.lexsort(
            (-np.vstack([copy_busy[d] for d in devices]), -np.vstack([measured[d].sm for d in devices])), axis=0
        )[0]
        device_of = np.asarray(devices, dtype="int64")[order]
        data_ns = data.lengths(n)
        for device in devices:
            rows, time = device_of == device, measured[device]
            for column, values in (
                ("sm_busy_ns", time.sm),
                ("copy_busy_ns", copy_busy[device]),
                ("copy_only_ns", copy_busy[device] - time.sm_in_copies),
                ("comm_exposed_ns", exposed.get(device, np.zeros(n, "int64"))),
                ("sm_idle_data_ns", data_ns - time.sm_in_data),
                ("sm_idle_sync_ns", time.sync - time.sync_in_data),
                ("short_gap_idle_ns", time.short),
            ):
                columns[column][rows] = values[rows]
    for column, values in columns.items():
        result[column] = values
    result["device_id"] = pd.array([d if d >= 0 else pd.NA for d in device_of], dtype="Int64")
    result["idle_ns"] = result["duration"] - result["sm_busy_ns"] - result["copy_only_ns"]
    result["sm_idle_host_ns"] = (
        result["duration"] - result["sm_busy_ns"] - result["sm_idle_sync_ns"] - result["sm_idle_data_ns"]
    )


# ---------------------------------------------------------------- classes


def _classify(r: dict) -> tuple[str | None, str]:
    """One step's class and the numbers behind it (see the module docstring)."""
    duration = r["duration"]
    if pd.isna(r["device_id"]):
        return None, "no GPU work recorded"
    sm_idle = duration - r["sm_busy_ns"]
    busy = (
        f"SMs busy {pct(r['sm_busy_ns'], duration):.1f}% of the step ({ms(r['sm_busy_ns'], 2)} of "
        f"{ms(duration, 2)}, device {r['device_id']})"
    )
    idle = (
        f"SMs idle {pct(sm_idle, duration):.1f}% of the step ({ms(sm_idle, 2)}; {ms(r['copy_only_ns'], 2)} of it "
        f"copies only): {pct(r['sm_idle_data_ns'], sm_idle):.1f}% inside data ranges, "
        f"{pct(r['sm_idle_sync_ns'], sm_idle):.1f}% while or after the host waited in a sync call, "
        f"{pct(r['sm_idle_host_ns'], sm_idle):.1f}% while the host launched too slowly"
    )
    if pct(r["comm_exposed_ns"], duration) >= COMM_EXPOSED_PCT:
        return "communication-bound", (
            f"NCCL kernels ran with no other kernel beside them for "
            f"{pct(r['comm_exposed_ns'], duration):.1f}% of the step "
            f"({ms(r['comm_exposed_ns'], 2)}, >= {COMM_EXPOSED_PCT:.0f}%); {busy}"
        )
    if pct(r["sm_busy_ns"], duration) >= GPU_BOUND_PCT:
        math_ns, memory_ns = r["compute_kernel_ns"], r["memory_kernel_ns"]
        mix = (
            f"of the step's kernel time ({ms(r['kernel_ns'], 2)}), "
            f"GEMM/attention {pct(math_ns, r['kernel_ns']):.1f}%, "
            f"memory-bound families ({', '.join(kernels.MEMORY_BOUND_FAMILIES)}) "
            f"{pct(memory_ns, r['kernel_ns']):.1f}%"
        )
        verdict = "memory-bound kernels" if memory_ns > math_ns else "compute-bound"
        return verdict, f"{busy}, >= {GPU_BOUND_PCT:.0f}%; {mix}; {idle}"
    causes = {
        "data-bound": r["sm_idle_data_ns"],
        "sync-bound": r["sm_idle_sync_ns"],
        "launch/host-bound": r["sm_idle_host_ns"],
    }
    verdict = max(causes, key=lambda name: (causes[name], name == "launch/host-bound"))
    launches = (
        f"; {r['kernels']:,} kernels launched, {pct(r['tiny_kernels'], r['kernels']):.0f}% under "
        f"{TINY_KERNEL_NS / 1e3:.0f} µs; {pct(r['short_gap_idle_ns'], sm_idle):.1f}% of the idle time in "
        f"gaps under {SHORT_GAP_NS / 1e6:g} ms"
    )
    return verdict, f"{busy}, < {GPU_BOUND_PCT:.0f}%; {idle}{launches}"


def step_accounting(
    tables, waits: cuda.WaitCalls | None = None, launches: LaunchSums | None = None, busy: gpu.BusyUnions | None = None
) -> pd.DataFrame:
    """One row per training step (COLUMNS, see the module docstring): kernel time by phase, SM-busy,
    copy-only and idle time, the causes of SM idle time, a bound class and its evidence. Empty (with
    the columns) without step ranges. What the caller has already, so that it is not worked out
    twice: `waits`, cuda.host_wait_calls(tables.events); `launches`, a LaunchSums(tables) that
    nvtx.gpu_time_by_range fed (its `also`); `busy`, gpu.busy_unions(tables.events).

    Why: a capture-wide verdict averages a data stall in one step with compute in the next; per step,
    each cost is where it happened, and backward kernels launched from autograd threads are counted
    in `backward`, not outside every range."""
    sums = (launches if launches is not None else LaunchSums(tables)).run(tables.events)
    steps, n = sums.steps, sums.n
    if not n:
        return pd.DataFrame(columns=COLUMNS)
    result = steps[["step", "start", "end", "duration"]].copy()
    result["kernels"], result["tiny_kernels"] = sums.kernels, sums.tiny
    by_phase = sums.phase_ns.reshape(n, len(cpu.PHASES) + 1)
    for i, column in enumerate(PHASE_COLUMNS):
        result[column] = by_phase[:, i]
    result["kernel_ns"] = by_phase.sum(axis=1)
    by_class = sums.class_ns.reshape(n, len(MIX_CLASSES))
    for i, column in ((COMPUTE, "compute_kernel_ns"), (MEMORY, "memory_kernel_ns"), (COMMUNICATION, "comm_kernel_ns")):
        result[column] = by_class[:, i]
    _busy_and_idle(
        result,
        tables,
        sums,
        cuda.host_wait_calls(tables.events) if waits is None else waits,
        busy,
    )
    result["sm_busy_pct"] = 100.0 * result["sm_busy_ns"] / result["duration"].clip(lower=1)
    result["idle_pct"] = 100.0 * result["idle_ns"] / result["duration"].clip(lower=1)
    verdicts = [_classify(r) for r in result.to_dict("records")]
    result["bound_class"] = pd.Series([v for v, _ in verdicts], index=result.index, dtype="object")
    result["evidence"] = [e for _, e in verdicts]
    return result[COLUMNS]


def run_bound(accounting: pd.DataFrame) -> dict:
    """The run in one line: `bound_class`, the class that covers the most step time (steps weighted by
    their duration), each class's share of step time, and SM-busy, copy-busy and idle time as % of all
    steps' time (None without steps). Why: the class of the step a reader sees first need not be the
    run's; weighting by time keeps a few slow steps from being outvoted by many fast ones."""
    total = int(accounting["duration"].sum()) if len(accounting) else 0
    if not total:
        return {
            "bound_class": None,
            "class_pct": {},
            "sm_busy_pct": None,
            "copy_busy_pct": None,
            "idle_pct": None,
            "steps": 0,
        }
    by_class = accounting.dropna(subset=["bound_class"]).groupby("bound_class")["duration"].sum()
    by_class = by_class.sort_values(ascending=False, kind="stable")
    return {
        "bound_class": str(by_class.index[0]) if len(by_class) else None,
        "class_pct": {str(name): float(pct(ns, total)) for name, ns in by_class.items()},
        "sm_busy_pct": float(pct(accounting["sm_busy_ns"].sum(), total)),
        "copy_busy_pct": float(pct(accounting["copy_busy_ns"].sum(), total)),
        "idle_pct": float(pct(accounting["idle_ns"].sum(), total)),
        "steps": len(accounting),
    }


def accounted_steps(
    tables, waits: cuda.WaitCalls, launches: LaunchSums, busy: gpu.BusyUnions, nvtx_gpu: pd.DataFrame
) -> pd.DataFrame:
    """step_accounting once `nvtx_gpu` is done: nvtx.gpu_time_by_range fills `launches` as it joins kernels to
    their launches, one join for both."""
    return step_accounting(tables, waits, launches, busy)


def token_ns(step_costs: pd.DataFrame) -> float | None:
    """Work that grows with the tokens: every kernel of the step but the optimizer's (per parameter)."""
    if not len(step_costs):
        return None
    return float((step_costs["kernel_ns"] - step_costs[f"{cpu.PHASES[-1]}_gpu_ns"]).median())
