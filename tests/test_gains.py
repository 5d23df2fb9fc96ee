"""Attainable gains: each finding's share of the median step that fixing it could save, and the ranking
by it. On the committed real captures every gain is recomputed here from the export's own rows (plain
SQL over the CUPTI and NVTX tables and brute-force interval arithmetic), not taken from the analysis;
on tables built here, from the numbers the test chose."""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import statistics
from pathlib import Path

import pandas as pd
import pytest

from sftprof import results
from sftprof.analysis import Analysis, analyze, boundness, cpu, gains, overhead, rules
from sftprof.analysis import idle as idle_module
from sftprof.analysis.compare import DELTA, GAIN, GAINS, compare
from sftprof.analysis.findings import WARNING_SHARE_PCT, Finding, ranked
from sftprof.analysis.spilled import SpilledUnion
from sftprof.report.html import RankReport, render_html
from sftprof.trace import load_trace
from sftprof.trace.events import EventStore
from sftprof.trace.tables import COLUMNS, TraceTables

from conftest import kernel_row

FIXTURES = Path(__file__).parent / "fixtures"
MS = 1_000_000


def plant(name: str) -> Path:
    return FIXTURES / f"h200_plant_{name}.sqlite"


@pytest.fixture(scope="module")
def analyses() -> dict:
    """Each committed capture, analysed once."""
    paths = {name: plant(name) for name in ("clean", "device_sync", "sync_memcpy", "cpu_starved", "elementwise")}
    paths |= {
        "tiny_llama": FIXTURES / "h200_tiny_llama_bf16.sqlite",
        "kineto_clean": FIXTURES / "h200_plant_clean.pt.trace.json.gz",
        "kineto_cpu": FIXTURES / "cpu_tiny_llama.pt.trace.json.gz",
    }
    return {name: analyze(load_trace(path)) for name, path in paths.items()}


def by_rule(analysis) -> dict[str, Finding]:
    return {f.rule: f for f in analysis.findings}


# ---------------------------------------------------------------- the export, read independently


