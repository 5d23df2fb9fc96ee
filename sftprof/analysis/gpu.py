"""GPU-side analyses: kernel, memory-operation and CUDA API summaries, busy time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis import intervals
from sftprof.analysis.stats import SQL_AGGREGATES, duration_summary, finish_summary
from sftprof.trace.events import KERNEL_SHAPE, EventStore, with_launch_shapes

# Kernels shorter than this take less time on the GPU than their launch takes on the CPU
# (cudaLaunchKernel costs ~5-10 µs): many of them in a row leave the GPU waiting for launches.
BUSY_WINDOW_ROWS = 2 << 20  # operations fetched at a time to merge into a device's busy time
BUSY_MAX_WINDOWS = 64  # per device: windows are cut at 1/64 quantiles, so larger traces get larger windows
TINY_KERNEL_NS = 10_000


def kernel_summary(events: EventStore) -> pd.DataFrame:
    """Kernel time by name, as `nsys stats -r gpukernsum` (2022.4 groups by name, grid and block)."""
    summary = events.query(f"""
        SELECT n.name AS kernel, s.* EXCLUDE (name_id)
        FROM (SELECT name_id, {", ".join(KERNEL_SHAPE)}, {SQL_AGGREGATES} FROM kernels GROUP BY ALL) s
        LEFT JOIN kernel_names n ON n.id = s.name_id""")
    return finish_summary(with_launch_shapes(summary), ["grid", "block", "kernel"])


def kernel_totals(events: EventStore) -> dict:
    """All kernels together: count, time, median duration, and how many are tiny (TINY_KERNEL_NS)."""
    row = events.query(f"""
        SELECT count(*) AS count, coalesce(sum(duration), 0)::BIGINT AS total_ns, median(duration) AS median_ns,
               count(*) FILTER (WHERE duration < {TINY_KERNEL_NS}) AS tiny
        FROM kernels""").iloc[0]
    return {"count": int(row["count"]), "total_ns": int(row["total_ns"]), "tiny": int(row["tiny"]),
            "median_ns": float(row["median_ns"]) if row["count"] else None}


def memop_summary(memops: pd.DataFrame) -> pd.DataFrame:
    """Memory-operation time by kind, as `nsys stats -r gpumemtimesum`."""
    return duration_summary(memops, ["operation"])


def cuda_api_summary(events: EventStore) -> pd.DataFrame:
    """CUDA API time by call, as `nsys stats -r cudaapisum`."""
    return finish_summary(events.query(f"""
        SELECT n.name, s.* EXCLUDE (name_id)
        FROM (SELECT name_id, {SQL_AGGREGATES} FROM cuda_api GROUP BY name_id) s
        JOIN api_names n ON n.id = s.name_id"""), ["name"])


@dataclass
class DeviceBusy:
    """When one GPU was running anything: `merged` is the union of its kernels and memory operations
    (sorted, disjoint start/end rows), from its `first` operation's start to its `last` one's end."""

    merged: pd.DataFrame
    first: int
    last: int


def busy_by_device(events: EventStore, memops: pd.DataFrame) -> dict[int, DeviceBusy]:
    """Per device, the union of every kernel and memory operation. Rows with start <= 0 are dropped,
    as nsys's utilisation rules do. Operations are fetched sorted, in windows of about BUSY_WINDOW_ROWS
    starts (edges at approximate quantiles), and merged a window at a time, so memory holds the
    merged intervals, not every kernel."""
    ops = memops.loc[memops["start"] > 0, ["device_id", "start", "end"]].astype("int64")
    operations = """(SELECT device_id::BIGINT AS device_id, start, "end" FROM kernels WHERE start > 0
                     UNION ALL SELECT device_id, start, "end" FROM ops)"""
    devices = events.query(f"""
        SELECT device_id, count(*) AS n, min(start) AS first, max(start) AS last,
               approx_quantile(start, [{", ".join(str(q / BUSY_MAX_WINDOWS) for q in range(1, BUSY_MAX_WINDOWS))}]) AS cuts
        FROM {operations} GROUP BY device_id ORDER BY device_id""", ops=ops)
    busy = {}
    for device, n, first, last, cuts in devices.itertuples(index=False):
        windows = min(-(-int(n) // BUSY_WINDOW_ROWS), BUSY_MAX_WINDOWS)
        inner = [cuts[k * BUSY_MAX_WINDOWS // windows - 1] for k in range(1, windows)]
        edges = np.unique(np.array([first, *inner, last + 1], dtype="int64"))
        merged = intervals.RunningUnion()
        for lo, hi in zip(edges[:-1], edges[1:]):
            window = events.arrays(f"""SELECT start, "end" FROM {operations}
                                       WHERE device_id = {int(device)} AND start >= {lo} AND start < {hi} ORDER BY start""",
                                   ops=ops)
            merged.add(window["start"], window["end"])
        frame = merged.result()
        busy[int(device)] = DeviceBusy(frame, int(first), int(frame["end"].iat[-1]))
    return busy


def all_devices_busy(busy: dict[int, DeviceBusy]) -> pd.DataFrame:
    """When any GPU was running anything (union over devices)."""
    if len(busy) <= 1:  # already a union: not another copy of ten million intervals
        return next(iter(busy.values())).merged if busy else intervals.RunningUnion().result()
    return intervals.union(pd.concat([b.merged for b in busy.values()], ignore_index=True))


def gpu_busy(busy: dict[int, DeviceBusy]) -> pd.DataFrame:
    """Per device: span from first to last GPU op, busy time (union over streams), busy %."""
    rows = []
    for device, b in busy.items():
        span = b.last - b.first
        busy_ns = int((b.merged["end"] - b.merged["start"]).sum())
        rows.append({"device_id": device, "span_ns": span, "busy_ns": busy_ns,
                     "busy_pct": 100.0 * busy_ns / span if span else 0.0})
    return pd.DataFrame(rows, columns=["device_id", "span_ns", "busy_ns", "busy_pct"])
