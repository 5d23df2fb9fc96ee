"""`sftprof compare` on real analyses; every expected number is recomputed from the raw trace tables
(nsys's own kernel short names, a plain interval merge), not taken from the analyses compared."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pandas as pd
import pytest

from sftprof import results
from sftprof.analysis import Analysis, analyze
from sftprof.analysis.compare import DELTA, DELTA_PCT, compare, unique_labels
from sftprof.analysis.findings import Finding
from sftprof.cli import main as sftprof_main
from sftprof.trace import load_trace
from sftprof.trace.events import EventStore
from sftprof.trace.tables import TraceTables

FIXTURES = Path(__file__).parent / "fixtures"
NSYS_FIXTURE = FIXTURES / "h200_tiny_llama_bf16.sqlite"
KINETO_FIXTURE = FIXTURES / "cpu_tiny_llama.pt.trace.json.gz"
STEP = r"^step \d+$"


def shifted_window(tables: TraceTables, start: int, end: int) -> TraceTables:
    """What a capture of [start, end] alone would hold: the rows inside it, on a timeline from 0."""
    frames = {}
    for name in ("nvtx", "osrt", "cuda_api", "kernels", "memops"):
        frame = getattr(tables, name)
        inside = frame[(frame["start"] >= start) & (frame["end"] <= end)].copy()
        inside[["start", "end"]] -= start
        frames[name] = inside
    return TraceTables(
        source_path=f"{tables.source_path}[window]",
        span_ns=end - start,
        sources=tables.sources,
        threads=tables.threads,
        events=EventStore.from_frames(**frames),
    )


def merged_busy_ns(frames: list[pd.DataFrame]) -> int:
    busy, current_start, current_end = 0, None, None
    for start, end in sorted(pd.concat(frames)[["start", "end"]].itertuples(index=False)):
        if current_end is None or start > current_end:
            busy += 0 if current_end is None else current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    return busy + (current_end - current_start)


@pytest.fixture(scope="module")
def full_and_window(tmp_path_factory):
    """The H200 capture analysed by the CLI, and the same capture cut to its steps 4 and 5."""
    root = tmp_path_factory.mktemp("compare")
    assert sftprof_main(["analyze", str(NSYS_FIXTURE), "-o", str(root / "full")]) == 0
    full = load_trace(NSYS_FIXTURE)
    steps = full.nvtx[full.nvtx["name"].str.match(STEP)].sort_values("start")
    window = shifted_window(full, int(steps.iloc[0]["start"]), int(steps.iloc[1]["end"]))
    results.save(analyze(window), root / "window" / "analysis")
    assert sftprof_main(["compare", str(root / "full"), str(root / "window"), "-o", str(root / "out")]) == 0
    table = pd.read_csv(root / "out" / "comparison.csv")
    return root, full, window, table


def _rows(table: pd.DataFrame, section: str) -> pd.DataFrame:
    return table[table["section"] == section].set_index("item")


def test_headline_deltas_equal_the_raw_tables(full_and_window):
    _, full, window, table = full_and_window
    headline = _rows(table, "headline")
    for label, raw in (("full", full), ("window", window)):
        step_ns = raw.nvtx[raw.nvtx["name"].str.match(STEP)]["duration"]
        kernel_ns, memop_ns = raw.kernels["duration"].sum(), raw.memops["duration"].sum()
        gpu_ops = [raw.kernels, raw.memops]
        gpu_span = max(f["end"].max() for f in gpu_ops) - min(f["start"].min() for f in gpu_ops)
        assert headline.loc["steps captured", label] == len(step_ns)
        assert headline.loc["median step", label] == pytest.approx(statistics.median(step_ns) / 1e6)
        assert headline.loc["kernel time", label] == pytest.approx(kernel_ns / 1e6)
        memory_share = 100 * memop_ns / (kernel_ns + memop_ns)
        assert headline.loc["memory-op share of GPU time", label] == pytest.approx(memory_share)
        assert headline.loc["GPU busy", label] == pytest.approx(100 * merged_busy_ns(gpu_ops) / gpu_span)
    assert list(headline.loc["steps captured", ["full", "window"]]) == [3, 2]
    kernel = headline.loc["kernel time"]
    assert kernel[DELTA + "window"] == pytest.approx(kernel["window"] - kernel["full"])
    assert kernel[DELTA_PCT + "window"] == pytest.approx(100 * (kernel["window"] / kernel["full"] - 1))


def test_kernel_families_per_step_and_largest_delta_first(full_and_window):
    root, full, window, table = full_and_window
    families = table[table["section"] == "kernel_families"]
    assert set(families["unit"]) == {"ms/step"}
    expected = {}
    for label, raw, steps in (("full", full, 3), ("window", window, 2)):
        # nsys's own short names: an independent grouping from the comparison's.
        expected[label] = raw.kernels.groupby("short_name")["duration"].sum() / steps / 1e6
    expected = pd.DataFrame(expected).fillna(0.0)
    got = families.set_index("item")[["full", "window"]]
    assert sorted(got.index) == sorted(expected.index)
    pd.testing.assert_frame_equal(got.sort_index(), expected.sort_index(), check_names=False, rtol=1e-9)
    biggest = (expected["window"] - expected["full"]).abs().idxmax()
    assert families.iloc[0]["item"] == biggest
    html = (root / "out" / "compare.html").read_text()
    assert f'title="{biggest}"' in html and 'class="highlight"' in html


def test_findings_of_each_input_as_their_analysis_json_says(full_and_window):
    root, *_ = full_and_window
    findings = pd.read_csv(root / "out" / "findings.csv")
    for label in ("full", "window"):
        summary = json.loads((root / label / "analysis" / results.SUMMARY_FILE).read_text())
        assert set(findings[findings[label].notna()]["rule"]) == {f["rule"] for f in summary["findings"]}


def test_against_a_cpu_capture_gpu_numbers_are_blank_not_zero(full_and_window, tmp_path, capsys):
    root, *_ = full_and_window
    assert sftprof_main(["compare", str(root / "full"), str(KINETO_FIXTURE), "-o", str(tmp_path)]) == 0
    summary = capsys.readouterr().out
    assert "no_gpu_activity: only in cpu_tiny_llama" in summary
    headline = _rows(pd.read_csv(tmp_path / "comparison.csv"), "headline")
    cpu = headline["cpu_tiny_llama"]
    gpu_and_os = ["kernel time", "GPU busy", "memory-op share of GPU time", "main thread blocked in OS calls"]
    assert cpu[gpu_and_os].isna().all()
    with gzip.open(KINETO_FIXTURE, "rt") as stream:
        events = json.load(stream)["traceEvents"]
    step_ms = [e["dur"] / 1e3 for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("step ")]
    assert cpu["median step"] == pytest.approx(statistics.median(step_ms), abs=1e-6)
    assert headline.loc["kernel time", "full"] > 0 and pd.isna(headline.loc["kernel time", DELTA + "cpu_tiny_llama"])


def _analysis(tables: dict, headline: dict, sources=("cuda", "nvtx"), findings=()) -> Analysis:
    return Analysis(
        source_path="test",
        span_ns=10_000_000,
        sources=list(sources),
        tables=tables,
        findings=list(findings),
        headline=headline,
    )


def test_tables_missing_columns_or_sources_are_compared_where_both_have_them():
    kernels = pd.DataFrame(
        {"kernel": ["void a::gemm<1>(int)", "void b::copy<2>(int)"], "total_ns": [3e6, 1e6], "instances": [3, 1]}
    )
    older = _analysis({"kernels": kernels.drop(columns="total_ns")}, {"kernels": 4})
    newer = _analysis(
        {"kernels": kernels}, {"kernels": 4, "new_metric": 7.5}, findings=[Finding("top_kernel", "info", "gemm", "")]
    )
    cpu_only = _analysis({"kernels": kernels}, {}, sources=("nvtx",))
    result = compare({"older": older, "newer": newer, "cpu": cpu_only})
    assert not result.per_step  # no steps table anywhere: capture totals in ms
    families = result.table[result.table["section"] == "kernel_families"].set_index("item")
    assert families.loc["gemm", "newer"] == 3.0 and families.loc["copy", "newer"] == 1.0
    assert families[["older", "cpu"]].isna().all().all() and set(families["unit"]) == {"ms"}
    headline = result.table[result.table["section"] == "headline"].set_index("item")
    assert headline.loc["new_metric", "newer"] == 7.5 and pd.isna(headline.loc["new_metric", "older"])
    assert headline.loc["kernel launches", "older"] == 4 and pd.isna(headline.loc["kernel launches", "cpu"])
    assert result.findings.set_index("rule").loc["top_kernel", "fired_in"] == "newer"


def test_workflow_folders_expand_to_ranks_and_get_short_labels(full_and_window, tmp_path, capsys):
    root, *_ = full_and_window
    for window in ("steady", "warmup"):
        for rank in ("rank0", "rank1"):
            source = root / ("full" if rank == "rank0" else "window") / "analysis"
            results.save(results.load(source), tmp_path / "results" / "exp" / window / "analysis" / rank)
    assert sftprof_main(["compare", str(tmp_path / "results" / "exp" / "steady"), "-o", str(tmp_path / "o")]) == 0
    assert "baseline rank0:" in capsys.readouterr().out
    columns = pd.read_csv(tmp_path / "o" / "comparison.csv").columns
    assert {"rank0", "rank1", DELTA + "rank1"} <= set(columns)
    runs = [tmp_path / "results" / "exp" / w / "analysis" / "rank0" for w in ("steady", "warmup")]
    assert unique_labels(runs) == ["steady/rank0", "warmup/rank0"]
    assert unique_labels([runs[0], runs[0]]) == ["rank0", "rank0 (2)"]


@pytest.mark.parametrize(
    "inputs, message",
    [
        (["{full}"], "give at least two inputs"),
        (["{full}", "{missing}"], "no such file or folder"),
        (["{full}", "{empty_dir}"], "no analysis.json in it"),
    ],
)
def test_bad_inputs_are_one_clear_error(full_and_window, tmp_path, capsys, inputs, message):
    root, *_ = full_and_window
    (tmp_path / "empty").mkdir()
    paths = [p.format(full=root / "full", missing=tmp_path / "nope", empty_dir=tmp_path / "empty") for p in inputs]
    assert sftprof_main(["compare", *paths, "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("sftprof: error: ") and message in err and "Traceback" not in err
