"""Per-step accounting (sftprof.analysis.accounting) on the committed H200 captures, each number checked
against the export's own rows (SQL and plain Python here, not sftprof's code), and on small tables built
here for the classes the captures do not hold.

What the captures hold (tests/fixtures/README.md), and so what is asserted:
- h200_tiny_llama_bf16: backward kernels are launched by the pt_autograd_0 thread, which has no NVTX
  range; by GPU time forward is well under backward. ~1,400 tiny kernels per step, SMs busy ~5%:
  launch/host-bound.
- h200_plant_cpu_starved: a 30 ms sleep in each data range; most SM idle time lies in them: data-bound.
- h200_plant_sync_memcpy: a synchronous cudaMemcpy of the logits per micro-step; the host waits ~55 ms
  in each while the copy runs and the SMs idle: sync-bound.
- h200_plant_device_sync: cudaDeviceSynchronize per micro-step, but the host is the slower side: the
  GPU has drained before the host syncs, the calls last ~35 µs, and the step is launch/host-bound
  (the data do not support sync-bound).
- h200_plant_gemm, h200_plant_elementwise: the kernel mixes are GEMM- and memory-dominated, but each
  micro-step first builds and pins a 64 MB random batch on the host (~130 ms of a ~280 ms step), so
  the SMs are busy 3-10% of the step: the steps are data-bound, not compute- or memory-bound. Those two
  classes are checked on built tables.
- h200_plant_pageable: copies from pageable memory run with no kernel beside them (copy-only time).
- h200_sft_*: sftprof's trainer on an 823M-parameter Llama (tests/fixtures/README.md). `clean` keeps
  the SMs over 90% busy (a GPU-side class); `data_stall` adds a 100 ms sleep per micro-batch in the
  data range: the SMs idle in it, the step is data-bound, and it is longer than clean's by about its
  SM idle time in data ranges; `padding_fixed` (short sequences) is launch/host-bound.
"""

from __future__ import annotations

import sqlite3
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import accounting
from sftprof.analysis.accounting import COLUMNS, PHASE_COLUMNS, run_bound, step_accounting
from sftprof.trace import load_trace
from sftprof.trace.events import EventStore
from sftprof.trace.tables import COLUMNS as TABLE_COLUMNS
from sftprof.trace.tables import TraceTables

from conftest import TRAINING_TID, merged, nvtx_range

FIXTURES = Path(__file__).parent / "fixtures"
CAPTURES = (
    "h200_tiny_llama_bf16",
    "h200_plant_clean",
    "h200_plant_cpu_starved",
    "h200_plant_sync_memcpy",
    "h200_plant_device_sync",
    "h200_plant_gemm",
    "h200_plant_elementwise",
    "h200_plant_pageable",
    "h200_sft_clean",
    "h200_sft_data_stall",
    "h200_sft_padding_fixed",
)
PHASES = ("data", "forward", "backward", "optimizer")


@cache
def accounted(capture: str) -> pd.DataFrame:
    return step_accounting(load_trace(FIXTURES / f"{capture}.sqlite")).set_index("step")


