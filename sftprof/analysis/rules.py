"""Expert rules: each looks for one known performance problem and returns a finding with the
numbers behind it, what to do, and what doing it could save (gains.py), or nothing when the trace
holds no evidence of the problem.

Severity follows the attainable gain: WARNING_SHARE_PCT of the median step or more is a warning; a
smaller one is still reported, as info with the reason in its evidence, when the evidence is there,
so that a reader knows it was looked for and what it costs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from sftprof.analysis import cuda, idle, intervals, views
from sftprof.analysis.boundness import DOMINANT_SHARE_PCT, full_precision_gemms
from sftprof.analysis.cpu import PHASES
from sftprof.analysis.cuda import ASYNC_MEMCPY_CALL, SYNC_MEMCPY_CALL, SYNC_MEMSET_CALL
from sftprof.analysis.efficiency import Padding, peak_for
from sftprof.analysis.excess import attention_saving, precision_ratio
from sftprof.analysis.findings import WARNING_SHARE_PCT, Finding, severity_of
from sftprof.analysis.findings import ms as _ms
from sftprof.analysis.findings import pct as _pct
from sftprof.analysis.gains import (
    FOREACH_ADAMW_BYTES,
    FUSED_ADAMW_BYTES,
    READ_BYTES,
    SLICED_BURSTS,
    SLICED_FILLS,
    ChainTotals,
    SlicedGradients,
    StepClock,
)
from sftprof.analysis.idle import MIN_SHARE_PCT, NAMES_LISTED
from sftprof.analysis.kernels import FLOAT32_FUNCTOR, FULL_ALIGNMENT_BYTES, MEMORY_BOUND_FAMILIES
from sftprof.analysis.memory import INTERCONNECT_KINDS, MEGABYTE, PAGEABLE, CopyCalls
from sftprof.analysis.nvtx import innermost_ranges
from sftprof.analysis.overhead import Overhead, host_share
from sftprof.analysis.sched import CPU_SCHED_SWITCH
from sftprof.analysis.views import (
    BLOCKING_MEMSET_ROWS,
    LOCK_WAIT_CALLS,
    PAGEABLE_ROWS,
    data_stalled,
)
from sftprof.trace.events import MAX_TIME_NS, EventStore, sql_in
from sftprof.trace.load import from_nsys
from sftprof.trace.tables import TraceTables

STEPS_LISTED = 10  # evidence names steps one by one up to this many (long captures have thousands)
KERNELS_LISTED = 3  # and kernels up to this many, the longest first
# nsys's cuda_memcpy_sync rule skips HtoD copies up to this size: the driver returns before they finish.
SMALL_SYNC_HTOD_BYTES = 64_000
# Which memsets block the host, the data stall's threshold and the lock calls are views.py's: it gives each rule
# its rows of the idle_causes table.
# Lock waits of the most blocked training thread below this share of step time are not worth a finding.
LOCK_WAIT_MIN_PCT = 5.0
DATA_PHASE = PHASES[0]
# A memory-bound kernel moved from fp32 to bf16 values moves half the bytes: half its time.
HALF_BYTES_SHARE = 0.5
# How many times longer a bf16 GEMM took on cuBLAS's fallback kernels than the same product at the multiple of 8
# elements below, by the kernel's load width in bytes: medians over an LM head's three products at four sizes, each
# 1, 2 and 4 past a multiple of 8, on an H100 80GB HBM3 (tests/fixtures/foreign/gemm_alignment.jsonl, foreign_loop.py
# gemm_alignment). 1 past ran `_align1` kernels (2-byte loads, 5.0-8.4x), 2 and 4 past `_align2` (4 bytes, 2.7-3.2x).
ALIGNMENT_SLOWDOWN = {2: 5.69, 4: 2.81}


def _median_ms(per_step) -> str:
    return _ms(float(np.median(per_step)))


def _gained(
    rule: str,
    title: str,
    evidence: str,
    recommendation: str,
    clock: StepClock,
    per_step,
    model: str,
    info_reason: str = "",
) -> Finding:
    """A finding whose severity and gain come from `per_step` (ns per step that fixing it saves at
    most); `info_reason` says, in the evidence, why a small gain is small."""
    gain = clock.share(per_step)
    severity = severity_of(gain)
    if severity == "info" and info_reason:
        evidence = f"{evidence} Below {WARNING_SHARE_PCT:g}% of the step because {info_reason}."
    return Finding(rule, severity, title, evidence, recommendation, gain, f"{model}; {clock.scope(per_step)}")


def _gpu_side_reason(clock: StepClock, saved_per_step, host_freed=0.0) -> str:
    """Why a GPU-side saving is small: little GPU time to save, or a CPU that hardly waits for the GPU (and
    whose own time the fix hardly shortens: `host_freed`)."""
    waited = clock.waited()
    if np.median(waited + clock.host_slack_ns + host_freed) < np.median(saved_per_step):
        freed = f" and the fix frees {_median_ms(host_freed)} of its own time" if np.any(host_freed) else ""
        slack = f" ({_ms(clock.host_slack_ns)} more without the profiler)" if clock.host_slack_ns else ""
        return (
            f"the CPU waited for the GPU only {_median_ms(waited)} per step{slack}{freed}, so kernels that finish "
            "sooner leave the GPU idle longer rather than the step shorter"
        )
    return f"it saves {_median_ms(saved_per_step)} of GPU time per step"


def _range_counts(events: EventStore, calls: pd.DataFrame) -> dict:
    """How many of the calls were made in each innermost range, by name, in the order first met."""
    return innermost_ranges(events, calls).value_counts(sort=False).to_dict()


def _mostly_in(counts: dict, calls: int) -> str:
    if not counts:
        return "outside NVTX ranges"
    # on a tie, the name met first in the calls' order
    names = pd.Series(counts).sort_values(ascending=False, kind="stable")
    return f"mostly in NVTX `{names.index[0]}` ({names.iloc[0]} of {calls})"


def _api_spans(ops: pd.DataFrame) -> pd.DataFrame:
    """The API calls of GPU operations joined to them (memory.CopyCalls.batches), as (global_tid, start, end)."""
    return ops[["global_tid", "api_start", "api_end"]].set_axis(["global_tid", "start", "end"], axis=1)


def _threads(tids, labels: dict) -> str:
    """The threads (global_tids) by their labels, each once."""
    return ", ".join(sorted({labels.get(tid, f"tid {int(tid) & 0xFFFFFF}") for tid in tids}))


# ---------------------------------------------------------------- the trace itself


def dropped_rows(tables: TraceTables) -> list[Finding]:
    """Rows the loader left out (TraceTables.dropped_rows), named once: every number computed without them."""
    dropped = tables.dropped_rows
    if not dropped:
        return []
    parts = ", ".join(f"{table} {rows:,}" for table, rows in sorted(dropped.items()))
    return [
        Finding(
            "dropped_rows",
            "warning",
            f"{sum(dropped.values()):,} trace rows left out as damaged",
            f"Left out, by table: {parts}. A start or end time is missing, the end comes before the start, a time "
            f"lies beyond ±{MAX_TIME_NS / 86_400e9:.0f} days, a field has the wrong type, or an event has no type, "
            "names a string the export does not hold or, as a call or range, no thread. Every number in this "
            "report is computed without them.",
            "The trace file was damaged or edited: export or record it again.",
        )
    ]


# ---------------------------------------------------------------- synchronization: what a wait costs the GPU


def _waited(calls: pd.DataFrame, clock: StepClock) -> np.ndarray:
    """Per step, what the CPU waited in these calls (start, end)."""
    return clock.by_step(calls["start"], (calls["end"] - calls["start"]).to_numpy(dtype=float))


SYNC_MODEL = (
    "GPU idle while the thread that launched the next GPU work was inside these calls, or launching what "
    "they delayed (idle_causes, the rows views.py gives this finding), plus the kernels that made the values read "
    "(gains.read_work), at most the CPU's wait for the GPU"
)


def _idle_evidence(views_rows: pd.DataFrame, clock: StepClock) -> str:
    """What the rows of a view hold: idle inside the calls, and the launches they delayed."""
    inside = views_rows[views_rows["source"] != "launches a call delayed"]["idle_ns"].sum() / clock.steps
    delayed = views_rows[views_rows["source"] == "launches a call delayed"]["idle_ns"].sum() / clock.steps
    return (
        f" The GPU idled {_ms(inside)} per step (mean) while the thread that launched its next work was inside "
        f"them, and {_ms(delayed)} more while it launched work they had delayed (idle_causes)."
    )


def _sync_reason(waited, lost) -> str:
    """Why waits cost the GPU little: the GPU had work while the CPU waited (less idle than waited), or they
    were short (the GPU idled through them: the wait is what it cost)."""
    if np.median(lost) < np.median(waited):
        return (
            f"the CPU waits for a busy GPU: new work reaches the GPU soon after each call returns, so removing "
            f"them saves at most {_median_ms(lost)} per step"
        )
    return (
        f"the calls wait only {_median_ms(waited)} per step: the GPU had run out of work when they began, so it "
        "is the CPU, not these calls, that keeps it idle"
    )


# ---------------------------------------------------------------- memory copies and sets


# The operations each copy rule reads (SQL over memory.CopyCalls' `m`): copies through a synchronous
# cudaMemcpy, but HtoD ones small enough that the driver returns early, as nsys's cuda_memcpy_sync rule does
# (PAGEABLE_ROWS and BLOCKING_MEMSET_ROWS: views.py)
SYNC_MEMCPY_ROWS = (
    f"{sql_in('m.copy_kind', ('HtoD', 'DtoH'))} "
    f"AND NOT (m.copy_kind = 'HtoD' AND coalesce(m.bytes <= {SMALL_SYNC_HTOD_BYTES}, false))"
)
CROSSING_ROWS = sql_in("m.copy_kind", INTERCONNECT_KINDS)


@dataclass
class _CopySums:
    """What a copy rule says of its operations (memory.CopyCalls.batches), summed a batch at a time; with
    `events`, the NVTX ranges their calls were made in too."""

    events: EventStore | None = None
    count: int = 0
    bytes: float = 0.0
    duration: int = 0
    exposed_ns: int = 0
    api_duration: int = 0
    kinds: dict = field(default_factory=dict)  # copy_kind: operations, in the order first met
    apis: set = field(default_factory=set)
    dst_kinds: set = field(default_factory=set)
    tids: set = field(default_factory=set)
    ranges: dict = field(default_factory=dict)  # _range_counts of their calls

    def add(self, ops: pd.DataFrame) -> None:
        self.count += len(ops)
        self.bytes += float(ops["bytes"].sum())
        self.duration += int(ops["duration"].sum())
        self.exposed_ns += int(ops["exposed_ns"].sum())
        _count_into(self.kinds, ops["copy_kind"].value_counts(sort=False).to_dict())
        self.dst_kinds.update(ops["dst_kind"].dropna().unique())
        if "api" in ops:
            self.api_duration += int(ops["api_duration"].sum())
            self.apis.update(ops["api"].unique())
            self.tids.update(np.unique(ops["global_tid"].to_numpy("int64")).tolist())
        if self.events is not None:
            _count_into(self.ranges, _range_counts(self.events, _api_spans(ops)))

    def by_kind(self) -> str:
        """ "3 HtoD, 1 DtoH": operations per copy kind, the most first."""
        kinds = pd.Series(self.kinds, dtype="int64").sort_values(ascending=False, kind="stable")
        return ", ".join(f"{n} {kind}" for kind, n in kinds.items())


def sync_memcpy(
    copies: CopyCalls, clock: StepClock, labels: dict, events: EventStore, idle_views: pd.DataFrame
) -> list[Finding]:
    """Host<->device copies through the synchronous cudaMemcpy API, but HtoD ones small enough to return early
    (SYNC_MEMCPY_ROWS); the gain is the idle time idle_causes puts on synchronous cudaMemcpy calls
    (views.py)."""
    sync, waited = _CopySums(events), np.zeros(clock.steps)
    for ops in copies.batches(SYNC_MEMCPY_ROWS, SYNC_MEMCPY_CALL):
        sync.add(ops)
        waited += _waited(_api_spans(ops), clock)
    if not sync.count:
        return []
    lost = views.per_step(idle_views, "sync_memcpy", clock)
    return [
        _gained(
            "sync_memcpy",
            f"{sync.count} synchronous cudaMemcpy calls block the CPU for {_ms(sync.api_duration)}",
            f"{sync.by_kind()} copies ({sync.bytes / MEGABYTE:,.3f} MB, {_ms(sync.duration)} on the GPU, "
            f"{_ms(sync.exposed_ns)} of it with no kernel running) were issued with "
            f"{', '.join(sorted(sync.apis))}, not an Async call: {_threads(sync.tids, labels)} waited "
            f"{_ms(sync.api_duration)} in them, {_mostly_in(sync.ranges, sync.count)}. HtoD copies of at most "
            f"{SMALL_SYNC_HTOD_BYTES:,} bytes are left out, as in nsys's cuda_memcpy_sync rule: they return early."
            + _idle_evidence(views.rows_of(idle_views, "sync_memcpy"), clock)
            + " The copies' own time on the GPU is the interconnect finding's.",
            "Copy with cudaMemcpyAsync from pinned memory and synchronize only where the data is needed (PyTorch: "
            "DataLoader(pin_memory=True), tensor.to('cuda', non_blocking=True); read results with one .item() or "
            ".cpu() per logging interval, not per step).",
            clock,
            lost,
            SYNC_MODEL,
            _sync_reason(waited, lost),
        )
    ]


def pageable_memcpy(
    copies: CopyCalls, clock: StepClock, labels: dict, events: EventStore, idle_views: pd.DataFrame
) -> list[Finding]:
    """cudaMemcpyAsync from or to pageable host memory: staged through a pinned buffer, so not asynchronous;
    the gain is the idle time idle_causes puts on asynchronous copy calls (views.py)."""
    pageable = _CopySums(events)
    for ops in copies.batches(PAGEABLE_ROWS, ASYNC_MEMCPY_CALL):
        pageable.add(ops)
    if not pageable.count:
        return []
    lost = views.per_step(idle_views, "pageable_memcpy", clock)
    median = copies.median_bytes(PAGEABLE_ROWS, ASYNC_MEMCPY_CALL)
    return [
        _gained(
            "pageable_memcpy",
            f"{pageable.count} asynchronous copies use pageable host memory, so they are not asynchronous",
            f"{pageable.by_kind()} copies ({pageable.bytes / MEGABYTE:,.3f} MB, median {median:,.0f} B) "
            f"read or write pageable memory: the driver stages them through a pinned buffer while the CPU waits. "
            f"Their API calls took {_ms(pageable.api_duration)} on {_threads(pageable.tids, labels)}, "
            f"{_mostly_in(pageable.ranges, pageable.count)}; the copies ran {_ms(pageable.exposed_ns)} with no kernel "
            f"beside them (the interconnect finding's), and the GPU idled {_median_ms(lost)} per step while the "
            "thread that launched its next work was inside asynchronous copy calls (idle_causes).",
            "Pin the host buffers: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to('cuda', "
            "non_blocking=True), so the copy overlaps GPU work instead of holding the CPU.",
            clock,
            lost,
            "GPU idle while the thread that launched the next GPU work was inside an asynchronous copy call, staging "
            "it (idle_causes, the rows views.py gives this finding)",
            f"the GPU idled only {_median_ms(lost)} per step while the CPU staged them",
        )
    ]


def sync_memset(copies: CopyCalls, clock: StepClock, labels: dict, idle_views: pd.DataFrame) -> list[Finding]:
    """cudaMemset (not Async) on pinned or managed memory, which blocks the host; the gain is the idle time
    idle_causes puts on synchronous cudaMemset calls (views.py)."""
    blocking, waited = _CopySums(), np.zeros(clock.steps)
    for ops in copies.batches(BLOCKING_MEMSET_ROWS, SYNC_MEMSET_CALL):
        blocking.add(ops)
        waited += _waited(_api_spans(ops), clock)
    if not blocking.count:
        return []
    lost = views.per_step(idle_views, "sync_memset", clock)
    return [
        _gained(
            "sync_memset",
            f"{blocking.count} synchronous cudaMemset calls on host-visible memory block the CPU for "
            f"{_ms(blocking.api_duration)}",
            f"{', '.join(sorted(blocking.apis))} on {', '.join(sorted(blocking.dst_kinds))} memory "
            f"({blocking.bytes / MEGABYTE:,.3f} MB) by {_threads(blocking.tids, labels)}."
            + _idle_evidence(views.rows_of(idle_views, "sync_memset"), clock),
            "Use cudaMemsetAsync on a stream, or clear device memory instead of pinned/managed memory.",
            clock,
            lost,
            SYNC_MODEL,
            _sync_reason(waited, lost),
        )
    ]


def interconnect_findings(
    kind_share: pd.DataFrame,
    host_memory: pd.DataFrame,
    crossing: dict,
    kernel_totals: dict,
    memop_totals: dict,
    copies: CopyCalls,
    clock: StepClock,
    idle_views: pd.DataFrame | None = None,
) -> list[Finding]:
    """The interconnect verdict: what would hiding host<->device and peer copies under kernels save, and so do
    they limit the step? (CROSSING_ROWS: every such copy, whichever call issued it.)"""
    return interconnect(
        kind_share,
        host_memory,
        crossing,
        int(kernel_totals["total_ns"] + memop_totals["ns"]),
        copies,
        clock,
        idle_views,
    )


def interconnect(
    kind_share: pd.DataFrame,
    host_memory: pd.DataFrame,
    crossing: dict,
    gpu_ns: int,
    copies: CopyCalls,
    clock: StepClock,
    idle_views: pd.DataFrame | None = None,
) -> list[Finding]:
    """The interconnect finding (interconnect_findings): `crossing`, memory.interconnect_share; `gpu_ns`, the
    kernels' and memory operations' time. Where most synchronizations wait for the copies (views.copy_syncs), the
    idle they leave (`idle_views`' interconnect rows) is the copies' too."""
    if kind_share.empty:
        return []
    exposed_ns, exposed = 0, np.zeros(clock.steps)
    for ops in copies.batches(CROSSING_ROWS):
        exposed_ns += int(ops["exposed_ns"].sum())
        exposed += clock.by_step(ops["start"], ops["exposed_ns"])
    lost = clock.gpu_side(exposed)
    waiting = np.zeros(clock.steps)
    if idle_views is not None:
        waiting = views.per_step(idle_views, views.INTERCONNECT_RULE, clock)
        lost = lost + waiting
    limits = severity_of(clock.share(lost)) == "warning"
    parts = "; ".join(
        f"{r.copy_kind} {r.gpu_time_pct:.2f}% ({r.instances} ops, {r.bytes / MEGABYTE:,.3f} MB"
        + (f", {r.gb_per_s:,.1f} GB/s" if r.bytes >= MEGABYTE else "")
        + ")"
        for r in kind_share.itertuples()
    )
    host_copies = host_memory["instances"].sum()
    pageable = host_memory.loc[host_memory["host_memory"] == PAGEABLE, "instances"].sum()
    return [
        _gained(
            "interconnect",
            f"Host-device and peer copies are {crossing['gpu_time_pct']:.2f}% of GPU time: the interconnect "
            + ("can limit the step" if limits else "is not the limit"),
            f"Shares of the {_ms(gpu_ns)} of GPU time (kernels + memory operations): {parts}. Crossing PCIe/NVLink: "
            f"{crossing['count']} copies, {crossing['bytes'] / MEGABYTE:,.3f} MB, {_ms(crossing['ns'])}, "
            f"{_ms(exposed_ns)} of it with no kernel running; {pageable} of {host_copies} host "
            "copies use pageable memory."
            + (
                " Most synchronizations wait for these copies, right after they are issued: the GPU idles "
                f"{_median_ms(waiting)} per step in them and in the launches they delayed."
                if waiting.any()
                else ""
            ),
            "Overlap transfers with compute (pinned memory, non_blocking copies on a side stream, prefetch the next "
            "batch) or move less (keep tensors on the GPU, offload less, copy states and checkpoints to the CPU "
            "every N steps rather than every step)."
            if limits
            else "",
            clock,
            lost,
            "host-device and peer copies' time not overlapped by kernels, at most the CPU's wait for the GPU"
            + (", and the idle of the synchronizations that wait for them" if waiting.any() else ""),
            f"the copies cost {_median_ms(lost)} per step, their time with no kernel running and the idle of the "
            "synchronizations that wait for them"
            if waiting.any()
            else _gpu_side_reason(clock, exposed),
        )
    ]


# ---------------------------------------------------------------- synchronization in the loop


def _step_of(times: np.ndarray, steps: pd.DataFrame) -> np.ndarray:
    """The step number each time falls in, or -1 outside every step (steps are disjoint)."""
    starts, ends = steps["start"].to_numpy(), steps["end"].to_numpy()
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times <= ends[np.maximum(index, 0)])
    return np.where(inside, steps["step"].to_numpy()[np.maximum(index, 0)], -1)


def _count_into(counts: dict, more: dict) -> None:
    """Add `more`'s counts to `counts`, names new to it after the others (the order first met)."""
    for name, n in more.items():
        counts[name] = counts.get(name, 0) + n


# Where most synchronizations are made inside the backward pass, on PyTorch's autograd thread: no loop code runs
# there, so they come from the engine or from code it calls for each node.
_BACKWARD_SYNCS = (
    " Most are made on PyTorch's autograd thread, node after node inside the backward pass, as anomaly detection "
    "makes them: the finding anomaly_detection counts them, with the idle they hold up."
)


DATA_DEPENDENT_ADVICE = (
    " Reads right after CUB's device-wide kernels fetch the size of an output that depends on the data (x[mask], "
    "masked_select, nonzero and one-argument torch.where; unique; repeat_interleave without output_size): keep "
    "shapes static (ignored labels, ignore_index=-100, rather than dropping positions; three-argument torch.where "
    "rather than indexing) so no size is read back."
)


UPLOAD_ADVICE = (
    " A sync after a copy of a few bytes from pageable host memory waits for a CPU value moved into an op: index with "
    "slices (x[..., i:i + 1], not x[..., [i]]) and make index or scalar tensors once, on the GPU."
)


def _uploaded(uploads: pd.DataFrame | None, steps: pd.DataFrame) -> str:
    """Evidence of the syncs inside the steps that wait for a small upload (views.upload_syncs), or ""."""
    if uploads is None or uploads.empty:
        return ""
    inside = uploads[_step_of(uploads["start"].to_numpy(), steps) >= 0]
    if inside.empty:
        return ""
    taken = _counted(inside["consumer"])
    return (
        f" {len(inside) / len(steps):.0f} of them a step wait for a copy of at most {READ_BYTES:,} bytes from "
        f"pageable host memory that their thread issued just before, each taken by {taken or 'no kernel'}: a CPU "
        "value moved into an op on every call (indexing with a Python list, x[..., [i]]; a CPU index or scalar "
        "tensor)."
    )


def _counted(kernels: pd.Series) -> str:
    """The kernels named most often (NAMES_LISTED of them, unnamed left out), each with how often."""
    counts = kernels[kernels != ""].value_counts().head(NAMES_LISTED)
    return ", ".join(f"`{name}` x{n}" for name, n in counts.items())


def syncs_in_steps(
    waits: cuda.WaitCalls,
    steps: pd.DataFrame,
    labels: dict,
    events: EventStore,
    clock: StepClock,
    idle_views: pd.DataFrame,
    in_backward: bool = False,
    reads: pd.DataFrame | None = None,
    uploads: pd.DataFrame | None = None,
    size_reads: float = 0.0,
    data_sized_gemms: float = 0.0,
) -> list[Finding]:
    """Explicit synchronizations (stream, event, device, context: cuda.HOST_SYNC_CALLS among `waits`,
    cuda.host_wait_calls) inside the `step N` ranges, per step, summed a batch of calls at a time: a
    trainer that synchronizes after every launch makes millions. The gain is the idle time idle_causes puts
    on these calls and the launches they delayed (views.py), plus the kernels that made the values read
    (`reads`: gains.read_work), at most the CPU's wait for the GPU; the syncs that wait for a CPU value just
    copied up (`uploads`: views.upload_syncs) are named with the kernel that took it; reads of a data-dependent
    size (`size_reads` a step: gains.size_reads_per_step) are advised static shapes, and a loop over groups of the
    data (`data_sized_gemms` a step: gains.data_sized_gemms_per_step) a grouped form. Synchronous copies and sets
    have their own rules. `in_backward` (views.backward_syncs): the backward pass
    itself makes most of them, and anomaly_detection counts their idle and its value checks (_BACKWARD_SYNCS)."""
    if steps.empty:
        return []
    explicit = set(cuda.host_sync_ids(events))
    steps = steps.sort_values("start")
    found, per_step, names, tids, ranges = 0, [], {}, {}, {}
    waited = np.zeros(clock.steps)
    for batch in cuda.call_batches(events, sql_in("a.name_id", [i for i in waits.ids if i in explicit])):
        batch = batch.assign(step=_step_of(batch["start"].to_numpy(), steps))
        batch = batch[batch["step"] >= 0]
        if batch.empty:
            continue
        found += len(batch)
        per_step.append(batch.groupby("step")["duration"].agg(["count", "sum"]))
        waited += _waited(batch, clock)
        _count_into(names, batch["name_id"].value_counts(sort=False).to_dict())
        _count_into(ranges, _range_counts(events, batch))
        _count_into(tids, batch["global_tid"].value_counts(sort=False).to_dict())
    if not found:
        return []
    per_step = pd.concat(per_step).groupby(level=0).sum()
    lost = views.per_step(idle_views, "sync_in_steps", clock)
    made = np.zeros(clock.steps)
    if reads is not None and len(reads) and not in_backward:
        made = clock.gpu_side(clock.by_step(reads["start"], reads["ns"]))
        lost = lost + made
    uploaded = _uploaded(uploads, steps)
    text = cuda.call_names(events)
    names = pd.Series({text[name_id]: n for name_id, n in names.items()})
    calls = ", ".join(f"{name} x{n}" for name, n in names.sort_values(ascending=False).items())
    listed = "; ".join(
        f"step {step}: {int(r['count'])} calls, {_ms(r['sum'])}" for step, r in per_step.head(STEPS_LISTED).iterrows()
    )
    if len(per_step) > STEPS_LISTED:
        listed += f"; and {len(per_step) - STEPS_LISTED:,} more steps"
    return [
        _gained(
            "sync_in_steps",
            f"{found / len(steps):.0f} synchronizing CUDA calls per step; the CPU waits {_median_ms(waited)} per "
            "step in them",
            f"Inside the step ranges: {listed}. Calls: {calls}, on {_threads(tids, labels)}, "
            f"{_mostly_in(ranges, found)}."
            + _idle_evidence(views.rows_of(idle_views, "sync_in_steps"), clock)
            + (
                f" The values read took {_median_ms(made)} of kernels per step (for {len(reads):,} small "
                "device-to-host reads, the reduction that made each and the elementwise kernels before it: "
                f"{_counted(reads['producer'])})."
                if made.any()
                else ""
            )
            + uploaded,
            "Each synchronization drains the GPU queue, so the CPU cannot run ahead of the GPU: drop per-step "
            ".item()/.cpu()/print of GPU values (accumulate the loss on the GPU and read it every N steps), avoid "
            "torch.cuda.synchronize() in the loop, and use non_blocking copies."
            + (DATA_DEPENDENT_ADVICE if made.any() and size_reads else "")
            + (
                " " + idle.GROUP_LOOP_ADVICE.format(gemms=data_sized_gemms)
                if data_sized_gemms >= idle.GROUP_LOOP_GEMMS
                else ""
            )
            + (UPLOAD_ADVICE if uploaded else "")
            + (_BACKWARD_SYNCS if in_backward else ""),
            clock,
            lost,
            SYNC_MODEL,
            _sync_reason(waited, lost),
        )
    ]


def anomaly_detection(
    idle_views: pd.DataFrame, checks: pd.DataFrame, clock: StepClock, overhead: Overhead | None = None
) -> list[Finding]:
    """The backward pass synchronizes after its nodes (views.backward_syncs), as anomaly detection does: the GPU's
    queue drains after every node, so the CPU never gets ahead and the step's synchronization, launch overhead,
    copy calls and queued starts are the reads' (views.ANOMALY_RULE rows); the value checks' kernels
    (kernels.value_checks) are work turning it off removes, at most the CPU's wait for the GPU. Less the profiler's
    time placed in those stretches (idle.profiler_time)."""
    rows = views.rows_of(idle_views, views.ANOMALY_RULE)
    if rows.empty:
        return []
    held = idle.per_step(rows, clock)
    placed = idle.profiler_time(idle_views, clock, overhead).get(views.ANOMALY_RULE, 0.0)
    share = host_share(overhead, float(np.median(held)), clock, placed)
    checks_ns = float(checks["total_ns"].sum()) / clock.steps
    checked = clock.gpu_side(np.full(clock.steps, checks_ns))
    gain = round(min(100.0, (share.gain_pct if share else clock.share(held)) + clock.share(checked)), 3)
    kinds = rows.groupby("cause")["idle_ns"].sum().sort_values(ascending=False) / clock.steps
    parts = ", ".join(f"{cause} {_ms(ns)}" for cause, ns in kinds.items())
    return [
        Finding(
            views.ANOMALY_RULE,
            severity_of(gain),
            "The backward pass synchronizes after its nodes (anomaly detection): the CPU never gets ahead of the GPU"
            + (share.title if share else ""),
            f"Most synchronizing calls are made on PyTorch's autograd thread, inside the backward pass. The GPU idles "
            f"{_median_ms(held)} per step while the CPU launches, copies and waits between them ({parts} per step), "
            f"and {int(checks['instances'].sum() / clock.steps):,} value-checking kernels (isnan, any) run "
            f"{_ms(checks_ns)} per step." + (share.evidence if share else ""),
            "Turn anomaly detection off outside debugging (torch.autograd.set_detect_anomaly(False); no "
            "torch.autograd.detect_anomaly() around the step): it checks every gradient for NaN and synchronizes "
            "for each, and records a traceback for every forward op. A backward hook or custom autograd Function "
            "that reads values does the same: check once per step (torch.isfinite on the loss or the grad norm).",
            gain,
            "GPU idle from synchronization, launch overhead, copy calls and queued starts in the steps whose backward "
            f"pass synchronizes (idle_causes: {clock.scope(held)}"
            + (share.basis if share else "")
            + f"), plus the value-checking kernels' time ({clock.scope(checked)}), at most the CPU's wait for the GPU",
        )
    ]


# ---------------------------------------------------------------- GPU utilisation


# ---------------------------------------------------------------- kernel mix and precision

FUSION_MODEL = (
    "each run of consecutive fusable kernels (elementwise, reductions and norms) on a stream with the GPU's next "
    "kernel queued behind it, fused, taking as long as its reductions' own passes or its longest kernel, whichever "
    "is longer (an estimate: the trace holds no tensor sizes to bound it by bytes); at most the CPU's wait for the "
    "GPU plus the host time of the launches fusion removes (the host's launch path: each "
    "launch and the dispatch before it, in proportion to the kernels removed)"
)


SLICED_ADVICE = (
    "Read the tensor whole: one call over all of it (the loss over the whole batch, with reduction='none' and weights "
    "where samples weigh differently), or its pieces taken at once with torch.split or torch.unbind, whose backward "
    "writes one gradient. A loss chunked to save memory chunks the hidden states and runs the output layer a chunk "
    "at a time with the loss (a fused linear cross-entropy: Liger's, Cut Cross-Entropy), not the logits."
)


def sliced_gradients(sliced: SlicedGradients, clock: StepClock) -> list[Finding]:
    """A tensor used a slice at a time in a Python loop (gains.sliced_gradients): each slice's gradient is a
    zero-filled tensor as large as the whole, and autograd adds them. The gain is those fills' and adds' time,
    which reading the tensor whole removes, at most what the step can lose by GPU time (StepClock.gpu_side)."""
    if sliced.shapes.empty:
        return []
    saved = sliced.saved_by_step
    shapes = "; ".join(
        f"{r.fills:.0f} fills and {r.adds:.0f} adds of grid ({r.grid_x}, {r.grid_y}, {r.grid_z})"
        for r in sliced.shapes.sort_values("fills", ascending=False).head(STEPS_LISTED).itertuples()
    )
    return [
        _gained(
            "sliced_gradients",
            f"A tensor is read a slice at a time: its gradient is zero-filled and added whole once a slice, "
            f"{_median_ms(saved)} per step",
            f"Per step (median): {shapes}, in {_median_ms(saved)}. Each fill writes a gradient as large as the "
            "tensor for one slice of it (the backward of x[i] or x[:, a:b]), and autograd adds each to the sum of "
            "the others: a Python loop over samples or chunks of one tensor (a per-sample loss, a loss chunked "
            "over the logits' positions).",
            SLICED_ADVICE,
            clock,
            clock.gpu_side(saved),
            f"the zero-fills and adds of one size that a step makes between two GEMMs ({SLICED_FILLS} fills or more, "
            f"no more adds than fills, in at most {SLICED_BURSTS} such stretches), which reading the tensor whole "
            "removes; at most the CPU's wait for the GPU",
            _gpu_side_reason(clock, saved),
        )
    ]


def memory_bound_mix(families: pd.DataFrame, mix: dict, chains: ChainTotals, clock: StepClock) -> list[Finding]:
    """Streaming kernels take kernel time that fusion could save: chains of fusable kernels (`chains`:
    gains.fusable_chains, summed per step of the clock's) fused into one, each element read and written once.
    Fusion also removes launches, and with them the host's work to issue each op, so where the host's path is
    the longer the step still shortens."""
    if families.empty or (not chains.runs and mix["memory_pct"] < DOMINANT_SHARE_PCT):
        return []
    streaming = families[families["family"].isin(MEMORY_BOUND_FAMILIES)]
    parts = ", ".join(f"{r.family} {r.time_pct:.1f}% (top: {r.top_kernel})" for r in streaming.itertuples())
    saved = chains.saved_by_step
    host_freed = chains.host_freed(clock)
    runs = (
        f" {chains.runs:,} runs of 2 or more elementwise, reduction or norm kernels back to back on a stream "
        f"({chains.kernels:,} kernels, {_ms(chains.total_ns)}) would take {_ms(chains.fused_ns)} fused, with "
        f"{100 * float(np.median(chains.removed_share())):.0f}% fewer launches a step; {chains.queued_runs:,} of "
        "the runs had the GPU's next kernel queued behind them (the others were followed by idle, which a shorter "
        "run only lengthens)."
        if chains.runs
        else " No fusable kernels run back to back: fusion by torch.compile has little to join."
    )
    return [
        _gained(
            "memory_bound_kernel_mix",
            f"{mix['memory_pct']:.1f}% of kernel time is in memory-bound streaming kernels",
            f"{parts}; GEMM/attention {mix['compute_pct']:.1f}%, tensor cores {mix['tensor_core_pct']:.1f}% of kernel "
            f"time.{runs}",
            "Fuse elementwise chains and the norms and reductions beside them (torch.compile; fused "
            "RMSNorm/rotary/SwiGLU kernels such as Liger's) and grow the work per kernel (hidden size, batch) to "
            "raise arithmetic intensity.",
            clock,
            clock.gpu_side(saved, host_freed),
            FUSION_MODEL,
            _gpu_side_reason(clock, saved, host_freed),
        )
    ]


def foreach_optimizer(foreach: pd.DataFrame, clock: StepClock) -> list[Finding]:
    """The optimizer updates parameters with PyTorch's foreach kernels, one pass over the optimizer state
    per operation (`foreach`: gains.foreach_optimizer_kernels); a fused optimizer makes one pass."""
    if foreach.empty:
        return []
    kept = FUSED_ADAMW_BYTES / FOREACH_ADAMW_BYTES
    saved = clock.by_step(foreach["start"], foreach["duration"] * (1 - kept))
    return [
        _gained(
            "foreach_optimizer",
            f"The optimizer runs as {len(foreach):,} foreach kernels: a fused optimizer would take about "
            f"{100 * kept:.0f}% of their time",
            f"Foreach (multi-tensor, not fused) optimizer kernels: {_ms(foreach['duration'].sum())} in {len(foreach):,} "
            f"kernels. Each foreach operation reads and writes the whole optimizer state again; AdamW(fused=True) "
            f"reads parameters, gradients and both moments and writes them back once ({FUSED_ADAMW_BYTES} B per fp32 "
            f"parameter against about {FOREACH_ADAMW_BYTES} B in the 8 foreach passes).",
            "Use the fused optimizer: torch.optim.AdamW(..., fused=True) (or apex/Transformer Engine's fused Adam).",
            clock,
            clock.gpu_side(saved),
            f"the foreach kernels' time x (1 - {FUSED_ADAMW_BYTES}/{FOREACH_ADAMW_BYTES}): fused AdamW moves "
            f"{FUSED_ADAMW_BYTES} B/param in one pass, foreach AdamW ~{FOREACH_ADAMW_BYTES} B/param in 8, at the same "
            "bandwidth; at most the CPU's wait for the GPU",
            _gpu_side_reason(clock, saved),
        )
    ]


def fp32_gemm(
    precision: pd.DataFrame,
    clock: StepClock,
    run_precision: str | None = None,
    device_name: str | None = None,
    families: pd.DataFrame | None = None,
    attention_runs: pd.DataFrame | None = None,
    chains: ChainTotals | None = None,
) -> list[Finding]:
    """Most GEMM time outside unfused attention in fp32/tf32, no GEMM named bf16/fp16/fp8, and a run that does not
    report half precision (`run_precision`, e.g. the trainer's "bfloat16"): mixed precision is off
    (boundness.full_precision_gemms). bf16 would run each GEMM at the GPU's bf16 rate (its datasheet's ratio to
    fp32 or tf32, excess.precision_ratio: 14.8x fp32 on an H100 or H200), and move half the bytes in the
    memory-bound kernels (`families`). Attention found unfused (`attention_runs`, excess.unfused_attention) is
    counted here as fused: in fp32, SDPA falls back to unfused attention where its flash kernels need 16-bit
    inputs, so bf16 (with SDPA) removes the runs' glue and GEMMs and their launches (excess.attention_saving)."""
    full = full_precision_gemms(precision, run_precision, attention_runs)
    if full.empty:
        return []
    peak = peak_for(device_name)
    ratios = {p: precision_ratio(peak, p) for p in full["precision"]}
    parts = ", ".join(
        f"{r.precision} {r.time_pct:.1f}% of GEMM time ({r.instances} kernels, bf16 {ratios[r.precision]:.1f}x faster)"
        for r in full.itertuples()
    )
    gemm_saved = sum(r.total_ns * (1 - 1 / ratios[r.precision]) for r in full.itertuples())
    streaming = families[families["family"].isin(MEMORY_BOUND_FAMILIES)] if families is not None else None
    streaming_ns = float(streaming["total_ns"].sum()) if streaming is not None and len(streaming) else 0.0
    saved = np.full(clock.steps, (gemm_saved + HALF_BYTES_SHARE * streaming_ns) / clock.steps)
    host_freed, attention = np.zeros(clock.steps), ""
    if attention_runs is not None and len(attention_runs) and chains is not None:
        ratio = ratios[full.sort_values("total_ns").iloc[-1]["precision"]]
        fused, host_freed = attention_saving(attention_runs, clock, chains)
        counted = clock.by_step(  # what the rates above already took off the runs' GEMMs and glue
            attention_runs["start"],
            attention_runs["gemm_ns"] * (1 - 1 / ratio) + HALF_BYTES_SHARE * attention_runs["glue_ns"],
        )
        saved = saved + np.maximum(fused - counted, 0)
        attention = (
            f" Attention runs unfused: {len(attention_runs):,} softmax runs between GEMMs, "
            f"{_ms((attention_runs['glue_ns'] + attention_runs['gemm_ns']).sum() / clock.steps)} per step (SDPA's "
            "flash kernels need 16-bit inputs), counted as fused attention in bf16."
        )
    gpu = peak.gpu if peak is not None else "an unknown GPU (bf16 taken as 2x, as against tf32)"
    return [
        _gained(
            "fp32_gemm",
            f"GEMMs run in fp32: {full['time_pct'].sum():.0f}% of GEMM time, and no GEMM named bf16, fp16 or fp8",
            f"By kernel name: {parts}; e.g. {full.iloc[0]['top_kernel'][:120]}. Memory-bound kernels "
            f"{_ms(streaming_ns / clock.steps)} per step, moving 4-byte values.{attention}",
            "Train in mixed precision: bf16 weights or torch.autocast('cuda', dtype=torch.bfloat16); FP8 with "
            "Transformer Engine on Hopper"
            + (
                "; at the least allow TF32 (torch.backends.cuda.matmul.allow_tf32 = True)."
                if (full["precision"] == "fp32").any()
                else "."
            )
            + (
                " In 16-bit, attention through torch.nn.functional.scaled_dot_product_attention (Hugging Face: "
                "attn_implementation='sdpa') runs fused."
                if attention
                else ""
            ),
            clock,
            clock.gpu_side(saved, host_freed),
            f"each fp32/tf32 GEMM at the bf16 rate of {gpu} by its datasheet, and the memory-bound kernels moving "
            "half the bytes"
            + (", unfused attention's glue and GEMMs as one fused kernel (an upper bound)" if attention else "")
            + "; spread evenly over the steps, at most the CPU's wait for the GPU",
            _gpu_side_reason(clock, saved),
        )
    ]


def unaligned_gemm(unaligned: pd.DataFrame, clock: StepClock) -> list[Finding]:
    """GEMMs on cuBLAS's fallback kernels for strides that are not a multiple of 16 bytes
    (kernels.unaligned_gemms): each would take its time / ALIGNMENT_SLOWDOWN with the dimension padded."""
    if unaligned.empty:
        return []
    slowdown = unaligned["alignment_bytes"].map(alignment_slowdown)
    saved_ns = float((unaligned["total_ns"] * (1 - 1 / slowdown)).sum())
    saved = np.full(clock.steps, saved_ns / clock.steps)
    parts = "; ".join(
        f"{r.kernel[:120]}: {_ms(r.total_ns / clock.steps)} per step, {r.alignment_bytes}-byte loads "
        f"({alignment_slowdown(r.alignment_bytes):.1f}x slower than aligned)"
        for r in unaligned.head(KERNELS_LISTED).itertuples()
    )
    return [
        _gained(
            "unaligned_gemm",
            "GEMMs run on slow fallback kernels: a matrix dimension is not a multiple of 8 elements",
            f"By kernel name, {len(unaligned)} GEMM kernels load fewer than {FULL_ALIGNMENT_BYTES} bytes at a time "
            f"(`_alignN`: N elements), which cuBLAS picks only when a leading dimension is not a multiple of "
            f"{FULL_ALIGNMENT_BYTES} bytes: {parts}.",
            "Pad the dimension to a multiple of 64: most often the vocabulary after tokens were added "
            "(Hugging Face: model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64); NeMo/Megatron: "
            "make_vocab_size_divisible_by), else a custom model's hidden, intermediate or head size, or a LoRA rank.",
            clock,
            clock.gpu_side(saved),
            "each such GEMM's time / its measured slowdown against the aligned product (H100, "
            + ", ".join(f"{b}-byte loads {x:g}x" for b, x in ALIGNMENT_SLOWDOWN.items())
            + "); spread evenly over the steps, at most the CPU's wait for the GPU",
            _gpu_side_reason(clock, saved),
        )
    ]


# float64 halves what float32 moves, and these kernels stream memory (a loss's softmax, casts, fills): in float32
# each would take half its time. On the Phi's float64 loss (H100): 13.0% of kernel time, 7.5% measured saving.
FLOAT64_SAVING = 0.5


def float64_math(wide: pd.DataFrame, clock: StepClock) -> list[Finding]:
    """Kernels on float64 elements (kernels.float64_kernels): a training step needs none, and in float32 each would
    move half the bytes."""
    if wide.empty:
        return []
    saved = np.full(clock.steps, FLOAT64_SAVING * float(wide["total_ns"].sum()) / clock.steps)
    parts = "; ".join(
        f"`{r.kernel[:120]}` {_ms(r.total_ns / clock.steps)} per step" for r in wide.head(KERNELS_LISTED).itertuples()
    )
    return [
        _gained(
            "float64_math",
            f"{len(wide)} kernels compute in float64",
            f"By kernel name, {len(wide)} kernels take float64 elements: {parts}.",
            "Keep the step in float32 or narrower: a tensor cast with .double() (often the loss or its logits, "
            '"for stability": float32 log_softmax is stable), a float64 NumPy array turned into a tensor '
            "(torch.from_numpy keeps float64: cast with .float()), or torch.set_default_dtype(torch.float64).",
            clock,
            clock.gpu_side(saved),
            f"the float64 kernels' time x {FLOAT64_SAVING:g} (float32 moves half the bytes); spread evenly over the "
            "steps, at most the CPU's wait for the GPU",
            _gpu_side_reason(clock, saved),
        )
    ]


# With the weights in bf16, autocast casts nothing each forward, gradients come back in bf16, AdamW streams half the
# bytes and a layer norm reads a bf16 residual stream. Against bf16 weights, measured without the profiler (H100):
# Falcon 16.6%, OPT 20.9%, sftprof's Llama trainer 15.7%, where the casts both ways, half the float32 AdamW and half
# the float32 layer norms give 15.2%, 16.9% and 13.0% (docs/DIAGNOSIS.md). Left out: the stream's other float32
# work (adds; norms a model writes itself, which may compute in float32 with bf16 weights too), and what a model
# casts for itself once its weights are bf16 (the Gemma's norms: 15.6% there against 10.8%).
HALF_PRECISION_SAVING = 0.5
# PyTorch's cast to fp16 (its cast to bf16 is `bfloat16_copy_kernel_cuda`): an fp16 autocast run.
FP16_CAST = re.compile(r"(?<!b)float16_copy_kernel_cuda")
FP16_CASTS = (
    " This run casts to fp16: fp16 weights would need a loss scaler and keep less range, so the switch is bf16 where "
    "the GPU has it (Ampere and later); on older GPUs, keep float32 master weights in the optimizer only."
)


def float32_weights(found: pd.DataFrame, clock: StepClock) -> list[Finding]:
    """Float32 weights computed in bf16 or fp16 (kernels.float32_weights): casts every forward and back, a float32
    optimizer and float32 layer norms, which weights held in 16 bits would not need."""
    if found.empty:
        return []
    casts, back, optimizer, norm = (found[found["kind"] == kind] for kind in ("cast", "cast_back", "optimizer", "norm"))
    cast_ns, back_ns, optimizer_ns, norm_ns = (float(kind["total_ns"].sum()) for kind in (casts, back, optimizer, norm))
    halved_ns = optimizer_ns + norm_ns
    saved = np.full(clock.steps, (cast_ns + back_ns + HALF_PRECISION_SAVING * halved_ns) / clock.steps)
    per_step = lambda ns: _ms(ns / clock.steps)  # noqa: E731
    norms = f"; layer norms read float32 activations for {per_step(norm_ns)} a step" if norm_ns else ""
    return [
        _gained(
            "float32_weights",
            "Float32 weights cast to 16 bits for the math: bf16 weights would skip the casts and halve the "
            "optimizer's traffic",
            f"By kernel name, the optimizer updates float32 weights ({len(optimizer)} kernels such as "
            f"`{FLOAT32_FUNCTOR.search(optimizer['kernel'].iloc[0]).group()}>`, {per_step(optimizer_ns)} per step) "
            f"while {int(casts['instances'].sum() / clock.steps)} casts to 16 bits a step take {per_step(cast_ns)} "
            f"and {int(back['instances'].sum() / clock.steps)} casts back to float32 {per_step(back_ns)}{norms}: "
            "mixed precision that keeps the weights in float32 (autocast, a Trainer's bf16 flag) casts each weight, "
            "and each activation its float32 stream feeds a matmul, every forward, and their gradients back.",
            "Hold the weights in bf16 (Hugging Face: from_pretrained(..., torch_dtype=torch.bfloat16) without "
            "autocast; Lightning: precision='bf16-true'; sftprof: precision bf16-true). Updates smaller than "
            "bf16 resolves are then lost: where that costs accuracy, keep float32 master weights only in the "
            "optimizer (Megatron/NeMo's distributed optimizer), which saves the per-forward casts."
            + (FP16_CASTS if casts["kernel"].str.contains(FP16_CAST).any() else ""),
            clock,
            clock.gpu_side(saved),
            f"the casts to 16 bits and back to float32, and the float32 optimizer's and layer norms' time x "
            f"{HALF_PRECISION_SAVING:g} (bf16 moves half the bytes); spread evenly over the steps, at most the "
            "CPU's wait for the GPU",
            _gpu_side_reason(clock, saved),
        )
    ]


def alignment_slowdown(alignment_bytes: int) -> float:
    """ALIGNMENT_SLOWDOWN for a load width: the entry for the widest measured width not above it."""
    fitting = [width for width in ALIGNMENT_SLOWDOWN if width <= alignment_bytes]
    return ALIGNMENT_SLOWDOWN[max(fitting) if fitting else min(ALIGNMENT_SLOWDOWN)]


def padding_findings(padded: Padding, token_time_ns: float | None, clock: StepClock) -> list[Finding]:
    """Padded token slots: work the token-proportional kernels (GEMM, attention and elementwise over
    activations, not the optimizer) do for nothing. `token_time_ns`: those kernels' time per median step
    (accounting.token_ns)."""
    share = padded.padding_pct / 100 if padded.padding_pct is not None else None
    return padding(share, token_time_ns, clock.step_ns if clock.has_steps else None)


def padding(padding_share: float | None, token_time_ns: float | None, step_ns: float | None) -> list[Finding]:
    """The padding finding (padding_findings) from its numbers. `padding_share`: padded slots / all slots
    (0-1); `token_time_ns`: the token-proportional kernels' time per median step; `step_ns`: the median step."""
    if not padding_share or padding_share <= 0 or not token_time_ns or not step_ns:
        return []
    saved = padding_share * token_time_ns
    gain = round(min(100.0, 100.0 * saved / step_ns), 3)
    severity = severity_of(gain)
    return [
        Finding(
            "padding",
            severity,
            f"{100 * padding_share:.1f}% of the token slots are padding",
            f"Token-proportional kernels take {_ms(token_time_ns)} per step; {100 * padding_share:.1f}% of the tokens "
            f"they process are padding: {_ms(saved)} per step of work on nothing."
            + ("" if severity == "warning" else f" Small: that is {gain:.1f}% of the {_ms(step_ns)} step."),
            "Pack sequences (padding-free batches with position ids or cu_seqlens) or group samples of similar length "
            "(group_by_length, a length-bucketing sampler); pad to a multiple of 8 or 64, not to the longest sample.",
            gain,
            f"padded share x time in token-proportional kernels per step / {_ms(step_ns)} median step "
            "(attention's cost grows faster than linearly with padded length: an estimate there)",
        )
    ]


# ---------------------------------------------------------------- CPU side


def data_stall(
    steps: pd.DataFrame,
    marked: pd.DataFrame,
    events: EventStore,
    clock: StepClock,
    labels: dict,
    idle_views: pd.DataFrame,
) -> list[Finding]:
    """The `data` phase takes a large share (DATA_STALL_PCT) of the step: the input pipeline starves the
    training loop. The gain is the idle time idle_causes puts on the `data` ranges of the thread that feeds the
    GPU (views.py); without GPU work, the ranges' time. `marked`: cpu.marked_ranges."""
    if not data_stalled(steps):
        return []
    step_ns, data_ns = int(steps["duration"].sum()), int(steps[f"{DATA_PHASE}_ns"].sum())
    share = _pct(data_ns, step_ns)
    data = marked[marked["name"] == DATA_PHASE]
    merged = intervals.union(data)
    top, in_calls = _calls_inside(events, merged, data["global_tid"])
    top = top.sort_values("sum", ascending=False).head(3)
    doing = ", ".join(f"{name} {_ms(r['sum'])} ({int(r['count'])} calls)" for name, r in top.iterrows())
    if clock.has_gpu:
        lost = views.per_step(idle_views, "data_stall", clock)
    else:
        lost = clock.by_step(merged["start"], (merged["end"] - merged["start"]).to_numpy(dtype=float))
    gpu = (
        f" The GPU idled {_pct(lost.sum(), data_ns):.1f}% of that time while the thread that launched its next "
        "work was inside them (idle_causes)."
        if clock.has_gpu
        else " No GPU work in the capture: the data ranges hold up the CPU-side step itself."
    )
    threads = ", ".join(sorted({labels.get(t, f"tid {int(t) & 0xFFFFFF}") for t in data["global_tid"]}))
    return [
        _gained(
            "data_stall",
            f"Data loading takes {share:.1f}% of step time: the input pipeline starves the training loop",
            f"NVTX `{DATA_PHASE}` ranges on {threads}: {_ms(data_ns)} of {_ms(step_ns)} in {len(steps)} steps "
            f"({_ms(data_ns / len(steps))} per step). Inside them: "
            + (f"{doing}; " if doing else "no OS-runtime calls; ")
            + f"{_ms(data_ns - in_calls)} in the thread's own code.{gpu}",
            "Prepare batches ahead of the step: DataLoader(num_workers>0, prefetch_factor, persistent_workers=True, "
            "pin_memory=True), pre-tokenize the dataset, and keep file or network reads and sleeps/retries off the "
            "training thread.",
            clock,
            lost,
            f"GPU idle while the thread that launched the next GPU work was inside its `{DATA_PHASE}` ranges "
            "(idle_causes, the rows views.py gives this finding)"
            if clock.has_gpu
            else f"the `{DATA_PHASE}` ranges' time (no GPU work in the capture)",
            "the GPU kept running queued work through most of the data loading",
        )
    ]


# No calls summed yet (_summed).
_NO_SUMS = pd.DataFrame({"count": pd.Series(dtype="int64"), "sum": pd.Series(dtype="int64")})


def _summed(total: pd.DataFrame, batch: pd.DataFrame) -> pd.DataFrame:
    """A batch's count and sum per key (its index) added to those of the batches before, by key: a few rows
    per call name, however many calls are read."""
    if total.empty:
        return batch
    return pd.concat([total, batch]).groupby(level=batch.index.names).sum()


def _calls_inside(events: EventStore, merged: pd.DataFrame, threads) -> tuple[pd.DataFrame, int]:
    """The OS-runtime calls of `threads` inside the disjoint sorted `merged`: per call name (by name) their count
    and time inside it (`sum`), and how much of it some call covers. Read by start a batch at a time (a thread
    can make millions), their union handed over as it settles."""
    sums = _NO_SUMS
    calls_union, in_calls = intervals.RunningUnion(), 0
    for batch in events.batches(f'''SELECT start, "end", name FROM osrt WHERE {sql_in("global_tid", threads)}
                                   ORDER BY start, "row"'''):
        inside = intervals.covered_ns(merged, batch["start"], batch["end"])
        kept = batch[inside > 0].assign(inside=inside[inside > 0])
        calls_union.add(kept["start"].to_numpy("int64"), kept["end"].to_numpy("int64"))
        in_calls += int(intervals.covered_ns(merged, *calls_union.take_final()).sum())
        sums = _summed(sums, kept.groupby("name")["inside"].agg(["count", "sum"]))
    in_calls += int(intervals.covered_ns(merged, *calls_union.take_final(last=True)).sum())
    return sums, in_calls


def _lock_waits_in_steps(events: EventStore, training, steps: pd.DataFrame, marked: pd.DataFrame, clock: StepClock):
    """The lock calls (LOCK_WAIT_CALLS) of the `training` threads, their time inside the steps and outside the
    `data` ranges (`waited`): per thread and call name (by both) their count and waited time (`sum`), per thread
    its longest wait (the first of equal ones by start) as a one-row frame, and per step the GPU idle during
    them, at most the waits themselves. Read by start a batch at a time: a thread can make millions."""
    in_steps, in_data = intervals.union(steps), intervals.union(marked[marked["name"] == DATA_PHASE])
    sums = _NO_SUMS
    longest: dict = {}
    lost = np.zeros(len(clock.starts))
    where = f"{sql_in('name', sorted(LOCK_WAIT_CALLS))} AND {sql_in('global_tid', training)}"
    for batch in events.batches(f'''SELECT start, "end", duration, name, global_tid, pid, tid FROM osrt
                                   WHERE {where} ORDER BY start, "row"'''):
        waited = intervals.covered_ns(in_steps, batch["start"], batch["end"]) - intervals.covered_ns(
            in_data, batch["start"], batch["end"]
        )
        batch = batch.assign(waited=waited)[waited > 0]
        sums = _summed(sums, batch.groupby(["global_tid", "name"])["waited"].agg(["count", "sum"]))
        for tid, thread_waits in batch.groupby("global_tid"):
            top = thread_waits.loc[[thread_waits["waited"].idxmax()]]
            if tid not in longest or top["waited"].iloc[0] > longest[tid]["waited"].iloc[0]:
                longest[tid] = top
        idle = np.minimum(clock.idle_in(batch["start"], batch["end"]), batch["waited"].to_numpy())
        lost += clock.by_step(batch["start"], idle)
    return sums, longest, lost


def lock_waits(
    steps: pd.DataFrame,
    marked: pd.DataFrame,
    events: EventStore,
    threads: pd.DataFrame,
    labels: dict,
    clock: StepClock,
    idle_views: pd.DataFrame,
) -> list[Finding]:
    """Training threads waiting for locks inside the steps, where the most blocked one waits LOCK_WAIT_MIN_PCT
    of the step or the GPU idles MIN_SHARE_PCT in the waits. The gain is the idle time idle_causes puts on lock
    calls (views.py); without GPU work, the waits themselves. Waits inside `data` ranges are waits for data (a
    queue from loader workers) and belong to data_stall. `marked`: cpu.marked_ranges."""
    training = threads.loc[threads["role"] != "", "global_tid"]
    if steps.empty:
        return []
    sums, longest, lost = _lock_waits_in_steps(events, training, steps, marked, clock)
    if sums.empty:
        return []
    if clock.has_gpu:
        lost = views.per_step(idle_views, "lock_wait", clock)
    step_ns = int(steps["duration"].sum())
    per_thread = sums.groupby("global_tid")["sum"].sum().sort_values(ascending=False)
    if _pct(per_thread.iloc[0], step_ns) < LOCK_WAIT_MIN_PCT and clock.share(lost) < MIN_SHARE_PCT:
        return []
    parts = []
    for tid, waited in per_thread.items():
        calls = ", ".join(f"{name} {_ms(r['sum'])} ({int(r['count'])} calls)" for name, r in sums.loc[tid].iterrows())
        parts.append(f"{labels.get(tid, tid)} {_ms(waited)} ({_pct(waited, step_ns):.1f}% of step time): {calls}")
    worst_tid = per_thread.index[0]
    longest = longest[worst_tid]
    where = innermost_ranges(events, longest)
    place = f" in NVTX `{where.iloc[0]}`" if len(where) else ""
    return [
        _gained(
            "lock_wait",
            f"{labels.get(worst_tid, worst_tid)} waits for locks {_pct(per_thread.iloc[0], step_ns):.1f}% of step time",
            f"Lock waits inside the steps (outside NVTX `{DATA_PHASE}`): "
            + "; ".join(parts)
            + f". Longest single wait {_ms(longest['waited'].iloc[0])}{place}.",
            "Another thread holds a lock the training thread needs (a logger, checkpoint, metrics or queue): shorten "
            "the critical section, hand work over through a queue without holding the lock, or move that work out "
            "of the step.",
            clock,
            lost,
            "GPU idle while the thread that launched the next GPU work waited in a lock call (idle_causes, the rows "
            "views.py gives this finding)"
            if clock.has_gpu
            else "the lock waits themselves (no GPU work in the capture)",
            "the GPU kept running queued work through most of the waits",
        )
    ]


def empty_trace_kinds(tables: TraceTables) -> list[Finding]:
    """Trace kinds that were requested but recorded nothing (TraceTables.empty_trace_kinds: kind -> what the
    capture says about it), named once: their absence from the report is no evidence about the program."""
    messages = tables.empty_trace_kinds
    if not messages:
        return []
    kinds = ", ".join(messages)
    return [
        Finding(
            "empty_trace_kind",
            "info",
            f"Traced but recorded nothing in the window: {kinds}",
            "; ".join(f"{kind}: {text}" for kind, text in messages.items()) + ". The sections fed by them are empty "
            "for that reason alone.",
            "Nothing to fix in the program: drop these kinds from profile.trace, or check that the library's calls "
            "happen inside the capture window.",
        )
    ]


def cpu_scheduling(cores: pd.DataFrame, sched_traced: bool, tables: TraceTables) -> list[Finding]:
    """Per-core CPU use when context switches were traced; otherwise, for an nsys capture (other
    trace formats cannot have it), say how to get it."""
    if not sched_traced and from_nsys(tables.source_path):
        return [
            Finding(
                "no_cpu_scheduling",
                "info",
                "CPU scheduling was not traced",
                "No SCHED_EVENTS: per-core CPU utilisation and when each thread ran (vs waited) are unknown.",
                f"Add {CPU_SCHED_SWITCH} to nsys profile (profile.cpuctxsw: process-tree).",
            )
        ]
    if not sched_traced or cores.empty:
        return []
    busiest = cores.sort_values("busy_pct").iloc[-1]
    return [
        Finding(
            "cpu_cores",
            "info",
            f"The program ran on {len(cores)} CPU cores, {cores['busy_pct'].mean():.1f}% busy on average",
            "Share of each core's time running the profiled program's threads: "
            + ", ".join(f"CPU {int(r.cpu)} {r.busy_pct:.1f}%" for r in cores.itertuples())
            + f"; busiest CPU {int(busiest.cpu)} ({int(busiest.threads)} threads ran on it).",
        )
    ]


def nvtx_projection(projection: pd.DataFrame) -> list[Finding]:
    """Which NVTX ranges the GPU time was launched from, and how much was launched outside any range."""
    if projection.empty:
        return []
    named = projection[~projection["range"].str.startswith("(")]
    outside = projection[projection["range"].str.startswith("(")]
    parts = ", ".join(f"`{r.range}` {r.gpu_pct:.1f}%" for r in named.head(5).itertuples())
    outside_pct = float(outside["gpu_pct"].sum())
    unnamed = ", ".join(
        f"{r.range[1:-1].removeprefix('no NVTX range, ')} {r.gpu_pct:.1f}%"  # the outer parentheses only
        for r in outside.head(3).itertuples()
    )
    return [
        Finding(
            "nvtx_gpu_time",
            "info",
            f"{100 - outside_pct:.1f}% of kernel time is launched inside NVTX ranges",
            f"Kernel time by the innermost range its launch was made in: {parts or 'none'}"
            + (f"; outside every range: {unnamed}" if len(outside) else "")
            + ".",
            "Kernels launched outside the ranges come from threads without NVTX ranges, usually PyTorch's autograd "
            "thread running backward: torch.autograd.profiler.emit_nvtx() gives every op a range on the thread that "
            "runs it."
            if outside_pct >= WARNING_SHARE_PCT
            else "",
        )
    ]