def rows(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        return conn.execute(sql).fetchall()


def merge(spans) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def covered(merged, start: int, end: int) -> int:
    return sum(max(0, min(e, end) - max(s, start)) for s, e in merged)


def gpu_busy(path: Path) -> list[tuple[int, int]]:
    """Every kernel, copy and set (start > 0, as nsys's utilisation rules), merged over streams."""
    return merge(
        rows(
            path,
            """SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start > 0
                               UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE start > 0
                               UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE start > 0""",
        )
    )


def steps(path: Path) -> list[tuple[int, int]]:
    return sorted(rows(path, "SELECT start, \"end\" FROM NVTX_EVENTS WHERE text LIKE 'step %'"))


def calls(path: Path, name: str) -> list[tuple[int, int, int]]:
    """Runtime calls of this name: start, end, correlation id."""
    return rows(
        path,
        f"""SELECT r.start, r."end", r.correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME r
                          JOIN StringIds s ON s.id = r.nameId WHERE s.value LIKE '{name}\\_v%' ESCAPE '\\'""",
    )


def idle_after(busy, start: int, end: int) -> int:
    """The GPU idle after a call: from when the GPU ran dry (or the call began) to the next GPU work."""
    before = [e for s, e in busy if s <= end]
    if before and max(before) > end:
        return 0  # still running when the call returned
    later = [s for s, _ in busy if s > end]
    return later[0] - max(max(before, default=start), start) if later else 0


def per_step_share(step_spans, amounts: dict[int, float]) -> float:
    """The median over steps of amounts keyed by time, as % of the median step."""
    per_step = [sum(v for t, v in amounts.items() if s <= t < e) for s, e in step_spans]
    return 100.0 * statistics.median(per_step) / statistics.median(e - s for s, e in step_spans)


def cpu_wait_per_step(path: Path, step_spans) -> list[int]:
    """Per step, when the CPU waited for the GPU: synchronizing calls and launches over 200 µs."""
    waits = rows(
        path,
        """SELECT r.start, r."end" FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
                          WHERE s.value LIKE 'cuda%Synchronize%' OR s.value LIKE 'cudaMemcpy\\_v%' ESCAPE '\\'
                             OR (s.value LIKE 'cudaLaunchKernel%' AND r."end" - r.start > 200000)""",
    )
    merged = merge(waits)
    return [covered(merged, s, e) for s, e in step_spans]


# ---------------------------------------------------------------- the committed captures


def test_the_clean_loop_warns_only_that_its_host_cannot_keep_the_gpu_busy(analyses):
    """The clean plant (a 4-layer model) plants no problem, yet its GPU idles 70% of each step in gaps under
    1 ms while the CPU runs Python between launches: every step's own class (step_accounting) is
    launch/host-bound, and the one warning says so, from the nsys and the Kineto capture alike."""
    for name in ("clean", "kineto_clean"):
        analysis = analyses[name]
        assert [f.rule for f in analysis.findings if f.severity == "warning"] == ["launch_bound"], name
        classes = set(analysis.tables["step_accounting"]["bound_class"])
        assert classes == {"launch/host-bound"}, name


def test_a_synchronous_copy_costs_the_idle_the_table_puts_on_it_and_its_copy_time_is_the_interconnects(analyses):
    """cudaMemcpy of the logits to pageable memory: the CPU waits ~54 ms per call while the copy runs
    alone on the GPU, then stages it while the GPU idles, and launches the next work late. The sync_memcpy
    finding's gain is the idle time idle_causes puts on those calls (inside them, re-derived from the file, and
    the launches they delayed); the copy's own GPU time is the interconnect finding's, which ranks first."""
    path = plant("sync_memcpy")
    busy, step_spans = gpu_busy(path), steps(path)
    analysis = analyses["sync_memcpy"]
    causes = analysis.tables["idle_causes"]
    mine = causes[(causes["cause"] == "synchronization") & causes["name"].str.startswith("cudaMemcpy")]
    assert len(mine) == len(causes[causes["cause"] == "synchronization"])  # the plant makes no other sync
    per_step = mine.groupby("step")["idle_ns"].sum()
    median_step = statistics.median(e - s for s, e in step_spans)
    finding = by_rule(analysis)["sync_memcpy"]
    assert finding.gain_pct == pytest.approx(100 * per_step.median() / median_step, abs=1e-3)
    assert finding.gain_pct > WARNING_SHARE_PCT and finding.severity == "warning"
    # inside the calls: each call's time with the GPU idle, cut at the step's edges
    inside = mine[mine["source"] == "CUDA API"].groupby("step")["idle_ns"].sum()
    in_calls = [
        sum(
            max(0, min(e, end) - max(s, start)) - covered(busy, max(s, start), min(e, end))
            for start, end, _ in calls(path, "cudaMemcpy")
            if start < e and end > s
        )
        for s, e in step_spans
    ]
    in_order = analysis.tables["steps"].sort_values("start")["step"]
    assert [int(inside.get(step, 0)) for step in in_order] == in_calls
    assert (mine["source"] == "launches a call delayed").any()
    assert analysis.findings[0].rule == "interconnect" and "the interconnect finding's" in finding.evidence


def test_a_device_sync_after_the_gpu_ran_dry_costs_only_its_short_wait(analyses):
    """plants.py device_sync: torch.cuda.synchronize() after each micro-batch. The GPU had run out of
    work before each call (the loop is CPU-bound), so each waits ~35 µs: removing them gives back only
    that, although the GPU then idles ~0.3-0.6 ms until the next batch's work arrives."""
    path = plant("device_sync")
    busy, step_spans = gpu_busy(path), steps(path)
    syncs = calls(path, "cudaDeviceSynchronize")
    follows = {start: idle_after(busy, start, end) for start, end, _ in syncs}
    lost = {start: min(end - start, follows[start]) for start, end, _ in syncs}
    finding = by_rule(analyses["device_sync"])["sync_in_steps"]
    assert finding.gain_pct == pytest.approx(per_step_share(step_spans, lost), abs=1e-3)
    assert 0 < finding.gain_pct < WARNING_SHARE_PCT and finding.severity == "info"
    assert min(follows.values()) > 5 * max(end - start for start, end, _ in syncs)
    assert "the GPU had run out of work when they began" in finding.evidence


def test_a_data_stall_costs_the_gpu_idle_inside_the_data_ranges_and_ranks_first(analyses):
    path = plant("cpu_starved")
    busy = gpu_busy(path)
    data = merge(rows(path, "SELECT start, \"end\" FROM NVTX_EVENTS WHERE text = 'data'"))
    lost = {s: (e - s) - covered(busy, s, e) for s, e in data}
    finding = analyses["cpu_starved"].findings[0]
    assert finding.rule == "data_stall" and finding.severity == "warning"
    assert finding.gain_pct == pytest.approx(per_step_share(steps(path), lost), abs=1e-3)
    assert "inside its `data` ranges (idle_causes" in finding.gain_basis


def test_fused_runs_save_only_the_launches_they_remove_while_the_cpu_never_waits(analyses):
    """The elementwise plant's model is all elementwise and reduction kernels, but its CPU builds each batch for
    ~100 ms and never waits for the GPU: fused kernels would leave the GPU idle longer, and the step shortens
    only by the host time of the launches fusion removes, less than the GPU time it saves. The runs, and their
    fused time (one pass per reduction, or the longest kernel), re-derived from the kernel rows."""
    path = plant("elementwise")
    kernels = rows(
        path,
        """SELECT k.streamId, k.start, k."end", s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k
                            JOIN StringIds s ON s.id = k.shortName ORDER BY k.streamId, k.start, k."end" """,
    )
    runs, current, stream = [], [], None
    for stream_id, start, end, short in kernels:
        fusable = "elementwise_kernel" in short or "reduce_kernel" in short
        if stream_id != stream or not fusable:
            runs.append(current)
            current = []
        stream = stream_id
        if fusable:
            current.append((end - start, "reduce_kernel" in short))
    runs = [run for run in runs + [current] if len(run) > 1]
    finding = by_rule(analyses["elementwise"])["memory_bound_kernel_mix"]
    total = sum(d for run in runs for d, _ in run)
    fused = sum(max(max(d for d, _ in run), sum(d for d, reduce in run if reduce)) for run in runs)
    assert f"{len(runs):,} runs of 2 or more elementwise, reduction or norm kernels" in finding.evidence
    assert (
        f"({sum(map(len, runs)):,} kernels, {total / MS:,.3f} ms) would take {fused / MS:,.3f} ms fused"
        in finding.evidence
    )
    assert cpu_wait_per_step(path, steps(path)) == [0, 0]
    step_ms = statistics.median(end - start for start, end in steps(path)) / MS
    assert 0 < finding.gain_pct < 100 * (total - fused) / MS / len(steps(path)) / step_ms
    assert by_rule(analyses["elementwise"])["bound_verdict"].title.endswith("kernels are memory-bound")
    assert analyses["elementwise"].findings[0].rule == "data_stall"


def test_launch_bound_gain_is_the_idle_while_the_host_launched_and_dispatched(analyses):
    """The launch-bound capture: its gain is the idle time idle_causes puts on host overhead, which here is nearly
    all of the GPU's idle time in gaps of 1 ms or less, re-derived from the file (the `data` ranges take under
    10% of the step: their idle time is no data stall's)."""
    path = FIXTURES / "h200_tiny_llama_bf16.sqlite"
    busy, step_spans = gpu_busy(path), steps(path)
    gaps = [(e, s) for (_, e), (s, _) in zip(busy, busy[1:]) if 0 < s - e <= 1_000_000]
    short_idle = [sum(covered([gap], s, e) for gap in gaps) for s, e in step_spans]
    median_step = statistics.median(e - s for s, e in step_spans)
    analysis = analyses["tiny_llama"]
    finding = analysis.findings[0]
    assert finding.rule == "launch_bound" and finding.severity == "warning"
    causes = analysis.tables["idle_causes"]
    host = causes[causes["cause"] == "host overhead"].groupby("step")["idle_ns"].sum()
    assert finding.gain_pct == pytest.approx(100 * host.median() / median_step, abs=1e-3)
    assert 0.9 * statistics.median(short_idle) <= host.median() <= statistics.median(short_idle) * 1.05


def test_every_idle_nanosecond_of_a_step_has_one_cause(analyses):
    """idle_causes adds up, step by step, to the GPU's idle time inside the step, re-derived from the file:
    the step's span less the union of every kernel and memory operation in it."""
    for name, path in (("tiny_llama", FIXTURES / "h200_tiny_llama_bf16.sqlite"), ("sync_memcpy", plant("sync_memcpy"))):
        busy = gpu_busy(path)
        idle = [(e - s) - covered(busy, s, e) for s, e in steps(path)]
        causes = analyses[name].tables["idle_causes"]
        summed = causes.groupby("step")["idle_ns"].sum()
        in_order = analyses[name].tables["steps"].sort_values("start")["step"]
        assert [int(summed.get(step, 0)) for step in in_order] == idle, name
        assert (causes["idle_ns"] > 0).all() and set(causes["cause"]) <= set(idle_module.CAUSE_NAMES), name


def test_foreach_adamw_gain_is_its_bytes_model_capped_by_the_cpu_wait(analyses):
    """The built-in trainer's AdamW runs as foreach kernels (8 passes); fused it would take 28/80 of
    their time, and the step shortens by at most what the CPU waits for the GPU (its .item() syncs)."""
    path = FIXTURES / "h200_tiny_llama_bf16.sqlite"
    step_spans = steps(path)
    foreach = rows(
        path,
        """SELECT k.start, k."end" - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k
                            JOIN StringIds s ON s.id = k.demangledName
                            WHERE s.value LIKE '%multi_tensor_apply%' AND s.value NOT LIKE '%Fused%'
                              AND s.value NOT LIKE '%Norm%'""",
    )
    saved = [sum(d for t, d in foreach if s <= t < e) * (1 - 28 / 80) for s, e in step_spans]
    waited = cpu_wait_per_step(path, step_spans)
    finding = by_rule(analyses["tiny_llama"])["foreach_optimizer"]
    expected = [min(a, b) for a, b in zip(saved, waited)]
    assert finding.gain_pct == pytest.approx(
        100 * statistics.median(expected) / statistics.median(e - s for s, e in step_spans), abs=1e-3
    )
    assert 0 < statistics.median(saved) and 0 < statistics.median(waited)
    assert "28/80" in finding.gain_basis


def test_findings_are_ranked_by_gain_then_warnings_then_notes(analyses):
    for name, analysis in analyses.items():
        gained = [f.gain_pct for f in analysis.findings if f.gain_pct is not None]
        assert gained == sorted(gained, reverse=True), name
        first_without = next((i for i, f in enumerate(analysis.findings) if f.gain_pct is None), len(analysis.findings))
        assert all(f.gain_pct is None for f in analysis.findings[first_without:]), name
        for finding in analysis.findings:
            if finding.gain_pct is not None:
                assert finding.severity == ("warning" if finding.gain_pct >= WARNING_SHARE_PCT else "info"), finding
                assert finding.gain_basis and 0 <= finding.gain_pct <= 100


def test_an_empty_trace_kind_is_named_once_from_what_nsys_recorded(analyses, tmp_path):
    """The plants traced cudnn; nsys's diagnostics, kept among the export's strings, say it collected nothing."""
    [(message,)] = rows(plant("clean"), "SELECT value FROM StringIds WHERE value LIKE 'No cuDNN events collected%'")
    [note] = [f for f in analyses["clean"].findings if f.rule == "empty_trace_kind"]
    assert note.title.endswith(": cuDNN") and message in note.evidence
    html = render_html([RankReport("", analyses["clean"])], "clean")
    assert html.count("Traced but recorded nothing") == 1
    assert html.index("Traced but recorded nothing") < html.index('id="summary"')
    assert not any(f.rule == "empty_trace_kind" for f in analyses["kineto_clean"].findings)  # no such record there


def test_the_headline_top_kernel_is_the_top_name_over_all_launch_shapes(analyses):
    path = plant("device_sync")
    by_name = rows(
        path,
        """SELECT s.value, sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                            JOIN StringIds s ON s.id = k.demangledName GROUP BY 1 ORDER BY 2 DESC""",
    )
    total = sum(ns for _, ns in by_name)
    headline = analyses["device_sync"].headline
    assert headline["top_kernel"] == by_name[0][0]
    assert headline["top_kernel_pct"] == round(100 * by_name[0][1] / total, 1)
    shapes = analyses["device_sync"].tables["kernels"]
    assert (shapes["kernel"] == by_name[0][0]).sum() > 1  # two launch shapes, each smaller than the name's total
    for key in ("bound_class", "mfu_pct", "padding_pct", "sm_busy_pct", "copy_busy_pct"):
        assert key in headline


# ---------------------------------------------------------------- PyTorch profiler steps


def _kineto_copy(tmp_path: Path, rename) -> Path:
    with gzip.open(FIXTURES / "cpu_tiny_llama.pt.trace.json.gz", "rt") as stream:
        trace = json.load(stream)
    for event in trace["traceEvents"]:
        if event.get("cat") == "user_annotation":
            event["name"] = rename(event["name"])
    path = tmp_path / "profiler_steps.pt.trace.json.gz"
    with gzip.open(path, "wt") as stream:
        json.dump(trace, stream)
    return path


def test_profiler_step_ranges_count_as_steps_and_no_phases_means_no_phase_finding(tmp_path):
    """torch.profiler's `ProfilerStep#N` ranges are the steps of a loop without its own `step N`
    ranges; without phase ranges nothing is said about phases (no "data takes 0.0%")."""
    path = _kineto_copy(
        tmp_path,
        lambda name: re.sub(r"^step (\d+)$", r"ProfilerStep#\1", name)
        .replace("data", "load")
        .replace("forward", "fwd")
        .replace("backward", "bwd")
        .replace("optimizer", "opt"),
    )
    result = analyze(load_trace(path))
    assert list(result.tables["steps"]["step"]) == [1, 2, 3] and result.headline["steps_captured"] == 3
    assert {"dominant_phase", "data_stall", "no_steps"}.isdisjoint(f.rule for f in result.findings)


def test_own_step_ranges_win_over_profiler_steps():
    def ranges(*spans):
        return pd.DataFrame(
            [
                {
                    "start": s,
                    "end": e,
                    "duration": e - s,
                    "name": n,
                    "style": "PushPop",
                    "global_tid": 1,
                    "pid": 1,
                    "tid": 1,
                }
                for n, s, e in spans
            ],
            columns=COLUMNS["nvtx"],
        )

    both = ranges(("ProfilerStep#7", 0, 100), ("step 3", 5, 95), ("ProfilerStep#8", 100, 200), ("step 4", 105, 195))
    assert list(cpu.step_table(both)["step"]) == [3, 4]
    assert list(cpu.step_table(ranges(("ProfilerStep#7", 0, 100)))["step"]) == [7]


# ---------------------------------------------------------------- tables built here


def kernel(name: str, start: int, duration: int, short: str | None = None, correlation: int = 0) -> dict:
    return kernel_row(name, start, duration, short, correlation, pid=1)


FOREACH = "void at::native::multi_tensor_apply_kernel<TensorListMetadata<2>, BinaryOpListAlphaFunctor<float>>(T1)"
EW = "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>(int, T2, T3)"
GEMM = "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT"
PROCESS_1 = (1 << 24) | 1  # thread 1 of process 1, whose kernels these are


def busy_gpu_loop(steps_n: int = 3) -> TraceTables:
    """A GPU-bound step of 100 ms, as in a Llama-7B SFT: kernels back to back for 99.9 ms (a 55 ms GEMM,
    three 5 ms elementwise kernels, foreach AdamW 4 x 5 ms, the rest GEMM), and one loss.item() whose
    cudaStreamSynchronize waits ~99 ms for the busy GPU; the next step's first kernel follows 100 µs
    after it returns, launched by a 5 µs cudaLaunchKernel that returns as it starts (the others' launches are
    not traced)."""
    kernels, nvtx, api = [], [], []
    for step in range(steps_n):
        t0 = step * 100 * MS
        t = t0 + 20_000
        api.append({"start": t - 5_000, "end": t, "name": "cudaLaunchKernel", "correlation_id": 1_000 + step})
        for name, short, duration in (
            [(GEMM, GEMM, 55 * MS)]
            + [(EW, "vectorized_elementwise_kernel", 5 * MS)] * 3
            + [(FOREACH, "multi_tensor_apply_kernel", 5 * MS)] * 4
            + [(GEMM, GEMM, 99_900_000 - 90 * MS)]
        ):
            kernels.append(kernel(name, t, duration, short, 1_000 + step if t == t0 + 20_000 else 0))
            t += duration
        nvtx.append({"start": t0, "end": t0 + 100 * MS, "name": f"step {step}"})
        api.append({"start": t0 + MS, "end": t, "name": "cudaStreamSynchronize"})
    nvtx = pd.DataFrame(
        [
            {**r, "duration": r["end"] - r["start"], "style": "PushPop", "global_tid": PROCESS_1, "pid": 1, "tid": 1}
            for r in nvtx
        ],
        columns=COLUMNS["nvtx"],
    )
    api = pd.DataFrame(
        [
            {
                "correlation_id": 100 + i,
                **r,
                "duration": r["end"] - r["start"],
                "global_tid": PROCESS_1,
                "pid": 1,
                "tid": 1,
            }
            for i, r in enumerate(api)
        ],
        columns=COLUMNS["cuda_api"],
    )
    events = EventStore.from_frames(kernels=pd.DataFrame(kernels), cuda_api=api, nvtx=nvtx)
    return TraceTables(source_path="busy", span_ns=steps_n * 100 * MS, sources={"cuda", "nvtx"}, events=events)


def test_a_sync_on_a_busy_gpu_costs_nearly_nothing_and_fusion_ranks_first():
    result = analyze(busy_gpu_loop())
    found = by_rule(result)
    sync = found["sync_in_steps"]
    # the 100 µs after each (the launch it delayed: idle_causes' `launches a call delayed`), 80 µs of it in the
    # sync's step and 20 in the next: the median step holds 80 (the last step's 80 µs have no launch after them)
    assert sync.gain_pct == pytest.approx(100 * 80_000 / (100 * MS), abs=1e-3)
    views = result.tables["idle_causes"]
    assert views[views["cause"] == "synchronization"].groupby("step")["idle_ns"].sum().to_dict() == {
        0: 80_000,
        1: 100_000,
        2: 20_000,
    }
    assert sync.severity == "info" and "the CPU waits for a busy GPU" in sync.evidence
    assert "the CPU waits 98.920 ms per step" in sync.title  # what the CPU waited: no measure of what it costs
    assert found["foreach_optimizer"].gain_pct == pytest.approx(100 * 20 * (1 - 28 / 80) / 100)  # 13% of 100 ms
    assert found["memory_bound_kernel_mix"].gain_pct == pytest.approx(10.0)  # 15 ms fused into 5 ms
    assert [f.rule for f in result.findings[:2]] == ["foreach_optimizer", "memory_bound_kernel_mix"]
    assert "dominant_phase" not in found  # no phase ranges: nothing said about phases


def test_compute_bound_advice_never_offers_a_precision_the_run_has():
    compute_bound = boundness.verdict({"compute_pct": 85.0, "memory_pct": 10.0, "tensor_core_pct": 80.0}, 97.0, {})
    nvjet_only = pd.DataFrame({"precision": ["not in the name"], "time_pct": [100.0]})
    bf16_run = boundness.verdict_finding(compute_bound, nvjet_only, "bfloat16").recommendation
    assert "already run in bf16 (the run reports bfloat16)" in bf16_run and "FP8" in bf16_run
    assert "torch.autocast" not in bf16_run
    unknown = boundness.verdict_finding(compute_bound, nvjet_only).recommendation
    assert "do not tell the GEMM precision" in unknown and "run in fp32" not in unknown.replace("a run in fp32", "")
    by_name = pd.DataFrame({"precision": ["bf16", "not in the name"], "time_pct": [5.0, 95.0]})
    assert "already run in bf16 (by kernel name)" in boundness.verdict_finding(compute_bound, by_name).recommendation
    fp32 = pd.DataFrame({"precision": ["fp32"], "time_pct": [90.0]})
    assert "bf16 (torch.autocast" in boundness.verdict_finding(compute_bound, fp32).recommendation
    fp8_run = boundness.verdict_finding(compute_bound, nvjet_only, "fp8").recommendation
    assert "already run in fp8" in fp8_run and "FP8 GEMMs" not in fp8_run


def test_padding_gain_is_the_padded_share_of_token_proportional_time():
    [padded] = rules.padding(0.30, 500 * MS, 790 * MS)
    assert padded.gain_pct == pytest.approx(100 * 0.30 * 500 / 790, abs=1e-3) and padded.severity == "warning"
    [little] = rules.padding(0.02, 100 * MS, 790 * MS)
    assert little.gain_pct == pytest.approx(100 * 0.02 * 100 / 790, abs=1e-3) and little.severity == "info"
    assert "of the 790.000 ms step" in little.evidence
    assert rules.padding(0.0, 100 * MS, 790 * MS) == [] and rules.padding(None, None, None) == []


def test_ranking_puts_gains_first_then_warnings_then_notes_in_order():
    findings = [
        Finding("a", "info", "", "", gain_pct=None),
        Finding("b", "info", "", "", gain_pct=1.0),
        Finding("c", "warning", "", "", gain_pct=None),
        Finding("d", "warning", "", "", gain_pct=30.0),
        Finding("e", "info", "", "", gain_pct=0.0),
        Finding("f", "info", "", "", gain_pct=None),
    ]
    assert [f.rule for f in ranked(findings)] == ["d", "b", "e", "c", "a", "f"]


def test_slow_steps_follow_the_largest_cause_nearly_as_large():
    """slow_steps says where, not why: it goes just after the first finding below it of work in a few of the steps
    priced at least 75% of it, and keeps its place where none is."""
    slow = Finding("slow_steps", "warning", "", "", gain_pct=26.0)
    cause = Finding("extra_forward", "warning", "", "", gain_pct=25.0, few_steps=True)
    other = Finding("memory_bound_kernel_mix", "warning", "", "", gain_pct=21.0)
    assert [f.rule for f in ranked([other, slow, cause])] == ["extra_forward", "slow_steps", "memory_bound_kernel_mix"]
    small = Finding("extra_forward", "warning", "", "", gain_pct=18.0, few_steps=True)  # under 75% of 26
    assert [f.rule for f in ranked([small, slow])] == ["slow_steps", "extra_forward"]
    everywhere = Finding("launch_bound", "warning", "", "", gain_pct=25.0)  # in every step: not what made some slow
    assert [f.rule for f in ranked([everywhere, slow])] == ["slow_steps", "launch_bound"]


def test_fused_attention_frees_the_host_time_of_the_launches_it_removes():
    """A host-bound step (the CPU never waits) with one unfused attention: fused attention saves no more GPU
    time than its glue and GEMMs, and in this step only the host's launch path in the share of launches it
    removes (glue kernels and both GEMMs, one fused kernel for them); ChainTotals.host_freed, as for fusion."""
    from sftprof.analysis import excess

    busy = pd.DataFrame({"start": [0], "end": [400_000]})
    clock = gains.StepClock.of(pd.DataFrame(), 1_000_000, SpilledUnion.of(busy), SpilledUnion().finish())
    chains = gains.ChainTotals(clock.starts, clock.ends)
    chains.kernels_by_step[:] = 100
    chains.launch_path_by_step[:] = 600_000
    runs = pd.DataFrame(
        {"start": [10], "glue_ns": [200_000], "gemm_ns": [100_000], "full_gemm_ns": [0], "softmax_ns": [50_000]}
    )
    runs["kernels"] = [9]  # 9 glue kernels and 2 GEMMs become 1: 10 of the step's 100 launches removed
    (finding,) = excess.unfused_attention_finding(runs, clock, chains)
    assert finding.gain_pct == pytest.approx(100 * 600_000 * 10 / 100 / 1_000_000)
    chains.kernels_by_step[:] = 10  # every launch removed, the whole host path freed: the GPU time saved caps it
    (finding,) = excess.unfused_attention_finding(runs, clock, chains)
    assert finding.gain_pct == pytest.approx(100 * 300_000 / 1_000_000)


# ---------------------------------------------------------------- analysis.json, report, compare


def test_gains_round_trip_through_analysis_json_and_bad_ones_are_refused(tmp_path):
    result = analyze(busy_gpu_loop())
    results.save(result, tmp_path / "a")
    loaded = results.load(tmp_path / "a")
    assert loaded.findings == result.findings
    summary = json.loads((tmp_path / "a" / results.SUMMARY_FILE).read_text())
    assert [f["gain_pct"] for f in summary["findings"]] == [f.gain_pct for f in result.findings]
    assert set(summary["findings"][0]) == {
        "rule",
        "severity",
        "title",
        "evidence",
        "recommendation",
        "gain_pct",
        "gain_basis",
        "few_steps",
    }
    for bad in ("12", 101, float("nan"), True):
        summary["findings"][0]["gain_pct"] = bad
        (tmp_path / "a" / results.SUMMARY_FILE).write_text(json.dumps(summary))
        with pytest.raises(results.ResultsError, match="findings must be"):
            results.load(tmp_path / "a")
    summary["findings"][0]["gain_pct"] = None
    summary["findings"][0]["few_steps"] = "yes"
    (tmp_path / "a" / results.SUMMARY_FILE).write_text(json.dumps(summary))
    with pytest.raises(results.ResultsError, match="findings must be"):
        results.load(tmp_path / "a")
    for finding in summary["findings"]:  # as sftprof wrote it before gains
        finding.pop("gain_pct"), finding.pop("gain_basis"), finding.pop("few_steps")
    (tmp_path / "a" / results.SUMMARY_FILE).write_text(json.dumps(summary))
    assert all(f.gain_pct is None for f in results.load(tmp_path / "a").findings)


def test_the_report_opens_with_the_ranked_gains():
    result = analyze(busy_gpu_loop())
    html = render_html([RankReport("", result)], "busy")
    first_table = html[html.index('id="first"') : html.index('id="summary"')]
    assert html.index('id="first"') < min(html.index(f'id="{anchor}"') for anchor in ("summary", "kernels", "steps"))
    shown = re.findall(r'<tr class="(\w+)" data-rule="(\w+)"><td>([^<]+)</td>', first_table)
    assert [rule for _, rule, _ in shown][:2] == ["foreach_optimizer", "memory_bound_kernel_mix"]
    assert shown[0][2] == "13.0%" and ("info", "sync_in_steps", "0.1%") in shown


def test_compare_takes_the_gains_from_each_analysis():
    def saved(gains_by_rule):
        return Analysis(
            source_path="x",
            span_ns=MS,
            sources=["cuda"],
            findings=[Finding(rule, "info", rule, "", gain_pct=gain) for rule, gain in gains_by_rule.items()],
        )

    before = saved({"sync_in_steps": 19.6, "foreach_optimizer": 6.8})
    after = saved({"foreach_optimizer": 0.5, "launch_bound": 2.0})
    result = compare({"before": before, "after": after})
    table = result.table[result.table["section"] == GAINS].set_index("item")
    assert list(table.index) == ["sync_in_steps", "foreach_optimizer", "launch_bound"]  # largest first
    assert table.loc["foreach_optimizer", DELTA + "after"] == pytest.approx(0.5 - 6.8)
    assert pd.isna(table.loc["sync_in_steps", "after"]) and table.loc["launch_bound", "after"] == 2.0
    findings = result.findings.set_index("rule")
    assert findings.loc["foreach_optimizer", GAIN + "before"] == 6.8


# ---------------------------------------------------------------- against measured fixes (the trainer's own runs)


def sft(case: str) -> Path:
    return FIXTURES / f"h200_sft_{case}.sqlite"


def measured_step_ms(case: str) -> float:
    """The trainer's median step outside the capture window (its own clock, not the trace)."""
    records = [json.loads(line) for line in (FIXTURES / f"h200_sft_{case}.metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["step_time_s"] * 1e3 for r in records if not r["in_window"] and r["step"] >= 5)


def test_the_fused_adamw_model_matches_the_fused_kernels_measured_in_the_fixed_run():
    """h200_sft_foreach_adamw and h200_sft_clean differ only in AdamW(fused=...): the fused kernels of
    the clean run take what the bytes model (28 of 80 B/param) predicts from the foreach kernels."""
    per_step = {}
    for case, kind in (("foreach_adamw", "NOT LIKE '%Fused%'"), ("clean", "LIKE '%Fused%'")):
        [(ns,)] = rows(
            sft(case),
            f"""SELECT sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k
                                     JOIN StringIds s ON s.id = k.demangledName
                                     WHERE s.value LIKE '%multi_tensor_apply%' AND s.value {kind}""",
        )
        per_step[case] = ns / len(steps(sft(case)))
    predicted = per_step["foreach_adamw"] * gains.FUSED_ADAMW_BYTES / gains.FOREACH_ADAMW_BYTES
    assert predicted == pytest.approx(per_step["clean"], rel=0.1)


def test_the_data_stall_gain_bounds_the_saving_measured_when_it_was_fixed():
    """h200_sft_data_stall is the clean run with a 100 ms sleep in each micro-batch's data range: its
    data-stall gain is an upper bound on what removing the sleep saved on the trainer's own clock."""
    [stall] = [f for f in analyze(load_trace(sft("data_stall"))).findings if f.rule == "data_stall"]
    saved = 100 * (measured_step_ms("data_stall") - measured_step_ms("clean")) / measured_step_ms("data_stall")
    assert saved <= stall.gain_pct <= saved + 10 and stall.severity == "warning"


def test_fp32_counts_attention_it_leaves_unfused_once_as_fused_in_bf16():
    """A GPU-bound step (the CPU waits 0.8 of it) with tf32 GEMMs (bf16 taken as 2x on an unknown GPU), memory-bound
    kernels, and one unfused attention run: the fp32 finding takes half the GEMM time, half the memory-bound time,
    and of the run what those rates did not already take (its glue and GEMMs become one fused kernel)."""
    busy = pd.DataFrame({"start": [0], "end": [900_000]})
    waits = pd.DataFrame({"start": [100_000], "end": [900_000]})
    clock = gains.StepClock.of(pd.DataFrame(), 1_000_000, SpilledUnion.of(busy), SpilledUnion.of(waits))
    chains = gains.ChainTotals(clock.starts, clock.ends)
    chains.kernels_by_step[:] = 100
    precision = pd.DataFrame(
        [{"precision": "tf32", "time_pct": 100.0, "total_ns": 300_000, "instances": 4, "top_kernel": "tf32_gemm"}]
    )
    families = pd.DataFrame({"family": ["elementwise"], "total_ns": [400_000]})
    runs = pd.DataFrame(
        {"start": [10], "glue_ns": [200_000], "gemm_ns": [100_000], "full_gemm_ns": [100_000], "softmax_ns": [50_000]}
    )
    runs["kernels"] = [5]
    (alone,) = rules.fp32_gemm(precision, clock, None, None, families)
    assert alone.gain_pct == pytest.approx(100 * (150_000 + 200_000) / 1_000_000)
    (merged,) = rules.fp32_gemm(precision, clock, None, None, families, runs, chains)
    assert merged.gain_pct == pytest.approx(100 * (150_000 + 200_000 + 300_000 - 50_000 - 100_000) / 1_000_000)
    assert "Attention runs unfused" in merged.evidence and "allow_tf32" not in merged.recommendation


def test_a_gpu_side_gain_may_take_the_host_time_the_profiler_added():
    """A step the CPU waits 0.1 of: a GPU saving of 0.3 of the step is capped at that wait in the capture, and at the
    wait plus the host time the profiler added (0.15 of the step) on the run's own clock, never beyond the saving."""
    busy = pd.DataFrame({"start": [0], "end": [900_000]})
    waits = pd.DataFrame({"start": [800_000], "end": [900_000]})
    clock = gains.StepClock.of(pd.DataFrame(), 1_000_000, SpilledUnion.of(busy), SpilledUnion.of(waits))
    added = overhead.Overhead(
        in_window_ns=1_000_000, unprofiled_ns=850_000, window_steps=1, outside_steps=5, timer_window_ms=(1.0,)
    )
    own = overhead.unprofiled_clock(clock, added)
    assert clock.gpu_side([300_000]) == pytest.approx([100_000])
    assert own.gpu_side([300_000]) == pytest.approx([250_000]) and own.gpu_side([200_000]) == pytest.approx([200_000])
    assert overhead.unprofiled_clock(clock, None) is clock


@pytest.mark.parametrize("cast, fp16", [("bfloat16_copy_kernel_cuda", False), ("float16_copy_kernel_cuda", True)])
def test_float32_weights_prices_the_casts_both_ways_and_says_when_the_run_casts_to_fp16(cast, fp16):
    """Casts to 16 bits and back count whole, the float32 optimizer and layer norms half; an fp16 run is told that
    fp16 weights need a loss scaler."""
    busy = pd.DataFrame({"start": [0], "end": [1_000_000]})
    waits = pd.DataFrame({"start": [0], "end": [900_000]})
    clock = gains.StepClock.of(pd.DataFrame(), 1_000_000, SpilledUnion.of(busy), SpilledUnion.of(waits))
    found = pd.DataFrame(
        {
            "kind": ["cast", "cast_back", "optimizer", "norm"],
            "kernel": [
                f"at::native::{cast}(at::TensorIteratorBase &)",
                "direct_copy_kernel_cuda [lambda(float)] LoadWithCast",
                "multi_tensor_apply_kernel<FusedAdamMathFunctor<float, 4>>",
                "vectorized_layer_norm_kernel<float, float>",
            ],
            "total_ns": [100_000, 60_000, 80_000, 40_000],
            "instances": [10, 5, 1, 2],
        }
    )
    (finding,) = rules.float32_weights(found, clock)
    assert finding.gain_pct == pytest.approx(100 * (100_000 + 60_000 + 0.5 * (80_000 + 40_000)) / 1_000_000)
    assert ("loss scaler" in finding.recommendation) == fp16 and "precision bf16-true" in finding.recommendation
