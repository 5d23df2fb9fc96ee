"""Analyses: pure functions from TraceTables to DataFrames and findings.

`analyze` runs them all and gathers the result; the report only renders what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from sftprof.analysis import boundness, cpu, cuda, gpu, kernels, memory, nvtx, rules, sched, utilisation
from sftprof.analysis.findings import Finding
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
                        "No NVTX range named `step N` was recorded, so per-step timing is unavailable.",
                        "Trace NVTX (`--trace=...,nvtx`) and annotate each training step with an NVTX range.")]
    findings = []
    phase_totals = {phase: int(steps[f"{phase}_ns"].sum()) for phase in cpu.PHASES}
    step_total = int(steps["duration"].sum())
    top_phase = max(phase_totals, key=phase_totals.get)
    share = 100.0 * phase_totals[top_phase] / step_total if step_total else 0.0
    breakdown = ", ".join(f"{p} {100.0 * t / step_total:.1f}%" for p, t in phase_totals.items())
    findings.append(Finding("dominant_phase", "info", f"{top_phase} takes {share:.1f}% of step time",
                            f"Over {len(steps)} captured steps ({step_total / 1e9:.3f} s): {breakdown}.",
                            _PHASE_ADVICE[top_phase]))
    median = float(steps["duration"].median())
    slow = steps[steps["duration"] > SLOW_STEP_FACTOR * median]
    if not slow.empty:
        listed = ", ".join(f"step {int(r.step)} {r.duration / 1e6:.1f} ms"
                           for r in slow.nlargest(rules.STEPS_LISTED, "duration").sort_values("start").itertuples())
        if len(slow) > rules.STEPS_LISTED:
            listed += f" and {len(slow) - rules.STEPS_LISTED:,} more (the slowest listed)"
        findings.append(Finding("slow_steps", "warning", f"{len(slow)} step(s) over {SLOW_STEP_FACTOR}x the median",
                                f"Median step {median / 1e6:.1f} ms; slow: {listed}.",
                                "Look at what else ran then (first-step warm-up, allocator growth, data "
                                "loading, other processes); keep warm-up steps out of the profiling window."))
    return findings


_PHASE_ADVICE = {
    "data": "The input pipeline dominates: prefetch with DataLoader workers and pinned memory, and tokenize ahead of time.",
    "forward": "Forward dominates: check kernel mix and precision (bf16/FP8 autocast), fuse attention (SDPA/flash).",
    "backward": "Backward dominates, as is usual (about 2x forward): gains come from faster kernels "
                "(mixed precision, fused ops) or activation recomputation trade-offs.",
    "optimizer": "The optimizer step dominates: use a fused/foreach AdamW, or accumulate more micro-batches per step.",
}


def _gpu_findings(tables: TraceTables, kernel_sum: pd.DataFrame, kernel_ns: int, busy: pd.DataFrame) -> list[Finding]:
    if kernel_sum.empty and tables.memops.empty:
        how = ("the capture traced no CUDA (`cuda` is not in profile.trace)" if "cuda" not in tables.sources
               else "CUDA was traced but no GPU work was recorded in the window")
        return [Finding("no_gpu_activity", "info", "No GPU activity in this capture",
                        f"No kernels or memory operations: {how}.",
                        "On a GPU node, add `cuda` (and `cudnn`, `cublas`) to profile.trace to answer the GPU "
                        "questions: dominant kernels, memory-transfer share, idle gaps.")]
    findings = []
    if not kernel_sum.empty:
        top = kernel_sum.iloc[0]
        findings.append(Finding("top_kernel", "info", f"Top kernel takes {top.time_pct}% of kernel time",
                                f"{top.kernel} ({top.instances} instances, {top.total_ns / 1e6:.3f} ms)."))
    memop_ns = int(tables.memops["duration"].sum())
    if kernel_ns + memop_ns:
        share = 100.0 * memop_ns / (kernel_ns + memop_ns)
        findings.append(Finding("memory_transfer_share", "warning" if share > 10 else "info",
                                f"Memory operations are {share:.1f}% of GPU time",
                                f"{memop_ns / 1e6:.3f} ms of memcpy/memset vs {kernel_ns / 1e6:.3f} ms of kernels.",
                                "Transfers are not the bottleneck." if share <= 10 else
                                "Overlap copies with compute (pinned memory, non_blocking copies, prefetch)."))
    for row in busy.itertuples():
        findings.append(Finding("gpu_busy", "warning" if row.busy_pct < 80 else "info",
                                f"GPU {row.device_id} busy {row.busy_pct:.1f}% of its active span",
                                f"{row.busy_ns / 1e6:.3f} ms busy in {row.span_ns / 1e6:.3f} ms (union over streams).",
                                "" if row.busy_pct >= 80 else
                                "The GPU waits on the CPU: look at the thread table for what the main thread does."))
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


def analyze(tables: TraceTables, progress: Callable[[str], None] = lambda step: None) -> Analysis:
    """Every analysis of one capture; `progress(step)` is called as each group of them starts.

    The heaviest analyses that need little else computed here (the CUDA API summary, the NVTX
    projection, memory operations' calls, sync calls) run on a second thread beside the rest: DuckDB
    and numpy release the GIL, and one analysis alone leaves part of a core idle."""
    tables = tables.with_all_columns()
    events = tables.events
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
        kernel_sum = gpu.kernel_summary(events)
        totals = gpu.kernel_totals(events)
        names = kernels.name_totals(events)
        families = kernels.family_summary(names)
        precision = kernels.gemm_precision(names)
        mix = kernels.kernel_mix(names)
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
        launching = set(api_threads["global_tid"])
        feeders = {tid: label for tid, label in labels.items() if tid in launching}  # the threads that feed the GPU
        causes = utilisation.gap_causes(gaps, tables, feeders)
        kind_share = memory.kind_share(totals["total_ns"], memops)
        host_memory = memory.host_memory(memops)
        runs = sched.on_cpu_intervals(tables.sched, tables.span_ns)
        cores = sched.core_summary(runs, tables.span_ns)
        sched_traced = "cpuctxsw" in tables.sources or not tables.sched.empty
        api_summary, copies = api_summary.result(), copies.result()
        launch = cuda.launch_overhead(api_summary)
        progress(STEPS[3])
        projection, sync_calls = projection.result(), sync_calls.result()
    progress(STEPS[4])

    result = Analysis(source_path=tables.source_path, span_ns=tables.span_ns, sources=sorted(tables.sources))
    result.tables = {
        "kernels": kernel_sum,
        "kernel_families": families,
        "gemm_precision": precision,
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
    }
    sets = copies[copies["copy_kind"] == memory.MEMSET_KIND]
    findings = (
        rules.dropped_rows(tables.dropped_rows)
        + _gpu_findings(tables, kernel_sum, totals["total_ns"], busy)
        + ([boundness.verdict_finding(verdict)] if verdict else [])
        + rules.launch_bound(totals, launch, busy, timeline, gaps, steps)
        + rules.idle_gaps(gaps, causes, busy)
        + rules.memory_bound_mix(families, mix, busy_pct)
        + rules.fp32_gemm(precision)
        + rules.interconnect(kind_share, host_memory, memory.interconnect_share(totals["total_ns"], memops),
                             int(totals["total_ns"] + memops["duration"].sum()))
        + rules.sync_memcpy(copies, tables.span_ns, labels, tables.nvtx)
        + rules.pageable_memcpy(copies, tables.span_ns, labels, tables.nvtx)
        + rules.sync_memset(sets, tables.span_ns, labels)
        + rules.syncs_in_steps(waits, steps, labels, tables.nvtx)
        + _step_findings(steps)
        + rules.data_stall(steps, tables.nvtx, tables.osrt, gpu.all_devices_busy(busy_by_device), labels)
        + rules.lock_waits(steps, tables.nvtx, tables.osrt, threads, labels)
        + _thread_findings(threads, tables.span_ns)
        + rules.cpu_scheduling(cores, sched_traced, Path(tables.source_path).suffix in NSYS_SUFFIXES)
        + rules.nvtx_projection(projection))
    result.findings = sorted(findings, key=lambda f: f.severity != "warning")  # problems first, else in order
    top = kernel_sum.iloc[0] if len(kernel_sum) else None
    result.headline = {
        "capture_s": tables.span_ns / 1e9,
        "steps_captured": len(steps),
        "median_step_ms": float(steps["duration"].median()) / 1e6 if len(steps) else None,
        "kernels": totals["count"],
        "application_threads": len(threads),
        "osrt_calls": len(tables.osrt),
        "nvtx_ranges": len(tables.nvtx),
        "top_kernel": str(top.kernel) if top is not None else None,
        "top_kernel_pct": float(top.time_pct) if top is not None else None,
        "kernel_family_pct": {row.family: round(float(row.time_pct), 2) for row in families.itertuples()},
        "tensor_core_pct": mix["tensor_core_pct"] if totals["count"] else None,
        "memop_gpu_time_pct": float(kind_share["gpu_time_pct"].sum()) if len(kind_share) else None,
        "gpu_busy_pct": busy_pct,
        "gpu_idle_gaps": len(gaps),
        "verdict": (("host-bound, kernels " if verdict["host_bound"] else "") + verdict["kernels"]) if verdict else None,
        "verdict_confidence": verdict["confidence"] if verdict else None,
        "warnings": sorted({f.rule for f in result.findings if f.severity == "warning"}),
    }
    return result
