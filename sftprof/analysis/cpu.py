"""CPU-side analyses: OS-runtime calls, NVTX ranges, training steps and threads."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis import cuda, step_inference
from sftprof.analysis.sched import CoreUse
from sftprof.analysis.stats import finish_summary, grouped_summary
from sftprof.errors import SftprofError, shown
from sftprof.step_names import NUMBERED_RANGE, STEP_NUMBER, STEP_RANGE
from sftprof.trace.events import THREAD_IDS, sql_in
from sftprof.trace.tables import TraceTables

# nsys injects its own threads into the profiled process: "[NSys]", "[NSys Comms]", "*2CommsProcesso"...
PROFILER_THREAD = re.compile(r"^(\[NSys|\*\d)")
# The trainer's phase ranges inside each step (sftprof.capture.sft.torch_backend).
PHASES = ("data", "forward", "backward", "optimizer")
# The name of a thread that left events but has no ThreadNames row (e.g. a Python thread: CPython
# does not name OS threads).
UNNAMED_THREAD = "(unnamed)"


def osrt_summary(events) -> pd.DataFrame:
    """OS-runtime time by call, as `nsys stats -r osrtsum`: summed by the store."""
    return finish_summary(grouped_summary(events, "osrt", ["name"]), ["name"])


def _in_capture_sql(span_ns: int) -> str:
    """SQL: a call's time inside [0, span] (a call can start before the capture or end after it)."""
    return f'greatest(least("end", {int(span_ns)}) - greatest(start, 0), 0)' if span_ns else "duration"


def _osrt_by_thread_and_call(events, span_ns: int, threads=None) -> pd.DataFrame:
    """Per thread and OS-runtime call name (NULL: none), by global_tid and name: calls, and their time inside
    the capture (`in_capture`)."""
    where = sql_in("global_tid", threads) if threads is not None else "true"
    return events.query(f"""
        SELECT global_tid, name, count(*) AS calls, sum({_in_capture_sql(span_ns)})::BIGINT AS in_capture
        FROM osrt WHERE {where} GROUP BY ALL ORDER BY global_tid, name""")


def _osrt_threads(events) -> pd.DataFrame:
    """The threads that made OS-runtime calls (global_tid, pid, tid), in the order of their first call."""
    return events.query("""
        WITH firsts AS (SELECT global_tid, min(start) AS first FROM osrt_rows GROUP BY global_tid)
        SELECT r.global_tid, any_value((r.global_tid >> 24) & 16777215) AS pid, any_value(r.global_tid & 16777215) AS tid
        FROM osrt_rows r JOIN firsts f ON r.global_tid = f.global_tid AND r.start = f.first
        GROUP BY r.global_tid ORDER BY any_value(f.first), min(r."row")""")


def nvtx_summary(events) -> pd.DataFrame:
    """NVTX range time by name and style, as `nsys stats -r nvtxsum`: summed by the store, by their codes."""
    names, styles = events.nvtx_categories()  # an application's own names: each range may have one of its own
    summary = grouped_summary(events, "nvtx", ["name_id", "style_id"], coded=("name_id", len(names)))
    for column, categories in zip(("name", "style"), (names, styles), strict=True):
        codes = summary.pop(f"{column}_id").fillna(-1).to_numpy("int64")
        summary[column] = pd.Categorical.from_codes(codes, categories)
    return finish_summary(summary, ["name", "style"])


def marked_ranges(events, pattern: re.Pattern = STEP_RANGE) -> pd.DataFrame:
    """The NVTX ranges that the step analyses read, in tables.py's nvtx columns, with `step` (the step's
    number; NA for a phase): the step ranges (`pattern`) and the phases (PHASES), a few per step, where the
    store can hold millions of others (NeMo's emit_nvtx)."""
    names = pd.Series(events.nvtx_categories()[0], dtype=object).astype(str)
    wanted = np.flatnonzero(names.map(lambda name: bool(pattern.search(name))).to_numpy(bool) | names.isin(PHASES))
    ranges = events.nvtx_frame(sql_in("name_id", wanted))
    found = step_ranges(ranges, pattern)
    step = pd.Series(pd.NA, index=ranges.index, dtype="Int64")
    step[found.index] = found["step"].to_numpy("int64")
    return ranges.assign(step=step)


