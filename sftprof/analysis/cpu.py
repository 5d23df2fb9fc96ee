"""CPU-side analyses: OS-runtime calls, NVTX ranges, training steps and threads."""

from __future__ import annotations

import re

import pandas as pd

from sftprof.analysis.stats import duration_summary

# nsys injects its own threads into the profiled process: "[NSys]", "[NSys Comms]", "*2CommsProcesso"...
PROFILER_THREAD = re.compile(r"^(\[NSys|\*\d)")
STEP_RANGE = re.compile(r"^(?:.*:)?step (\d+)$")
# The trainer's phase ranges inside each step (sftprof.sft.torch_backend).
PHASES = ("data", "forward", "backward", "optimizer")


def osrt_summary(osrt: pd.DataFrame) -> pd.DataFrame:
    """OS-runtime time by call, as `nsys stats -r osrtsum`."""
    return duration_summary(osrt, ["name"])


def nvtx_summary(nvtx: pd.DataFrame) -> pd.DataFrame:
    """NVTX range time by name and style, as `nsys stats -r nvtxsum`."""
    return duration_summary(nvtx, ["name", "style"])


def step_table(nvtx: pd.DataFrame) -> pd.DataFrame:
    """One row per `step N` range, with the time of each phase range nested inside it."""
    match = nvtx["name"].astype(str).str.extract(STEP_RANGE, expand=False)
    steps = nvtx[match.notna()].assign(step=match.dropna().astype(int))
    columns = ["step", "start", "end", "duration", *(f"{phase}_ns" for phase in PHASES), "other_ns"]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    phases = nvtx[nvtx["name"].isin(PHASES)]
    rows = []
    for step in steps.sort_values("start").itertuples():
        inside = phases[(phases["global_tid"] == step.global_tid) & (phases["start"] >= step.start)
                        & (phases["end"] <= step.end)]
        per_phase = inside.groupby("name")["duration"].sum()
        row = {"step": step.step, "start": step.start, "end": step.end, "duration": step.duration}
        for phase in PHASES:
            row[f"{phase}_ns"] = int(per_phase.get(phase, 0))
        row["other_ns"] = step.duration - sum(row[f"{phase}_ns"] for phase in PHASES)
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)


def phase_ranges(nvtx: pd.DataFrame) -> pd.DataFrame:
    """The individual phase ranges (data/forward/backward/optimizer), in time order."""
    phases = nvtx[nvtx["name"].isin(PHASES)]
    return phases[["name", "start", "end", "duration", "tid"]].sort_values("start").reset_index(drop=True)


def application_pids(tables) -> set[int]:
    """Processes that emitted trace events (the profiled program), not nsys or the system."""
    pids = set()
    for frame in (tables.nvtx, tables.cuda_api, tables.osrt):
        pids.update(int(pid) for pid in frame["pid"].unique())
    return pids


def thread_role(pid: int, tid: int, name: str) -> str:
    """The training threads users ask about: the process's main thread and PyTorch's autograd workers."""
    if pid == tid:
        return "main"
    if str(name).startswith("pt_autograd"):
        return "autograd"
    return ""


def _clipped_to_capture(calls: pd.DataFrame, span_ns: int) -> pd.Series:
    """Call durations inside [0, span]: a call can start before the capture or end after it."""
    if not span_ns:
        return calls["duration"]
    return (calls["end"].clip(upper=span_ns) - calls["start"].clip(lower=0)).clip(lower=0)


def thread_summary(tables) -> pd.DataFrame:
    """Per application thread: OS-runtime time inside the capture, the call it blocks in most,
    CUDA API and NVTX activity."""
    pids = application_pids(tables)
    threads = tables.threads[tables.threads["pid"].isin(pids)
                             & ~tables.threads["thread_name"].astype(str).str.match(PROFILER_THREAD)]
    osrt = tables.osrt.assign(in_capture=_clipped_to_capture(tables.osrt, tables.span_ns))
    osrt_by_tid = osrt.groupby("global_tid")
    rows = []
    for thread in threads.itertuples():
        calls = osrt_by_tid.get_group(thread.global_tid) if thread.global_tid in osrt_by_tid.groups else osrt.iloc[0:0]
        per_call = calls.groupby("name")["in_capture"].sum().sort_values(ascending=False)
        api = tables.cuda_api[tables.cuda_api["global_tid"] == thread.global_tid]
        rows.append({
            "global_tid": thread.global_tid, "pid": thread.pid, "tid": thread.tid,
            "thread_name": thread.thread_name, "role": thread_role(thread.pid, thread.tid, thread.thread_name),
            "osrt_calls": len(calls), "osrt_ns": int(calls["in_capture"].sum()),
            "top_osrt_call": per_call.index[0] if len(per_call) else "",
            "top_osrt_ns": int(per_call.iloc[0]) if len(per_call) else 0,
            "cuda_api_calls": len(api), "cuda_api_ns": int(api["duration"].sum()),
            "nvtx_ranges": int((tables.nvtx["global_tid"] == thread.global_tid).sum()),
        })
    columns = ["global_tid", "pid", "tid", "thread_name", "role", "osrt_calls", "osrt_ns", "top_osrt_call",
               "top_osrt_ns", "cuda_api_calls", "cuda_api_ns", "nvtx_ranges"]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["osrt_ns", "nvtx_ranges"], ascending=False).reset_index(drop=True)