def query(capture: str, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{FIXTURES / capture}.sqlite?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


# ranges on the thread that has the step ranges, with their text whichever column holds it
RANGES = """
    WITH named AS (SELECT n.start, n."end", coalesce(s.value, n.text) AS name, n.globalTid AS tid
                   FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60)),
         main AS (SELECT tid FROM named WHERE name LIKE 'step %' LIMIT 1),
         ranges AS (SELECT * FROM named WHERE tid = (SELECT tid FROM main))"""


def steps_of(capture: str) -> dict[int, tuple[int, int]]:
    rows = query(capture, RANGES + " SELECT name, start, \"end\" FROM ranges WHERE name LIKE 'step %'")
    return {int(name.split()[1]): (start, end) for name, start, end in rows}


def overlap(intervals_, start: int, end: int) -> int:
    return sum(max(0, min(e, end) - max(s, start)) for s, e in intervals_)


def kernels_of(capture: str) -> list[list[int]]:
    return merged(query(capture, 'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 0'))


def copies_of(capture: str) -> list[list[int]]:
    return merged(
        query(
            capture,
            'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = 0 UNION ALL '
            'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = 0',
        )
    )


def calls_named(capture: str, like: str) -> list[tuple[int, int]]:
    return query(
        capture,
        f"""SELECT r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s
                              ON s.id = r.nameId WHERE s.value LIKE '{like}'""",
    )


# ---------------------------------------------------------------- the real captures


def test_phase_time_is_placed_by_the_launch_on_the_training_threads_ranges():
    """Every kernel's time in the step and phase open on the training thread when its launching call
    started, whichever thread launched it: an SQL join on the export gives the same sums."""
    capture = "h200_tiny_llama_bf16"
    expected = query(
        capture,
        RANGES
        + """,
        launched AS (SELECT k."end" - k.start AS ns, r.start AS t FROM CUPTI_ACTIVITY_KIND_KERNEL k
                     JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
                      AND ((r.globalTid >> 24) & 16777215) = ((k.globalPid >> 24) & 16777215))
        SELECT st.name, coalesce(ph.name, 'other'), sum(ns) FROM launched l
        JOIN ranges st ON st.name LIKE 'step %' AND st.start <= l.t AND l.t < st."end"
        LEFT JOIN ranges ph ON ph.name IN ('data', 'forward', 'backward', 'optimizer')
             AND ph.start <= l.t AND l.t < ph."end"
        GROUP BY 1, 2""",
    )
    table = accounted(capture)
    got = {
        (f"step {step}", column.removesuffix("_gpu_ns")): value
        for step, row in table[PHASE_COLUMNS].iterrows()
        for column, value in row.items()
        if value
    }
    assert got == {(step, phase): ns for step, phase, ns in expected}
    assert len(table) == 3


def test_backward_kernels_of_the_autograd_thread_count_as_backward():
    capture = "h200_tiny_llama_bf16"
    [(autograd_ns,)] = query(
        capture,
        """
        SELECT sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
        JOIN ThreadNames t ON t.globalTid = r.globalTid JOIN StringIds s ON s.id = t.nameId
        WHERE s.value = 'pt_autograd_0'""",
    )
    [(autograd_ranges,)] = query(
        capture,
        """SELECT count(*) FROM NVTX_EVENTS n JOIN ThreadNames t
        ON t.globalTid = n.globalTid JOIN StringIds s ON s.id = t.nameId WHERE s.value = 'pt_autograd_0'""",
    )
    assert autograd_ranges == 0 and autograd_ns > 0  # the thread launches kernels and has no range
    table = accounted(capture)
    # the three captured steps hold nearly all autograd kernels (the rest ran outside the steps)
    assert 0.9 * autograd_ns < table["backward_gpu_ns"].sum()
    assert (table["other_gpu_ns"] < 0.01 * table["kernel_ns"]).all()  # not "outside every range"
    assert (table["forward_gpu_ns"] < 0.7 * table["backward_gpu_ns"]).all()


@pytest.mark.parametrize("capture", CAPTURES)
def test_sums_add_up(capture):
    table = accounted(capture)
    assert list(table.reset_index().columns) == COLUMNS
    assert (table[PHASE_COLUMNS].sum(axis=1) == table["kernel_ns"]).all()
    assert (table["sm_busy_ns"] + table["copy_only_ns"] + table["idle_ns"] == table["duration"]).all()
    assert (
        table["sm_idle_sync_ns"] + table["sm_idle_data_ns"] + table["sm_idle_host_ns"]
        == table["duration"] - table["sm_busy_ns"]
    ).all()
    numbers = table.select_dtypes("number")
    assert (numbers >= 0).all().all()
    assert (table["copy_only_ns"] <= table["copy_busy_ns"]).all() and (
        table["short_gap_idle_ns"] <= table["duration"] - table["sm_busy_ns"]
    ).all()
    assert table["sm_busy_pct"].between(0, 100).all() and table["idle_pct"].between(0, 100).all()
    assert table["bound_class"].isin(accounting.BOUND_CLASSES).all()
    assert (table["device_id"] == 0).all()


@pytest.mark.ci_sample(4)
@pytest.mark.parametrize("capture", CAPTURES)
def test_busy_time_equals_the_union_of_the_exports_rows(capture):
    kernels, copies = kernels_of(capture), copies_of(capture)
    table = accounted(capture)
    for step, (start, end) in steps_of(capture).items():
        sm = overlap(kernels, start, end)
        copy = overlap(copies, start, end)
        copy_only = copy - sum(overlap(kernels, max(s, start), min(e, end)) for s, e in copies if s < end and e > start)
        assert (table.at[step, "sm_busy_ns"], table.at[step, "copy_busy_ns"], table.at[step, "copy_only_ns"]) == (
            sm,
            copy,
            copy_only,
        ), capture
        # every kernel launched in the step: the SQL count of launches whose call starts in it
        [(launched,)] = query(
            capture,
            f"""SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            WHERE r.start >= {start} AND r.start < {end}""",
        )
        assert table.at[step, "kernels"] == launched


def test_a_cpu_starved_step_is_data_bound():
    capture = "h200_plant_cpu_starved"
    kernels, table = kernels_of(capture), accounted(capture)
    data = query(capture, RANGES + " SELECT start, \"end\" FROM ranges WHERE name = 'data'")
    assert not calls_named(capture, "cudaDeviceSynchronize%") and not calls_named(capture, "cudaMemcpy_v%")
    for step, (start, end) in steps_of(capture).items():
        inside = [(max(s, start), min(e, end)) for s, e in data if s < end and e > start]
        idle_in_data = sum(e - s - overlap(kernels, s, e) for s, e in inside)
        assert sum(e - s for s, e in inside) >= 60_000_000  # two 30 ms sleeps
        row = table.loc[step]
        # no host-sync call in the capture at all: the SM idle time in data ranges is all data's
        assert row["sm_idle_data_ns"] == idle_in_data
        assert row["sm_idle_data_ns"] > 0.5 * (row["duration"] - row["sm_busy_ns"])
        assert row["bound_class"] == "data-bound" and "inside data ranges" in row["evidence"]
    assert run_bound(table.reset_index())["bound_class"] == "data-bound"


def test_a_synchronous_copy_per_micro_step_is_sync_bound():
    capture = "h200_plant_sync_memcpy"
    kernels, table = kernels_of(capture), accounted(capture)
    memcpys = calls_named(capture, "cudaMemcpy_v%")
    for step, (start, end) in steps_of(capture).items():
        calls = [(s, e) for s, e in memcpys if start <= s < end]
        assert len(calls) == 2  # one per micro-step
        idle_in_calls = sum(e - s - overlap(kernels, s, e) for s, e in calls)
        row = table.loc[step]
        assert row["sm_idle_sync_ns"] >= idle_in_calls > 0.5 * (row["duration"] - row["sm_busy_ns"])
        assert row["bound_class"] == "sync-bound"


def test_syncs_after_the_gpu_has_drained_cost_nothing():
    capture = "h200_plant_device_sync"
    table = accounted(capture)
    syncs = calls_named(capture, "cudaDeviceSynchronize%")
    for step, (start, end) in steps_of(capture).items():
        calls = [(s, e) for s, e in syncs if start <= s < end]
        assert len(calls) >= 2 and sum(e - s for s, e in calls) < 0.01 * (end - start)
        row = table.loc[step]
        assert row["sm_idle_sync_ns"] < 0.01 * row["duration"]
        assert row["bound_class"] == "launch/host-bound"


@pytest.mark.parametrize(
    "capture, dominant, markers",
    [
        ("h200_plant_gemm", "compute_kernel_ns", ("nvjet%", "%gemm%", "%cutlass%")),
        ("h200_plant_elementwise", "memory_kernel_ns", ("%elementwise%", "%multi_tensor%", "%reduce%")),
    ],
)
def test_the_kernel_mix_is_the_models_but_the_host_batch_bounds_the_step(capture, dominant, markers):
    table, kernels = accounted(capture), kernels_of(capture)
    data = query(capture, RANGES + " SELECT start, \"end\" FROM ranges WHERE name = 'data'")
    marked = " OR ".join(f"s.value LIKE '{m}'" for m in markers)
    for step, (start, end) in steps_of(capture).items():
        [(marked_ns, all_ns)] = query(
            capture,
            f"""
            SELECT sum(CASE WHEN {marked} THEN k."end" - k.start ELSE 0 END), sum(k."end" - k.start)
            FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
            WHERE r.start >= {start} AND r.start < {end}""",
        )
        row = table.loc[step]
        assert row["kernel_ns"] == all_ns and marked_ns > 0.6 * all_ns and row[dominant] >= marked_ns
        # the data ranges hold 90% of the step, and the SMs are busy under 10% of it
        assert sum(min(e, end) - max(s, start) for s, e in data if s < end and e > start) > 0.9 * (end - start)
        assert overlap(kernels, start, end) < 0.1 * (end - start)
        assert row["bound_class"] == "data-bound"


def test_copies_from_pageable_memory_are_copy_only_time():
    table = accounted("h200_plant_pageable")
    [(pageable,)] = query(
        "h200_plant_pageable", "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 AND srcKind = 0"
    )
    assert pageable >= 4
    assert (table["copy_only_ns"] > 0).all() and (table["copy_only_ns"] == table["copy_busy_ns"]).all()


def test_a_sleep_in_the_data_range_of_the_trainer_is_data_bound():
    stall, clean = accounted("h200_sft_data_stall"), accounted("h200_sft_clean")
    kernels = kernels_of("h200_sft_data_stall")
    data = query("h200_sft_data_stall", RANGES + " SELECT start, \"end\" FROM ranges WHERE name = 'data'")
    for step, (start, end) in steps_of("h200_sft_data_stall").items():
        inside = [(max(s, start), min(e, end)) for s, e in data if s < end and e > start]
        assert sum(e - s for s, e in inside) >= 200 * MS  # 2 micro-batches x 100 ms
        row = stall.loc[step]
        assert row["sm_idle_data_ns"] == sum(e - s - overlap(kernels, s, e) for s, e in inside)
        assert overlap(kernels, start, end) < 0.8 * (end - start) and row["bound_class"] == "data-bound"
    # same model, data and settings as clean: the same kernel time; the extra step time is the stall
    for (_, slow), (_, fast) in zip(stall.iterrows(), clean.iterrows()):
        assert abs(slow["kernel_ns"] - fast["kernel_ns"]) < 0.01 * fast["kernel_ns"]
        extra, stalled = slow["duration"] - fast["duration"], slow["sm_idle_data_ns"] - fast["sm_idle_data_ns"]
        assert abs(extra - stalled) < 0.05 * extra


def test_a_well_fed_trainer_is_bound_by_its_kernels_and_short_sequences_by_the_host():
    clean, kernels = accounted("h200_sft_clean"), kernels_of("h200_sft_clean")
    for step, (start, end) in steps_of("h200_sft_clean").items():
        assert overlap(kernels, start, end) >= 0.8 * (end - start)
        assert clean.at[step, "bound_class"] in ("compute-bound", "memory-bound kernels")
    short, kernels = accounted("h200_sft_padding_fixed"), kernels_of("h200_sft_padding_fixed")
    for step, (start, end) in steps_of("h200_sft_padding_fixed").items():
        assert overlap(kernels, start, end) < 0.4 * (end - start)
        row = short.loc[step]
        assert row["bound_class"] == "launch/host-bound"
        assert row["short_gap_idle_ns"] > 0.8 * (row["duration"] - row["sm_busy_ns"])


def test_cpu_captures_have_steps_without_a_class():
    table = step_accounting(load_trace(FIXTURES / "cpu_tiny_llama.pt.trace.json.gz"))
    assert len(table) == 3 and table["device_id"].isna().all() and table["bound_class"].isna().all()
    assert (table["idle_ns"] == table["duration"]).all() and (table["kernel_ns"] == 0).all()
    assert run_bound(table)["bound_class"] is None


def test_a_kineto_gpu_trace_accounts_like_the_nsys_capture_of_the_same_loop():
    kineto = step_accounting(load_trace(FIXTURES / "h200_plant_clean.pt.trace.json.gz")).set_index("step")
    nsys = accounted("h200_plant_clean")
    assert list(kineto.index) == list(nsys.index) == [3, 4]
    assert (kineto["kernels"] == nsys["kernels"]).all()
    for column in ("forward_gpu_ns", "backward_gpu_ns", "optimizer_gpu_ns"):
        assert (abs(kineto[column] - nsys[column]) < 0.02 * nsys[column]).all(), column


# ---------------------------------------------------------------- built tables: every class

MAIN, AUTOGRAD = TRAINING_TID, (7 << 24) | 9  # pid 7: the training thread and an autograd thread
MS = 1_000_000


def _frame(table: str, rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{c: row.get(c) for c in TABLE_COLUMNS[table]} for row in rows], columns=TABLE_COLUMNS[table])


