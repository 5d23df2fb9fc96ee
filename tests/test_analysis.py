"""Pure analyses over small tables built in the test, so every expected number is derivable."""

from __future__ import annotations

import math
import sqlite3
import statistics
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import analyze, gpu, intervals, nvtx
from sftprof.analysis.stats import finish_summary, grouped_summary, sqlite_round
from sftprof.trace.events import EventStore
from sftprof.trace.tables import TraceTables


def duration_summary(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """nsys's summary of a pandas table's `duration` by `keys` (text; missing: a group of its own)."""
    return finish_summary(grouped_summary(EventStore(on_disk=False), "rows", keys, rows=rows), keys)


def test_summary_statistics_follow_nsys_conventions():
    rows = pd.DataFrame({"name": ["a", "a", "a", "a", "b"], "duration": [1, 2, 10, 20, 7]})
    summary = duration_summary(rows, ["name"]).set_index("name")
    a = summary.loc["a"]
    assert (a.total_ns, a.instances, a.min_ns, a.max_ns) == (33, 4, 1, 20)
    assert a.med_ns == 6.0  # mean of the two middle values
    assert a.avg_ns == 8.3  # 8.25 rounds half away from zero, as SQLite does
    assert a.stddev_ns == 8.8  # sample standard deviation (n - 1)
    assert summary.loc["b"].stddev_ns == 0.0  # one instance: 0, not NaN
    assert list(summary.index) == ["a", "b"]  # by total time, descending
    assert summary["time_pct"].tolist() == [82.5, 17.5]


def test_rounding_in_one_statement_equals_sqlite_round_of_each_value():
    """nsys rounds its summaries with SQLite's round(); sftprof rounds every distinct value in one statement, and
    leaves integers below 2^52 as they are: the same doubles as a round() per value, whatever the value."""
    rng = np.random.default_rng(7)
    edges = [math.nan, -0.0, 0.0, 0.05, 0.15, 0.25, 0.45, 2.5, -2.5, 1e300, -1e20, math.inf, -math.inf]
    edges += [2.0**52 - 1, 2.0**52, 2.0**52 + 2, -(2.0**52) + 1, 4503599627370495.5, 1e15 + 0.5, 123456789.05]
    values = np.concatenate(
        [
            rng.random(5000) * 1e6,
            np.round(rng.random(500) * 1e4, 2) + 0.05,  # halves at the rounded digit
            rng.integers(-(2**53), 2**53, 500).astype(float),
            rng.integers(0, 10**7, 500) + 0.5,
            edges,
        ]
    )
    series = pd.Series(values, index=np.arange(len(values)) * 3)
    rounded = sqlite_round(series)
    con = sqlite3.connect(":memory:")
    each = [con.execute("SELECT round(?, 1)", (float(value),)).fetchone()[0] for value in values]
    expected = np.array([math.nan if value is None else value for value in each])
    got = rounded.to_numpy()
    same = (got.view("int64") == expected.view("int64")) | (np.isnan(got) & np.isnan(expected))
    assert same.all(), values[~same]
    assert rounded.index.equals(series.index)


def test_busy_time_is_the_union_over_streams_not_the_sum():
    kernels = pd.DataFrame(
        {"device_id": [0, 0, 0, 1], "start": [10, 15, 40, 5], "end": [20, 30, 50, 6], "name": ["k"] * 4}
    )
    memops = pd.DataFrame({"device_id": [0], "start": [29], "end": [35], "operation": ["[CUDA memset]"]})
    busy = gpu.gpu_busy(gpu.busy_by_device(EventStore.from_frames(kernels=kernels, memops=memops)))
    busy = busy.set_index("device_id")
    # device 0: [10,35) merged from three overlapping ops, then [40,50): 35 ns busy in a 40 ns span
    assert busy.loc[0, "busy_ns"] == 35 and busy.loc[0, "span_ns"] == 40
    assert busy.loc[0, "busy_pct"] == 87.5
    assert busy.loc[1, "busy_ns"] == 1


def _tables_with(**frames) -> TraceTables:
    events = EventStore.from_frames(
        kernels=frames.pop("kernels", None), cuda_api=frames.pop("cuda_api", None), nvtx=frames.pop("nvtx", None)
    )
    return TraceTables(source_path="test", span_ns=1_000_000_000, sources={"cuda", "nvtx"}, events=events, **frames)


def _nvtx_steps(durations_ms):
    rows, t = [], 0
    for step, ms in enumerate(durations_ms):
        end = t + int(ms * 1e6)
        rows.append(
            {
                "start": t,
                "end": end,
                "duration": end - t,
                "name": f"step {step}",
                "style": "PushPop",
                "global_tid": 1,
                "pid": 1,
                "tid": 1,
            }
        )
        half = t + (end - t) // 2
        rows.append(
            {
                "start": t,
                "end": half,
                "duration": half - t,
                "name": "forward",
                "style": "PushPop",
                "global_tid": 1,
                "pid": 1,
                "tid": 1,
            }
        )
        rows.append(
            {
                "start": half,
                "end": end,
                "duration": end - half,
                "name": "backward",
                "style": "PushPop",
                "global_tid": 1,
                "pid": 1,
                "tid": 1,
            }
        )
        t = end
    return pd.DataFrame(rows)


def test_findings_name_slow_steps_and_gpu_facts_with_evidence():
    kernels = pd.DataFrame(
        {
            "start": [100, 300],
            "end": [200, 900],
            "duration": [100, 600],
            "name": ["ampere_bf16_gemm", "elementwise"],
            "short_name": ["gemm", "ew"],
            "mangled_name": [None, None],
            "device_id": [0, 0],
            "stream_id": [7, 7],
            "pid": [1, 1],
            "correlation_id": [1, 2],
            "grid": ["1 1 1"] * 2,
            "block": ["1 1 1"] * 2,
        }
    )
    result = analyze(_tables_with(kernels=kernels, nvtx=_nvtx_steps([10, 10, 40, 10])))
    rules = {f.rule: f for f in result.findings}
    assert "no_gpu_activity" not in rules
    assert (
        rules["top_kernel"].title.startswith("Top kernel takes 85.7%") and "elementwise" in rules["top_kernel"].evidence
    )
    assert "step 2 40.0 ms" in rules["slow_steps"].evidence
    # what the run saves if the slow step took the median's time: 30 of the steps' 70 ms
    assert rules["slow_steps"].gain_pct == pytest.approx(100 * 30 / 70, abs=0.001)
    assert rules["gpu_busy"].severity == "info" and "87.5%" in rules["gpu_busy"].title
    assert result.headline["steps_captured"] == 4


def _named_ranges(*spans: tuple[str, float, float]) -> pd.DataFrame:
    """NVTX ranges on one thread: (name, start ms, end ms) each."""
    rows = [(name, int(a * 1e6), int(b * 1e6)) for name, a, b in spans]
    return pd.DataFrame(
        [
            {
                "start": a,
                "end": b,
                "duration": b - a,
                "name": n,
                "style": "PushPop",
                "global_tid": 1,
                "pid": 1,
                "tid": 1,
            }
            for n, a, b in rows
        ]
    )


def _numbered(name: str, numbers, inner: str = "layer") -> pd.DataFrame:
    """A range `name N` 10 ms long for each number, one after another, each holding `inner 0` and `inner 1`."""
    spans = []
    for i, number in enumerate(numbers):
        t = 10.0 * i
        spans += [(f"{name} {number}", t, t + 10), (f"{inner} 0", t + 1, t + 4), (f"{inner} 1", t + 5, t + 9)]
    return _named_ranges(*spans)


def test_ranges_numbered_one_after_another_are_the_steps_where_nothing_else_finds_them():
    """A loop's own name for its iterations (`minibatch N`), unknown to sftprof and with no kernels to infer steps
    from: the family whose numbers count up by one from range to range is the steps, not the layers inside them
    (which count from 0 again every step), and the report says how they were found."""
    result = analyze(_tables_with(nvtx=_numbered("minibatch", [5, 6, 7])))
    assert result.headline["steps_captured"] == 3
    assert "numbered one after another (named like 'minibatch 5')" in result.headline["steps_found_by"]


@pytest.mark.parametrize(
    "nvtx",
    [
        _numbered("minibatch", [5, 7, 8]),  # a number skipped: not one range after another
        _numbered("minibatch", [7, 6, 5]),  # counting down
        _named_ranges(("chunk 1", 0, 10), ("chunk 2", 5, 15)),  # overlapping
        _named_ranges(("aten::mm, seq = 1", 0, 10), ("aten::mm, seq = 2", 10, 20)),  # emit_nvtx's op ranges
    ],
)
def test_ranges_that_do_not_count_up_one_after_another_are_not_steps(nvtx):
    assert analyze(_tables_with(nvtx=nvtx)).headline["steps_captured"] == 0


def test_no_false_alarms_on_even_steps_without_gpu():
    tables = _tables_with(nvtx=_nvtx_steps([10, 11, 10, 12]))
    tables.sources = {"nvtx"}
    rules = {f.rule for f in analyze(tables).findings}
    assert "slow_steps" not in rules and "gpu_busy" not in rules and "no_gpu_activity" in rules


@pytest.mark.parametrize("sources, said", [({"nvtx"}, "holds no CUDA calls"), ({"nvtx", "cuda"}, "were traced")])
def test_no_gpu_activity_says_what_an_export_can_tell(sources, said):
    """An export without a CUDA call cannot tell `cuda` left out of the trace from a CPU run (cuda is traced by
    default), so the finding names both and does not tell the user to add what may be there."""
    tables = _tables_with(nvtx=_nvtx_steps([10, 11, 10, 12]))
    tables.sources = sources
    [finding] = [f for f in analyze(tables).findings if f.rule == "no_gpu_activity"]
    assert said in finding.evidence and "sft.device: cuda" in finding.recommendation


def _threads(osrt_ms: dict[str, tuple[float, str]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "thread_name": name,
                "role": "main" if name == "python" else "autograd",
                "tid": i,
                "osrt_ns": int(ms * 1e6),
                "top_osrt_call": call,
                "top_osrt_ns": int(ms * 1e6),
            }
            for i, (name, (ms, call)) in enumerate(osrt_ms.items())
        ]
    )


