"""Analyses: pure functions from TraceTables to DataFrames and findings.

`analyze` runs them all and gathers the result; the report only renders what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sftprof.analysis import (accounting, boundness, cpu, cuda, efficiency, gains, gpu, kernels, memory, nvtx, rules,
                              sched, utilisation)
from sftprof.analysis.findings import Finding, ranked, severity_of
from sftprof.trace.metrics import RunMetrics
from sftprof.trace.tables import TraceTables

# Traces from nsys (other formats, e.g. Kineto, cannot record CPU scheduling at all).
NSYS_SUFFIXES = {".sqlite", ".nsys-rep"}
# A step this much slower than the median step is an outlier worth naming.
SLOW_STEP_FACTOR = 1.5
# A training thread blocked in OS calls for less of the capture than this is not worth a finding.
BLOCKED_SHARE = 0.10


@dataclass
class Analysis:
    source_path: str
    span_ns: int
    sources: list[str]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    headline: dict = field(default_factory=dict)


def _step_findings(steps: pd.DataFrame) -> list[Finding]:
    if steps.empty:
        return [Finding("no_steps", "info", "No training-step ranges in the capture",
                        "No NVTX range named `step N` (nor a PyTorch profiler `ProfilerStep#N`) was recorded, so "
                        "per-step timing is unavailable and gains are shares of the whole capture.",
                        "Trace NVTX (`--trace=...,nvtx`) and annotate each training step with an NVTX range.")]
    findings = []
    phase_totals = {phase: int(steps[f"{phase}_ns"].sum()) for phase in cpu.PHASES}
    step_total = int(steps["duration"].sum())
    if sum(phase_totals.values()):  # no phase ranges, no evidence about phases
        top_phase = max(phase_totals, key=phase_totals.get)
        share = 100.0 * phase_totals[top_phase] / step_total if step_total else 0.0
        breakdown = ", ".join(f"{p} {100.0 * t / step_total:.1f}%" for p, t in phase_totals.items())
        findings.append(Finding("dominant_phase", "info", f"{top_phase} takes {share:.1f}% of step time",
                                f"Over {len(steps)} captured steps ({step_total / 1e9:.3f} s), wall time of the "
                                f"phase ranges on the CPU: {breakdown}.", _PHASE_ADVICE[top_phase]))
    median = float(steps["duration"].median())
    slow = steps[steps["duration"] > SLOW_STEP_FACTOR * median]
    if not slow.empty:
        listed = ", ".join(f"step {int(r.step)} {r.duration / 1e6:.1f} ms"
                           for r in slow.nlargest(rules.STEPS_LISTED, "duration").sort_values("start").itertuples())
        if len(slow) > rules.STEPS_LISTED:
            listed += f" and {len(slow) - rules.STEPS_LISTED:,} more (the slowest listed)"
        excess = float((slow["duration"] - median).sum()) / len(steps)
        gain = round(min(100.0, 100.0 * excess / median), 3) if median else 0.0
        findings.append(Finding("slow_steps", severity_of(gain),
                                f"{len(slow)} step(s) over {SLOW_STEP_FACTOR}x the median",
                                f"Median step {median / 1e6:.1f} ms; slow: {listed}.",
                                "Look at what else ran then (first-step warm-up, allocator growth, data "
                                "loading, other processes); keep warm-up steps out of the profiling window.",
                                gain, f"the slow steps' time over the median step, averaged over all {len(steps)} "
                                      f"steps ({excess / 1e6:,.3f} ms) / {median / 1e6:,.3f} ms median step"))
    return findings


# Phase times are the CPU's wall time in the phase ranges: they say where the CPU spent the step, not
# what the GPU did; the kernel findings say that.
_PHASE_ADVICE = {
    "data": "The input pipeline dominates: prefetch with DataLoader workers and pinned memory, and tokenize ahead "
            "of time.",
    "forward": "Forward holds the CPU longest: see the kernel and launch findings for what its time goes to.",
    "backward": "Backward holds the CPU longest: see the kernel and launch findings for what its time goes to.",
    "optimizer": "The optimizer step holds the CPU longest: a fused optimizer (AdamW(fused=True)) launches a few "
                 "kernels instead of one per foreach operation; accumulating more micro-batches runs it less often.",
}


def _top_kernel_by_name(names: pd.DataFrame) -> pd.Series | None:
    """The kernel with the most time by name, all its launch shapes together (as the Nsight GUI lists
    kernels), with its `instances`, `duration` and share of all kernel time (`time_pct`)."""
    if names.empty or not names["duration"].sum():
        return None
    by_name = names.assign(kernel=names["name"].fillna(names["short_name"]).astype(str)).groupby("kernel")
    totals = by_name[["duration", "instances"]].sum().sort_values("duration", ascending=False)
    top = totals.iloc[0]
    return pd.Series({"kernel": totals.index[0], "instances": int(top["instances"]), "duration": int(top["duration"]),
                      "time_pct": round(100.0 * top["duration"] / totals["duration"].sum(), 1)})


def _gpu_findings(tables: TraceTables, kernel_sum: pd.DataFrame, top: pd.Series | None, kernel_ns: int,
                  busy: pd.DataFrame) -> list[Finding]:
    if kernel_sum.empty and tables.memops.empty:
        how = ("the capture traced no CUDA (`cuda` is not in profile.trace)" if "cuda" not in tables.sources
               else "CUDA was traced but no GPU work was recorded in the window")
        return [Finding("no_gpu_activity", "info", "No GPU activity in this capture",
                        f"No kernels or memory operations: {how}.",
                        "On a GPU node, add `cuda` (and `cudnn`, `cublas`) to profile.trace to answer the GPU "
                        "questions: dominant kernels, memory-transfer share, idle gaps.")]
    findings = []
    if top is not None:
        shapes = int((kernel_sum["kernel"] == top.kernel).sum())
        findings.append(Finding("top_kernel", "info", f"Top kernel takes {top.time_pct}% of kernel time",
                                f"{top.kernel} ({top.instances} instances, {top.duration / 1e6:.3f} ms, "
                                f"{shapes} launch shape{'s' if shapes != 1 else ''})."))
    memop_ns = int(tables.memops["duration"].sum())
    if kernel_ns + memop_ns:
        share = 100.0 * memop_ns / (kernel_ns + memop_ns)
        findings.append(Finding("memory_transfer_share", "info", f"Memory operations are {share:.1f}% of GPU time",
                                f"{memop_ns / 1e6:.3f} ms of memcpy/memset vs {kernel_ns / 1e6:.3f} ms of kernels. "
                                "What hiding them could save: see the copy and interconnect findings."))
    for row in busy.itertuples():
        findings.append(Finding("gpu_busy", "info", f"GPU {row.device_id} busy {row.busy_pct:.1f}% of its active span",
                                f"{row.busy_ns / 1e6:.3f} ms busy in {row.span_ns / 1e6:.3f} ms (union over streams). "
                                f"Its idle time is the most that feeding it better can win; the findings with gains "
                                "say which cause holds how much of it."))
    return findings


# OS-runtime calls in which a thread waits for another thread or for the GPU.
WAIT_CALLS = {"pthread_cond_wait", "pthread_cond_timedwait", "sem_wait", "sem_timedwait", "futex", "poll",
              "epoll_wait", "pthread_mutex_lock"}
_WAIT_ADVICE = ("Waiting on the training threads is waiting on another thread (the autograd engine hands backward "
                "work to pt_autograd_*) or on the GPU. Read it with the GPU busy time: if the GPU is idle too, the "
                "CPU issues work too slowly (small kernels, Python overhead: try larger micro-batches, "
                "torch.compile or CUDA graphs).")


def _thread_findings(threads: pd.DataFrame, span_ns: int) -> list[Finding]:
    training = threads[(threads["role"] != "") & (threads["osrt_ns"] > 0)]
    if training.empty or not span_ns or training["osrt_ns"].max() < BLOCKED_SHARE * span_ns:
        return []
    parts = [f"{t.thread_name} ({t.role}, tid {t.tid}) {t.osrt_ns / 1e6:.3f} ms = {100.0 * t.osrt_ns / span_ns:.1f}% "
             f"of the capture, most in {t.top_osrt_call} ({t.top_osrt_ns / 1e6:.3f} ms)"
             for t in training.itertuples()]
    worst = training.iloc[0]
    return [Finding("training_thread_blocking", "info",
                    f"{worst.thread_name} ({worst.role} thread) blocks {100.0 * worst.osrt_ns / span_ns:.1f}% of "
                    f"the capture in OS calls, mostly {worst.top_osrt_call}",
                    "Time blocked in OS-runtime calls inside the capture: " + "; ".join(parts) + ".",
                    _WAIT_ADVICE if worst.top_osrt_call in WAIT_CALLS else
                    f"{worst.top_osrt_call} on a training thread stalls the step: move it off the training loop "
                    "(a background thread or process), or do it less often.")]



def _gpu_busy_pct(busy: pd.DataFrame) -> float | None:
    """Busy share of the GPUs' active spans, all devices together; None without GPU work."""
    span = busy["span_ns"].sum()
    return float(100.0 * busy["busy_ns"].sum() / span) if span else None


