"""Expert rules: each looks for one known performance problem and returns a finding with the
numbers behind it and what to do, or nothing when the trace holds no evidence of the problem.

Severity: a problem whose cost reaches WARNING_SHARE_PCT of the time it is measured against
(the capture, the steps, the GPU's active span) is a warning; a smaller one is still reported,
as info, when the evidence is there, so that a reader knows it was looked for and what it costs.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sftprof.analysis import intervals
from sftprof.analysis.boundness import DOMINANT_SHARE_PCT
from sftprof.analysis.cpu import PHASES
from sftprof.analysis.cuda import ASYNC_MEMCPY_CALL, SYNC_MEMCPY_CALL, SYNC_MEMSET_CALL
from sftprof.analysis.findings import Finding
from sftprof.analysis.gpu import TINY_KERNEL_NS
from sftprof.analysis.kernels import HALF_PRECISIONS, MEMORY_BOUND_FAMILIES
from sftprof.analysis.memory import INTERCONNECT_LIMIT_PCT, MEGABYTE, PAGEABLE
from sftprof.analysis.nvtx import innermost_ranges
from sftprof.analysis.sched import CPU_SCHED_SWITCH
from sftprof.analysis.utilisation import IDLE_GAP_NS, LOW_UTILISATION_PCT, OWN_CODE
from sftprof.trace.events import MAX_TIME_NS

WARNING_SHARE_PCT = 5.0
STEPS_LISTED = 10  # evidence names steps one by one up to this many (long captures have thousands)
# nsys's cuda_memcpy_sync rule skips HtoD copies up to this size: the driver returns before they finish.
SMALL_SYNC_HTOD_BYTES = 64_000
# Memsets that block the host: on pinned or managed memory (device-memory memsets run asynchronously).
HOST_BLOCKING_MEMSET_KINDS = ("Pinned", "Managed")
# Loading data for longer than this share of the step starves the GPU (and the CPU-side model code).
DATA_STALL_PCT = 10.0
# OS calls in which a thread waits for a lock held by another thread. CPython's threading.Lock
# and queue.Queue block in sem_wait/sem_clockwait/sem_timedwait; C++ code in pthread_mutex_lock.
LOCK_WAIT_CALLS = {"pthread_mutex_lock", "pthread_mutex_timedlock", "pthread_rwlock_rdlock", "pthread_rwlock_wrlock",
                   "pthread_rwlock_timedrdlock", "pthread_rwlock_timedwrlock", "pthread_spin_lock", "sem_wait",
                   "sem_timedwait", "sem_clockwait"}
DATA_PHASE = PHASES[0]
# Launch-bound needs most kernels to be tiny (TINY_KERNEL_NS), not a few.
LAUNCH_BOUND_TINY_PCT = 50.0


def _ms(ns) -> str:
    return f"{ns / 1e6:,.3f} ms"


def _pct(part, whole) -> float:
    return 100.0 * part / whole if whole else 0.0


def _severity(cost_pct: float) -> str:
    return "warning" if cost_pct >= WARNING_SHARE_PCT else "info"


def _where(nvtx: pd.DataFrame, calls: pd.DataFrame) -> str:
    """ "mostly in NVTX `data` (18 of 18)": the innermost ranges that calls (global_tid, start, end) were made in."""
    ranges = innermost_ranges(nvtx, calls)
    if ranges.empty:
        return "outside NVTX ranges"
    names = nvtx.loc[ranges.to_numpy(), "name"].value_counts()
    return f"mostly in NVTX `{names.index[0]}` ({names.iloc[0]} of {len(calls)})"


def _api_spans(ops: pd.DataFrame) -> pd.DataFrame:
    """The API calls of GPU operations joined to them (cuda.with_api_calls), as (global_tid, start, end)."""
    return ops[["global_tid", "api_start", "api_end"]].set_axis(["global_tid", "start", "end"], axis=1)


def _api_named(ops: pd.DataFrame, pattern: re.Pattern) -> pd.Series:
    """Which rows' `api` matches `pattern`, tested once per distinct name: a long capture has hundreds of
    thousands of memory operations and a handful of API names."""
    return ops["api"].isin([name for name in ops["api"].unique() if pattern.search(name)])


def _threads(calls: pd.DataFrame, labels: dict) -> str:
    return ", ".join(sorted({labels.get(tid, f"tid {int(tid) & 0xFFFFFF}") for tid in calls["global_tid"]}))


# ---------------------------------------------------------------- the trace itself

def dropped_rows(dropped: dict[str, int]) -> list[Finding]:
    """Rows the loader left out (TraceTables.dropped_rows), named once: every number computed without them."""
    if not dropped:
        return []
    parts = ", ".join(f"{table} {rows:,}" for table, rows in sorted(dropped.items()))
    return [Finding(
        "dropped_rows", "warning", f"{sum(dropped.values()):,} trace rows left out as damaged",
        f"Left out, by table: {parts}. A start or end time is missing, the end comes before the start, a time "
        f"lies beyond ±{MAX_TIME_NS / 86_400e9:.0f} days, or a field has the wrong type. Every number in this "
        "report is computed without them.",
        "The trace file was damaged or edited: export or record it again.")]


# ---------------------------------------------------------------- memory copies and sets

def sync_memcpy(copies: pd.DataFrame, span_ns: int, labels: dict, nvtx: pd.DataFrame) -> list[Finding]:
    """Host<->device copies through the synchronous cudaMemcpy API (copies joined to their API call)."""
    sync = copies[_api_named(copies, SYNC_MEMCPY_CALL) & copies["copy_kind"].isin(["HtoD", "DtoH"])]
    sync = sync[~((sync["copy_kind"] == "HtoD") & (sync["bytes"] <= SMALL_SYNC_HTOD_BYTES))]
    if sync.empty:
        return []
    blocked = int(sync["api_duration"].sum())
    kinds = ", ".join(f"{n} {kind}" for kind, n in sync["copy_kind"].value_counts().items())
    return [Finding(
        "sync_memcpy", _severity(_pct(blocked, span_ns)),
        f"{len(sync)} synchronous cudaMemcpy calls block the CPU for {_ms(blocked)}",
        f"{kinds} copies ({sync['bytes'].sum() / MEGABYTE:,.3f} MB) were issued with "
        f"{', '.join(sorted(set(sync['api'])))}, not an Async call: {_threads(sync, labels)} waited {_ms(blocked)} "
        f"in them ({_pct(blocked, span_ns):.1f}% of the capture), {_where(nvtx, _api_spans(sync))}. HtoD copies of at most "
        f"{SMALL_SYNC_HTOD_BYTES:,} bytes are left out, as in nsys's cuda_memcpy_sync rule: they return early.",
        "Copy with cudaMemcpyAsync from pinned memory and synchronize only where the data is needed (PyTorch: "
        "DataLoader(pin_memory=True), tensor.to('cuda', non_blocking=True); read results with one .item() or "
        ".cpu() per logging interval, not per step).")]


def pageable_memcpy(copies: pd.DataFrame, span_ns: int, labels: dict, nvtx: pd.DataFrame) -> list[Finding]:
    """cudaMemcpyAsync from or to pageable host memory: staged through a pinned buffer, so not asynchronous."""
    pageable = copies[_api_named(copies, ASYNC_MEMCPY_CALL)
                      & ((copies["src_kind"] == PAGEABLE) | (copies["dst_kind"] == PAGEABLE))]
    if pageable.empty:
        return []
    api_ns = int(pageable["api_duration"].sum())
    sizes = ", ".join(f"{n} {kind}" for kind, n in pageable["copy_kind"].value_counts().items())
    return [Finding(
        "pageable_memcpy", _severity(_pct(api_ns, span_ns)),
        f"{len(pageable)} asynchronous copies use pageable host memory, so they are not asynchronous",
        f"{sizes} copies ({pageable['bytes'].sum() / MEGABYTE:,.3f} MB, median {pageable['bytes'].median():,.0f} B) "
        f"read or write pageable memory: the driver stages them through a pinned buffer while the CPU waits. "
        f"Their API calls took {_ms(api_ns)} on {_threads(pageable, labels)} ({_pct(api_ns, span_ns):.2f}% of the "
        f"capture), {_where(nvtx, _api_spans(pageable))}.",
        "Pin the host buffers: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to('cuda', "
        "non_blocking=True), so the copy overlaps GPU work instead of holding the CPU.")]


def sync_memset(sets: pd.DataFrame, span_ns: int, labels: dict) -> list[Finding]:
    """cudaMemset (not Async) on pinned or managed memory, which blocks the host."""
    blocking = sets[_api_named(sets, SYNC_MEMSET_CALL) & sets["dst_kind"].isin(HOST_BLOCKING_MEMSET_KINDS)]
    if blocking.empty:
        return []
    blocked = int(blocking["api_duration"].sum())
    return [Finding(
        "sync_memset", _severity(_pct(blocked, span_ns)),
        f"{len(blocking)} synchronous cudaMemset calls on host-visible memory block the CPU for {_ms(blocked)}",
        f"{', '.join(sorted(set(blocking['api'])))} on {', '.join(sorted(set(blocking['dst_kind'])))} memory "
        f"({blocking['bytes'].sum() / MEGABYTE:,.3f} MB) by {_threads(blocking, labels)}: "
        f"{_pct(blocked, span_ns):.2f}% of the capture.",
        "Use cudaMemsetAsync on a stream, or clear device memory instead of pinned/managed memory.")]


def interconnect(kind_share: pd.DataFrame, host_memory: pd.DataFrame, crossing: dict,
                 gpu_ns: int) -> list[Finding]:
    """The interconnect verdict: do host<->device and peer copies take a share of GPU time that matters?"""
    if kind_share.empty:
        return []
    limits = crossing["gpu_time_pct"] >= INTERCONNECT_LIMIT_PCT
    parts = "; ".join(f"{r.copy_kind} {r.gpu_time_pct:.2f}% ({r.instances} ops, {r.bytes / MEGABYTE:,.3f} MB"
                      + (f", {r.gb_per_s:,.1f} GB/s" if r.bytes >= MEGABYTE else "") + ")"
                      for r in kind_share.itertuples())
    host_copies = host_memory["instances"].sum()
    pageable = host_memory.loc[host_memory["host_memory"] == PAGEABLE, "instances"].sum()
    return [Finding(
        "interconnect", "warning" if limits else "info",
        f"Host-device and peer copies are {crossing['gpu_time_pct']:.2f}% of GPU time: the interconnect "
        + ("can limit the step" if limits else "is not the limit"),
        f"Shares of the {_ms(gpu_ns)} of GPU time (kernels + memory operations): {parts}. Crossing PCIe/NVLink: "
        f"{crossing['count']} copies, {crossing['bytes'] / MEGABYTE:,.3f} MB, {_ms(crossing['ns'])}; "
        f"{pageable} of {host_copies} host copies use pageable memory.",
        "Overlap transfers with compute (pinned memory, non_blocking copies on a side stream, prefetch the next "
        "batch) or move less (keep tensors on the GPU, offload less)." if limits else "")]


# ---------------------------------------------------------------- synchronization in the loop

def _step_of(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step number each time falls in, or -1 outside every step (steps are disjoint)."""
    starts, ends = steps["start"].to_numpy(), steps["end"].to_numpy()
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times <= ends[np.maximum(index, 0)])
    return np.where(inside, steps["step"].to_numpy()[np.maximum(index, 0)], -1)