class Trace:
    """A capture built kernel by kernel: each kernel gets its launching call on `tid` at `launch`."""

    def __init__(self):
        self.ranges, self.kernels, self.calls, self.memops = [], [], [], []

    def step(self, number: int, start: int, end: int, phases=()):
        self.ranges.append(nvtx_range(f"step {number}", start, end))
        self.ranges += [nvtx_range(name, s, e) for name, s, e in phases]

    def kernel(self, name: str, start: int, end: int, launch: int | None, tid: int = MAIN, device: int = 0):
        correlation = len(self.kernels) + 1
        self.kernels.append(
            {
                "start": start,
                "end": end,
                "duration": end - start,
                "name": name,
                "short_name": name,
                "device_id": device,
                "stream_id": 7,
                "pid": 7,
                "correlation_id": correlation if launch is not None else None,
            }
        )
        if launch is not None:
            self.call("cudaLaunchKernel", launch, launch + 1000, tid, correlation)

    def call(self, name: str, start: int, end: int, tid: int = MAIN, correlation: int | None = None):
        self.calls.append(
            {
                "start": start,
                "end": end,
                "duration": end - start,
                "name": name,
                "global_tid": tid,
                "pid": tid >> 24,
                "tid": tid & 0xFFFFFF,
                "correlation_id": correlation or 10**6 + len(self.calls),
            }
        )

    def tables(self) -> TraceTables:
        events = EventStore.from_frames(
            kernels=pd.DataFrame(self.kernels) if self.kernels else None,
            cuda_api=pd.DataFrame(self.calls) if self.calls else None,
            nvtx=_frame("nvtx", self.ranges),
            memops=_frame("memops", self.memops),
        )
        return TraceTables(source_path="built", span_ns=10**9, sources={"cuda", "nvtx"}, events=events)

    def account(self) -> pd.DataFrame:
        return step_accounting(self.tables()).set_index("step")


