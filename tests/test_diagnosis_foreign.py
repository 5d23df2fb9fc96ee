"""The diagnosis on model families and a loop sftprof's rules were not written on (tests/fixtures/foreign: a
GPT-NeoX of Pythia-410M's shape with `iteration N` ranges; then, planted blind, an OPT with `batch N` ranges, a
GPT-2 with `fwd_bwd_opt N` ranges, a GPTBigCode with `train_step N` ranges, a Phi with `opt_step N` ranges and a
Gemma with `minibatch N` ranges; one problem planted per capture, nsys 2025.3 on an H100), against the saving of each fix measured without the profiler
in the same session, read here from the committed timings (not through sftprof)."""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from sftprof.analysis import analyze
from sftprof.analysis.kernels import GEMM_ALIGNMENT
from sftprof.analysis.rules import ALIGNMENT_SLOWDOWN
from sftprof.report.suggest import suggest
from sftprof.trace import load_trace
from sftprof.trace.metrics import read_metrics

from conftest import unpack_xz

FOREIGN = Path(__file__).parent / "fixtures" / "foreign"
RERUN = FOREIGN / "checkpointing_rerun"  # the checkpointed loop captured and measured on another day
# An OPT with `batch N` ranges: problems planted before any rule was written for them (README.md), and the finding
# that names each first.
OPT_BLIND = FOREIGN / "opt_blind"
BLIND = {
    "vocab_unaligned": "unaligned_gemm",
    "micro_batch_1": "launch_bound",
    "empty_cache": "allocator_churn",
    "anomaly_mode": "anomaly_detection",  # the rule written after this capture (tested on GPT-2's below)
}
# A GPT-2 (GPT-2 medium's shape, its Python tanh GELU, dropout 0.1) with `fwd_bwd_opt N` ranges: four more problems
# planted before any rule was looked at for them, and two fixes of the clean loop (README.md); then, in a second run,
# the gradient-norm reads again and anomaly detection, to try the rule written on the OPT's capture.
GPT2_BLIND = FOREIGN / "gpt2_blind"
GPT2_SECOND = GPT2_BLIND / "second_run"
# Four more problems planted on the GPT-2 and analysed before any rule was written for them (README.md).
GPT2_THIRD = GPT2_BLIND / "third_run"
WARMUP = 3  # iterations left out of each measured run: the first builds kernels and allocator pools
TOKENS = 8 * 1024  # micro-batch 8 x 1024 tokens an iteration (README.md)
# The target: the gain within 25% of the measured saving, or within 3 points of it.
AGREEMENT, POINTS = 0.25, 3.0
# Each planted problem and the finding that should name it first.
PLANTED = {
    "eager_attention": "unfused_attention",
    "fp32": "fp32_gemm",
    "tokenize_no_nvtx": "host_work",
    "no_cache_alloc": "allocator_churn",
    "foreach_off": "launch_bound",
    "checkpointing": "recomputation",  # not designed for; named first but under-predicted (test below)
}


def measured_runs(timings: str = "measured.jsonl") -> list[tuple[str, list[float]]]:
    """Each unprofiled run in order: its case and its iterations' times in ms, the first WARMUP left out."""
    runs: list[tuple[str, list[float]]] = []
    for line in (FOREIGN / timings).read_text().splitlines():
        row = json.loads(line)
        if not row.get("case"):
            continue
        if row["iteration"] == 0:
            runs.append((row["case"], []))
        if row["iteration"] >= WARMUP:
            runs[-1][1].append(1000 * row["s"])
    return runs


def measured_ms(timings: str = "measured.jsonl") -> dict[str, float]:
    """Median unprofiled iteration per case, over every alternating run."""
    times = defaultdict(list)
    for case, values in measured_runs(timings):
        times[case].extend(values)
    return {case: statistics.median(values) for case, values in times.items()}


def measured_saving_pct(case: str, timings: str = "measured.jsonl") -> float:
    times = measured_ms(timings)
    return 100 * (1 - times["clean"] / times[case])


def saving_in(folder: Path, case: str) -> float:
    """measured_saving_pct from the timings of a folder of FOREIGN (a blind set, a second run)."""
    return measured_saving_pct(case, str((folder / "measured.jsonl").relative_to(FOREIGN)))


def fix_saving_in(folder: Path, fix: str, case: str = "clean") -> float:
    """A fix's saving, 1 - fix / case, on the median unprofiled iterations in a folder of FOREIGN."""
    times = measured_ms(str((folder / "measured.jsonl").relative_to(FOREIGN)))
    return 100 * (1 - times[fix] / times[case])


def paired_savings_pct(case: str, timings: str = "measured.jsonl") -> list[float]:
    """The saving of each round: the case's median iteration against the clean run just before it."""
    runs = measured_runs(timings)
    return [
        100 * (1 - statistics.median(before) / statistics.median(times))
        for (previous, before), (name, times) in zip(runs, runs[1:])
        if name == case and previous == "clean"
    ]


def agrees(gain: float, measured: float) -> bool:
    return abs(gain - measured) <= max(AGREEMENT * measured, POINTS)


