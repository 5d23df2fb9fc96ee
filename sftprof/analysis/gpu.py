"""GPU-side analyses: kernel, memory-operation and CUDA API summaries, busy time."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis import intervals
from sftprof.analysis.spilled import SpilledUnion
from sftprof.analysis.stats import finish_summary, grouped_medians, grouped_summary
from sftprof.trace.events import KERNEL_SHAPE, EventStore, with_launch_shapes

# Operations fetched at a time to merge into a device's busy time (1M: 0.2 GB less peak RSS than 2M
# at 10M kernels, with the launch join's slices beside it, and no slower).
BUSY_WINDOW_ROWS = 1 << 20
# Kernels shorter than this take less time on the GPU than their launch takes on the CPU
# (cudaLaunchKernel costs ~5-10 µs): many of them in a row leave the GPU waiting for launches.
TINY_KERNEL_NS = 10_000
TIMELINE_CHUNKS = 50  # equal windows of a device's active span in the utilisation timeline
COMMUNICATION_MARKER = "nccl"  # kernels whose name holds it are collective communication


def kernel_summary(events: EventStore) -> pd.DataFrame:
    """Kernel time by name, as `nsys stats -r gpukernsum` (2022.4 groups by name, grid and block)."""
    summary = events.query(
        "SELECT n.name AS kernel, s.* EXCLUDE (name_id) FROM s LEFT JOIN kernel_names n ON n.id = s.name_id",
        s=grouped_summary(events, "kernels", ["name_id", *KERNEL_SHAPE]),
    )
    return finish_summary(with_launch_shapes(summary), ["grid", "block", "kernel"])


def kernel_totals(events: EventStore) -> dict:
    """All kernels together: count, time, median duration, and how many are tiny (TINY_KERNEL_NS)."""
    row = events.query(f"""
        SELECT count(*) AS instances, coalesce(sum(duration), 0)::BIGINT AS total_ns, min(duration) AS min_ns,
               max(duration) AS max_ns, count(*) FILTER (WHERE duration < {TINY_KERNEL_NS}) AS tiny
        FROM kernels""")
    count = int(row["instances"].iat[0])
    return {
        "count": count,
        "total_ns": int(row["total_ns"].iat[0]),
        "tiny": int(row["tiny"].iat[0]),
        "median_ns": float(grouped_medians(events, "kernels", [], row)[0]) if count else None,
    }


def memop_summary(events: EventStore) -> pd.DataFrame:
    """Memory-operation time by kind, as `nsys stats -r gpumemtimesum`."""
    return finish_summary(grouped_summary(events, "memops", ["operation"]), ["operation"])


def cuda_api_summary(events: EventStore) -> pd.DataFrame:
    """CUDA API time by call, as `nsys stats -r cudaapisum`."""
    return finish_summary(
        events.query(
            "SELECT n.name, s.* EXCLUDE (name_id) FROM s JOIN api_names n ON n.id = s.name_id",
            s=grouped_summary(events, "cuda_api", ["name_id"]),
        ),
        ["name"],
    )


@dataclass
class DeviceBusy:
    """When one GPU was running anything: `merged` is the union of its kernels and memory operations
    (kept in files: spilled.SpilledUnion), from its `first` operation's start to its `last` one's end.
    `kernel_chunks`: its kernels counted as they streamed by (busy_unions), by the chunk of
    intervals.chunk_edges(first, last, TIMELINE_CHUNKS) each starts in: (all, shorter than
    TINY_KERNEL_NS); None where they were not."""

    merged: SpilledUnion
    first: int
    last: int
    kernel_chunks: tuple[np.ndarray, np.ndarray] | None = None


@dataclass
class KernelsBusy:
    """When one GPU ran kernels: their union (the operations' one where no memory operation ran), from its
    first kernel's start to its last end."""

    union: SpilledUnion
    first: int
    last: int


@dataclass
class BusyUnions:
    """What one pass over every kernel and memory operation gives, per device (busy_unions):
    `operations`, the union of both (busy_by_device); `kernels`, of kernels alone (when the SMs ran
    anything); `not_communication`, of kernels but the collectives' (COMMUNICATION_MARKER), only where
    some ran (None otherwise): the SMs busy with work of their own."""

    operations: dict[int, DeviceBusy]
    kernels: dict[int, KernelsBusy]
    not_communication: dict[int, DeviceBusy] | None


def is_communication(name: pd.Series, short_name: pd.Series) -> np.ndarray:
    """Which kernels (by name and short name, NA for none) are collective communication."""
    names = (short_name.fillna("").astype(str) + " " + name.fillna("").astype(str)).str.lower()
    return names.str.contains(COMMUNICATION_MARKER, regex=False).to_numpy(bool)


# A kernel's (name_id, short_name_id) pair as one number (NULL ids as -1): ids are INTEGER.
NAME_PAIR_SQL = "((coalesce(name_id, -1)::BIGINT + 1) << 32) + coalesce(short_name_id, -1) + 1"


def _communication_pairs(events: EventStore) -> list[int]:
    """NAME_PAIR_SQL of the communication kernels (a few distinct names, whatever the trace size)."""
    pairs = events.used_names("kernels")
    if pairs.empty:
        return []
    pairs = pairs[is_communication(pairs["name"], pairs["short_name"])]
    return [
        ((int(name) + 1) << 32) + int(short) + 1
        for name, short in zip(pairs["name_id"], pairs["short_name_id"], strict=True)
    ]


def device_windows(events: EventStore, source: str, rows: int | None = None, **frames: pd.DataFrame):
    """Per device of `source` (SQL rows with device_id, start and end), its rows cut into windows of
    about `rows` (BUSY_WINDOW_ROWS by default) starts (start_windows): yields (device, first start, last end,
    [(lo, hi), ...]), devices in order."""
    devices = events.query(
        f"""
        SELECT device_id, count(*) AS n, min(start) AS first, max(start) AS last, max("end") AS last_end
        FROM {source} GROUP BY device_id ORDER BY device_id""",
        **frames,
    )
    for device, n, first, last, last_end in devices.itertuples(index=False):
        device_rows = f"FROM {source} WHERE device_id IS NOT DISTINCT FROM {'NULL' if pd.isna(device) else int(device)}"
        windows = start_windows(events, device_rows, n, first, last, rows or BUSY_WINDOW_ROWS, **frames)
        yield device, int(first), int(last_end), windows


def start_windows(
    events: EventStore, selection: str, n: int, first: int, last: int, rows: int, **frames: pd.DataFrame
) -> list[tuple[int, int]]:
    """[lo, hi) windows of start time that cut the `n` rows of `selection` (SQL from FROM on; their starts
    `first` to `last`) into about `rows` each, edges at approximate quantiles, however many rows: so that
    memory holds a window."""
    windows = -(-int(n) // rows)
    inner = []
    if windows > 1:
        quantiles = ", ".join(str(k / windows) for k in range(1, windows))
        inner = events.query(f"SELECT approx_quantile(start, [{quantiles}]) AS cuts {selection}", **frames)
        inner = inner["cuts"].iat[0]
    edges = np.unique(np.array([first, *inner, last + 1], dtype="int64"))
    return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))


