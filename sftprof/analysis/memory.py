"""Memory operations: bytes moved, their share of GPU time per kind, and pinned vs pageable host memory.

A training step moves a batch in (HtoD), a few scalars out (DtoH, e.g. `loss.item()`), and copies
and clears buffers on the device (DtoD, memset). Only copies that cross the host link or a peer
link (INTERCONNECT_KINDS) say anything about the interconnect; DtoD and memset stay in GPU memory.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis import intervals
from sftprof.analysis.cuda import base_name, call_names, name_ids
from sftprof.analysis.gpu import BusyUnions, KernelsBusy, kernels_busy_in, start_windows
from sftprof.analysis.stats import grouped_summary
from sftprof.trace import events as store
from sftprof.trace.events import EventStore, labelled_columns, sql_in

MEGABYTE = 1e6  # nsys stats prints memory sizes in MB of 1000^2 bytes, with 3 decimals
# Copies over PCIe / NVLink-C2C (host) or NVLink / PCIe (peer GPUs).
INTERCONNECT_KINDS = ("HtoD", "DtoH", "PtoP", "UVM HtoD", "UVM DtoH")
PAGEABLE = "Pageable"


def totals(events: EventStore) -> dict:
    """Every memory operation together: count and time."""
    row = events.query("SELECT count(*) AS n, coalesce(sum(duration), 0)::BIGINT AS ns FROM memops")
    return {"count": int(row["n"].iat[0]), "ns": int(row["ns"].iat[0])}


def size_summary(events: EventStore) -> pd.DataFrame:
    """Bytes per operation, as `nsys stats -r gpumemsizesum` computes them (in bytes, unrounded;
    nsys prints them in MB: see MEGABYTE)."""
    columns = ["total_bytes", "count", "avg_bytes", "med_bytes", "min_bytes", "max_bytes", "stddev_bytes", "operation"]
    # grouped_summary's statistics of `duration`, here of bytes
    sizes = grouped_summary(
        events, "(SELECT operation, bytes AS duration FROM memops WHERE bytes IS NOT NULL)", ["operation"]
    )
    if sizes.empty:
        return pd.DataFrame(columns=columns)
    summary = pd.DataFrame(
        {
            "total_bytes": sizes["total_ns"].astype("int64"),
            "count": sizes["instances"].astype("int64"),
            "avg_bytes": sizes["total_ns"] / sizes["instances"],
            "med_bytes": sizes["med_ns"],
            "min_bytes": sizes["min_ns"].astype("int64"),
            "max_bytes": sizes["max_ns"].astype("int64"),
            "stddev_bytes": sizes["stddev_ns"].astype("float64").fillna(0.0),
            "operation": sizes["operation"],
        }
    )
    summary = summary.sort_values(["total_bytes", "operation"], ascending=[False, True], kind="stable")
    return summary[columns].reset_index(drop=True)


def kind_share(kernel_ns: int, memop_ns: int, events: EventStore) -> pd.DataFrame:
    """Per copy kind: time, its share of all GPU time (`kernel_ns` + `memop_ns`), bytes and bandwidth."""
    columns = ["copy_kind", "instances", "total_ns", "gpu_time_pct", "bytes", "gb_per_s"]
    frame = events.query("""SELECT copy_kind, count(*) AS instances, sum(duration)::BIGINT AS total_ns,
                                   coalesce(sum(bytes), 0)::BIGINT AS bytes
                            FROM memops GROUP BY copy_kind ORDER BY copy_kind""")
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame["gpu_time_pct"] = 100.0 * frame["total_ns"] / (kernel_ns + memop_ns)
    frame["gb_per_s"] = frame["bytes"] / frame["total_ns"].where(frame["total_ns"] > 0)  # bytes per ns = GB/s
    return frame[columns].sort_values("total_ns", ascending=False).reset_index(drop=True)


# SQL: a copy reads host memory (HtoD, HtoA, HtoH); writes it (DtoH, AtoH)
_FROM_HOST = "(starts_with(copy_kind, 'H') OR starts_with(copy_kind, 'UVM H'))"
_TO_HOST = "suffix(copy_kind, 'toH')"


def host_memory(events: EventStore) -> pd.DataFrame:
    """Copies to or from host memory by the host memory's kind: pageable copies go through a staging
    buffer and block the CPU; pinned ones are true DMA and can overlap compute."""
    columns = ["copy_kind", "host_memory", "instances", "bytes", "total_ns"]
    frame = events.query(f"""
        SELECT copy_kind,
               coalesce(CASE WHEN {_FROM_HOST} THEN src_kind WHEN {_TO_HOST} THEN dst_kind END, 'not recorded')
                   AS host_memory,
               count(*) AS instances, coalesce(sum(bytes), 0)::BIGINT AS bytes, sum(duration)::BIGINT AS total_ns
        FROM memops WHERE {_FROM_HOST} OR {_TO_HOST} GROUP BY ALL ORDER BY copy_kind, host_memory""")
    return frame[columns] if len(frame) else pd.DataFrame(columns=columns)


def interconnect_share(kernel_ns: int, memop_ns: int, events: EventStore) -> dict:
    """Host<->device and peer copies: time, bytes, and share of all GPU time (`kernel_ns` + `memop_ns`, %)."""
    row = events.query(f"""SELECT coalesce(sum(duration), 0)::BIGINT AS ns, coalesce(sum(bytes), 0)::BIGINT AS bytes,
                                  count(*) AS n FROM memops WHERE {sql_in("copy_kind", INTERCONNECT_KINDS)}""")
    ns, gpu_ns = int(row["ns"].iat[0]), kernel_ns + memop_ns
    return {
        "ns": ns,
        "bytes": int(row["bytes"].iat[0]),
        "count": int(row["n"].iat[0]),
        "gpu_time_pct": 100.0 * ns / gpu_ns if gpu_ns else 0.0,
    }


@dataclass(frozen=True)
class CopyCalls:
    """The memory operations as the copy rules read them: each with `exposed_ns`, its time with no kernel
    running on any GPU (`kernels`: gpu.BusyUnions.kernels), and, where asked, the API call that issued it. A
    rule names the operations it reads in SQL and sums them a batch at a time (`batches`): a trainer may set
    pinned memory millions of times."""

    events: EventStore
    kernels: dict[int, KernelsBusy]

    def batches(self, where: str, calls: re.Pattern | None = None) -> Iterator[pd.DataFrame]:
        """The operations (`m`, the memops view) for which `where` holds, by start (ties in the export's
        order), in tables.py's memops columns with `exposed_ns`, a window of about a batch of starts
        (events.BATCH_VECTORS) at a time: each window is a query of its own, so DuckDB holds one window's
        sort and join, never the whole selection's while the caller queries between windows. With `calls`:
        only the operations issued by an API call whose name (without its version) matches it, joined on
        (pid, correlation_id) as nsys's own scripts do (correlation ids are unique only within a process),
        with the call's `api` name, `api_start`, `api_end`, `api_duration` and `global_tid`."""
        names = call_names(self.events) if calls is not None else {}
        # each call name id as its name without version: codes into `bases`
        bases = sorted({base_name(name) for name in names.values()})
        codes = np.full(max(names, default=-1) + 1, -1, dtype="int64")
        codes[list(names)] = [bases.index(base_name(name)) for name in names.values()]
        labels = labelled_columns("memops")[1]
        for lo, hi in self._windows(where):
            batch = self.events.named(self._sql(f"({where}) AND m.start >= {lo} AND m.start < {hi}", calls), labels)
            if batch.empty:
                continue
            if calls is not None:
                batch["api"] = pd.Categorical.from_codes(codes[batch.pop("name_id").to_numpy("int64")], bases)
            starts, ends = batch["start"].to_numpy("int64"), batch["end"].to_numpy("int64")
            beside = intervals.covered_ns(kernels_busy_in(self.kernels, starts, ends), starts, ends)
            yield batch.assign(exposed_ns=batch["duration"].to_numpy("int64") - beside)

    def _windows(self, where: str) -> list[tuple[int, int]]:
        """Windows of start time that cut the operations for which `where` holds into about a batch each."""
        selection = f"FROM memops m WHERE {where}"
        n, first, last = self.events.query(f"SELECT count(*), min(start), max(start) {selection}").iloc[0]
        rows = store.BATCH_VECTORS * store.VECTOR_ROWS
        return start_windows(self.events, selection, n, first, last, rows) if n else []

    def count(self, where: str, calls: re.Pattern | None = None) -> int:
        """How many operations `batches(where, calls)` gives."""
        return int(self.events.query(f"SELECT count(*) AS n FROM ({self._sql(where, calls)})")["n"].iat[0])

    def median_bytes(self, where: str, calls: re.Pattern | None = None) -> float:
        """The median size of the operations `batches(where, calls)` gives (NaN for none)."""
        median = self.events.query(f"SELECT median(bytes) AS b FROM ({self._sql(where, calls)})")["b"].iat[0]
        return float("nan") if pd.isna(median) else float(median)

    def _sql(self, where: str, calls: re.Pattern | None) -> str:
        columns = labelled_columns("memops", "m")[0]
        joined = ""
        if calls is not None:
            ids = name_ids(self.events, lambda name: bool(calls.search(base_name(name))))
            columns += ', a.start AS api_start, a."end" AS api_end, a.duration AS api_duration, a.global_tid, a.name_id'
            joined = f"""JOIN cuda_api a ON a.pid = m.pid AND a.correlation_id = m.correlation_id
                         AND {sql_in("a.name_id", ids)}"""
        return f'SELECT {columns} FROM memops m {joined} WHERE {where} ORDER BY m.start, m."row"'


def memop_kinds(kernel_totals: dict, memop_totals: dict, events: EventStore) -> pd.DataFrame:
    """kind_share of all GPU time: the kernels' (gpu.kernel_totals) and the memory operations' (totals)."""
    return kind_share(kernel_totals["total_ns"], memop_totals["ns"], events)


def crossing(kernel_totals: dict, memop_totals: dict, events: EventStore) -> dict:
    """interconnect_share of all GPU time: the kernels' (gpu.kernel_totals) and the memory operations' (totals)."""
    return interconnect_share(kernel_totals["total_ns"], memop_totals["ns"], events)


def copy_calls(events: EventStore, unions: BusyUnions) -> CopyCalls:
    """The copy rules' view of the memory operations, exposed where no kernel ran (busy_unions' `kernels`)."""
    return CopyCalls(events, unions.kernels)