def test_thread_blocking_is_a_finding_only_above_the_threshold():
    from sftprof.analysis.overview import thread_findings as _thread_findings

    span = 1_000_000_000
    assert _thread_findings(_threads({"python": (50, "pthread_cond_wait")}), span) == []
    [finding] = _thread_findings(
        _threads({"python": (400, "pthread_cond_wait"), "pt_autograd_0": (300, "sem_wait")}), span
    )
    assert finding.title.startswith("python (main thread) blocks 40.0%")
    assert "pt_autograd_0 (autograd, tid 1) 300.000 ms = 30.0%" in finding.evidence
    assert "autograd engine" in finding.recommendation
    [io_bound] = _thread_findings(_threads({"python": (200, "write")}), span)
    assert io_bound.recommendation.startswith("write on a training thread")


def test_thread_summary_of_many_threads_sums_each_threads_calls_and_names_its_longest():
    """OS-runtime calls on 300 threads (a node's thread pools): each thread's count, time and longest call, as
    the rows give them; a tie goes to the first name, and a thread whose calls have no name has no top call."""
    from sftprof.analysis import cpu, cuda

    rng = np.random.default_rng(3)
    pid, rows = 4242, 6000
    tids = rng.integers(1, 301, rows)
    starts = rng.integers(0, 900_000_000, rows)
    osrt = pd.DataFrame(
        {
            "start": starts,
            "end": starts + rng.integers(1, 1_000_000, rows),
            "global_tid": (pid << 24) | tids,
            "name": rng.choice(["read", "write", "poll", "futex"], rows),
        }
    )
    tie = pd.DataFrame({"start": [10, 20], "end": [10**6 + 10, 10**6 + 20], "name": ["write", "poll"]})
    unnamed = pd.DataFrame({"start": [5], "end": [50], "name": [None]})
    osrt = pd.concat(
        [osrt, tie.assign(global_tid=(pid << 24) | 999), unnamed.assign(global_tid=(pid << 24) | 998)],
        ignore_index=True,
    )
    tables = TraceTables(source_path="test", span_ns=10**9, events=EventStore.from_frames(osrt=osrt))
    summary = cpu.thread_summary(tables, cuda.host_wait_calls(tables.events), cuda.calls_by_thread(tables.events))
    summary = summary.set_index("tid")
    durations = osrt.assign(tid=osrt["global_tid"] & 0xFFFFFF, duration=osrt["end"] - osrt["start"])
    per_call = durations.groupby(["tid", "name"])["duration"].sum()
    assert len(summary) == 302
    assert summary["osrt_calls"].to_dict() == durations.groupby("tid").size().to_dict()
    assert summary["osrt_ns"].to_dict() == durations.groupby("tid")["duration"].sum().to_dict()
    longest = per_call.groupby("tid").max()
    assert summary["top_osrt_ns"].drop(998).to_dict() == longest.to_dict()
    for tid in summary.index.drop([998, 999]):
        assert per_call[(tid, summary.at[tid, "top_osrt_call"])] == longest[tid]
    assert summary.at[999, "top_osrt_call"] == "poll" and summary.at[998, "top_osrt_call"] == ""


