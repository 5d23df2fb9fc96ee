"""NVTX ranges as the frame for the rest of the trace: the range a call was made in, and the GPU
time launched from each range.

A kernel belongs to the NVTX ranges, on the thread that launched it, that contain its launching
CUDA API call (start and end inside the range), the rule of nsys's nvtxkernsum/nvtxgpuproj.
`inclusive` counts it in every such range, as nvtxkernsum does; the plain columns count it once,
in the innermost range, so that they add up to the kernel time.
"""

from __future__ import annotations

import weakref

import numpy as np
import pandas as pd

from sftprof.trace.events import EventStore

NOT_TRACED = "(launching call not traced)"
SLICE_KERNELS = 1 << 19  # 0.5M: half the peak memory of the launch join at 1M, no slower at 10M kernels
LAUNCH_KEYS = ["global_tid", "segment", "start", "end"]


def _outside(thread: str) -> str:
    return f"(no NVTX range, {thread})"


def _place(seg_starts: np.ndarray, seg_ends: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Calls (starts, ends) among one thread's sorted segments: the segment each starts in (`known`,
    valid where the call starts in one), which calls lie strictly inside it, and which touch its
    edge (start or end where a range does)."""
    at = np.searchsorted(seg_starts, starts, side="right") - 1
    known = np.maximum(at, 0)
    strictly_inside = (at >= 0) & (starts > seg_starts[known]) & (ends < seg_ends[known])
    return known, strictly_inside, (at >= 0) & ~strictly_inside


def _placed_calls(nvtx: pd.DataFrame, calls: pd.DataFrame):
    """Per thread of `calls` that has ranges: the index labels of its calls that lie strictly inside
    a segment and those segments (arrays), and for its calls on a segment's edge (a call starting or
    ending where a range does), each one's enclosing ranges, innermost first (checked range by range)."""
    segments, _ = timeline_segments(nvtx)
    ranges_by_thread = dict(tuple(nvtx.groupby("global_tid")))
    for tid, thread_calls in calls.groupby("global_tid"):
        thread_segments = segments[segments["global_tid"] == tid]
        if thread_segments.empty:
            continue
        seg_starts, seg_ends = thread_segments["seg_start"].to_numpy(), thread_segments["seg_end"].to_numpy()
        starts, ends = thread_calls["start"].to_numpy(), thread_calls["end"].to_numpy()
        known, strictly_inside, on_edge = _place(seg_starts, seg_ends, starts, ends)
        ranges = ranges_by_thread[tid]
        edges = {}
        for label, start, end in zip(thread_calls.index[on_edge], starts[on_edge], ends[on_edge], strict=True):
            inside = ranges[(ranges["start"] <= start) & (ranges["end"] >= end)]
            edges[label] = sorted(inside.index, key=lambda lbl: (-inside.at[lbl, "start"], inside.at[lbl, "end"], lbl))
        yield thread_calls.index[strictly_inside], thread_segments["segment"].to_numpy()[known[strictly_inside]], edges


