"""Compute- or memory-bound: a verdict with its evidence and how far to trust it.

Three kinds of evidence, strongest last:
- how busy the GPU is at all: below LOW_UTILISATION_PCT the host limits the step whatever the
  kernels are (measured directly from the trace, so that part of the verdict is certain);
- the kernel mix by name: GEMM/attention time vs streaming (elementwise, reduction, copy,
  optimizer) time, and the share on tensor cores: a good proxy, not a measurement;
- GPU metrics, when collected: SM issue, tensor-core and DRAM throughput sampled while the GPU worked.

Advice for compute-bound work follows the GEMMs' precision, as the run reports it or, failing that,
as kernel names show it: a run never gets told to use a precision it already has, and nvjet names,
which carry none, are read as "unknown", not as fp32.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from sftprof.analysis.findings import Finding
from sftprof.analysis.gpu import DeviceBusy
from sftprof.analysis.kernels import COMPUTE_BOUND_FAMILIES, HALF_PRECISIONS, MEMORY_BOUND_FAMILIES
from sftprof.analysis.utilisation import LOW_UTILISATION_PCT
from sftprof.trace.events import EventStore

GPU_METRICS_SWITCH = "--gpu-metrics-device=all (nsys 2022.4; --gpu-metrics-devices=all in newer releases)"
# A family group with this share of kernel time decides the kernel-mix verdict...
DOMINANT_SHARE_PCT = 60.0
# ...and with this share, names alone are convincing enough for medium confidence (streaming
# kernels are memory-bound by construction; the doubt is in what the rest does).
CONFIDENT_SHARE_PCT = 70.0
# A unit (SM issue, tensor cores, DRAM) busier than this while the GPU works is the limit.
METRIC_LIMIT_PCT = 40.0
# GPU metric names start with these (newer nsys appends " [Throughput %]").
DRAM_METRICS = ("dram read bandwidth", "dram write bandwidth")
SM_ISSUE_METRIC = "sm issue"
TENSOR_METRIC = "tensor active"
# Share of GEMM time (%) that kernel names must show as fp32/tf32 before the GEMMs count as fp32:
# cuBLASLt's nvjet names carry no precision, so a few fp32 GEMMs (an fp32 head, say) beside many such
# kernels are no evidence that mixed precision is off.
FP32_GEMM_MIN_PCT = 50.0
FULL_PRECISIONS = ("fp32", "tf32")
# The run's precision as a trainer reports it ("bfloat16", "torch.float16", "fp8"...), by label;
# first match wins ("bfloat16" also contains "float16").
RUN_PRECISIONS = (
    ("fp8", r"fp8|float8|e4m3|e5m2"),
    ("bf16", r"bf16|bfloat16"),
    ("fp16", r"fp16|float16|half"),
    ("tf32", r"tf32"),
    ("fp32", r"fp32|float32"),
)
# What raises a compute-bound step's speed once the GEMMs run in half precision.
HALF_PRECISION_LEVERS = (
    "larger GEMMs (more tokens per micro-batch, a larger hidden size) in tensor-core-friendly "
    "shapes (multiples of 64), and fusing the work between them"
)
FP8_LEVER = "FP8 GEMMs with Transformer Engine (Hopper, Blackwell)"


def metric_means_while_busy(events: EventStore, busy: dict[int, DeviceBusy]) -> dict:
    """Mean of each metric (lower-cased name) over samples taken while its device was running work.
    Samples are read a batch at a time and summed by metric: twenty counters sampled at 10 kHz make 12M
    rows a minute (20M as one frame: 100 s and 6.2 GB, benchmarks/ENGINE.md). A sample without
    a value counts for nothing."""
    names = events.query("SELECT id, name FROM metric_names")
    if names.empty:
        return {}
    size = int(names["id"].max()) + 1
    sums, counts = np.zeros(size), np.zeros(size, "int64")
    for batch in events.metric_batches():  # one pass
        device, times, metric_ids, values = (batch[c] for c in ("device_id", "timestamp", "metric_id", "value"))
        first, last = (device.min(), device.max()) if len(device) else (0, -1)
        for d in [first] if first == last else np.unique(device):  # a batch of one device (a rank's): no sort
            if int(d) not in busy:
                continue
            mine = np.arange(len(device)) if first == last else np.flatnonzero(device == d)
            inside = mine[busy[int(d)].merged.covering(times[mine]) & ~np.isnan(values[mine])]
            metric = metric_ids[inside]
            sums += np.bincount(metric, weights=values[inside], minlength=size)
            counts += np.bincount(metric, minlength=size)
    names = names.assign(sum=sums[names["id"]], count=counts[names["id"]], key=names["name"].str.lower())
    by_name = names[names["count"] > 0].groupby("key")[["sum", "count"]].sum()
    return (by_name["sum"] / by_name["count"]).to_dict()


def _metric(means: dict, prefix: str) -> float | None:
    values = [value for name, value in means.items() if name.startswith(prefix)]
    return float(sum(values)) if values else None


def _metrics_verdict(means: dict) -> tuple[str, str] | None:
    dram = [v for v in (_metric(means, name) for name in DRAM_METRICS) if v is not None]
    issue, tensor = _metric(means, SM_ISSUE_METRIC), _metric(means, TENSOR_METRIC)
    if not dram and issue is None and tensor is None:
        return None
    dram_pct, compute_pct = sum(dram), max(issue or 0.0, tensor or 0.0)
    text = (
        f"while the GPU worked, DRAM bandwidth averaged {dram_pct:.0f}% of peak, SM issue "
        f"{issue if issue is not None else float('nan'):.0f}%, tensor cores {tensor if tensor is not None else float('nan'):.0f}%"
    )
    if dram_pct >= METRIC_LIMIT_PCT and dram_pct >= compute_pct:
        return "memory-bound", text
    if compute_pct >= METRIC_LIMIT_PCT:
        return "compute-bound", text
    return "latency-bound (no unit near its peak)", text


def _mix_verdict(mix: dict) -> str:
    if mix["compute_pct"] >= DOMINANT_SHARE_PCT:
        return "compute-bound"
    if mix["memory_pct"] >= DOMINANT_SHARE_PCT:
        return "memory-bound"
    return "mixed"


def verdict(mix: dict, busy_pct: float | None, metric_means: dict) -> dict:
    """The verdict on the GPU work: `kernels` (compute-/memory-bound/mixed), its `confidence`,
    whether the host limits the step overall (`host_bound`), and the sentences behind it."""
    by_mix = _mix_verdict(mix)
    by_metrics = _metrics_verdict(metric_means)
    mix_text = (
        f"{mix['memory_pct']:.1f}% of kernel time in streaming kernels ({', '.join(MEMORY_BOUND_FAMILIES)}), "
        f"{mix['compute_pct']:.1f}% in {'/'.join(COMPUTE_BOUND_FAMILIES)}; {mix['tensor_core_pct']:.1f}% on "
        "tensor cores"
    )
    if by_metrics:
        kernels, metrics_text = by_metrics
        confidence = "high" if kernels == by_mix else "medium"
        basis = f"GPU metrics: {metrics_text}; kernel names: {mix_text}" + (
            "" if kernels == by_mix else f" (names alone would say {by_mix}; the metrics measure it)"
        )
    else:
        kernels = by_mix
        dominant = max(mix["compute_pct"], mix["memory_pct"])
        confidence = "medium" if kernels != "mixed" and dominant >= CONFIDENT_SHARE_PCT else "low"
        basis = (
            f"kernel names only: {mix_text}. GPU metrics were not collected: {GPU_METRICS_SWITCH} "
            "records SM, tensor-core and DRAM throughput and would settle it"
        )
    return {
        "kernels": kernels,
        "confidence": confidence,
        "basis": basis,
        "host_bound": busy_pct is not None and busy_pct < LOW_UTILISATION_PCT,
        "busy_pct": busy_pct,
    }


def evidence_table(mix: dict, busy_pct: float | None, metric_means: dict) -> pd.DataFrame:
    """The numbers the verdict rests on, each with where it comes from."""
    rows = [
        ("GPU busy, % of its active span", busy_pct, "trace (union of GPU work)"),
        ("GEMM + attention, % of kernel time", mix["compute_pct"], "kernel names"),
        ("streaming kernels, % of kernel time", mix["memory_pct"], "kernel names"),
        ("tensor-core kernels, % of kernel time", mix["tensor_core_pct"], "kernel names"),
    ]
    for label, prefix in (
        ("DRAM read bandwidth, % of peak", DRAM_METRICS[0]),
        ("DRAM write bandwidth, % of peak", DRAM_METRICS[1]),
        ("SM issue, % of peak", SM_ISSUE_METRIC),
        ("tensor cores active, % of peak", TENSOR_METRIC),
    ):
        value = _metric(metric_means, prefix)
        rows.append(
            (
                label,
                value,
                "GPU metrics while busy" if value is not None else f"GPU metrics: not collected ({GPU_METRICS_SWITCH})",
            )
        )
    return pd.DataFrame(rows, columns=["evidence", "value", "basis"])


def run_precision_label(run_precision: str | None) -> str | None:
    """ "bf16", "fp16", "fp8", "tf32" or "fp32" for what a run reports, None when it reports nothing known."""
    text = str(run_precision or "").lower()
    return next((label for label, pattern in RUN_PRECISIONS if re.search(pattern, text)), None)


def half_precision(run_precision: str | None) -> bool:
    return run_precision_label(run_precision) in HALF_PRECISIONS


def full_precision_gemms(
    gemm_precision: pd.DataFrame, run_precision: str | None, attention_runs: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The fp32/tf32 rows of `gemm_precision` where mixed precision is off: no bf16/fp16/fp8 GEMM in the capture,
    a run that does not report half precision, and fp32/tf32 names holding FP32_GEMM_MIN_PCT of the GEMM time
    outside unfused attention (`attention_runs`: excess.unfused_attention). SDPA's math fallback computes
    attention in fp32 whatever the model's precision, so fp32 attention GEMMs beside GEMMs whose names tell no
    precision (cuBLASLt's nvjet) say that attention runs unfused, not that the model runs in fp32. Empty
    otherwise."""
    if gemm_precision.empty or gemm_precision["precision"].isin(HALF_PRECISIONS).any() or half_precision(run_precision):
        return gemm_precision.iloc[:0]
    full = gemm_precision[gemm_precision["precision"].isin(FULL_PRECISIONS)]
    attention_ns = float(attention_runs["full_gemm_ns"].sum()) if attention_runs is not None else 0.0
    outside = float(gemm_precision["total_ns"].sum()) - attention_ns
    full_share = 100 * (float(full["total_ns"].sum()) - attention_ns) / outside if outside > 0 else 0.0
    return full if full_share >= FP32_GEMM_MIN_PCT else full.iloc[:0]


