"""Compare analyses side by side: headline numbers, per-item deltas of the saved tables (breakdowns) and the
findings of each. Pure: analyses in, one Comparison out; the caller loads or computes them
(pipeline.compare_paths) and report/compare.py writes it. The first input is the baseline: every delta is
"input minus baseline".

Captures differ in length, so breakdown times are per captured step whenever every input has steps:
a 3-step window against a 2-step one then compares like with like. Analyses from other sftprof
versions may lack a table, a column or a trace source; such a value stays blank (NaN), never 0.
A name that an input has the table for but did not record (a kernel it never ran) counts as 0.
Each finding's attainable gain is compared as its analysis gives it (analysis.json), never derived again.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from sftprof import results
from sftprof.analysis import Analysis
from sftprof.analysis.cpu import PHASES, STEP_RANGE
from sftprof.analysis.registry import SAVED_TABLES
from sftprof.errors import SftprofError
from sftprof.trace.kineto import kernel_short_name
from sftprof.trace.load import trace_stem

TOP_CHANGES = 10  # rows of "largest changes" in the terminal summary and the HTML
NS_PER_MS = 1e6
HEADLINE = "headline"
GAINS = "gains"  # the section of each rule's attainable gain (% of the median step), as each analysis gives it
GAIN_UNIT = "% of median step"
DELTA, DELTA_PCT = "delta:", "delta_pct:"  # CSV column prefixes, followed by the input's label
GAIN = "gain:"  # findings.csv: each input's gain for the rule, after its title column


class CompareError(SftprofError, ValueError):
    """An input that is neither an analysis folder nor a trace, or too few inputs."""


class UnusableValue(CompareError):
    """A value of an analysis that the comparison cannot use; `file` is relative to its folder."""

    def __init__(self, file: str, problem: str):
        super().__init__(f"{file}: {problem}")
        self.file, self.problem = file, problem


# Every number a comparison reads is a time (ns), a count or a share: none is negative or infinite, and none is
# beyond results.MAX_VALUE (2^62 ns, 146 years: the scale of a misread or hand-edited value).
MAX_VALUE = results.MAX_VALUE


def check_usable(analysis: Analysis) -> None:
    """Take every value the comparison uses from a saved analysis once, so that a damaged one is refused
    (UnusableValue, naming its file) before anything is written."""
    for metric in HEADLINE_METRICS:
        metric.value(analysis)
    for breakdown in BREAKDOWNS:
        breakdown.totals(analysis)


# ---------------------------------------------------------------- labels


def _label_parts(path: Path) -> list[str]:
    """Path components that tell inputs apart: no root, no `analysis` folders, no trace suffixes."""
    path = path.resolve()
    name = trace_stem(path) if path.is_file() else path.name
    return [part for part in (*path.parts[1:-1], name) if part != "analysis"] or [name]


def unique_labels(paths: list[Path]) -> list[str]:
    """The shortest path tails that are unique: rank0 vs rank1, or steady/rank0 vs warmup/rank0."""
    parts = [_label_parts(path) for path in paths]
    depth = [1] * len(paths)
    while True:
        labels = ["/".join(p[-d:]) for p, d in zip(parts, depth)]
        ambiguous = [
            i
            for i, label in enumerate(labels)
            if depth[i] < len(parts[i])
            and any(other == label and parts[j] != parts[i] for j, other in enumerate(labels))
        ]
        if not ambiguous:
            break
        for i in ambiguous:
            depth[i] += 1
    seen: Counter = Counter()
    numbered = []
    for label in labels:  # the same input given twice
        seen[label] += 1
        numbered.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return numbered


# ---------------------------------------------------------------- metrics


def _table(analysis: Analysis, name: str, *numbers: str, keys: tuple[str, ...] = ()) -> pd.DataFrame | None:
    """The table if this analysis has it with these columns of numbers and of keys; None if it does not
    (other sftprof version)."""
    if name not in SAVED_TABLES:  # a comparison reads only what the analysis saves (its registry)
        raise KeyError(f"{name} is not a table the analysis saves")
    frame = analysis.tables.get(name)
    if frame is None or not {*numbers, *keys} <= set(frame.columns):
        return None
    for column in numbers:
        if not pd.api.types.is_numeric_dtype(frame[column]) and frame[column].notna().any():
            raise UnusableValue(f"{name}.csv", f"column {column} holds values that are not numbers")
        values = frame[column].dropna().to_numpy(dtype=float)
        if not (np.isfinite(values) & (values >= 0) & (values <= MAX_VALUE)).all():
            raise UnusableValue(
                f"{name}.csv", f"column {column} holds a value no capture gives (infinite, negative or over 2^62)"
            )
    return frame


def _traced_sum(analysis: Analysis, table: str, column: str, source: str) -> float | None:
    frame = _table(analysis, table, column)
    if source not in analysis.sources or frame is None:
        return None
    return float(frame[column].sum())


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns / NS_PER_MS


def steps_captured(analysis: Analysis) -> float | None:
    steps = _table(analysis, "steps", "duration")
    if steps is not None:
        return float(len(steps))
    count = analysis.headline.get("steps_captured")
    if count is not None and not results.is_number(count):
        raise UnusableValue(results.SUMMARY_FILE, "headline.steps_captured must be a number")
    return count


def median_step_ms(analysis: Analysis) -> float | None:
    steps = _table(analysis, "steps", "duration")
    return float(steps["duration"].median()) / NS_PER_MS if steps is not None and len(steps) else None


def memory_op_share(analysis: Analysis) -> float | None:
    kernel_ns = _traced_sum(analysis, "kernels", "total_ns", "cuda")
    memop_ns = _traced_sum(analysis, "memops", "total_ns", "cuda")
    if kernel_ns is None or memop_ns is None or not kernel_ns + memop_ns:
        return None
    return 100.0 * memop_ns / (kernel_ns + memop_ns)


def gpu_busy_pct(analysis: Analysis) -> float | None:
    """Busy time over active span, all devices together (a span-weighted mean of their busy %)."""
    busy = _traced_sum(analysis, "gpu_busy", "busy_ns", "cuda")
    span = _traced_sum(analysis, "gpu_busy", "span_ns", "cuda")
    return 100.0 * busy / span if busy is not None and span else None


def blocked_pct(role: str) -> Callable[[Analysis], float | None]:
    """Share of the capture that the most blocked thread of this role spent in OS-runtime calls."""

    def metric(analysis: Analysis) -> float | None:
        threads = _table(analysis, "threads", "osrt_ns", keys=("role",))
        if "osrt" not in analysis.sources or threads is None or not analysis.span_ns:
            return None
        of_role = threads[threads["role"].fillna("") == role]
        return 100.0 * float(of_role["osrt_ns"].max()) / analysis.span_ns if len(of_role) else None

    return metric


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    value: Callable[[Analysis], float | None]


HEADLINE_METRICS = [
    Metric("capture length", "s", lambda a: a.span_ns / 1e9 if a.span_ns else None),
    Metric("steps captured", "", steps_captured),
    Metric("median step", "ms", median_step_ms),
    Metric("kernel time", "ms", lambda a: _ms(_traced_sum(a, "kernels", "total_ns", "cuda"))),
    Metric("kernel launches", "", lambda a: _traced_sum(a, "kernels", "instances", "cuda")),
    Metric("memory-op time", "ms", lambda a: _ms(_traced_sum(a, "memops", "total_ns", "cuda"))),
    Metric("memory-op share of GPU time", "%", memory_op_share),
    Metric("GPU busy", "%", gpu_busy_pct),
    Metric("CUDA API time", "ms", lambda a: _ms(_traced_sum(a, "cuda_api", "total_ns", "cuda"))),
    Metric("main thread blocked in OS calls", "% of capture", blocked_pct("main")),
    Metric("autograd thread blocked in OS calls", "% of capture", blocked_pct("autograd")),
    Metric("warnings", "", lambda a: float(sum(f.severity == "warning" for f in a.findings))),
]
# analysis.json headline keys the metrics above already show; any other numeric key is compared as it is.
HEADLINE_KEYS_SHOWN = {"capture_s", "steps_captured", "median_step_ms", "kernels"}


# ---------------------------------------------------------------- sections


def _total_by(
    table: str, key: str, value: str = "total_ns", name_of: Callable[[str], str] | None = None
) -> Callable[[Analysis], pd.Series | None]:
    def extract(analysis: Analysis) -> pd.Series | None:
        frame = _table(analysis, table, value, keys=(key,))
        if frame is None:
            return None
        keys = frame[key].astype(str)
        return frame[value].groupby(keys.map(name_of) if name_of else keys, sort=False).sum()

    return extract


def _nvtx_ranges(analysis: Analysis) -> pd.Series | None:
    """Time by range name, without step and phase ranges: the steps section compares those, and
    step names differ from window to window."""
    totals = _total_by("nvtx", "name")(analysis)
    if totals is None:
        return None
    return totals[~totals.index.str.match(STEP_RANGE) & ~totals.index.isin(PHASES)]


def _phase_means(analysis: Analysis) -> pd.Series | None:
    steps = _table(analysis, "steps", "duration", *(f"{phase}_ns" for phase in PHASES))
    if steps is None or steps.empty:
        return None
    means = {phase: steps[f"{phase}_ns"].mean() for phase in PHASES}
    if _table(analysis, "steps", "other_ns") is not None:
        means["other"] = steps["other_ns"].mean()
    means["whole step"] = steps["duration"].mean()
    return pd.Series(means, dtype=float)


def _thread_name(row) -> str:
    return f"{row.thread_name} ({row.role})" if isinstance(row.role, str) and row.role else str(row.thread_name)


def _thread_blocking(analysis: Analysis) -> pd.Series | None:
    threads = _table(analysis, "threads", "osrt_ns", keys=("thread_name", "role"))
    if threads is None:
        return None
    names = pd.Series([_thread_name(row) for row in threads.itertuples()], index=threads.index, dtype=str)
    return threads["osrt_ns"].groupby(names, sort=False).sum()


@dataclass(frozen=True)
class Breakdown:
    """Time by item (kernel, call, phase...) of one saved table, compared item by item; `name` is the
    comparison table's `section`."""

    name: str
    title: str
    source: str  # the trace source whose absence makes the section "not measured", not zero
    totals: Callable[[Analysis], pd.Series | None]  # nanoseconds by item
    already_per_step: bool = False


