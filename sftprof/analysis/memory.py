"""Memory operations: bytes moved, their share of GPU time per kind, and pinned vs pageable host memory.

A training step moves a batch in (HtoD), a few scalars out (DtoH, e.g. `loss.item()`), and copies
and clears buffers on the device (DtoD, memset). Only copies that cross the host link or a peer
link (INTERCONNECT_KINDS) say anything about the interconnect; DtoD and memset stay in GPU memory.
"""

from __future__ import annotations

import pandas as pd

from sftprof.analysis.stats import grouped_summary
from sftprof.trace.events import EventStore, sql_in

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