# The memory operations with a device (memop_unions); busy time (busy_unions) leaves out those with start <= 0 too.
MEMOPS_ON_DEVICES = "memops WHERE device_id IS NOT NULL"


def busy_unions(events: EventStore, kernels: bool = True, memops: bool = True) -> BusyUnions:
    """Per device, the union of every kernel and memory operation, of kernels alone and of
    kernels but the collectives (BusyUnions), in one pass. Rows with start <= 0 are dropped, as
    nsys's utilisation rules do. Operations are fetched in windows of start time (device_windows),
    sorted, and merged a window at a time into files (spilled.SpilledUnion), so memory holds a window.
    `kernels` False: the first union only (busy_by_device); `memops` False: kernels only. Without memory
    operations the first two are one."""
    communication = _communication_pairs(events) if kernels else []
    is_comm = f"{NAME_PAIR_SQL} IN ({', '.join(map(str, communication))})" if communication else "false"
    busy_ops = f"{MEMOPS_ON_DEVICES} AND start > 0"
    with_ops = memops and events.count(busy_ops) > 0
    ops = f'UNION ALL SELECT device_id::BIGINT, start, "end", false, false FROM {busy_ops}' if with_ops else ""
    operations = f"""(SELECT device_id::BIGINT AS device_id, start, "end", true AS kernel, {is_comm} AS comm
                      FROM kernels WHERE start > 0 {ops})"""
    split = kernels and with_ops  # the kernels' union is not the operations' one
    # kernels that start at or before 0 are counted in the timeline (utilisation_timeline), not merged here
    early = events.query("SELECT count(*) AS n FROM kernels WHERE start <= 0")["n"].iat[0]
    unions = BusyUnions({}, {}, {} if communication else None)
    for device, first, last, windows in device_windows(events, operations):
        chunk_starts, _ = intervals.chunk_edges(first, last, TIMELINE_CHUNKS)
        counted = np.zeros((2, TIMELINE_CHUNKS), dtype="int64")  # kernels, tiny kernels
        # every operation's union; the kernels' (where it is another); the kernels' but the collectives'
        merged = [SpilledUnion(), SpilledUnion() if split else None, SpilledUnion() if communication else None]
        first_kernel = None
        for lo, hi in windows:
            window = events.sorted_arrays(
                "start",
                f"""SELECT start, "end", kernel, comm FROM {operations}
                                                WHERE device_id = {int(device)} AND start >= {lo} AND start < {hi}""",
            )
            starts, ends = window["start"], window["end"]
            merged[0].add(starts, ends)
            comm = window["comm"]
            if with_ops:
                is_kernel = window["kernel"].astype(bool)
                starts, ends, comm = starts[is_kernel], ends[is_kernel], comm[is_kernel]
            # the chunk each kernel starts in: the last one starting at or before it (the first, if none)
            chunk = np.clip(np.searchsorted(chunk_starts, starts, side="right") - 1, 0, TIMELINE_CHUNKS - 1)
            counted[0] += np.bincount(chunk, minlength=TIMELINE_CHUNKS)
            counted[1] += np.bincount(chunk[ends - starts < TINY_KERNEL_NS], minlength=TIMELINE_CHUNKS)
            if not kernels:
                continue
            if split:
                merged[1].add(starts, ends)
            if first_kernel is None and len(starts):
                first_kernel = int(starts[0])
            if communication:
                own = ~comm.astype(bool)
                merged[2].add(starts[own], ends[own])
        every = merged[0].finish()
        end = every.last_end
        unions.operations[int(device)] = DeviceBusy(
            every, first, end, None if early or end != last else (counted[0], counted[1])
        )
        if first_kernel is None:
            continue
        kernel_union = merged[1].finish() if split else every
        unions.kernels[int(device)] = KernelsBusy(kernel_union, first_kernel, kernel_union.last_end)
        if communication:
            own_union = merged[2].finish()
            unions.not_communication[int(device)] = DeviceBusy(
                own_union,
                own_union.first_start if len(own_union) else first,
                own_union.last_end if len(own_union) else first,
            )
    return unions