def own_step_times(case: str, path: Path, folder: Path = FOREIGN, real_tokens: int | None = None) -> Path:
    """The captured run's own iteration times (profiled.jsonl) as sftprof's metrics file: what a loop that
    times its steps gives `sftprof analyze --metrics` (sftprof.trace.metrics' required fields); with `real_tokens`,
    a loop that counts its tokens too (token_slots, real_tokens: the torch trainer's fields)."""
    tokens = TOKENS if real_tokens is None else real_tokens
    counts = {} if real_tokens is None else {"token_slots": TOKENS, "real_tokens": real_tokens}
    lines = []
    for line in (folder / "profiled.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["case"] == case:
            step = {"step": row["iteration"], "step_time_s": row["s"], "in_window": row["in_window"]}
            lines.append(json.dumps(step | {"tokens_per_s": tokens / row["s"]} | counts))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """Each case analysed with the run's own step times (timed=True, as a user who timed the loop would) or
    from the capture alone."""
    folder, cache = tmp_path_factory.mktemp("foreign"), {}

    def diagnose(case: str, timed: bool = True, source: Path = FOREIGN):
        if (case, timed, source) not in cache:
            name = f"{source.name}_{case}"
            tables = load_trace(unpack_xz(source / f"{case}.sqlite.xz", folder / f"{name}.sqlite"))
            metrics = read_metrics(own_step_times(case, folder / f"{name}.metrics.jsonl", source)) if timed else None
            try:
                cache[case, timed, source] = analyze(tables, metrics=metrics)
            finally:
                tables.events.close()
        return cache[case, timed, source]

    return diagnose


def test_each_fix_was_measured_to_pay():
    times = measured_ms()
    assert set(times) == {"clean", *PLANTED}
    assert all(measured_saving_pct(case) > 10 for case in PLANTED)


@pytest.mark.parametrize("case", ["eager_attention", "fp32", "tokenize_no_nvtx", "no_cache_alloc", "foreach_off"])
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


def test_per_parameter_adamw_over_predicts_without_the_runs_own_step_times(diagnosed):
    """The profiler makes every launch dearer (116 ms in the window against 91 ms outside it): from the capture
    alone the launch_bound gain counts that too and over-predicts the fix; with the run's own step times the
    profiler's added time comes out of it (the parametrized test above)."""
    top, measured = diagnosed("foreach_off", timed=False).findings[0], measured_saving_pct("foreach_off")
    assert top.rule == "launch_bound" and "`update`" in top.evidence
    assert top.gain_pct > (1 + AGREEMENT) * measured
    assert diagnosed("foreach_off").headline["profiling_overhead_pct"] > 20


@pytest.mark.parametrize("case", ["clean", "eager_attention", "fp32"])
def test_gpu_bound_cases_barely_move_with_the_runs_own_step_times(diagnosed, case):
    """Where the profiler added little (GPU-bound steps), the gains with and without the step times agree: they
    differ by the share rebased onto the run's own step and by the host time the profiler added, which the run
    without it spends waiting for the GPU (StepClock.host_slack_ns), each under 3%."""
    timed, alone = diagnosed(case).findings[0], diagnosed(case, timed=False).findings[0]
    overhead = diagnosed(case).headline["profiling_overhead_pct"]
    assert abs(overhead) < 3
    assert timed.rule == alone.rule and timed.gain_pct == pytest.approx(alone.gain_pct, rel=0.03 + abs(overhead) / 100)


def test_the_clean_run_raises_no_planted_warning(diagnosed):
    warned = {f.rule for f in diagnosed("clean").findings if f.severity == "warning"}
    assert not warned & set(PLANTED.values())


@pytest.mark.parametrize("case", ["tokenize_no_nvtx", "no_cache_alloc", "foreach_off", "checkpointing"])
def test_from_the_capture_alone_the_overhead_note_holds_what_the_profiler_added(diagnosed, case):
    """Without step times, the profiling_overhead note gives the traced events a step at overhead.EVENT_COST_NS
    each; on each host-bound case the range holds what the run's own step times say the profiler added."""
    timed = diagnosed(case).headline
    added_ms = timed["unprofiled_step_ms"] * timed["profiling_overhead_pct"] / 100
    [note] = [f for f in diagnosed(case, timed=False).findings if f.rule == "profiling_overhead"]
    low, high = (float(x.replace(",", "")) for x in re.findall(r"([\d,.]+) ms", note.title)[:2])
    assert note.severity == "info" and added_ms > 5 and low <= added_ms <= high


def test_the_clean_runs_one_warning_is_borne_out_by_torch_compile(diagnosed):
    """The clean loop's one warning, the memory-bound kernel mix (fusable runs with the GPU's next kernel queued
    behind them), against torch.compile of the same loop without the profiler: compiled_h200.jsonl, clean and
    compiled alternating twice on an H200 (the capture is the H100's, README.md)."""
    [warning] = [f for f in diagnosed("clean").findings if f.severity == "warning"]
    times = measured_ms("compiled_h200.jsonl")
    measured = 100 * (1 - times["compiled"] / times["clean"])
    assert warning.rule == "memory_bound_kernel_mix" and measured > 10
    assert agrees(warning.gain_pct, measured)


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


def test_checkpointing_is_named_first_as_recomputation_but_under_its_days_saving(diagnosed):
    """Checkpointing (a problem no rule was written for) shows first as forward kernels the backward thread
    launches again, with the idle while the CPU launched them and handed back to the backward pass, and the
    launches they delayed; second as launch_bound. Each idle nanosecond counts in one of the two; that day's
    measured saving is larger than either holds, and the two together come near it (docs/DIAGNOSIS.md)."""
    findings, measured = diagnosed("checkpointing").findings, measured_saving_pct("checkpointing")
    assert [f.rule for f in findings[:2]] == ["recomputation", "launch_bound"]
    assert diagnosed("checkpointing", timed=False).findings[0].rule == "recomputation"
    recompute = findings[0]
    assert recompute.severity == "warning" and "fprop" in recompute.evidence
    assert all(f.gain_pct < measured for f in findings[:2])
    assert agrees(sum(f.gain_pct for f in findings[:2]), measured)


def test_checkpointing_captured_and_measured_again_agrees_with_that_days_saving(diagnosed):
    """The same loop captured and measured on another day (checkpointing_rerun/, README.md): recomputation ranks
    first with the run's step times and agrees with that day's measured saving. The two days' savings differ by
    more than the agreement allows: a host-bound step's time follows the host's speed, which varied between
    rounds of one day as well (the rounds' range is asserted)."""
    top = diagnosed("checkpointing", source=RERUN).findings[0]
    measured = saving_in(RERUN, "checkpointing")
    assert top.rule == "recomputation" and agrees(top.gain_pct, measured), (top.gain_pct, measured)
    assert not agrees(measured, measured_saving_pct("checkpointing"))
    rounds = paired_savings_pct("checkpointing") + paired_savings_pct("checkpointing", f"{RERUN.name}/measured.jsonl")
    assert max(rounds) - min(rounds) > 15


@pytest.mark.parametrize("case", ["clean", "eager_attention", "fp32", "tokenize_no_nvtx", "no_cache_alloc"])
def test_no_recomputation_where_nothing_was_checkpointed(diagnosed, case):
    assert "recomputation" not in {f.rule for f in diagnosed(case).findings}


def test_no_recomputation_in_the_rerun_days_clean_capture(diagnosed):
    assert "recomputation" not in {f.rule for f in diagnosed("clean", source=RERUN).findings}


def test_suggest_tests_turning_checkpointing_off(diagnosed):
    suggested = {name: (entry, gain) for name, entry, _, gain in suggest(diagnosed("checkpointing"), top=2)}
    entry, gain = suggested["no-checkpointing"]
    assert entry["motivated_by"] == "recomputation" and entry["sft"] == {"gradient_checkpointing": False}
    assert gain == diagnosed("checkpointing").findings[0].gain_pct


def test_each_blind_fix_was_measured_to_pay():
    assert all(saving_in(OPT_BLIND, case) > 20 for case in BLIND)


@pytest.mark.parametrize("case", sorted(BLIND))
def test_a_blind_case_is_named_first(diagnosed, case):
    top = diagnosed(case, source=OPT_BLIND).findings[0]
    assert top.rule == BLIND[case] and top.severity == "warning"


@pytest.mark.parametrize("case", ["vocab_unaligned", "micro_batch_1", "anomaly_mode"])
def test_a_blind_cases_gain_agrees_with_its_measured_saving(diagnosed, case):
    top = diagnosed(case, source=OPT_BLIND).findings[0]
    assert agrees(top.gain_pct, saving_in(OPT_BLIND, case)), (top.gain_pct, saving_in(OPT_BLIND, case))


def test_emptying_the_cache_falls_short_of_its_measured_saving(diagnosed):
    """Named first, but under the measured saving by more than the agreement allows, and so are the first two
    together (docs/DIAGNOSIS.md: emptying the cache costs more than the idle its cudaMalloc and cudaFree calls
    leave)."""
    findings, measured = diagnosed("empty_cache", source=OPT_BLIND).findings, saving_in(OPT_BLIND, "empty_cache")
    assert findings[0].gain_pct < measured and not agrees(findings[0].gain_pct, measured)
    assert findings[0].gain_pct + findings[1].gain_pct < measured


def test_anomaly_detections_syncs_are_on_the_autograd_thread_and_the_advice_says_so(diagnosed):
    """The synchronizations are the backward pass's own, so anomaly_detection takes their idle, and with it the
    launch overhead, copies and queued starts between them; sync_in_steps keeps its evidence, with nothing left."""
    findings = diagnosed("anomaly_mode", source=OPT_BLIND).findings
    [sync] = [f for f in findings if f.rule == "sync_in_steps"]
    assert "pt_autograd" in sync.evidence and "anomaly_detection" in sync.recommendation and sync.gain_pct < 0.1
    assert "launch_bound" not in {f.rule for f in findings}
    assert "set_detect_anomaly(False)" in findings[0].recommendation and "isnan" in findings[0].evidence


def test_a_loop_that_reads_its_loss_is_not_told_of_anomaly_detection(diagnosed):
    cases = [("clean", OPT_BLIND), ("clean", FOREIGN), ("empty_cache", OPT_BLIND), ("clean", GPT2_BLIND)]
    cases += [("grad_norm_log", GPT2_SECOND), ("foreach_off", FOREIGN), ("checkpointing", FOREIGN)]
    for case, source in cases:
        for finding in diagnosed(case, source=source).findings:
            assert "anomaly" not in finding.recommendation + finding.rule, (case, finding.rule)


def test_the_opt_loops_batch_ranges_are_not_taken_for_steps_which_are_inferred(diagnosed):
    headline = diagnosed("clean", source=OPT_BLIND).headline
    assert headline["steps_captured"] == 4 and headline["steps_found_by"].startswith("inferred")


def test_suggest_first_tests_padding_the_vocabulary(diagnosed):
    [(name, entry, _, gain)] = suggest(diagnosed("vocab_unaligned", source=OPT_BLIND), top=1)
    assert (name, entry["sft"], entry["motivated_by"]) == (
        "pad-vocab",
        {"pad_vocab_to_multiple_of": 64},
        "unaligned_gemm",
    )
    assert gain == diagnosed("vocab_unaligned", source=OPT_BLIND).findings[0].gain_pct


def test_no_unaligned_gemm_where_every_dimension_is_a_multiple_of_8(diagnosed):
    for case, source in [("clean", OPT_BLIND), ("clean", FOREIGN), ("fp32", FOREIGN), ("micro_batch_1", OPT_BLIND)]:
        assert "unaligned_gemm" not in {f.rule for f in diagnosed(case, source=source).findings}, (case, source)


def test_the_opt_clean_runs_fusion_warning_is_not_borne_out_by_torch_compile(diagnosed):
    """The fusion warning on the clean OPT loop: torch.compile of the same loop, measured without the profiler
    (opt_blind/compiled.jsonl, clean and compiled alternating twice), saved nothing: the warning is a miss."""
    [warning] = [f for f in diagnosed("clean", source=OPT_BLIND).findings if f.severity == "warning" and f.gain_pct]
    times = measured_ms(f"{OPT_BLIND.name}/compiled.jsonl")
    assert warning.rule == "memory_bound_kernel_mix" and times["compiled"] > times["clean"]


def test_compiling_the_opt_layer_by_layer_pays_but_less_than_the_fusion_warning_gives(diagnosed):
    """Regional compilation (each decoder layer compiled, opt_blind/compiled_layers.jsonl, three clean and two
    compiled runs alternating) saved 5.1%: the warning's direction holds, its size (8.5%) is over by more than the
    agreement allows."""
    [warning] = [f for f in diagnosed("clean", source=OPT_BLIND).findings if f.severity == "warning" and f.gain_pct]
    times = measured_ms(f"{OPT_BLIND.name}/compiled_layers.jsonl")
    measured = 100 * (1 - times["compiled_layers"] / times["clean"])
    assert 3 < measured < warning.gain_pct and not agrees(warning.gain_pct, measured)


def test_compiling_the_opt_cut_less_gpu_time_than_predicted_and_left_the_host_behind(diagnosed):
    """Why the OPT's fusion warning missed (opt_blind/compiled.sqlite.xz, the compiled loop captured): compiled, its
    step ran more kernels and less than half the GPU time the fusion model gave, and the GPU idled for the host."""
    clean, compiled = (diagnosed(case, False, OPT_BLIND) for case in ("clean", "compiled"))
    steps = {
        name: a.tables["step_accounting"].median(numeric_only=True)
        for name, a in [("clean", clean), ("compiled", compiled)]
    }
    [fusion] = [f for f in clean.findings if f.rule == "memory_bound_kernel_mix"]
    predicted_ns = fusion.gain_pct / 100 * steps["clean"]["duration"]
    assert 0 < steps["clean"]["kernel_ns"] - steps["compiled"]["kernel_ns"] < predicted_ns / 2
    assert steps["compiled"]["kernels"] > steps["clean"]["kernels"]
    assert steps["compiled"]["idle_ns"] > 3 * steps["clean"]["idle_ns"] and compiled.findings[0].rule == "launch_bound"


def test_alignment_slowdowns_are_the_measured_medians():
    """rules.ALIGNMENT_SLOWDOWN against gemm_alignment.jsonl: each unaligned product's time over the same product
    at the multiple of 8 below it, median per load width: the `_alignN` of the kernel that ran, times 2 bytes (bf16;
    sizes 2 and 4 past a multiple of 8 both ran align2 kernels)."""
    rows = [json.loads(line) for line in (FOREIGN / "gemm_alignment.jsonl").read_text().splitlines()]
    rows = [row for row in rows if "gemm_alignment" in row]
    aligned = {(r["gemm_alignment"], r["tokens"], r["hidden"], r["size"]): r["ms"] for r in rows if r["size"] % 8 == 0}
    ratios = defaultdict(list)
    for r in rows:
        if r["size"] % 8:
            [elements] = {int(m.group(1)) for k in r["kernels"] if (m := GEMM_ALIGNMENT.search(k))}
            base = aligned[r["gemm_alignment"], r["tokens"], r["hidden"], r["size"] - r["size"] % 8]
            ratios[2 * elements].append(r["ms"] / base)
    assert {width: round(statistics.median(x), 2) for width, x in ratios.items()} == ALIGNMENT_SLOWDOWN


def test_the_gpt2_clean_loops_fusion_warning_is_borne_out_by_both_fixes(diagnosed):
    """The clean GPT-2's one warning is a problem nobody planted: its GELU, written in Python, is eight kernels
    forward and more backward. PyTorch's one-kernel tanh GELU (the same function) and torch.compile each saved
    what the fusion model gives, measured without the profiler."""
    [warning] = [f for f in diagnosed("clean", source=GPT2_BLIND).findings if f.severity == "warning"]
    assert warning.rule == "memory_bound_kernel_mix"
    for fix in ("gelu_tanh", "compiled"):
        assert fix_saving_in(GPT2_BLIND, fix) > 20 and agrees(warning.gain_pct, fix_saving_in(GPT2_BLIND, fix)), fix


@pytest.mark.parametrize("case, rule", [("fp32_lm_head", "fp32_gemm"), ("gc_collect", "host_work")])
def test_a_gpt2_blind_case_is_named_first(diagnosed, case, rule):
    top = diagnosed(case, source=GPT2_BLIND).findings[0]
    assert (top.rule, top.severity) == (rule, "warning")


def test_an_fp32_lm_head_is_priced_as_measured(diagnosed):
    top = diagnosed("fp32_lm_head", source=GPT2_BLIND).findings[0]
    assert agrees(top.gain_pct, saving_in(GPT2_BLIND, "fp32_lm_head")), top.gain_pct


def test_gc_collect_agrees_from_the_capture_alone_but_not_with_the_profiled_runs_slower_steps(diagnosed):
    """gc.collect() took longer in the profiled process, outside its window too, than in the measured runs, so the
    gain as a share of that run's own steps is over the measured saving; from the capture alone it agrees."""
    measured = saving_in(GPT2_BLIND, "gc_collect")
    timed, alone = (diagnosed("gc_collect", timed, GPT2_BLIND).findings[0] for timed in (True, False))
    assert alone.rule == "host_work" and agrees(alone.gain_pct, measured)
    assert timed.gain_pct > measured and not agrees(timed.gain_pct, measured)
    rows = [json.loads(line) for line in (GPT2_BLIND / "profiled.jsonl").read_text().splitlines()]
    outside = [1000 * r["s"] for r in rows if r["case"] == "gc_collect" and not r["in_window"] and r["iteration"]]
    assert statistics.median(outside) > 1.2 * measured_ms(f"{GPT2_BLIND.name}/measured.jsonl")["gc_collect"]


def test_gradient_norm_reads_on_a_slowed_host_are_overpriced_and_the_overhead_is_flagged(diagnosed):
    """The first capture of 294 `.item()` reads a step ran on a host slowed for the whole process (its launch calls
    took twice their usual time; its iterations outside the window 92-142 ms against 89.5 measured): the reads are
    named first, over the measured saving, and profiling_overhead warns that the capture ran 68% slow."""
    findings, measured = diagnosed("grad_norm_log", source=GPT2_BLIND).findings, saving_in(GPT2_BLIND, "grad_norm_log")
    assert findings[0].rule == "sync_in_steps" and findings[0].gain_pct > measured
    [overhead] = [f for f in findings if f.rule == "profiling_overhead"]
    assert overhead.severity == "warning" and "67.7% slower" in overhead.title


def test_gradient_norm_reads_are_priced_as_measured_and_the_models_gelu_stays_above_them(diagnosed):
    """Captured again: the launches and copies between two reads (idle._Pieces.between_reads) are the reads'."""
    findings = diagnosed("grad_norm_log", source=GPT2_SECOND).findings
    [sync] = [f for f in findings if f.rule == "sync_in_steps"]
    assert findings[0].rule == "memory_bound_kernel_mix" and findings[1] == sync
    assert agrees(sync.gain_pct, saving_in(GPT2_SECOND, "grad_norm_log")), sync.gain_pct


def test_anomaly_detection_on_a_family_its_rule_was_not_written_on(diagnosed):
    top = diagnosed("anomaly_mode", source=GPT2_SECOND).findings[0]
    assert (top.rule, top.severity) == ("anomaly_detection", "warning")
    assert agrees(top.gain_pct, saving_in(GPT2_SECOND, "anomaly_mode")), top.gain_pct


def test_per_parameter_groups_cost_little_and_the_models_own_gelu_stays_first(diagnosed):
    """One optimizer group per parameter cost 4.7% measured; the finding above it is the clean loop's own GELU
    problem, about as large as on the clean capture."""
    top = diagnosed("param_groups", source=GPT2_BLIND).findings[0]
    clean = diagnosed("clean", source=GPT2_BLIND).findings[0]
    assert saving_in(GPT2_BLIND, "param_groups") < 10
    assert top.rule == clean.rule == "memory_bound_kernel_mix" and abs(top.gain_pct - clean.gain_pct) < 3


def test_the_gpt2_loops_ranges_are_not_taken_for_steps_which_are_inferred(diagnosed):
    for case in ("clean", "grad_norm_log", "gc_collect", "fp32_lm_head", "param_groups"):
        headline = diagnosed(case, source=GPT2_BLIND).headline
        assert headline["steps_captured"] == 4 and headline["steps_found_by"].startswith("inferred"), case


def outside_window_saving_pct(folder: Path, case: str) -> float:
    """The saving against the profiled process's own iterations outside its window: 1 - clean / those."""
    rows = [json.loads(line) for line in (folder / "profiled.jsonl").read_text().splitlines()]
    outside = [1000 * r["s"] for r in rows if r["case"] == case and not r["in_window"] and r["iteration"] >= WARMUP]
    return 100 * (
        1 - measured_ms(f"{folder.relative_to(FOREIGN)}/measured.jsonl")["clean"] / statistics.median(outside)
    )


def test_each_third_run_problem_was_measured():
    savings = {case: saving_in(GPT2_THIRD, case) for case in ("launch_blocking", "state_to_cpu", "activation_log")}
    assert all(saving > 20 for saving in savings.values()), savings
    assert saving_in(GPT2_THIRD, "ema_loop") < 5


def test_launches_that_wait_for_their_kernels_are_named_with_their_switch(diagnosed):
    """CUDA_LAUNCH_BLOCKING=1: every launch returned after its kernel ended (cuda.synchronous_issuers), so the launch
    overhead is synchronous_launches', not launch_bound's. Its gain is over the measured saving, since the profiled
    process ran 20% slower than the measured ones outside its window too; against those iterations it agrees."""
    findings = diagnosed("launch_blocking", source=GPT2_THIRD).findings
    top = findings[0]
    assert (top.rule, top.severity) == ("synchronous_launches", "warning")
    assert "CUDA_LAUNCH_BLOCKING" in top.recommendation and "launch_bound" not in {f.rule for f in findings}
    assert top.gain_pct > saving_in(GPT2_THIRD, "launch_blocking")
    assert agrees(top.gain_pct, outside_window_saving_pct(GPT2_THIRD, "launch_blocking")), top.gain_pct


def test_a_checkpoint_copied_to_pageable_memory_every_step_is_the_interconnects(diagnosed):
    """The state dict copied to the CPU every iteration: copies to pageable memory return only once done, so the
    CPU waits in them and the copies' time is the step's (was 0.4%, capped by the syncs' wait alone). From the
    capture alone the gain agrees; as a share of the profiled run's own steps, slower outside the window than
    in it, it is under."""
    measured = saving_in(GPT2_THIRD, "state_to_cpu")
    timed, alone = (diagnosed("state_to_cpu", timed, GPT2_THIRD).findings[0] for timed in (True, False))
    assert timed.rule == alone.rule == "interconnect" and timed.severity == "warning"
    assert agrees(alone.gain_pct, measured) and not agrees(timed.gain_pct, measured)
    assert outside_window_saving_pct(GPT2_THIRD, "state_to_cpu") > measured


def test_activation_reads_are_priced_with_the_kernels_that_made_them(diagnosed):
    """A forward hook reading each weighted module's mean output with .item(): the syncs' idle and the kernels that
    computed the values (gains.read_work), second to the model's own GELU finding, as large as on the clean loop."""
    findings = diagnosed("activation_log", source=GPT2_THIRD).findings
    clean = diagnosed("clean", source=GPT2_BLIND).findings[0]
    [sync] = [f for f in findings if f.rule == "sync_in_steps"]
    assert findings[0].rule == clean.rule == "memory_bound_kernel_mix" and findings[1] == sync
    assert abs(findings[0].gain_pct - clean.gain_pct) < 3
    assert agrees(sync.gain_pct, saving_in(GPT2_THIRD, "activation_log")), sync.gain_pct
    assert "The values read took" in sync.evidence


def test_an_average_of_the_weights_kept_parameter_by_parameter_costs_little_and_raises_nothing(diagnosed):
    """2.7% measured (its foreach fix 1.0%): the only warning is the model's own GELU finding."""
    warnings = [f.rule for f in diagnosed("ema_loop", source=GPT2_THIRD).findings if f.severity == "warning"]
    assert warnings == ["memory_bound_kernel_mix"]
    times = measured_ms(f"{GPT2_THIRD.relative_to(FOREIGN)}/measured.jsonl")
    assert 0 < 1 - times["ema_foreach"] / times["ema_loop"] < 0.05


# A GPTBigCode (StarCoder's multi-query architecture) with `train_step N` ranges: five more problems planted and
# analysed before any rule was looked at for them, with the clean loop's torch.compile fix (README.md).
BIGCODE = FOREIGN / "gpt_bigcode_blind"


def test_each_bigcode_problem_was_measured():
    savings = {c: saving_in(BIGCODE, c) for c in ("offload_activations", "fp32_tf32", "teacher_h2d", "deterministic")}
    assert all(saving > 20 for saving in savings.values()), savings
    assert 0 < saving_in(BIGCODE, "padded_mask") < 20
    assert fix_saving_in(BIGCODE, "teacher_pinned", "teacher_h2d") > 15


def test_a_pageable_copy_to_the_gpu_each_step_is_the_interconnects_and_pinning_it_is_the_fix(diagnosed):
    """A 128 MiB target copied from pageable memory every iteration: the copy call is open for all of the copy
    (staged, it returns a microsecond before the copy ends), so its thread waits there (cuda.synchronous_issuers),
    and the copy's time is the step's. Named first, within 25% of the measured saving and of its pinned fix's."""
    top = diagnosed("teacher_h2d", source=BIGCODE).findings[0]
    assert (top.rule, top.severity) == ("interconnect", "warning")
    assert agrees(top.gain_pct, saving_in(BIGCODE, "teacher_h2d")), top.gain_pct
    assert agrees(top.gain_pct, fix_saving_in(BIGCODE, "teacher_pinned", "teacher_h2d")), top.gain_pct


def test_offloaded_activations_are_the_interconnects_with_the_syncs_that_wait_for_them(diagnosed):
    """save_on_cpu: every saved activation copied to pinned memory and waited for (views.copy_syncs), so the syncs'
    idle is the copies' and not sync_in_steps' (whose remedy, dropping .item(), does not apply)."""
    findings = diagnosed("offload_activations", source=BIGCODE).findings
    top = findings[0]
    assert (top.rule, top.severity) == ("interconnect", "warning")
    assert agrees(top.gain_pct, saving_in(BIGCODE, "offload_activations")), top.gain_pct
    assert "Most synchronizations wait for these copies" in top.evidence
    assert all(f.gain_pct < 1 for f in findings if f.rule == "sync_in_steps")


def test_tf32_weights_with_attention_unfused_in_fp32_are_one_precision_finding(diagnosed):
    """Float32 weights with TF32: SDPA ran this model's attention unfused in fp32, and bf16 is the one switch for
    both, so the fp32 finding counts the attention runs and is first. It is under the measured saving: the capped
    part (the CPU's wait) cannot see that the host's own work shrinks too."""
    findings = diagnosed("fp32_tf32", source=BIGCODE).findings
    top, measured = findings[0], saving_in(BIGCODE, "fp32_tf32")
    assert (top.rule, top.severity) == ("fp32_gemm", "warning")
    assert "unfused_attention" not in {f.rule for f in findings}
    assert "Attention runs unfused" in top.evidence and "sdpa" in top.recommendation
    assert 0.6 * measured < top.gain_pct < measured and not agrees(top.gain_pct, measured)


def test_deterministic_algorithms_are_priced_as_launch_overhead_and_their_fills_named(diagnosed):
    """torch.use_deterministic_algorithms fills every new tensor (640 fill kernels a step, 38% of launches): the
    launches' idle is priced within 25% as launch_bound, whose remedy then leads with the fills' switches (written
    after this capture); the clean loop's (10% fills at most on any other capture) does not."""
    top = diagnosed("deterministic", source=BIGCODE).findings[0]
    assert (top.rule, top.severity) == ("launch_bound", "warning")
    assert agrees(top.gain_pct, saving_in(BIGCODE, "deterministic")), top.gain_pct
    assert top.recommendation.startswith("38% of the kernels launched fill memory")
    assert "fill_uninitialized_memory" in top.recommendation
    clean = diagnosed("clean", source=BIGCODE).findings[0]
    assert clean.rule == "launch_bound" and "fill" not in clean.recommendation


def test_a_padded_attention_mask_is_not_named(diagnosed):
    """An attention mask with padding doubles the cuDNN attention kernels' time (the same kernel names); no finding
    names it, and the top finding is the clean loop's own."""
    assert (
        diagnosed("padded_mask", source=BIGCODE).findings[0].rule == diagnosed("clean", source=BIGCODE).findings[0].rule
    )


def test_the_bigcode_clean_loops_warning_is_borne_out_in_direction_by_torch_compile(diagnosed):
    """The clean loop is partly host-bound: launch_bound warns (and profiling_overhead: the window ran 23% slow),
    and torch.compile (fewer launches) saved less than it gives."""
    findings = diagnosed("clean", source=BIGCODE).findings
    warnings = [f.rule for f in findings if f.severity == "warning"]
    assert warnings == ["launch_bound", "profiling_overhead"]
    assert 5 < fix_saving_in(BIGCODE, "compiled") < findings[0].gain_pct
    headline = diagnosed("clean", source=BIGCODE).headline
    assert headline["steps_captured"] == 4 and not headline["steps_found_by"].startswith("inferred")


# The GPTBigCode in fp32 without TF32 (not the case fp32_gemm's attention counting was written on) and deterministic
# algorithms with and without their fills, captured and measured on another H100 host the same day (README.md).
BIGCODE_SECOND = BIGCODE / "second_run"


def test_fp32_without_tf32_counts_its_unfused_attention_and_agrees(diagnosed):
    """fp32 weights, no TF32: the GEMMs at 14.8x and SDPA unfused in fp32, one finding, within 25% of the measured
    saving (the attention counting was written on the TF32 capture, not this one)."""
    findings = diagnosed("fp32", source=BIGCODE_SECOND).findings
    top = findings[0]
    assert (top.rule, top.severity) == ("fp32_gemm", "warning")
    assert "unfused_attention" not in {f.rule for f in findings} and "Attention runs unfused" in top.evidence
    assert agrees(top.gain_pct, saving_in(BIGCODE_SECOND, "fp32")), top.gain_pct


def test_deterministic_algorithms_cost_follows_the_host():
    """On a host whose clean loop ran 53.9 ms (the blind set's: 64.2 ms, in rounds of 56-71 ms), the same switch
    cost less than half as much: its cost is host time, which follows the host's pace."""
    assert 5 < saving_in(BIGCODE_SECOND, "deterministic") < saving_in(BIGCODE, "deterministic") / 2


# A Phi (Phi-2's architecture) with `opt_step N` ranges (steps inferred): six problems planted blind, analysed with
# the rules as they stood before any rule was looked at for them (README.md).
PHI = FOREIGN / "phi_blind"


def test_each_phi_problem_was_measured():
    savings = {c: saving_in(PHI, c) for c in ("eval_every_step", "sdpa_math", "cpu_adamw")}
    assert all(saving > 20 for saving in savings.values()), savings
    assert 0 < saving_in(PHI, "fp64_loss") < 15 and saving_in(PHI, "emit_nvtx") < 10
    assert abs(saving_in(PHI, "memory_tight")) < 5  # the cap cost nothing: the allocator's peak fitted
    assert fix_saving_in(PHI, "compiled") > 30


def test_sdpa_math_fallback_is_unfused_attention_not_fp32(diagnosed):
    """SDPA with its fused backends off: the math fallback runs the bf16 model's attention GEMMs in fp32, beside the
    model's nvjet GEMMs, whose names tell no precision. Those fp32 GEMMs are the attention's, so the finding is
    unfused attention, with SDPA's backends in its remedy, not fp32 with autocast in its (when captured: fp32_gemm,
    "no bf16 GEMM in the capture"); within 25% of the measured saving."""
    findings = diagnosed("sdpa_math", source=PHI).findings
    top = findings[0]
    assert (top.rule, top.severity) == ("unfused_attention", "warning")
    assert "fp32_gemm" not in {f.rule for f in findings}
    assert "math backend" in top.recommendation and "flash_sdp_enabled" in top.recommendation
    assert agrees(top.gain_pct, saving_in(PHI, "sdpa_math")), top.gain_pct


def test_an_evaluation_every_step_is_a_forward_no_backward_follows(diagnosed):
    """A validation loss after every iteration: the loop's thread runs the layers' forward twice a step and the
    backward follows once (recompute._passes, written after this capture). Priced within 25% of the measured
    saving, second to the model's own fusion problem (its fix measured 39.2%); the clean loop has no such pass."""
    findings = diagnosed("eval_every_step", source=PHI).findings
    extra = next(f for f in findings if f.rule == "extra_forward")
    assert extra.severity == "warning" and extra.title.startswith("2 forward passes a step, 1 of them")
    assert agrees(extra.gain_pct, saving_in(PHI, "eval_every_step")), extra.gain_pct
    assert [f.rule for f in findings[:2]] == ["memory_bound_kernel_mix", "extra_forward"]
    assert "extra_forward" not in {f.rule for f in diagnosed("clean", source=PHI).findings}


def test_an_optimizer_on_the_cpu_is_host_work_in_its_range_and_under(diagnosed):
    """AdamW on fp32 masters in host memory: the GPU idles while the CPU steps the optimizer, host_work in `update`,
    first, its remedy going by what the range does; the copies down and back and the launches between are other
    findings', so the top one is under."""
    top, measured = diagnosed("cpu_adamw", source=PHI).findings[0], saving_in(PHI, "cpu_adamw")
    assert (top.rule, top.severity) == ("host_work", "warning") and "`update`" in top.evidence
    assert "an optimizer stepped on the CPU" in top.recommendation
    assert 0.6 * measured < top.gain_pct < measured


def test_a_float64_loss_is_float64_math_and_agrees(diagnosed):
    """The logits cast to float64 for the cross-entropy: the softmax, its backward, the casts and fills on float64
    elements, half of whose time float32 saves (float64_math, written after this capture), within 3 points of the
    measured saving; the clean loop has none."""
    found = next(f for f in diagnosed("fp64_loss", source=PHI).findings if f.rule == "float64_math")
    assert found.title == "6 kernels compute in float64" and "cunn_SoftMaxForward" in found.evidence
    assert agrees(found.gain_pct, saving_in(PHI, "fp64_loss")), found.gain_pct
    assert "float64_math" not in {f.rule for f in diagnosed("clean", source=PHI).findings}


def test_emit_nvtx_is_the_profilers_cost_with_the_runs_step_times(diagnosed):
    """emit_nvtx left on costs little without the profiler (measured under 10%) but slows the window: with the
    run's step times, profiling_overhead warns and names the op-level ranges, and the top finding is the clean
    loop's."""
    findings = diagnosed("emit_nvtx", source=PHI).findings
    overhead = next(f for f in findings if f.rule == "profiling_overhead")
    assert overhead.severity == "warning" and "emit_nvtx" in overhead.evidence
    assert findings[0].rule == diagnosed("clean", source=PHI).findings[0].rule
    # from the capture alone the cost is not measured, but the op-level ranges are named, and the way to leave them out
    alone = next(f for f in diagnosed("emit_nvtx", timed=False, source=PHI).findings if f.rule == "profiling_overhead")
    assert "op-level NVTX ranges" in alone.evidence and alone.recommendation.startswith("Capture without emit_nvtx")


def test_the_phi_clean_loops_warning_is_borne_out_by_torch_compile(diagnosed):
    """Phi's GELU written in Python and its parallel block leave long elementwise chains: the fusion finding warns,
    and torch.compile of the same loop saved within 25% of its gain; a memory cap that cost nothing warns of
    nothing the clean loop does not."""
    clean = diagnosed("clean", source=PHI)
    assert (clean.findings[0].rule, clean.findings[0].severity) == ("memory_bound_kernel_mix", "warning")
    assert agrees(clean.findings[0].gain_pct, fix_saving_in(PHI, "compiled")), clean.findings[0].gain_pct
    assert clean.headline["steps_found_by"].startswith("inferred")
    warned = lambda case: {f.rule for f in diagnosed(case, source=PHI).findings if f.severity == "warning"}  # noqa: E731
    assert warned("memory_tight") <= warned("clean") | {"profiling_overhead"}


# A Gemma (Gemma's architecture, its 256,000-token vocabulary) with `minibatch N` ranges: five problems planted blind,
# analysed with the rules as they stood before any rule was looked at for them (README.md).
GEMMA = FOREIGN / "gemma_blind"


def cycle_saving_in(folder: Path, case: str, every: int) -> float:
    """The saving of removing work that comes every `every` iterations: the case's mean iteration over whole cycles
    after the warm-up, against the clean loop's median."""
    rows = [json.loads(line) for line in (folder / "measured.jsonl").read_text().splitlines()]
    runs = [r for r in rows if r.get("case") == case]
    first = -(-WARMUP // every) * every
    stop = max(r["iteration"] for r in runs) + 1
    stop -= (stop - first) % every
    mean_ms = statistics.mean(1000 * r["s"] for r in runs if first <= r["iteration"] < stop)
    return 100 * (1 - measured_ms(str((folder / "measured.jsonl").relative_to(FOREIGN)))["clean"] / mean_ms)


def test_each_gemma_problem_was_measured():
    assert cycle_saving_in(GEMMA, "eval_every_4", 4) > 20
    assert fix_saving_in(GEMMA, "distill_cached", "distill_teacher") > 10  # the teacher's forward
    assert fix_saving_in(GEMMA, "pad_longest", "pad_to_max") > 50  # a quarter of the tokens
    assert 5 < saving_in(GEMMA, "autocast_fp32_weights") < 15 and saving_in(GEMMA, "sync_timing") < 5
    assert fix_saving_in(GEMMA, "compiled") > 25


def test_a_teachers_forward_before_the_students_is_a_pass_no_backward_follows(diagnosed):
    """A frozen teacher's forward launched just before the student's: the step's first forward holds both, told apart
    by where their layers' runs break (recompute._pass_blocks, written after this capture). Priced within 25% of what
    computing the teacher's logits once saved, second to the fusion finding (the float32 distillation loss over
    256,000 logits)."""
    findings = diagnosed("distill_teacher", source=GEMMA).findings
    extra = next(f for f in findings if f.rule == "extra_forward")
    assert extra.severity == "warning" and extra.title.startswith("2 forward passes a step, 1 of them")
    assert agrees(extra.gain_pct, fix_saving_in(GEMMA, "distill_cached", "distill_teacher")), extra.gain_pct
    assert [f.rule for f in findings[:2]] == ["memory_bound_kernel_mix", "extra_forward"]


def test_an_evaluation_every_fourth_step_is_found_in_its_step(diagnosed):
    """A validation pass over 4 batches every 4th iteration: no shift of the kernel sequence matches it, but the step
    recurs 4 times with the evaluation between (step_inference's step 6); the evaluation's step is slow, and its 4
    passes have no backward. Both findings' gains are shares of the whole window (the median step has none), each
    within 25% of the measured saving over whole cycles; the cause ranks before its symptom (findings.SYMPTOMS)."""
    result = diagnosed("eval_every_4", source=GEMMA)
    assert "a sequence of 3,093 kernels recurs 4 times" in result.headline["steps_found_by"]
    measured = cycle_saving_in(GEMMA, "eval_every_4", 4)
    rules = {f.rule: f for f in result.findings}
    assert rules["extra_forward"].title.startswith("5 forward passes a step in 1 of 4 steps, 1 of them")
    assert "over the 4 steps (in 1 of them)" in rules["extra_forward"].gain_basis  # the basis the gain was taken on
    assert agrees(rules["extra_forward"].gain_pct, measured) and agrees(rules["slow_steps"].gain_pct, measured)
    # the pass (what to change) before the slow step it makes, though the slow step's gain is a little larger
    assert [f.rule for f in result.findings[:2]] == ["extra_forward", "slow_steps"]


def test_the_gemma_clean_loops_warning_is_borne_out_by_torch_compile(diagnosed):
    """The fusion finding warns on the clean loop, and torch.compile saved within 25% of its gain; no forward pass
    without a backward."""
    findings = diagnosed("clean", source=GEMMA).findings
    assert (findings[0].rule, findings[0].severity) == ("memory_bound_kernel_mix", "warning")
    assert agrees(findings[0].gain_pct, fix_saving_in(GEMMA, "compiled")), findings[0].gain_pct
    assert "extra_forward" not in {f.rule for f in findings}


def test_padding_to_the_maximum_length_is_named_only_with_the_loops_token_counts(diagnosed, tmp_path):
    """Sequences of 256 tokens padded to 1024: the capture runs the same kernels on the same shapes as for text, so
    from it nothing names the padding; given the loop's token counts (token_slots and real_tokens in its metrics, as
    sftprof's trainer writes them), `padding` is first and within 25% of padding to the longest sequence."""
    assert "padding" not in {f.rule for f in diagnosed("pad_to_max", source=GEMMA).findings}
    real = 8 * 256  # the micro-batch's real tokens (foreign_loop.PADDED_LENGTH a sequence)
    metrics = own_step_times("pad_to_max", tmp_path / "metrics.jsonl", GEMMA, real_tokens=real)
    tables = load_trace(unpack_xz(GEMMA / "pad_to_max.sqlite.xz", tmp_path / "pad_to_max.sqlite"))
    try:
        top = analyze(tables, metrics=read_metrics(metrics)).findings[0]
    finally:
        tables.events.close()
    assert (top.rule, top.severity) == ("padding", "warning") and top.title.startswith("75.0% of the token slots")
    assert agrees(top.gain_pct, fix_saving_in(GEMMA, "pad_longest", "pad_to_max")), top.gain_pct


def test_timing_each_phase_with_a_sync_is_priced_as_its_syncs(diagnosed):
    """torch.cuda.synchronize() after each phase, to log its time: the syncs' finding agrees with the small saving
    (within 3 points)."""
    syncs = next(f for f in diagnosed("sync_timing", source=GEMMA).findings if f.rule == "sync_in_steps")
    assert "5 synchronizing CUDA calls per step" in syncs.title
    assert agrees(syncs.gain_pct, saving_in(GEMMA, "sync_timing")), syncs.gain_pct


def test_float32_weights_under_autocast_are_priced_over_where_the_models_norms_cast_for_themselves(diagnosed):
    """Float32 weights under bf16 autocast (planted blind; float32_weights was written after this capture): the casts
    both ways and half the float32 AdamW, a warning second to the fusion finding, but over the saving of holding the
    weights in bf16: the Gemma's norms compute in float32 and cast for themselves, casts that come back with bf16
    weights (docs/DIAGNOSIS.md)."""
    findings = diagnosed("autocast_fp32_weights", source=GEMMA).findings
    found = next(f for f in findings if f.rule == "float32_weights")
    assert "`FusedAdamMathFunctor<float>`" in found.evidence and "precision bf16-true" in found.recommendation
    measured = saving_in(GEMMA, "autocast_fp32_weights")
    assert measured < found.gain_pct < 1.5 * measured, found.gain_pct
    assert [f.rule for f in findings[:2]] == ["memory_bound_kernel_mix", "float32_weights"]


@pytest.mark.parametrize("case", ["clean", "fp32", "foreach_off"])
def test_weights_held_in_one_precision_are_not_told_to_change_it(diagnosed, case):
    """bf16 weights (the clean loop, its foreach-free optimizer) and float32 weights without autocast (fp32_gemm's
    case): nothing is cast to 16 bits for the math, so float32_weights says nothing."""
    assert "float32_weights" not in {f.rule for f in diagnosed(case).findings}


# The OPT loop with three problems the frozen-pass and recurring-step rules (written on the Gemma's captures) were
# not written for (README.md); the teacher and the reference run in eval mode, the OPT trains with dropout.
OPT_FROZEN = FOREIGN / "opt_frozen"


@pytest.mark.parametrize("case, fix", [("teacher_deep", "teacher_deep_cached"), ("reference_kl", "reference_cached")])
def test_a_frozen_models_forward_is_found_before_or_after_the_trained_one(diagnosed, case, fix):
    """A 36-layer teacher before the 24-layer student, a reference model after the policy: each frozen forward is a
    pass of its own (its layers' runs are not the trained model's, which has dropout kernels), priced within 25% of
    computing its logits once."""
    extra = next(f for f in diagnosed(case, source=OPT_FROZEN).findings if f.rule == "extra_forward")
    assert extra.title.startswith("2 forward passes a step, 1 of them")
    assert agrees(extra.gain_pct, fix_saving_in(OPT_FROZEN, fix, case)), extra.gain_pct


def test_an_evaluation_every_third_step_in_eval_mode_is_a_slow_step_and_under_priced_as_passes(diagnosed):
    """Evaluation every 3rd iteration, in eval mode: the inferred steps are the loop's 4 `batch N` ranges (the capture
    begins and ends with the step whole), and `slow_steps` prices the evaluation's step within 25%, from the capture
    alone and with the profiled run's own step times. Its 4 passes launch no dropout kernels; with those left out of
    the layer runs they are the training forward's, counted by `extra_forward`, but priced under the saving."""
    measured = cycle_saving_in(OPT_FROZEN, "eval_every_3", 3)
    for timed in (False, True):
        result = diagnosed("eval_every_3", timed=timed, source=OPT_FROZEN)
        assert result.headline["steps_captured"] == 4
        rules = {f.rule: f for f in result.findings}
        assert agrees(rules["slow_steps"].gain_pct, measured), (timed, rules["slow_steps"].gain_pct)
        assert rules["extra_forward"].title.startswith("5 forward passes a step in 1 of 4 steps, 1 of them")
        assert 0 < rules["extra_forward"].gain_pct < 0.75 * measured, (timed, rules["extra_forward"].gain_pct)