def test_busy_time_merged_window_by_window_equals_the_union_of_every_operation(h200_tables, monkeypatch):
    """busy_by_device fetches each device's operations in windows of start times; an operation may
    run on past its window's end into the next ones."""
    kernels, memops = h200_tables.kernels, h200_tables.memops
    operations = pd.concat([kernels[["start", "end"]], memops[["start", "end"]]])
    whole = intervals.union(operations[operations["start"] > 0])
    monkeypatch.setattr(gpu, "BUSY_WINDOW_ROWS", 50)
    [windowed] = gpu.busy_by_device(h200_tables.events).values()
    assert len(operations) // 50 > 80  # windows of about 50 starts: many edges
    pd.testing.assert_frame_equal(windowed.merged.frame(), whole)
    assert (windowed.first, windowed.last) == (operations["start"].min(), whole["end"].max())


def test_device_windows_hold_about_the_rows_asked_for_however_many_rows():
    """Windows are cut so that each holds about `rows` starts, with no cap on their number: memory holds a
    window whatever the capture's length."""
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(0, 10**12, 300_000))
    ops = pd.DataFrame({"device_id": np.repeat([0, 1], [200_000, 100_000]), "start": starts, "end": starts + 5})
    found = list(gpu.device_windows(EventStore.from_frames(), "ops", 1_000, ops=ops))
    assert [device for device, *_ in found] == [0, 1]
    for device, first, last_end, windows in found:
        mine = ops[ops["device_id"] == device]
        assert (first, last_end) == (mine["start"].min(), mine["end"].max())
        counts = [((mine["start"] >= lo) & (mine["start"] < hi)).sum() for lo, hi in windows]
        assert sum(counts) == len(mine) and len(windows) == len(mine) // 1_000
        assert max(counts) < 1_500


