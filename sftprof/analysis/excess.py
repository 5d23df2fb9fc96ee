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

import numpy as np
import pandas as pd

from sftprof.analysis import gains, gpu
from sftprof.analysis.boundness import FULL_PRECISIONS, full_precision_gemms
from sftprof.analysis.findings import Finding, ms, severity_of
from sftprof.analysis.gains import StepClock
from sftprof.analysis.kernels import GEMM_FAMILY, gemm_precisions
from sftprof.trace.events import EventStore

SOFTMAX = re.compile(r"softmax", re.IGNORECASE)
LOSS_SOFTMAX = re.compile(r"log_?softmax", re.IGNORECASE)  # cross-entropy's, after the LM head
FUSED_ATTENTION = "attention"  # kernels.KERNEL_FAMILIES' family of flash/fmha/SDPA kernels
COLUMNS = ["start", "glue_ns", "gemm_ns", "full_gemm_ns", "softmax_ns", "kernels"]
FUSED_KERNELS = 1  # what a fused attention launches for a softmax run and its two GEMMs (flash: one forward kernel)


def unfused_attention(events: EventStore) -> pd.DataFrame:
    """Each run of non-GEMM kernels between two GEMMs on a stream that holds an attention softmax: its first
    kernel's `start`, the run's time (`glue_ns`), the two GEMMs around it (`gemm_ns`; `full_gemm_ns` those of
    them whose names show fp32 or tf32), its softmax kernels' time (`softmax_ns`) and how many kernels it has."""
    names = gains._names(events)
    if names.empty:
        return pd.DataFrame(columns=COLUMNS)
    label = names["name"].fillna(names["short_name"]).astype(str)
    softmax = label.map(lambda n: bool(SOFTMAX.search(n)) and not LOSS_SOFTMAX.search(n))
    kinds = pd.DataFrame(
        {
            "name_id": names["name_id"].astype("int64"),
            "is_gemm": (names["family"] == GEMM_FAMILY).to_numpy(bool),
            "is_softmax": softmax.to_numpy(bool),
            "is_full": gemm_precisions(label).isin(FULL_PRECISIONS).to_numpy(bool),
        }
    ).drop_duplicates("name_id")
    if not kinds["is_softmax"].any() or (names["family"] == FUSED_ATTENTION).any():  # nothing unfused to find
        return pd.DataFrame(columns=COLUMNS)
    source = f"""(SELECT coalesce(k.device_id::BIGINT, {gains.NULL_LAST}) AS device_id, k.start, k."end", k.duration,
                         coalesce(k.stream_id::BIGINT, {gains.NULL_LAST}) AS stream, coalesce(f.is_gemm, false) AS g,
                         coalesce(f.is_softmax, false) AS s, coalesce(f.is_full, false) AS f
                  FROM kernels k LEFT JOIN kinds f ON f.name_id = k.name_id)"""
    runs = []
    # as gains.fusable_chains walks its runs: a device's kernels a window of start times at a time, put in
    # stream order in numpy, each stream's open run carried into the next window
    for device, _, _, windows in gpu.device_windows(events, source, gains.CHAIN_WINDOW_ROWS, kinds=kinds):
        held = None
        for lo, hi in windows:
            rows = events.arrays(
                f"SELECT start, duration, stream, g, s, f FROM {source} "
                f"WHERE device_id = {int(device)} AND start >= {lo} AND start < {hi}",
                kinds=kinds,
            )
            if held is not None:
                rows = {column: np.concatenate((held[column], rows[column])) for column in rows}
            order = np.lexsort((rows["start"], rows["stream"]))
            done, held = _complete({column: values[order] for column, values in rows.items()})
            runs.append(_attention_runs(done))
        if held is not None:
            runs.append(_attention_runs(held))
    found = [run for run in runs if len(run)]
    if not found:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(found, ignore_index=True).sort_values("start", kind="stable", ignore_index=True)


def _complete(rows: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Kernels of one device in (stream, start) order: those whose runs a later window cannot change, and on
    each stream those it can: from the stream's last GEMM on (its run waits for the GEMM that closes it; that
    GEMM stays in the first part too, closing the run before it), or the whole stream where it has no GEMM."""
    n = len(rows["start"])
    if not n:
        return rows, rows
    stream, g = rows["stream"], rows["g"].astype(bool)
    new_stream = np.r_[True, stream[1:] != stream[:-1]]
    group, first = np.cumsum(new_stream) - 1, np.flatnonzero(new_stream)
    position = np.arange(n)
    last_gemm = np.maximum.reduceat(np.where(g, position, -1), first)
    cut = np.where(last_gemm >= 0, last_gemm, first)[group]
    held = position >= cut
    done = (position < cut) | ((position == cut) & g)
    return {c: v[done] for c, v in rows.items()}, {c: v[held] for c, v in rows.items()}


def _attention_runs(rows: dict[str, np.ndarray]) -> pd.DataFrame:
    """Each run of non-GEMM kernels that a GEMM opens and another GEMM of the same stream closes, holding a
    softmax (COLUMNS). A stream's kernels before its first GEMM open no run."""
    n = len(rows["start"])
    if not n:
        return pd.DataFrame(columns=COLUMNS)
    stream, g, s = rows["stream"], rows["g"], rows["s"]
    new_stream = np.r_[True, stream[1:] != stream[:-1]]
    segment = np.cumsum(g | new_stream) - 1  # each GEMM, and each stream's first kernel, opens a segment
    count = int(segment[-1]) + 1
    first = np.flatnonzero(g | new_stream)
    opened = g[first]  # the segment opens with a GEMM (else: a stream's kernels before its first GEMM)
    glue = ~g
    duration, start = rows["duration"], rows["start"]
    glue_ns = np.bincount(segment, weights=np.where(glue, duration, 0), minlength=count)
    softmax_ns = np.bincount(segment, weights=np.where(s & glue, duration, 0), minlength=count)
    has_softmax = np.bincount(segment, weights=(s & glue), minlength=count) > 0
    kernels = np.bincount(segment, weights=glue, minlength=count)
    glue_start = np.full(count, np.iinfo("int64").max)
    np.minimum.at(glue_start, segment[glue], start[glue])
    opening = np.where(opened, duration[first], 0)
    full_opening = np.where(rows["f"][first], opening, 0)
    closed = np.r_[~new_stream[first[1:]], False]  # the next segment is the same stream's: a GEMM opens it
    closing, full_closing = np.r_[opening[1:], 0], np.r_[full_opening[1:], 0]
    keep = opened & closed & has_softmax
    return pd.DataFrame(
        {
            "start": glue_start[keep],
            "glue_ns": glue_ns[keep].astype("int64"),
            "gemm_ns": (opening + closing)[keep].astype("int64"),
            "full_gemm_ns": (full_opening + full_closing)[keep].astype("int64"),
            "softmax_ns": softmax_ns[keep].astype("int64"),
            "kernels": kernels[keep].astype("int64"),
        }
    )


