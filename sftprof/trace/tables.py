"""The normalized tables every analysis reads, whatever the trace came from.

Times are integer nanoseconds on the capture's timeline; `duration` = end - start.
Columns (a table with no rows still has them; a table the trace did not record stays empty):

threads     global_tid, pid, tid, thread_name, process_name
nvtx        start, end, duration, name, style ("PushPop"|"StartEnd"), global_tid, pid, tid
            (ranges only; an unterminated range ends at the capture's last timestamp)
osrt        start, end, duration, name, global_tid, pid, tid     (OS runtime calls)
cuda_api    start, end, duration, name, global_tid, pid, tid, correlation_id
            (name without the `_vNNNN` version suffix, as nsys stats strips it)
kernels     start, end, duration, name, short_name, mangled_name, device_id, stream_id, pid,
            correlation_id, grid, block    (grid/block formatted as nsys stats prints them)
memops      start, end, duration, operation ("[CUDA memcpy HtoD]"... or "[CUDA memset]", as the
            nsys version that wrote the file names them in gpumemtimesum), bytes, device_id,
            stream_id, pid, correlation_id,
            copy_kind ("HtoD", "DtoH", "DtoD", "PtoP", "HtoH", ... or "memset": the same whatever
            the naming), src_kind, dst_kind (memory kind: "Pageable", "Pinned", "Device", "Managed"...;
            a memset's memory is its dst_kind)
sync        start, end, duration, sync_type ("Event sync", "Stream wait sync", "Stream sync",
            "Context sync"...), device_id, stream_id, pid, correlation_id   (CUDA synchronization
            activity; correlation_id is the synchronizing API call's)
sched       start, cpu, is_sched_in (bool), global_tid, pid, tid   (a thread switched onto or off a
            CPU core: point events, from nsys --cpuctxsw)
gpu_metrics timestamp, device_id, metric, value   (sampled GPU counters, e.g. "SMs Active [Throughput %]")
gpus        device_id, name ("NVIDIA H200"), chip_name ("GH100"), sm_count, memory_bytes,
            memory_bandwidth_bytes_per_s, clock_hz, compute_capability ("9.0")   (the GPUs the
            capture saw, one row per device id: nsys's TARGET_INFO_GPU, Kineto's deviceProperties;
            what a source does not record is NA; empty for a CPU capture)

Rows whose times are missing, reversed (end < start) or beyond any capture (events.valid_times) are
left out by the loader and counted in `dropped_rows` (table -> rows), never turned into negative times.

kernels, cuda_api, sched, gpu_metrics, nvtx, osrt, memops and sync grow with the capture (tens of millions of rows),
so they live in an EventStore (DuckDB, names as ids: see events.py) that analyses query; the others are pandas.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import pandas as pd

from sftprof.trace.events import EventStore, valid_times

COLUMNS = {
    "threads": ["global_tid", "pid", "tid", "thread_name", "process_name"],
    "nvtx": ["start", "end", "duration", "name", "style", "global_tid", "pid", "tid"],
    "osrt": ["start", "end", "duration", "name", "global_tid", "pid", "tid"],
    "cuda_api": ["start", "end", "duration", "name", "global_tid", "pid", "tid", "correlation_id"],
    "kernels": [
        "start",
        "end",
        "duration",
        "name",
        "short_name",
        "mangled_name",
        "device_id",
        "stream_id",
        "pid",
        "correlation_id",
        "grid",
        "block",
    ],
    "memops": [
        "start",
        "end",
        "duration",
        "operation",
        "bytes",
        "device_id",
        "stream_id",
        "pid",
        "correlation_id",
        "copy_kind",
        "src_kind",
        "dst_kind",
    ],
    "sync": ["start", "end", "duration", "sync_type", "device_id", "stream_id", "pid", "correlation_id"],
    "sched": ["start", "cpu", "is_sched_in", "global_tid", "pid", "tid"],
    "gpu_metrics": ["timestamp", "device_id", "metric", "value"],
    "gpus": [
        "device_id",
        "name",
        "chip_name",
        "sm_count",
        "memory_bytes",
        "memory_bandwidth_bytes_per_s",
        "clock_hz",
        "compute_capability",
    ],
}
# gpus' integer columns (nullable: a source may not record one)
GPU_COUNTS = ("device_id", "sm_count", "memory_bytes", "memory_bandwidth_bytes_per_s", "clock_hz")


def empty(table: str) -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype="object") for column in COLUMNS[table]})


def gpu_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The gpus table from a loader's rows (any of its columns; values as the source gave them):
    counts as nullable integers (anything not a non-negative integer becomes NA), names as text, one
    row per device id (the first), rows without a device id left out."""
    frame = pd.DataFrame(
        {
            column: rows[column] if column in rows else pd.Series(pd.NA, index=rows.index, dtype="object")
            for column in COLUMNS["gpus"]
        }
    )
    for column in GPU_COUNTS:
        numbers = pd.to_numeric(frame[column], errors="coerce")
        whole = numbers.notna() & (numbers >= 0) & (numbers < 2**63) & (numbers == numbers.round())
        frame[column] = pd.array([int(v) if ok else pd.NA for v, ok in zip(numbers, whole)], dtype="Int64")
    for column in ("name", "chip_name", "compute_capability"):
        frame[column] = frame[column].map(lambda v: str(v) if isinstance(v, str) else None).astype("object")
    frame = frame[frame["device_id"].notna()].drop_duplicates("device_id")
    return frame.sort_values("device_id").reset_index(drop=True)


