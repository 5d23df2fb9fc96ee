"""GPU-side analyses: kernel, memory-operation and CUDA API summaries, busy time."""

from __future__ import annotations

import pandas as pd

from sftprof.analysis.stats import duration_summary

KERNEL_NAME_COLUMNS = {"demangled": "name", "short": "short_name", "mangled": "mangled_name"}


def kernel_summary(kernels: pd.DataFrame, names: str = "demangled", by_launch_shape: bool = True) -> pd.DataFrame:
    """Kernel time by name, as `nsys stats -r gpukernsum` (2022.4 groups by name, grid and block)."""
    rows = kernels.assign(kernel=kernels[KERNEL_NAME_COLUMNS[names]].fillna(kernels["name"]))
    return duration_summary(rows, ["grid", "block", "kernel"] if by_launch_shape else ["kernel"])


def memop_summary(memops: pd.DataFrame) -> pd.DataFrame:
    """Memory-operation time by kind, as `nsys stats -r gpumemtimesum`."""
    return duration_summary(memops, ["operation"])


def cuda_api_summary(cuda_api: pd.DataFrame) -> pd.DataFrame:
    """CUDA API time by call, as `nsys stats -r cudaapisum`."""
    return duration_summary(cuda_api, ["name"])


def busy_intervals(intervals: pd.DataFrame) -> pd.DataFrame:
    """Merge overlapping [start, end) intervals: GPU busy time is their union, not a sum."""
    if intervals.empty:
        return pd.DataFrame(columns=["start", "end"])
    ordered = intervals.sort_values("start")
    starts, ends = ordered["start"].to_numpy(), ordered["end"].to_numpy()
    running_end = pd.Series(ends).cummax().to_numpy()
    new_block = pd.Series(starts[1:] > running_end[:-1])
    block_id = pd.concat([pd.Series([0]), new_block.cumsum()], ignore_index=True).to_numpy()
    merged = pd.DataFrame({"start": starts, "end": ends, "block": block_id})
    return merged.groupby("block").agg(start=("start", "min"), end=("end", "max")).reset_index(drop=True)


def gpu_busy(kernels: pd.DataFrame, memops: pd.DataFrame) -> pd.DataFrame:
    """Per device: span from first to last GPU op, busy time (union over streams), busy %."""
    ops = pd.concat([kernels[["device_id", "start", "end"]], memops[["device_id", "start", "end"]]])
    ops = ops[ops["start"] > 0]
    rows = []
    for device, device_ops in ops.groupby("device_id"):
        merged = busy_intervals(device_ops)
        span = int(device_ops["end"].max() - device_ops["start"].min())
        busy = int((merged["end"] - merged["start"]).sum())
        rows.append({"device_id": device, "span_ns": span, "busy_ns": busy,
                     "busy_pct": 100.0 * busy / span if span else 0.0})
    return pd.DataFrame(rows, columns=["device_id", "span_ns", "busy_ns", "busy_pct"])
