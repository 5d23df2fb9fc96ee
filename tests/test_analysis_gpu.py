"""GPU-side analyses and rules on small tables built here, so every expected number is derivable by hand."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import (
    analyze,
    boundness,
    cpu,
    cuda,
    excess,
    gains,
    gpu,
    intervals,
    kernels,
    memory,
    nvtx,
    rules,
    utilisation,
    views,
)
from sftprof.analysis import idle as idle_causes
from sftprof.analysis.spilled import SpilledUnion
from sftprof.trace import events as events_module
from sftprof.trace.events import EventStore
from sftprof.trace.tables import COLUMNS, TraceTables

from conftest import TRAINING_TID, nvtx_range
from conftest import kernel_row as kernel

MAIN, AUTOGRAD = TRAINING_TID, (7 << 24) | 9  # global_tids of pid 7: main thread and a second thread


def frame(table: str, rows: list[dict]) -> pd.DataFrame:
    """A normalized table with every documented column (missing values NA)."""
    return pd.DataFrame(
        [{column: row.get(column) for column in COLUMNS[table]} for row in rows], columns=COLUMNS[table]
    )


def store(kernels: pd.DataFrame | None = None, cuda_api: pd.DataFrame | None = None) -> EventStore:
    """An EventStore holding these kernel and CUDA API rows."""
    return EventStore.from_frames(kernels=kernels, cuda_api=cuda_api)


def name_totals(kernel_rows: pd.DataFrame) -> pd.DataFrame:
    """Per-kernel rows as the name-totals rows that the kernel-mix analyses take."""
    return kernels.name_totals(store(kernel_rows))


def api(name: str, start: int, duration: int, correlation: int, tid: int = MAIN) -> dict:
    return {
        "start": start,
        "end": start + duration,
        "duration": duration,
        "name": name,
        "global_tid": tid,
        "pid": tid >> 24,
        "tid": tid & 0xFFFFFF,
        "correlation_id": correlation,
    }


def clock(
    span_ns: int, busy: list[tuple[int, int]] = (), waits: list[tuple[int, int]] = (), steps: pd.DataFrame | None = None
) -> gains.StepClock:
    """What gains are measured against: a capture of `span_ns` (or these steps), GPU busy and CPU waits."""
    spans = lambda pairs: pd.DataFrame(list(pairs), columns=["start", "end"], dtype="int64")  # noqa: E731
    return gains.StepClock.of(
        steps if steps is not None else pd.DataFrame(),
        span_ns,
        SpilledUnion.of(intervals.union(spans(busy))),
        SpilledUnion.of(intervals.union(spans(waits))),
    )


# ---------------------------------------------------------------- kernel families, tensor cores, precision

FAMILY_CASES = [  # (demangled name, short name, family, duration)
    ("nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT", None, "GEMM", 400),
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_32x6_nn_align2>(T1::Params)",
        "Kernel2",
        "GEMM",
        100,
    ),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)", "splitKreduce_kernel", "GEMM", 50),
    (
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 64>>(Flash_fwd_params)",
        "flash_fwd_kernel",
        "attention",
        150,
    ),
    ("void cudnn::fusion::compute_dot_do_o<true>(const void *)", "compute_dot_do_o", "attention", 50),
    (
        "void at::native::multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>(...)",
        "multi_tensor_apply_kernel",
        "optimizer",
        60,
    ),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm *)", None, "communication", 40),
    (
        "void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float>>>(T3)",
        "reduce_kernel",
        "reduction/norm",
        30,
    ),
    (
        "void at::native::(anonymous)::CatArrayBatchedCopy<OpaqueType<4>, unsigned int, 3>(...)",
        "CatArrayBatchedCopy",
        "copy/cat",
        20,
    ),
    (
        "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>(int, T2, T3)",
        "vectorized_elementwise_kernel",
        "elementwise",
        80,
    ),
    (
        "void at::native::(anonymous)::embedding_backward_feature_kernel<float, float, long>(...)",
        "embedding_backward_feature_kernel",
        "other",
        20,
    ),
]


@pytest.fixture
def mixed_kernels() -> pd.DataFrame:
    return frame(
        "kernels",
        [kernel(name, 1000 * i, duration, short) for i, (name, short, _, duration) in enumerate(FAMILY_CASES)],
    )


def test_each_kernel_lands_in_its_family_first_match_wins(mixed_kernels):
    assert kernels.kernel_families(mixed_kernels).tolist() == [family for _, _, family, _ in FAMILY_CASES]


def test_family_summary_adds_up_to_all_kernel_time(mixed_kernels):
    families = kernels.family_summary(name_totals(mixed_kernels)).set_index("family")
    assert families["total_ns"].sum() == mixed_kernels["duration"].sum() == 1000
    assert families["time_pct"].sum() == pytest.approx(100.0)
    assert families.loc["GEMM", "total_ns"] == 550 and families.loc["GEMM", "instances"] == 3
    assert families.loc["GEMM", "top_kernel"] == "nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT"
    assert families.loc["attention", "bound"] == "compute" and families.loc["elementwise", "bound"] == "memory"
    # nvjet and the tensorop cutlass GEMM (500 of 550 ns) run on tensor cores; split-K reduction does not
    assert families.loc["GEMM", "tensor_core_pct"] == pytest.approx(100 * 500 / 550)
    mix = kernels.kernel_mix(name_totals(mixed_kernels))
    assert mix["compute_pct"] == pytest.approx(75.0)  # GEMM 550 + attention 200
    assert mix["memory_pct"] == pytest.approx(19.0)  # 60 + 30 + 20 + 80


@pytest.mark.parametrize(
    "name, tensor_cores",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", True),
        ("nvjet_sm90_tst_32x64_64x16_4x2_h_bz_NTN", True),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64", True),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_bf16_128x64_32x6_nt_align2>(T1::Params)", True),
        ("ampere_fp16_s1688gemm_fp16_128x128_ldg8_f2f_tn", True),
        ("sm89_xmma_gemm_e4m3e4m3_e4m3f32_f32_tn_n", True),
        ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(T1::Params)", False),
        ("ampere_sgemm_128x64_tn", False),
        ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", False),
        ("void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float>>>", False),
    ],
)
def test_tensor_core_markers(name, tensor_cores):
    assert kernels.on_tensor_cores(frame("kernels", [kernel(name, 0, 1)])).tolist() == [tensor_cores]


def test_fp32_gemm_rule_fires_only_without_any_half_precision_gemm():
    sgemm = kernel("ampere_sgemm_128x64_tn", 0, 900)
    nvjet = kernel("nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT", 1000, 100)
    only_fp32 = kernels.gemm_precision(name_totals(frame("kernels", [sgemm, nvjet]))).set_index("precision")
    assert only_fp32.loc["fp32", "time_pct"] == pytest.approx(90.0)
    assert only_fp32.loc[kernels.UNKNOWN_PRECISION, "instances"] == 1  # nvjet names carry no precision
    gpu_bound = clock(2_000, busy=[(0, 900), (1000, 1100)], waits=[(0, 2_000)])
    [finding] = rules.fp32_gemm(only_fp32.reset_index(), gpu_bound)
    assert finding.severity == "warning" and "fp32 90.0% of GEMM time" in finding.evidence
    assert finding.gain_pct == pytest.approx(100 * 0.5 * 900 / 2_000)  # bf16 takes at most half the time
    assert rules.fp32_gemm(only_fp32.reset_index(), gpu_bound, run_precision="bfloat16") == []
    bf16 = kernel(
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64>(T1::Params)", 2000, 10, "Kernel2"
    )
    assert rules.fp32_gemm(kernels.gemm_precision(name_totals(frame("kernels", [sgemm, bf16]))), gpu_bound) == []


def test_value_checks_are_boolean_reductions_and_comparisons_of_floating_values():
    """isnan (x != x on bf16) and any() over its booleans count; a comparison of integer ids (a mask test) and a
    sum do not."""
    elementwise = "void at::native::vectorized_elementwise_kernel<(int)4, at::native::{}, std::array<char *, 3>>(int)"
    reduce = "void at::native::reduce_kernel<(int)512, (int)1, at::native::ReduceOp<{}>>(T1)"
    totals = name_totals(
        frame(
            "kernels",
            [
                kernel(
                    elementwise.format(
                        "BinaryFunctor<c10::BFloat16, c10::BFloat16, bool, "
                        "at::native::<unnamed>::CompareEqFunctor<c10::BFloat16>>"
                    ),
                    0,
                    30,
                ),
                kernel(
                    reduce.format(
                        "bool, at::native::func_wrapper_t<bool, at::native::or_kernel_cuda(at::TensorIterator &)>"
                    ),
                    30,
                    40,
                ),
                kernel(
                    elementwise.format(
                        "AUnaryFunctor<long, long, bool, at::native::<unnamed>::CompareEqFunctor<long>>"
                    ),
                    70,
                    5,
                ),
                kernel(
                    reduce.format("float, at::native::func_wrapper_t<float, at::native::sum_functor<float>>"), 75, 9
                ),
            ],
        )
    )
    assert sorted(kernels.value_checks(totals)["total_ns"]) == [30, 40]
    assert kernels.value_checks(totals.iloc[2:]).empty


def test_unaligned_gemms_are_tensor_core_gemms_whose_loads_are_under_16_bytes():
    """`_alignN` times the element size of the precision in the name: bf16 align1 (2 bytes) and fp16 align4 (8)
    count; bf16 align8 (16) and tf32 align4 (16) do not, nor a SIMT sgemm's align1 (rotary embeddings' outer
    product takes one whatever its strides), nor a name without a precision."""
    totals = name_totals(
        frame(
            "kernels",
            [
                kernel("void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1>(T1)", 0, 700),
                kernel("void cutlass::Kernel2<cutlass_80_tensorop_f16_s16816gemm_f16_64x64_nn_align4>(T1)", 700, 100),
                kernel("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_bf16_64x64_tn_align8>(T1)", 800, 50),
                kernel("void cutlass::Kernel2<cutlass_80_tensorop_tf32_s1688gemm_tf32_64x64_tn_align4>(T1)", 850, 50),
                kernel("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(T1::Params)", 900, 50),
                kernel("void cutlass::Kernel2<cutlass_80_tensorop_s16816gemm_64x64_tn_align1>(T1)", 950, 50),
            ],
        )
    )
    unaligned = kernels.unaligned_gemms(totals)
    assert unaligned[["precision", "alignment_bytes", "total_ns"]].values.tolist() == [
        ["bf16", 2, 700],
        ["fp16", 8, 100],
    ]
    gpu_bound = clock(2_000, busy=[(0, 1_000)], waits=[(0, 2_000)])
    [finding] = rules.unaligned_gemm(unaligned, gpu_bound)
    slow = rules.ALIGNMENT_SLOWDOWN
    saved = 700 * (1 - 1 / slow[2]) + 100 * (1 - 1 / slow[4])  # 8-byte loads: the 4-byte entry, the widest below
    assert finding.gain_pct == pytest.approx(100 * saved / 2_000, abs=1e-3)
    assert finding.severity == "warning" and "pad_to_multiple_of=64" in finding.recommendation
    assert rules.unaligned_gemm(kernels.unaligned_gemms(totals.iloc[2:]), gpu_bound) == []


def test_fusing_runs_saves_what_the_cpu_waits_for_and_the_host_time_of_the_launches_it_removes():
    """Three elementwise kernels and a norm back to back (400 ns) fused take as long as the longest (100 ns):
    300 ns of GPU time, with the GPU's next kernel queued behind them. That shortens the step while the CPU
    waits for the GPU, and beyond that by the host time of the launches fusion removes: 3 of the step's 6
    kernels, so half the host's launch path (each launch with the stretch since the thread's last one)."""
    streaming = frame(
        "kernels",
        [
            kernel("elementwise_kernel", 0, 100),
            kernel("elementwise_kernel", 100, 100),
            kernel("vectorized_layer_norm_kernel", 200, 100),
            kernel("elementwise_kernel", 300, 100),
            kernel("nvjet_sm90_x", 400, 100),
            kernel("elementwise_kernel", 500, 100),
        ],
    )  # alone: nothing to fuse with
    launches = frame("cuda_api", [api("cudaLaunchKernel", 160 * i, 60, i) for i in range(6)])  # 5 x 160 ns
    families, mix = kernels.family_summary(name_totals(streaming)), kernels.kernel_mix(name_totals(streaming))
    chains = gains.fusable_chains(store(streaming, launches), pd.DataFrame(), 1_000)
    assert (chains.runs, chains.queued_runs, chains.kernels, chains.total_ns, chains.fused_ns) == (1, 1, 4, 400, 100)
    assert chains.saved_by_step.tolist() == [300.0]  # the whole capture: no step ranges
    assert (chains.removed_by_step.tolist(), chains.kernels_by_step.tolist()) == ([3.0], [6.0])
    assert chains.launch_path_by_step.tolist() == [800.0]
    [waiting] = rules.memory_bound_mix(families, mix, chains, clock(1_000, [(0, 600)], waits=[(0, 1_000)]))
    assert waiting.severity == "warning" and waiting.gain_pct == pytest.approx(30.0)
    # the host never waits: the removed launches free 400 ns of its launch path, more than the GPU saves
    [host_bound] = rules.memory_bound_mix(families, mix, chains, clock(1_000, [(0, 600)]))
    assert host_bound.gain_pct == pytest.approx(30.0)
    # with no launch calls traced, nothing frees the host: the GPU's saving cannot shorten the step
    no_calls = gains.fusable_chains(store(streaming), pd.DataFrame(), 1_000)
    [starved] = rules.memory_bound_mix(families, mix, no_calls, clock(1_000, [(0, 600)]))
    assert starved.severity == "info" and starved.gain_pct == 0
    assert "the CPU waited for the GPU only 0.000 ms per step" in starved.evidence
    # with 24 more GEMMs the run's 3 removed launches are 10% of 30: 80 ns of host time, below the GPU's 300
    gemms = [kernel("nvjet_sm90_x", 600 + 10 * i, 10) for i in range(24)]
    many = frame("kernels", [*streaming.to_dict("records"), *gemms])
    many_chains = gains.fusable_chains(store(many, launches), pd.DataFrame(), 1_000)
    totals = name_totals(many)
    [capped] = rules.memory_bound_mix(
        kernels.family_summary(totals), kernels.kernel_mix(totals), many_chains, clock(1_000, [(0, 840)])
    )
    assert capped.gain_pct == pytest.approx(8.0)
    # a run followed by idle (the GPU waiting for the host) saves nothing: the next kernel would only wait longer
    idle_after = frame("kernels", [*streaming.to_dict("records")[:4], kernel("nvjet_sm90_x", 400 + 6_000, 100)])
    assert gains.fusable_chains(store(idle_after, launches), pd.DataFrame(), 10_000).saved_by_step.tolist() == [0.0]
    compute = frame("kernels", [kernel("elementwise_kernel", 0, 300), kernel("nvjet_sm90_x", 300, 700)])
    totals = name_totals(compute)
    assert (
        rules.memory_bound_mix(
            kernels.family_summary(totals),
            kernels.kernel_mix(totals),
            gains.fusable_chains(store(compute), pd.DataFrame(), 1_000),
            clock(1_000),
        )
        == []
    )


# ---------------------------------------------------------------- memory operations


def memop(
    kind: str, start: int, duration: int, nbytes: int, src: str | None, dst: str | None, correlation: int = 0
) -> dict:
    operation = "[CUDA memset]" if kind == "memset" else f"[CUDA memcpy {kind}]"
    return {
        "start": start,
        "end": start + duration,
        "duration": duration,
        "operation": operation,
        "bytes": nbytes,
        "device_id": 0,
        "stream_id": 7,
        "pid": 7,
        "correlation_id": correlation,
        "copy_kind": kind,
        "src_kind": src,
        "dst_kind": dst,
    }


def test_size_summary_follows_gpumemsizesum_statistics():
    ops = frame(
        "memops",
        [memop("HtoD", i * 10, 5, b, "Pinned", "Device") for i, b in enumerate([1, 2, 10, 20])]
        + [memop("memset", 100, 5, 8, None, "Device")],
    )
    sizes = memory.size_summary(EventStore.from_frames(memops=ops)).set_index("operation")
    htod = sizes.loc["[CUDA memcpy HtoD]"]
    assert (htod.total_bytes, htod["count"], htod.min_bytes, htod.max_bytes) == (33, 4, 1, 20)
    assert htod.med_bytes == 6.0 and htod.avg_bytes == 8.25  # unrounded, as nsys's bytes
    assert htod.stddev_bytes == pytest.approx(np.std([1, 2, 10, 20], ddof=1))
    assert sizes.loc["[CUDA memset]", "stddev_bytes"] == 0.0
    assert list(sizes.index) == ["[CUDA memcpy HtoD]", "[CUDA memset]"]


def test_kind_shares_of_gpu_time_and_pageable_host_memory():
    ks = frame("kernels", [kernel("k", 0, 800)])
    ops = frame(
        "memops",
        [
            memop("HtoD", 1000, 100, 4_000_000, "Pageable", "Device"),
            memop("HtoD", 2000, 20, 1000, "Pinned", "Device"),
            memop("DtoH", 3000, 30, 8, "Device", "Pinned"),
            memop("DtoD", 4000, 40, 2_000_000, "Device", "Device"),
            memop("memset", 5000, 10, 64, None, "Device"),
        ],
    )
    kernel_ns = gpu.kernel_totals(store(ks))["total_ns"]
    assert kernel_ns == 800
    op_store = EventStore.from_frames(memops=ops)
    memop_ns = memory.totals(op_store)["ns"]
    assert memop_ns == 200
    shares = memory.kind_share(kernel_ns, memop_ns, op_store).set_index("copy_kind")
    assert shares["gpu_time_pct"].to_dict() == pytest.approx({"HtoD": 12.0, "DtoD": 4.0, "DtoH": 3.0, "memset": 1.0})
    assert shares.loc["DtoD", "gb_per_s"] == pytest.approx(2_000_000 / 40)  # bytes per ns = GB/s
    host = memory.host_memory(op_store)
    assert host[["copy_kind", "host_memory", "instances"]].values.tolist() == [
        ["DtoH", "Pinned", 1],
        ["HtoD", "Pageable", 1],
        ["HtoD", "Pinned", 1],
    ]
    crossing = memory.interconnect_share(kernel_ns, memop_ns, op_store)
    assert (crossing["count"], crossing["ns"], crossing["gpu_time_pct"]) == (3, 150, 15.0)
    copies = memory.CopyCalls(op_store, gpu.busy_unions(op_store).kernels)  # no kernel runs beside any of them
    shares = memory.kind_share(kernel_ns, memop_ns, op_store)
    [verdict] = rules.interconnect(shares, host, crossing, 1000, copies, clock(6_000, waits=[(0, 6_000)]))
    assert verdict.gain_pct == pytest.approx(100 * 150 / 6_000)  # HtoD 100 + 20, DtoH 30: not DtoD, not memset
    assert verdict.severity == "info" and verdict.title.endswith("is not the limit")
    assert "1 of 3 host copies use pageable memory" in verdict.evidence
    [limiting] = rules.interconnect(shares, host, crossing, 1000, copies, clock(1_500, waits=[(0, 1_500)]))
    assert limiting.severity == "warning" and "can limit the step" in limiting.title  # 100 of 1,500 ns
    [running_ahead] = rules.interconnect(shares, host, crossing, 1000, copies, clock(1_500))
    assert running_ahead.title.endswith("is not the limit") and running_ahead.gain_pct == 0


def test_copy_kind_comes_from_the_operation_name_when_a_loader_lacks_it():
    ops = frame("memops", [memop("HtoD", 0, 1, 1, None, None), memop("memset", 5, 1, 1, None, None)])
    for given in (ops.drop(columns=["copy_kind"]), ops.assign(copy_kind=pd.NA)):
        assert EventStore.from_frames(memops=given).frame("memops")["copy_kind"].tolist() == ["HtoD", "memset"]


def test_a_frame_of_memory_operations_holds_each_label_once_and_the_views_text():
    """EventStore.named: 0.4M copies at 40M kernels held 0.12 GB of repeated label strings where DuckDB made one a row."""
    rows = [memop("HtoD", 10 * i, 1, 1, "Pinned", "Device") for i in range(50)] + [
        memop("memset", 900, 1, 1, None, None)
    ]
    events = EventStore.from_frames(memops=frame("memops", rows))
    got = events.frame("memops")
    text = events.query('SELECT operation, copy_kind, src_kind, dst_kind FROM memops ORDER BY start, "row"')
    for column in text:
        pd.testing.assert_series_equal(got[column], text[column])
        assert len({id(value) for value in got[column].tolist() if isinstance(value, str)}) <= 2


# ---------------------------------------------------------------- utilisation and gaps


def test_covered_ns_equals_a_brute_force_count():
    rng = np.random.default_rng(0)
    starts = rng.integers(0, 900, 40)
    spans = pd.DataFrame({"start": starts, "end": starts + rng.integers(1, 60, 40)})
    merged = intervals.union(spans)
    timeline = np.zeros(1000, dtype=bool)
    for s, e in zip(spans["start"], spans["end"]):
        timeline[s:e] = True
    windows = rng.integers(0, 1000, (50, 2))
    lo, hi = windows.min(axis=1), windows.max(axis=1)
    assert intervals.covered_ns(merged, lo, hi).tolist() == [int(timeline[a:b].sum()) for a, b in zip(lo, hi)]
    assert (merged["start"].to_numpy()[1:] > merged["end"].to_numpy()[:-1]).all()  # disjoint, sorted


def test_gaps_timeline_and_steps_on_two_devices():
    ks = frame(
        "kernels",
        [
            kernel("a", 1_000, 1_000),
            kernel("b", 1_500, 1_000),
            kernel("c", 5_000_000, 5_000),
            kernel("d", 10, 100, device=1),
            kernel("e", 200, 100, device=1),
        ],
    )
    ops = frame("memops", [memop("HtoD", 2_600_000, 400_000, 1, "Pinned", "Device")])
    events = EventStore.from_frames(kernels=ks, memops=ops)
    by_device = gpu.busy_by_device(events)
    gaps = utilisation.idle_gaps(by_device)
    # device 0 busy [1000, 2500), [2.6 ms, 3.0 ms), [5.0 ms, 5.005 ms): gaps 2.5975 ms and 2.0 ms; device 1: none
    assert gaps[["device_id", "start", "end"]].values.tolist() == [[0, 2_500, 2_600_000], [0, 3_000_000, 5_000_000]]
    timeline = utilisation.utilisation_timeline(events, by_device, chunks=4)
    dev0 = timeline[timeline["device_id"] == 0]
    chunk = (5_005_000 - 1_000) / 4
    covered = np.array(dev0["busy_pct"]) / 100 * (dev0["end"] - dev0["start"]).to_numpy()
    assert covered.sum() == pytest.approx(1_500 + 400_000 + 5_000)  # chunks cover the span: busy adds up
    assert dev0["kernels"].tolist() == [2, 0, 0, 1] and dev0["tiny_kernels"].tolist() == [2, 0, 0, 1]
    assert dev0["busy_pct"].iloc[2] == pytest.approx(100 * 400_000 / chunk)  # [2.503, 3.754) ms holds the copy
    steps = pd.DataFrame(
        {"step": [1, 2], "start": [0, 2_500_000], "end": [2_500_000, 5_100_000], "duration": [2_500_000, 2_600_000]}
    )
    per_step = utilisation.step_utilisation(steps, by_device).set_index(["step", "device_id"])["gpu_busy_ns"]
    assert per_step.to_dict() == {(1, 0): 1_500, (2, 0): 405_000, (1, 1): 200, (2, 1): 0}


def test_gap_causes_say_what_the_feeding_thread_did():
    ks = frame("kernels", [kernel("a", 100, 100, correlation=1), kernel("b", 3_000_100, 100, correlation=2)])
    osrt = frame(
        "osrt",
        [
            {
                "start": 500_000,
                "end": 1_500_000,
                "duration": 1_000_000,
                "name": "read",
                "global_tid": MAIN,
                "pid": 7,
                "tid": 7,
            },
            {
                "start": 0,
                "end": 4_000_000,
                "duration": 4_000_000,
                "name": "poll",
                "global_tid": (7 << 24) | 99,
                "pid": 7,
                "tid": 99,
            },
        ],
    )  # not a feeder
    ranges = frame("nvtx", [nvtx_range("step 1", 0, 4_000_000), nvtx_range("data", 100, 2_000_000)])
    calls = frame("cuda_api", [api("cudaLaunchKernel", 3_000_000, 50, 2)])
    tables = TraceTables(
        source_path="t",
        span_ns=4_000_000,
        events=EventStore.from_frames(kernels=ks, cuda_api=calls, nvtx=ranges, osrt=osrt),
    )
    gaps = utilisation.idle_gaps(gpu.busy_by_device(tables.events))
    assert gaps[["start", "end"]].values.tolist() == [[200, 3_000_100]]
    causes = utilisation.gap_causes(gaps, tables, {MAIN: "python (main, tid 7)"})
    found = {(r.source, r.name): r.overlap_ns for r in causes.itertuples()}
    assert found == {
        ("OS runtime", "read"): 1_000_000,
        ("CUDA API", "cudaLaunchKernel"): 50,
        ("NVTX range", "data"): 1_999_800,  # the innermost range; `step 1` contains it
        (utilisation.OWN_CODE, "data"): 2_999_900 - 1_000_000 - 50,
    }
    result = analyze(tables)
    idle = result.tables["idle_causes"]
    assert {(r.cause, r.source, r.name, r.range): r.idle_ns for r in idle.itertuples()} == {
        # kernel a's launch was not traced: no thread to name
        ("unattributed", "none", idle_causes.UNKNOWN_THREAD, idle_causes.NO_RANGE): 100,
        # b was launched at 3.00005 ms and started 50 ns later: queued on the GPU
        ("queued", "GPU", "launched before the GPU started it", idle_causes.NO_RANGE): 50,
        ("host overhead", "CUDA API", "cudaLaunchKernel", "step 1"): 50,
        ("OS call", "OS runtime", "read", "data"): 1_000_000,
        # own code in a gap over 1 ms, cut where `data` ends
        ("host work", "own code", "data", "data"): 499_800 + 500_000,
        ("host work", "own code", "step 1", "step 1"): 1_000_000,
        # after b, nothing follows: the thread that launched b; a gap under 1 ms
        ("host overhead", "own code", "step 1", "step 1"): 999_800,
    }
    assert idle["idle_ns"].sum() == 4_000_000 - 200  # every idle nanosecond of the step, once
    found = {f.rule: f for f in result.findings}
    assert found["host_work"].gain_pct == pytest.approx(100 * 1_000_000 / 4_000_000, abs=1e-3)  # not the data range's
    assert "`step 1` 1.000 ms" in found["host_work"].evidence


def test_launch_bound_is_the_idle_while_the_host_launches_late():
    """Kernels of 2 µs every 20 µs, each launched by an 8 µs call that returns 5 µs before it starts: the GPU
    idles 18 µs in each gap, 13 of them while the host ran its own code or the launch, 5 queued."""
    ks = frame("kernels", [kernel("k", i * 20_000, 2_000, correlation=i + 1) for i in range(100)])
    calls = frame("cuda_api", [api("cudaLaunchKernel", i * 20_000 - 13_000, 8_000, i + 1) for i in range(1, 100)])
    ranges = frame("nvtx", [nvtx_range("step 1", 2_000, 99 * 20_000 + 2_000)])  # from the first kernel's end
    tables = TraceTables(
        source_path="t", span_ns=2_000_000, events=EventStore.from_frames(kernels=ks, cuda_api=calls, nvtx=ranges)
    )
    result = analyze(tables)
    idle = result.tables["idle_causes"].groupby(["cause", "source"])["idle_ns"].sum().to_dict()
    assert idle == {
        ("host overhead", "CUDA API"): 99 * 8_000,
        ("host overhead", "own code"): 99 * 5_000,
        ("queued", "GPU"): 99 * 5_000,
    }
    [finding] = [f for f in result.findings if f.rule == "launch_bound"]
    assert finding.severity == "warning"
    assert finding.gain_pct == pytest.approx(100 * 13_000 / 20_000, abs=1e-3)


def _launch_blocking_trace(blocking: bool) -> TraceTables:
    """100 kernels of 60 µs every 80 µs in one step range. Each launch call begins 5 µs before its kernel and,
    `blocking`, returns 2 µs after it ends (CUDA_LAUNCH_BLOCKING=1), else after 8 µs (queued work)."""
    ks = frame("kernels", [kernel("k", i * 80_000, 60_000, correlation=i + 1) for i in range(100)])
    calls = frame(
        "cuda_api",
        [api("cudaLaunchKernel", i * 80_000 - 5_000, 67_000 if blocking else 8_000, i + 1) for i in range(1, 100)],
    )
    ranges = frame("nvtx", [nvtx_range("step 1", 60_000, 99 * 80_000 + 60_000)])  # from the first kernel's end
    events = EventStore.from_frames(kernels=ks, cuda_api=calls, nvtx=ranges)
    return TraceTables(source_path="t", span_ns=8_000_000, events=events)


def test_synchronous_issuers_are_the_calls_that_return_after_their_long_work():
    """Launches that return after their 60 µs kernels are a synchronous issuer, and their calls are waits; the
    same launches returning before their kernels are not; nor are calls returning after 2 µs kernels (a short
    kernel on an idle GPU can end before an asynchronous launch returns)."""
    blocking = _launch_blocking_trace(blocking=True).events
    waits = cuda.host_wait_calls(blocking)
    [launch] = cuda.launch_ids(blocking)
    assert waits.synchronous == ((MAIN, (launch,)),)
    assert views.synchronous_launches(blocking, waits)
    assert cuda.waited_by_thread(blocking, waits).to_dict() == {MAIN: 99 * 67_000}
    queued = _launch_blocking_trace(blocking=False).events
    assert cuda.host_wait_calls(queued).synchronous == ()
    short = frame("kernels", [kernel("k", i * 20_000, 2_000, correlation=i + 1) for i in range(100)])
    calls = frame("cuda_api", [api("cudaLaunchKernel", i * 20_000 - 3_000, 8_000, i + 1) for i in range(100)])
    assert cuda.host_wait_calls(store(short, calls)).synchronous == ()


def test_a_copy_from_pageable_memory_is_a_synchronous_issuer_though_its_call_returns_just_before_it_ends():
    """A staged copy's call returns once its last chunk is queued, a microsecond or so before the copy ends: it was
    open for nearly all of the copy, which queued work never is (its call returns before the work has run)."""
    ops = pd.DataFrame(
        [
            memop("HtoD", i * 30_000_000 + 3_000_000, 24_000_000, 128 << 20, "Pageable", "Device", i + 1)
            for i in range(4)
        ]
    )
    calls = frame("cuda_api", [api("cudaMemcpyAsync", i * 30_000_000, 27_000_000 - 1_000, i + 1) for i in range(4)])
    [copy] = cuda.name_ids(EventStore.from_frames(cuda_api=calls), lambda name: True)
    assert cuda.synchronous_issuers(EventStore.from_frames(memops=ops, cuda_api=calls)) == ((MAIN, (copy,)),)
    queued = frame("cuda_api", [api("cudaMemcpyAsync", i * 30_000_000, 3_000_000 + 5_000, i + 1) for i in range(4)])
    assert cuda.synchronous_issuers(EventStore.from_frames(memops=ops, cuda_api=queued)) == ()


def test_read_work_is_the_reduction_before_a_small_read_and_the_elementwise_kernels_before_it():
    """A GEMM, a conversion, an abs, a memset and a mean, then a 4-byte read: the mean, abs and conversion made the
    value (the memset aside, the GEMM not), and the mean (`producer`) is the kernel that computed it. A read after a
    GEMM made by no reduction, and a 4 MB copy, are not reads of values."""
    elementwise = "void at::native::vectorized_elementwise_kernel<4, {}>(int, T2, T3)"
    mean = "void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps<float>>>(T3)"
    gemm = "nvjet_sm90_tst_64x64_64x13_2x1_v_bz_NNT"
    ks = frame(
        "kernels",
        [
            kernel(gemm, 0, 100),
            kernel(elementwise.format("direct_copy_kernel"), 110, 20, "unrolled_elementwise_kernel"),
            kernel(elementwise.format("AbsFunctor<float>"), 140, 20, "vectorized_elementwise_kernel"),
            kernel(mean, 180, 30, "reduce_kernel"),
            kernel(gemm, 1_000, 100),
            kernel(mean, 2_000, 30, "reduce_kernel"),
        ],
    )
    ops = pd.DataFrame(
        [
            memop("memset", 170, 2, 4, None, None),
            memop("DtoH", 220, 2, 4, "Device", "Pageable"),
            memop("DtoH", 1_110, 2, 4, "Device", "Pageable"),
            memop("DtoH", 2_040, 500, 4 << 20, "Device", "Pageable"),
        ]
    )
    work = gains.read_work(EventStore.from_frames(kernels=ks, memops=ops))
    assert work.to_dict("records") == [{"start": 220, "kernels": 3, "ns": 70, "producer": "reduce_kernel"}]


def test_idle_between_launches_that_wait_for_their_kernels_is_theirs():
    """With every launch waiting for its kernel, the 20 µs the GPU idles between kernels (the launch's return,
    the host's own code and the next launch) is synchronous launches', and no launch_bound finding remains."""
    result = analyze(_launch_blocking_trace(blocking=True))
    rules = {f.rule: f for f in result.findings}
    assert "launch_bound" not in rules
    finding = rules["synchronous_launches"]
    assert finding.severity == "warning"
    assert finding.gain_pct == pytest.approx(100 * 20_000 / 80_000, abs=1e-3)
    assert "CUDA_LAUNCH_BLOCKING" in finding.recommendation
    queued = {f.rule: f for f in analyze(_launch_blocking_trace(blocking=False)).findings}
    assert "synchronous_launches" not in queued


def test_host_work_inside_a_range_nested_in_data_counts_as_data():
    """A loop that marks its input work more finely (`tokenize` inside `data`): the idle while the thread ran it
    is in `data`, as the data_stall view reads it, not in the innermost range; outside `data`, the innermost."""
    ks = frame("kernels", [kernel("k", 0, 1_000, correlation=1), kernel("k", 3_000_000, 1_000, correlation=2)])
    ks = pd.concat([ks, frame("kernels", [kernel("k", 6_000_000, 1_000, correlation=3)])], ignore_index=True)
    calls = frame(
        "cuda_api", [api("cudaLaunchKernel", 2_990_000, 5_000, 2), api("cudaLaunchKernel", 5_990_000, 5_000, 3)]
    )
    ranges = frame(
        "nvtx",
        [
            nvtx_range("step 1", 1_000, 6_001_000),
            nvtx_range("data", 1_000, 2_990_000),
            nvtx_range("tokenize", 2_000, 2_900_000),  # inside data
            nvtx_range("log", 3_002_000, 5_900_000),  # outside data
        ],
    )
    events = EventStore.from_frames(kernels=ks, cuda_api=calls, nvtx=ranges)
    table = analyze(TraceTables(source_path="t", span_ns=6_001_000, events=events)).tables["idle_causes"]
    own = table[table["source"] == "own code"].groupby("range")["idle_ns"].sum()
    assert set(own.index) <= {"data", "log", "step 1"}
    assert own["data"] == 2_990_000 - 1_000 and own["log"] == 5_900_000 - 3_002_000


# ---------------------------------------------------------------- CUDA API: copies, syncs


def test_copy_rules_follow_nsys_semantics():
    calls = [
        api("cudaMemcpy", 0, 5_000, 1),
        api("cudaMemcpy", 10_000, 5_000, 2),
        api("cudaMemcpyAsync", 20_000, 3_000, 3),
        api("cudaMemcpyAsync", 30_000, 3_000, 4),
        api("cudaMemset", 40_000, 1_000, 5),
        api("cudaMemsetAsync", 50_000, 1_000, 6),
    ]
    ops = frame(
        "memops",
        [
            memop("DtoH", 1_000, 100, 4, "Device", "Pageable", correlation=1),
            memop("HtoD", 11_000, 100, 1_000, "Pageable", "Device", correlation=2),  # small: skipped
            memop("HtoD", 21_000, 100, 16_384, "Pageable", "Device", correlation=3),
            memop("HtoD", 31_000, 100, 16_384, "Pinned", "Device", correlation=4),
            memop("memset", 41_000, 10, 8, None, "Pinned", correlation=5),
            memop("memset", 51_000, 10, 8, None, "Pinned", correlation=6),
        ],
    )
    device_side = frame(
        "memops",
        [memop("DtoD", 61_000, 10, 8, "Device", "Device"), memop("memset", 62_000, 10, 8, None, "Device")],
    )
    events = EventStore.from_frames(
        cuda_api=frame("cuda_api", calls),
        nvtx=frame("nvtx", [nvtx_range("data", 0, 100_000)]),
        memops=pd.concat([ops, device_side], ignore_index=True),
    )
    # each rule reads its operations with their calls, and no device-side one
    copies = memory.CopyCalls(events, gpu.busy_unions(events).kernels)
    wheres = (rules.SYNC_MEMCPY_ROWS, rules.PAGEABLE_ROWS, rules.BLOCKING_MEMSET_ROWS, rules.CROSSING_ROWS)
    read = pd.concat([ops for where in wheres for ops in copies.batches(where, re.compile(""))])
    assert set(read["start"]) == set(ops["start"]) and (read["api_start"] < read["start"]).all()
    labels = {MAIN: "python (main, tid 7)"}
    capture = clock(1_000_000, busy=ops[["start", "end"]].itertuples(index=False))
    table = views.idle_views(idle_causes.idle_causes(events, capture, pd.DataFrame()), pd.DataFrame())
    [sync] = rules.sync_memcpy(copies, capture, labels, events, table)
    assert sync.title == "1 synchronous cudaMemcpy calls block the CPU for 0.005 ms"
    assert "mostly in NVTX `data` (1 of 1)" in sync.evidence
    # idle_causes' rows for synchronous cudaMemcpy calls: each 5 µs call less its copy's 100 ns, and the 100 ns
    # of launching that each call delayed; the small HtoD copy's call too (the table names calls, not copies); and
    # the 5 µs between the two calls, which sync one after the other (idle._Pieces.between_reads)
    assert sync.gain_pct == pytest.approx(100 * (2 * (5_000 - 100) + 2 * 100 + 5_000) / 1_000_000)
    [pageable] = rules.pageable_memcpy(copies, capture, labels, events, table)
    assert pageable.title.startswith("1 asynchronous copies use pageable") and pageable.severity == "info"
    # the GPU idle during the pageable copy's call, less its copy's 100 ns: idle_causes names each copy call with
    # the host memory it touched, so the pinned copy's call is copy_calls'
    assert pageable.gain_pct == pytest.approx(100 * (3_000 - 100) / 1_000_000)
    assert set(table.loc[table["rule"] == "pageable_memcpy", "name"]) == {"cudaMemcpyAsync (pageable)"}
    [memset] = rules.sync_memset(copies, capture, labels, table)
    assert memset.title.startswith("1 synchronous cudaMemset") and "Pinned" in memset.evidence
    assert memset.gain_pct == pytest.approx(100 * 1_000 / 1_000_000)  # its call; the Async one is copy_calls'
    claimed = table.groupby("rule")["idle_ns"].sum().to_dict()
    assert claimed["copy_calls"] == 1_000 + 3_000 - 100 and sum(claimed.values()) == table["idle_ns"].sum()
    # the same correlation id in another process is another call: nothing joins
    elsewhere = EventStore.from_frames(cuda_api=frame("cuda_api", calls), memops=ops.assign(pid=8))
    assert not list(memory.CopyCalls(elsewhere, {}).batches("true", re.compile("")))
    assert len(next(memory.CopyCalls(elsewhere, {}).batches("true"))) == len(ops)


def test_copy_rules_sum_their_operations_a_batch_at_a_time(monkeypatch):
    """The copy rules read thousands of operations in batches of 2,048 and say what they say when one
    batch holds them all: counts, bytes, the exact median size, threads and ranges."""
    n, sizes = 3_000, [4_096 * (1 + k % 7) for k in range(3_000)]
    calls, ops = [], []
    for k in range(n):
        at = 10_000 * k
        calls += [
            api("cudaMemcpy", at, 3_000, 2 * k + 1),
            api("cudaMemcpyAsync", at + 5_000, 2_000, 2 * k + 2, AUTOGRAD),
        ]
        ops += [
            memop("DtoH", at + 1_000, 500, 8, "Device", "Pinned", correlation=2 * k + 1),
            memop("HtoD", at + 5_500, 700, sizes[k], "Pageable", "Device", correlation=2 * k + 2),
        ]
    events = EventStore.from_frames(
        cuda_api=frame("cuda_api", calls),
        nvtx=frame("nvtx", [nvtx_range("data", 0, 10_000 * n)]),
        memops=frame("memops", ops),
    )
    copies = memory.CopyCalls(events, gpu.busy_unions(events).kernels)
    capture = clock(10_000 * n, busy=[(op["start"], op["end"]) for op in ops])
    labels = {MAIN: "python (main, tid 7)", AUTOGRAD: "pt_autograd_0 (tid 9)"}
    shares = memory.kind_share(0, 3_600_000, events)
    crossing = memory.interconnect_share(0, 3_600_000, events)
    table = views.idle_views(idle_causes.idle_causes(events, capture, pd.DataFrame()), pd.DataFrame())

    def findings():
        return [
            *rules.sync_memcpy(copies, capture, labels, events, table),
            *rules.pageable_memcpy(copies, capture, labels, events, table),
            *rules.interconnect(shares, memory.host_memory(events), crossing, 3_600_000, copies, capture),
        ]

    whole = findings()
    monkeypatch.setattr(events_module, "BATCH_VECTORS", 1)
    assert len(list(copies.batches(rules.CROSSING_ROWS))) == 3  # 6,000 operations
    assert findings() == whole
    sync, pageable, _ = whole
    assert (
        sync.title.startswith(f"{n} synchronous cudaMemcpy calls")
        and f"mostly in NVTX `data` ({n} of {n})" in sync.evidence
    )
    assert f"median {np.median(sizes):,.0f} B" in pageable.evidence and "pt_autograd_0" in pageable.evidence


def test_syncs_in_steps_are_counted_per_step():
    calls = frame(
        "cuda_api",
        [
            api("cudaStreamSynchronize", 100, 4_000, 1),
            api("cudaStreamSynchronize", 6_000, 2_000, 2),
            api("cudaDeviceSynchronize", 12_000, 1_000, 3, tid=AUTOGRAD),
            api("cudaMemcpy", 14_000, 1_000, 6),  # a copy: sync_memcpy's
            api("cudaLaunchKernel", 16_000, 2_000, 4),
            api("cudaStreamSynchronize", 30_000, 5_000, 5),
        ],
    )  # after the last step
    steps = pd.DataFrame({"step": [1, 2], "start": [0, 10_000], "end": [10_000, 20_000], "duration": [10_000, 10_000]})
    events = store(cuda_api=calls)
    waits = cuda.host_wait_calls(events)
    # The GPU runs until 5,000, then from 5,500 to 7,000; the next work comes at 13,500.
    gpu_runs = clock(
        40_000,
        busy=[(0, 5_000), (5_500, 7_000), (13_500, 20_000)],
        waits=events.query(f'SELECT a.start, a."end" FROM cuda_api a WHERE {waits.where()}').itertuples(index=False),
        steps=steps,
    )
    # what idle_causes would hold: per step, the idle time in the syncs and the launches they delayed, and a
    # synchronous copy's (sync_memcpy's, not this rule's)
    table = views.idle_views(
        pd.DataFrame(
            {
                "step": [1, 2, 2, 1],
                "cause": ["synchronization"] * 3 + ["host overhead"],
                "source": ["CUDA API", "launches a call delayed", "CUDA API", "own code"],
                "name": ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "forward"],
                "range": ["forward"] * 4,
                "idle_ns": [2_000, 1_000, 500, 3_000],
                "pieces": [1, 1, 1, 1],
            }
        ),
        steps,
    )
    [finding] = rules.syncs_in_steps(waits, steps, {MAIN: "main", AUTOGRAD: "autograd"}, events, gpu_runs, table)
    assert "step 1: 2 calls, 0.006 ms; step 2: 1 calls, 0.001 ms" in finding.evidence
    assert "cudaMemcpy" not in finding.evidence
    assert list(table["rule"]) == ["sync_in_steps", "sync_in_steps", "sync_memcpy", "launch_bound"]
    assert finding.gain_pct == pytest.approx(100 * np.median([2_000, 1_000]) / 10_000)
    assert finding.severity == "warning" and finding.title.startswith("2 synchronizing CUDA calls per step")
    assert cuda.sync_calls(events, 100_000).set_index("name").loc["cudaStreamSynchronize", "calls"] == 3


def _many_syncs(calls_per_step: int, steps: int) -> tuple[EventStore, pd.DataFrame]:
    """`steps` steps of 100 µs, each with `calls_per_step` stream syncs of 10 ns (the first step's in NVTX
    `data`, the rest in `forward`, each on the thread that makes the calls: two threads take turns), and some
    calls after the last step."""
    rows, ranges = [], []
    for step in range(steps):
        first, tid = step * 100_000, MAIN if step % 2 else AUTOGRAD
        ranges.append(nvtx_range("data" if step == 0 else "forward", first, first + 90_000, tid))
        rows += [api("cudaStreamSynchronize_v3020", first + 20 * i, 10, i, tid) for i in range(calls_per_step)]
    rows += [api("cudaDeviceSynchronize", steps * 100_000 + 50 * i, 20, i) for i in range(10)]  # after the steps
    calls, ranges = frame("cuda_api", rows), frame("nvtx", ranges)
    steps_table = pd.DataFrame({"step": range(1, steps + 1), "start": ranges["start"], "end": ranges["end"]})
    return EventStore.from_frames(cuda_api=calls, nvtx=ranges), steps_table.assign(
        duration=steps_table["end"] - steps_table["start"]
    )


def test_syncs_in_steps_summed_in_batches_equal_one_batch(monkeypatch):
    """7,000 syncs: four batches of 2,048 where EventStore.batches fetches one DuckDB vector at a time, with a
    query for the calls' NVTX ranges between two batches (which once ended the batches' result)."""
    from sftprof.trace import events as event_store

    events, steps = _many_syncs(1_000, 7)
    waits = cuda.host_wait_calls(events)
    busy = [(step * 100_000, step * 100_000 + 5_000) for step in range(7)]
    waited = events.query(f'SELECT a.start, a."end" FROM cuda_api a WHERE {waits.where()}').itertuples(index=False)
    runs = clock(800_000, busy=busy, waits=waited, steps=steps)
    labels = {MAIN: "main", AUTOGRAD: "autograd"}
    table = views.idle_views(idle_causes.idle_causes(events, runs, steps), steps)
    [whole] = rules.syncs_in_steps(waits, steps, labels, events, runs, table)
    monkeypatch.setattr(event_store, "BATCH_VECTORS", 1)
    [batched] = rules.syncs_in_steps(waits, steps, labels, events, runs, table)
    assert batched == whole
    assert whole.title.startswith("1000 synchronizing CUDA calls per step")
    assert "Calls: cudaStreamSynchronize_v3020 x7000, on autograd, main" in whole.evidence
    assert "mostly in NVTX `forward` (6000 of 7000)" in whole.evidence


def test_a_union_of_calls_merged_in_batches_is_the_union_of_them(monkeypatch):
    from sftprof.trace import events as event_store

    events, _ = _many_syncs(1_000, 7)
    monkeypatch.setattr(event_store, "BATCH_VECTORS", 1)
    union = cuda.calls_union(events, cuda.host_wait_calls(events).where())
    calls = events.query('SELECT start, "end" FROM cuda_api ORDER BY start')
    pd.testing.assert_frame_equal(union.frame(), intervals.union(calls).reset_index(drop=True), check_dtype=False)
    assert len(union) == 7_010  # every call: none overlaps another


def test_sync_calls_are_summed_per_name_without_its_version():
    calls = frame(
        "cuda_api",
        [
            api("cudaStreamSynchronize_v3020", 0, 4_000, 1),
            api("cudaStreamSynchronize", 10_000, 1_000, 2),
            api("cudaStreamWaitEvent_v3020", 20_000, 30, 3),
            api("cudaLaunchKernel", 30_000, 9_000, 4),
        ],
    )
    table = cuda.sync_calls(store(cuda_api=calls), 100_000).set_index("name")
    assert table.loc["cudaStreamSynchronize", ["calls", "total_ns", "max_ns"]].tolist() == [2, 5_000, 4_000]
    assert table.loc["cudaStreamSynchronize", "avg_ns"] == 2_500.0
    assert table.loc["cudaStreamSynchronize", "blocks_host"] and not table.loc["cudaStreamWaitEvent", "blocks_host"]
    assert list(table.index) == ["cudaStreamSynchronize", "cudaStreamWaitEvent"]  # by time, and no launch


# ---------------------------------------------------------------- NVTX projection


def test_gpu_time_goes_to_the_innermost_range_on_the_launching_thread():
    ranges = frame(
        "nvtx",
        [
            nvtx_range("step 1", 0, 1_000),
            nvtx_range("forward", 100, 400),
            nvtx_range("attention", 200, 300),
            nvtx_range("step 2", 2_000, 3_000),
        ],
    )
    calls = frame(
        "cuda_api",
        [
            api("cudaLaunchKernel", 50, 10, 1),  # step 1 only
            api("cudaLaunchKernel", 150, 10, 2),  # forward
            api("cudaLaunchKernel", 210, 10, 3),  # attention in forward in step 1
            api("cudaLaunchKernel", 295, 10, 4),  # ends after attention: forward
            api("cudaLaunchKernel", 250, 10, 5, tid=AUTOGRAD),  # no range on that thread
            api("cudaLaunchKernel", 1_500, 10, 6),
        ],
    )  # between steps
    ks = frame("kernels", [kernel("k", 5_000 + c, 10 * c, correlation=c) for c in range(1, 8)])  # 7: not traced
    events = EventStore.from_frames(kernels=ks, cuda_api=calls, nvtx=ranges)
    projection = nvtx.gpu_time_by_range(events, {AUTOGRAD: "pt_autograd_0 (autograd, tid 9)"})
    by_range = projection.set_index("range")
    assert by_range["gpu_ns"].to_dict() == {
        "step 1": 10,
        "forward": 20 + 40,
        "attention": 30,
        "(no NVTX range, pt_autograd_0 (autograd, tid 9))": 50,
        "(no NVTX range, tid 7)": 60,
        nvtx.NOT_TRACED: 70,
    }
    assert by_range["gpu_ns"].sum() == ks["duration"].sum()
    assert by_range.loc["step 1", "inclusive_gpu_ns"] == 10 + 20 + 30 + 40
    assert by_range.loc["forward", "inclusive_gpu_ns"] == 20 + 30 + 40
    assert "step 2" not in by_range.index


# ---------------------------------------------------------------- compute- or memory-bound


def test_verdict_confidence_follows_the_evidence():
    mostly_streaming = {"compute_pct": 20.0, "memory_pct": 75.0, "tensor_core_pct": 18.0}
    names_only = boundness.verdict(mostly_streaming, 90.0, {})
    assert (names_only["kernels"], names_only["confidence"], names_only["host_bound"]) == (
        "memory-bound",
        "medium",
        False,
    )
    assert "--gpu-metrics-device=all" in names_only["basis"]
    mixed = boundness.verdict({**mostly_streaming, "memory_pct": 50.0, "compute_pct": 45.0}, 90.0, {})
    assert (mixed["kernels"], mixed["confidence"]) == ("mixed", "low")
    agreeing = {
        "dram read bandwidth [throughput %]": 55.0,
        "dram write bandwidth [throughput %]": 15.0,
        "sm issue [throughput %]": 30.0,
        "tensor active [throughput %]": 5.0,
    }
    assert boundness.verdict(mostly_streaming, 90.0, agreeing)["confidence"] == "high"
    tensor_busy = {**agreeing, "dram read bandwidth [throughput %]": 10.0, "tensor active [throughput %]": 70.0}
    measured = boundness.verdict(mostly_streaming, 90.0, tensor_busy)
    assert (measured["kernels"], measured["confidence"]) == ("compute-bound", "medium")
    assert "names alone would say memory-bound" in measured["basis"]
    idle = boundness.verdict(mostly_streaming, 12.0, {})
    finding = boundness.verdict_finding(idle, pd.DataFrame(columns=["precision", "time_pct"]))
    assert idle["host_bound"] and finding.title.startswith("Host-bound: the GPU is busy 12.0%")
    assert "confidence high" in finding.evidence and "memory-bound, confidence medium" in finding.evidence


def test_metric_means_use_only_samples_taken_while_the_gpu_worked():
    ks = frame("kernels", [kernel("k", 100, 100)])
    samples = pd.DataFrame(
        {
            "timestamp": [50, 150, 180, 250],
            "device_id": [0, 0, 0, 0],
            "metric": ["SM Issue [Throughput %]"] * 4,
            "value": [0, 60, 80, 0],
        }
    )
    events = EventStore.from_frames(kernels=ks, gpu_metrics=samples)
    means = boundness.metric_means_while_busy(events, gpu.busy_by_device(events))
    assert means == {"sm issue [throughput %]": 70.0}


_TWO_THREADS = """
import threading
import numpy as np, pandas as pd
from sftprof.trace import events as events_module
from sftprof.trace.events import EventStore
events = EventStore.from_frames(kernels=pd.DataFrame({"start": [1, 2], "end": [3, 4], "name": ["a", "b"], "device_id": 0}))
results = {}
def sums(offset):
    ops = pd.DataFrame({"x": np.arange(1000) + offset})
    results[offset] = {int(events.query("SELECT sum(x) + (SELECT count(*) FROM kernels) AS s FROM ops",
                                        ops=ops)["s"].iat[0]) for _ in range(200)}
