"""CPU scheduling (nsys `--cpuctxsw`): when each thread ran, and on which core.

SCHED_EVENTS holds point events, a thread switched in or out on a core; pairing them gives the
thread's on-CPU intervals. With `--cpuctxsw=process-tree` only the profiled process tree is
recorded, so a core's utilisation here is the share of its time spent running the profiled program.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from sftprof.analysis import intervals

CPU_SCHED_SWITCH = "--cpuctxsw=process-tree"
CORE_CHUNKS = 50  # time chunks per core in the utilisation timeline


def on_cpu_intervals(sched: pd.DataFrame, span_ns: int) -> pd.DataFrame:
    """One row per stretch a thread ran on a core. A thread already running when the capture
    began (its first event a switch-out) ran from 0; one still running at the end, until span_ns."""
    columns = ["global_tid", "pid", "tid", "cpu", "start", "end", "duration"]
    if sched.empty:
        return pd.DataFrame(columns=columns)
    events = sched.sort_values(["global_tid", "start"], kind="stable").reset_index(drop=True)
    same_thread_next = events["global_tid"].shift(-1) == events["global_tid"]
    same_thread_prev = events["global_tid"].shift(1) == events["global_tid"]
    switched_in = events["is_sched_in"].astype(bool)
    next_out = same_thread_next & ~switched_in.shift(-1, fill_value=True)
    paired = events[switched_in & next_out].assign(end=events["start"].shift(-1)[switched_in & next_out])
    still_running = events[switched_in & ~same_thread_next].assign(end=max(span_ns, int(events["start"].max())))
    running_at_start = events[~switched_in & ~same_thread_prev]
    running_at_start = running_at_start.assign(end=running_at_start["start"], start=0)
    runs = pd.concat([paired, still_running, running_at_start], ignore_index=True)
    runs = runs.astype({"start": "int64", "end": "int64"})
    runs["start"] = runs["start"].clip(lower=0)
    runs = runs[runs["end"] > runs["start"]]
    runs = runs.assign(duration=runs["end"] - runs["start"])
    return runs[columns].sort_values(["start", "cpu"]).reset_index(drop=True)


def core_timeline(runs: pd.DataFrame, span_ns: int, chunks: int = CORE_CHUNKS) -> pd.DataFrame:
    """Per core and time chunk: the share of the chunk the core spent running traced threads."""
    columns = ["cpu", "chunk", "start", "end", "busy_pct"]
    if runs.empty or span_ns <= 0:
        return pd.DataFrame(columns=columns)
    starts, ends = intervals.chunk_edges(0, span_ns, chunks)
    frames = []
    for cpu, core_runs in runs.groupby("cpu"):
        busy = intervals.covered_ns(intervals.union(core_runs), starts, ends)
        frames.append(
            pd.DataFrame(
                {
                    "cpu": cpu,
                    "chunk": np.arange(chunks),
                    "start": starts,
                    "end": ends,
                    "busy_pct": 100.0 * busy / np.maximum(ends - starts, 1),
                }
            )
        )
    return pd.concat(frames, ignore_index=True)[columns]


def core_summary(runs: pd.DataFrame, span_ns: int) -> pd.DataFrame:
    """Per core: busy time over the capture, and how many traced threads ran on it."""
    columns = ["cpu", "busy_ns", "busy_pct", "threads"]
    if runs.empty:
        return pd.DataFrame(columns=columns)
    rows = []
    for cpu, core_runs in runs.groupby("cpu"):
        merged = intervals.union(core_runs)
        busy = int((merged["end"] - merged["start"]).sum())
        rows.append(
            {
                "cpu": cpu,
                "busy_ns": busy,
                "busy_pct": 100.0 * busy / span_ns if span_ns else np.nan,
                "threads": core_runs["global_tid"].nunique(),
            }
        )
    return pd.DataFrame(rows, columns=columns)
