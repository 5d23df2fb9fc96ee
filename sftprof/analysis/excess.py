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
    ordered = (
        "SELECT k.device_id, k.stream_id, k.start, k.duration, coalesce(f.is_gemm, false) AS g, "
        "coalesce(f.is_softmax, false) AS s FROM kernels k LEFT JOIN kinds f ON f.name_id = k.name_id "
        "ORDER BY k.device_id NULLS LAST, k.stream_id NULLS LAST, k.start"
    )
    runs, held = [], None
    for batch in events.batches(ordered, kinds=kinds):
        rows = _stream_rows(batch)
        if held is not None:
            rows = {column: np.concatenate((held[column], rows[column])) for column in rows}
        done, held = _complete(rows)
        runs.append(_attention_runs(done))
    if held is not None:
        runs.append(_attention_runs(held))
    found = [run for run in runs if len(run)]
    if not found:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(found, ignore_index=True).sort_values("start", kind="stable", ignore_index=True)


def _stream_rows(batch: pd.DataFrame) -> dict[str, np.ndarray]:
    """A batch of kernels in (device, stream, start) order as arrays: `stream` one number per device and stream."""
    device = batch["device_id"].astype("float64").fillna(np.inf).to_numpy()
    stream = batch["stream_id"].astype("float64").fillna(np.inf).to_numpy()
    return {
        "stream": np.stack((device, stream), axis=1),
        "start": batch["start"].to_numpy("int64"),
        "duration": batch["duration"].astype("float64").fillna(0).to_numpy("int64"),
        "g": batch["g"].to_numpy(bool),
        "s": batch["s"].to_numpy(bool),
    }


def _complete(rows: dict[str, np.ndarray]) -> tuple[dict, dict | None]:
    """The rows whose segments a later batch cannot change, and those it can: from the last stream's last GEMM
    on (its segment waits for the GEMM that closes it), or the whole last stream where it has no GEMM yet."""
    stream = rows["stream"]
    n = len(rows["start"])
    if not n:
        return rows, None
    same = (stream == stream[-1]).all(axis=1)
    first_of_last = int(np.flatnonzero(~same)[-1]) + 1 if (~same).any() else 0
    gemms = np.flatnonzero(rows["g"][first_of_last:])
    cut = first_of_last + int(gemms[-1]) if len(gemms) else first_of_last
    done = {column: values[: cut + 1 if len(gemms) else cut] for column, values in rows.items()}
    held = {column: values[cut:] for column, values in rows.items()}
    return done, held


def _attention_runs(rows: dict[str, np.ndarray]) -> pd.DataFrame:
    """Each run of non-GEMM kernels that a GEMM opens and another GEMM of the same stream closes, holding a
    softmax (COLUMNS). A stream's kernels before its first GEMM open no run."""
    n = len(rows["start"])
    if not n:
        return pd.DataFrame(columns=COLUMNS)
    stream, g, s = rows["stream"], rows["g"], rows["s"]
    new_stream = np.r_[True, (stream[1:] != stream[:-1]).any(axis=1)]
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
    closed = np.r_[~new_stream[first[1:]], False]  # the next segment is the same stream's: a GEMM opens it
    closing = np.r_[opening[1:], 0]
    keep = opened & closed & has_softmax
    return pd.DataFrame(
        {
            "start": glue_start[keep],
            "glue_ns": glue_ns[keep].astype("int64"),
            "gemm_ns": (opening + closing)[keep].astype("int64"),
            "softmax_ns": softmax_ns[keep].astype("int64"),
            "kernels": kernels[keep].astype("int64"),
        }
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
