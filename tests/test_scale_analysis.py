"""The large-trace paths give what the plain computations give: one busy pass for three unions and the
timeline's counts, one launch join for the NVTX projection and the per-step accounting, windowed
elementwise chains, unions written in place, and the loader's labels read as codes.

Each is checked against a direct computation on small or random traces, with windows and slices made
tiny so that every edge between them is crossed (benchmarks/ENGINE.md has the measurements behind
these paths)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import (
    accounting,
    cpu,
    cuda,
    gains,
    gpu,
    intervals,
    memory,
    nvtx,
    spilled,
    stats,
    utilisation,
)
from sftprof.analysis import (
    kernels as kernel_kinds,
)
from sftprof.trace import events as events_module
from sftprof.trace import load_trace
from sftprof.trace.events import EventStore
from sftprof.trace.tables import COLUMNS, TraceTables

FIXTURES = Path(__file__).parent / "fixtures"
MAIN, AUTOGRAD, OTHER_PROCESS = (7 << 24) | 7, (7 << 24) | 9, (8 << 24) | 8
NAMES = [
    "vectorized_elementwise_kernel",
    "ampere_bf16_gemm",
    "unrolled_elementwise_kernel",
    "reduce_kernel",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
]


def _frame(table: str, rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{c: row.get(c) for c in COLUMNS[table]} for row in rows], columns=COLUMNS[table])


def random_trace(
    seed: int = 5, n: int = 6_000, devices=(0, 1), streams=(7, 8, 13), memops: int = 300, steps: int = 12
) -> TraceTables:
    """Kernels on several devices and streams (overlapping, some NCCL, some ties), launched from two
    threads of one process and one of another, some without a traced launch; memory operations;
    step and phase ranges on the main thread."""
    rng = np.random.default_rng(seed)
    span = 1_000_000
    starts = rng.integers(1, span, n)
    kernels = pd.DataFrame(
        {
            "start": starts,
            "end": starts + rng.integers(0, 400, n),
            "name": rng.choice(NAMES, n, p=[0.35, 0.25, 0.2, 0.1, 0.1]),
            "device_id": rng.choice(devices, n),
            "stream_id": rng.choice(streams, n),
            "pid": 7,
            "correlation_id": np.arange(1, n + 1) * 3,
        }
    )
    kernels["short_name"] = kernels["name"]
    kernels.loc[rng.random(n) < 0.05, "correlation_id"] = None  # launch not traced
    kernels["duration"] = kernels["end"] - kernels["start"]
    tids = rng.choice([MAIN, AUTOGRAD, OTHER_PROCESS], n, p=[0.6, 0.3, 0.1])
    launch = np.maximum(kernels["start"].to_numpy() - rng.integers(0, 2_000, n), 0)
    launched = kernels["correlation_id"].notna().to_numpy()
    calls = pd.DataFrame(
        {
            "start": launch[launched],
            "end": launch[launched] + 500,
            "name": "cudaLaunchKernel",
            "global_tid": tids[launched],
            "correlation_id": kernels["correlation_id"][launched],
        }
    )
    calls["pid"], calls["tid"] = tids[launched] >> 24, tids[launched] & 0xFFFFFF
    calls["duration"] = calls["end"] - calls["start"]
    kernels.loc[tids == OTHER_PROCESS, "pid"] = 8
    syncs = pd.DataFrame(
        {
            "start": rng.integers(0, span, 40),
            "name": "cudaStreamSynchronize",
            "global_tid": MAIN,
            "pid": 7,
            "tid": 7,
            "correlation_id": 10**7 + np.arange(40),
        }
    )
    syncs["end"] = syncs["start"] + rng.integers(0, 20_000, 40)
    syncs["duration"] = syncs["end"] - syncs["start"]
    ranges = []
    edges = np.linspace(0, span, steps + 1).astype("int64")
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        ranges.append({"name": f"step {i}", "start": lo, "end": hi})
        cut = np.linspace(lo, hi, 5).astype("int64")
        ranges += [
            {"name": phase, "start": a, "end": b} for phase, a, b in zip(cpu.PHASES, cut[:-1], cut[1:], strict=True)
        ]
    nvtx_rows = [
        {**r, "duration": r["end"] - r["start"], "style": "PushPop", "global_tid": MAIN, "pid": 7, "tid": 7}
        for r in ranges
    ]
    op_starts = rng.integers(1, span, memops)
    ops = [
        {
            "start": s,
            "end": s + int(d),
            "duration": int(d),
            "operation": "[CUDA memcpy HtoD]",
            "bytes": 64,
            "device_id": int(dev),
            "stream_id": 9,
            "pid": 7,
            "correlation_id": None,
            "copy_kind": "HtoD",
        }
        for s, d, dev in zip(op_starts, rng.integers(0, 3_000, memops), rng.choice(devices, memops), strict=True)
    ]
    events = EventStore.from_frames(
        kernels=kernels,
        cuda_api=pd.concat([calls, syncs], ignore_index=True),
        nvtx=_frame("nvtx", nvtx_rows),
        memops=_frame("memops", ops),
    )
    return TraceTables(source_path="random", span_ns=span, sources={"cuda", "nvtx"}, events=events)


@pytest.fixture(params=[None, 97], ids=["whole", "tiny windows"])
def windows(request, monkeypatch):
    """Run a test with the default windows and slices, and with ones a few dozen rows long (NVTX windows: 5 ranges)."""
    if request.param:
        monkeypatch.setattr(gpu, "BUSY_WINDOW_ROWS", request.param)
        monkeypatch.setattr(gains, "CHAIN_WINDOW_ROWS", request.param)
        monkeypatch.setattr(nvtx, "SLICE_KERNELS", request.param)
        monkeypatch.setattr(nvtx, "WINDOW_RANGES", 5)
    return request.param


# ---------------------------------------------------------------- unions


def test_running_union_in_place_equals_the_union_at_once():
    rng = np.random.default_rng(11)
    for overlap in (5, 60, 5_000):  # mostly apart, some merged, nearly all merged
        starts = np.sort(rng.integers(0, 200_000, 4_000))
        ends = starts + rng.integers(0, overlap, len(starts))
        at_once = intervals.union(pd.DataFrame({"start": starts, "end": ends}))
        for batch in (1, 7, 999, 4_000):
            running = intervals.RunningUnion()
            for lo in range(0, len(starts), batch):
                running.add(starts[lo : lo + batch], ends[lo : lo + batch])
            pd.testing.assert_frame_equal(running.result(), at_once)


def test_covered_ns_counts_every_window_exactly():
    rng = np.random.default_rng(3)
    starts = np.sort(rng.integers(0, 10_000, 300))
    merged = intervals.union(pd.DataFrame({"start": starts, "end": starts + rng.integers(0, 40, 300)}))
    timeline = np.zeros(10_100, dtype=bool)
    for s, e in zip(merged["start"], merged["end"], strict=True):
        timeline[s:e] = True
    lo = rng.integers(0, 10_000, 500)
    hi = lo + rng.integers(0, 500, 500)
    expected = [int(timeline[a:b].sum()) for a, b in zip(lo, hi, strict=True)]
    assert intervals.covered_ns(merged, lo, hi).tolist() == expected


def test_one_busy_pass_gives_the_three_unions_and_the_timeline_counts(windows):
    tables = random_trace()
    events, memops = tables.events, tables.memops
    kernels = tables.kernels
    kernels = kernels[kernels["start"] > 0]
    comm = kernels["name"].str.contains("nccl")
    unions = gpu.busy_unions(events)
    for device in (0, 1):
        mine, ops = kernels[kernels["device_id"] == device], memops[memops["device_id"] == device]
        expected = {
            "operations": pd.concat([mine[["start", "end"]], ops[["start", "end"]]]),
            "kernels": mine[["start", "end"]],
            "not_communication": mine.loc[~comm, ["start", "end"]],
        }
        for name, rows in expected.items():
            busy = getattr(unions, name)[device]
            union = busy.union if name == "kernels" else busy.merged
            pd.testing.assert_frame_equal(union.frame(), intervals.union(rows.astype("int64")))
    assert unions.operations[0].last == max(
        kernels.loc[kernels["device_id"] == 0, "end"].max(), memops.loc[memops["device_id"] == 0, "end"].max()
    )
    # the counts the pass kept are the timeline's query
    counted = utilisation.utilisation_timeline(events, unions.operations)
    queried = utilisation.utilisation_timeline(
        events, {d: gpu.DeviceBusy(b.merged, b.first, b.last) for d, b in unions.operations.items()}
    )
    pd.testing.assert_frame_equal(counted, queried)
    assert counted["kernels"].sum() == len(kernels)


def test_without_collectives_there_is_no_third_union_and_without_copies_two_are_one():
    tables = random_trace(devices=(0,))
    names = tables.kernels["name"]
    assert names.str.contains("nccl").any()
    plain = EventStore.from_frames(kernels=tables.kernels[~names.str.contains("nccl")])
    unions = gpu.busy_unions(plain)
    assert unions.not_communication is None
    assert unions.kernels[0].union is unions.operations[0].merged
    assert list(gpu.busy_by_device(tables.events)) == list(unions.operations)
    without_copies = gpu.busy_unions(tables.events, memops=False)  # the trace's kernels, collectives among them
    assert without_copies.kernels[0].union is without_copies.operations[0].merged


# ---------------------------------------------------------------- the launch join, shared


def test_launch_slices_match_kernels_to_their_calls_as_a_join_does(windows):
    tables = random_trace()
    events = tables.events
    kernels, calls = tables.kernels, tables.cuda_api
    joined = kernels.merge(
        calls[["pid", "correlation_id", "global_tid", "start", "end"]],
        how="left",
        on=["pid", "correlation_id"],
        suffixes=("", "_call"),
    )
    expected = pd.DataFrame(
        {
            "launch_tid": joined["global_tid"].fillna(-1).astype("int64"),
            "launch_start": joined["start_call"].fillna(joined["start"]).astype("int64"),
            "start": joined["start"],
            "duration": joined["duration"],
        }
    )
    found = pd.concat([pd.DataFrame({c: s[c] for c in expected.columns}) for s in nvtx.launch_slices(events)])
    key = list(expected.columns)
    pd.testing.assert_frame_equal(
        found.sort_values(key, ignore_index=True), expected.sort_values(key, ignore_index=True), check_dtype=False
    )


def test_a_call_that_repeats_a_key_is_joined_duplicates_and_all():
    """A damaged export whose calls repeat a (pid, correlation id): each kernel meets both, as SQL's join does."""
    kernels = pd.DataFrame(
        {
            "start": [10, 20],
            "end": [15, 25],
            "name": "k",
            "short_name": "k",
            "device_id": 0,
            "stream_id": 7,
            "pid": 7,
            "correlation_id": [1, 2],
        }
    )
    calls = pd.DataFrame(
        {
            "start": [1, 2, 3],
            "end": [4, 5, 6],
            "name": "cudaLaunchKernel",
            "global_tid": MAIN,
            "correlation_id": [1, 1, 2],
        }
    )
    [found] = list(nvtx.launch_slices(EventStore.from_frames(kernels=kernels, cuda_api=calls)))
    assert sorted(zip(found["start"].tolist(), found["launch_start"].tolist(), strict=True)) == [
        (10, 1),
        (10, 2),
        (20, 3),
    ]


