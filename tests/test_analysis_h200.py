"""The new analyses on the real H200 capture (tests/fixtures/README.md), checked against `nsys stats`
where nsys has the same report, against the file's own rows where it does not, and against invariants.

Which rules fire on this capture, and why that is right (each is re-derived from the data below;
the gains themselves are checked in test_gains.py):
- launch_bound (warning, the largest gain): a 4-layer, hidden-256 model gives ~1,400 kernels per step,
  99% of them under 10 µs, while a cudaLaunchKernel costs ~8 µs of CPU; the GPU is busy ~5% of its
  span, and the short gaps between kernels are ~94% of the step.
- gpu_busy (info): a measurement; the findings with gains say which cause holds the idle time.
- bound_verdict says host-bound; memory_bound_kernel_mix and foreach_optimizer (info): ~72% of kernel
  time is elementwise, reduction, copy and optimizer kernels (the trainer's AdamW runs as foreach
  kernels), but the CPU waits for the GPU ~0.15 ms per step, so faster kernels barely shorten it.
- pageable_memcpy (info): each micro-batch's input tensors (16 KB HtoD) are copied from pageable memory
  with cudaMemcpyAsync (the trainer does not pin); the GPU idles ~0.9% of the step inside the
  cudaMemcpyAsync calls (idle_causes; every such call's, the pinned copies' too), hence info.
- sync_in_steps (info): 14 cudaStreamSynchronize per step (`.item()` reads); the GPU had run dry
  before each, so they cost ~0.2% of the step.
- host_work, thread_wait (info): the other causes of the GPU's idle time (idle_causes), each 1-2% of the
  step: the optimizer range's own code in gaps over 1 ms, and the autograd thread's pthread_cond_wait.
  The copy and set calls' idle (copy_calls) is pageable_memcpy's but for the memsets', under 1%.
- empty_trace_kind (info): cuDNN was traced, and nsys says it collected nothing.
Not fired, with the evidence of absence: sync_memcpy and sync_memset (all copies and sets are Async),
fp32_gemm (bf16 tensorop GEMMs are present), data_stall (data is <5% of step time), lock_wait (the
training threads make no lock-wait call inside the steps).
"""

from __future__ import annotations

import csv
import io
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sftprof.analysis import analyze, cpu, gpu, intervals, kernels, memory, nvtx, utilisation


@pytest.fixture(scope="module")
def result(h200_tables):
    return analyze(h200_tables)