def enclosing_ranges(nvtx: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Every (call, range) pair where the range, on the call's thread, contains the call.
    `call` and `range` are index labels of `calls` and `nvtx`."""
    _, open_ranges = timeline_segments(nvtx)
    pairs = []
    for inside, segments, edges in _placed_calls(nvtx, calls):
        pairs += [
            (call, label) for call, segment in zip(inside, segments, strict=True) for label in open_ranges[segment]
        ]
        pairs += [(call, label) for call, labels in edges.items() for label in labels]
    return pd.DataFrame(pairs, columns=["call", "range"]).astype({"call": calls.index.dtype, "range": nvtx.index.dtype})


def innermost_ranges(nvtx: pd.DataFrame, calls: pd.DataFrame) -> pd.Series:
    """For each call (by index label), the index label of the innermost NVTX range containing it
    on its thread: the one that started last (the shorter one on a tie). Calls in no range are absent."""
    _, open_ranges = timeline_segments(nvtx)
    parts = [pd.Series(dtype=nvtx.index.dtype)]
    for inside, segments, edges in _placed_calls(nvtx, calls):
        first, after = open_ranges.offsets[segments], open_ranges.offsets[segments + 1]
        parts.append(pd.Series(open_ranges.labels[first[after > first]], index=inside[after > first]))
        parts.append(pd.Series({call: labels[0] for call, labels in edges.items() if labels}, dtype=nvtx.index.dtype))
    return pd.concat(parts).astype(nvtx.index.dtype).rename("range").rename_axis("call")


_last_segments: list = []  # [(weakref to an nvtx frame, its segments)]: rules ask again for the same frame


def timeline_segments(nvtx: pd.DataFrame) -> tuple[pd.DataFrame, _OpenRanges]:
    """`_cut_timelines`, worked out once per NVTX table (analyses do not modify their inputs)."""
    if _last_segments and _last_segments[0][0]() is nvtx:
        return _last_segments[0][1]
    result = _cut_timelines(nvtx)
    _last_segments[:] = [(weakref.ref(nvtx), result)]
    return result


class _OpenRanges:
    """segment -> index labels of the ranges open in it, innermost first (stored as one array and
    an offset per segment, not a list per segment)."""

    def __init__(self, labels: np.ndarray, offsets: np.ndarray):
        self.labels, self.offsets = labels, offsets

    def __getitem__(self, segment: int) -> list:
        return self.labels[self.offsets[segment] : self.offsets[segment + 1]].tolist()


def _cut_timelines(nvtx: pd.DataFrame) -> tuple[pd.DataFrame, _OpenRanges]:
    """Each thread's timeline cut at every start and end of its ranges. Within one segment the same
    ranges are open, so a call that lies strictly inside a segment is inside exactly the ranges that
    contain the segment. Returns (segments: global_tid, segment, seg_start, seg_end; the open
    ranges of each segment)."""
    parts, opened, first_segment = [], [], 0
    for tid, ranges in nvtx.groupby("global_tid", sort=True):
        starts, ends = ranges["start"].to_numpy("int64"), ranges["end"].to_numpy("int64")
        bounds = np.unique(np.r_[starts, ends])
        parts.append(
            pd.DataFrame(
                {
                    "global_tid": tid,
                    "segment": first_segment + np.arange(len(bounds)),
                    "seg_start": bounds,
                    "seg_end": np.r_[bounds[1:], np.iinfo("int64").max],
                }
            )
        )
        # A range (end > start) is open in the segments from the one its start opens to the one its
        # end opens: one (segment, range) row for each.
        positive = np.flatnonzero(ends > starts)
        first = np.searchsorted(bounds, starts[positive]) + first_segment
        spans = np.searchsorted(bounds, ends[positive]) + first_segment - first
        owner = np.repeat(positive, spans)
        segment = np.repeat(first, spans) + np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans)
        opened.append(
            pd.DataFrame({"segment": segment, "start": starts[owner], "end": ends[owner], "label": ranges.index[owner]})
        )
        first_segment += len(bounds)
    segments = (
        pd.concat(parts, ignore_index=True)
        if parts
        else pd.DataFrame(columns=["global_tid", "segment", "seg_start", "seg_end"])
    )
    pairs = (
        pd.concat(opened, ignore_index=True) if opened else pd.DataFrame(columns=["segment", "start", "end", "label"])
    )
    # innermost first: the range that started last, the shorter one on a tie (as innermost_ranges)
    pairs = pairs.sort_values(["segment", "start", "end", "label"], ascending=[True, False, True, True], kind="stable")
    offsets = np.r_[0, np.cumsum(np.bincount(pairs["segment"].to_numpy("int64"), minlength=len(segments)))]
    return segments.astype("int64"), _OpenRanges(pairs["label"].to_numpy(), offsets)


class _LaunchTally:
    """Kernels counted by where their launching call lies, over batches of launches: per segment
    for calls strictly inside one; per call span for the few on a segment's edge (placed exactly
    later); per thread for calls outside every segment (before the thread's first range, or on a
    thread without ranges). Memory holds counts per segment, not launches."""

    def __init__(self, segments: pd.DataFrame):
        self.segment_tids = segments["global_tid"].to_numpy()
        self.threads = {
            tid: (rows["seg_start"].to_numpy(), rows["seg_end"].to_numpy(), rows["segment"].to_numpy())
            for tid, rows in segments.groupby("global_tid")
        }
        self.kernels = np.zeros(len(segments), dtype="int64")  # by segment id (= row of `segments`)
        self.gpu_ns = np.zeros(len(segments), dtype="int64")
        self.edge_calls: list[pd.DataFrame] = []
        self.outside: list[pd.DataFrame] = []

    def add(self, tids: np.ndarray, starts: np.ndarray, ends: np.ndarray, durations: np.ndarray) -> None:
        placed = np.zeros(len(tids), dtype=bool)
        for tid, (seg_starts, seg_ends, seg_ids) in self.threads.items():
            rows = np.flatnonzero(tids == tid)
            known, inside, on_edge = _place(seg_starts, seg_ends, starts[rows], ends[rows])
            ids = seg_ids[known[inside]]
            self.kernels += np.bincount(ids, minlength=len(self.kernels))
            self.gpu_ns += np.bincount(ids, weights=durations[rows[inside]], minlength=len(self.gpu_ns)).astype("int64")
            edge_rows = rows[on_edge]
            self.edge_calls.append(
                pd.DataFrame(
                    {
                        "global_tid": tid,
                        "segment": seg_ids[known[on_edge]],
                        "start": starts[edge_rows],
                        "end": ends[edge_rows],
                        "kernels": 1,
                        "gpu_ns": durations[edge_rows],
                    }
                )
            )
            placed[rows[inside | on_edge]] = True
        threads, which = np.unique(tids[~placed], return_inverse=True)
        gpu_ns = np.bincount(which, weights=durations[~placed], minlength=len(threads)).astype("int64")
        self.outside.append(
            pd.DataFrame(
                {"global_tid": threads, "kernels": np.bincount(which, minlength=len(threads)), "gpu_ns": gpu_ns}
            )
        )

    def in_segments(self) -> pd.DataFrame:
        used = np.flatnonzero(self.kernels)
        return pd.DataFrame(
            {
                "global_tid": self.segment_tids[used],
                "segment": used,
                "kernels": self.kernels[used],
                "gpu_ns": self.gpu_ns[used],
            }
        )

    def on_edges(self) -> pd.DataFrame:
        calls = pd.concat(self.edge_calls or [pd.DataFrame(columns=LAUNCH_KEYS + ["kernels", "gpu_ns"], dtype="int64")])
        return calls.groupby(LAUNCH_KEYS, sort=False).sum().reset_index()

    def outside_segments(self) -> pd.DataFrame:
        rows = pd.concat(self.outside or [pd.DataFrame(columns=["global_tid", "kernels", "gpu_ns"], dtype="int64")])
        return rows.groupby("global_tid", sort=False).sum().reset_index()


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
        at = np.minimum(np.searchsorted(sorted_keys, kernel_keys), len(sorted_keys) - 1)
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


def gpu_time_by_range(nvtx: pd.DataFrame, events: EventStore, thread_labels: dict, also=None) -> pd.DataFrame:
    """Kernel time per NVTX range name. Kernels launched outside every range are listed per thread,
    so that backward kernels launched by an unannotated autograd thread show up as such.

    Kernels are joined to their launches a slice at a time (launch_slices); each launch is placed in
    its thread's segments by binary search, and calls that touch a segment's edge are placed
    exactly, one by one. `also`: another tally of the same join (accounting.LaunchSums), fed every
    slice as it passes (`also.add`) and closed at the end (`also.finish`), so that the kernels are
    joined to their launches once for both."""
    columns = ["range", "kernels", "gpu_ns", "gpu_pct", "inclusive_kernels", "inclusive_gpu_ns"]
    totals = events.query("SELECT count(*) AS n, coalesce(sum(duration), 0)::BIGINT AS ns FROM kernels").iloc[0]
    if not totals["n"]:
        if also is not None:
            also.finish()
        return pd.DataFrame(columns=columns)
    segments, open_ranges = timeline_segments(nvtx)
    tally = _LaunchTally(segments)
    for launches in launch_slices(events):
        if also is not None:
            also.add(launches)
        launched = launches["launch_tid"] >= 0
        tally.add(*(launches[c][launched] for c in ("launch_tid", "launch_start", "launch_end", "duration")))
    if also is not None:
        also.finish()

    def outside(tid) -> str:
        return _outside(thread_labels.get(tid, f"tid {int(tid) & 0xFFFFFF}"))

    name_of = nvtx["name"].to_dict()
    exclusive, inclusive = [], []
    for tid, segment, kernels, gpu_ns in tally.in_segments().itertuples(index=False):
        names = [name_of[label] for label in open_ranges[segment]]
        exclusive.append((names[0] if names else outside(tid), kernels, gpu_ns))
        inclusive += [(name, kernels, gpu_ns) for name in names]
    exclusive += [
        (outside(tid), kernels, gpu_ns) for tid, kernels, gpu_ns in tally.outside_segments().itertuples(index=False)
    ]
    calls = tally.on_edges()
    if len(calls):
        innermost = innermost_ranges(nvtx, calls)
        for label, call in calls.iterrows():
            name = nvtx.at[innermost[label], "name"] if label in innermost.index else outside(call["global_tid"])
            exclusive.append((name, call["kernels"], call["gpu_ns"]))
        pairs = enclosing_ranges(nvtx, calls)
        inclusive += [
            (nvtx.at[r, "name"], calls.at[c, "kernels"], calls.at[c, "gpu_ns"])
            for c, r in zip(pairs["call"], pairs["range"], strict=True)
        ]
    exclusive = pd.DataFrame(exclusive, columns=["range", "kernels", "gpu_ns"]).groupby("range").sum()
    launched_n, launched_ns = int(exclusive["kernels"].sum()), int(exclusive["gpu_ns"].sum())
    if totals["n"] > launched_n:
        exclusive.loc[NOT_TRACED] = [int(totals["n"]) - launched_n, int(totals["ns"]) - launched_ns]
    inclusive = pd.DataFrame(inclusive, columns=["range", "inclusive_kernels", "inclusive_gpu_ns"])
    inclusive = inclusive.groupby("range").sum()
    frame = exclusive.join(inclusive, how="outer").fillna(0).astype("int64").reset_index()
    frame = frame.rename(columns={"index": "range"})
    frame["gpu_pct"] = 100.0 * frame["gpu_ns"] / totals["ns"] if totals["ns"] else 0.0
    return frame[columns].sort_values(["gpu_ns", "inclusive_gpu_ns"], ascending=False).reset_index(drop=True)