@pytest.mark.parametrize(
    "capture", ["h200_tiny_llama_bf16.sqlite", "h200_sft_clean.sqlite", "h200_plant_device_sync.sqlite"]
)
def test_accounting_fed_by_the_projection_and_the_busy_pass_equals_its_own(capture):
    tables = load_trace(FIXTURES / capture).with_all_columns()
    _shared_equals_own(tables)


def test_accounting_shared_equals_own_on_several_devices_with_collectives(windows):
    tables = random_trace()
    own = _shared_equals_own(tables)
    # SM-busy and exposed NCCL time, each step on its device, straight from the kernels
    kernels = tables.kernels
    for device, rows in own.groupby("device_id"):
        mine = kernels[kernels["device_id"] == device]
        busy = intervals.union(mine[["start", "end"]])
        others = intervals.union(mine.loc[~mine["name"].str.contains("nccl"), ["start", "end"]])
        sm = intervals.covered_ns(busy, rows["start"], rows["end"])
        assert rows["sm_busy_ns"].tolist() == sm.tolist()
        assert (
            rows["comm_exposed_ns"].tolist() == (sm - intervals.covered_ns(others, rows["start"], rows["end"])).tolist()
        )
    assert own["comm_exposed_ns"].sum() > 0


def _shared_equals_own(tables: TraceTables) -> pd.DataFrame:
    events = tables.events
    waits = cuda.host_wait_calls(events)
    labels = cpu.thread_labels(cpu.thread_summary(tables, waits, cuda.calls_by_thread(events)))
    own = accounting.step_accounting(tables, waits)
    projection_alone = nvtx.gpu_time_by_range(events, labels)
    sums = accounting.LaunchSums(tables)
    projection = nvtx.gpu_time_by_range(events, labels, sums)
    assert sums.finished
    pd.testing.assert_frame_equal(projection, projection_alone)
    shared = accounting.step_accounting(tables, waits, sums, gpu.busy_unions(events))
    pd.testing.assert_frame_equal(shared, own)
    assert len(own) and own["kernel_ns"].sum() > 0
    return own