def syncs_in_steps(waits: pd.DataFrame, steps: pd.DataFrame, labels: dict, nvtx: pd.DataFrame) -> list[Finding]:
    """CUDA calls that make the CPU wait for the GPU (`waits`: cuda.host_wait_calls), inside the
    `step N` ranges, per step."""
    if steps.empty or waits.empty:
        return []
    steps = steps.sort_values("start")
    waits = waits.assign(step=_step_of(waits["start"].to_numpy(), steps))
    waits = waits[waits["step"] >= 0]
    if waits.empty:
        return []
    per_step = waits.groupby("step")["duration"].agg(["count", "sum"])
    blocked, step_ns = int(waits["duration"].sum()), int(steps["duration"].sum())
    calls = ", ".join(f"{name} x{n}" for name, n in waits["name"].value_counts().items())
    listed = "; ".join(f"step {step}: {int(r['count'])} calls, {_ms(r['sum'])}"
                       for step, r in per_step.head(STEPS_LISTED).iterrows())
    if len(per_step) > STEPS_LISTED:
        listed += f"; and {len(per_step) - STEPS_LISTED:,} more steps"
    return [Finding(
        "sync_in_steps", _severity(_pct(blocked, step_ns)),
        f"{len(waits) / len(steps):.0f} synchronizing CUDA calls per step block the CPU "
        f"{_ms(blocked / len(steps))} per step ({_pct(blocked, step_ns):.1f}% of step time)",
        f"Inside the step ranges: {listed}. Calls: {calls}, on {_threads(waits, labels)}, {_where(nvtx, waits)}.",
        "Each synchronization drains the GPU queue, so the CPU cannot run ahead of the GPU: drop per-step "
        ".item()/.cpu()/print of GPU values (accumulate the loss on the GPU and read it every N steps), avoid "
        "torch.cuda.synchronize() in the loop, and use non_blocking copies.")]