threads = [threading.Thread(target=sums, args=(offset,)) for offset in (0, 10**6)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(sorted((k, sorted(v)) for k, v in results.items()))
"""


def test_event_store_queries_from_two_threads_each_see_their_own_frames():
    """analyze() queries the store from two threads, often with frames of the same name (`ops`).
    In a child process: a store that is not thread-safe can deadlock, holding the GIL."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _TWO_THREADS], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str([(0, [sum(range(1000)) + 2]), (10**6, [sum(range(1000)) + 1000 * 10**6 + 2])])


@pytest.mark.parametrize(
    "syncs, expected",
    [
        ([(AUTOGRAD, 1_000 + 50_000 * k) for k in range(10)], True),  # node after node, 50 µs apart
        ([(AUTOGRAD, 1_000 + 5_000_000 * k) for k in range(10)], False),  # a hook now and then: the queue refills
        ([(MAIN, 1_000 + 50_000 * k) for k in range(10)], False),  # the loop's own reads
    ],
)
def test_backward_syncs_are_close_synchronizations_made_by_the_autograd_thread(syncs, expected):
    calls = [api("cudaStreamSynchronize", start, 2_000, k, tid) for k, (tid, start) in enumerate(syncs)]
    calls.append(api("cudaStreamSynchronize", 90_000_000, 2_000, 99))  # the loss read once per step
    threads = pd.DataFrame({"global_tid": [MAIN, AUTOGRAD], "role": ["main", cpu.AUTOGRAD_ROLE]})
    assert views.backward_syncs(store(cuda_api=frame("cuda_api", calls)), threads) is expected


def _copies_then_syncs(nbytes: int) -> EventStore:
    """10 device-to-host copies of `nbytes`, each issued by cudaMemcpyAsync and waited for by the thread's next call,
    a cudaStreamSynchronize that begins while the copy still runs."""
    ops = pd.DataFrame(
        [memop("DtoH", i * 1_000_000 + 10_000, 400_000, nbytes, "Device", "Pinned", i + 1) for i in range(10)]
    )
    calls = [api("cudaMemcpyAsync", i * 1_000_000, 5_000, i + 1) for i in range(10)]
    calls += [api("cudaStreamSynchronize", i * 1_000_000 + 20_000, 400_000, 100 + i) for i in range(10)]
    return EventStore.from_frames(memops=ops, cuda_api=frame("cuda_api", calls))


def test_syncs_that_wait_for_the_copies_just_issued_are_the_copies():
    """Activation offloading: each sync waits for a 2 MiB copy its thread just issued (views.copy_syncs); a loop that
    reads 4-byte values with .item() does the same calls, but those are value reads, not data moved."""
    assert views.copy_syncs(_copies_then_syncs(2 << 20))
    assert not views.copy_syncs(_copies_then_syncs(4))


def test_unfused_attention_in_fp32_is_the_precision_findings():
    """Where mixed precision is off, unfused attention is counted by fp32_gemm (SDPA's flash kernels need 16-bit
    inputs): its own finding is not raised; in bf16 it is the attention finding's alone."""
    runs = pd.DataFrame(
        [{"start": 0, "glue_ns": 800, "gemm_ns": 200, "full_gemm_ns": 200, "softmax_ns": 300, "kernels": 5}]
    )
    fp32 = pd.DataFrame(
        [{"precision": "tf32", "time_pct": 100.0, "total_ns": 1_000, "instances": 2, "top_kernel": "tf32_gemm"}]
    )
    assert excess.unfused_attention_finding(runs, None, None, fp32, None) == []
    assert not boundness.full_precision_gemms(fp32, None, runs).empty
    assert boundness.full_precision_gemms(fp32, "bfloat16").empty  # the run reports half precision
    assert boundness.full_precision_gemms(fp32.assign(precision="bf16"), None).empty


def test_fp32_gemms_only_in_unfused_attention_are_the_attentions():
    """SDPA's math fallback runs bf16 attention's GEMMs in fp32 beside GEMMs whose names tell no precision
    (nvjet): outside the attention runs the fp32 names hold too little GEMM time to say mixed precision is off."""
    runs = pd.DataFrame(
        [{"start": 0, "glue_ns": 800, "gemm_ns": 600, "full_gemm_ns": 600, "softmax_ns": 300, "kernels": 5}]
    )
    precision = pd.DataFrame(
        [
            {"precision": "fp32", "time_pct": 70.0, "total_ns": 700, "instances": 4, "top_kernel": "sm80_xmma_f32"},
            {"precision": "not in the name", "time_pct": 30.0, "total_ns": 300, "instances": 6, "top_kernel": "nvjet"},
        ]
    )
    assert not boundness.full_precision_gemms(precision, None).empty  # without the runs: 70% of GEMM time
    assert boundness.full_precision_gemms(precision, None, runs).empty  # outside them: 100 of 400 ns


def test_fill_share_counts_the_launches_that_write_one_value():
    names = pd.DataFrame(
        {
            "name": [
                "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>>(int, T2, T3)",
                "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<float>>(int, T2, T3)",
                None,
            ],
            "short_name": ["vectorized_elementwise_kernel", "vectorized_elementwise_kernel", "nvjet_sm90_tst"],
            "instances": [30, 50, 20],
            "duration": [1, 1, 1],
        }
    )
    assert kernels.fill_share_pct(names) == pytest.approx(30.0)
    assert kernels.fill_share_pct(names.iloc[:0]) == 0.0


def test_float64_kernels_are_those_on_double_elements_not_with_a_double_scalar():
    """A softmax, a fill and a copy on float64 elements are float64 work; fused AdamW on float, whose learning rate
    and betas are double arguments, and a kernel without a demangled name are not."""
    names = pd.DataFrame(
        {
            "name": [
                "void at::native::<unnamed>::cunn_SoftMaxForward<(int)2, double, double, double, "
                "at::native::<unnamed>::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)",
                "void at::native::vectorized_elementwise_kernel<(int)2, at::native::FillFunctor<double>, "
                "std::array<char *, (unsigned long)1>>(int, T2, T3)",
                "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase "
                "&)::[lambda(double) (instance 1)], std::array<char *, (unsigned long)2>>(int, T1, T2)",
                "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::FusedOptimizerTensorList"
                "Metadata<(int)4>, at::native::<unnamed>::FusedAdamMathFunctor<float, (int)4, (at::native::ADAM_MODE)1, "
                "(bool)0>, const float *, double, double, double, double, double, bool, const float *>(T1, T2, T3...)",
                None,
            ],
            "short_name": ["cunn_SoftMaxForward", "vectorized_elementwise_kernel", "unrolled_elementwise_kernel"]
            + ["multi_tensor_apply_kernel", "nvjet_sm90_tst"],
            "instances": [1, 3, 2, 21, 40],
            "duration": [50, 10, 20, 30, 70],
        }
    )
    assert kernels.float64_kernels(names)["total_ns"].tolist() == [50, 20, 10]
    assert kernels.float64_kernels(names.iloc[3:]).empty