def test_launch_sums_not_fed_are_filled_by_the_accounting_itself():
    tables = random_trace(devices=(0,))
    waits = cuda.host_wait_calls(tables.events)
    unfed = accounting.LaunchSums(tables)
    pd.testing.assert_frame_equal(
        accounting.step_accounting(tables, waits, unfed), accounting.step_accounting(tables, waits)
    )
    assert unfed.finished


# ---------------------------------------------------------------- fusable chains


def _chains_at_once(kernels: pd.DataFrame) -> pd.DataFrame:
    """The runs of fusable kernels, from every kernel sorted by device, stream, start and end."""
    ordered = kernels.sort_values(["device_id", "stream_id", "start", "end"], kind="stable").reset_index(drop=True)
    chained = kernel_kinds.kernel_families(ordered).isin(gains.FUSABLE_FAMILIES).to_numpy()
    stream = (ordered["device_id"].to_numpy("int64") << 32) + ordered["stream_id"].to_numpy("int64")
    new_stream = np.r_[True, stream[1:] != stream[:-1]]
    run = np.cumsum(~chained | new_stream)
    reduction = kernel_kinds.kernel_families(ordered).eq(gains.REDUCTION_FAMILY).to_numpy()
    ordered = ordered.assign(reduced=np.where(reduction, ordered["duration"], 0), reductions=reduction.astype(int))
    runs = (
        ordered[chained]
        .assign(run=run[chained])
        .groupby("run")
        .agg(
            start=("start", "first"),
            end=("end", "last"),
            device_id=("device_id", "first"),
            kernels=("start", "size"),
            total_ns=("duration", "sum"),
            longest_ns=("duration", "max"),
            reduced_ns=("reduced", "sum"),
            reductions=("reductions", "sum"),
        )
    )
    runs = runs[runs["kernels"] > 1]
    # fused: one kernel per reduction (each still makes its pass), or one as long as the longest kernel
    runs = runs.assign(
        fused_ns=np.maximum(runs["longest_ns"], runs["reduced_ns"]),
        removed=runs["kernels"] - runs["reductions"].clip(1),
    )
    # queued: the device started another kernel within QUEUED_GAP_NS of the run's end
    nexts = []
    for device, end in zip(runs["device_id"], runs["end"], strict=True):
        later = kernels.loc[(kernels["device_id"] == device) & (kernels["start"] >= end), "start"]
        nexts.append(later.min() if len(later) else None)
    gap = pd.Series(nexts, index=runs.index, dtype="float") - runs["end"]
    runs = runs.assign(queued=(gap <= gains.QUEUED_GAP_NS).to_numpy())
    return runs.sort_values("start", kind="stable").reset_index(drop=True)


