"""CPU-visible bottlenecks planted in a miniature training loop (tests/planted_training_loop.py) and
captured under the real nsys: the analysis must name each one, and stay quiet on the clean loop and
on the clean demo capture.

Live captures trace `osrt,nvtx` without context switches: with `--cpuctxsw=process-tree`, nsys
2022.4 on this VM hangs in about half of the runs (an analysis thread spins in epoll_wait after the
program exits). Scheduling analyses therefore run on tests/fixtures/cpu_lock_sched.sqlite, one
successful capture of the `lock` plant with `--cpuctxsw=process-tree`.
"""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof import pipeline
from sftprof.analysis import analyze, intervals, sched
from sftprof.capture import nsys
from sftprof.trace import load_trace
from sftprof.trace.events import EventStore

PLANTED = Path(__file__).parent / "planted_training_loop.py"
SCHED_FIXTURE = Path(__file__).parent / "fixtures" / "cpu_lock_sched.sqlite"
CAPTURE_OPTIONS = ["--trace=osrt,nvtx", "--sample=none", "--cpuctxsw=none"]
PROBLEMS = {"data_stall", "lock_wait"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    """Each mode of the planted loop, profiled, exported and analysed."""
    folder = tmp_path_factory.mktemp("planted")
    analyses = {}
    for mode in ("clean", "data_starved", "lock"):
        report = nsys.run_profile(CAPTURE_OPTIONS, [sys.executable, str(PLANTED), mode], folder / mode, io.StringIO())
        analyses[mode] = analyze(load_trace(pipeline.export_report(report, folder / f"{mode}.sqlite")))
    return analyses


def _rules(analysis) -> dict:
    return {f.rule: f for f in analysis.findings}


@pytest.mark.e2e
def test_a_starved_data_path_is_named(planted):
    found = _rules(planted["data_starved"])
    stall = found["data_stall"]
    assert stall.severity == "warning"
    share = float(stall.title.split("takes ")[1].split("%")[0])
    assert 40 < share < 80  # 40 ms of sleep (more on a loaded machine) in a ~72 ms step
    # the main thread, by the last name nsys recorded for it: under load nsys 2022.4 can miss the rename at
    # exec and keep its launcher's name (seen once, in a fresh clone's run beside other work)
    assert "clock_nanosleep" in stall.evidence and re.search(r"(python|nsys-launcher) \(main, tid", stall.evidence)
    assert "num_workers" in stall.recommendation
    assert "lock_wait" not in found


@pytest.mark.e2e
def test_a_thread_blocked_in_a_lock_is_named(planted):
    found = _rules(planted["lock"])
    lock = found["lock_wait"]
    # the main thread under either name nsys 2022.4 records for it (it can miss the rename at exec)
    assert lock.severity == "warning" and re.match(r"(python|nsys-launcher) \(main, tid", lock.title)
    assert "sem_wait" in lock.evidence and "in NVTX `optimizer`" in lock.evidence
    waited = float(lock.title.split("locks ")[1].split("%")[0])
    assert 15 < waited < 60  # ~19 ms of a ~52 ms step
    assert "data_stall" not in found


@pytest.mark.e2e
def test_the_clean_loop_raises_no_problem(planted):
    found = _rules(planted["clean"])
    assert not PROBLEMS & set(found)
    assert found["no_cpu_scheduling"].recommendation.startswith("Add --cpuctxsw=process-tree")
    steps = planted["clean"].tables["steps"]
    # the median step: one step of a real capture on a loaded 2-core machine once took 13% in data
    assert list(steps["step"]) == [0, 1, 2, 3, 4] and (steps["data_ns"] / steps["duration"]).median() < 0.1


@pytest.mark.e2e
def test_the_clean_demo_capture_raises_no_problem(demo_sqlite):
    """The real SFT loop on CPU (conftest's demo): backward dominates, nothing is planted."""
    analysis = analyze(load_trace(demo_sqlite))
    assert not PROBLEMS & {f.rule for f in analysis.findings}
    assert "dominant_phase" in {f.rule for f in analysis.findings}


# ---------------------------------------------------------------- CPU scheduling (committed capture)


@pytest.fixture(scope="module")
def sched_capture():
    tables = load_trace(SCHED_FIXTURE)
    return tables, analyze(tables)


def test_on_cpu_intervals_are_consistent(sched_capture):
    tables, _ = sched_capture
    assert "cpuctxsw" in tables.sources and len(tables.sched) > 100
    runs = tables.events.query(sched.runs_sql(tables.span_ns))
    assert (runs["duration"] > 0).all() and (runs["end"] <= tables.span_ns).all()
    for _, thread_runs in runs.groupby("global_tid"):  # a thread runs on one core at a time
        ordered = thread_runs.sort_values("start")
        assert (ordered["start"].to_numpy()[1:] >= ordered["end"].to_numpy()[:-1]).all()
    for _, core_runs in runs.groupby("cpu"):  # a core runs one thread at a time
        ordered = core_runs.sort_values("start")
        assert (ordered["start"].to_numpy()[1:] >= ordered["end"].to_numpy()[:-1]).all()
    use = sched.core_use(tables.events, tables.span_ns)
    assert use.cores["busy_ns"].sum() == runs["duration"].sum() and (use.cores["busy_pct"] <= 100).all()
    assert use.running.sum() == runs["duration"].sum()
    assert use.cores["threads"].tolist() == runs.groupby("cpu")["global_tid"].nunique().tolist()


def test_the_blocked_thread_is_off_cpu_while_it_waits(sched_capture):
    """Two independent nsys sources agree: OSRT says main sat in sem_wait, SCHED says it was not running."""
    tables, result = sched_capture
    main_tid = result.tables["threads"].set_index("role").loc["main", "global_tid"]
    waits = tables.osrt[
        (tables.osrt["global_tid"] == main_tid)
        & (tables.osrt["name"] == "sem_wait")
        & (tables.osrt["duration"] > 10_000_000)
    ]
    assert len(waits) == 5  # one per step, ~19 ms each
    runs = tables.events.query(sched.runs_sql(tables.span_ns))
    running = intervals.union(runs[runs["global_tid"] == main_tid])
    on_cpu = intervals.covered_ns(running, waits["start"], waits["end"])
    assert (on_cpu < 0.05 * waits["duration"].to_numpy()).all()
    assert "lock_wait" in {f.rule for f in result.findings}


def test_thread_states_and_core_timeline(sched_capture):
    tables, result = sched_capture
    states = result.tables["thread_states"].set_index("role")
    main = states.loc["main"]
    assert 0 < main.running_pct <= 100 and main.os_calls_pct > 10
    timeline = result.tables["cpu_timeline"]
    assert set(timeline["cpu"]) == set(result.tables["cpu_cores"]["cpu"]) and timeline["busy_pct"].between(0, 100).all()
    lengths = (timeline["end"] - timeline["start"]).to_numpy()
    per_core = pd.Series(timeline["busy_pct"].to_numpy() / 100 * lengths).groupby(timeline["cpu"].to_numpy()).sum()
    cores = result.tables["cpu_cores"].set_index("cpu")["busy_ns"]
    assert np.allclose(per_core.sort_index().to_numpy(), cores.sort_index().to_numpy(), atol=100)
    [finding] = [f for f in result.findings if f.rule == "cpu_cores"]
    assert finding.title.startswith(f"The program ran on {len(cores)} CPU cores")


def test_sched_pairing_handles_threads_running_at_the_edges():
    events = pd.DataFrame(
        {
            "start": [5, 10, 30, 40, 50],
            "cpu": [1, 0, 0, 1, 0],
            "is_sched_in": [False, True, False, True, True],
            "global_tid": [2, 1, 1, 2, 1],
            "pid": 0,
            "tid": [2, 1, 1, 2, 1],
        }
    )
    store = EventStore.from_frames(sched=events)
    runs = store.query(f"{sched.runs_sql(span_ns=100)} ORDER BY start, cpu")
    assert runs[["global_tid", "cpu", "start", "end"]].values.tolist() == [
        [2, 1, 0, 5],  # running when the capture began
        [1, 0, 10, 30],
        [2, 1, 40, 100],  # still running when it ended
        [1, 0, 50, 100],
    ]


def test_off_cpu_intervals_close_at_the_next_switch_in_and_at_the_window():
    events = pd.DataFrame(
        {  # thread 1: out at 20, in at 30, out at 45, in at 60, out at 90 (past the window); thread 2 elsewhere
            "start": [5, 20, 25, 30, 45, 60, 90],
            "cpu": 0,
            "is_sched_in": [True, False, False, True, False, True, False],
            "global_tid": [1, 1, 2, 1, 1, 1, 1],
            "pid": 0,
            "tid": [1, 1, 2, 1, 1, 1, 1],
        }
    )
    store = EventStore.from_frames(sched=events)
    starts, ends = sched.off_cpu(store, 1, lo=10, hi=80)
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(20, 30), (45, 60)]
    starts, ends = sched.off_cpu(store, 1, lo=50, hi=100)  # switched out when the window opens, out again at 90
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(50, 60), (90, 100)]
    assert not len(sched.off_cpu(store, 3, lo=0, hi=100)[0])  # no switches: nothing known to be off
    starts, ends = sched.off_cpu(store, 2, lo=10, hi=100)  # only a switch-out: off from it to the window's end
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(25, 100)]
    only_in = EventStore.from_frames(sched=events.assign(is_sched_in=events["global_tid"] == 2))
    starts, ends = sched.off_cpu(only_in, 2, lo=10, hi=100)  # only a switch-in: off from the window's start to it
    assert list(zip(starts.tolist(), ends.tolist(), strict=True)) == [(10, 25)]


