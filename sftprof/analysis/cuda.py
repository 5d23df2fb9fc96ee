"""CUDA API calls beyond the cudaapisum table: launch cost, and the calls in which the CPU waits for the GPU.

Names are matched without their `_vNNNN` suffix (nsys strips only 5-character versions such as
`_v7000`, so `cudaLaunchKernelExC_v11060` keeps its suffix in the summary).
"""

from __future__ import annotations

import re

import pandas as pd

from sftprof.analysis.stats import duration_summary

API_VERSION_SUFFIX = re.compile(r"_v\d+$")
# Calls that put a kernel on a stream (runtime and driver API).
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel", "cudaGraphLaunch",
                "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"}
# Calls in which the host thread blocks until GPU work has finished.
HOST_SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                   "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize"}
# Calls that order streams on the GPU without blocking the host.
STREAM_WAIT_CALLS = {"cudaStreamWaitEvent", "cuStreamWaitEvent"}
# cudaMemcpy*/cudaMemset* without `Async`: synchronous with respect to the host (a memset only for
# pinned or managed memory, see rules.sync_memset).
SYNC_MEMCPY_CALL = re.compile(r"^cu(?:da)?Memcpy(?!.*Async)")
SYNC_MEMSET_CALL = re.compile(r"^cu(?:da)?Memset(?!.*Async)")
ASYNC_MEMCPY_CALL = re.compile(r"^cu(?:da)?Memcpy.*Async")


def base_names(cuda_api: pd.DataFrame) -> pd.Series:
    """Call names without version suffix (worked out once per distinct name: traces repeat a few dozen)."""
    names = cuda_api["name"].astype(str)
    return names.map({name: API_VERSION_SUFFIX.sub("", name) for name in names.unique()})


def _waits_for_gpu(name: str) -> bool:
    return name in HOST_SYNC_CALLS or bool(SYNC_MEMCPY_CALL.search(name))


def host_wait_calls(cuda_api: pd.DataFrame) -> pd.DataFrame:
    """The API calls in which the calling thread waits for the GPU: explicit synchronization and
    synchronous memcpy."""
    names = base_names(cuda_api)
    return cuda_api[names.map({name: _waits_for_gpu(name) for name in names.unique()}).astype(bool)]


def launch_overhead(cuda_api: pd.DataFrame) -> pd.DataFrame:
    """Host time per kernel launch call: the CPU cost of putting one kernel on a stream."""
    return duration_summary(cuda_api[base_names(cuda_api).isin(LAUNCH_CALLS)], ["name"])


def sync_calls(cuda_api: pd.DataFrame, span_ns: int) -> pd.DataFrame:
    """Synchronization calls: how often, and how long the calling threads were blocked in them."""
    columns = ["name", "calls", "total_ns", "avg_ns", "max_ns", "capture_pct", "blocks_host"]
    names = base_names(cuda_api)
    calls = cuda_api.assign(base=names)[names.isin(STREAM_WAIT_CALLS)
                                        | names.map({name: _waits_for_gpu(name) for name in names.unique()}).astype(bool)]
    if calls.empty:
        return pd.DataFrame(columns=columns)
    frame = calls.groupby("base")["duration"].agg(calls="count", total_ns="sum", avg_ns="mean", max_ns="max")
    frame = frame.reset_index().rename(columns={"base": "name"})
    frame["capture_pct"] = 100.0 * frame["total_ns"] / span_ns if span_ns else float("nan")
    frame["blocks_host"] = ~frame["name"].isin(STREAM_WAIT_CALLS)
    return frame[columns].sort_values("total_ns", ascending=False).reset_index(drop=True)


def sync_activity(sync: pd.DataFrame) -> pd.DataFrame:
    """CUDA synchronization activity (CUPTI) by kind: event, stream, context syncs and stream waits."""
    return duration_summary(sync, ["sync_type"])


def with_api_calls(ops: pd.DataFrame, cuda_api: pd.DataFrame) -> pd.DataFrame:
    """GPU operations with the API call that issued them (`api` name, `api_start`, `api_end`,
    `api_duration`, `global_tid`): correlation ids are unique only within a process, so the join
    is on (pid, correlation_id), as nsys's own scripts do."""
    calls = cuda_api.assign(api=base_names(cuda_api))[
        ["pid", "correlation_id", "api", "start", "end", "duration", "global_tid"]].rename(
        columns={"start": "api_start", "end": "api_end", "duration": "api_duration"})
    calls = calls.dropna(subset=["pid", "correlation_id"]).astype({"pid": "int64", "correlation_id": "int64"})
    keyed = ops.dropna(subset=["pid", "correlation_id"]).astype({"pid": "int64", "correlation_id": "int64"})
    return keyed.merge(calls, on=["pid", "correlation_id"], how="inner")
