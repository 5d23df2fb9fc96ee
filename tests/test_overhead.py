"""Profiling overhead (issue 51): the captured steps against the same run's steps outside the window, on real
captures with the trainer's metrics. Every expected figure is derived here from the files themselves: the
step ranges from the export's own NVTX table, the unprofiled step from the metrics file."""

import json
import sqlite3

import numpy as np
import pytest

from sftprof.analysis import overhead
from sftprof.analysis.variants import WARMUP_STEPS
from sftprof.pipeline import analyze_trace
from sftprof.report.html import RankReport, render_html

from conftest import NEMO_CAPTURE, NEMO_DEFAULT_WINDOW, REPO

FIXTURES = REPO / "tests" / "fixtures"


def step_ranges_ms(sqlite_path) -> list[float]:
    """The `step N` NVTX ranges' durations, read from the export with SQLite alone."""
    with sqlite3.connect(sqlite_path) as db:
        rows = db.execute(
            """SELECT e."end" - e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
               WHERE coalesce(e.text, s.value) GLOB 'step [0-9]*' AND e."end" IS NOT NULL"""
        ).fetchall()
    return [duration / 1e6 for (duration,) in rows]


def unprofiled_ms(metrics_path) -> list[float]:
    """The trainer's steps outside the window after the warm-up steps, from the metrics file."""
    lines = [json.loads(line) for line in open(metrics_path) if line.strip()]
    return [1e3 * r["step_time_s"] for r in lines if not r["in_window"] and r["step"] >= WARMUP_STEPS]


def expected_pct(sqlite_path, metrics_path) -> float:
    return 100.0 * (np.median(step_ranges_ms(sqlite_path)) / np.median(unprofiled_ms(metrics_path)) - 1.0)


def test_nemo_capture_says_its_emit_nvtx_window_slowed_the_run(nemo, nemo_sqlite):
    """docs/NEMO.md: steps inside NsysCallback's window took 0.70-0.84 s, outside 0.39-0.56 s. The overhead is
    in the headline, and the finding names emit_nvtx's op ranges and the trace kinds the capture was taken with."""
    metrics = NEMO_CAPTURE.with_suffix(".metrics.jsonl")
    pct = expected_pct(nemo_sqlite, metrics)
    assert pct > overhead.FINDING_PCT
    assert nemo.headline["profiling_overhead_pct"] == pytest.approx(pct, abs=0.01)
    assert nemo.headline["unprofiled_step_ms"] == pytest.approx(np.median(unprofiled_ms(metrics)))
    (finding,) = [f for f in nemo.findings if f.rule == "profiling_overhead"]
    assert finding.severity == "warning" and finding.gain_pct is None
    assert f"{pct:.1f}% slower than the same run's steps outside the window" in finding.title
    assert "op-level NVTX ranges (emit_nvtx" in finding.evidence and "osrt" in finding.evidence
    assert "nsys stays attached outside the window" in finding.evidence  # the figure can understate the cost
    assert "no emit_nvtx" in finding.recommendation and "--trace=cuda,nvtx" in finding.recommendation


def test_host_bound_findings_on_nemo_do_not_rank_on_the_profilers_time(nemo, nemo_sqlite):
    """launch_bound's gain counts only the host time the profiler did not add: the added time is spread over the
    causes of idle by their stretches (queued idle left out), and the rest is a share of the run's own step."""
    step = np.median(step_ranges_ms(nemo_sqlite))
    unprofiled = np.median(unprofiled_ms(NEMO_CAPTURE.with_suffix(".metrics.jsonl")))
    causes = nemo.tables["idle_causes"]
    held = causes[causes["cause"] != "queued"]
    stretches = held.groupby("cause")["pieces"].sum()  # no data, sync or lock finding takes NeMo's host overhead
    placed = (step - unprofiled) * stretches["host overhead"] / stretches.sum()
    host = causes[causes["cause"] == "host overhead"]
    host_ms = np.median(host.groupby("step")["idle_ns"].sum()) / 1e6
    (launch,) = [f for f in nemo.findings if f.rule == "launch_bound"]
    assert launch.gain_pct == pytest.approx(100 * max(0.0, host_ms - placed) / unprofiled, abs=0.05)
    assert host_ms / unprofiled * 100 > launch.gain_pct  # the raw idle would have ranked on the overhead
    assert "The profiler made the captured steps" in launch.evidence and "run's own" in launch.gain_basis


