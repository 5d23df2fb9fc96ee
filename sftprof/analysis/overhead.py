"""What profiling cost the run: the captured steps against the same run's steps outside the capture window.

A profile is worth as much as it resembles the run without it. The trainer's metrics time every step,
inside the capture window and outside it; the capture's step ranges time the steps it holds. The overhead
is the median captured step (the step every gain is a share of) against the trainer's median step
outside the window after the warm-up steps (variants.measured_steps: the same unprofiled step the variant
verdicts measure). The window's own steps are taken from the capture's step ranges, not from the
trainer's timer: that timer can hold nsys starting or stopping the capture (NeMo's NsysCallback stops it
inside step 3's time, 14.9 s on the committed capture), the ranges do not. On the built-in trainer's
captures the two agree within 0.3 ms a step. nsys stays attached outside the window: on host-bound steps
(NeMo's LoRA, a 4-layer Llama) those steps ran slower than in runs without nsys, so there the figure
understates the cost (docs/PROFILING-OVERHEAD.md).

What the capture recorded per step (op-level NVTX ranges, CUDA API and OS-runtime calls) and the trace
kinds it was taken with say what the added time went to, as far as the capture can tell: it holds no
record of nsys's own cost per event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from sftprof.analysis.findings import Finding, ms, severity_of
from sftprof.analysis.gains import StepClock
from sftprof.analysis.variants import WARMUP_STEPS, measured_steps
from sftprof.trace.metrics import RunMetrics
from sftprof.trace.tables import TraceTables

# Above this, the captured steps are too unlike the run's own for their host time to be read as the run's.
FINDING_PCT = 10.0
# A host-bound cause is "mostly the profiler's" when the time the profiler added is at least this share of it.
MOSTLY = 0.5
# torch.autograd.profiler.emit_nvtx's ranges (NeMo's NsysCallback turns it on): one per op call, named by the
# op (`aten::mm`, `autograd::engine::evaluate_function: MulBackward0`, `MulBackward0`) once the loader cut
# their numbering.
OP_RANGE = re.compile(r"^\w+::|Backward\d*$")
# Host time nsys added per traced event (CUDA API call, OS-runtime call, NVTX range) where the host set the
# step's pace: the GPT-NeoX loop's host-bound cases (tests/fixtures/foreign, H100, nsys 2025.3.1,
# --trace=cuda,nvtx,osrt; the run's own step times against the captured ones) paid 1.4-8.9 µs an event.
# tests/test_diagnosis_foreign.py checks the range against those captures. A GPU-bound step hides it.
EVENT_COST_NS = (1_400, 8_900)
TRACED_TABLES = {"cuda_api": "cuda", "osrt": "osrt", "nvtx": "nvtx"}  # table: the source that fills it
# META_DATA_CAPTURE's CAPTURE_EVENT_TYPE values as --trace names them.
TRACE_KIND = {"Cuda": "cuda", "NvtxEvents": "nvtx", "OSRuntime": "osrt", "CuBLAS": "cublas", "CuDNN": "cudnn"}


@dataclass(frozen=True)
class Overhead:
    """The median captured step (`in_window_ns`, from `window_steps` step ranges) against the trainer's
    median step outside the window after warm-up (`unprofiled_ns`, from `outside_steps` steps), and what the
    trainer's own timer said of the window's steps (ms)."""

    in_window_ns: float
    unprofiled_ns: float
    window_steps: int
    outside_steps: int
    timer_window_ms: tuple[float, ...]

    @property
    def pct(self) -> float:
        return 100.0 * (self.in_window_ns / self.unprofiled_ns - 1.0)

    @property
    def added_ns(self) -> float:
        """What the profiler added to a step, at least 0: the most of any host time that may be its own."""
        return max(0.0, self.in_window_ns - self.unprofiled_ns)


def measure(metrics: RunMetrics, clock: StepClock) -> Overhead | None:
    """The overhead of the capture (module docstring); None without step ranges, without the trainer's
    metrics, or where they mark no step inside the window (not the capture's run) or none outside it after
    the warm-up."""
    steps = metrics.steps
    if not clock.has_steps or steps.empty:
        return None
    window = steps[steps["in_window"].fillna(False).astype(bool)]
    outside = measured_steps(metrics)["step_time_s"].astype("float64").dropna()
    if window.empty or outside.empty or not clock.step_ns:
        return None
    return Overhead(
        in_window_ns=clock.step_ns,
        unprofiled_ns=float(np.median(outside)) * 1e9,
        window_steps=clock.steps,
        outside_steps=len(outside),
        timer_window_ms=tuple(float(t) * 1e3 for t in window["step_time_s"].astype("float64")),
    )


def trace_kinds(tables: TraceTables) -> list[str]:
    """The trace kinds the capture was taken with: its own settings where the export has them (nsys 2024+),
    else the kinds that left tables or said they recorded nothing."""
    recorded = tables.capture_settings.get("CAPTURE_EVENT_TYPE", ())
    kinds = {TRACE_KIND.get(kind, kind.lower()) for kind in recorded}
    kinds |= {source for source in tables.sources if source in ("cuda", "nvtx", "osrt")}
    kinds |= {kind.lower() for kind in tables.empty_trace_kinds}
    return sorted(kinds, key=lambda k: (k not in ("cuda", "nvtx"), k))


def _sampling(tables: TraceTables) -> list[str]:
    """CPU sampling and context-switch tracing, where the capture says they were on."""
    rate = tables.capture_settings.get("RATE_HZ", ("0",))[0]
    on = []
    if "sample" in tables.sources or (rate.isdigit() and int(rate) > 0):
        on.append(f"CPU IP sampling{f' at {rate} Hz' if rate.isdigit() and int(rate) > 0 else ''}")
    if "cpuctxsw" in tables.sources:
        on.append("CPU context switches")
    return on


def _per_step(tables: TraceTables, clock: StepClock, table: str, by_name: bool = False) -> pd.DataFrame:
    """Rows of `table` starting inside the steps, counted (by name_id where `by_name`), over all steps."""
    windows = pd.DataFrame({"s": clock.starts, "e": clock.ends})
    group = ", name_id" if by_name else ""
    return tables.events.query(
        f"SELECT count(*) AS n{group} FROM {table} t JOIN windows w ON t.start >= w.s AND t.start < w.e "
        f"{'GROUP BY name_id' if by_name else ''}",
        windows=windows,
    )


def _op_ranges(tables: TraceTables, clock: StepClock) -> int:
    """emit_nvtx's op ranges inside the steps, all steps together."""
    if "nvtx" not in tables.sources:
        return 0
    counts = _per_step(tables, clock, "nvtx", by_name=True)
    names = tables.events.nvtx_categories()[0]
    is_op = [pd.notna(i) and bool(OP_RANGE.search(str(names[int(i)]))) for i in counts["name_id"]]
    return int(counts.loc[is_op, "n"].sum())


def _calls(tables: TraceTables, clock: StepClock, table: str, source: str) -> int:
    return int(_per_step(tables, clock, table)["n"].iloc[0]) if source in tables.sources else 0


def finding(overhead: Overhead | None, tables: TraceTables, clock: StepClock) -> list[Finding]:
    """A warning where the captured steps ran more than FINDING_PCT slower than the run's own: what the capture
    recorded per step and was taken with (what the added host time went to), and the settings that leave it
    out; without the run's step times, a note of what the traced events may have cost (_unknown). No gain: it is
    a cost of the capture, not of the run."""
    if overhead is None:
        return _unknown(tables, clock)
    if overhead.pct <= FINDING_PCT:
        return []
    steps = clock.steps
    ops = _op_ranges(tables, clock)
    api = _calls(tables, clock, "cuda_api", "cuda")
    os_calls = _calls(tables, clock, "osrt", "osrt")
    kinds = trace_kinds(tables)
    sampled = _sampling(tables)
    graph_mode = next(
        (v[0] for k, v in tables.capture_settings.items() if k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE")), None
    )
    recorded = [f"{api / steps:,.0f} CUDA API calls"] if api else []
    if ops:
        recorded.append(f"{ops / steps:,.0f} op-level NVTX ranges (emit_nvtx: `aten::*` ops and autograd nodes)")
    if os_calls:
        recorded.append(f"{os_calls / steps:,.0f} OS-runtime calls")
    settings = [f"--trace={','.join(kinds)}"] if kinds else []
    settings += [f"{what} on" for what in sampled]
    if graph_mode and graph_mode.lower() == "node":
        settings.append("CUDA graphs traced per node (--cuda-graph-trace=node)")
    timer = ", ".join(f"{t:,.1f}" for t in overhead.timer_window_ms)
    evidence = (
        f"Median captured step {ms(overhead.in_window_ns, 1)} ({overhead.window_steps} step ranges) against "
        f"{ms(overhead.unprofiled_ns, 1)}, the trainer's median step outside the capture window (the same run's "
        f"metrics, {overhead.outside_steps} step{'s' if overhead.outside_steps != 1 else ''}; steps 0-{WARMUP_STEPS - 1} left out as warm-up: allocator "
        f"growth, autotuning, compilation); the profiler added up to {ms(overhead.added_ns, 1)} a step. The "
        f"trainer's own timer gave the window's steps {timer} ms (nsys starting or stopping the capture can fall "
        "in them). Per captured step the capture recorded "
        + (", ".join(recorded) or "no CUDA, NVTX or OS-runtime events")
        + (f"; taken with {'; '.join(settings)}" if settings else "")
        + ". nsys stays attached outside the window, and on host-bound steps those steps too ran slower than "
        "without it (docs/PROFILING-OVERHEAD.md), so the cost can be larger than this. Host-bound findings here "
        "count only host time beyond what the profiler added (docs/DIAGNOSIS.md)."
    )
    off = []
    if ops:
        off.append(
            "no emit_nvtx (NeMo's NsysCallback turns it on as it opens the window: open the window with "
            "cudaProfilerStart/Stop alone, as sftprof does unless a window's op_ranges is on, and take op-level "
            "ranges from a second, short window)"
        )
    extra = [kind for kind in kinds if kind not in ("cuda", "nvtx")]
    if extra:
        lost = " (the idle causes then cannot name OS calls)" if "osrt" in extra else ""
        off.append(f"`--trace=cuda,nvtx` (without {', '.join(extra)}){lost}")
    if sampled:
        off.append("`--sample=none --cpuctxsw=none`")
    if graph_mode and graph_mode.lower() == "node":
        off.append("`--cuda-graph-trace=graph`")
    recommendation = (f"Time the window with {'; '.join(off)}, and compare again. " if off else "") + (
        "Every traced CUDA call costs a host-bound step, whatever the setting (docs/PROFILING-OVERHEAD.md): until "
        "the captured steps are within a few % of the run's own, read host-bound findings against the unprofiled "
        "step."
    )
    return [
        Finding(
            "profiling_overhead",
            "warning",
            f"The captured steps ran {overhead.pct:.1f}% slower than the same run's steps outside the window",
            evidence,
            recommendation,
        )
    ]


def traced_events(tables: TraceTables, clock: StepClock) -> int:
    """CUDA API calls, OS-runtime calls and NVTX ranges starting inside the steps, all steps together."""
    return sum(_calls(tables, clock, table, source) for table, source in TRACED_TABLES.items())


def _unknown(tables: TraceTables, clock: StepClock) -> list[Finding]:
    """Without the run's own step times, what the profiler may have added to a step whose pace the host sets: the
    capture's traced events a step at EVENT_COST_NS each. A note (info): no measurement of this run says how
    much it was, and a GPU-bound step hides it."""
    events = traced_events(tables, clock) / max(clock.steps, 1)
    if not clock.has_gpu or not events or not clock.step_ns:
        return []
    low, high = (events * cost for cost in EVENT_COST_NS)
    share = f"{100.0 * low / clock.step_ns:.0f}-{100.0 * high / clock.step_ns:.0f}%"
    ops = _op_ranges(tables, clock) / max(clock.steps, 1)
    op_ranges = (
        f" {ops:,.0f} of them a step are op-level NVTX ranges (emit_nvtx: `aten::*` ops and autograd nodes), which "
        "cost the run little without the profiler and each a traced event with it."
        if ops
        else ""
    )
    return [
        Finding(
            "profiling_overhead",
            "info",
            f"Without the run's own step times the profiler's cost is unknown: {ms(low, 1)}-{ms(high, 1)} a step "
            f"({share}) by the events it traced, if the host sets the step's pace",
            f"No step times of the same run were given, so the captured step ({ms(clock.step_ns, 1)}) cannot be set "
            f"against the run's own. The capture traced {events:,.0f} events a step (CUDA API and OS-runtime calls, "
            f"NVTX ranges); in measured host-bound runs each event made the step {EVENT_COST_NS[0] / 1e3:g}-"
            f"{EVENT_COST_NS[1] / 1e3:g} µs longer (docs/PROFILING-OVERHEAD.md). Host-bound findings may hold that "
            "time; where the host runs ahead of the GPU (the CPU waits for it), the GPU's pace hides it." + op_ranges,
            ("Capture without emit_nvtx (take op-level ranges from a second, short window). " if ops else "")
            + "Give the run's own step times (`sftprof analyze --metrics FILE`: the built-in trainer's and NeMo's "
            "metrics, or a loop's own as `step`, `step_time_s`, `tokens_per_s`, `in_window` lines): sftprof then "
            "measures the overhead, takes it out of the host-bound gains, and gives every gain as a share of the "
            "unprofiled step.",
        )
    ]


@dataclass(frozen=True)
class HostShare:
    """A host-bound cause's gain once the profiler's added time is taken out (host_share)."""

    gain_pct: float
    title: str  # appended to the finding's title
    evidence: str  # appended to its evidence
    basis: str  # appended to its gain basis


def unprofiled_clock(clock: StepClock, overhead: Overhead | None) -> StepClock:
    """The clock of the run without the profiler, for GPU-side gains: nsys costs the host per traced call, so
    where the run timed its steps the captured ones are longer by what it added (`added_ns`) and the CPU
    waited that much less for the GPU than it does unprofiled (StepClock.gpu_side)."""
    if overhead is None or not overhead.added_ns:
        return clock
    return replace(clock, host_slack_ns=overhead.added_ns)


def host_share(overhead: Overhead | None, host_ns: float, clock: StepClock, added_ns: float) -> HostShare | None:
    """The part of a cause of idle (`host_ns` per step, median) that the profiler cannot have added: `added_ns`
    per step of the profiler's time fell in this cause's stretches (idle.profiler_time), so host_ns - added_ns
    of it is the run's own whatever nsys cost. The gain counts that part, as a share of the captured step like
    every other gain until on_unprofiled_step rebases them all. None where no overhead was measured or none of
    it fell here."""
    if overhead is None or added_ns <= 0 or not clock.step_ns:
        return None
    own = max(0.0, host_ns - added_ns)
    gain = round(float(np.clip(100.0 * own / clock.step_ns, 0.0, 100.0)), 3)
    mostly = added_ns >= MOSTLY * host_ns
    return HostShare(
        gain,
        " (mostly the profiler's own overhead)" if mostly else "",
        f" The profiler made the captured steps {ms(overhead.added_ns, 1)} longer than the run's own "
        f"({overhead.pct:+.1f}%, finding profiling_overhead), {ms(added_ns, 1)} of it in these stretches by their "
        "share of the stretches the host held the GPU up in (nsys costs the host per traced call, and each "
        f"stretch ends with one): the gain counts only the {ms(own, 1)} it did not add.",
        f"; less the {ms(added_ns, 1)} of the profiler's added time placed here: {ms(own, 1)}",
    )


def on_unprofiled_step(findings: list[Finding], overhead: Overhead | None) -> list[Finding]:
    """Every gain as a share of the run's own step where the same run timed it (`overhead`): a gain is the time
    a fix saves, and the fix is judged on the run without the profiler. The captured step is longer by what the
    profiler added, so its shares understate the saving. A severity that followed the gain follows the new one."""
    if overhead is None or overhead.unprofiled_ns <= 0 or overhead.in_window_ns == overhead.unprofiled_ns:
        return findings
    factor = overhead.in_window_ns / overhead.unprofiled_ns
    rebased = []
    for finding in findings:
        if finding.gain_pct is None:
            rebased.append(finding)
            continue
        gain = round(float(np.clip(finding.gain_pct * factor, 0.0, 100.0)), 3)
        saved = finding.gain_pct / 100.0 * overhead.in_window_ns
        severity = severity_of(gain) if finding.severity == severity_of(finding.gain_pct) else finding.severity
        rebased.append(
            replace(
                finding,
                severity=severity,
                gain_pct=gain,
                gain_basis=f"{finding.gain_basis}; {ms(saved, 1)} a step of the run's own {ms(overhead.unprofiled_ns, 1)} "
                f"step (profiling_overhead: the captured one is {overhead.pct:+.1f}%)",
            )
        )
    return rebased