# ---------------------------------------------------------------- GPU utilisation

def idle_gaps(gaps: pd.DataFrame, causes: pd.DataFrame, busy: pd.DataFrame) -> list[Finding]:
    """GPU gaps longer than IDLE_GAP_NS, with what the CPU threads did during the longest."""
    if gaps.empty:
        return []
    spans = busy.set_index("device_id")["span_ns"]
    devices = []
    for device, device_gaps in gaps.groupby("device_id"):
        share = _pct(device_gaps["duration"].sum(), spans.get(device, 0))
        devices.append((share, f"GPU {device}: {len(device_gaps)} gaps, {_ms(device_gaps['duration'].sum())} "
                               f"({share:.1f}% of its active span)"))
    worst_share = max(share for share, _ in devices)
    longest = gaps.iloc[0]
    first = causes[causes["gap"] == 1]
    explained = []
    for row in first.head(6).itertuples():
        what = (f"in its own code in NVTX `{row.name}`" if row.source == OWN_CODE else
                f"in NVTX `{row.name}`" if row.source == "NVTX range" else f"in {row.name} ({row.source})")
        explained.append(f"{row.thread} {what} for {_ms(row.overlap_ns)}")
    own_code = first[first["source"] == OWN_CODE]
    # Own code for at least half the longest gap: the CPU was busy, not blocked.
    advice = ("The threads that feed the GPU were running their own code (Python) rather than waiting in a call: "
              "move that work off the critical path (prefetch the next batch during the step, a fused optimizer, "
              "fewer Python-side ops between launches) or capture the step in a CUDA graph."
              if not own_code.empty and own_code["overlap_ns"].max() >= 0.5 * longest["duration"] else
              "Remove the blocking calls listed from the training loop, or overlap them with GPU work.")
    return [Finding(
        "gpu_idle_gaps", _severity(worst_share),
        f"{len(gaps)} GPU idle gaps over {IDLE_GAP_NS / 1e6:g} ms, {_ms(gaps['duration'].sum())} in all",
        "; ".join(text for _, text in devices) + f". Longest {_ms(longest['duration'])} at "
        f"{longest['start'] / 1e6:,.3f} ms: " + ("; ".join(explained) or "no traced CPU activity") + ".",
        advice)]