BREAKDOWNS = [
    Breakdown("steps", "Step time by phase (mean per step)", "nvtx", _phase_means, already_per_step=True),
    Breakdown(
        "kernel_families",
        "Kernel time by family (kernel function name)",
        "cuda",
        _total_by("kernels", "kernel", name_of=kernel_short_name),
    ),
    Breakdown("kernels", "Kernel time by kernel", "cuda", _total_by("kernels", "kernel")),
    Breakdown("memops", "Memory-operation time by kind", "cuda", _total_by("memops", "operation")),
    Breakdown("cuda_api", "CUDA API time by call", "cuda", _total_by("cuda_api", "name")),
    Breakdown("nvtx", "Other NVTX range time by name (steps and phases: see above)", "nvtx", _nvtx_ranges),
    Breakdown("osrt", "OS-runtime call time by call", "osrt", _total_by("osrt", "name")),
    Breakdown("threads", "Time blocked in OS-runtime calls by thread", "osrt", _thread_blocking),
]


# ---------------------------------------------------------------- the comparison


@dataclass
class Comparison:
    labels: list[str]  # the first is the baseline
    paths: dict[str, str]  # label -> where the input came from
    analyses: dict[str, Analysis]
    per_step: bool  # section times are per captured step
    table: pd.DataFrame  # section, item, unit, one value column per label, delta columns
    findings: pd.DataFrame  # rule, fired_in, one title column per label


