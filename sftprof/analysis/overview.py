"""The run at a glance: the top kernel, how busy each GPU was, the steps and their phases, and the
training threads' blocking. Informational findings (no gain: they describe, the rules judge)."""

from __future__ import annotations

import pandas as pd

from sftprof.analysis import cpu, rules
from sftprof.analysis.findings import Finding, severity_of
from sftprof.trace.tables import TraceTables

# A step this much slower than the median step is an outlier worth naming.
SLOW_STEP_FACTOR = 1.5
# A training thread blocked in OS calls for less of the capture than this is not worth a finding.
BLOCKED_SHARE = 0.10


def step_findings(steps: pd.DataFrame) -> list[Finding]:
    """The phase that holds the CPU longest in the steps, and steps far slower than the median."""
    if steps.empty:
        return [
            Finding(
                "no_steps",
                "info",
                "No training-step ranges in the capture",
                "No NVTX range named `step N` (nor a PyTorch profiler `ProfilerStep#N`) was recorded, so "
                "per-step timing is unavailable and gains are shares of the whole capture.",
                "Trace NVTX (`--trace=...,nvtx`) and annotate each training step with an NVTX range.",
            )
        ]
    findings = []
    phase_totals = {phase: int(steps[f"{phase}_ns"].sum()) for phase in cpu.PHASES}
    step_total = int(steps["duration"].sum())
    if sum(phase_totals.values()):  # no phase ranges, no evidence about phases
        top_phase = max(phase_totals, key=lambda phase: phase_totals[phase])
        share = 100.0 * phase_totals[top_phase] / step_total if step_total else 0.0
        breakdown = ", ".join(f"{p} {100.0 * t / step_total:.1f}%" for p, t in phase_totals.items())
        findings.append(
            Finding(
                "dominant_phase",
                "info",
                f"{top_phase} takes {share:.1f}% of step time",
                f"Over {len(steps)} captured steps ({step_total / 1e9:.3f} s), wall time of the "
                f"phase ranges on the CPU: {breakdown}.",
                _PHASE_ADVICE[top_phase],
            )
        )
    median = float(steps["duration"].median())
    slow = steps[steps["duration"] > SLOW_STEP_FACTOR * median]
    if not slow.empty:
        listed = ", ".join(
            f"step {int(r.step)} {r.duration / 1e6:.1f} ms"
            for r in slow.nlargest(rules.STEPS_LISTED, "duration").sort_values("start").itertuples()
        )
        if len(slow) > rules.STEPS_LISTED:
            listed += f" and {len(slow) - rules.STEPS_LISTED:,} more (the slowest listed)"
        over = float((slow["duration"] - median).sum())
        gain = round(min(100.0, 100.0 * over / step_total), 3) if step_total else 0.0
        findings.append(
            Finding(
                "slow_steps",
                severity_of(gain),
                f"{len(slow)} step(s) over {SLOW_STEP_FACTOR}x the median",
                f"Median step {median / 1e6:.1f} ms; slow: {listed}.",
                "Look at what else ran then (first-step warm-up, allocator growth, data "
                "loading, other processes); keep warm-up steps out of the profiling window.",
                gain,
                f"the slow steps' time over the median step, averaged over all {len(steps)} "
                f"steps ({over / len(steps) / 1e6:,.3f} ms) / {step_total / len(steps) / 1e6:,.3f} ms mean step: what "
                "the run saves if they take the median's time",
            )
        )
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


def top_kernel_by_name(names: pd.DataFrame) -> pd.Series | None:
    """The kernel with the most time by name, all its launch shapes together (as the Nsight GUI lists
    kernels), with its `instances`, `duration` and share of all kernel time (`time_pct`)."""
    if names.empty or not names["duration"].sum():
        return None
    by_name = names.assign(kernel=names["name"].fillna(names["short_name"]).astype(str)).groupby("kernel")
    totals = by_name[["duration", "instances"]].sum().sort_values("duration", ascending=False)
    top = totals.iloc[0]
    return pd.Series(
        {
            "kernel": totals.index[0],
            "instances": int(top["instances"]),
            "duration": int(top["duration"]),
            "time_pct": round(100.0 * top["duration"] / totals["duration"].sum(), 1),
        }
    )