def launch_bound(kernels: dict, launch: pd.DataFrame, busy: pd.DataFrame, timeline: pd.DataFrame,
                 gaps: pd.DataFrame, steps: pd.DataFrame) -> list[Finding]:
    """Many tiny kernels while the GPU is mostly idle: the CPU cannot launch work fast enough.
    `kernels`: gpu.kernel_totals."""
    if not kernels["count"] or busy.empty:
        return []
    tiny_pct = _pct(kernels["tiny"], kernels["count"])
    busy_pct = _pct(busy["busy_ns"].sum(), busy["span_ns"].sum())
    if busy_pct >= LOW_UTILISATION_PCT or tiny_pct < LAUNCH_BOUND_TINY_PCT:
        return []
    low_chunks = int((timeline["busy_pct"] < LOW_UTILISATION_PCT).sum())
    in_gaps = _pct(gaps["duration"].sum(), busy["span_ns"].sum() - busy["busy_ns"].sum())
    median_ns = kernels["median_ns"]
    launch_cost = ""
    if not launch.empty:
        usual = launch.sort_values("instances").iloc[-1]
        launch_cost = (f"; a launch costs the CPU {usual['med_ns'] / 1e3:.1f} µs (median {usual['name']}, "
                       f"{usual['instances']:,} calls)"
                       + (", so the GPU finishes a typical kernel before the CPU has issued the next"
                          if usual["med_ns"] > median_ns else ""))
    per_step = f" {kernels['count'] / len(steps):,.0f} kernels per step." if len(steps) else ""
    return [Finding(
        "launch_bound", "warning",
        f"Launch-bound: {tiny_pct:.0f}% of kernels run under {TINY_KERNEL_NS / 1e3:g} µs and the GPU is busy "
        f"{busy_pct:.1f}% of its span",
        f"{kernels['count']:,} kernels, median {median_ns / 1e3:.1f} µs{launch_cost}. {low_chunks} of {len(timeline)} "
        f"time chunks are "
        f"under {LOW_UTILISATION_PCT:.0f}% busy, and only {in_gaps:.0f}% of the idle time is in gaps over "
        f"{IDLE_GAP_NS / 1e6:g} ms: the rest is short waits between kernels.{per_step}",
        "Cut the CPU cost per unit of GPU work: capture the step in CUDA graphs (torch.compile(mode="
        "'reduce-overhead'), torch.cuda.graphs), fuse small ops (torch.compile), use a fused optimizer "
        "(AdamW(fused=True)), and give each kernel more work (larger micro-batch or sequence length, fewer "
        "accumulation steps).")]


