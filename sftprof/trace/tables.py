"""The normalized tables every analysis reads, whatever the trace came from.

Times are integer nanoseconds on the capture's timeline; `duration` = end - start.
Columns (a table with no rows still has them):

threads   global_tid, pid, tid, thread_name, process_name
nvtx      start, end, duration, name, style ("PushPop"|"StartEnd"), global_tid, pid, tid
          (ranges only; an unterminated range ends at the capture's last timestamp)
osrt      start, end, duration, name, global_tid, pid, tid     (OS runtime calls)
cuda_api  start, end, duration, name, global_tid, pid, tid, correlation_id
          (name without the `_vNNNN` version suffix)
kernels   start, end, duration, name, short_name, mangled_name, device_id, stream_id, pid,
          correlation_id, grid, block    (grid/block formatted as nsys stats prints them)
memops    start, end, duration, operation ("[CUDA memcpy HtoD]"... or "[CUDA memset]"), bytes,
          device_id, stream_id, pid, correlation_id
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

COLUMNS = {
    "threads": ["global_tid", "pid", "tid", "thread_name", "process_name"],
    "nvtx": ["start", "end", "duration", "name", "style", "global_tid", "pid", "tid"],
    "osrt": ["start", "end", "duration", "name", "global_tid", "pid", "tid"],
    "cuda_api": ["start", "end", "duration", "name", "global_tid", "pid", "tid", "correlation_id"],
    "kernels": ["start", "end", "duration", "name", "short_name", "mangled_name", "device_id", "stream_id",
                "pid", "correlation_id", "grid", "block"],
    "memops": ["start", "end", "duration", "operation", "bytes", "device_id", "stream_id", "pid",
               "correlation_id"],
}


def empty(table: str) -> pd.DataFrame:
    return pd.DataFrame({column: pd.Series(dtype="object") for column in COLUMNS[table]})


@dataclass
class TraceTables:
    """One capture, normalized. `sources` says which trace sources the capture had."""

    source_path: str
    span_ns: int
    sources: set[str] = field(default_factory=set)
    threads: pd.DataFrame = field(default_factory=lambda: empty("threads"))
    nvtx: pd.DataFrame = field(default_factory=lambda: empty("nvtx"))
    osrt: pd.DataFrame = field(default_factory=lambda: empty("osrt"))
    cuda_api: pd.DataFrame = field(default_factory=lambda: empty("cuda_api"))
    kernels: pd.DataFrame = field(default_factory=lambda: empty("kernels"))
    memops: pd.DataFrame = field(default_factory=lambda: empty("memops"))
