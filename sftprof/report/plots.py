"""Plots as inline SVG strings, so the report is one self-contained HTML file."""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from sftprof.analysis.cpu import PHASES  # noqa: E402
from sftprof.text import terminal_safe  # noqa: E402

PHASE_COLORS = {
    "data": "#9467bd",
    "forward": "#1f77b4",
    "backward": "#ff7f0e",
    "optimizer": "#2ca02c",
    "other": "#bbbbbb",
}
MAX_BARS = 60  # per-step plots: more steps than this are drawn as runs of steps
MAX_TICK_LABELS = 20
# Labels are kernel, thread and NVTX names from the trace: text, never mathtext (`$...$`) or TeX.
plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "text.parse_math": False, "text.usetex": False})


def _svg(fig) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _label(name, limit: int = 60) -> str:
    """A name from the trace as a plot label: control characters shown as escapes, long names cut."""
    name = terminal_safe(name)
    return name if len(name) <= limit else name[: limit - 1] + "…"


def step_phases(steps: pd.DataFrame) -> str | None:
    """Stacked bars: where each captured step's time went. Past MAX_BARS steps (long captures have
    thousands), each bar is the median of a run of consecutive steps."""
    if steps.empty:
        return None
    columns = [f"{phase}_ns" for phase in [*PHASES, "other"]]
    if len(steps) > MAX_BARS:
        runs = np.arange(len(steps)) * MAX_BARS // len(steps)
        grouped = steps.groupby(runs)
        labels = [f"{first}-{last}" for first, last in zip(grouped["step"].min(), grouped["step"].max())]
        steps, xlabel = grouped[columns].median().assign(step=labels), "training steps (median of each run)"
    else:
        steps, xlabel = steps.assign(step=steps["step"].astype(str)), "training step"
    fig, ax = plt.subplots(figsize=(7, 3))
    bottom = pd.Series(0.0, index=steps.index)
    for phase, column in zip([*PHASES, "other"], columns):
        values = steps[column] / 1e6
        ax.bar(steps["step"], values, bottom=bottom, label=phase, color=PHASE_COLORS[phase])
        bottom += values
    if len(steps) > MAX_TICK_LABELS:
        ax.set_xticks(ax.get_xticks()[:: len(steps) // MAX_TICK_LABELS + 1])
    ax.set_xlabel(xlabel)
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
    ax.barh([_label(n) for n in rows[label_column]], rows["time_pct"], color="#1f77b4")
    ax.set_xlabel("% of total time")
    ax.set_title(title)
    return _svg(fig)


def phase_timeline(phases: pd.DataFrame, steps: pd.DataFrame) -> str | None:
    """Gantt of the phase ranges across the captured steps (the first MAX_BARS of them: beyond that
    the ranges are thinner than a pixel)."""
    if phases.empty:
        return None
    if len(steps) > MAX_BARS:
        steps = steps.sort_values("start").head(MAX_BARS)
        phases = phases[phases["start"] < steps["end"].max()]
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


LABELLED_CORES = 32  # above this many cores, the heat map's rows are not labelled one by one
FAMILY_COLORS = {"compute": "#1f77b4", "memory": "#ff7f0e", "": "#999999"}


def family_bars(families: pd.DataFrame) -> str | None:
    """Kernel time per family, coloured by what bounds the family (dense math vs streaming)."""
    if families.empty:
        return None
    rows = families.iloc[::-1]
    bound = rows["bound"].fillna("").astype(str)
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    ax.barh(
        [_label(family) for family in rows["family"]],
        rows["time_pct"],
        color=[FAMILY_COLORS.get(b, "#999999") for b in bound],
    )
    for y, (pct, n) in enumerate(zip(rows["time_pct"], rows["instances"])):
        ax.text(pct, y, f" {pct:.1f}% ({int(n):,})", va="center", fontsize=8)
    ax.set_xlim(0, max(100.0, float(rows["time_pct"].max()) * 1.15))
    ax.set_xlabel("% of kernel time (instances in brackets)")
    ax.set_title("Kernel families (blue: compute-bound math, orange: memory-bound streaming)")
    return _svg(fig)


def memop_breakdown(kinds: pd.DataFrame) -> str | None:
    """Share of all GPU time (kernels + memory operations) per memory-operation kind."""
    if kinds.empty:
        return None
    rows = kinds.iloc[::-1]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(rows) + 1.2))
    ax.barh([_label(k) for k in rows["copy_kind"]], rows["gpu_time_pct"], color="#2ca02c")
    for y, (pct, n) in enumerate(zip(rows["gpu_time_pct"], rows["instances"])):
        ax.text(pct, y, f" {pct:.2f}% ({int(n):,})", va="center", fontsize=8)
    ax.set_xlim(0, float(rows["gpu_time_pct"].max()) * 1.3 or 1.0)
    ax.set_xlabel("% of GPU time (operations in brackets)")
    ax.set_title("Memory operations by kind")
    return _svg(fig)