# ---------------------------------------------------------------- kernel mix and precision

def memory_bound_mix(families: pd.DataFrame, mix: dict, busy_pct: float | None) -> list[Finding]:
    """Streaming kernels dominate kernel time: bandwidth, not math, bounds the GPU's work."""
    if families.empty or mix["memory_pct"] < DOMINANT_SHARE_PCT:
        return []
    streaming = families[families["family"].isin(MEMORY_BOUND_FAMILIES)]
    parts = ", ".join(f"{r.family} {r.time_pct:.1f}% (top: {r.top_kernel})" for r in streaming.itertuples())
    gpu_matters = busy_pct is not None and busy_pct >= LOW_UTILISATION_PCT
    idle = (f" The GPU is busy only {busy_pct:.1f}% of its span, so this matters once the host keeps it fed."
            if busy_pct is not None and not gpu_matters else "")
    return [Finding(
        "memory_bound_kernel_mix", "warning" if gpu_matters else "info",
        f"{mix['memory_pct']:.1f}% of kernel time is in memory-bound streaming kernels",
        f"{parts}; GEMM/attention {mix['compute_pct']:.1f}%, tensor cores {mix['tensor_core_pct']:.1f}% of kernel "
        f"time.{idle}",
        "Fuse elementwise chains (torch.compile; fused RMSNorm/rotary/SwiGLU kernels such as Liger's), use a fused "
        "optimizer (AdamW(fused=True)), keep activations in bf16, and grow the work per kernel (hidden size, "
        "batch) to raise arithmetic intensity.")]


# Share of GEMM time (%) that names must show as fp32/tf32 before fp32_gemm speaks.
FP32_GEMM_MIN_PCT = 50.0