def gemm_precision_known(gemm_precision: pd.DataFrame, run_precision: str | None) -> tuple[str | None, str]:
    """The GEMMs' precision as far as the evidence goes, and where that comes from: the run's own report
    first, then kernel names (a half precision if any GEMM name shows one; fp32/tf32 only where such
    names hold FP32_GEMM_MIN_PCT of GEMM time). (None, "") when neither tells."""
    label = run_precision_label(run_precision)
    if label:
        return label, f"the run reports {run_precision}"
    if gemm_precision.empty:
        return None, ""
    half = gemm_precision[gemm_precision["precision"].isin(HALF_PRECISIONS)]
    if len(half):
        return str(half.iloc[0]["precision"]), "by kernel name"
    full = gemm_precision[gemm_precision["precision"].isin(FULL_PRECISIONS)]
    if full["time_pct"].sum() >= FP32_GEMM_MIN_PCT:
        return str(full.iloc[0]["precision"]), "by kernel name"
    return None, ""


def _compute_bound_advice(gemm_precision: pd.DataFrame, run_precision: str | None) -> str:
    """The levers left to a compute-bound step: never lower precision to a run that already has it."""
    label, source = gemm_precision_known(gemm_precision, run_precision)
    if label in HALF_PRECISIONS:
        levers = HALF_PRECISION_LEVERS if label == "fp8" else f"{FP8_LEVER}, {HALF_PRECISION_LEVERS}"
        return f"The GEMMs already run in {label} ({source}): the levers left are {levers}."
    if label in FULL_PRECISIONS:
        return (
            f"The GEMMs run in {label} ({source}): bf16 (torch.autocast or bf16 weights) at least doubles their "
            f"rate on tensor cores; then {FP8_LEVER}, {HALF_PRECISION_LEVERS}."
        )
    return (
        "Kernel names do not tell the GEMM precision (cuBLASLt's nvjet kernels carry none) and the run reported "
        f"none: a run in fp32 gains most from bf16 first; one already in bf16 from {FP8_LEVER}, "
        f"{HALF_PRECISION_LEVERS}."
    )


