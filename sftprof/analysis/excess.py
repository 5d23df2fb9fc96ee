"""Kernel time a switch would remove: attention computed unfused, the glue kernels around its softmax.

Eager attention computes softmax(Q K^T) V as separate kernels: a batched GEMM writes the sequence x
sequence scores, elementwise kernels scale and mask them, a softmax normalises them, and a second GEMM
reads them back; the backward pass does the same in reverse. A fused kernel (PyTorch's SDPA with the
flash or cuDNN backend, FlashAttention) never writes the scores to memory. The trace holds no tensor sizes,
so the attention is found by its shape on each stream: the run of non-GEMM kernels between two GEMMs that
holds a softmax (not the loss's log-softmax) is its glue, and the GEMMs on either side are its matmuls.
At training sequence lengths those matmuls are bound by the scores they write and read, not by their
FLOPs, so fused attention's own time is taken as small beside them: the saving is glue plus matmuls, an
upper bound.
"""

from __future__ import annotations

import re

import pandas as pd

from sftprof.analysis import gains
from sftprof.analysis.findings import Finding, ms, severity_of
from sftprof.analysis.gains import StepClock
from sftprof.trace.events import EventStore

SOFTMAX = re.compile(r"softmax", re.IGNORECASE)
LOSS_SOFTMAX = re.compile(r"log_?softmax", re.IGNORECASE)  # cross-entropy's, after the LM head
FUSED_ATTENTION = "attention"  # kernels.KERNEL_FAMILIES' family of flash/fmha/SDPA kernels
GEMM = "GEMM"
COLUMNS = ["start", "glue_ns", "gemm_ns", "softmax_ns", "kernels"]


def unfused_attention(events: EventStore) -> pd.DataFrame:
    """Each run of non-GEMM kernels between two GEMMs on a stream that holds an attention softmax: its first
    kernel's `start`, the run's time (`glue_ns`), the two GEMMs around it (`gemm_ns`), its softmax kernels'
    time (`softmax_ns`) and how many kernels it has."""
    names = gains._names(events)
    if names.empty:
        return pd.DataFrame(columns=COLUMNS)
    label = names["name"].fillna(names["short_name"]).astype(str)
    softmax = label.map(lambda n: bool(SOFTMAX.search(n)) and not LOSS_SOFTMAX.search(n))
    kinds = pd.DataFrame(
        {
            "name_id": names["name_id"].astype("int64"),
            "is_gemm": (names["family"] == GEMM).to_numpy(bool),
            "is_softmax": softmax.to_numpy(bool),
        }
    ).drop_duplicates("name_id")
    if not kinds["is_softmax"].any() or (names["family"] == FUSED_ATTENTION).any():  # nothing unfused to find
        return pd.DataFrame(columns=COLUMNS)
    return events.query(
        """
        WITH k AS (
            SELECT k.device_id, k.stream_id, k.start, k.duration, coalesce(f.is_gemm, false) AS g,
                   coalesce(f.is_softmax, false) AS s
            FROM kernels k LEFT JOIN kinds f ON f.name_id = k.name_id),
        cut AS (  -- each GEMM opens a segment: the GEMM, then the non-GEMM kernels up to the next one
            SELECT *, sum(g::INTEGER) OVER (PARTITION BY device_id, stream_id ORDER BY start
                                            ROWS UNBOUNDED PRECEDING) AS seg FROM k),
        runs AS (
            SELECT device_id, stream_id, seg, min(start) FILTER (WHERE NOT g) AS start,
                   sum(duration) FILTER (WHERE NOT g) AS glue_ns, sum(duration) FILTER (WHERE s) AS softmax_ns,
                   count(*) FILTER (WHERE NOT g) AS kernels, max(duration) FILTER (WHERE g) AS opening_gemm
            FROM cut GROUP BY ALL),
        closed AS (
            SELECT *, lead(opening_gemm) OVER (PARTITION BY device_id, stream_id ORDER BY seg) AS closing_gemm
            FROM runs)
        SELECT start, glue_ns::BIGINT AS glue_ns,
               (coalesce(opening_gemm, 0) + coalesce(closing_gemm, 0))::BIGINT AS gemm_ns,
               softmax_ns::BIGINT AS softmax_ns, kernels
        FROM closed WHERE softmax_ns IS NOT NULL AND seg > 0 AND closing_gemm IS NOT NULL ORDER BY start""",
        kinds=kinds,
    )


def unfused_attention_finding(runs: pd.DataFrame, clock: StepClock) -> list[Finding]:
    """Attention runs unfused (unfused_attention found softmax glue between GEMMs, and no fused attention kernel
    ran): SDPA's flash or cuDNN backend would do it in one kernel."""
    if runs.empty:
        return []
    saved = clock.by_step(runs["start"], runs["glue_ns"] + runs["gemm_ns"])
    per_step = clock.gpu_side(saved)
    gain = clock.share(per_step)
    steps = clock.steps
    return [
        Finding(
            "unfused_attention",
            severity_of(gain),
            f"Attention runs unfused: softmax and batched GEMMs over the scores take {gain:.1f}% of the step",
            f"{len(runs):,} softmax runs between GEMMs ({len(runs) / steps:,.0f} per step; no flash, fmha or SDPA "
            f"kernel in the capture): {ms(runs['glue_ns'].sum() / steps)} per step in {int(runs['kernels'].sum()):,} "
            f"glue kernels (softmax {ms(runs['softmax_ns'].sum() / steps)}), {ms(runs['gemm_ns'].sum() / steps)} "
            "in the GEMMs around them, which write and read the sequence x sequence scores.",
            "Use fused attention: torch.nn.functional.scaled_dot_product_attention (Hugging Face: "
            "attn_implementation='sdpa' or 'flash_attention_2'), which never writes the scores to memory.",
            gain,
            "the glue kernels and the GEMMs around each attention softmax, taking fused attention's own time as "
            f"small beside them (an upper bound); at most the CPU's wait for the GPU; {clock.scope(per_step)}",
        )
    ]


def precision_ratio(peak, precision: str) -> float:
    """How many times faster bf16 tensor cores are than `precision` on this GPU, by its datasheet (efficiency
    .Peak; None: 2, bf16 against tf32, the smallest ratio of any GPU in the table)."""
    if peak is None or precision not in peak.tflops:
        return 2.0
    return float(peak.tflops["bf16"] / peak.tflops[precision])