def _with_deltas(frame: pd.DataFrame, labels: list[str]) -> pd.DataFrame:
    baseline = frame[labels[0]]
    for label in labels[1:]:
        frame[DELTA + label] = frame[label] - baseline
        frame[DELTA_PCT + label] = 100.0 * (frame[label] - baseline) / baseline.where(baseline != 0)
    return frame


def largest_delta(frame: pd.DataFrame) -> pd.Series:
    """Per row, the largest absolute delta against the baseline over all inputs (NaN if none)."""
    deltas = frame[[c for c in frame.columns if c.startswith(DELTA)]]
    return deltas.abs().max(axis=1, skipna=True)


def headline_frame(analyses: dict[str, Analysis]) -> pd.DataFrame:
    rows = [
        {"item": m.name, "unit": m.unit, **{label: m.value(a) for label, a in analyses.items()}}
        for m in HEADLINE_METRICS
    ]
    extra_keys = dict.fromkeys(
        key
        for a in analyses.values()
        for key, value in a.headline.items()
        if key not in HEADLINE_KEYS_SHOWN and isinstance(value, (int, float))
    )
    rows += [
        {"item": key, "unit": "", **{label: a.headline.get(key) for label, a in analyses.items()}} for key in extra_keys
    ]
    frame = pd.DataFrame(rows)
    labels = list(analyses)
    frame[labels] = frame[labels].apply(pd.to_numeric, errors="coerce").astype(float)
    frame.insert(0, "section", HEADLINE)
    return _with_deltas(frame, labels)


def breakdown_frame(
    breakdown: Breakdown, analyses: dict[str, Analysis], steps: dict[str, float] | None
) -> pd.DataFrame:
    """One row per item, one column per input (ms, or ms per step), largest delta first."""
    totals = {label: breakdown.totals(a) if breakdown.source in a.sources else None for label, a in analyses.items()}
    items = list(dict.fromkeys(item for t in totals.values() if t is not None for item in t.index))
    labels = list(analyses)
    if not items:
        return pd.DataFrame(columns=["section", "item", "unit", *labels])
    divisors = steps if steps is not None and not breakdown.already_per_step else None
    frame = pd.DataFrame({"item": items})
    for label, total in totals.items():
        if total is None:
            frame[label] = math.nan
            continue
        values = total.reindex(items, fill_value=0).to_numpy(dtype=float) / NS_PER_MS
        frame[label] = values / divisors[label] if divisors is not None else values
    frame = _with_deltas(frame, labels)
    ranking = pd.DataFrame({"delta": largest_delta(frame).fillna(-1), "size": frame[labels].max(axis=1).fillna(-1)})
    frame = frame.loc[ranking.sort_values(["delta", "size"], ascending=False, kind="stable").index]
    frame = frame.reset_index(drop=True)
    frame.insert(0, "section", breakdown.name)
    frame.insert(2, "unit", "ms/step" if divisors is not None or breakdown.already_per_step else "ms")
    return frame


