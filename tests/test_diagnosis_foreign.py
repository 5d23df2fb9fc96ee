"""The diagnosis on a model family and a loop sftprof's rules were not written on (tests/fixtures/foreign: a
GPT-NeoX of Pythia-410M's shape, `iteration N` ranges, one problem planted per capture, nsys 2025.3 on an
H100), against the saving of each fix measured without the profiler in the same session, read here from the
committed timings (not through sftprof)."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from sftprof.analysis import analyze
from sftprof.report.suggest import suggest
from sftprof.trace import load_trace

from conftest import unpack_xz

FOREIGN = Path(__file__).parent / "fixtures" / "foreign"
WARMUP = 3  # iterations left out of each measured run: the first builds kernels and allocator pools
# The target: the gain within 25% of the measured saving, or within 3 points of it.
AGREEMENT, POINTS = 0.25, 3.0
# Each planted problem and the finding that should name it first.
PLANTED = {
    "eager_attention": "unfused_attention",
    "fp32": "fp32_gemm",
    "tokenize_no_nvtx": "host_work",
    "no_cache_alloc": "allocator_churn",
    "foreach_off": "launch_bound",
    "checkpointing": "launch_bound",  # not designed for: recompute shows as launches on the backward thread
}


def measured_ms() -> dict[str, float]:
    """Median unprofiled iteration per case, over every alternating run."""
    times = defaultdict(list)
    for line in (FOREIGN / "measured.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("case") and row["iteration"] >= WARMUP:
            times[row["case"]].append(1000 * row["s"])
    return {case: statistics.median(values) for case, values in times.items()}


def measured_saving_pct(case: str) -> float:
    times = measured_ms()
    return 100 * (1 - times["clean"] / times[case])


def agrees(gain: float, measured: float) -> bool:
    return abs(gain - measured) <= max(AGREEMENT * measured, POINTS)


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    folder, cache = tmp_path_factory.mktemp("foreign"), {}

    def diagnose(case: str):
        if case not in cache:
            tables = load_trace(unpack_xz(FOREIGN / f"{case}.sqlite.xz", folder / f"{case}.sqlite"))
            try:
                cache[case] = analyze(tables)
            finally:
                tables.events.close()
        return cache[case]

    return diagnose


def test_each_fix_was_measured_to_pay():
    times = measured_ms()
    assert set(times) == {"clean", *PLANTED}
    assert all(measured_saving_pct(case) > 10 for case in PLANTED)


@pytest.mark.parametrize("case", ["eager_attention", "fp32", "tokenize_no_nvtx", "no_cache_alloc", "checkpointing"])
def test_the_planted_cause_ranks_first_with_the_measured_saving(diagnosed, case):
    top = diagnosed(case).findings[0]
    assert top.rule == PLANTED[case] and top.severity == "warning"
    assert agrees(top.gain_pct, measured_saving_pct(case)), (top.gain_pct, measured_saving_pct(case))


def test_steps_are_found_without_any_nvtx(diagnosed):
    headline = diagnosed("tokenize_no_nvtx").headline
    assert headline["steps_captured"] == diagnosed("clean").headline["steps_captured"]
    assert headline["steps_found_by"].startswith("inferred")


def test_allocator_churn_counts_the_launches_its_calls_delayed(diagnosed):
    """cudaMalloc and cudaFree hold the thread while the GPU runs, so every launch after them comes later; the
    idle those launches leave, up to the calls' time, is the allocator's too (without it, 56.8%)."""
    causes = diagnosed("no_cache_alloc").tables["idle_causes"]
    allocation = causes[causes["cause"] == "allocation"]
    delayed = allocation.loc[allocation["source"] == "launches a call delayed", "idle_ns"].sum()
    assert 0 < delayed < allocation["idle_ns"].sum()
    assert set(allocation["name"]) <= {"cudaMalloc", "cudaFree"}


def test_per_parameter_adamw_ranks_first_as_launch_bound_but_over_predicts(diagnosed):
    """The profiler makes every launch dearer (116 ms in the window against 89 ms without it), and the fused
    optimizer removes only the `update` range's launches: the launch_bound gain over-predicts the fix."""
    top, measured = diagnosed("foreach_off").findings[0], measured_saving_pct("foreach_off")
    assert top.rule == "launch_bound" and "`update`" in top.evidence
    assert top.gain_pct > (1 + AGREEMENT) * measured


def test_the_clean_run_raises_no_planted_warning(diagnosed):
    warned = {f.rule for f in diagnosed("clean").findings if f.severity == "warning"}
    assert not warned & set(PLANTED.values())


@pytest.mark.parametrize(
    "case, variant",
    [
        ("eager_attention", "sdpa"),
        ("no_cache_alloc", "expandable-segments"),
        ("fp32", "bf16"),
        ("foreach_off", "compiled"),
    ],
)
def test_suggest_first_tests_the_top_finding(diagnosed, case, variant):
    [(name, entry, _, gain)] = suggest(diagnosed(case), top=1)
    assert (name, entry["motivated_by"], gain) == (variant, PLANTED[case], diagnosed(case).findings[0].gain_pct)