def test_every_gain_is_a_share_of_the_unprofiled_step(nemo, nemo_sqlite):
    """Where the run timed its own steps, a gain is the time saved over the run's own step: the captured one is
    longer by what the profiler added, so its shares would understate every saving."""
    step = np.median(step_ranges_ms(nemo_sqlite))
    unprofiled = np.median(unprofiled_ms(NEMO_CAPTURE.with_suffix(".metrics.jsonl")))
    gained = [f for f in nemo.findings if f.gain_pct and f.rule not in ("launch_bound", "host_work", "copy_calls")]
    assert gained
    for finding in gained:
        saved_ms = float(finding.gain_basis.rsplit("; ", 1)[1].split(" ms a step")[0].replace(",", ""))
        assert finding.gain_pct == pytest.approx(100 * saved_ms / unprofiled, abs=0.05)
        assert saved_ms < step


@pytest.mark.parametrize("capture", ["h200_sft_clean", "nsys2025/h200_sft_clean"])
def test_clean_builtin_trainer_capture_raises_none(capture):
    """The built-in trainer's clean captures: steps in the window as fast as outside it (within noise)."""
    sqlite_path, metrics = FIXTURES / f"{capture}.sqlite", FIXTURES / f"{capture}.metrics.jsonl"
    result = analyze_trace(sqlite_path, metrics)
    pct = expected_pct(sqlite_path, metrics)
    assert pct <= overhead.FINDING_PCT
    assert result.headline["profiling_overhead_pct"] == pytest.approx(pct, abs=0.01)
    assert "profiling_overhead" not in {f.rule for f in result.findings}


def test_launch_bound_builtin_capture_raises_it():
    """The built-in trainer at short sequences is launch-bound (tests/fixtures/README.md, padding_fixed): its
    window's steps ran well over 10% slower than the rest of the same run."""
    sqlite_path, metrics = FIXTURES / "h200_sft_padding_fixed.sqlite", FIXTURES / "h200_sft_padding_fixed.metrics.jsonl"
    result = analyze_trace(sqlite_path, metrics)
    pct = expected_pct(sqlite_path, metrics)
    assert pct > overhead.FINDING_PCT
    (finding,) = [f for f in result.findings if f.rule == "profiling_overhead"]
    assert f"{pct:.1f}% slower" in finding.title and "`--trace=cuda,nvtx` (without osrt)" in finding.recommendation


def test_no_figure_without_the_runs_metrics_only_a_note_of_what_the_events_may_cost():
    """Without the run's metrics no overhead is measured: a note gives the traced events a step at the cost per
    event measured on host-bound runs (overhead.EVENT_COST_NS), and takes nothing out of any gain."""
    sqlite_path = FIXTURES / "h200_sft_padding_fixed.sqlite"
    result = analyze_trace(sqlite_path)
    assert result.headline["profiling_overhead_pct"] is None
    (note,) = [f for f in result.findings if f.rule == "profiling_overhead"]
    with sqlite3.connect(sqlite_path) as db:  # the export's own rows, starting inside its step ranges
        steps = db.execute("SELECT start, end FROM NVTX_EVENTS WHERE text LIKE 'step %'").fetchall()
        events = sum(
            db.execute(f"SELECT count(*) FROM {table} WHERE start >= ? AND start < ?", step).fetchone()[0]
            for table in ("CUPTI_ACTIVITY_KIND_RUNTIME", "OSRT_API", "NVTX_EVENTS")
            for step in steps
        )
    assert note.severity == "info" and note.gain_pct is None and len(steps) == result.headline["steps_captured"]
    assert f"{events / len(steps):,.0f} events a step" in note.evidence
    low = events / len(steps) * overhead.EVENT_COST_NS[0] / 1e6
    assert f"{low:,.1f} ms-" in note.title


def test_report_first_screen_gives_the_overhead(nemo):
    """The figure sits under the first heading, before the top finding."""
    html = render_html([RankReport("", nemo, NEMO_CAPTURE.with_suffix(".metrics.jsonl"))], "nemo")
    first_screen = html[: html.index('class="finding')]
    assert (
        f"Profiling overhead: the captured steps took\n {nemo.headline['profiling_overhead_pct']:+.1f}%" in first_screen
    )


def test_nemos_default_window_without_op_ranges_still_says_what_the_trace_costs(nemo_default_window):
    """The NeMo backend's default window (cudaProfilerStart/Stop alone, no emit_nvtx) on an H100: the step
    ranges against the run's own steps outside the window still differ by more than FINDING_PCT, and the finding
    puts it on the traced calls, not on op ranges the capture does not hold."""
    sqlite_path, analysis = nemo_default_window
    pct = expected_pct(sqlite_path, NEMO_DEFAULT_WINDOW.with_suffix(".metrics.jsonl"))
    assert pct > overhead.FINDING_PCT
    assert analysis.headline["profiling_overhead_pct"] == pytest.approx(pct, abs=0.01)
    (finding,) = [f for f in analysis.findings if f.rule == "profiling_overhead"]
    assert finding.severity == "warning" and f"{pct:.1f}% slower" in finding.title
    assert "CUDA API calls" in finding.evidence and "emit_nvtx" not in finding.evidence
    assert "no emit_nvtx" not in finding.recommendation
