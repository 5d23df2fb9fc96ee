"""A real H200 capture of the built-in SFT loop (tests/fixtures/README.md): the CUDA loaders and
summaries must give exactly what `nsys stats` gives on the same file."""

from __future__ import annotations

import pytest

from sftprof.analysis import analyze, gpu

from conftest import as_nsys_rows, nsys_stats


@pytest.mark.parametrize(
    "report, summarize, name_columns",
    [
        ("gpukernsum", lambda t: gpu.kernel_summary(t.events), ["grid", "block", "kernel"]),
        ("gpumemtimesum", lambda t: gpu.memop_summary(t.events), ["operation"]),
        ("cudaapisum", lambda t: gpu.cuda_api_summary(t.events), ["name"]),
    ],
)
def test_cuda_summaries_equal_nsys_stats(h200_capture, h200_tables, report, summarize, name_columns):
    ours = as_nsys_rows(summarize(h200_tables), name_columns)
    theirs = {tuple(row.values()) for row in nsys_stats(report, h200_capture)}
    assert ours == theirs and len(ours) > 3


def test_capture_window_held_exactly_the_configured_steps(h200_tables):
    steps = sorted(h200_tables.nvtx[h200_tables.nvtx["name"].str.startswith("step")]["name"])
    assert steps == ["step 4", "step 5", "step 6"]


def test_findings_on_a_real_gpu_capture(h200_tables):
    result = analyze(h200_tables)
    rules = {f.rule: f for f in result.findings}
    assert "no_gpu_activity" not in rules
    assert {"top_kernel", "memory_transfer_share", "gpu_busy", "dominant_phase"} <= set(rules)
    busy = result.tables["gpu_busy"].iloc[0]
    assert 0 < busy.busy_ns <= busy.span_ns
    threads = result.tables["threads"].set_index("thread_name")
    assert threads.loc["pt_autograd_0", "role"] == "autograd"
    assert threads.loc["pt_autograd_0", "top_osrt_call"] == "pthread_cond_wait"
    assert (result.tables["threads"]["osrt_ns"] <= h200_tables.span_ns).all()
    assert "pt_autograd_0" in rules["training_thread_blocking"].evidence
