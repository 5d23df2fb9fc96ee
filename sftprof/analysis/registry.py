"""The list of analyses: every value `analyze` computes, what it is computed from, and every rule.

A Section is one named value: a pure function of earlier values (the inputs named in it). Those
marked `saved` are the result tables (analysis/NAME.csv) the report and `compare` read; the others
are intermediates. A Rule turns values into findings. `analyze` walks SECTIONS in order, then
RULES; docs/ANALYSES.md is generated from both (`python -m sftprof.analysis`).

Five values exist before any section: `tables` (the loader's TraceTables), `events` (its
kernels and CUDA API calls), `span_ns` (the capture's span), `metrics` (the trainer's RunMetrics, possibly
empty) and `step_pattern` (the regular expression step ranges are named by, cpu.step_pattern). Every
compute and check is a named function of its module, called with the inputs in order: the docs read it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from sftprof.analysis import (
    accounting,
    boundness,
    collectives,
    cpu,
    cuda,
    efficiency,
    excess,
    gains,
    gpu,
    idle,
    kernels,
    memory,
    nvtx,
    overhead,
    overview,
    recompute,
    rules,
    sched,
    utilisation,
    views,
)

BASE_VALUES = ("tables", "events", "span_ns", "metrics", "step_pattern")


@dataclass(frozen=True)
class Section:
    name: str
    compute: Callable
    inputs: tuple[str, ...]
    stage: str  # the progress step it belongs to (STAGES)
    title: str = ""  # for a saved table: what a row is, as the docs and report say it
    saved: bool = False
    beside: bool = False  # heavy and needs little: computed on the second thread, in listed order


@dataclass(frozen=True)
class Rule:
    name: str  # the rule ids of the findings it can return (Finding.rule)
    check: Callable
    inputs: tuple[str, ...]


def _saved(name: str, compute: Callable, inputs: tuple[str, ...], stage: str, title: str, beside=False) -> Section:
    return Section(name, compute, inputs, stage, title, saved=True, beside=beside)


K, B, T, N, F = "kernels", "GPU busy time", "CUDA API calls and threads", "NVTX ranges", "findings"
STAGES = (K, B, T, N, F)

SECTIONS: tuple[Section, ...] = (
    # First beside the kernel summaries, not beside the busy-time union: both hold many rows.
    _saved(
        "cuda_api",
        gpu.cuda_api_summary,
        ("events",),
        K,
        "CUDA API time by call, as nsys stats cuda_api_sum",
        beside=True,
    ),
    Section("waits", cuda.host_wait_calls, ("events",), K),
    Section("api_threads", cuda.calls_by_thread, ("events",), K),
    _saved(
        "threads",
        cpu.thread_summary,
        ("tables", "waits", "api_threads"),
        K,
        "each application thread: role, OS-runtime, CUDA API and NVTX time",
    ),
    Section("labels", cpu.thread_labels, ("threads",), K),
    # filled by nvtx_gpu's join of kernels to their launches, for step_accounting: one join for both
    Section("marked", cpu.marked_ranges, ("events", "step_pattern"), K),
    # the step ranges, or steps inferred from the GPU timeline where there are none
    Section("found_steps", cpu.training_steps, ("marked", "events"), K),
    _saved("steps", cpu.found_table, ("found_steps",), K, "each captured step and its phases' CPU time"),
    Section("launch_sums", accounting.LaunchSums, ("tables", "marked", "steps"), K),
    _saved(
        "nvtx_gpu",
        nvtx.gpu_time_by_range,
        ("events", "labels", "launch_sums"),
        K,
        "GPU time projected onto NVTX ranges, as nsys stats nvtx_gpu_proj_sum (emit_nvtx ranges by op, not by call)",
        beside=True,
    ),
    Section("memop_totals", memory.totals, ("events",), K),
    _saved(
        "sync_calls",
        cuda.sync_calls,
        ("events", "span_ns"),
        K,
        "synchronizing CUDA calls: count, time and where they were made",
        beside=True,
    ),
    Section("sliced_grads", gains.sliced_gradients, ("events", "steps", "span_ns"), K),
    Section(
        "chains",
        gains.fusable_chains,
        ("events", "steps", "span_ns", "sliced_grads"),
        K,
        beside=True,
    ),
    _saved(
        "kernels",
        gpu.kernel_summary,
        ("events",),
        K,
        "kernel time by kernel and launch shape, as nsys 2022.4 stats gpukernsum",
    ),
    _saved(
        "kernels_by_name",
        kernels.name_summary,
        ("events",),
        K,
        "kernel time by kernel, all launch shapes together, as nsys 2023+ stats cuda_gpu_kern_sum",
    ),
    Section("kernel_totals", gpu.kernel_totals, ("events",), K),
    Section("kernel_names", kernels.name_totals, ("events",), K),
    Section("top_kernel", overview.top_kernel_by_name, ("kernel_names",), K),
    Section("fill_share", kernels.fill_share_pct, ("kernel_names",), K),
    _saved(
        "kernel_families", kernels.family_summary, ("kernel_names",), K, "kernel time by family (GEMM, attention, ...)"
    ),
    _saved("gemm_precision", kernels.gemm_precision, ("kernel_names",), K, "GEMM time by the precision its name shows"),
    Section("kernel_mix", kernels.kernel_mix, ("kernel_names",), K),
    Section("unaligned_gemms", kernels.unaligned_gemms, ("kernel_names",), K),
    Section("value_checks", kernels.value_checks, ("kernel_names",), K),
    Section("float64_kernels", kernels.float64_kernels, ("kernel_names",), K),
    Section("float32_weights", kernels.float32_weights, ("kernel_names",), K),
    Section("foreach", gains.foreach_optimizer_kernels, ("events",), K),
    Section("attention_runs", excess.unfused_attention, ("events",), K),
    Section("busy_unions", gpu.busy_unions, ("events",), B),
    Section("busy_by_device", gpu.operations_busy, ("busy_unions",), B),
    _saved("gpu_busy", gpu.gpu_busy, ("busy_by_device",), B, "each GPU's busy time: union of kernels and copies"),
    Section("busy_pct", overview.gpu_busy_pct, ("gpu_busy",), B),
    _saved("gpu_gaps", utilisation.idle_gaps, ("busy_by_device",), B, "GPU idle gaps, longest first"),
    _saved(
        "gpu_timeline",
        utilisation.utilisation_timeline,
        ("events", "busy_by_device"),
        B,
        "GPU utilisation over time, in bins",
    ),
    Section(
        "metric_means",
        boundness.metric_means_while_busy,
        ("events", "busy_by_device"),
        B,
    ),
    Section(
        "verdict",
        boundness.kernel_verdict,
        ("kernel_mix", "busy_pct", "metric_means", "kernel_totals"),
        B,
    ),
    Section(
        "captured_clock",
        gains.step_clock,
        ("steps", "span_ns", "busy_by_device", "events", "waits"),
        T,
    ),
    Section("overhead", overhead.measure, ("metrics", "captured_clock"), T),
    Section("clock", overhead.unprofiled_clock, ("captured_clock", "overhead"), T),
    Section("feeders", cpu.feeders, ("labels", "api_threads"), T),
    Section("recomputed", recompute.recomputed, ("events", "clock"), T),
    _saved(
        "idle_causes",
        idle.idle_causes,
        ("events", "clock", "steps", "recomputed"),
        T,
        "per step, every nanosecond of GPU idle time by what the thread feeding the GPU was doing: CUDA call, "
        "OS call, or its own code by innermost NVTX range",
    ),
    _saved(
        "gap_causes",
        utilisation.gap_causes,
        ("gpu_gaps", "tables", "feeders"),
        T,
        "what the threads that feed the GPU did during the longest idle gaps",
    ),
    _saved(
        "memop_kinds",
        memory.memop_kinds,
        ("kernel_totals", "memop_totals", "events"),
        T,
        "memory-operation time by direction and host memory kind, as a share of GPU time",
    ),
    _saved("host_memory", memory.host_memory, ("events",), T, "copies by host memory kind (pinned, pageable)"),
    Section("crossing", memory.crossing, ("kernel_totals", "memop_totals", "events"), T),
    Section("cpu_use", sched.core_use, ("events", "span_ns"), T),
    _saved(
        "cpu_cores",
        sched.cpu_cores,
        ("cpu_use",),
        T,
        "each CPU core's busy share (needs CPU scheduling traced)",
    ),
    Section("sched_traced", sched.sched_traced, ("tables", "events"), T),
    Section("core_rivals", sched.core_rivals, ("events", "span_ns", "feeders", "clock"), T),
    Section("copies", memory.copy_calls, ("events", "busy_unions"), T),
    # idle_causes with the finding each row counts toward: the idle, sync, copy, data and lock rules' views
    Section("backward_syncs", views.backward_syncs, ("events", "threads"), T),
    Section("read_work", gains.read_work, ("events",), T),
    Section("size_reads", gains.size_reads_per_step, ("read_work", "clock"), T),
    Section("data_sized_gemms", gains.data_sized_gemms_per_step, ("events", "clock"), T),
    Section("upload_syncs", views.upload_syncs, ("events",), T),
    Section("launches_wait", views.synchronous_launches, ("events", "waits"), T),
    Section("copy_syncs", views.copy_syncs, ("events",), T),
    Section(
        "idle_views",
        views.idle_views,
        ("idle_causes", "steps", "backward_syncs", "launches_wait", "copy_syncs", "data_sized_gemms"),
        T,
    ),
    _saved("launch_overhead", cuda.launch_overhead, ("cuda_api",), T, "CPU time per kernel launch call"),
    _saved(
        "step_accounting",
        accounting.accounted_steps,
        ("tables", "waits", "launch_sums", "busy_unions", "nvtx_gpu"),
        N,
        "per step: GPU time by phase, SM-busy apart from copy-busy, idle, and the step's class",
    ),
    _saved(
        "collectives",
        collectives.collective_table,
        ("events", "steps"),
        N,
        "NCCL collective kernels per step, device and kind (all-reduce, reduce-scatter, ...): time, time "
        "exposed with no compute kernel beside them, and of that the time blocking compute, whose next kernel "
        "was already launched (rows without a step: the whole capture)",
    ),
    _saved(
        "step_waits",
        collectives.step_waits,
        ("marked", "events"),
        N,
        "per step and phase: the training thread's time blocked in synchronization calls (gloo, MPI, c10d waits)",
    ),
    Section("bound", accounting.run_bound, ("step_accounting",), F),
    Section("measured_steps", efficiency.measured_steps, ("metrics",), F),
    Section("padded", efficiency.padding, ("measured_steps",), F),
    Section("device_name", efficiency.device_name, ("tables",), F),
    Section("utilization", efficiency.utilization, ("measured_steps", "metrics", "device_name"), F),
    Section("token_ns", accounting.token_ns, ("step_accounting",), F),
    Section("precision", efficiency.metrics_precision, ("metrics",), F),
    _saved(
        "memops",
        gpu.memop_summary,
        ("events",),
        F,
        "memory-operation time by kind, as nsys stats cuda_gpu_mem_time_sum",
    ),
    _saved("memops_by_size", memory.size_summary, ("events",), F, "memory-operation bytes by kind"),
    _saved("sync_activity", cuda.sync_activity, ("events",), F, "CUDA synchronization events by kind"),
    _saved("step_gpu", utilisation.step_utilisation, ("steps", "busy_by_device"), F, "GPU busy share in each step"),
    _saved(
        "bound_evidence",
        boundness.bound_evidence,
        ("kernel_mix", "busy_pct", "metric_means", "verdict"),
        F,
        "the evidence behind the compute/memory verdict",
    ),
    _saved("osrt", cpu.osrt_summary, ("events",), F, "OS-runtime calls by name, as nsys stats osrt_sum"),
    _saved(
        "nvtx",
        cpu.nvtx_summary,
        ("events",),
        F,
        "NVTX ranges by name, as nsys stats nvtx_sum (emit_nvtx ranges by op, not by call)",
    ),
    _saved("phases", cpu.phase_ranges, ("marked",), F, "every phase range (data, forward, ...)"),
    _saved("thread_osrt", cpu.thread_osrt, ("tables", "threads"), F, "OS-runtime time by thread and call"),
    _saved(
        "thread_states",
        cpu.thread_state_table,
        ("threads", "cpu_use", "tables", "sched_traced", "cuda_api"),
        F,
        "what each training thread did: running, blocked, waiting",
    ),
    _saved("cpu_timeline", sched.cpu_timeline, ("cpu_use",), F, "each core's busy share over time, in bins"),
    _saved("padding", efficiency.padding_steps, ("padded",), F, "per trainer step: token slots and real tokens"),
    _saved(
        "mfu",
        efficiency.mfu_steps,
        ("utilization",),
        F,
        "per trainer step: model FLOPs and MFU against the GPU's peak",
    ),
)

RULES: tuple[Rule, ...] = (
    Rule("dropped_rows", rules.dropped_rows, ("tables",)),
    Rule("empty_trace_kind", rules.empty_trace_kinds, ("tables",)),
    Rule(
        "sync_memcpy",
        rules.sync_memcpy,
        ("copies", "clock", "labels", "events", "idle_views"),
    ),
    Rule(
        "sync_memset",
        rules.sync_memset,
        ("copies", "clock", "labels", "idle_views"),
    ),
    Rule(
        "sync_in_steps",
        rules.syncs_in_steps,
        (
            "waits",
            "steps",
            "labels",
            "events",
            "clock",
            "idle_views",
            "backward_syncs",
            "read_work",
            "upload_syncs",
            "size_reads",
            "data_sized_gemms",
        ),
    ),
    Rule(
        "pageable_memcpy",
        rules.pageable_memcpy,
        ("copies", "clock", "labels", "events", "idle_views"),
    ),
    Rule(
        "data_stall",
        rules.data_stall,
        ("steps", "marked", "events", "clock", "labels", "idle_views"),
    ),
    Rule(
        "lock_wait",
        rules.lock_waits,
        ("steps", "marked", "events", "threads", "labels", "clock", "idle_views"),
    ),
    Rule(
        ", ".join(cause.rule for cause in idle.FINDING_CAUSES),
        idle.idle_findings,
        ("idle_views", "clock", "overhead", "fill_share", "data_sized_gemms", "core_rivals", "labels"),
    ),
    Rule("profiling_overhead", overhead.finding, ("overhead", "tables", "clock")),
    Rule("foreach_optimizer", rules.foreach_optimizer, ("foreach", "clock")),
    Rule("memory_bound_kernel_mix", rules.memory_bound_mix, ("kernel_families", "kernel_mix", "chains", "clock")),
    Rule("sliced_gradients", rules.sliced_gradients, ("sliced_grads", "clock")),
    Rule("padding", rules.padding_findings, ("padded", "token_ns", "clock")),
    Rule(
        "fp32_gemm",
        rules.fp32_gemm,
        ("gemm_precision", "clock", "precision", "device_name", "kernel_families", "attention_runs", "chains"),
    ),
    Rule("unaligned_gemm", rules.unaligned_gemm, ("unaligned_gemms", "clock")),
    Rule("float64_math", rules.float64_math, ("float64_kernels", "clock")),
    Rule("float32_weights", rules.float32_weights, ("float32_weights", "clock")),
    Rule("anomaly_detection", rules.anomaly_detection, ("idle_views", "value_checks", "clock", "overhead")),
    Rule(
        "unfused_attention",
        excess.unfused_attention_finding,
        ("attention_runs", "clock", "chains", "gemm_precision", "precision"),
    ),
    Rule("recomputation", recompute.recompute_finding, ("recomputed", "clock", "idle_views", "overhead")),
    Rule("extra_forward", recompute.extra_forward_finding, ("recomputed", "clock", "chains")),
    Rule(
        "interconnect",
        rules.interconnect_findings,
        ("memop_kinds", "host_memory", "crossing", "kernel_totals", "memop_totals", "copies", "clock", "idle_views"),
    ),
    Rule(
        "top_kernel, memory_transfer_share, gpu_busy, no_gpu_activity",
        overview.gpu_findings,
        ("tables", "kernels", "top_kernel", "kernel_totals", "memop_totals", "gpu_busy"),
    ),
    Rule("bound_verdict", boundness.verdict_findings, ("verdict", "gemm_precision", "precision")),
    Rule("dominant_phase, slow_steps, no_steps", overview.step_findings, ("steps",)),
    Rule("training_thread_blocking", overview.thread_findings, ("threads", "span_ns")),
    Rule("cpu_cores, no_cpu_scheduling", rules.cpu_scheduling, ("cpu_cores", "sched_traced", "tables")),
    Rule("nvtx_gpu_time", rules.nvtx_projection, ("nvtx_gpu",)),
    Rule("exposed_communication", collectives.exposed_communication, ("collectives", "steps", "clock")),
)

SAVED_TABLES = tuple(s.name for s in SECTIONS if s.saved)


def _check() -> None:
    """Every input is a base value or an earlier section: the order in SECTIONS is the evaluation order."""
    known = set(BASE_VALUES)
    for section in SECTIONS:
        missing = [name for name in section.inputs if name not in known]
        if missing or section.name in known or section.stage not in STAGES:
            raise RuntimeError(f"registry: section {section.name!r} needs {missing} before it, or repeats a name")
        known.add(section.name)
    for rule in RULES:
        if missing := [name for name in rule.inputs if name not in known]:
            raise RuntimeError(f"registry: rule {rule.name!r} needs unknown values {missing}")


_check()


def _doc(function: Callable) -> str:
    """The first paragraph of the docstring of the function a rule calls."""
    doc = inspect.getdoc(function) or ""
    return " ".join(doc.split("\n\n")[0].split())


def docs_page() -> str:
    """docs/ANALYSES.md: every saved table and every rule, in the order analyze() runs them."""
    lines = [
        "# Analyses and rules",
        "",
        "What you can do with this page: find which table in `analysis/` answers a question, which rule raised a",
        "finding, and what each is computed from. It is generated from `sftprof/analysis/registry.py`",
        "(`python -m sftprof.analysis > docs/ANALYSES.md`); a test keeps it in sync.",
        "",
        "Every value is a pure function of the values named in *from*: the loader's `tables`, `events` and",
        "`span_ns`, the trainer's `metrics`, or earlier values. Intermediate values are listed in `registry.py`.",
        "",
        "## Tables (analysis/NAME.csv)",
        "",
        "| table | what it holds | from |",
        "|---|---|---|",
    ]
    lines += [f"| `{s.name}` | {s.title} | {', '.join(s.inputs)} |" for s in SECTIONS if s.saved]
    lines += [
        "",
        "## Rules",
        "",
        "Findings are ranked by `gain_pct`, the share of the median step that fixing them could save at most",
        "(docs/DIAGNOSIS.md says how each gain is computed).",
        "",
        "| rule | what it looks for | from |",
        "|---|---|---|",
    ]
    lines += [f"| `{r.name}` | {_doc(r.check)} | {', '.join(r.inputs)} |" for r in RULES]
    return "\n".join(lines) + "\n"
