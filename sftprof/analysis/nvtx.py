"""NVTX ranges as the frame for the rest of the trace: the range a call was made in, and the GPU
time launched from each range.

A kernel belongs to the NVTX ranges, on the thread that launched it, that contain its launching
CUDA API call (start and end inside the range), the rule of nsys's nvtxkernsum/nvtxgpuproj.
`inclusive` counts it in every such range, as nvtxkernsum does; the plain columns count it once,
in the innermost range, so that they add up to the kernel time.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sftprof.analysis.cuda import with_api_calls

NOT_TRACED = "(launching call not traced)"


def _outside(thread: str) -> str:
    return f"(no NVTX range, {thread})"


def enclosing_ranges(nvtx: pd.DataFrame, calls: pd.DataFrame) -> pd.DataFrame:
    """Every (call, range) pair where the range, on the call's thread, contains the call.
    `call` and `range` are index labels of `calls` and `nvtx`."""
    pairs = []
    by_thread = dict(tuple(calls.groupby("global_tid")))
    for tid, ranges in nvtx.groupby("global_tid"):
        if tid not in by_thread:
            continue
        thread_calls = by_thread[tid].sort_values("start")
        starts, ends = thread_calls["start"].to_numpy(), thread_calls["end"].to_numpy()
        labels = thread_calls.index.to_numpy()
        for range_label, start, end in zip(ranges.index, ranges["start"], ranges["end"]):
            lo, hi = np.searchsorted(starts, start, side="left"), np.searchsorted(starts, end, side="right")
            inside = labels[lo:hi][ends[lo:hi] <= end]
            pairs.append(pd.DataFrame({"call": inside, "range": range_label}))
    if not pairs:
        return pd.DataFrame({"call": pd.Series(dtype=calls.index.dtype), "range": pd.Series(dtype=nvtx.index.dtype)})
    return pd.concat(pairs, ignore_index=True)


def innermost_ranges(nvtx: pd.DataFrame, calls: pd.DataFrame) -> pd.Series:
    """For each call (by index label), the index label of the innermost NVTX range containing it
    on its thread: the one that started last (the shorter one on a tie). Calls in no range are absent."""
    pairs = enclosing_ranges(nvtx, calls)
    pairs = pairs.assign(start=nvtx.loc[pairs["range"], "start"].to_numpy(),
                         end=nvtx.loc[pairs["range"], "end"].to_numpy())
    pairs = pairs.sort_values(["call", "start", "end"], ascending=[True, False, True])
    return pairs.drop_duplicates("call").set_index("call")["range"]


def gpu_time_by_range(nvtx: pd.DataFrame, cuda_api: pd.DataFrame, kernels: pd.DataFrame,
                      thread_labels: dict) -> pd.DataFrame:
    """Kernel time per NVTX range name. Kernels launched outside every range are listed per thread,
    so that backward kernels launched by an unannotated autograd thread show up as such."""
    columns = ["range", "kernels", "gpu_ns", "gpu_pct", "inclusive_kernels", "inclusive_gpu_ns"]
    if kernels.empty:
        return pd.DataFrame(columns=columns)
    launched = with_api_calls(kernels[["pid", "correlation_id", "duration"]], cuda_api)
    calls = launched.rename(columns={"api_start": "start", "api_end": "end"})
    innermost = innermost_ranges(nvtx, calls)
    outside = calls["global_tid"].map(lambda tid: _outside(thread_labels.get(tid, f"tid {int(tid) & 0xFFFFFF}")))
    calls["range"] = nvtx["name"].reindex(innermost.reindex(calls.index).to_numpy()).to_numpy()
    calls["range"] = calls["range"].fillna(outside)
    exclusive = calls.groupby("range")["duration"].agg(kernels="count", gpu_ns="sum")
    untraced = len(kernels) - len(launched)
    if untraced:
        exclusive.loc[NOT_TRACED] = [untraced, int(kernels["duration"].sum() - launched["duration"].sum())]
    pairs = enclosing_ranges(nvtx, calls)
    inclusive = pd.DataFrame({"range": nvtx.loc[pairs["range"], "name"].to_numpy(),
                              "duration": calls.loc[pairs["call"], "duration"].to_numpy()})
    inclusive = inclusive.groupby("range")["duration"].agg(inclusive_kernels="count", inclusive_gpu_ns="sum")
    frame = exclusive.join(inclusive, how="outer").fillna(0).astype("int64").reset_index()
    frame = frame.rename(columns={"index": "range"})
    frame["gpu_pct"] = 100.0 * frame["gpu_ns"] / kernels["duration"].sum()
    return frame[columns].sort_values(["gpu_ns", "inclusive_gpu_ns"], ascending=False).reset_index(drop=True)
