"""When the GPU works and when it waits: idle gaps, utilisation over time and per step, and what
the CPU threads were doing during the longest gaps.

Busy time is the union of kernels and memory operations over all streams of a device (see
intervals), measured between the device's first and last operation, as nsys's gpu_gaps and
gpu_time_util rules do. Unlike gpu_time_util, overlapping operations are not summed, so a chunk
is never more than 100% busy.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sftprof.analysis import gpu, intervals
from sftprof.analysis.cuda import calls_during
from sftprof.analysis.gpu import TINY_KERNEL_NS, DeviceBusy
from sftprof.trace.events import EventStore, sql_in

# A GPU idle for longer than this is a gap worth explaining. Kernels of a training step follow
# each other within microseconds, so 1 ms of nothing is a stall; nsys analyze's gpu_gaps uses
# 500 ms, tuned for whole-application traces, which would hide every in-step stall.
IDLE_GAP_NS = 1_000_000
UTILISATION_CHUNKS = gpu.TIMELINE_CHUNKS
LOW_UTILISATION_PCT = 50.0  # as nsys's gpu_time_util
GAPS_EXPLAINED = 5
CAUSES_PER_SOURCE = 5  # rows per gap and per kind of CPU activity


def idle_gaps(busy: dict[int, DeviceBusy], min_gap_ns: int = IDLE_GAP_NS) -> pd.DataFrame:
    """Stretches longer than `min_gap_ns` in which a device ran nothing, longest first."""
    columns = ["device_id", "start", "end", "duration"]
    frames = [b.merged.gaps(min_gap_ns).assign(device_id=device) for device, b in busy.items()]
    if not frames:
        return pd.DataFrame(columns=columns)
    gaps = pd.concat(frames, ignore_index=True)[columns]
    return gaps.sort_values(["duration", "start"], ascending=[False, True]).reset_index(drop=True)


def utilisation_timeline(
    events: EventStore, busy: dict[int, DeviceBusy], chunks: int = UTILISATION_CHUNKS
) -> pd.DataFrame:
    """Per device, its active span in `chunks` equal windows: busy %, and kernels started in each
    (all, and those shorter than TINY_KERNEL_NS): counted as gpu.busy_unions merged them where it
    did, else by a query."""
    columns = ["device_id", "chunk", "start", "end", "busy_pct", "kernels", "tiny_kernels"]
    frames = []
    for device, b in busy.items():
        starts, ends = intervals.chunk_edges(b.first, b.last, chunks)
        covered = b.merged.covered_ns(starts, ends)
        if b.kernel_chunks is not None and chunks == gpu.TIMELINE_CHUNKS:
            counts, tiny = b.kernel_chunks
        else:
            counts, tiny = _kernels_per_chunk(events, b, device, starts, chunks)
        frames.append(
            pd.DataFrame(
                {
                    "device_id": device,
                    "chunk": np.arange(chunks),
                    "start": starts,
                    "end": ends,
                    "busy_pct": 100.0 * covered / np.maximum(ends - starts, 1),
                    "kernels": counts,
                    "tiny_kernels": tiny,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def step_utilisation(steps: pd.DataFrame, busy_by_device: dict[int, DeviceBusy]) -> pd.DataFrame:
    """GPU busy time inside each training step's wall-clock window, per device."""
    columns = ["step", "device_id", "duration", "gpu_busy_ns", "gpu_busy_pct"]
    frames = []
    for device, b in busy_by_device.items():
        if steps.empty:
            break
        busy = b.merged.covered_ns(steps["start"], steps["end"])
        frames.append(
            pd.DataFrame(
                {
                    "step": steps["step"].to_numpy(),
                    "device_id": device,
                    "duration": steps["duration"].to_numpy(),
                    "gpu_busy_ns": busy,
                    "gpu_busy_pct": 100.0 * busy / np.maximum(steps["duration"].to_numpy(), 1),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)


def _during(frame: pd.DataFrame, windows: pd.DataFrame, threads) -> pd.DataFrame:
    """The rows of `threads` that overlap any of `windows`, found on the columns' arrays before any row
    is copied."""
    starts, ends = frame["start"].to_numpy(), frame["end"].to_numpy()
    near = np.zeros(len(frame), dtype=bool)
    for start, end in zip(windows["start"], windows["end"], strict=True):
        near |= (starts < end) & (ends > start)
    near = frame.iloc[np.flatnonzero(near)]
    return near[near["global_tid"].isin(threads)]


def _stored_during(frame_where, windows: pd.DataFrame, threads) -> pd.DataFrame:
    """_during for a table in the store (`frame_where`: its frame of the rows for which SQL holds): NeMo's
    emit_nvtx leaves 60M NVTX ranges at 10M kernels, and its data workers 4M OS-runtime calls."""
    if windows.empty or not len(threads):
        return frame_where("false")
    near = " OR ".join(
        f'(start < {int(end)} AND "end" > {int(start)})' for start, end in zip(windows["start"], windows["end"])
    )
    return frame_where(f"{sql_in('global_tid', threads)} AND ({near})")


def _overlapping(frame: pd.DataFrame, start: int, end: int) -> pd.DataFrame:
    inside = frame[(frame["start"] < end) & (frame["end"] > start)]
    return inside.assign(overlap_ns=intervals.overlap_ns(inside["start"], inside["end"], start, end))


def _leaf_ranges(ranges: pd.DataFrame) -> pd.DataFrame:
    """Of the ranges overlapping a window, those that contain no other one on the same thread:
    the innermost thing each thread was inside."""
    leaves = []
    for _, thread_ranges in ranges.groupby("global_tid"):
        starts, ends = thread_ranges["start"].to_numpy(), thread_ranges["end"].to_numpy()
        contains_other = [((starts >= s) & (ends <= e)).sum() > 1 for s, e in zip(starts, ends, strict=True)]
        leaves.append(thread_ranges[~np.array(contains_other)])
    return pd.concat(leaves) if leaves else ranges


# The source label of the time a thread spent in none of its traced calls: running its own code.
OWN_CODE = "own code (no traced call)"
UNNAMED_RANGE = "(unnamed range)"  # an NVTX range pushed with no message (text and textId NULL)


def gap_causes(gaps: pd.DataFrame, tables, feeders: dict, top: int = GAPS_EXPLAINED) -> pd.DataFrame:
    """For the `top` longest gaps, what each thread that feeds the GPU (`feeders`: global_tid ->
    label, the threads that make CUDA calls) was doing: its CUDA API calls, OS-runtime calls and
    innermost NVTX ranges overlapping the gap, and the part of the gap it spent in none of its
    traced calls (running its own code, e.g. Python), each with how much of the gap it covers."""
    columns = ["gap", "device_id", "gap_start", "gap_ns", "source", "thread", "name", "calls", "overlap_ns"]
    rows = []
    explained = gaps.head(top)
    cuda_calls = calls_during(tables.events, explained[["start", "end"]], feeders)
    sources = {
        "CUDA API": _during(cuda_calls, explained, feeders),
        "OS runtime": _stored_during(tables.events.osrt_frame, explained, feeders),
        "NVTX range": _stored_during(tables.events.nvtx_frame, explained, feeders),
    }
    for rank, gap in enumerate(explained.itertuples(), start=1):
        found = {source: _overlapping(frame, gap.start, gap.end) for source, frame in sources.items()}
        found["NVTX range"] = _leaf_ranges(found["NVTX range"])
        for source, inside in found.items():
            grouped = inside.groupby(["global_tid", "name"])["overlap_ns"].agg(calls="count", overlap_ns="sum")
            grouped = grouped.reset_index().sort_values("overlap_ns", ascending=False).head(CAUSES_PER_SOURCE)
            rows += [
                {
                    "source": source,
                    "global_tid": r.global_tid,
                    "name": r.name,
                    "calls": r.calls,
                    "overlap_ns": int(r.overlap_ns),
                    "gap": rank,
                    "gap_row": gap,
                }
                for r in grouped.itertuples()
            ]
        # each thread's calls and ranges in the gap found once, not a filter of every thread's per thread (5,000
        # threads feeding the GPU took 14 s)
        calls = pd.concat([found["CUDA API"], found["OS runtime"]])
        calls_of, leaves = dict(tuple(calls.groupby("global_tid"))), found["NVTX range"]
        ranges_of = dict(tuple(leaves.groupby("global_tid")))
        for tid in feeders:
            thread_calls = intervals.union(calls_of.get(tid, calls.iloc[:0]))
            in_calls = int(intervals.covered_ns(thread_calls, [gap.start], [gap.end])[0])
            ranges = ranges_of.get(tid, leaves.iloc[:0])
            if gap.duration - in_calls > 0:
                rows.append(
                    {
                        "source": OWN_CODE,
                        "global_tid": tid,
                        "gap": rank,
                        "gap_row": gap,
                        "calls": pd.NA,
                        "name": "/".join(ranges.sort_values("start")["name"].astype(object).fillna(UNNAMED_RANGE))
                        or "(no NVTX range)",
                        "overlap_ns": gap.duration - in_calls,
                    }
                )
    if not rows:
        return pd.DataFrame(columns=columns)
    frame = pd.DataFrame(rows)
    frame = frame.assign(
        device_id=frame["gap_row"].map(lambda g: g.device_id),
        gap_start=frame["gap_row"].map(lambda g: g.start),
        gap_ns=frame["gap_row"].map(lambda g: g.duration),
        thread=frame["global_tid"].map(feeders),
    )
    return frame[columns].sort_values(["gap", "overlap_ns"], ascending=[True, False]).reset_index(drop=True)


def _kernels_per_chunk(events, b, device, starts, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernels, and tiny kernels, starting in each chunk of one device's timeline."""
    # The chunk a kernel starts in: the last one starting at or before it (the first, if none).
    # Proportion gives it to within one of the rounded edges; the edges settle it.
    edges = "[" + ", ".join(map(str, starts)) + "]"
    guess = f"least(greatest((start - {b.first}) * {chunks} // {max(b.last - b.first, 1)}, 0), {chunks - 1})"
    counted = events.query(f"""
        SELECT CASE WHEN start < {edges}[c + 1] AND c > 0 THEN c - 1
                    WHEN c + 1 < {chunks} AND start >= {edges}[c + 2] THEN c + 1 ELSE c END AS chunk,
               count(*) AS kernels, count(*) FILTER (WHERE duration < {TINY_KERNEL_NS}) AS tiny
        FROM (SELECT start, duration, {guess}::BIGINT AS c FROM kernels WHERE device_id = {int(device)})
        GROUP BY ALL""")
    counts = np.bincount(counted["chunk"], weights=counted["kernels"], minlength=chunks).astype("int64")
    tiny = np.bincount(counted["chunk"], weights=counted["tiny"], minlength=chunks).astype("int64")
    return counts, tiny
