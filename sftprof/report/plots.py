"""Plots as inline SVG strings, so the report is one self-contained HTML file."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from sftprof.analysis.cpu import PHASES  # noqa: E402

PHASE_COLORS = {"data": "#9467bd", "forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c",
                "other": "#bbbbbb"}
plt.rcParams.update({"svg.fonttype": "none", "font.size": 9})


def _svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _shorten(name: str, limit: int = 60) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def step_phases(steps: pd.DataFrame) -> str | None:
    """Stacked bars: where each captured step's time went."""
    if steps.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 3))
    bottom = pd.Series(0.0, index=steps.index)
    for phase in [*PHASES, "other"]:
        values = steps[f"{phase}_ns"] / 1e6
        ax.bar(steps["step"].astype(str), values, bottom=bottom, label=phase, color=PHASE_COLORS[phase])
        bottom += values
    ax.set_xlabel("training step")
    ax.set_ylabel("ms")
    ax.set_title("Step time by phase (NVTX)")
    ax.legend(ncols=5, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return _svg(fig)


def share_bars(summary: pd.DataFrame, label_column: str, title: str, top: int = 12) -> str | None:
    """Horizontal bars of time share, for any nsys-stats-style summary table."""
    if summary.empty:
        return None
    rows = summary.head(top).iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1))
    ax.barh([_shorten(str(n)) for n in rows[label_column]], rows["time_pct"], color="#1f77b4")
    ax.set_xlabel("% of total time")
    ax.set_title(title)
    return _svg(fig)


def phase_timeline(phases: pd.DataFrame, steps: pd.DataFrame) -> str | None:
    """Gantt of the phase ranges across the captured steps."""
    if phases.empty:
        return None
    origin = phases["start"].min()
    fig, ax = plt.subplots(figsize=(8, 2.2))
    for lane, phase in enumerate(PHASES):
        rows = phases[phases["name"] == phase]
        spans = [((s - origin) / 1e6, d / 1e6) for s, d in zip(rows["start"], rows["duration"])]
        ax.broken_barh(spans, (lane - 0.4, 0.8), color=PHASE_COLORS[phase])
    for step in steps.itertuples():
        ax.axvline((step.start - origin) / 1e6, color="#444", lw=0.6, ls=":")
    ax.set_yticks(range(len(PHASES)), PHASES)
    ax.set_xlabel("ms since the first captured phase (dotted: step starts)")
    ax.set_title("Training phases over time")
    return _svg(fig)


def training_curve(metrics: pd.DataFrame) -> str | None:
    """Step time for every step of the run, with the profiled window marked."""
    if metrics.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 2.6))
    colors = ["#d62728" if w else "#1f77b4" for w in metrics["in_window"]]
    ax.bar(metrics["step"], metrics["step_time_s"] * 1e3, color=colors)
    ax.set_xlabel("step (red: inside the capture window)")
    ax.set_ylabel("step time, ms")
    ax.set_title("Step time over the whole run (trainer's own clock)")
    return _svg(fig)