def nvtx_threads(events) -> pd.DataFrame:
    """Each thread with NVTX ranges: global_tid, pid, tid and how many ranges, in the order of its first range
    in the table (NVTX_ORDER). From the rows stored, as no name is needed (the nvtx view may map names)."""
    return events.query(f"""
        WITH firsts AS (SELECT global_tid, min(start) AS first, count(*) AS ranges FROM nvtx_rows GROUP BY global_tid)
        SELECT global_tid, {THREAD_IDS}, ranges FROM (
            SELECT n.global_tid, any_value(f.ranges) AS ranges, any_value(f.first) AS first, max(n."end") AS last
            FROM nvtx_rows n JOIN firsts f ON n.global_tid = f.global_tid AND n.start = f.first
            GROUP BY n.global_tid)
        ORDER BY first, last DESC, global_tid""")


def step_ranges(nvtx: pd.DataFrame, pattern: re.Pattern = STEP_RANGE) -> pd.DataFrame:
    """The NVTX ranges whose name holds a step number (`pattern`; marked_ranges' `step` where the frame has
    it), with it as `step`, matched once per distinct name used: a capture of NeMo's emit_nvtx holds
    millions of ranges, so nothing as long as the table is made but a mask. The pattern's first group that
    matches any name wins: `ProfilerStep#N` counts only where no name is `step N` (a loop with both marks
    the same steps twice)."""
    if "step" in nvtx.columns:
        return nvtx[nvtx["step"].notna()].astype({"step": "int64"})
    names = nvtx["name"]
    if isinstance(names.dtype, pd.CategoricalDtype):  # the loaders' names: codes, and each name once
        codes, distinct = names.cat.codes.to_numpy(), names.cat.categories
    else:
        codes, distinct = pd.factorize(names)
    used = np.zeros(len(distinct) + 1, dtype=bool)  # the last for code -1 (no name)
    used[codes] = True  # not a bincount: it counts in an int64 copy of the codes (60M ranges: +0.5 GB)
    used = used[:-1]
    match = pd.Series(np.asarray(distinct, dtype=object)[used], dtype=object).astype(str).str.extract(pattern)
    group = next((match[c] for c in match.columns if match[c].notna().any()), match[0])
    found = group.where(group.str.fullmatch(STEP_NUMBER, na=False)).astype("Int64")  # no number: no step
    if pattern is not STEP_RANGE and group.notna().any() and found.isna().all():
        example = group.dropna().iloc[0]
        raise SftprofError(
            f"step range pattern {shown(pattern.pattern)}: its group matched {shown(example, 40)} and no step "
            "number in any range name: put the group around the digits"
        )
    numbered = np.flatnonzero(used)[found.notna().to_numpy()]
    number = np.zeros(len(distinct), dtype="int64")
    number[numbered] = found.dropna().to_numpy("int64")
    has_step = np.zeros(len(distinct) + 1, dtype=bool)  # the last for code -1 (no name)
    has_step[numbered] = True
    rows = np.flatnonzero(has_step[codes])
    return nvtx.iloc[rows].assign(step=number[codes[rows]])


def numbered_steps(events) -> pd.DataFrame:
    """The ranges of the family of NUMBERED_RANGE names (one word, counted) that run one after another on a thread
    and count up by one there, with the number as `step`; of several such families, the one covering the most time
    (the outermost: iterations, not the micro-batches or layers inside them, which count again from 0 every step).
    Empty where there is none."""
    names = pd.Series(events.nvtx_categories()[0], dtype=object).astype(str)
    parts = names.str.extract(NUMBERED_RANGE)
    wanted = np.flatnonzero(parts[1].notna().to_numpy())
    empty = pd.DataFrame(columns=["start", "end", "duration", "name", "style", "global_tid", "pid", "tid", "step"])
    if not len(wanted):
        return empty
    ranges = events.nvtx_frame(sql_in("name_id", wanted))
    labels = ranges["name"].astype(str)
    family = labels.map(dict(zip(names.iloc[wanted], parts[0].iloc[wanted].str.lower(), strict=True)))
    number = labels.map(dict(zip(names.iloc[wanted], parts[1].iloc[wanted].astype("int64"), strict=True)))
    best, covered = empty, 0
    for _, rows in ranges.assign(step=number).groupby([family, ranges["global_tid"]], sort=False):
        rows = rows.sort_values("start")
        in_order = (np.diff(rows["step"].to_numpy("int64")) == 1).all()
        apart = (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1]).all()
        if len(rows) >= 2 and in_order and apart and int(rows["duration"].sum()) > covered:
            best, covered = rows, int(rows["duration"].sum())
    return best