def attention_saving(runs: pd.DataFrame, clock: StepClock, chains: gains.ChainTotals) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the GPU time fused attention removes (each run's glue and its two GEMMs) and the host's launch path
    it frees (`chains`: gains.ChainTotals.host_freed, for the launches removed)."""
    saved = clock.by_step(runs["start"], runs["glue_ns"] + runs["gemm_ns"])
    removed = clock.by_step(runs["start"], runs["kernels"] + 2 - FUSED_KERNELS)  # glue and both GEMMs, for one
    return saved, chains.host_freed(clock, removed)


def unfused_attention_finding(
    runs: pd.DataFrame,
    clock: StepClock,
    chains: gains.ChainTotals,
    gemm_precision: pd.DataFrame | None = None,
    run_precision: str | None = None,
) -> list[Finding]:
    """Attention runs unfused (unfused_attention found softmax glue between GEMMs, and no fused attention kernel
    ran): SDPA's flash or cuDNN backend would do it in one kernel, so it also launches fewer. Where mixed
    precision is off (boundness.full_precision_gemms), the fp32 finding counts these runs: SDPA's flash kernels
    need 16-bit inputs, so in fp32 it falls back to unfused attention, and bf16 is the one switch for both."""
    if runs.empty or (gemm_precision is not None and len(full_precision_gemms(gemm_precision, run_precision, runs))):
        return []
    saved, host_freed = attention_saving(runs, clock, chains)
    per_step = clock.gpu_side(saved, host_freed)
    gain = clock.share(per_step)
    steps = clock.steps
    return [
        Finding(
            "unfused_attention",
            severity_of(gain),
            # what the capture shows, not the gain: a run's own step times turn the gain into a share of another step
            f"Attention runs unfused: softmax and batched GEMMs over the scores take {ms(np.median(saved))} of GPU "
            "time a step",
            f"{len(runs):,} softmax runs between GEMMs ({len(runs) / steps:,.0f} per step; no flash, fmha or SDPA "
            f"kernel in the capture): {ms(runs['glue_ns'].sum() / steps)} per step in {int(runs['kernels'].sum()):,} "
            f"glue kernels (softmax {ms(runs['softmax_ns'].sum() / steps)}), {ms(runs['gemm_ns'].sum() / steps)} "
            "in the GEMMs around them, which write and read the sequence x sequence scores.",
            "Use fused attention: torch.nn.functional.scaled_dot_product_attention (Hugging Face: "
            "attn_implementation='sdpa' or 'flash_attention_2'), which never writes the scores to memory. Where the "
            "loop asked for SDPA, something sent attention down its own path: Hugging Face models compute it "
            "themselves to return the weights (output_attentions=True, left on from debugging), or SDPA fell back "
            "to its math backend: its fused backends are off "
            "(torch.backends.cuda.flash_sdp_enabled(), mem_efficient_sdp_enabled(), cudnn_sdp_enabled(); an "
            "sdpa_kernel(SDPBackend.MATH) context) or refused the call (fp32 inputs, a head size they lack)"
            + (
                f"; here {ms(runs['full_gemm_ns'].sum() / steps)} a step of the GEMMs around the softmax run in "
                "fp32 (the math backend computes bf16 attention in fp32)."
                if runs["full_gemm_ns"].sum() > 0
                else "."
            ),
            gain,
            "the glue kernels and the GEMMs around each attention softmax, taking fused attention's own time as "
            f"small beside them (an upper bound); at most the CPU's wait for the GPU plus the host's launch path in "
            f"the share of launches removed ({FUSED_KERNELS} fused kernel for each softmax run and its two GEMMs); "
            f"{clock.scope(per_step)}",
        )
    ]


def precision_ratio(peak, precision: str) -> float:
    """How many times faster bf16 tensor cores are than `precision` on this GPU, by its datasheet (efficiency
    .Peak; None: 2, bf16 against tf32, the smallest ratio of any GPU in the table)."""
    if peak is None or precision not in peak.tflops:
        return 2.0
    return float(peak.tflops["bf16"] / peak.tflops[precision])
