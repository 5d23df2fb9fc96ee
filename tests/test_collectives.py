"""NCCL kernel names -> collective kinds, exposed communication and synchronization waits.

NCCL kernels cannot be made on this CPU machine: the names below are real ones, quoted from NCCL's
sources and from traces in public issues (each with where it comes from), and the kernel timelines
are synthetic, checked against an independent count on a boolean timeline. Real 2-GPU captures are
checked in test_nccl_ranks.py.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import collectives, cpu
from sftprof.analysis.collectives import ALL, NCCL_PATTERNS, collective_kind, collective_table, step_waits
from sftprof.analysis.gains import StepClock
from sftprof.analysis.spilled import SpilledUnion
from sftprof.trace.events import EventStore

# (kernel name as nsys or Kineto shows it, the pattern that must name it, the kind)
NAMES = [
    # NCCL 2.19+ (src/device/generate.py: ncclDevKernel_<coll>[_<redop>_<type>]_<algo>_<proto>)
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl_dev_kernel", "all_reduce"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nccl_dev_kernel", "all_reduce"),  # HTA issues 122, 360
    ("ncclDevKernel_AllReduce_Sum_f32_TREE_LL(ncclDevKernelArgs4K const)", "nccl_dev_kernel", "all_reduce"),
    ("ncclDevKernel_ReduceScatter_Sum_u8_RING_LL(ncclDevKernelArgs4K const)", "nccl_dev_kernel", "reduce_scatter"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl_dev_kernel", "all_gather"),
    ("ncclDevKernel_AllGatherV_RING_LL", "nccl_dev_kernel", "all_gather"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "nccl_dev_kernel", "broadcast"),
    ("ncclDevKernel_Reduce_Sum_f16_RING_LL", "nccl_dev_kernel", "reduce"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "nccl_dev_kernel", "send_recv"),
    ("ncclDevKernel_SendRecv(struct ncclDevComm*, uint64_t, struct ncclWork*)", "nccl_dev_kernel", "send_recv"),
    ("ncclDevKernel_Generic", "nccl_dev_kernel", "generic"),  # HTA issue 360
    ("nccldevkernel_allreduce_sum_f32_ring_ll", "nccl_dev_kernel", "all_reduce"),  # lower-cased (HTA issue 247)
    # NCCL 2.27+ symmetric-memory kernels
    ("ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32(ncclSymkDevWorkArgs4K const)", "nccl_symmetric_kernel", "all_reduce"),
    ("ncclSymkDevKernel_ReduceScatter_LL_sum_f8e4m3", "nccl_symmetric_kernel", "reduce_scatter"),
    ("ncclSymkDevKernel_AllGather_STMC", "nccl_symmetric_kernel", "all_gather"),
    # NCCL 2.8-2.18
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "nccl_kernel", "all_reduce"),
    ("ncclKernel_AllReduce_RING_LL_Sum_half(ncclDevComm*, unsigned long, ncclWork*)", "nccl_kernel", "all_reduce"),
    ("ncclKernel_ReduceScatter_RING_LL_Sum_half", "nccl_kernel", "reduce_scatter"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "nccl_kernel", "all_gather"),
    ("ncclKernel_Broadcast_RING_LL_Sum_int8_t", "nccl_kernel", "broadcast"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "nccl_kernel", "send_recv"),
    # NCCL 2.7 and earlier
    ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "nccl_legacy_kernel", "all_reduce"),
    ("ncclReduceScatterRingLLKernel_sum_f16", "nccl_legacy_kernel", "reduce_scatter"),
]
NOT_NCCL = [
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTT",
    "ampere_sgemm_128x64_tn",
    "reduce_kernel<512, 1>",
    "allreduce_two_shot_multimem_intra_node_kernel",
    "void cutlass::Kernel2<cutlass_80_wmma>",
    None,
]


@pytest.mark.parametrize("name, pattern, kind", NAMES)
def test_each_nccl_name_is_named_by_its_pattern(name, pattern, kind):
    first = next(p for p, regex in NCCL_PATTERNS.items() if regex.search(name))
    assert first == pattern
    assert collective_kind(name) == kind


def test_every_pattern_is_tested_and_other_kernels_are_not_collectives():
    assert {pattern for _, pattern, _ in NAMES} == set(NCCL_PATTERNS)
    assert [collective_kind(name) for name in NOT_NCCL] == [None] * len(NOT_NCCL)
    # NCCL's, but in no known scheme: still communication (gpu.COMMUNICATION_MARKER), of kind `other`
    assert collective_kind("ncclFutureKernel_AllToAllv") == "other"


def test_short_name_wins_over_the_full_name():
    names = pd.DataFrame(
        {
            "name": ["ncclDevKernel_Generic(args)", "gemm", None],
            "short_name": ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", None, "ncclDevKernel_SendRecv"],
        }
    )
    assert list(collectives.kinds_of(names)) == ["all_reduce", None, "send_recv"]


def _store(rows) -> EventStore:
    kernels = pd.DataFrame(rows, columns=["start", "end", "name", "device_id"])
    kernels["short_name"] = kernels["name"].str.split("(").str[0]
    return EventStore.from_frames(kernels=kernels)


AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgs4K const)"


def test_exposed_time_by_hand():
    """Device 0: compute [1000,1100) and [1150,1300); all-reduces [1080,1200) and [1090,1120) (another
    stream: one union); a reduce-scatter [1250,1400). Steps [1000,1180) and [1180,1500)."""
    events = _store(
        [
            (1000, 1100, "gemm", 0),
            (1150, 1300, "gemm", 0),
            (1080, 1200, AR, 0),
            (1090, 1120, AR, 0),
            (1250, 1400, RS, 0),
            (1010, 1020, "ncclDevKernel_Generic", 1),
        ]
    )
    steps = pd.DataFrame({"step": [7, 8], "start": [1000, 1180], "end": [1180, 1500]})
    table = collective_table(events, steps).set_index(["step", "device_id", "kind"])
    capture = table[table.index.get_level_values("step").isna()].droplevel("step")  # the whole capture
    # whole capture, device 0: all-reduce union [1080,1200) = 120, compute covers 20 + 50: 50 exposed
    assert capture.loc[(0, "all_reduce"), ["kernels", "time_ns", "busy_ns", "exposed_ns"]].tolist() == [2, 150, 120, 50]
    # reduce-scatter [1250,1400) = 150, compute covers [1250,1300): 100 exposed
    assert capture.loc[(0, "reduce_scatter"), ["busy_ns", "exposed_ns"]].tolist() == [150, 100]
    assert capture.loc[(0, ALL), ["kernels", "busy_ns", "exposed_ns"]].tolist() == [3, 270, 150]
    assert capture.loc[(1, "generic"), ["busy_ns", "exposed_ns"]].tolist() == [10, 10]  # no compute on device 1
    # per step: the all-reduce union is cut at 1180 (100 in step 7, 20 in step 8, covered by [1150,1300))
    assert table.loc[(7, 0, "all_reduce"), ["busy_ns", "exposed_ns"]].tolist() == [100, 50]
    assert table.loc[(8, 0, "all_reduce"), ["kernels", "busy_ns", "exposed_ns"]].tolist() == [0, 20, 0]
    assert table.loc[(8, 0, ALL), ["busy_ns", "exposed_ns"]].tolist() == [170, 100]
    assert collectives.exposed_per_step(collective_table(events, steps)).to_dict() == {7: 50, 8: 100}


def test_blocking_time_counts_only_what_launched_compute_waited_for():
    """Device 0, launches traced: an all-reduce [1100,1300) with the next gemm launched at 1250 (it waits
    [1250,1300)); one [1400,1500) whose next gemm is launched at 1550, after it ended (the GPU would have
    idled anyway: nothing blocked); one [1800,1900) that nothing follows (unknown: counted whole)."""
    rows = [
        (1000, 1100, "gemm", 0, 1, 900),
        (1100, 1300, AR, 0, 2, 950),
        (1300, 1400, "gemm", 0, 3, 1250),
        (1400, 1500, AR, 0, 4, 1260),
        (1600, 1700, "gemm", 0, 5, 1550),
        (1800, 1900, AR, 0, 6, 1560),
    ]
    frame = pd.DataFrame(rows, columns=["start", "end", "name", "device_id", "correlation_id", "launch"])
    kernels = frame.drop(columns="launch").assign(short_name=frame["name"].str.split("(").str[0], pid=5)
    calls = pd.DataFrame(
        {
            "start": frame["launch"],
            "end": frame["launch"] + 5,
            "name": "cudaLaunchKernel",
            "global_tid": (5 << 24) | 7,  # nsys's layout: the pid above the tid
            "pid": 5,
            "tid": 7,
            "correlation_id": frame["correlation_id"],
        }
    ).assign(duration=5)
    events = EventStore.from_frames(kernels=kernels, cuda_api=calls)
    steps = pd.DataFrame({"step": [1, 2], "start": [1000, 1550], "end": [1550, 2000]})
    table = collective_table(events, steps)
    whole = table[table["step"].isna() & (table["kind"] == ALL)].iloc[0]
    assert whole[["busy_ns", "exposed_ns", "blocking_ns"]].tolist() == [400, 400, 150]
    by_step = table[table["step"].notna() & (table["kind"] == ALL)].set_index("step")
    assert by_step["blocking_ns"].to_dict() == {1: 50, 2: 100}
    assert collectives.exposed_per_step(table, "blocking_ns").to_dict() == {1: 50, 2: 100}


def test_exposed_time_matches_an_independent_count_on_a_timeline():
    """Random kernels on two devices and several streams; every number against a boolean timeline."""
    rng = np.random.default_rng(7)
    horizon, rows = 6000, []
    for device in (0, 1):
        for _ in range(150):
            start = int(rng.integers(1, horizon - 200))
            rows.append((start, start + int(rng.integers(1, 200)), f"gemm_{rng.integers(3)}", device))
        for _ in range(40):
            start = int(rng.integers(1, horizon - 300))
            rows.append(
                (start, start + int(rng.integers(1, 300)), [AR, RS, "ncclDevKernel_SendRecv"][rng.integers(3)], device)
            )
    events = _store(rows)
    steps = pd.DataFrame({"step": [1, 2, 3], "start": [1, 2100, 4000], "end": [2000, 3900, horizon]})
    table = collective_table(events, steps)
    frame = pd.DataFrame(rows, columns=["start", "end", "name", "device_id"])
    frame["kind"] = frame["name"].map(collective_kind)
    for device in (0, 1):
        on = frame[frame["device_id"] == device]
        compute = np.zeros(horizon + 1, bool)
        for r in on[on["kind"].isna()].itertuples():
            compute[r.start : r.end] = True
        for kind in (ALL, "all_reduce", "reduce_scatter", "send_recv"):
            comm = np.zeros(horizon + 1, bool)
            for r in on[on["kind"].notna() if kind == ALL else on["kind"] == kind].itertuples():
                comm[r.start : r.end] = True
            for step, start, end in [(None, 0, horizon + 1), *steps.itertuples(index=False)]:
                row = table[
                    (table["device_id"] == device)
                    & (table["kind"] == kind)
                    & (table["step"].isna() if step is None else table["step"] == step)
                ]
                window = slice(start, end)
                busy, exposed = int(comm[window].sum()), int((comm[window] & ~compute[window]).sum())
                got = row[["busy_ns", "exposed_ns"]].iloc[0].tolist() if len(row) else [0, 0]
                assert got == [busy, exposed], (device, kind, step)


def test_no_nccl_kernels_no_rows():
    table = collective_table(_store([(1, 10, "gemm", 0)]), pd.DataFrame({"step": [1], "start": [0], "end": [20]}))
    assert table.empty and list(table.columns) == collectives.COLLECTIVE_COLUMNS
    assert collective_table(EventStore.from_frames(), pd.DataFrame(columns=["step", "start", "end"])).empty


def test_many_kernels_take_a_join_not_a_loop():
    """200,000 compute kernels and 2,000 all-reduces: numpy and one range join, not a pass per kernel."""
    rng = np.random.default_rng(1)
    starts = np.sort(rng.integers(1, 10**10, 200_000))
    compute = pd.DataFrame(
        {"start": starts, "end": starts + rng.integers(1_000, 50_000, len(starts)), "name": "gemm", "device_id": 0}
    )
    comm_starts = np.sort(rng.integers(1, 10**10, 2_000))
    comm = pd.DataFrame({"start": comm_starts, "end": comm_starts + 100_000, "name": AR, "device_id": 0})
    events = _store(pd.concat([compute, comm]).itertuples(index=False))
    steps = pd.DataFrame({"step": np.arange(100), "start": np.arange(100) * 10**8, "end": np.arange(1, 101) * 10**8})
    began = time.monotonic()
    table = collective_table(events, steps)
    assert time.monotonic() - began < 60
    whole = table[table["step"].isna() & (table["kind"] == ALL)].iloc[0]
    assert whole["kernels"] == 2_000 and 0 < whole["exposed_ns"] < whole["busy_ns"]


def test_exposed_communication_finding_gain():
    steps = pd.DataFrame({"step": [8, 7], "start": [1180, 1000], "end": [1500, 1180], "duration": [320, 180]})
    events = _store([(1000, 1100, "gemm", 0), (1150, 1300, "gemm", 0), (1080, 1200, AR, 0), (1250, 1400, RS, 0)])
    table = collective_table(events, steps)
    clock = StepClock.of(
        steps,
        1500,
        SpilledUnion().finish(),
        SpilledUnion().finish(),
    )
    [finding] = collectives.exposed_communication(table, steps, clock)
    # exposed per step: 50 (step 7) and 100 (step 8); median 75 over the median step (180 + 320) / 2 = 250
    assert finding.gain_pct == pytest.approx(30.0) and finding.severity == "warning"
    assert finding.rule == "exposed_communication" and "all_reduce" in finding.evidence
    assert collectives.exposed_communication(table.iloc[:0], steps, clock) == []


def _nvtx(rows):
    frame = pd.DataFrame(rows, columns=["name", "start", "end", "global_tid"])
    return frame.assign(duration=frame["end"] - frame["start"], style="PushPop", pid=1, tid=frame["global_tid"])


def _osrt(rows):
    frame = pd.DataFrame(rows, columns=["name", "start", "end", "global_tid"])
    return frame.assign(duration=frame["end"] - frame["start"], pid=1, tid=frame["global_tid"])


def test_step_waits_by_phase():
    nvtx = _nvtx(
        [
            ("step 5", 0, 100, 1),
            ("data", 0, 20, 1),
            ("forward", 20, 50, 1),
            ("backward", 50, 90, 1),
            ("step 6", 100, 200, 1),
            ("backward", 150, 190, 1),
            ("step 5", 0, 100, 2),
        ]
    )  # thread 2: fewer steps
    osrt = _osrt(
        [
            ("clock_nanosleep", 2, 18, 1),  # a sleep in data: not a synchronization wait
            ("pthread_cond_wait", 5, 10, 1),  # data: counted under data (the rank's own input pipeline)
            ("pthread_cond_wait", 25, 35, 1),  # forward
            ("pthread_cond_wait", 45, 60, 1),  # starts in forward, cut at its end (5)
            ("recv", 92, 96, 1),  # step 5, outside every phase: other
            ("futex", 160, 170, 1),  # step 6 backward
            ("pthread_cond_wait", 30, 40, 2),  # another thread
            ("pthread_cond_wait", 300, 310, 1),  # outside every step
            ("pthread_mutex_lock", 60, 70, 1),  # a lock: lock_waits' business
        ]
    )
    events = EventStore.from_frames(osrt=osrt)
    table = step_waits(nvtx, events).set_index(["step", "phase"])
    assert sorted(table.index.get_level_values("phase").unique()) == sorted(collectives.WAIT_PHASES)
    assert table.loc[(5, "data"), ["waits", "wait_ns"]].tolist() == [1, 5]
    assert table.loc[(5, "forward"), ["waits", "wait_ns"]].tolist() == [2, 15]
    assert table.loc[(5, "backward"), "wait_ns"] == 0 and table.loc[(5, "other"), "wait_ns"] == 4
    assert table.loc[(6, "backward"), ["waits", "wait_ns"]].tolist() == [1, 10]
    assert table["wait_ns"].sum() == 34
    assert step_waits(_nvtx([("data", 0, 5, 1)]), events).empty


def test_step_waits_read_in_batches_sum_as_each_call_placed_alone(monkeypatch):
    """Random steps, phases and waits, the waits read 2048 at a time: each table cell equals the sum over the
    calls placed one by one (the latest step and phase started at the call's start, open then; cut at their end)."""
    rng = np.random.default_rng(7)
    ranges, calls = [], []
    for step in range(40):
        start = step * 1000
        ranges.append((f"step {step}", start, start + 900, 1))
        cut = np.sort(rng.choice(np.arange(start + 1, start + 900), 5, replace=False))
        for name, lo, hi in zip(cpu.PHASES, cut[:-1], cut[1:]):
            ranges.append((name, int(lo), int(hi) - int(rng.integers(0, 20)), 1))
    names = sorted(collectives.SYNC_WAIT_CALLS)[:3] + ["pthread_mutex_lock"]
    for at in rng.integers(-500, 41_000, 9000):
        calls.append((str(rng.choice(names)), int(at), int(at + rng.integers(0, 300)), 1))
    monkeypatch.setattr("sftprof.trace.events.BATCH_VECTORS", 1)
    table = step_waits(_nvtx(ranges), EventStore.from_frames(osrt=_osrt(calls))).set_index(["step", "phase"])
    expected = {}
    steps = [r for r in ranges if r[0].startswith("step")]
    phases = sorted((r for r in ranges if not r[0].startswith("step")), key=lambda r: r[1])
    for name, start, end, _ in calls:
        step = max((r for r in steps if r[1] <= start), key=lambda r: r[1], default=None)
        if name not in collectives.SYNC_WAIT_CALLS or step is None or start >= step[2]:
            continue
        phase = max((r for r in phases if r[1] <= start), key=lambda r: r[1], default=None)
        label, limit = collectives.OTHER_PHASE, step[2]
        if phase is not None and start < phase[2]:
            label, limit = phase[0], min(limit, phase[2])
        key = (int(step[0].split()[1]), label)
        count, total = expected.get(key, (0, 0))
        expected[key] = (count + 1, total + max(min(end, limit) - start, 0))
    assert len(expected) > 100
    for key, (count, total) in expected.items():
        assert table.loc[key, ["waits", "wait_ns"]].tolist() == [count, total]
    assert table["waits"].sum() == sum(count for count, _ in expected.values())