def one_timeline(steps: pd.DataFrame) -> pd.DataFrame:
    """Step ranges that do not overlap, as the gains' step windows must not: where several threads mark the
    steps (ranks of one capture, or a loop and its helper) one thread's, the one with the most (the first to
    start on a tie); and of ranges nested on that thread (`step 3` around `train_step 3`), the outermost."""
    if len(steps) < 2:
        return steps
    if steps["global_tid"].nunique() > 1:
        counts = steps.groupby("global_tid")["start"].agg(["size", "min"])
        thread = counts.sort_values(["size", "min"], ascending=[False, True]).index[0]
        steps = steps[steps["global_tid"] == thread]
    ordered = steps.sort_values(["start", "end"], ascending=[True, False])
    ends = ordered["end"].to_numpy()
    reached = np.maximum.accumulate(ends)
    outermost = np.r_[True, ordered["start"].to_numpy()[1:] >= reached[:-1]]
    return ordered[outermost]


def step_table(nvtx: pd.DataFrame, pattern: re.Pattern = STEP_RANGE) -> pd.DataFrame:
    """One row per step range (step_ranges, on one timeline: one_timeline), with the time of each phase range
    nested inside it."""
    steps = one_timeline(step_ranges(nvtx, pattern))
    columns = ["step", "start", "end", "duration", *(f"{phase}_ns" for phase in PHASES), "other_ns"]
    if steps.empty:
        return pd.DataFrame(columns=columns)
    steps = steps.sort_values("start").reset_index(drop=True)
    phases = nvtx[nvtx["name"].isin(PHASES)]
    # Each phase range belongs to the step range, on its thread, that contains it (steps do not overlap).
    phase_ns = pd.DataFrame(0, index=steps.index, columns=list(PHASES))
    for tid, thread_steps in steps.groupby("global_tid"):
        thread_phases = phases[phases["global_tid"] == tid]
        step_starts = thread_steps["start"].to_numpy()
        at = np.searchsorted(step_starts, thread_phases["start"].to_numpy(), side="right") - 1
        inside = (at >= 0) & (thread_phases["end"].to_numpy() <= thread_steps["end"].to_numpy()[np.maximum(at, 0)])
        owner = thread_steps.index.to_numpy()[at[inside]]
        sums = thread_phases[inside].groupby([owner, thread_phases.loc[inside, "name"].to_numpy()])["duration"].sum()
        phase_ns = phase_ns.add(sums.unstack(fill_value=0).reindex(columns=list(PHASES), fill_value=0), fill_value=0)
    frame = steps[["step", "start", "end", "duration"]].copy()
    for phase in PHASES:
        frame[f"{phase}_ns"] = phase_ns[phase].astype("int64")
    frame["other_ns"] = frame["duration"] - phase_ns.sum(axis=1)
    return frame[columns]


@dataclass(frozen=True)
class FoundSteps:
    """The steps of a capture (step_table's columns) and how they were found, for the report."""

    table: pd.DataFrame
    how: str


def training_steps(marked: pd.DataFrame, events) -> FoundSteps:
    """The step ranges (marked_ranges' `step`); where there are none, the steps the GPU timeline repeats
    (step_inference: a stock Hugging Face, Lightning or Megatron loop names no steps); else none, and
    every gain is a share of the whole capture."""
    table = step_table(marked)
    if len(table):
        ranges = step_ranges(marked)
        how = f"{len(table)} NVTX step ranges (named like {str(ranges['name'].iloc[0])!r})"
        if len(ranges) > len(table):
            kept = one_timeline(ranges).iloc[0]
            how += (
                f"; {len(ranges)} matched on {ranges['global_tid'].nunique()} thread(s), overlapping: the outermost "
                f"on pid {kept['pid']} tid {kept['tid']}"
            )
        return FoundSteps(table, how)
    inferred = step_inference.infer_steps(events)
    if inferred is None:
        numbered = numbered_steps(events)
        if len(numbered) < 2:
            return FoundSteps(table, "no step ranges and no repeating kernel sequence: the capture counts as one step")
        phases = marked[marked["name"].isin(PHASES)]  # marked_ranges' phases: step NA
        table = step_table(pd.concat([numbered, phases], ignore_index=True).astype({"step": "Int64"}))
        how = (
            f"{len(table)} NVTX ranges numbered one after another (named like {str(numbered['name'].iloc[0])!r}), "
            "taken as the steps: no range has a step's name and the GPU timeline does not repeat "
            "(--step-range picks others)"
        )
        return FoundSteps(table, how)
    found = inferred.table[["step", "start", "end", "duration"]].copy()
    for phase in PHASES:
        found[f"{phase}_ns"] = 0
    found["other_ns"] = found["duration"]
    return FoundSteps(found, inferred.how)


def found_table(found: FoundSteps) -> pd.DataFrame:
    """One row per step (training_steps): from its range, or inferred, with its phases' CPU time."""
    return found.table