def test_intervals_merged_in_batches_equal_the_union_at_once():
    """busy_by_device merges operations through RunningUnion a window at a time; a batch boundary
    may fall inside a run of overlapping intervals, or between touching ones."""
    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, 100_000, 5_000))
    ends = starts + rng.integers(0, 60, len(starts))
    at_once = intervals.union(pd.DataFrame({"start": starts, "end": ends}))
    for batch in (1, 2, 7, 999, 5_000):
        running = intervals.RunningUnion()
        for lo in range(0, len(starts), batch):
            running.add(starts[lo : lo + batch], ends[lo : lo + batch])
        pd.testing.assert_frame_equal(running.result(), at_once)
    assert 1 < len(at_once) < len(starts)  # the case merges some intervals and keeps gaps between others
    covered = np.zeros(100_100, dtype=bool)
    for s, e in zip(starts, ends):
        covered[s:e] = True
    assert int((at_once["end"] - at_once["start"]).sum()) == covered.sum()


@pytest.mark.parametrize("side", ["left", "right"])
def test_search_among_ordered_needles_answers_as_numpy_does(side):
    """search_ordered gallops from its last answer: needles in order, nearly in order, in no order, repeated,
    beyond either end, and an empty haystack must all get np.searchsorted's positions."""
    rng = np.random.default_rng(3)
    haystack = np.sort(rng.integers(0, 10_000, 2_000))  # with repeats
    ordered = np.sort(rng.integers(-50, 10_050, 3_000))
    cases = {
        "ordered": ordered,
        "nearly ordered": ordered + rng.integers(-40, 40, len(ordered)),
        "no order": rng.integers(-50, 10_050, 3_000),
        "descending": ordered[::-1].copy(),
        "values of the haystack": np.sort(rng.choice(haystack, 500)),
        "int32": ordered.astype(np.int32),
        "none": np.empty(0, np.int64),
    }
    for name, needles in cases.items():
        for hay in (haystack, haystack[:1], haystack[:0], np.full(9, 5_000)):
            expected = np.searchsorted(hay, needles, side=side)
            assert (intervals.search_ordered(hay, needles, side) == expected).all(), (name, len(hay))


