"""The verdict on variants: did the change a finding recommended pay what the finding predicted?

Pure: each run's findings and trainer metrics in, one row per variant out. A variant is compared
with its experiment (the baseline) on
- the gain predicted by the baseline's finding that motivated it (its gain_pct);
- the gain measured on the trainer's own step times, outside the capture window (nsys costs time
  inside it) and after the warm-up steps, as the change in median step time, with its spread;
- real tokens per second (tokens that carry a loss, not padding);
- whether that finding is gone from the variant's own capture;
- whether the loss curve moved beyond noise: a fix for speed must not change what is learned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sftprof.analysis.findings import Finding
from sftprof.trace.metrics import RunMetrics

# Steps left out at the start of every run: allocator growth, autotuning, compilation.
WARMUP_STEPS = 3
# Fewer measured steps than this and the measured gain is flagged as unreliable.
MIN_STEPS = 20
# A finding counts as gone when the variant's capture no longer has it, or its gain fell to at most
# this share of the baseline's (or under 1% of the step).
GONE_SHARE = 0.25
# The loss moved when the mean difference over the common steps is beyond LOSS_NOISE_SIGMAS standard
# errors of the baseline's step-to-step noise, and more than LOSS_MIN_SHIFT of the baseline's loss.
LOSS_NOISE_SIGMAS = 3.0
LOSS_MIN_SHIFT = 0.01


@dataclass
class Run:
    """One run's evidence: its findings (analysis.json) and its trainer metrics."""

    findings: list[Finding]
    metrics: RunMetrics


def measured_steps(metrics: RunMetrics) -> pd.DataFrame:
    """The steps a speed is measured on: outside the capture window, after the warm-up."""
    steps = metrics.steps
    if steps.empty:
        return steps
    outside = ~steps["in_window"].fillna(False).astype(bool)
    return steps[outside & (steps["step"].astype("int64") >= WARMUP_STEPS)]


def _speed(metrics: RunMetrics) -> dict:
    steps = measured_steps(metrics)
    times = steps["step_time_s"].astype("float64").dropna().to_numpy() if len(steps) else np.array([])
    if not len(times):
        return {"steps": 0, "median_ms": None, "p25_ms": None, "p75_ms": None, "real_tokens_per_s": None}
    real = steps["real_tokens"] if steps["real_tokens"].notna().any() else steps["tokens"]
    real = real.astype("float64")
    per_s = (
        float(real.sum() / steps["step_time_s"].astype("float64")[real.notna()].sum()) if real.notna().any() else None
    )
    return {
        "steps": len(times),
        "median_ms": float(np.median(times) * 1e3),
        "p25_ms": float(np.percentile(times, 25) * 1e3),
        "p75_ms": float(np.percentile(times, 75) * 1e3),
        "real_tokens_per_s": per_s,
    }


def _gain(findings: list[Finding], rule: str | None) -> float | None:
    gains = [f.gain_pct or 0.0 for f in findings if f.rule == rule]
    return max(gains) if gains else None


def loss_shift(base: RunMetrics, variant: RunMetrics) -> tuple[float | None, bool | None]:
    """The variant's mean loss minus the baseline's over the steps both read, as a share of the
    baseline's mean loss, and whether that is beyond noise (None: too few common steps)."""
    pair = pd.merge(
        base.steps[["step", "loss"]], variant.steps[["step", "loss"]], on="step", suffixes=("_base", "_variant")
    ).dropna()
    if len(pair) < 3:
        return None, None
    base_loss = pair["loss_base"].astype("float64").to_numpy()
    shift = float(np.mean(pair["loss_variant"].astype("float64").to_numpy() - base_loss))
    scale = float(np.mean(np.abs(base_loss))) or 1.0
    noise = float(np.std(np.diff(base_loss)) / np.sqrt(2))  # one step's noise, from step-to-step changes
    beyond = abs(shift) > LOSS_NOISE_SIGMAS * noise / np.sqrt(len(pair)) and abs(shift) > LOSS_MIN_SHIFT * scale
    return 100.0 * shift / scale, bool(beyond)


def verdict(base: Run, variants: dict[str, tuple[str | None, Run]]) -> pd.DataFrame:
    """One row per variant (name -> (motivated_by, run)) against the baseline."""
    base_speed = _speed(base.metrics)
    rows = []
    for name, (rule, run) in variants.items():
        speed = _speed(run.metrics)
        predicted = _gain(base.findings, rule)
        measured = (
            100.0 * (base_speed["median_ms"] - speed["median_ms"]) / base_speed["median_ms"]
            if base_speed["median_ms"] and speed["median_ms"]
            else None
        )
        left = _gain(run.findings, rule)
        gone = None if rule is None or predicted is None else left is None or left <= max(1.0, GONE_SHARE * predicted)
        shift_pct, moved = loss_shift(base.metrics, run.metrics)
        rows.append(
            {
                "variant": name,
                "motivated_by": rule,
                "predicted_gain_pct": predicted,
                "measured_gain_pct": measured,
                "baseline_median_step_ms": base_speed["median_ms"],
                "median_step_ms": speed["median_ms"],
                "p25_step_ms": speed["p25_ms"],
                "p75_step_ms": speed["p75_ms"],
                "steps_measured": speed["steps"],
                "baseline_real_tokens_per_s": base_speed["real_tokens_per_s"],
                "real_tokens_per_s": speed["real_tokens_per_s"],
                "finding_gone": gone,
                "finding_gain_left_pct": left,
                "loss_shift_pct": shift_pct,
                "loss_changed": moved,
                "verdict": _say(
                    rule,
                    predicted,
                    measured,
                    _change(base_speed["real_tokens_per_s"], speed["real_tokens_per_s"]),
                    min(speed["steps"], base_speed["steps"]),
                    gone,
                    moved,
                ),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


COLUMNS = [
    "variant",
    "motivated_by",
    "predicted_gain_pct",
    "measured_gain_pct",
    "baseline_median_step_ms",
    "median_step_ms",
    "p25_step_ms",
    "p75_step_ms",
    "steps_measured",
    "baseline_real_tokens_per_s",
    "real_tokens_per_s",
    "finding_gone",
    "finding_gain_left_pct",
    "loss_shift_pct",
    "loss_changed",
    "verdict",
]


def _change(before: float | None, after: float | None) -> float | None:
    return 100.0 * (after - before) / before if before and after is not None else None


def _say(rule, predicted, measured, tokens_change, fewest, gone, moved) -> str:
    """The row in words: what was measured against what was predicted, and what to distrust. Real tokens/s
    is said too: a median can improve while the slow steps get slower (padding to every new length makes
    cuDNN plan anew), and throughput is what the run pays."""
    if measured is None:
        return "no step times to measure (the trainer's metrics are missing or hold no steps outside the window)"
    parts = [f"measured {measured:+.1f}% of the median step"]
    if tokens_change is not None:
        parts.append(f"real tokens/s {tokens_change:+.1f}%")
    if predicted is not None:
        parts.append(f"predicted at most {predicted:.1f}% by `{rule}`")
    elif rule:
        parts.append(f"the baseline has no `{rule}` finding")
    if gone is not None:
        parts.append("the finding is gone" if gone else "the finding is still there")
    if fewest < MIN_STEPS:
        parts.append(f"only {fewest} steps measured (want {MIN_STEPS}+: raise sft.steps)")
    if moved:
        parts.append("the loss curve moved beyond noise: check the change is a pure speed fix")
    return "; ".join(parts)