# What analyze() reports to `progress` as it goes, in order.
STEPS = ("kernels", "GPU busy time", "CUDA API calls and threads", "NVTX ranges", "findings")


def _run_steps(metrics: RunMetrics) -> pd.DataFrame:
    """The trainer's steps that MFU and padding are measured on: all but the first (warm-up:
    allocator growth, autotuning, compilation) where there are more."""
    steps = metrics.steps
    return steps.iloc[1:] if len(steps) > 1 else steps


def analyze(tables: TraceTables, progress: Callable[[str], None] = lambda step: None,
            metrics: RunMetrics | None = None) -> Analysis:
    """Every analysis of one capture; `progress(step)` is called as each group of them starts.
    `metrics`: the trainer's metrics of the same run, where there are any: its precision (kernel names
    often do not tell it, and advice must not offer a run what it already has), token counts
    (padding) and model facts (MFU).

    The heaviest analyses that need little else computed here (the CUDA API summary, the NVTX
    projection, memory operations' calls, sync calls, elementwise chains) run on a second thread
    beside the rest: DuckDB and numpy release the GIL, and one analysis alone leaves part of a core idle."""
    tables = tables.with_all_columns()
    events = tables.events
    metrics = metrics or RunMetrics()
    precision = efficiency.run_precision(metrics.run)
    with ThreadPoolExecutor(1) as beside:
        progress(STEPS[0])
        # First beside the kernel summaries, not beside the busy-time union: both hold many rows.
        api_summary = beside.submit(gpu.cuda_api_summary, events)
        waits = cuda.host_wait_calls(events)
        api_threads = cuda.calls_by_thread(events)
        threads = cpu.thread_summary(tables, waits, api_threads)
        labels = cpu.thread_labels(threads)
        projection = beside.submit(nvtx.gpu_time_by_range, tables.nvtx, events, labels)
        memops = tables.memops.assign(copy_kind=memory.copy_kinds(tables.memops))
        copies = beside.submit(cuda.with_api_calls, memops, events)
        sync_calls = beside.submit(cuda.sync_calls, events, tables.span_ns)
        chains = beside.submit(gains.elementwise_chains, events)
        kernel_sum = gpu.kernel_summary(events)
        totals = gpu.kernel_totals(events)
        names = kernels.name_totals(events)
        top_kernel = _top_kernel_by_name(names)
        families = kernels.family_summary(names)
        precision_table = kernels.gemm_precision(names)
        mix = kernels.kernel_mix(names)
        foreach = gains.foreach_optimizer_kernels(events)
        progress(STEPS[1])
        busy_by_device = gpu.busy_by_device(events, memops)
        busy = gpu.gpu_busy(busy_by_device)
        busy_pct = _gpu_busy_pct(busy)
        gaps = utilisation.idle_gaps(busy_by_device)
        timeline = utilisation.utilisation_timeline(events, busy_by_device)
        metric_means = boundness.metric_means_while_busy(tables.gpu_metrics, busy_by_device)
        verdict = boundness.verdict(mix, busy_pct, metric_means) if totals["count"] else None
        progress(STEPS[2])
        steps = cpu.step_table(tables.nvtx)
        clock = gains.StepClock.of(steps, tables.span_ns, gpu.all_devices_busy(busy_by_device),
                                   gains.cpu_waits(events, waits))
        launching = set(api_threads["global_tid"])
        feeders = {tid: label for tid, label in labels.items() if tid in launching}  # the threads that feed the GPU
        causes = utilisation.gap_causes(gaps, tables, feeders)
        kind_share = memory.kind_share(totals["total_ns"], memops)
        host_memory = memory.host_memory(memops)
        runs = sched.on_cpu_intervals(tables.sched, tables.span_ns)
        cores = sched.core_summary(runs, tables.span_ns)
        sched_traced = "cpuctxsw" in tables.sources or not tables.sched.empty
        api_summary, copies = api_summary.result(), copies.result()
        kernels_busy = gpu.all_devices_busy(gpu.busy_by_device(events, memops.iloc[:0]))
        beside_kernels = gains.kernel_time_in(kernels_busy, copies["start"], copies["end"])
        copies = copies.assign(exposed_ns=copies["duration"] - beside_kernels)  # a copy's time with no kernel running
        launch = cuda.launch_overhead(api_summary)
        progress(STEPS[3])
        step_costs = accounting.step_accounting(tables, waits)
        projection, sync_calls, chains = projection.result(), sync_calls.result(), chains.result()
    progress(STEPS[4])

    bound = accounting.run_bound(step_costs)
    run_steps = _run_steps(metrics)
    padded = efficiency.padding(run_steps)
    device = tables.gpus["name"].dropna().iloc[0] if len(tables.gpus) and tables.gpus["name"].notna().any() else None
    utilization = efficiency.mfu(run_steps, metrics.run, device)
    # Work that grows with the tokens: every kernel of the step but the optimizer's (per parameter).
    token_ns = (float((step_costs["kernel_ns"] - step_costs[f"{cpu.PHASES[-1]}_gpu_ns"]).median())
                if len(step_costs) else None)
    result = Analysis(source_path=tables.source_path, span_ns=tables.span_ns, sources=sorted(tables.sources))
    result.tables = {
        "kernels": kernel_sum,
        "kernel_families": families,
        "gemm_precision": precision_table,
        "memops": gpu.memop_summary(memops),
        "memops_by_size": memory.size_summary(memops),
        "memop_kinds": kind_share,
        "host_memory": host_memory,
        "cuda_api": api_summary,
        "launch_overhead": launch,
        "sync_calls": sync_calls,
        "sync_activity": cuda.sync_activity(tables.sync),
        "gpu_busy": busy,
        "gpu_gaps": gaps,
        "gap_causes": causes,
        "gpu_timeline": timeline,
        "step_gpu": utilisation.step_utilisation(steps, busy_by_device),
        "bound_evidence": boundness.evidence_table(mix, busy_pct, metric_means) if verdict else pd.DataFrame(),
        "osrt": cpu.osrt_summary(tables.osrt),
        "nvtx": cpu.nvtx_summary(tables.nvtx),
        "nvtx_gpu": projection,
        "steps": steps,
        "phases": cpu.phase_ranges(tables.nvtx),
        "threads": threads,
        "thread_osrt": cpu.thread_osrt(tables, threads),
        "thread_states": cpu.thread_states(threads, runs, tables.span_ns, sched_traced,
                                           "cuda" in tables.sources or not api_summary.empty),
        "cpu_cores": cores,
        "cpu_timeline": sched.core_timeline(runs, tables.span_ns),
        "step_accounting": step_costs,
        "padding": padded.steps,
        "mfu": utilization.steps if utilization else pd.DataFrame(),
    }
    sets = copies[copies["copy_kind"] == memory.MEMSET_KIND]
    findings = (
        rules.dropped_rows(tables.dropped_rows)
        + rules.empty_trace_kinds(tables.empty_trace_kinds)
        + rules.sync_memcpy(copies, clock, labels, tables.nvtx)
        + rules.sync_memset(sets, clock, labels)
        + rules.syncs_in_steps(waits, steps, labels, tables.nvtx, clock)
        + rules.pageable_memcpy(copies, clock, labels, tables.nvtx)
        + rules.data_stall(steps, tables.nvtx, tables.osrt, clock, labels)
        + rules.lock_waits(steps, tables.nvtx, tables.osrt, threads, labels, clock)
        + rules.idle_gaps(gaps, causes, busy, clock)
        + rules.launch_bound(totals, launch, busy, timeline, gaps, steps, clock)
        + rules.foreach_optimizer(foreach, clock)
        + rules.memory_bound_mix(families, mix, chains, clock)
        + rules.padding(padded.padding_pct / 100 if padded.padding_pct is not None else None, token_ns,
                        clock.step_ns if clock.has_steps else None)
        + rules.fp32_gemm(precision_table, clock, precision)
        + rules.interconnect(kind_share, host_memory, memory.interconnect_share(totals["total_ns"], memops),
                             int(totals["total_ns"] + memops["duration"].sum()), copies, clock)
        + _gpu_findings(tables, kernel_sum, top_kernel, totals["total_ns"], busy)
        + ([boundness.verdict_finding(verdict, precision_table, precision)] if verdict else [])
        + _step_findings(steps)
        + _thread_findings(threads, tables.span_ns)
        + rules.cpu_scheduling(cores, sched_traced, Path(tables.source_path).suffix in NSYS_SUFFIXES)
        + rules.nvtx_projection(projection))
    result.findings = ranked(findings)
    result.headline = {
        "capture_s": tables.span_ns / 1e9,
        "steps_captured": len(steps),
        "median_step_ms": float(steps["duration"].median()) / 1e6 if len(steps) else None,
        "kernels": totals["count"],
        "application_threads": len(threads),
        "osrt_calls": len(tables.osrt),
        "nvtx_ranges": len(tables.nvtx),
        "top_kernel": str(top_kernel.kernel) if top_kernel is not None else None,
        "top_kernel_pct": float(top_kernel.time_pct) if top_kernel is not None else None,
        "kernel_family_pct": {row.family: round(float(row.time_pct), 2) for row in families.itertuples()},
        "tensor_core_pct": mix["tensor_core_pct"] if totals["count"] else None,
        "memop_gpu_time_pct": float(kind_share["gpu_time_pct"].sum()) if len(kind_share) else None,
        "gpu_busy_pct": busy_pct,
        "gpu_idle_gaps": len(gaps),
        "verdict": (("host-bound, kernels " if verdict["host_bound"] else "") + verdict["kernels"]) if verdict else None,
        "verdict_confidence": verdict["confidence"] if verdict else None,
        "bound_class": bound["bound_class"],
        "mfu_pct": utilization.hardware_mfu_pct if utilization else None,
        "useful_mfu_pct": utilization.useful_mfu_pct if utilization else None,
        "padding_pct": padded.padding_pct,
        "sm_busy_pct": bound["sm_busy_pct"],
        "copy_busy_pct": bound["copy_busy_pct"],
        "warnings": sorted({f.rule for f in result.findings if f.severity == "warning"}),
    }
    return result