def _rule_gains(analysis: Analysis) -> dict[str, float]:
    """Each rule's gain as the analysis gives it (the largest, where a rule fired more than once); rules
    without an estimate are left out."""
    gains: dict[str, float] = {}
    for finding in analysis.findings:
        if finding.gain_pct is not None:
            gains[finding.rule] = max(gains.get(finding.rule, 0.0), float(finding.gain_pct))
    return gains


def gains_frame(analyses: dict[str, Analysis]) -> pd.DataFrame:
    """One row per rule with a gain in any input: each input's gain, taken from its analysis (never
    derived again here), and the deltas; largest gain first. Blank where the rule did not fire."""
    labels = list(analyses)
    by_label = {label: _rule_gains(a) for label, a in analyses.items()}
    rules = list(dict.fromkeys(rule for gains in by_label.values() for rule in gains))
    if not rules:
        return pd.DataFrame(columns=["section", "item", "unit", *labels])
    frame = pd.DataFrame(
        {"item": rules, **{label: [by_label[label].get(rule, math.nan) for rule in rules] for label in labels}}
    )
    frame = _with_deltas(frame, labels)
    frame = frame.loc[frame[labels].max(axis=1).sort_values(ascending=False, kind="stable").index]
    frame = frame.reset_index(drop=True)
    frame.insert(0, "section", GAINS)
    frame.insert(2, "unit", GAIN_UNIT)
    return frame


def findings_frame(analyses: dict[str, Analysis]) -> pd.DataFrame:
    """One row per rule fired anywhere: its title(s) and gain in each input, blank where it did not fire."""
    labels = list(analyses)
    titles: dict[str, dict[str, list[str]]] = {}
    severity: dict[str, str] = {}
    for label, analysis in analyses.items():
        for finding in analysis.findings:
            titles.setdefault(finding.rule, {}).setdefault(label, []).append(finding.title)
            if finding.severity == "warning" or finding.rule not in severity:
                severity[finding.rule] = finding.severity
    gains = {label: _rule_gains(a) for label, a in analyses.items()}
    rows = []
    for rule, by_label in titles.items():
        fired = [label for label in labels if label in by_label]
        rows.append(
            {
                "rule": rule,
                "severity": severity[rule],
                "fired_in": "all" if len(fired) == len(labels) else ", ".join(fired),
                **{label: "; ".join(by_label.get(label, [])) for label in labels},
                **{GAIN + label: gains[label].get(rule, math.nan) for label in labels},
            }
        )
    return pd.DataFrame(rows, columns=["rule", "severity", "fired_in", *labels, *(GAIN + label for label in labels)])


def compare(analyses: dict[str, Analysis], paths: dict[str, str] | None = None) -> Comparison:
    """Pure: the side-by-side comparison of analyses keyed by label, the first being the baseline."""
    if len(analyses) < 2:
        raise CompareError("nothing to compare: give at least two inputs (or a folder with several ranks)")
    labels = list(analyses)
    step_counts = {label: count for label, a in analyses.items() if (count := steps_captured(a))}
    per_step = len(step_counts) == len(analyses)
    frames = [headline_frame(analyses), gains_frame(analyses)]
    frames += [breakdown_frame(b, analyses, step_counts if per_step else None) for b in BREAKDOWNS]
    table = pd.concat([f for f in frames if len(f)], ignore_index=True)
    return Comparison(
        labels=labels,
        paths=paths or {label: a.source_path for label, a in analyses.items()},
        analyses=analyses,
        per_step=per_step,
        table=table,
        findings=findings_frame(analyses),
    )


def largest_changes(comparison: Comparison, top: int = TOP_CHANGES) -> pd.DataFrame:
    """The section rows (times, same unit) that moved most against the baseline, over all sections."""
    rows = comparison.table[~comparison.table["section"].isin([HEADLINE, GAINS])]
    weight = largest_delta(rows)
    rows = rows.assign(weight=weight)[weight > 0]
    return rows.sort_values("weight", ascending=False, kind="stable").head(top).drop(columns="weight")
