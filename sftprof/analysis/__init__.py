"""Analyses: pure functions from TraceTables to DataFrames and findings.

`analyze` computes the values listed in `registry` in order and applies its rules; the report only
renders what it returns.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import cast

import pandas as pd

from sftprof.analysis.findings import Finding, ranked
from sftprof.analysis.overhead import Overhead, on_unprofiled_step
from sftprof.analysis.registry import RULES, SECTIONS, STAGES
from sftprof.step_names import step_pattern
from sftprof.trace.metrics import RunMetrics
from sftprof.trace.tables import TraceTables

# What analyze() reports to `progress` as it goes, in order.
STEPS = STAGES


@dataclass
class Analysis:
    source_path: str
    span_ns: int
    sources: list[str]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    headline: dict = field(default_factory=dict)


def _value(values: dict, name: str):
    value = values[name]
    if isinstance(value, Future):
        value = values[name] = value.result()
    return value


def _next_ready(values: dict, pending: list):
    """The first of `pending` whose inputs are all computed; where none is, the first, once those of its inputs
    still computed beside are done (what any section waits for is computed beside, or waits for it)."""
    while True:
        for section in pending:
            if all(name in values and not _running(values[name]) for name in section.inputs):
                return section
        wait([values[name] for name in pending[0].inputs if _running(values[name])], return_when=FIRST_COMPLETED)


def _running(value) -> bool:
    return isinstance(value, Future) and not value.done()


def analyze(
    tables: TraceTables,
    progress: Callable[[str], None] = lambda step: None,
    metrics: RunMetrics | None = None,
    step_range: str | None = None,
) -> Analysis:
    """Every analysis of one capture; `progress(step)` is called as each stage of them starts.
    `metrics`: the trainer's metrics of the same run, where there are any: its precision (kernel names
    often do not tell it, and advice must not offer a run what it already has), token counts
    (padding) and model facts (MFU). `step_range`: the regular expression the loop's step ranges are
    named by, where step_names.STEP_RANGE does not know them.

    Sections marked `beside` (heavy, needing little computed here: the CUDA API summary, the NVTX
    projection, sync calls, fusable chains) run on a second thread
    beside the rest: DuckDB and numpy release the GIL, and one analysis alone leaves part of a core idle.
    The rest run here, each the first listed whose inputs are ready: a section that needs one still being
    computed beside waits, and those after it that do not go first (_next_ready)."""
    tables = tables.with_all_columns()
    values = {
        "tables": tables,
        "events": tables.events,
        "span_ns": tables.span_ns,
        "metrics": metrics or RunMetrics(),
        "step_pattern": step_pattern(step_range),
    }
    pending, reached = list(SECTIONS), 0
    with ThreadPoolExecutor(1) as beside:
        while pending:
            section = _next_ready(values, pending)
            pending.remove(section)
            for stage in STAGES[reached : STAGES.index(section.stage) + 1]:  # each once, in order
                progress(stage)
                reached += 1
            args = [_value(values, name) for name in section.inputs]
            values[section.name] = beside.submit(section.compute, *args) if section.beside else section.compute(*args)
        for name in list(values):
            _value(values, name)
    result = Analysis(source_path=tables.source_path, span_ns=tables.span_ns, sources=sorted(tables.sources))
    result.tables = {section.name: values[section.name] for section in SECTIONS if section.saved}
    found = [finding for rule in RULES for finding in rule.check(*(values[n] for n in rule.inputs))]
    result.findings = ranked(on_unprofiled_step(found, cast("Overhead | None", values["overhead"])))
    result.headline = _headline(values, result.findings)
    return result


def _headline(v: dict, findings: list[Finding]) -> dict:
    """The numbers a reader wants first, and what analysis.json promises scripts (docs/DIAGNOSIS.md)."""
    tables, steps, totals, top, verdict = v["tables"], v["steps"], v["kernel_totals"], v["top_kernel"], v["verdict"]
    kind_share, mix, bound, padded, utilization = (
        v["memop_kinds"],
        v["kernel_mix"],
        v["bound"],
        v["padded"],
        v["utilization"],
    )
    return {
        "capture_s": tables.span_ns / 1e9,
        "steps_captured": len(steps),
        "steps_found_by": v["found_steps"].how,
        "median_step_ms": float(steps["duration"].median()) / 1e6 if len(steps) else None,
        "profiling_overhead_pct": round(v["overhead"].pct, 2) if v["overhead"] else None,
        "unprofiled_step_ms": v["overhead"].unprofiled_ns / 1e6 if v["overhead"] else None,
        "kernels": totals["count"],
        "application_threads": len(v["threads"]),
        "osrt_calls": tables.events.count("osrt_rows"),
        "nvtx_ranges": tables.events.count("nvtx_rows"),
        "top_kernel": str(top.kernel) if top is not None else None,
        "top_kernel_pct": float(top.time_pct) if top is not None else None,
        "kernel_family_pct": {row.family: round(float(row.time_pct), 2) for row in v["kernel_families"].itertuples()},
        "tensor_core_pct": mix["tensor_core_pct"] if totals["count"] else None,
        "memop_gpu_time_pct": float(kind_share["gpu_time_pct"].sum()) if len(kind_share) else None,
        "gpu_busy_pct": v["busy_pct"],
        "gpu_idle_gaps": len(v["gpu_gaps"]),
        "verdict": (("host-bound, kernels " if verdict["host_bound"] else "") + verdict["kernels"])
        if verdict
        else None,
        "verdict_confidence": verdict["confidence"] if verdict else None,
        "bound_class": bound["bound_class"],
        "mfu_pct": utilization.hardware_mfu_pct if utilization else None,
        "useful_mfu_pct": utilization.useful_mfu_pct if utilization else None,
        "padding_pct": padded.padding_pct,
        "sm_busy_pct": bound["sm_busy_pct"],
        "copy_busy_pct": bound["copy_busy_pct"],
        "warnings": sorted({f.rule for f in findings if f.severity == "warning"}),
    }
