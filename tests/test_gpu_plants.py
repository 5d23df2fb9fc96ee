"""Real H200 captures of tests/gpu_programs/plants.py, one planted problem each (see
tests/fixtures/README.md). Here: our loaders and summaries equal `nsys stats` on every one of
them, and each capture really holds what was planted, read straight from the export's tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sftprof.analysis import gpu
from sftprof.trace import load_trace

from conftest import as_nsys_rows, nsys_stats, private_copy

FIXTURES = Path(__file__).parent / "fixtures"
PLANTS = ("clean", "sync_memcpy", "pageable", "device_sync", "cpu_starved", "elementwise", "gemm")


def fixture(plant: str) -> Path:
    return FIXTURES / f"h200_plant_{plant}.sqlite"


@pytest.fixture(scope="module", params=PLANTS)
def capture(request, tmp_path_factory) -> Path:
    return private_copy(tmp_path_factory, fixture(request.param))


@pytest.mark.parametrize(
    "report, summarize, name_columns",
    [
        ("gpukernsum", lambda t: gpu.kernel_summary(t.events), ["grid", "block", "kernel"]),
        ("gpumemtimesum", lambda t: gpu.memop_summary(t.events), ["operation"]),
        ("cudaapisum", lambda t: gpu.cuda_api_summary(t.events), ["name"]),
    ],
)
def test_summaries_equal_nsys_stats_on_every_plant(capture, report, summarize, name_columns):
    ours = as_nsys_rows(summarize(load_trace(capture)), name_columns)
    theirs = {tuple(row.values()) for row in nsys_stats(report, capture)}
    assert ours == theirs and ours


def _count(plant: str, sql: str) -> int:
    with sqlite3.connect(f"file:{fixture(plant)}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchone()[0]


def _api_calls(plant: str, name: str) -> int:
    return _count(
        plant,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE s.value LIKE '{name}\\_v%' ESCAPE '\\'",
    )


def test_each_capture_holds_its_plant_and_the_clean_one_none():
    # Two captured steps of two micro-batches each: four planted events.
    assert _api_calls("sync_memcpy", "cudaMemcpy") == 4 and _api_calls("clean", "cudaMemcpy") == 0
    assert _api_calls("device_sync", "cudaDeviceSynchronize") >= 4
    assert _api_calls("clean", "cudaDeviceSynchronize") == 0
    pageable_host_to_device = (
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
        "WHERE copyKind = 1 AND srcKind = 0"
    )  # HtoD from pageable memory
    assert _count("pageable", pageable_host_to_device) >= 4 and _count("clean", pageable_host_to_device) == 0
    step_ranges = "SELECT sum(end - start) FROM NVTX_EVENTS WHERE text = 'data'"
    assert _count("cpu_starved", step_ranges) >= 4 * 30e6 > 10 * _count("clean", step_ranges)


PROBLEM_RULES = {
    "sync_memcpy",
    "pageable_memcpy",
    "sync_memset",
    "sync_in_steps",
    "data_stall",
    "lock_wait",
    "fp32_gemm",
    "allocator_churn",
    "unfused_attention",
}


@pytest.fixture(scope="module")
def findings() -> dict[str, dict[str, object]]:
    from sftprof.analysis import analyze

    return {plant: {f.rule: f for f in analyze(load_trace(fixture(plant))).findings} for plant in PLANTS}


@pytest.mark.parametrize(
    "plant, rule, evidence",
    [
        ("sync_memcpy", "sync_memcpy", "4 synchronous cudaMemcpy"),
        ("pageable", "pageable_memcpy", "pageable"),
        ("device_sync", "sync_in_steps", "cudaDeviceSynchronize"),
        ("cpu_starved", "data_stall", "Data loading"),
    ],
)
def test_each_planted_problem_is_named(findings, plant, rule, evidence):
    finding = findings[plant].get(rule)
    assert finding is not None, f"{plant}: no {rule} finding among {sorted(findings[plant])}"
    assert evidence in finding.title + finding.evidence


def test_the_clean_run_raises_no_problem(findings):
    assert not PROBLEM_RULES & set(findings["clean"])


def test_elementwise_model_is_memory_bound_and_gemm_model_compute_bound(findings):
    assert "kernels are memory-bound" in findings["elementwise"]["bound_verdict"].title
    assert "kernels are compute-bound" in findings["gemm"]["bound_verdict"].title


def test_a_kineto_trace_of_the_same_loop_holds_the_same_kernels():
    """tests/gpu_programs/kineto_trace.py profiled two steps of the clean plant with
    torch.profiler on the same H200: the Kineto loader must find the kernels nsys found for
    two steps of that loop, each linked to the runtime call that launched it."""
    kineto = load_trace(FIXTURES / "h200_plant_clean.pt.trace.json.gz")
    nsys_kernels = load_trace(fixture("clean")).kernels
    assert (
        kineto.kernels["short_name"]
        .value_counts()
        .sort_index()
        .equals(nsys_kernels["short_name"].value_counts().sort_index())
    )
    launches = kineto.kernels.merge(kineto.cuda_api[["pid", "correlation_id"]], on=["pid", "correlation_id"])
    assert len(launches) == len(kineto.kernels) and {"cuda", "nvtx"} <= kineto.sources