@pytest.mark.parametrize("window, left_open", [(None, False), (1, False), (7, False), (7, True)])
def test_ranges_containing_calls_equal_a_brute_force_check(monkeypatch, window, left_open):
    """nvtx finds the ranges around each call by cutting each thread's timeline at range edges;
    calls that start or end exactly on an edge, overlapping (start/end) ranges and zero-length
    calls are the cases that cutting could get wrong; and, in windows of a few ranges, ranges
    carried over from one window to the next, calls asked about out of time order, and ranges
    left open to the capture's end (more carried than a window holds: the rest is one window)."""
    if window:
        monkeypatch.setattr(nvtx, "WINDOW_RANGES", window)
    rng = np.random.default_rng(3)
    ranges = pd.DataFrame({"start": rng.integers(0, 1_000, 300) // 10 * 10, "global_tid": rng.integers(1, 3, 300)})
    ranges["end"] = ranges["start"] + rng.integers(0, 30, 300) * 10
    if left_open:
        ranges.loc[::3, "end"] = 2_000
    ranges["name"] = [f"r{i}" for i in range(len(ranges))]  # each range a name of its own: the name says which
    events = EventStore.from_frames(nvtx=ranges.assign(style="PushPop", pid=0, tid=ranges["global_tid"]))
    calls = pd.DataFrame({"start": rng.integers(0, 1_300, 2_000) // 5 * 5, "global_tid": rng.integers(1, 4, 2_000)})
    calls["end"] = calls["start"] + rng.integers(0, 8, 2_000) * 5
    pairs = nvtx.enclosing_ranges(events, calls)
    column = lambda frame, name: frame[name].to_numpy()[:, None] if frame is calls else frame[name].to_numpy()[None, :]  # noqa: E731
    inside = (
        (column(calls, "global_tid") == column(ranges, "global_tid"))
        & (column(ranges, "start") <= column(calls, "start"))
        & (column(calls, "end") <= column(ranges, "end"))
    )
    expected = set(zip(*(axis.tolist() for axis in np.nonzero(inside))))  # RangeIndex: positions are labels
    assert set(zip(pairs["call"], pairs["name"])) == {(c, f"r{r}") for c, r in expected}
    assert len(expected) > 500
    innermost = nvtx.innermost_ranges(events, calls)
    around_call = {}
    for c, r in sorted(expected):
        around_call.setdefault(c, []).append(r)
    for call, chosen in innermost.items():
        around = ranges.loc[around_call[call]]  # identical ranges: the first name (the loaders' order) is inner
        best = around.sort_values(["start", "end", "name"], ascending=[False, True, True], kind="stable")
        assert chosen == best["name"].iloc[0]
    assert set(innermost.index) == {c for c, _ in expected}
    if left_open:  # each thread carries more ranges than a window starts: the rest is one window
        for thread in nvtx.thread_windows(events).values():
            walk = thread.walk()
            for window in range(len(thread.window_starts)):
                walk.ranges(window)
            assert walk._tail is not None


def test_windows_are_cut_where_a_window_of_ranges_has_started(monkeypatch):
    """nvtx.window_cuts starts a new window where WINDOW_RANGES ranges would have started in the last one; only
    a bucket of time in which more start than that (here 40 ranges at one time) makes a larger window."""
    monkeypatch.setattr(nvtx, "WINDOW_RANGES", 10)
    # 500 distinct points 2^16 ns apart, in under 2^29 ns: under WINDOW_BUCKETS (2^14) buckets of 2^15 ns or less,
    # no two share a bucket, so every window but the crowded one holds exactly WINDOW_RANGES
    assert nvtx.WINDOW_BUCKETS >= 1 << 14
    starts = np.sort(np.random.default_rng(8).choice(1 << 13, 500, replace=False)).astype("int64") << 16
    starts[100:140] = starts[100]
    ranges = pd.DataFrame({"start": starts, "end": starts + 5, "name": "r", "style": "PushPop"})
    events = EventStore.from_frames(nvtx=ranges.assign(global_tid=7, pid=0, tid=7))
    [thread] = nvtx.thread_windows(events).values()
    per_window = np.bincount(thread.window_of(starts))
    assert per_window.sum() == 500 and len(per_window) >= 46  # 460 ranges by 10, and the 40
    crowded = thread.window_of(starts[100:101])[0]
    assert per_window[crowded] >= 40 and (np.delete(per_window, crowded)[:-1] == 10).all()


def test_ranges_containing_calls_side_by_side(monkeypatch):
    """Analyses run side by side and share each NVTX table's windows: callers on four threads at once, each
    walking windows of 3 ranges, find what one caller alone finds."""
    monkeypatch.setattr(nvtx, "WINDOW_RANGES", 3)
    rng = np.random.default_rng(5)
    ranges = pd.DataFrame({"start": np.sort(rng.integers(0, 100_000, 3_000)), "global_tid": rng.integers(1, 3, 3_000)})
    ranges["end"] = ranges["start"] + rng.integers(0, 300, 3_000)
    ranges["name"] = [f"r{i}" for i in range(len(ranges))]
    events = EventStore.from_frames(nvtx=ranges.assign(style="PushPop", pid=0, tid=ranges["global_tid"]))
    calls = pd.DataFrame({"start": np.sort(rng.integers(0, 100_000, 4_000)), "global_tid": rng.integers(1, 3, 4_000)})
    calls["end"] = calls["start"] + rng.integers(0, 20, 4_000)
    alone = nvtx.innermost_ranges(events, calls)
    nvtx._last_windows.clear()  # the callers below make the windows again, side by side
    with ThreadPoolExecutor(4) as pool:
        found = list(pool.map(lambda _: nvtx.innermost_ranges(events, calls), range(16)))
    assert len(alone) > 1_000
    for each in found:
        pd.testing.assert_series_equal(each, alone)


def test_standard_deviation_is_exact_whatever_order_the_rows_come_in():
    """grouped_summary's stddev is the sample standard deviation of the exact variance (statistics.stdev on
    Fractions, to the last bit or one), the same for the rows in any order: DuckDB's stddev_samp differed in the 16th digit
    between a capture's SQLite and parquetdir exports, which store rows in different orders."""
    rng = np.random.default_rng(11)
    values = rng.integers(0, 10**10, 200_000)  # squares beyond 64 bits: up to 10 s in ns
    orders = [values, values[::-1].copy(), np.random.default_rng(3).permutation(values)]
    orders = [pd.DataFrame({"name": "one", "duration": each}) for each in orders]
    spreads = [
        grouped_summary(EventStore(on_disk=False), "rows", ["name"], rows=each)["stddev_ns"].iat[0] for each in orders
    ]
    exact = float(statistics.stdev([Fraction(int(v)) for v in values]))
    assert spreads[0] == spreads[1] == spreads[2] and abs(spreads[0] - exact) <= math.ulp(exact)
    one = grouped_summary(EventStore(on_disk=False), "rows", ["name"], rows=orders[0].iloc[:1])
    assert np.isnan(one["stddev_ns"].iat[0])


def test_summary_over_a_pandas_table_equals_pandas_own_groupby():
    """grouped_summary (the bounded median included) equals pandas' groupby on the same rows, for two text
    keys, each with missing values (a group of their own)."""
    rng = np.random.default_rng(5)
    n = 5_000
    names = pd.Categorical.from_codes(rng.integers(-1, 7, n), [f"range {i}" for i in range(9)])  # two unused
    styles = pd.Series(rng.choice(["PushPop", "StartEnd", None], n), dtype="object")
    rows = pd.DataFrame({"name": names, "style": styles, "duration": rng.integers(0, 10**9, n)})
    got = duration_summary(rows.astype({"name": object}), ["name", "style"])
    grouped = rows.groupby(["name", "style"], dropna=False, observed=True)["duration"]
    expected = grouped.agg(total_ns="sum", instances="count", med_ns="median", min_ns="min", max_ns="max")
    expected = expected.assign(stddev_ns=grouped.std().fillna(0).round(1)).reset_index()
    assert len(got) == len(expected) == 8 * 3
    assert got["name"].isna().any() and got["style"].isna().any()
    merged = got.astype({"name": object}).merge(expected.astype({"name": object}), on=["name", "style"])
    assert len(merged) == len(got)
    for column in ("total_ns", "instances", "min_ns", "max_ns"):
        assert (merged[f"{column}_x"] == merged[f"{column}_y"]).all(), column
    assert np.allclose(merged["med_ns_x"], merged["med_ns_y"].round(1), atol=0.051)
    assert np.allclose(merged["stddev_ns_x"], merged["stddev_ns_y"], atol=0.051)