def gpu_findings(
    tables: TraceTables,
    kernel_sum: pd.DataFrame,
    top: pd.Series | None,
    kernel_totals: dict,
    memops: dict,
    busy: pd.DataFrame,
) -> list[Finding]:
    """The top kernel by name, the share of memory operations (`memops`: memory.totals) in GPU time, and
    each GPU's busy share."""
    if kernel_sum.empty and not memops["count"]:
        # An export tells "not traced" from "no CUDA calls" only where some CUDA call was recorded.
        how = (
            "CUDA calls were traced but no GPU work was recorded in the window"
            if "cuda" in tables.sources
            else "the capture holds no CUDA calls (a run on the CPU, or `cuda` left out of profile.trace)"
        )
        return [
            Finding(
                "no_gpu_activity",
                "info",
                "No GPU activity in this capture",
                f"No kernels or memory operations: {how}.",
                "Train on a GPU (`sft.device: cuda`) with `cuda` in profile.trace (its default) to answer the GPU "
                "questions: dominant kernels, memory-transfer share, idle gaps.",
            )
        ]
    findings = []
    if top is not None:
        shapes = int((kernel_sum["kernel"] == top.kernel).sum())
        findings.append(
            Finding(
                "top_kernel",
                "info",
                f"Top kernel takes {top.time_pct}% of kernel time",
                f"{top.kernel} ({top.instances} instances, {top.duration / 1e6:.3f} ms, "
                f"{shapes} launch shape{'s' if shapes != 1 else ''}).",
            )
        )
    kernel_ns, memop_ns = kernel_totals["total_ns"], memops["ns"]
    if kernel_ns + memop_ns:
        share = 100.0 * memop_ns / (kernel_ns + memop_ns)
        findings.append(
            Finding(
                "memory_transfer_share",
                "info",
                f"Memory operations are {share:.1f}% of GPU time",
                f"{memop_ns / 1e6:.3f} ms of memcpy/memset vs {kernel_ns / 1e6:.3f} ms of kernels. "
                "What hiding them could save: see the copy and interconnect findings.",
            )
        )
    for row in busy.itertuples():
        findings.append(
            Finding(
                "gpu_busy",
                "info",
                f"GPU {row.device_id} busy {row.busy_pct:.1f}% of its active span",
                f"{row.busy_ns / 1e6:.3f} ms busy in {row.span_ns / 1e6:.3f} ms (union over streams). "
                f"Its idle time is the most that feeding it better can win; the findings with gains "
                "say which cause holds how much of it.",
            )
        )
    return findings


# OS-runtime calls in which a thread waits for another thread or for the GPU.
WAIT_CALLS = {
    "pthread_cond_wait",
    "pthread_cond_timedwait",
    "sem_wait",
    "sem_timedwait",
    "futex",
    "poll",
    "epoll_wait",
    "pthread_mutex_lock",
}
_WAIT_ADVICE = (
    "Waiting on the training threads is waiting on another thread (the autograd engine hands backward "
    "work to pt_autograd_*) or on the GPU. Read it with the GPU busy time: if the GPU is idle too, the "
    "CPU issues work too slowly (small kernels, Python overhead: try larger micro-batches, "
    "torch.compile or CUDA graphs)."
)


def thread_findings(threads: pd.DataFrame, span_ns: int) -> list[Finding]:
    """A training thread that spends much of the capture blocked in OS calls, and in which."""
    training = threads[(threads["role"] != "") & (threads["osrt_ns"] > 0)]
    if training.empty or not span_ns or training["osrt_ns"].max() < BLOCKED_SHARE * span_ns:
        return []
    parts = [
        f"{t.thread_name} ({t.role}, tid {t.tid}) {t.osrt_ns / 1e6:.3f} ms = {100.0 * t.osrt_ns / span_ns:.1f}% "
        f"of the capture, most in {t.top_osrt_call} ({t.top_osrt_ns / 1e6:.3f} ms)"
        for t in training.itertuples()
    ]
    worst = training.iloc[0]
    return [
        Finding(
            "training_thread_blocking",
            "info",
            f"{worst.thread_name} ({worst.role} thread) blocks {100.0 * worst.osrt_ns / span_ns:.1f}% of "
            f"the capture in OS calls, mostly {worst.top_osrt_call}",
            "Time blocked in OS-runtime calls inside the capture: " + "; ".join(parts) + ".",
            _WAIT_ADVICE
            if worst.top_osrt_call in WAIT_CALLS
            else f"{worst.top_osrt_call} on a training thread stalls the step: move it off the training loop "
            "(a background thread or process), or do it less often.",
        )
    ]


def gpu_busy_pct(busy: pd.DataFrame) -> float | None:
    """Busy share of the GPUs' active spans, all devices together; None without GPU work."""
    span = busy["span_ns"].sum()
    return float(100.0 * busy["busy_ns"].sum() / span) if span else None