def count_dropped(dropped: dict[str, int], table: str, rows: int) -> None:
    """Count `rows` of `table` left out as damaged in `dropped` (TraceTables.dropped_rows), if any."""
    if rows:
        dropped[table] = dropped.get(table, 0) + rows


def valid_rows(frame: pd.DataFrame, table: str, dropped: dict[str, int]) -> pd.DataFrame:
    """`frame` (`table`'s rows as a loader read them) without the rows whose times are not valid
    (events.valid_times), counted in `dropped[table]`; times as int64, and `duration` computed here,
    from valid times only (on a reversed or huge pair, end - start is negative or overflows)."""
    times = [column for column in ("start", "end", "timestamp") if column in COLUMNS[table]]
    keep = valid_times(*(frame[column] for column in times))
    if not keep.all():
        count_dropped(dropped, table, int((~keep).sum()))
        frame = frame[keep].reset_index(drop=True)
    # int64 columns as they are: to_numeric copies (60M NVTX ranges: 1 GB while loading)
    frame = frame.assign(
        **{
            column: frame[column] if frame[column].dtype == np.int64 else pd.to_numeric(frame[column]).astype("int64")
            for column in times
        }
    )
    if "duration" in COLUMNS[table]:
        frame["duration"] = frame["end"] - frame["start"]
    return frame[COLUMNS[table]]


def _whole_table(table: str, what: str) -> property:
    """A read-only attribute: the event store's whole `table` as one DataFrame, names as text."""
    return property(
        lambda self: self.events.frame(table),
        doc=f"Every {what} as one DataFrame: for small traces and tests; analyses query `events`.",
    )


@dataclass
class TraceTables:
    """One capture, normalized. `sources` says which trace sources the capture had; `events` holds
    its kernels, CUDA API calls, GPU metric samples, context switches, NVTX ranges, OS-runtime calls, memory
    operations and synchronizations; `dropped_rows` counts, by table, the rows left out for their times
    (or, for a trace format whose rows can be malformed otherwise, their types); `empty_trace_kinds`
    names the trace kinds the capture says recorded nothing (kind -> the tool's own message);
    `capture_settings` holds the capture's own record of how it was taken (nsys 2024+'s META_DATA_CAPTURE:
    key -> its values, environment and command line left out), {} where the export has none."""

    source_path: str
    span_ns: int
    sources: set[str] = field(default_factory=set)
    threads: pd.DataFrame = field(default_factory=lambda: empty("threads"))
    gpus: pd.DataFrame = field(default_factory=lambda: empty("gpus"))
    events: EventStore = field(default_factory=EventStore.from_frames)
    dropped_rows: dict[str, int] = field(default_factory=dict)
    empty_trace_kinds: dict[str, str] = field(default_factory=dict)
    capture_settings: dict[str, tuple[str, ...]] = field(default_factory=dict)

    kernels = _whole_table("kernels", "kernel")
    memops = _whole_table("memops", "memory operation")
    sync = _whole_table("sync", "CUDA synchronization")
    osrt = _whole_table("osrt", "OS-runtime call")
    nvtx = _whole_table("nvtx", "NVTX range")
    cuda_api = _whole_table("cuda_api", "CUDA API call")
    sched = _whole_table("sched", "context switch")
    gpu_metrics = _whole_table("gpu_metrics", "GPU metric sample")

    def with_all_columns(self) -> TraceTables:
        """A copy in which every table has every documented column: a loader that does not know a
        column (another trace format, an older sftprof) leaves it missing, and analyses read it as NA."""
        frames = {}
        for f in fields(self):
            frame = getattr(self, f.name)
            if f.name in COLUMNS:
                missing = [c for c in COLUMNS[f.name] if c not in frame.columns]
                frame = frame.assign(**{c: pd.Series(pd.NA, index=frame.index, dtype="object") for c in missing})
            frames[f.name] = frame
        return TraceTables(**frames)