def test_chains_cut_window_by_window_sum_to_the_chains_of_every_kernel_at_once(windows):
    tables = random_trace(n=8_000)
    kernels = tables.kernels.assign(start=tables.kernels["start"] // 50 * 50)  # ties: kernels start together
    kernels["end"] = kernels["start"] + kernels["duration"]
    steps = cpu.step_table(tables.nvtx)
    found = gains.fusable_chains(EventStore.from_frames(kernels=kernels), steps, tables.span_ns)
    expected = _chains_at_once(kernels)
    assert found.runs == len(expected) > 100
    assert (found.kernels, found.total_ns, found.fused_ns) == tuple(
        int(expected[column].sum()) for column in ("kernels", "total_ns", "fused_ns")
    )
    assert len(steps) > 1 and found.saved_by_step.sum() > 0
    starts, ends = gains.step_windows(steps, tables.span_ns)
    assert 0 < found.queued_runs == int(expected["queued"].sum()) < found.runs
    queued_saving = (expected["total_ns"] - expected["fused_ns"]).where(expected["queued"], 0)
    saved = gains.sum_by_window(starts, ends, expected["start"], queued_saving)
    assert found.saved_by_step.tolist() == saved.tolist()
    removed = gains.sum_by_window(starts, ends, expected["start"], expected["removed"])
    assert found.removed_by_step.tolist() == removed.tolist()
    launched = gains.sum_by_window(starts, ends, kernels["start"], np.ones(len(kernels)))
    assert found.kernels_by_step.tolist() == launched.tolist()


# ---------------------------------------------------------------- the loader and the copies' calls


def test_labels_read_as_codes_are_the_exports_labels():
    """Memory operations', sync activity's and OS calls' text columns are read as codes and labels; the
    same rows read with their labels as text by SQL."""
    import sqlite3

    path = FIXTURES / "h200_sft_clean.sqlite"
    tables = load_trace(path)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        osrt = pd.read_sql_query(
            """SELECT o.start, s.value AS name FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId
                                    WHERE o.eventClass = 27 ORDER BY o.start""",
            conn,
        )
        sets = pd.read_sql_query("SELECT count(*) AS n FROM CUPTI_ACTIVITY_KIND_MEMSET", conn)["n"].iat[0]
    assert tables.osrt["name"].tolist() == osrt["name"].tolist()
    memops = tables.memops
    assert (memops["operation"] == "[CUDA memset]").sum() == sets == (memops["copy_kind"] == "memset").sum()
    assert memops["src_kind"][memops["copy_kind"] == "memset"].isna().all()
    assert set(memops["dst_kind"].dropna()) <= {"Device", "Pinned", "Pageable"}
    assert set(tables.sync["sync_type"]) <= {"Event sync", "Stream wait sync", "Stream sync", "Context sync", "Unknown"}


def test_copies_with_their_calls_keep_the_operations_order_and_names():
    """CopyCalls.batches gives what a join of the whole tables gives, in the operations' order."""
    tables = load_trace(FIXTURES / "h200_sft_clean.sqlite").with_all_columns()
    copies = memory.CopyCalls(tables.events, {})
    joined = pd.concat(copies.batches("true", re.compile("^cu")), ignore_index=True)
    calls = tables.cuda_api
    expected = tables.memops.merge(calls, on=["pid", "correlation_id"], suffixes=("", "_call"))
    assert len(joined) == len(expected) > 1_000
    assert joined["start"].tolist() == expected["start"].tolist()
    assert joined["api"].tolist() == [cuda.base_name(n) for n in expected["name"]]
    assert joined["api_start"].tolist() == expected["start_call"].tolist()
    assert joined["copy_kind"].tolist() == expected["copy_kind"].tolist()
    assert (joined["exposed_ns"] == joined["duration"]).all()  # no kernels given


def test_kernel_classes_by_name_or_by_name_pair():
    classes = pd.DataFrame(
        {
            "name_id": [3, 5, -1],
            "short_name_id": [9, 9, -1],
            "cls": [accounting.COMPUTE, accounting.COMMUNICATION, accounting.MEMORY],
        }
    )
    ids, shorts = np.array([5, 3, -1, 4, 99]), np.array([9, 9, -1, 9, 9])
    expected = [accounting.COMMUNICATION, accounting.COMPUTE, accounting.MEMORY, accounting.OTHER, accounting.OTHER]
    assert accounting._class_of(classes, ids, shorts).tolist() == expected
    # one name under two short names: each pair has its own class
    pairs = pd.concat([classes, pd.DataFrame({"name_id": [3], "short_name_id": [8], "cls": [accounting.MEMORY]})])
    assert accounting._class_of(pairs, np.array([3, 3, 7]), np.array([9, 8, 9])).tolist() == [
        accounting.COMPUTE,
        accounting.MEMORY,
        accounting.OTHER,
    ]


@pytest.mark.parametrize("n", [1, 15, 16, 17, 32, 33, 1_000, 100_017])
def test_covered_ns_from_block_sums_equals_every_cumulative_length(n):
    """covered_ns keeps one length sum per LENGTH_BLOCK intervals and adds the rest as it asks: on unions of
    sizes around a block's, windows anywhere (before the first interval, past the last, inside one, on
    block edges) get what the cumulative length of every interval gives."""
    rng = np.random.default_rng(n)
    starts = np.cumsum(rng.integers(1, 50, n)) + 1_000
    merged = pd.DataFrame({"start": starts, "end": starts + rng.integers(1, 30, n)})
    edges = np.r_[merged["start"].to_numpy(), merged["end"].to_numpy(), 0, int(merged["end"].iat[-1]) + 5]
    lo = np.r_[rng.integers(0, int(edges.max()) + 10, 400), edges]
    hi = lo + rng.integers(0, 2_000, len(lo))
    through = np.cumsum(merged["end"].to_numpy() - merged["start"].to_numpy())

    def covered_before(t):
        count = np.searchsorted(merged["start"].to_numpy(), t, side="right")
        last = np.maximum(count - 1, 0)
        partial = np.clip(np.minimum(t, merged["end"].to_numpy()[last]) - merged["start"].to_numpy()[last], 0, None)
        return np.where(count > 0, np.where(last > 0, through[np.maximum(last - 1, 0)], 0) + partial, 0)

    for _ in range(2):  # the second time from the block sums kept for a large frame
        assert (intervals.covered_ns(merged, lo, hi) == covered_before(hi) - covered_before(lo)).all()


def test_covered_ns_of_a_large_frame_follows_its_columns():
    """The cumulative lengths kept for the last large frame are not reused once its columns change."""
    starts = np.arange(0, 4_000_000, 20, dtype="int64")
    merged = pd.DataFrame({"start": starts, "end": starts + 10})
    windows = (np.array([0, 1_000]), np.array([1_000, 4_000_000]))
    assert intervals.covered_ns(merged, *windows).tolist() == [500, 1_999_500]
    assert intervals.covered_ns(merged, *windows).tolist() == [500, 1_999_500]
    merged["end"] = starts + 20
    assert intervals.covered_ns(merged, *windows).tolist() == [1_000, 3_999_000]


def test_a_thread_timeline_is_cut_at_each_distinct_time_once():
    """ThreadRanges' segment bounds (made in place) are np.unique of the starts and ends, ties, repeats and
    no ranges at all included, and each range's first and last segments are where its start and end are."""
    rng = np.random.default_rng(3)
    for n in [0, 1, 2, *rng.integers(3, 300, 50)]:
        starts = np.sort(rng.integers(0, max(n // 3, 1), n))
        ends = starts + rng.integers(0, 5, n)
        timeline = nvtx.ThreadRanges(starts, ends, np.arange(n), np.arange(n))
        assert (timeline.bounds == np.unique(np.r_[starts, ends])).all()
        assert (timeline.seg_ends == np.r_[timeline.bounds[1:], np.iinfo("int64").max][: len(timeline.bounds)]).all()
        order = np.lexsort((-np.arange(n), -ends, starts))
        assert (timeline.bounds[timeline.first] == starts[order]).all()
        assert (timeline.bounds[timeline.last] == ends[order]).all()


def test_push_order_without_a_sort_equals_the_sort():
    """Ranges listed as the loader lists them (start, then end descending, then anything) are put in push
    order by reversing runs of identical ranges; other listings are sorted. Both equal the full sort."""
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(0, 40))
        starts = np.sort(rng.integers(0, 6, n))
        ends = starts + rng.integers(0, 4, n)
        listed = np.lexsort((rng.random(n), -ends, starts))
        for order in (listed, rng.permutation(listed)):
            s, e = starts[order], ends[order]
            rank = np.arange(n) if rng.random() < 0.7 else rng.permutation(n)
            got = nvtx._push_order(s, e, rank)
            assert ((np.arange(n) if got is None else got) == np.lexsort((-rank, -e, s))).all()


def test_projection_is_the_same_whatever_the_slices_of_the_launch_join(monkeypatch):
    """Calls outside every range (the autograd thread and another process launch kernels here) are tallied
    per thread batch by batch: the table is the same from one slice and from slices of 97 kernels."""
    tables = random_trace()
    events = tables.events
    labels = cpu.thread_labels(cpu.thread_summary(tables, cuda.host_wait_calls(events), cuda.calls_by_thread(events)))
    whole = nvtx.gpu_time_by_range(events, labels)
    monkeypatch.setattr(nvtx, "SLICE_KERNELS", 97)
    sliced = nvtx.gpu_time_by_range(events, labels)
    pd.testing.assert_frame_equal(sliced, whole)
    left_open = tables.nvtx.copy()  # a third of the ranges left open: they end at the capture's end
    left_open.loc[::3, "end"] = tables.span_ns
    open_events = EventStore.from_frames(kernels=tables.kernels, cuda_api=tables.cuda_api, nvtx=left_open)
    monkeypatch.setattr(nvtx, "WINDOW_RANGES", 1 << 20)
    whole_open = nvtx.gpu_time_by_range(open_events, labels)
    for ranges in (1, 4, 33):  # windows of the ranges as well: ranges carried from window to window
        monkeypatch.setattr(nvtx, "WINDOW_RANGES", ranges)
        windowed = nvtx.gpu_time_by_range(events, labels)
        assert len(nvtx.thread_windows(events)[next(iter(nvtx.thread_windows(events)))].window_starts) > 1
        pd.testing.assert_frame_equal(windowed, whole)
        pd.testing.assert_frame_equal(nvtx.gpu_time_by_range(open_events, labels), whole_open)
    outside = whole[whole["range"].str.startswith("(no NVTX range, ")]
    assert len(outside) >= 2 and outside["kernels"].sum() > 0


def test_threads_projected_side_by_side_sum_as_one_at_a_time(monkeypatch):
    """Launching threads that each hold ranges (here the autograd thread too, with names of its own) are
    projected side by side where there are cores: the table is the one a single worker gives."""
    tables = random_trace()
    autograd = tables.nvtx.assign(
        name=tables.nvtx["name"].astype(str) + " (autograd)", global_tid=AUTOGRAD, tid=AUTOGRAD & 0xFFFFFF
    )
    events = EventStore.from_frames(
        kernels=tables.kernels, cuda_api=tables.cuda_api, nvtx=pd.concat([tables.nvtx, autograd], ignore_index=True)
    )
    monkeypatch.setattr(nvtx, "SLICE_KERNELS", 97)
    monkeypatch.setattr(nvtx, "usable_cores", lambda: 1)
    alone = nvtx.gpu_time_by_range(events, {})
    monkeypatch.setattr(nvtx, "usable_cores", lambda: 16)
    side_by_side = nvtx.gpu_time_by_range(events, {})
    pd.testing.assert_frame_equal(side_by_side, alone)
    # every kernel the autograd thread launched went to its ranges' names or its row outside them
    launched = events.query(f"""SELECT count(*) AS n FROM kernels k JOIN cuda_api a
                                ON a.pid = k.pid AND a.correlation_id = k.correlation_id
                                WHERE a.global_tid = {AUTOGRAD}""")
    ranged = alone["range"].str.endswith(" (autograd)")
    outside = alone["range"] == nvtx._outside(f"tid {AUTOGRAD & 0xFFFFFF}")
    assert alone.loc[ranged | outside, "kernels"].sum() == launched["n"].iloc[0] > alone.loc[outside, "kernels"].sum()
    assert alone.loc[~ranged & ~outside, "kernels"].sum() > 0
    assert alone["kernels"].sum() == len(tables.kernels)


@pytest.mark.parametrize("buckets, fetched", [(4, 0), (64, 50), (1 << 21, 1 << 20)])
def test_medians_by_bucket_passes_equal_pandas_medians(monkeypatch, buckets, fetched):
    """The bounded median (stats.grouped_medians), whatever the passes it takes before it fetches, equals
    pandas' on groups of one value, of repeated values, of values near 2^53, even and odd counts, and
    a NULL key."""
    rng = np.random.default_rng(11)
    durations = np.concatenate(
        [
            [5],  # a group of one
            np.full(9, 1_000),  # one value, repeated
            rng.integers(0, 50, 400),  # many ties
            rng.integers(0, 2**53, 301),  # the widest range
            rng.integers(2**53 - 5, 2**53, 40),  # near the top, even count
            rng.integers(1_000, 1_000_000, 250),  # odd count
            [7, 3],  # the NULL grid's group
        ]
    )
    sizes = [1, 9, 400, 301, 40, 250, 2]
    starts = rng.integers(0, 1_000, len(durations))
    frame = pd.DataFrame(
        {
            "start": starts,
            "end": starts + durations,
            "name": np.repeat([f"k{g % 6}" for g in range(len(sizes))], sizes),
            "grid": np.repeat(["1 1 1"] * (len(sizes) - 1) + [None], sizes),
            "block": "32 1 1",
        }
    )
    events = EventStore.from_frames(kernels=frame.assign(duration=durations))
    monkeypatch.setattr(stats, "MEDIAN_BUCKET_ROWS", buckets)
    monkeypatch.setattr(stats, "MEDIAN_FETCH_ROWS", fetched)
    summary = stats.grouped_summary(events, "kernels", ["name_id", "grid_x"])
    names = events.query("SELECT id AS name_id, name FROM kernel_names")
    got = summary.merge(names, on="name_id").set_index(["name", "grid_x"])["med_ns"]
    frame["grid_x"] = pd.to_numeric(frame["grid"].str[0]).astype("Int32")
    expected = pd.Series(durations, index=frame.index).groupby([frame["name"], frame["grid_x"]], dropna=False).median()
    assert len(got) == len(expected) == len(sizes)  # k0 twice: with a grid and with none
    pd.testing.assert_series_equal(got.sort_index(), expected.sort_index().astype("float64"), check_names=False)
    everything = stats.grouped_summary(events, "kernels", [])
    assert everything["med_ns"].iat[0] == float(np.median(durations))


def test_many_groups_of_few_values_are_summed_in_slices_and_their_medians_fetched_in_batches(monkeypatch):
    """Names an application writes can give every range a name of its own. Such groups are summed a slice of
    their codes at a time (memory_budget.summary_groups a slice), and their medians fetched a batch
    of MEDIAN_FETCH_ROWS values at a time rather than counted MEDIAN_BUCKET_ROWS / 2 groups a query. The summary
    equals the one-query summary and pandas' medians, in fewer queries than groups / (MEDIAN_BUCKET_ROWS / 2)."""
    rng = np.random.default_rng(17)
    sizes = np.concatenate([np.ones(2000, "int64"), rng.integers(2, 6, 3000), [300, 41]])  # the last: counted
    names = np.repeat(np.arange(len(sizes)), sizes)
    durations = rng.integers(0, 10**9, len(names))
    durations[:3000] = rng.integers(0, 3, 3000)  # ties
    frame = pd.DataFrame({"name_id": pd.array(names, "Int64"), "style_id": names % 2, "duration": durations})
    frame.loc[frame.index[-3:], "name_id"] = pd.NA  # ranges with no name: a group of their own, in one slice
    events = EventStore(on_disk=False)
    whole = stats.grouped_summary(events, "rows", ["name_id", "style_id"], rows=frame)
    monkeypatch.setattr(stats, "MEDIAN_BUCKET_ROWS", 64)
    monkeypatch.setattr(stats, "MEDIAN_FETCH_ROWS", 500)
    monkeypatch.setattr(stats.memory_budget, "summary_groups", lambda: 700)
    queries = []
    query = EventStore.query
    monkeypatch.setattr(EventStore, "query", lambda self, sql, **f: queries.append(sql) or query(self, sql, **f))
    parted = stats.grouped_summary(events, "rows", ["name_id", "style_id"], coded=("name_id", len(sizes)), rows=frame)
    assert sum("GROUP BY ALL" in sql and "WHERE name_id" in sql for sql in queries) == -(-len(sizes) // 700) > 1
    key = ["name_id", "style_id"]
    pd.testing.assert_frame_equal(
        parted.sort_values(key).reset_index(drop=True), whole.sort_values(key).reset_index(drop=True)
    )
    expected = frame.groupby(["name_id", "style_id"], dropna=False)["duration"].median().to_numpy("float64")
    assert len(parted) == len(sizes) + 1
    assert (parted.sort_values(key)["med_ns"].to_numpy() == expected).all()
    assert len(queries) < 3000 / 32  # one pass of the groups of 2 to 5 values, counted 32 a query, is more


def test_median_buckets_a_query_can_fill_stay_within_the_cap():
    """However ranges' widths and counts fall, the buckets one query can fill (at most a range's count each) come
    to stats.MEDIAN_BUCKET_ROWS at most, no range is split finer than its width, and a range with few values is
    counted value by value."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        ranges = int(rng.integers(1, stats.MEDIAN_BUCKET_ROWS // 2 + 1))
        width_bits = rng.integers(0, 45, ranges)
        counts = np.maximum(rng.lognormal(4, 4, ranges).astype("int64"), 1)
        bits = stats._bucket_bits(width_bits, counts)
        assert np.minimum(np.ldexp(1.0, bits), counts).sum() <= stats.MEDIAN_BUCKET_ROWS
        assert (bits <= width_bits).all() and (bits[width_bits > 0] >= 1).all()
        few = counts <= stats.MEDIAN_BUCKET_ROWS // ranges
        assert (bits[few] == width_bits[few]).all()


def test_medians_of_many_spread_values_fit_the_share_on_four_threads(monkeypatch):
    """Counting 6M values spread over 2^40 into buckets stays in a 128 MiB DuckDB share with 4 threads (any
    machine of 4 cores or more at the 1 GB default): with 2^21 buckets a pass the histogram ran out of it, as
    the median of NeMo's NVTX ranges did; the medians equal pandas'."""
    monkeypatch.setattr(events_module, "usable_cores", lambda: 4)
    rng = np.random.default_rng(3)
    spread = pd.DataFrame({"name_id": rng.integers(0, 3, 6_000_000), "duration": rng.integers(0, 2**40, 6_000_000)})
    events = EventStore(on_disk=True)
    try:
        assert events.query("SELECT current_setting('threads') AS threads")["threads"].iat[0] == 4
        summary = stats.grouped_summary(events, "spread", ["name_id"], spread=spread)
    finally:
        events.close()
    expected = spread.groupby("name_id")["duration"].median()
    pd.testing.assert_series_equal(summary.set_index("name_id")["med_ns"].sort_index(), expected, check_names=False)


def test_a_union_kept_in_files_answers_as_the_union_in_memory():
    """spilled.SpilledUnion, fed batches as the busy pass feeds it and read back a block at a time, answers
    every question with what the whole arrays give: rows, positions of times (searchsorted), whether a time is
    covered, covered time, gaps, intervals near windows; blocks of 1 to 50 intervals put block edges everywhere."""
    rng = np.random.default_rng(1)
    for _ in range(150):
        n = int(rng.integers(0, 600))
        starts = np.sort(rng.integers(0, 20_000, n))
        ends = starts + rng.integers(0, 60, n)
        whole = intervals.union(pd.DataFrame({"start": starts, "end": ends}))
        union_starts, union_ends = whole["start"].to_numpy(), whole["end"].to_numpy()
        kept = spilled.SpilledUnion(block=int(rng.integers(1, 50)))
        batch = int(rng.integers(1, 80))
        for lo in range(0, n, batch):
            kept.add(starts[lo : lo + batch], ends[lo : lo + batch])
        kept.finish()
        pd.testing.assert_frame_equal(kept.frame(), whole)
        assert len(kept) == len(whole) and kept.total_length() == int((union_ends - union_starts).sum())
        times = np.r_[rng.integers(-10, 20_100, 200), union_starts[:5], union_ends[-5:]]
        for column, values in (("start", union_starts), ("end", union_ends)):
            for side in ("left", "right"):
                assert (kept.positions(times, column, side) == np.searchsorted(values, times, side=side)).all()
        index = np.searchsorted(union_starts, times, side="right") - 1
        inside = (index >= 0) & (times < union_ends[np.maximum(index, 0)])
        assert (kept.covering(times) == inside).all() and (
            kept.covering(np.sort(times)) == inside[np.argsort(times)]
        ).all()
        windows = (times, times + rng.integers(0, 400, len(times)))
        assert (kept.covered_ns(*windows) == intervals.covered_ns(whole, *windows)).all()
        for first in rng.integers(0, len(whole) + 2, 5):
            last = int(first + rng.integers(0, 30))
            assert all(map(np.array_equal, kept.rows(first, last), (union_starts[first:last], union_ends[first:last])))
        holes = pd.DataFrame({"start": union_ends[:-1], "end": union_starts[1:]})
        holes = holes.assign(duration=holes["end"] - holes["start"])
        holes = holes[holes["duration"] > 20].sort_values(["duration", "start"], ascending=[False, True])
        pd.testing.assert_frame_equal(kept.gaps(20), holes.reset_index(drop=True))
        near = kept.overlapping(windows[0][:8], windows[1][:8])
        overlaps = (union_starts[:, None] < windows[1][:8]) & (union_ends[:, None] > windows[0][:8])
        keep = overlaps.any(axis=1)
        assert all(map(np.array_equal, near, (union_starts[keep], union_ends[keep])))


def test_unions_in_files_merge_a_window_of_time_at_a_time():
    """SpilledUnion.merged (when any GPU ran): the union of the devices' unions, whatever the window size."""
    rng = np.random.default_rng(2)
    for _ in range(40):
        parts = []
        for _device in range(int(rng.integers(1, 4))):
            starts = np.sort(rng.integers(0, 3_000, int(rng.integers(0, 200))))
            parts.append(pd.DataFrame({"start": starts, "end": starts + rng.integers(0, 40, len(starts))}))
        kept = [spilled.SpilledUnion.of(intervals.union(part), block=int(rng.integers(1, 20))) for part in parts]
        merged = spilled.SpilledUnion.merged(kept, rows=int(rng.integers(1, 50)))
        pd.testing.assert_frame_equal(merged.frame(), intervals.union(pd.concat(parts, ignore_index=True)))


@pytest.mark.parametrize("distinct", [1, 3, nvtx.FEW_KEYS, nvtx.FEW_KEYS + 1, 200])
def test_groups_give_each_keys_positions_in_order(distinct):
    """nvtx._groups finds a few keys a pass each and more by sorting: the same groups either way."""
    keys = np.random.default_rng(distinct).integers(0, distinct, 5_000) * 7 - 3
    groups = list(nvtx._groups(keys))
    assert [int(key) for key, _ in groups] == sorted(set(keys.tolist()))
    for key, positions in groups:
        assert positions.dtype == np.int32
        assert (positions == np.flatnonzero(keys == key)).all()