def fp32_gemm(precision: pd.DataFrame) -> list[Finding]:
    """Most GEMM time in fp32/tf32 and no bf16/fp16/fp8 GEMM in the capture: mixed precision is off."""
    if precision.empty or precision["precision"].isin(HALF_PRECISIONS).any():
        return []
    full = precision[precision["precision"].isin(["fp32", "tf32"])]
    # cuBLASLt's nvjet names carry no precision: a few fp32 GEMMs (an fp32 head, say) beside
    # many such kernels are no evidence that mixed precision is off.
    if full.empty or full["time_pct"].sum() < FP32_GEMM_MIN_PCT:
        return []
    parts = ", ".join(f"{r.precision} {r.time_pct:.1f}% of GEMM time ({r.instances} kernels)" for r in full.itertuples())
    return [Finding(
        "fp32_gemm", "warning", "GEMMs run in fp32: no bf16, fp16 or fp8 GEMM in the capture",
        f"By kernel name: {parts}; e.g. {full.iloc[0]['top_kernel'][:120]}.",
        "Train in mixed precision: torch.autocast('cuda', dtype=torch.bfloat16) or bf16 weights; FP8 with "
        "Transformer Engine on Hopper; at the least allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True).")]


# ---------------------------------------------------------------- CPU side

def data_stall(steps: pd.DataFrame, nvtx: pd.DataFrame, osrt: pd.DataFrame, gpu_busy: pd.DataFrame,
               labels: dict) -> list[Finding]:
    """The `data` phase takes a large share of the step: the input pipeline starves the training loop.
    `gpu_busy`: when any GPU ran anything (gpu.all_devices_busy)."""
    if steps.empty:
        return []
    step_ns, data_ns = int(steps["duration"].sum()), int(steps[f"{DATA_PHASE}_ns"].sum())
    share = _pct(data_ns, step_ns)
    if share < DATA_STALL_PCT:
        return []
    data = nvtx[nvtx["name"] == DATA_PHASE]
    merged = intervals.union(data)
    calls = osrt[osrt["global_tid"].isin(data["global_tid"])]
    calls = calls.assign(inside=intervals.covered_ns(merged, calls["start"], calls["end"]))
    calls = calls[calls["inside"] > 0]
    in_calls = int(intervals.covered_ns(intervals.union(calls), merged["start"], merged["end"]).sum())
    top = calls.groupby("name")["inside"].agg(["count", "sum"]).sort_values("sum", ascending=False).head(3)
    doing = ", ".join(f"{name} {_ms(r['sum'])} ({int(r['count'])} calls)" for name, r in top.iterrows())
    gpu = ""
    if not gpu_busy.empty:
        busy_ns = intervals.covered_ns(gpu_busy, merged["start"], merged["end"]).sum()
        gpu = f" The GPU was busy {_pct(busy_ns, data_ns):.1f}% of that time."
    threads = ", ".join(sorted({labels.get(t, f"tid {int(t) & 0xFFFFFF}") for t in data["global_tid"]}))
    return [Finding(
        "data_stall", "warning",
        f"Data loading takes {share:.1f}% of step time: the input pipeline starves the training loop",
        f"NVTX `{DATA_PHASE}` ranges on {threads}: {_ms(data_ns)} of {_ms(step_ns)} in {len(steps)} steps "
        f"({_ms(data_ns / len(steps))} per step). Inside them: "
        + (f"{doing}; " if doing else "no OS-runtime calls; ")
        + f"{_ms(data_ns - in_calls)} in the thread's own code.{gpu}",
        "Prepare batches ahead of the step: DataLoader(num_workers>0, prefetch_factor, persistent_workers=True, "
        "pin_memory=True), pre-tokenize the dataset, and keep file or network reads and sleeps/retries off the "
        "training thread.")]