def utilisation_timeline(timeline: pd.DataFrame, low_pct: float) -> str | None:
    """GPU busy % per time chunk, one line per device, with the low-utilisation threshold."""
    if timeline.empty:
        return None
    origin = timeline["start"].min()
    fig, ax = plt.subplots(figsize=(8, 2.6))
    for device, chunks in timeline.groupby("device_id"):
        edges = [*((chunks["start"] - origin) / 1e6), (chunks["end"].iloc[-1] - origin) / 1e6]
        ax.stairs(chunks["busy_pct"], edges, fill=True, alpha=0.6, label=f"GPU {device}")
    ax.axhline(low_pct, color="#d62728", lw=0.8, ls="--")
    ax.set_ylim(0, 100)
    ax.set_xlabel("ms since the first GPU operation")
    ax.set_ylabel("busy %")
    ax.set_title(
        f"GPU utilisation over time ({timeline.groupby('device_id').size().iloc[0]} chunks; dashed: {low_pct:.0f}%)"
    )
    ax.legend(fontsize=8, loc="upper right")
    return _svg(fig)


def thread_states(states: pd.DataFrame) -> str | None:
    """Per thread: share of the capture running on a core, inside OS calls, waiting for the GPU."""
    if states.empty:
        return None
    rows = states.head(12).iloc[::-1].reset_index(drop=True)
    series = [
        ("running on a CPU", "running_pct", "#2ca02c"),
        ("inside OS-runtime calls", "os_calls_pct", "#d62728"),
        ("waiting for the GPU (CUDA sync)", "gpu_wait_pct", "#9467bd"),
    ]
    series = [s for s in series if rows[s[1]].notna().any()]
    height = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.4))
    for i, (label, column, color) in enumerate(series):
        ax.barh(
            [y + (i - (len(series) - 1) / 2) * height for y in range(len(rows))],
            rows[column].fillna(0),
            height=height,
            color=color,
            label=label,
        )
    ax.set_yticks(range(len(rows)), [_label(t, 45) for t in rows["thread"]])
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of the capture (the states can overlap)")
    ax.set_title("What each thread did")
    ax.legend(ncols=len(series), fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.25))
    return _svg(fig)


def core_timeline(timeline: pd.DataFrame) -> str | None:
    """Heat map: per CPU core and time chunk, the share of time the profiled program ran on it."""
    if timeline.empty:
        return None
    grid = timeline.pivot(index="cpu", columns="chunk", values="busy_pct").sort_index()
    span_ms = (timeline["end"].max() - timeline["start"].min()) / 1e6
    fig, ax = plt.subplots(figsize=(8, min(0.25 * len(grid), 6) + 1.6))
    image = ax.imshow(
        grid.to_numpy(),
        aspect="auto",
        cmap="viridis",
        vmin=0,
        vmax=100,
        interpolation="nearest",
        extent=(0, span_ms, len(grid) - 0.5, -0.5),
    )
    if len(grid) <= LABELLED_CORES:
        ax.set_yticks(range(len(grid)), [f"CPU {int(c)}" for c in grid.index])
    else:
        ax.set_ylabel(f"CPU ({int(grid.index.min())}-{int(grid.index.max())})")
    ax.set_xlabel("ms since the capture began")
    ax.set_title("CPU cores: share of time running the profiled program")
    fig.colorbar(image, ax=ax, label="busy %")
    return _svg(fig)