def verdict_finding(result: dict, gemm_precision: pd.DataFrame, run_precision: str | None = None) -> Finding:
    """The verdict's finding (verdict_findings), its advice by `gemm_precision` and the run's precision."""
    kernels, confidence = result["kernels"], result["confidence"]
    if result["host_bound"]:
        return Finding(
            "bound_verdict",
            "info",
            f"Host-bound: the GPU is busy {result['busy_pct']:.1f}% of its active span; its kernels are {kernels}",
            f"Host-bound, confidence high: GPU busy time is measured from the trace, and below "
            f"{LOW_UTILISATION_PCT:.0f}% neither compute nor memory bandwidth limits the step. The kernels that "
            f"do run are {kernels}, confidence {confidence}: {result['basis']}.",
            "Feed the GPU first (see the launch-bound, idle-gap and synchronization findings); the kernel mix "
            "matters once the GPU is busy.",
        )
    advice = {
        "memory-bound": "Raise arithmetic intensity: fuse elementwise chains (torch.compile, fused "
        "norm/rotary/activation kernels), fused optimizers, larger hidden size or batch per "
        "kernel.",
        "compute-bound": _compute_bound_advice(gemm_precision, run_precision),
        "mixed": "No kernel class dominates: optimise the largest families in the kernel-family table.",
    }
    return Finding(
        "bound_verdict",
        "info",
        f"The GPU work is {kernels} (confidence {confidence})",
        f"GPU busy {result['busy_pct']:.1f}% of its active span. {result['basis']}.",
        advice.get(kernels, "Compare SM issue with DRAM throughput kernel by kernel in Nsight Compute."),
    )


def kernel_verdict(mix: dict, busy_pct: float | None, metric_means: dict, kernel_totals: dict) -> dict | None:
    """The verdict, where any kernel ran (gpu.kernel_totals)."""
    return verdict(mix, busy_pct, metric_means) if kernel_totals["count"] else None


def bound_evidence(mix: dict, busy_pct: float | None, metric_means: dict, result: dict | None) -> pd.DataFrame:
    """evidence_table where there is a verdict; empty where no kernel ran."""
    return evidence_table(mix, busy_pct, metric_means) if result else pd.DataFrame()


def verdict_findings(result: dict | None, gemm_precision: pd.DataFrame, run_precision: str | None) -> list[Finding]:
    """The verdict as a finding (a diagnosis: no gain of its own); compute-bound advice follows the
    GEMMs' precision (gemm_precision_known)."""
    return [verdict_finding(result, gemm_precision, run_precision)] if result else []