def phase_ranges(nvtx: pd.DataFrame) -> pd.DataFrame:
    """The individual phase ranges (data/forward/backward/optimizer), in time order."""
    phases = nvtx[nvtx["name"].isin(PHASES)]
    return phases[["name", "start", "end", "duration", "tid"]].sort_values("start").reset_index(drop=True)


def application_pids(tables, api_threads: pd.DataFrame) -> set[int]:
    """Processes that emitted trace events (the profiled program), not nsys or the system.
    `api_threads`: cuda.calls_by_thread."""
    pids = set(api_threads["pid"].dropna().astype(int))
    for frame in (nvtx_threads(tables.events), _osrt_threads(tables.events)):
        pids.update(int(pid) for pid in frame["pid"].unique())
    return pids


AUTOGRAD_ROLE = "autograd"  # PyTorch's backward-pass threads (pt_autograd_*)


def thread_role(pid: int, tid: int, name: str) -> str:
    """The training threads users ask about: the process's main thread and PyTorch's autograd workers."""
    if pid == tid:
        return "main"
    if str(name).startswith("pt_autograd"):
        return AUTOGRAD_ROLE
    return ""


def _sched_threads(events) -> pd.DataFrame:
    """The threads the context switches name, in the order they first appear."""
    return events.query(
        "SELECT global_tid, pid, tid FROM sched GROUP BY global_tid, pid, tid ORDER BY min(start), global_tid"
    )


def application_threads(tables, api_threads: pd.DataFrame) -> pd.DataFrame:
    """The profiled program's threads: named ones (ThreadNames) and those that only left events,
    without nsys's own threads. `api_threads`: cuda.calls_by_thread."""
    pids = application_pids(tables, api_threads)
    named = tables.threads[tables.threads["pid"].isin(pids)][["global_tid", "pid", "tid", "thread_name"]]
    # each table's threads first: NVTX alone can hold 60M rows (emit_nvtx)
    seen = pd.concat(
        [
            frame[["global_tid", "pid", "tid"]].drop_duplicates("global_tid")
            for frame in (
                _osrt_threads(tables.events),
                api_threads,
                nvtx_threads(tables.events),
                _sched_threads(tables.events),
            )
        ]
    )
    seen = seen[seen["pid"].isin(pids)]
    unnamed = seen[~seen["global_tid"].isin(named["global_tid"])].drop_duplicates("global_tid")
    threads = pd.concat([named, unnamed.assign(thread_name=UNNAMED_THREAD)], ignore_index=True)
    return threads[~threads["thread_name"].astype(str).str.match(PROFILER_THREAD)].reset_index(drop=True)


def thread_summary(tables, waits: cuda.WaitCalls, api_threads: pd.DataFrame) -> pd.DataFrame:
    """Per application thread: OS-runtime time inside the capture, the call it blocks in most,
    CUDA API and NVTX activity, and the time it waited for the GPU in synchronizing CUDA calls
    (`waits`: cuda.host_wait_calls; `api_threads`: cuda.calls_by_thread)."""
    threads = application_threads(tables, api_threads)
    by_call = _osrt_by_thread_and_call(tables.events, tables.span_ns, threads["global_tid"])
    gpu_wait = cuda.waited_by_thread(tables.events, waits)
    api_by_tid = api_threads.set_index("global_tid")[["calls", "total_ns"]]
    nvtx_by_tid = nvtx_threads(tables.events).set_index("global_tid")["ranges"]
    # each thread's figures looked up once, not a filter of every thread's rows per thread: 10k threads took 4.4 s
    osrt = by_call.groupby("global_tid")[["calls", "in_capture"]].sum()
    top = (  # the call a thread spent most time in, ties to the first name
        by_call[by_call["name"].notna()]
        .sort_values(["global_tid", "in_capture", "name"], ascending=[True, False, True], kind="stable")
        .drop_duplicates("global_tid")
        .set_index("global_tid")
    )
    tid = threads["global_tid"]

    def per_thread(values: pd.Series) -> list[int]:
        """Each thread's value in `values` (indexed by global_tid), 0 where it has none."""
        return [0 if pd.isna(value) else int(value) for value in tid.map(values)]

    waited = [int(gpu_wait.get(thread, 0)) for thread in tid]
    rows = {
        "global_tid": tid.tolist(),
        "pid": threads["pid"].tolist(),
        "tid": threads["tid"].tolist(),
        "thread_name": threads["thread_name"].tolist(),
        "role": [thread_role(*thread) for thread in zip(threads["pid"], threads["tid"], threads["thread_name"])],
        "osrt_calls": per_thread(osrt["calls"]),
        "osrt_ns": per_thread(osrt["in_capture"]),
        "top_osrt_call": ["" if pd.isna(name) else name for name in tid.map(top["name"])],
        "top_osrt_ns": per_thread(top["in_capture"]),
        "cuda_api_calls": per_thread(api_by_tid["calls"]),
        "cuda_api_ns": per_thread(api_by_tid["total_ns"]),
        "gpu_wait_ns": waited,
        "gpu_wait_pct": [100.0 * value / tables.span_ns if tables.span_ns else 0.0 for value in waited],
        "nvtx_ranges": per_thread(nvtx_by_tid),
    }
    columns = [
        "global_tid",
        "pid",
        "tid",
        "thread_name",
        "role",
        "osrt_calls",
        "osrt_ns",
        "top_osrt_call",
        "top_osrt_ns",
        "cuda_api_calls",
        "cuda_api_ns",
        "gpu_wait_ns",
        "gpu_wait_pct",
        "nvtx_ranges",
    ]
    frame = pd.DataFrame(rows, columns=columns)
    return frame.sort_values(["osrt_ns", "nvtx_ranges"], ascending=False).reset_index(drop=True)