def test_core_use_read_in_batches_equals_the_runs_summed_whole(monkeypatch):
    """Random switches of 40 threads on 6 cores (threads running at either edge, runs that overlap on a
    core where switches were lost), read a DuckDB vector (2,048 rows) at a time: the per-core busy time,
    threads and timeline, and each thread's time on a core, equal sums over the runs taken whole."""
    from sftprof.trace import events as events_module

    rng = np.random.default_rng(3)
    n = 30_000
    switches = pd.DataFrame(
        {
            "start": rng.integers(0, 10_000_000, n),
            "cpu": rng.integers(0, 6, n),
            "is_sched_in": rng.random(n) < 0.5,
            "global_tid": rng.integers(0, 40, n) + (7 << 24),
        }
    )
    store = EventStore.from_frames(sched=switches)
    monkeypatch.setattr(events_module, "BATCH_VECTORS", 1)
    use = sched.core_use(store, span_ns=9_000_000, chunks=7)
    runs = store.query(sched.runs_sql(9_000_000))
    assert len(runs) > 5_000 and (runs["start"] == 0).any() and (runs["end"] == runs["end"].max()).sum() > 1
    edges = intervals.chunk_edges(0, 9_000_000, 7)
    busy, timeline = [], []
    for _, core_runs in runs.groupby("cpu"):
        merged = intervals.union(core_runs)
        busy.append(int((merged["end"] - merged["start"]).sum()))
        timeline.extend(100.0 * intervals.covered_ns(merged, *edges) / (edges[1] - edges[0]))
    assert busy < runs.groupby("cpu")["duration"].sum().tolist()  # overlapping runs are counted once
    assert use.cores["busy_ns"].tolist() == busy
    assert use.cores["threads"].tolist() == runs.groupby("cpu")["global_tid"].nunique().tolist()
    assert np.allclose(use.timeline["busy_pct"], timeline)
    assert use.running.sort_index().to_dict() == runs.groupby("global_tid")["duration"].sum().to_dict()


@pytest.mark.parametrize("fixture", ["cpu_lock_sched", "h200_sft_data_stall"])
def test_calls_read_a_row_at_a_time_give_the_same_findings(fixture, monkeypatch):
    """The lock-wait, data-stall and step-wait sums read the store's rows in batches (EventStore.batches): with
    every batch cut into single rows, each finding and the step waits are as with whole batches."""
    path = Path(__file__).parent / "fixtures" / f"{fixture}.sqlite"
    whole = analyze(load_trace(path))
    batches = EventStore.batches

    def row_by_row(self, sql, **frames):
        for batch in batches(self, sql, **frames):
            yield from (batch.iloc[[i]] for i in range(len(batch)))

    monkeypatch.setattr(EventStore, "batches", row_by_row)
    cut = analyze(load_trace(path))
    assert {f.rule for f in whole.findings} & PROBLEMS
    assert [(f.rule, f.title, f.evidence, f.gain_pct) for f in cut.findings] == [
        (f.rule, f.title, f.evidence, f.gain_pct) for f in whole.findings
    ]
    pd.testing.assert_frame_equal(cut.tables["step_waits"], whole.tables["step_waits"])