def busy_by_device(events: EventStore) -> dict[int, DeviceBusy]:
    """Per device, the union of every kernel and memory operation (busy_unions' first)."""
    return busy_unions(events, kernels=False).operations


def memop_unions(events: EventStore) -> dict[int, SpilledUnion]:
    """Per device, the union of its memory operations, merged a window at a time (device_windows) into
    files (spilled.SpilledUnion): a trainer may set memory millions of times."""
    unions = {}
    for device, _, _, windows in device_windows(events, f"(SELECT * FROM {MEMOPS_ON_DEVICES})"):
        merged = SpilledUnion()
        for lo, hi in windows:
            window = events.sorted_arrays(
                "start",
                f"""SELECT start, "end" FROM {MEMOPS_ON_DEVICES}
                    AND device_id = {int(device)} AND start >= {lo} AND start < {hi}""",
            )
            merged.add(window["start"], window["end"])
        unions[int(device)] = merged.finish()
    return unions


def all_devices_busy(busy: dict[int, DeviceBusy]) -> SpilledUnion:
    """When any GPU was running anything (union over devices)."""
    return SpilledUnion.merged([b.merged for b in busy.values()]) if busy else SpilledUnion().finish()


def kernels_busy_in(busy: dict[int, KernelsBusy], starts: np.ndarray, ends: np.ndarray) -> pd.DataFrame:
    """When any GPU ran a kernel, within the windows [starts[i], ends[i]) (the merged kernel intervals
    of every device that overlap one, unioned over devices): a copy's time beside kernels, without
    the kernels' unions whole."""
    near = [pd.DataFrame({"start": s, "end": e}) for s, e in (b.union.overlapping(starts, ends) for b in busy.values())]
    if len(near) == 1:  # already a union
        return near[0]
    return intervals.union(pd.concat(near, ignore_index=True)) if near else intervals.RunningUnion().result()


def gpu_busy(busy: dict[int, DeviceBusy]) -> pd.DataFrame:
    """Per device: span from first to last GPU op, busy time (union over streams), busy %."""
    rows = []
    for device, b in busy.items():
        span = b.last - b.first
        busy_ns = b.merged.total_length()
        rows.append(
            {
                "device_id": device,
                "span_ns": span,
                "busy_ns": busy_ns,
                "busy_pct": 100.0 * busy_ns / span if span else 0.0,
            }
        )
    return pd.DataFrame(rows, columns=["device_id", "span_ns", "busy_ns", "busy_pct"])


def operations_busy(unions: BusyUnions) -> dict[int, DeviceBusy]:
    """Each device's union of kernels and memory operations: what busy time, gaps and the timeline read."""
    return unions.operations