PHASED = (
    ("data", 0, 10 * MS),
    ("forward", 10 * MS, 40 * MS),
    ("backward", 40 * MS, 90 * MS),
    ("optimizer", 90 * MS, 100 * MS),
)


def test_a_step_of_long_gemms_is_compute_bound_and_phases_follow_launches():
    trace = Trace()
    trace.step(0, 0, 100 * MS, PHASED)
    trace.kernel("ampere_bf16_gemm", 11 * MS, 40 * MS, launch=10 * MS + 500_000)  # forward, main thread
    trace.kernel("ampere_bf16_gemm", 40 * MS, 88 * MS, launch=41 * MS, tid=AUTOGRAD)  # backward, by time
    trace.kernel("vectorized_elementwise_kernel", 90 * MS, 99 * MS, launch=None)  # no launch: by its start
    trace.kernel("ampere_bf16_gemm", 100 * MS, 101 * MS, launch=100 * MS + 5)  # launched after the step
    row = trace.account().loc[0]
    assert (
        row["data_gpu_ns"],
        row["forward_gpu_ns"],
        row["backward_gpu_ns"],
        row["optimizer_gpu_ns"],
        row["other_gpu_ns"],
    ) == (0, 29 * MS, 48 * MS, 9 * MS, 0)
    assert row["kernel_ns"] == 86 * MS and row["kernels"] == 3
    assert (row["compute_kernel_ns"], row["memory_kernel_ns"]) == (77 * MS, 9 * MS)
    assert row["sm_busy_ns"] == 86 * MS and row["idle_ns"] == 14 * MS
    # idle: 0-10 in data, 10-11 and 88-90 and 99-100 while the host launched
    assert (row["sm_idle_data_ns"], row["sm_idle_host_ns"], row["sm_idle_sync_ns"]) == (10 * MS, 4 * MS, 0)
    assert row["bound_class"] == "compute-bound" and "SMs busy 86.0%" in row["evidence"]