def nsys_rows(report: str, path: Path, header: str, fmt: str = "csv") -> list[dict]:
    out = subprocess.run(
        ["nsys", "stats", "--report", report, "--format", fmt, "--force-export", "false", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return list(csv.DictReader(io.StringIO(out[out.index(header) :])))


def query(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


# ---------------------------------------------------------------- equal to nsys stats


def test_size_summary_equals_gpumemsizesum_in_bytes(h200_capture, h200_tables):
    theirs = {row["Operation"]: row for row in nsys_rows("gpumemsizesum", h200_capture, "Total", "csv:mem=B")}
    ours = memory.size_summary(h200_tables.events).set_index("operation")
    assert set(theirs) == set(ours.index) and len(ours) == 4
    for operation, row in theirs.items():
        mine = ours.loc[operation]
        assert (int(row["Total (B)"]), int(row["Count"]), int(row["Min (B)"]), int(row["Max (B)"])) == (
            mine.total_bytes,
            mine["count"],
            mine.min_bytes,
            mine.max_bytes,
        )
        for column, value in (
            ("Avg (B)", mine.avg_bytes),
            ("Med (B)", mine.med_bytes),
            ("StdDev (B)", mine.stddev_bytes),
        ):
            assert float(row[column]) == pytest.approx(value, rel=1e-12, abs=1e-12), (operation, column)


def test_megabytes_print_as_nsys_prints_them(h200_capture, h200_tables):
    """nsys's default unit is MB = 10^6 bytes with three decimals (113,246,208 B -> 113.246)."""
    theirs = {
        (row["Operation"], row["Total (MB)"], row["Avg (MB)"], row["Med (MB)"], row["Max (MB)"])
        for row in nsys_rows("gpumemsizesum", h200_capture, "Total")
    }
    ours = {
        (r.operation, *(f"{v / memory.MEGABYTE:.3f}" for v in (r.total_bytes, r.avg_bytes, r.med_bytes, r.max_bytes)))
        for r in memory.size_summary(h200_tables.events).itertuples()
    }
    assert ours == theirs


def test_inclusive_gpu_time_per_range_equals_nvtxkernsum(h200_capture, h200_tables, result):
    """nvtxkernsum counts a kernel in every range around its launch, on the launching thread; kernels
    launched outside every range come out as the range `None`."""
    totals: dict[str, list[int]] = {}
    for row in nsys_rows("nvtxkernsum", h200_capture, "NVTX Range"):
        entry = totals.setdefault(row["NVTX Range"], [0, 0])
        entry[0] += int(row["Kern Inst"])
        entry[1] += int(row["Total Time (ns)"])
    outside = totals.pop("None")
    projection = result.tables["nvtx_gpu"].set_index("range")
    named = projection[~projection.index.str.startswith("(")]
    assert {name: [int(r.inclusive_kernels), int(r.inclusive_gpu_ns)] for name, r in named.iterrows()} == totals
    unannotated = projection.loc["(no NVTX range, pt_autograd_0 (autograd, tid 566))"]
    assert [unannotated.kernels, unannotated.gpu_ns] == outside
    assert projection["gpu_ns"].sum() == h200_tables.kernels["duration"].sum()  # innermost: each kernel once


# ---------------------------------------------------------------- against the file's own rows


def test_memops_carry_copy_and_memory_kinds_as_the_file_has_them(h200_capture, h200_tables):
    rows = query(
        h200_capture,
        """SELECT e.label, s.label, d.label, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                             JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind
                             JOIN ENUM_CUDA_MEM_KIND s ON s.id = m.srcKind JOIN ENUM_CUDA_MEM_KIND d ON d.id = m.dstKind
                             GROUP BY 1, 2, 3""",
    )
    short = {"Host-to-Device": "HtoD", "Device-to-Host": "DtoH", "Device-to-Device": "DtoD"}
    copies = h200_tables.memops[h200_tables.memops["copy_kind"] != "memset"]
    ours = copies.groupby(["copy_kind", "src_kind", "dst_kind"]).size().to_dict()
    assert ours == {(short[kind], src, dst): n for kind, src, dst, n in rows}
    [(memsets, device_memsets)] = query(
        h200_capture, "SELECT count(*), sum(memKind = 2) FROM CUPTI_ACTIVITY_KIND_MEMSET"
    )
    sets = h200_tables.memops[h200_tables.memops["copy_kind"] == "memset"]
    assert len(sets) == memsets and (sets["dst_kind"] == "Device").sum() == device_memsets


def test_sync_table_holds_every_synchronization_record(h200_capture, h200_tables, result):
    rows = dict(
        query(
            h200_capture,
            """SELECT t.label, count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y
                                  JOIN ENUM_CUPTI_SYNC_TYPE t ON t.id = y.syncType GROUP BY 1""",
        )
    )
    assert h200_tables.sync["sync_type"].value_counts().to_dict() == rows
    activity = result.tables["sync_activity"].set_index("sync_type")
    assert activity["instances"].to_dict() == rows


def test_sync_calls_are_the_runtime_rows_of_those_names(h200_capture, result):
    [(calls, total)] = query(
        h200_capture,
        """SELECT count(*), sum(r."end" - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                                         JOIN StringIds s ON s.id = r.nameId
                                         WHERE s.value LIKE 'cudaStreamSynchronize%'""",
    )
    sync = result.tables["sync_calls"].set_index("name")
    assert list(sync.index) == ["cudaStreamSynchronize"]
    assert (sync.loc["cudaStreamSynchronize", "calls"], sync.loc["cudaStreamSynchronize", "total_ns"]) == (calls, total)
    main = result.tables["threads"].set_index("role").loc["main"]
    assert main.gpu_wait_ns == total  # all of them on the main thread (`.item()` in the loop)


# ---------------------------------------------------------------- invariants


def test_families_cover_every_kernel_once(h200_tables, result):
    families = result.tables["kernel_families"]
    assert families["total_ns"].sum() == h200_tables.kernels["duration"].sum()
    assert families["instances"].sum() == len(h200_tables.kernels)
    assert families["time_pct"].sum() == pytest.approx(100.0)
    by_name = h200_tables.kernels.assign(family=kernels.kernel_families(h200_tables.kernels))
    assert (by_name[by_name["short_name"].str.startswith("nvjet")]["family"] == "GEMM").all()
    assert (by_name[by_name["name"].str.contains("sdpa")]["family"] == "attention").all()
    precision = result.tables["gemm_precision"].set_index("precision")
    assert precision["total_ns"].sum() == families.set_index("family").loc["GEMM", "total_ns"]


def test_busy_time_gaps_and_timeline_agree(h200_tables, result):
    # every kernel and memory operation, as nsys's utilisation rules count them (start > 0)
    ops = pd.concat([h200_tables.kernels[["start", "end"]], h200_tables.memops[["start", "end"]]], ignore_index=True)
    ops = ops[ops["start"] > 0].astype("int64")
    merged = intervals.union(ops)
    busy = result.tables["gpu_busy"].iloc[0]
    assert busy.busy_ns == (merged["end"] - merged["start"]).sum() <= busy.span_ns
    gaps = result.tables["gpu_gaps"]
    assert (gaps["duration"] > utilisation.IDLE_GAP_NS).all()
    assert (intervals.covered_ns(merged, gaps["start"], gaps["end"]) == 0).all()  # gaps hold no GPU work
    every_hole = merged["start"].to_numpy()[1:] - merged["end"].to_numpy()[:-1]
    assert len(gaps) == (every_hole > utilisation.IDLE_GAP_NS).sum()
    timeline = result.tables["gpu_timeline"]
    lengths = (timeline["end"] - timeline["start"]).to_numpy()
    assert np.round(timeline["busy_pct"].to_numpy() / 100 * lengths).sum() == pytest.approx(busy.busy_ns, abs=50)
    assert (timeline["busy_pct"] <= 100).all() and len(timeline) == utilisation.UTILISATION_CHUNKS
    per_step = result.tables["step_gpu"]
    assert (per_step["gpu_busy_ns"] <= per_step["duration"]).all() and per_step["gpu_busy_ns"].sum() <= busy.busy_ns


def test_memory_kind_shares_add_up_to_the_memory_share(h200_tables, result):
    kinds = result.tables["memop_kinds"]
    gpu_ns = h200_tables.kernels["duration"].sum() + h200_tables.memops["duration"].sum()
    assert kinds["gpu_time_pct"].sum() == pytest.approx(100.0 * h200_tables.memops["duration"].sum() / gpu_ns)
    host = result.tables["host_memory"].set_index(["copy_kind", "host_memory"])["instances"].to_dict()
    assert host == {("DtoH", "Pinned"): 24, ("HtoD", "Pageable"): 18}


def test_thread_osrt_rows_add_up_to_the_thread_summary(h200_tables, result):
    per_call = result.tables["thread_osrt"].groupby("thread")["total_ns"].sum()
    labels = cpu.thread_labels(result.tables["threads"])
    summary = result.tables["threads"].assign(thread=result.tables["threads"]["global_tid"].map(labels))
    summary = summary[summary["osrt_ns"] > 0].set_index("thread")["osrt_ns"]
    assert per_call.sort_index().to_dict() == summary.sort_index().to_dict()


# ---------------------------------------------------------------- findings on this capture

FIRES = {
    "launch_bound": "warning",
    "gpu_busy": "info",
    "bound_verdict": "info",
    "memory_bound_kernel_mix": "info",
    "foreach_optimizer": "info",
    "pageable_memcpy": "info",  # the pageable HtoD copies' calls only
    "copy_calls": "info",  # the other copy and set calls (device-to-device, to pinned memory, memsets): 1.3%
    "sync_in_steps": "info",
    "host_work": "info",
    "thread_wait": "info",
    "interconnect": "info",
    "nvtx_gpu_time": "info",
    "empty_trace_kind": "info",
}
SILENT = {"sync_memcpy", "sync_memset", "fp32_gemm", "data_stall", "lock_wait"}


def test_rules_fire_exactly_where_the_capture_has_the_evidence(h200_capture, h200_tables, result):
    severity = {f.rule: f.severity for f in result.findings}
    assert {rule: severity.get(rule) for rule in FIRES} == FIRES
    assert not SILENT & set(severity)
    # The evidence, re-derived from the file itself:
    apis = dict(
        query(
            h200_capture,
            """SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                                  JOIN StringIds s ON s.id = r.nameId GROUP BY 1""",
        )
    )
    assert not any(name.startswith(("cudaMemcpy_", "cudaMemset_")) for name in apis)  # no synchronous copy/set
    [(pageable,)] = query(
        h200_capture,
        """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m
                                      JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId
                                      JOIN StringIds s ON s.id = r.nameId
                                      WHERE s.value LIKE 'cudaMemcpy%Async%' AND (m.srcKind = 0 OR m.dstKind = 0)""",
    )
    assert pageable == 18 and result.findings[
        [f.rule for f in result.findings].index("pageable_memcpy")
    ].title.startswith("18 asynchronous copies")
    [(bf16_gemms,)] = query(
        h200_capture,
        """SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                        JOIN StringIds s ON s.id = k.demangledName
                                        WHERE s.value LIKE '%tensorop_bf16%gemm%'""",
    )
    assert bf16_gemms > 0
    steps = result.tables["steps"]
    assert steps["data_ns"].sum() < 0.05 * steps["duration"].sum()
    tiny = (h200_tables.kernels["duration"] < gpu.TINY_KERNEL_NS).mean()
    assert tiny > 0.95 and result.headline["gpu_busy_pct"] < 10


def test_findings_name_their_numbers(result):
    found = {f.rule: f for f in result.findings}
    assert found["interconnect"].title.endswith("the interconnect is not the limit")
    assert "18 of 42 host copies use pageable memory" in found["interconnect"].evidence
    assert "mostly in NVTX `data` (18 of 18)" in found["pageable_memcpy"].evidence
    assert "step 4: 14 calls" in found["sync_in_steps"].evidence
    assert "`forward`" in found["launch_bound"].evidence and "`cudaLaunchKernel`" in found["launch_bound"].evidence
    assert "`optimizer`" in found["host_work"].evidence and "`pthread_cond_wait`" in found["thread_wait"].evidence
    assert (
        found["bound_verdict"].title.startswith("Host-bound")
        and "--gpu-metrics-device=all" in found["bound_verdict"].evidence
    )
    assert "pt_autograd_0" in found["nvtx_gpu_time"].evidence and "emit_nvtx" in found["nvtx_gpu_time"].recommendation
    for finding in result.findings:  # quoted thread labels keep their own parentheses
        text = finding.title + finding.evidence + finding.recommendation
        assert text.count("(") == text.count(")"), finding
    assert result.findings[0].rule == "launch_bound" and result.findings[0].severity == "warning"  # largest gain first


def test_headline(result, h200_tables):
    headline = result.headline
    families = headline["kernel_family_pct"]
    assert max(families, key=families.get) == "elementwise" and sum(families.values()) == pytest.approx(100, abs=0.05)
    by_name = h200_tables.kernels.groupby("name")["duration"].sum()  # all launch shapes of a kernel together
    assert headline["top_kernel"] == by_name.idxmax()
    assert headline["top_kernel_pct"] == round(100 * by_name.max() / by_name.sum(), 1)
    assert headline["verdict"] == "host-bound, kernels memory-bound" and headline["verdict_confidence"] == "medium"
    assert headline["memop_gpu_time_pct"] == pytest.approx(
        100
        * h200_tables.memops["duration"].sum()
        / (h200_tables.memops["duration"].sum() + h200_tables.kernels["duration"].sum())
    )
    assert set(headline["warnings"]) == {"launch_bound"}
    assert 0 < headline["tensor_core_pct"] < families["GEMM"] + families["attention"]
    assert nvtx.NOT_TRACED not in set(result.tables["nvtx_gpu"]["range"])  # every kernel's launch was traced
