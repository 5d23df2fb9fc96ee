"""GPU-side analyses: kernel, memory-operation and CUDA API summaries, busy time."""

from __future__ import annotations

import pandas as pd

from sftprof.analysis import intervals
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


def gpu_ops(kernels: pd.DataFrame, memops: pd.DataFrame) -> pd.DataFrame:
    """Every kernel and memory operation as (device_id, start, end): what keeps a GPU busy.
    Rows with start <= 0 are dropped, as nsys's utilisation rules do."""
    ops = pd.concat([kernels[["device_id", "start", "end"]], memops[["device_id", "start", "end"]]],
                    ignore_index=True)
    ops = ops[ops["start"] > 0]
    return ops.astype({"start": "int64", "end": "int64"})


def gpu_busy(kernels: pd.DataFrame, memops: pd.DataFrame) -> pd.DataFrame:
    """Per device: span from first to last GPU op, busy time (union over streams), busy %."""
    rows = []
    for device, device_ops in gpu_ops(kernels, memops).groupby("device_id"):
        merged = intervals.union(device_ops)
        span = int(device_ops["end"].max() - device_ops["start"].min())
        busy = int((merged["end"] - merged["start"]).sum())
        rows.append({"device_id": device, "span_ns": span, "busy_ns": busy,
                     "busy_pct": 100.0 * busy / span if span else 0.0})
    return pd.DataFrame(rows, columns=["device_id", "span_ns", "busy_ns", "busy_pct"])