def test_a_step_of_streaming_kernels_is_memory_bound():
    trace = Trace()
    trace.step(0, 0, 100 * MS, PHASED)
    trace.kernel("vectorized_elementwise_kernel", 10 * MS, 80 * MS, launch=10 * MS)
    trace.kernel("ampere_bf16_gemm", 80 * MS, 92 * MS, launch=41 * MS)
    row = trace.account().loc[0]
    assert row["bound_class"] == "memory-bound kernels" and row["sm_busy_ns"] == 82 * MS


def test_below_the_gpu_bound_line_the_largest_idle_cause_names_the_step():
    """SMs busy 70%: a GPU-bound step by the capture-wide 50% line, but 25% of it waits for data."""
    trace = Trace()
    trace.step(0, 0, 100 * MS, (("data", 0, 25 * MS), ("forward", 25 * MS, 100 * MS)))
    trace.kernel("ampere_bf16_gemm", 25 * MS, 95 * MS, launch=25 * MS)
    row = trace.account().loc[0]
    assert (row["sm_idle_data_ns"], row["sm_idle_host_ns"]) == (25 * MS, 5 * MS)
    assert row["bound_class"] == "data-bound" and "< 80%" in row["evidence"]


def test_exposed_nccl_time_makes_a_step_communication_bound():
    trace = Trace()
    trace.step(0, 0, 100 * MS, PHASED)
    trace.kernel("ampere_bf16_gemm", 10 * MS, 60 * MS, launch=10 * MS)
    trace.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 50 * MS, 90 * MS, launch=45 * MS, tid=AUTOGRAD)
    row = trace.account().loc[0]
    # NCCL runs 50-90 ms; 50-60 beside the GEMM: 30 ms exposed
    assert row["comm_exposed_ns"] == 30 * MS and row["comm_kernel_ns"] == 40 * MS
    assert row["bound_class"] == "communication-bound" and row["sm_busy_ns"] == 80 * MS