def lock_waits(steps: pd.DataFrame, nvtx: pd.DataFrame, osrt: pd.DataFrame, threads: pd.DataFrame,
               labels: dict) -> list[Finding]:
    """Training threads waiting for locks inside the steps. Waits inside `data` ranges are waits for
    data (a queue from loader workers) and belong to data_stall."""
    training = threads.loc[threads["role"] != "", "global_tid"]
    waits = osrt[osrt["name"].isin(LOCK_WAIT_CALLS) & osrt["global_tid"].isin(training)]
    if steps.empty or waits.empty:
        return []
    in_steps = intervals.covered_ns(intervals.union(steps), waits["start"], waits["end"])
    in_data = intervals.covered_ns(intervals.union(nvtx[nvtx["name"] == DATA_PHASE]), waits["start"], waits["end"])
    waits = waits.assign(waited=in_steps - in_data)
    waits = waits[waits["waited"] > 0]
    step_ns = int(steps["duration"].sum())
    per_thread = waits.groupby("global_tid")["waited"].sum().sort_values(ascending=False)
    if per_thread.empty or _pct(per_thread.iloc[0], step_ns) < WARNING_SHARE_PCT:
        return []
    parts = []
    for tid, waited in per_thread.items():
        thread_waits = waits[waits["global_tid"] == tid]
        calls = ", ".join(f"{name} {_ms(r['sum'])} ({int(r['count'])} calls)" for name, r in
                          thread_waits.groupby("name")["waited"].agg(["count", "sum"]).iterrows())
        parts.append(f"{labels.get(tid, tid)} {_ms(waited)} ({_pct(waited, step_ns):.1f}% of step time): {calls}")
    worst_tid = per_thread.index[0]
    longest = waits.loc[[waits.loc[waits["global_tid"] == worst_tid, "waited"].idxmax()]]
    where = innermost_ranges(nvtx, longest)
    place = f" in NVTX `{nvtx.loc[where.iloc[0], 'name']}`" if len(where) else ""
    return [Finding(
        "lock_wait", "warning",
        f"{labels.get(worst_tid, worst_tid)} waits for locks {_pct(per_thread.iloc[0], step_ns):.1f}% of step time",
        f"Lock waits inside the steps (outside NVTX `{DATA_PHASE}`): " + "; ".join(parts)
        + f". Longest single wait {_ms(longest['waited'].iloc[0])}{place}.",
        "Another thread holds a lock the training thread needs (a logger, checkpoint, metrics or queue): shorten "
        "the critical section, hand work over through a queue without holding the lock, or move that work out "
        "of the step.")]


def cpu_scheduling(cores: pd.DataFrame, sched_traced: bool, nsys_capture: bool) -> list[Finding]:
    """Per-core CPU use when context switches were traced; otherwise, for an nsys capture (other
    trace formats cannot have it), say how to get it."""
    if not sched_traced and nsys_capture:
        return [Finding("no_cpu_scheduling", "info", "CPU scheduling was not traced",
                        "No SCHED_EVENTS: per-core CPU utilisation and when each thread ran (vs waited) are unknown.",
                        f"Add {CPU_SCHED_SWITCH} to nsys profile (profile.cpuctxsw: process-tree).")]
    if not sched_traced or cores.empty:
        return []
    busiest = cores.sort_values("busy_pct").iloc[-1]
    return [Finding("cpu_cores", "info",
                    f"The program ran on {len(cores)} CPU cores, {cores['busy_pct'].mean():.1f}% busy on average",
                    "Share of each core's time running the profiled program's threads: "
                    + ", ".join(f"CPU {int(r.cpu)} {r.busy_pct:.1f}%" for r in cores.itertuples())
                    + f"; busiest CPU {int(busiest.cpu)} ({int(busiest.threads)} threads ran on it).")]


def nvtx_projection(projection: pd.DataFrame) -> list[Finding]:
    """Which NVTX ranges the GPU time was launched from, and how much was launched outside any range."""
    if projection.empty:
        return []
    named = projection[~projection["range"].str.startswith("(")]
    outside = projection[projection["range"].str.startswith("(")]
    parts = ", ".join(f"`{r.range}` {r.gpu_pct:.1f}%" for r in named.head(5).itertuples())
    outside_pct = float(outside["gpu_pct"].sum())
    unnamed = ", ".join(f"{r.range.strip('()').removeprefix('no NVTX range, ')} {r.gpu_pct:.1f}%"
                        for r in outside.head(3).itertuples())
    return [Finding(
        "nvtx_gpu_time", "info",
        f"{100 - outside_pct:.1f}% of kernel time is launched inside NVTX ranges",
        f"Kernel time by the innermost range its launch was made in: {parts or 'none'}"
        + (f"; outside every range: {unnamed}" if len(outside) else "") + ".",
        "Kernels launched outside the ranges come from threads without NVTX ranges, usually PyTorch's autograd "
        "thread running backward: torch.autograd.profiler.emit_nvtx() gives every op a range on the thread that "
        "runs it." if outside_pct >= WARNING_SHARE_PCT else "")]
