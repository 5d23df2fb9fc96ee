"""Memory operations: bytes moved, their share of GPU time per kind, and pinned vs pageable host memory.

A training step moves a batch in (HtoD), a few scalars out (DtoH, e.g. `loss.item()`), and copies
and clears buffers on the device (DtoD, memset). Only copies that cross the host link or a peer
link (INTERCONNECT_KINDS) say anything about the interconnect; DtoD and memset stay in GPU memory.
"""

from __future__ import annotations

import re

import pandas as pd

from sftprof.trace.nsys_sqlite import MEMSET_KIND

MEGABYTE = 1e6  # nsys stats prints memory sizes in MB of 1000^2 bytes, with 3 decimals
# Copies over PCIe / NVLink-C2C (host) or NVLink / PCIe (peer GPUs).
INTERCONNECT_KINDS = ("HtoD", "DtoH", "PtoP", "UVM HtoD", "UVM DtoH")
PAGEABLE = "Pageable"
_KIND_IN_OPERATION = re.compile(r"memcpy (\w+)")


def copy_kinds(memops: pd.DataFrame) -> pd.Series:
    """Each operation's copy kind ("HtoD"..., "memset"); read from the operation name where a
    loader did not give `copy_kind` (a Kineto trace names operations the nsys 2022.4 way)."""
    given = memops["copy_kind"].astype("object") if "copy_kind" in memops else None
    if given is not None and not given.isna().any():  # nsys's loader gives them all: no name is read
        return given
    operations = memops["operation"].astype(str)
    from_name = operations.map(
        {
            op: MEMSET_KIND if "memset" in op else (m.group(1) if (m := _KIND_IN_OPERATION.search(op)) else "Unknown")
            for op in operations.unique()
        }
    )
    return given.fillna(from_name) if given is not None else from_name


def _host_side(kinds: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Which copies read host memory (HtoD, HtoA, HtoH) and which write it (DtoH, AtoH)."""
    distinct = kinds.unique()
    reads = {kind: str(kind).startswith(("H", "UVM H")) for kind in distinct}
    writes = {kind: str(kind).endswith("toH") for kind in distinct}
    return kinds.map(reads).astype(bool), kinds.map(writes).astype(bool)


def size_summary(memops: pd.DataFrame) -> pd.DataFrame:
    """Bytes per operation, as `nsys stats -r gpumemsizesum` computes them (in bytes, unrounded;
    nsys prints them in MB: see MEGABYTE)."""
    columns = ["total_bytes", "count", "avg_bytes", "med_bytes", "min_bytes", "max_bytes", "stddev_bytes", "operation"]
    if memops.empty:
        return pd.DataFrame(columns=columns)
    sizes = memops.assign(bytes=memops["bytes"].astype("int64")).groupby("operation", sort=False)["bytes"]
    summary = sizes.agg(
        total_bytes="sum",
        count="count",
        avg_bytes="mean",
        med_bytes="median",
        min_bytes="min",
        max_bytes="max",
        stddev_bytes="std",
    ).reset_index()
    summary["stddev_bytes"] = summary["stddev_bytes"].fillna(0.0)
    summary = summary.sort_values(["total_bytes", "operation"], ascending=[False, True], kind="stable")
    return summary[columns].reset_index(drop=True)


def kind_share(kernel_ns: int, memops: pd.DataFrame) -> pd.DataFrame:
    """Per copy kind: time, its share of all GPU time (`kernel_ns` + memory ops), bytes and bandwidth."""
    columns = ["copy_kind", "instances", "total_ns", "gpu_time_pct", "bytes", "gb_per_s"]
    if memops.empty:
        return pd.DataFrame(columns=columns)
    gpu_ns = kernel_ns + memops["duration"].sum()
    grouped = memops.assign(copy_kind=copy_kinds(memops)).groupby("copy_kind")
    frame = grouped.agg(instances=("duration", "count"), total_ns=("duration", "sum"), bytes=("bytes", "sum"))
    frame = frame.reset_index().astype({"total_ns": "int64", "bytes": "int64"})
    frame["gpu_time_pct"] = 100.0 * frame["total_ns"] / gpu_ns
    frame["gb_per_s"] = frame["bytes"] / frame["total_ns"].where(frame["total_ns"] > 0)  # bytes per ns = GB/s
    return frame[columns].sort_values("total_ns", ascending=False).reset_index(drop=True)


def host_memory(memops: pd.DataFrame) -> pd.DataFrame:
    """Copies to or from host memory by the host memory's kind: pageable copies go through a staging
    buffer and block the CPU; pinned ones are true DMA and can overlap compute."""
    columns = ["copy_kind", "host_memory", "instances", "bytes", "total_ns"]
    kinds = copy_kinds(memops)
    from_host, to_host = _host_side(kinds)
    crossing = from_host | to_host
    # the host side's kind, of these copies only: most operations stay on the device (1.5M memsets at 10M kernels)
    copies, from_host, to_host = memops[crossing], from_host[crossing], to_host[crossing]
    if copies.empty:
        return pd.DataFrame(columns=columns)
    host = copies["src_kind"].astype("object").where(from_host, copies["dst_kind"].astype("object").where(to_host))
    copies = copies.assign(copy_kind=kinds[crossing], host_memory=host.fillna("not recorded"))
    frame = (
        copies.groupby(["copy_kind", "host_memory"])
        .agg(instances=("duration", "count"), bytes=("bytes", "sum"), total_ns=("duration", "sum"))
        .reset_index()
    )
    return frame[columns].sort_values(["copy_kind", "host_memory"]).reset_index(drop=True)


def interconnect_share(kernel_ns: int, memops: pd.DataFrame) -> dict:
    """Host<->device and peer copies: time, bytes, and share of all GPU time (`kernel_ns` + memory ops, %)."""
    gpu_ns = int(kernel_ns + memops["duration"].sum())
    crossing = memops[copy_kinds(memops).isin(INTERCONNECT_KINDS)]
    ns = int(crossing["duration"].sum())
    return {
        "ns": ns,
        "bytes": int(crossing["bytes"].sum()),
        "count": len(crossing),
        "gpu_time_pct": 100.0 * ns / gpu_ns if gpu_ns else 0.0,
    }