def test_idle_after_a_sync_that_drained_the_gpu_is_sync_time_unless_the_host_loads_data():
    trace = Trace()
    trace.step(
        0,
        0,
        100 * MS,
        (
            ("data", 0, 10 * MS),
            ("forward", 10 * MS, 50 * MS),
            ("data", 50 * MS, 60 * MS),
            ("forward", 60 * MS, 100 * MS),
        ),
    )
    trace.kernel("ampere_bf16_gemm", 10 * MS, 30 * MS, launch=10 * MS)
    trace.call("cudaStreamSynchronize", 11 * MS, 31 * MS)  # the GPU drains at 30 ms, inside the wait
    trace.kernel("ampere_bf16_gemm", 75 * MS, 80 * MS, launch=74 * MS)
    trace.call("cudaStreamSynchronize", 85 * MS, 95 * MS)  # the SMs already idle: only the wait counts
    row = trace.account().loc[0]
    # the gap 30-75 began inside the first wait: all of it but its 10 ms in data (50-60); the second
    # wait 85-95: its 10 ms
    assert row["sm_idle_sync_ns"] == 45 * MS
    # data: 0-10 and 50-60; host: 80-85 and 95-100
    assert (row["sm_idle_data_ns"], row["sm_idle_host_ns"]) == (20 * MS, 10 * MS)
    assert row["bound_class"] == "sync-bound"