def thread_labels(threads: pd.DataFrame) -> dict:
    """global_tid -> "python3 (main, tid 496)": how findings and tables name a thread."""
    return {
        row.global_tid: f"{row.thread_name} ({row.role + ', ' if row.role else ''}tid {row.tid})"
        for row in threads.itertuples()
    }


def feeders(labels: dict, api_threads: pd.DataFrame) -> dict:
    """The labelled threads that launch GPU work (`api_threads`: cuda.calls_by_thread)."""
    launching = set(api_threads["global_tid"])
    return {tid: label for tid, label in labels.items() if tid in launching}


def thread_osrt(tables, threads: pd.DataFrame) -> pd.DataFrame:
    """Per application thread and OS-runtime call: calls and time inside the capture (long table)."""
    columns = ["thread", "role", "tid", "call", "calls", "total_ns", "capture_pct"]
    frame = _osrt_by_thread_and_call(tables.events, tables.span_ns, threads["global_tid"])
    if frame.empty:
        return pd.DataFrame(columns=columns)
    frame = frame[frame["name"].notna()].rename(columns={"in_capture": "total_ns"}).reset_index(drop=True)
    info = threads.set_index("global_tid")
    labels = thread_labels(threads)
    frame = frame.assign(
        thread=frame["global_tid"].map(labels),
        role=frame["global_tid"].map(info["role"]),
        tid=frame["global_tid"].map(info["tid"]),
        call=frame["name"],
        capture_pct=100.0 * frame["total_ns"] / tables.span_ns if tables.span_ns else float("nan"),
    )
    return frame[columns].sort_values(["total_ns", "thread"], ascending=[False, True]).reset_index(drop=True)


def thread_states(
    threads: pd.DataFrame, running: pd.Series, span_ns: int, sched_traced: bool, cuda_traced: bool
) -> pd.DataFrame:
    """Per application thread, shares of the capture: running on a core (`running`: time on a core by
    global_tid, sched.core_use; needs CPU scheduling data),
    inside OS-runtime calls, and waiting for the GPU in CUDA calls (needs CUDA tracing); NaN where
    not traced. They can overlap (a thread spinning in cudaStreamSynchronize is running), so they
    are not stacked."""
    columns = ["thread", "role", "running_pct", "os_calls_pct", "gpu_wait_pct"]
    if threads.empty or not span_ns:
        return pd.DataFrame(columns=columns)
    labels = thread_labels(threads)
    frame = pd.DataFrame(
        {
            "thread": threads["global_tid"].map(labels),
            "role": threads["role"],
            "running_pct": (100.0 * threads["global_tid"].map(running).fillna(0) / span_ns)
            if sched_traced
            else float("nan"),
            "os_calls_pct": 100.0 * threads["osrt_ns"] / span_ns,
            "gpu_wait_pct": threads["gpu_wait_pct"] if cuda_traced else float("nan"),
        }
    )
    active = (frame[["running_pct", "os_calls_pct", "gpu_wait_pct"]].fillna(0) > 0).any(axis=1) | (frame["role"] != "")
    return frame[active][columns].reset_index(drop=True)


def thread_state_table(
    threads: pd.DataFrame, use: CoreUse, tables: TraceTables, sched_traced: bool, cuda_api: pd.DataFrame
) -> pd.DataFrame:
    """thread_states, CUDA counted as traced where it was asked for or any CUDA call was recorded."""
    cuda_traced = "cuda" in tables.sources or not cuda_api.empty
    return thread_states(threads, use.running, tables.span_ns, sched_traced, cuda_traced)