def test_idle_inside_data_ranges_is_data_time_and_launch_gaps_are_host_time():
    trace = Trace()
    trace.step(0, 0, 100 * MS, (("data", 0, 60 * MS), ("forward", 60 * MS, 100 * MS)))
    trace.kernel("vectorized_elementwise_kernel", 5 * MS, 10 * MS, launch=1 * MS)
    for k in range(10):  # tiny kernels 20 µs apart
        start = 60 * MS + k * 30_000
        trace.kernel("vectorized_elementwise_kernel", start, start + 5_000, launch=start - 2_000)
    row = trace.account().loc[0]
    assert row["sm_idle_data_ns"] == 55 * MS and row["tiny_kernels"] == 10 and row["kernels"] == 11
    assert row["short_gap_idle_ns"] == 9 * 25_000
    assert row["bound_class"] == "data-bound"


def test_the_busiest_device_is_measured_and_copies_alone_are_copy_only():
    trace = Trace()
    trace.step(0, 0, 100 * MS, PHASED)
    trace.kernel("ampere_bf16_gemm", 10 * MS, 20 * MS, launch=10 * MS, device=0)
    trace.kernel("ampere_bf16_gemm", 10 * MS, 70 * MS, launch=10 * MS, device=1)
    trace.memops = [
        {
            "start": 65 * MS,
            "end": 80 * MS,
            "duration": 15 * MS,
            "operation": "[CUDA memcpy HtoD]",
            "bytes": 1,
            "device_id": 1,
            "stream_id": 8,
            "pid": 7,
            "correlation_id": None,
        }
    ]
    row = trace.account().loc[0]
    assert row["device_id"] == 1 and row["sm_busy_ns"] == 60 * MS
    assert (row["copy_busy_ns"], row["copy_only_ns"], row["idle_ns"]) == (15 * MS, 10 * MS, 30 * MS)
    assert row["kernel_ns"] == 70 * MS  # kernels of every device


def test_run_bound_weighs_steps_by_time():
    table = pd.DataFrame(
        {
            "duration": [100, 10, 10],
            "bound_class": ["data-bound", "compute-bound", "compute-bound"],
            "sm_busy_ns": [10, 10, 10],
            "copy_busy_ns": [0, 0, 12],
            "idle_ns": [90, 0, 0],
        }
    )
    result = run_bound(table)
    assert result["bound_class"] == "data-bound" and result["steps"] == 3
    assert result["class_pct"] == pytest.approx({"data-bound": 100 * 100 / 120, "compute-bound": 100 * 20 / 120})
    assert (result["sm_busy_pct"], result["copy_busy_pct"], result["idle_pct"]) == pytest.approx((25.0, 10.0, 75.0))
    assert run_bound(pd.DataFrame(columns=COLUMNS))["bound_class"] is None


def test_no_steps_no_rows():
    trace = Trace()
    trace.kernel("ampere_bf16_gemm", 10, 20, launch=5)
    assert step_accounting(trace.tables()).empty and list(step_accounting(trace.tables()).columns) == COLUMNS


def test_large_slices_give_the_same_numbers(monkeypatch):
    """The slicing of kernels (by correlation id) and of busy windows (by start) changes nothing."""
    tables = load_trace(FIXTURES / "h200_tiny_llama_bf16.sqlite")
    whole = step_accounting(tables)
    from sftprof.analysis import gpu, nvtx

    monkeypatch.setattr(nvtx, "SLICE_KERNELS", 97)
    monkeypatch.setattr(gpu, "BUSY_WINDOW_ROWS", 101)
    sliced = step_accounting(tables)
    pd.testing.assert_frame_equal(whole, sliced)
    assert np.array_equal(whole["sm_busy_ns"], sliced["sm_busy_ns"])
