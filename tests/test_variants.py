"""Variants: the config that declares them, `sftprof suggest`, the verdict, and the demo with two
variants run for real through the workflow."""

from __future__ import annotations

import copy
import json
import re
import shutil

import pandas as pd
import pytest
import yaml

from sftprof import results
from sftprof.analysis import Analysis, registry
from sftprof.analysis.findings import Finding
from sftprof.analysis.variants import MIN_STEPS, WARMUP_STEPS, Run, verdict
from sftprof.capture import config
from sftprof.capture.sft import backend_settings
from sftprof.report import suggest
from sftprof.text import read_csv
from sftprof.trace.metrics import read_metrics

from conftest import REPO, SMALL_DEMO, assert_refused, planned_jobs, run_sftprof, snakemake, write_config

FIXTURES = REPO / "tests" / "fixtures"
VARIANTS = {
    "pad-longest": {"motivated_by": "padding", "sft": {"padding": "longest"}},
    "loss-every-3": {"motivated_by": "sync_in_steps", "sft": {"loss_every": 3}},
}


def _demo_with_variants() -> dict:
    demo = copy.deepcopy(SMALL_DEMO)
    demo["experiments"]["demo"]["variants"] = copy.deepcopy(VARIANTS)
    return demo


# ---------------------------------------------------------------- config


def test_variants_become_experiments_with_the_overrides_merged():
    checked = config.validate(_demo_with_variants())
    assert config.built_experiments(checked) == ["demo", "demo/pad-longest", "demo/loss-every-3"]
    variant = checked["experiments"]["demo/pad-longest"]
    assert variant["sft"]["padding"] == "longest" and checked["experiments"]["demo"]["sft"]["padding"] == "max_length"
    assert variant["sft"]["steps"] == SMALL_DEMO["experiments"]["demo"]["sft"]["steps"]  # the rest is the base's
    assert "variants" not in variant
    assert config.validate(copy.deepcopy(checked))["experiments"]["demo/pad-longest"] == variant  # repeatable


@pytest.mark.parametrize(
    "variants, message",
    [
        ({"steady": {"sft": {}}}, "experiments.demo.variants.steady: a variant may not be named like a window"),
        ({"comparison": {}}, "experiments.demo.variants.comparison: a variant may not be named"),
        ({"x": {"sft": {"padding": "shortest"}}}, "experiments.demo.variants.x.sft.padding"),
        ({"x": {"sft": {"nonsense": 1}}}, "experiments.demo.variants.x.sft"),
        ({"x": {"runtime": {}}}, "experiments.demo.variants.x"),
        ({"../x": {}}, "experiments.demo.variants"),
    ],
)
def test_bad_variants_are_refused_naming_the_key(variants, message):
    demo = copy.deepcopy(SMALL_DEMO)
    demo["experiments"]["demo"]["variants"] = variants
    with pytest.raises(config.ConfigError, match=message.replace(".", r"\.")):
        config.validate(demo)


# ---------------------------------------------------------------- suggest


@pytest.fixture(scope="module")
def padding_analysis(tmp_path_factory):
    out = tmp_path_factory.mktemp("padding")
    result = run_sftprof(
        "analyze",
        str(FIXTURES / "h200_sft_padding.sqlite"),
        "--metrics",
        str(FIXTURES / "h200_sft_padding.metrics.jsonl"),
        "-o",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    return out


def test_suggest_prints_variants_for_the_top_findings_that_validate_as_config(padding_analysis):
    result = run_sftprof("suggest", str(padding_analysis))
    assert result.returncode == 0, result.stderr
    suggested = yaml.safe_load(result.stdout)["variants"]
    findings = results.load(padding_analysis / "analysis").findings
    top_rules = [f.rule for f in findings if "torch" in suggest.REMEDIES.get(f.rule, {}) and f.gain_pct]
    assert [entry["motivated_by"] for entry in suggested.values()][0] == top_rules[0] == "padding"
    assert suggested["pad-longest"]["sft"] == {"padding": "longest", "pad_to_multiple_of": 64}
    demo = copy.deepcopy(SMALL_DEMO)
    demo["experiments"]["demo"]["variants"] = suggested
    config.validate(demo)  # pasted as printed, it is valid config


def _nemo_demo() -> dict:
    demo = copy.deepcopy(SMALL_DEMO)
    experiment = demo["experiments"]["demo"]
    experiment["sft"].update({"backend": "nemo", "device": "cuda"})
    experiment["profile"] = {
        "trace": ["cuda", "nvtx", "osrt"],
        "windows": {"steady": {"capture_range": "cudaProfilerApi", "start_step": 2, "end_step": 4}},
    }
    return demo


@pytest.mark.parametrize("backend", ["torch", "nemo"])
def test_every_remedy_sets_only_what_its_backend_reads_and_validates(backend):
    demo = _nemo_demo() if backend == "nemo" else copy.deepcopy(SMALL_DEMO)
    if backend == "torch":  # the run ddp-overlap, sdpa and no-checkpointing answer: their defaults turned round
        demo["experiments"]["demo"]["sft"].update(ddp_overlap=False, attention="eager", gradient_checkpointing=True)
    remedies = {by[backend].variant: by[backend] for by in suggest.REMEDIES.values() if backend in by}
    demo["experiments"]["demo"]["variants"] = {name: remedy.overrides for name, remedy in remedies.items()}
    checked = config.validate(demo)
    for name, remedy in remedies.items():
        sft = checked["experiments"][f"demo/{name}"]["sft"]
        assert set(remedy.overrides) == {"sft"} and set(remedy.overrides["sft"]) <= set(backend_settings(sft))
        assert sft != checked["experiments"]["demo"]["sft"]


def test_param_gather_overlap_is_refused_with_lora():
    demo = _nemo_demo()
    demo["experiments"]["demo"]["sft"]["nemo"] = {"peft": "lora", "overlap_param_gather": True}
    with pytest.raises(config.ConfigError, match=r"sft\.nemo\.overlap_param_gather: LoRA runs without"):
        config.validate(demo)


def _nemo_window(padding_analysis, tmp_path, run: dict):
    """The padding analysis as a window of a nemo run whose step 0 says `run`."""
    window = tmp_path / "steady"
    shutil.copytree(padding_analysis / "analysis", window / "analysis" / "rank0")
    (window / "capture").mkdir()
    line = {"step": 0, "rank": 0, "loss": 1.0, "step_time_s": 0.3, "tokens": 8, "tokens_per_s": 26.7}
    record = {**line, "in_window": False, "run": run}
    (window / "capture" / "profile.rank0.metrics.jsonl").write_text(json.dumps(record) + "\n")
    return window


def test_suggest_on_a_nemo_run_proposes_nemo_knobs_only(padding_analysis, tmp_path):
    """The same findings, from a run whose metrics say backend nemo: padding becomes packing, and the findings
    whose remedies are built-in switches (which nemo ignores) suggest nothing."""
    window = _nemo_window(padding_analysis, tmp_path, {"backend": "nemo"})
    assert suggest.run_facts(window) == {"backend": "nemo"} and suggest.run_facts(padding_analysis) == {}
    result = run_sftprof("suggest", str(window))
    assert result.returncode == 0, result.stderr
    suggested = yaml.safe_load(result.stdout)["variants"]
    assert suggested["packed"] == {"motivated_by": "padding", "sft": {"nemo": {"packed_sequence": True}}}
    # the host-overhead share of the idle time, answered by NeMo's CUDA graphs; nothing else is a NeMo knob
    assert suggested.get("cuda-graphs", {}).get("motivated_by", "launch_bound") == "launch_bound"
    assert set(suggested) <= {"packed", "cuda-graphs"}
    forced = yaml.safe_load(run_sftprof("suggest", str(padding_analysis), "--backend", "nemo").stdout)
    assert forced["variants"] == suggested


@pytest.mark.parametrize("layer_spec", ["local", "transformer_engine"])
def test_suggest_leaves_out_what_the_runs_stack_cannot_take(padding_analysis, tmp_path, layer_spec):
    """Packing needs Transformer Engine's attention: on a run without it (megatron-core's local spec), suggest
    says the remedy exists and why it is left out, and proposes nothing that would fail."""
    window = _nemo_window(padding_analysis, tmp_path, {"backend": "nemo", "layer_spec": layer_spec})
    result = run_sftprof("suggest", str(window))
    assert result.returncode == 0, result.stderr
    suggested = (yaml.safe_load(result.stdout) or {}).get("variants", {})
    if layer_spec == "local":
        assert suggested == {}
        assert "# Not suggested, padding: `packed`" in result.stdout and "needs Transformer Engine" in result.stdout
    else:
        assert "packed" in suggested and set(suggested) <= {"packed", "cuda-graphs"}
        assert "Not suggested" not in result.stdout


def test_a_run_fact_of_the_wrong_type_is_refused(padding_analysis, tmp_path):
    window = _nemo_window(padding_analysis, tmp_path, {"backend": ["nemo"]})
    result = run_sftprof("suggest", str(window))
    assert result.returncode != 0 and "run.backend must be a string" in result.stderr
    assert "Traceback" not in result.stderr


def test_suggest_refuses_a_folder_without_an_analysis(tmp_path):
    result = run_sftprof("suggest", str(tmp_path))
    assert result.returncode != 0 and "no analysis.json" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("top", ["0", "-1"])
def test_suggest_refuses_a_top_below_one(padding_analysis, top):
    """--top 0 and --top -1 printed every variant."""
    assert_refused(run_sftprof("suggest", padding_analysis, "--top", top), contains="--top must be at least 1")


def test_a_newline_in_a_folder_name_adds_no_variant_to_suggests_yaml(padding_analysis, tmp_path):
    """The folder is named in a YAML comment: a newline in it ended the comment and added a variant."""
    folder = tmp_path / "x\nvariants:\n  rogue: {sft: {compile: true}}\n#"
    shutil.copytree(padding_analysis / "analysis", folder / "analysis")
    result = run_sftprof("suggest", folder)
    assert result.returncode == 0, result.stderr
    suggested = yaml.safe_load(result.stdout)["variants"]
    assert "rogue" not in suggested and set(suggested) <= {
        r.variant for by in suggest.REMEDIES.values() for r in by.values()
    }
    assert "x\\nvariants:" in result.stdout


# ---------------------------------------------------------------- the verdict


def _metrics(tmp_path, name, step_s, loss, steps=30, window=(10, 11), tokens=1000):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "step": s,
                    "rank": 0,
                    "loss": loss(s),
                    "step_time_s": step_s(s),
                    "tokens": tokens,
                    "tokens_per_s": tokens / step_s(s),
                    "in_window": window[0] <= s <= window[1],
                }
            )
            + "\n"
            for s in range(steps)
        )
    )
    return read_metrics(path)


def _finding(rule, gain):
    return Finding(rule, "warning" if gain >= 5 else "info", rule, "", "", gain, "test")


def test_verdict_measures_the_median_step_outside_the_window(tmp_path):
    noise = [0.0, 0.002, -0.002, 0.001, -0.001]
    base = Run(
        [_finding("padding", 60.0)],
        _metrics(
            tmp_path,
            "base",
            lambda s: 5.0 if s < WARMUP_STEPS or 10 <= s <= 11 else 0.100 + noise[s % 5],
            lambda s: 3.0 - 0.01 * s + noise[s % 5],
        ),
    )
    fixed = Run(
        [_finding("padding", 2.0)],
        _metrics(tmp_path, "fixed", lambda s: 0.040 + noise[s % 5], lambda s: 3.0 - 0.01 * s + noise[(s + 2) % 5]),
    )
    wrong = Run(
        [_finding("padding", 55.0)],
        _metrics(tmp_path, "wrong", lambda s: 0.100 + noise[s % 5], lambda s: 2.0 - 0.01 * s),
    )
    table = verdict(base, {"fixed": ("padding", fixed), "wrong": ("padding", wrong)}).set_index("variant")
    assert table.at["fixed", "measured_gain_pct"] == pytest.approx(60.0)
    assert table.at["fixed", "predicted_gain_pct"] == 60.0
    assert table.at["fixed", "steps_measured"] == 30 - WARMUP_STEPS - 2
    assert table.at["fixed", "finding_gone"] and not table.at["fixed", "loss_changed"]
    assert table.at["wrong", "measured_gain_pct"] == pytest.approx(0.0)
    assert not table.at["wrong", "finding_gone"] and table.at["wrong", "loss_changed"]
    assert "loss curve moved" in table.at["wrong", "verdict"]
    assert table.at["fixed", "real_tokens_per_s"] == pytest.approx(1000 / 0.040, rel=0.01)


def test_verdict_says_when_too_few_steps_were_measured(tmp_path):
    run = Run([], _metrics(tmp_path, "short", lambda s: 0.1, lambda s: 1.0, steps=10, window=(5, 6)))
    row = verdict(run, {"same": (None, run)}).iloc[0]
    assert row["steps_measured"] == 10 - WARMUP_STEPS - 2 < MIN_STEPS
    assert f"want {MIN_STEPS}+" in row["verdict"] and row["finding_gone"] is None


# ---------------------------------------------------------------- the demo with two variants, for real


@pytest.fixture(scope="module")
def variants_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("variants")
    demo = _demo_with_variants()
    demo["experiments"]["demo"]["sft"]["steps"] = 12  # a CI-sized run: the verdict flags its few steps
    write_config(workdir, demo)
    plan = planned_jobs(snakemake(workdir, "-n"))
    snakemake(workdir)
    return workdir, plan


@pytest.mark.e2e
def test_each_variant_runs_as_its_own_profiled_job_with_its_own_paths(variants_run):
    workdir, plan = variants_run
    assert plan["profile_sft"] == 3 and plan["render_report"] == 3 and plan["compare_variants"] == 1
    for name in ("demo", "demo/pad-longest", "demo/loss-every-3"):
        assert (workdir / "results" / name / "steady" / "report.html").is_file()
    record = read_metrics(workdir / "results/demo/pad-longest/steady/capture/profile.rank0.metrics.jsonl").run
    assert record["padding"] == "longest"


@pytest.mark.e2e
def test_the_verdict_has_a_row_per_variant(variants_run):
    workdir, _ = variants_run
    table = read_csv(workdir / "results/demo/variants/variants.csv")
    assert list(table["variant"]) == ["pad-longest", "loss-every-3"]
    assert table["median_step_ms"].notna().all() and table["baseline_median_step_ms"].notna().all()
    base = read_metrics(workdir / "results/demo/steady/capture/profile.rank0.metrics.jsonl").steps
    outside = int((~base["in_window"].astype(bool) & (base["step"] >= WARMUP_STEPS)).sum())
    assert outside > 0 and (table["steps_measured"] == outside).all()
    html = (workdir / "results/demo/variants/variants.html").read_text()
    assert "pad-longest" in html and "measured" in html


@pytest.mark.e2e
def test_changing_one_variant_reruns_only_that_variant(variants_run, tmp_path):
    workdir, _ = variants_run
    copy_dir = tmp_path / "changed"
    shutil.copytree(workdir, copy_dir, symlinks=True)
    demo = _demo_with_variants()
    demo["experiments"]["demo"]["sft"]["steps"] = 12
    demo["experiments"]["demo"]["variants"]["loss-every-3"]["sft"]["loss_every"] = 4
    write_config(copy_dir, demo)
    dry = snakemake(copy_dir, "-n")
    plan = planned_jobs(dry)
    assert plan["profile_sft"] == 1 and plan["compare_variants"] == 1
    outputs = [line.split(":", 1)[1].strip() for line in dry.stdout.splitlines() if line.strip().startswith("output:")]
    assert "results/demo/loss-every-3/steady/capture" in outputs
    assert not {"results/demo/steady/capture", "results/demo/pad-longest/steady/capture"} & set(outputs)


# ---------------------------------------------------------------- suggested variants, added by the workflow


def _demo_suggesting(**setting) -> dict:
    demo = copy.deepcopy(SMALL_DEMO)
    demo["experiments"]["demo"]["sft"]["steps"] = 12
    demo["experiments"]["demo"]["suggested_variants"] = {"enabled": True, **setting}
    return demo


def test_suggested_variants_is_off_unless_enabled_and_not_inherited_by_variants():
    assert config.suggested_variant_count(config.validate(_demo_with_variants()), "demo") == 0
    checked = config.validate(_demo_suggesting(enabled=False))
    assert config.suggested_variant_count(checked, "demo") == 0
    demo = _demo_suggesting(top=2)
    demo["experiments"]["demo"]["variants"] = copy.deepcopy(VARIANTS)
    checked = config.validate(demo)
    assert config.suggested_variant_count(checked, "demo") == 2
    assert "suggested_variants" not in checked["experiments"]["demo/pad-longest"]
    with pytest.raises(config.ConfigError, match=r"experiments\.demo\.suggested_variants\.top"):
        config.validate(_demo_suggesting(top=0))


def test_the_checkpoint_adds_what_suggest_prints_and_hand_written_variants_win(padding_analysis, tmp_path):
    """The checkpoint's variant list (write_suggestions -> read_suggestions -> add_suggested_variants) on a real
    H200 analysis with findings that have remedies."""
    path = tmp_path / "suggested-variants.yaml"
    suggest.write_suggestions(padding_analysis, "torch", 3, path)
    suggested = suggest.read_suggestions(path)
    findings = results.load(padding_analysis / "analysis").findings
    ranked = [suggest.REMEDIES[f.rule]["torch"].variant for f in findings if f.rule in suggest.REMEDIES and f.gain_pct]
    assert list(suggested) == list(dict.fromkeys(ranked))[:3] and "pad-longest" in suggested
    checked = config.validate(_demo_with_variants())  # hand-written pad-longest pads to the exact longest length
    config.add_suggested_variants(checked, "demo", suggested)
    config.add_suggested_variants(checked, "demo", suggested)  # repeatable: input functions ask again
    assert config.built_experiments(checked) == ["demo", "demo/pad-longest", "demo/loss-every-3"] + [
        f"demo/{name}" for name in suggested if name != "pad-longest"
    ]
    assert checked["experiments"]["demo/pad-longest"]["sft"]["pad_to_multiple_of"] == 1  # the hand-written one
    assert checked["experiments"]["demo/compiled"]["sft"]["compile"] is True
    assert config.variants_of(checked, "demo")["compiled"]["motivated_by"] == "memory_bound_kernel_mix"


@pytest.fixture(scope="module")
def suggesting_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("suggesting")
    write_config(workdir, _demo_suggesting())
    plan = planned_jobs(snakemake(workdir, "-n"))
    snakemake(workdir)
    return workdir, plan


@pytest.mark.e2e
def test_the_switch_runs_the_baseline_then_what_its_analysis_suggests(suggesting_run):
    """The CPU demo has no finding that a switch fixes (no GPU, no padding finding): nothing is added, and the
    verdict says so."""
    workdir, plan = suggesting_run
    assert plan["profile_sft"] == 1 and plan["suggest_variants"] == 1 and plan["compare_variants"] == 1
    findings = results.load(workdir / "results/demo/steady/analysis/rank0").findings
    assert not suggest.suggest(Analysis("demo", 0, [], findings=findings))
    assert suggest.read_suggestions(workdir / "results/demo/suggested-variants.yaml") == {}
    assert sorted(p.name for p in (workdir / "results/demo").iterdir()) == [
        "steady",
        "suggested-variants.yaml",
        "variants",
    ]
    assert read_csv(workdir / "results/demo/variants/variants.csv").empty
    assert "No variants to compare" in (workdir / "results/demo/variants/variants.html").read_text()


@pytest.mark.e2e
@pytest.mark.ci_sample(0)  # a second variant run, 24 s: the switch test below runs one in CI
def test_suggested_variants_run_as_variants_once_the_suggestion_has_them(suggesting_run, padding_analysis, tmp_path):
    """The loop with a suggestion that has a variant: the checkpoint's file, as the workflow wrote it, replaced by
    what the H200 padding analysis suggests (its top one), then the workflow run again for real."""
    workdir = tmp_path / "suggested"
    shutil.copytree(suggesting_run[0], workdir, symlinks=True)
    suggest.write_suggestions(padding_analysis, "torch", 1, workdir / "results/demo/suggested-variants.yaml")
    plan = planned_jobs(snakemake(workdir, "-n"))
    assert plan["profile_sft"] == 1 and plan["compare_variants"] == 1 and "suggest_variants" not in plan
    snakemake(workdir)
    assert (workdir / "results/demo/pad-longest/steady/report.html").is_file()
    record = read_metrics(workdir / "results/demo/pad-longest/steady/capture/profile.rank0.metrics.jsonl").run
    assert (record["padding"], record["pad_to_multiple_of"]) == ("longest", 64)
    row = read_csv(workdir / "results/demo/variants/variants.csv").iloc[0]
    assert (row["variant"], row["motivated_by"]) == ("pad-longest", "padding")
    assert row["median_step_ms"] > 0 and "the baseline has no `padding` finding" in row["verdict"]
    assert "Nothing to be done" in snakemake(workdir, "-n").stdout


# ---------------------------------------------------------------- the loop on an H200, committed

H200 = FIXTURES / "variants_h200"


def _h200_findings(name: str) -> list[Finding]:
    """The findings of a committed analysis.json (the loop's tables are not committed)."""
    return [Finding(**entry) for entry in json.loads((H200 / f"{name}.analysis.json").read_text())["findings"]]


def _h200_run(tmp_path, name: str) -> Run:
    return Run(_h200_findings(name), read_metrics(H200 / f"{name}.metrics.jsonl"))


def test_h200_loop_measured_gains_stay_under_their_bounds_where_the_fix_removes_the_cause(tmp_path):
    """docs/USAGE.md's table: padding to a multiple of 64 paid 55% of a bound near 80%; the exact longest
    length did not pay (cuDNN plans anew for every length) though its finding went; no fix moved the loss."""
    first = verdict(
        _h200_run(tmp_path, "baseline"),
        {
            name: (rule, _h200_run(tmp_path, name))
            for name, rule in (
                ("pad-longest", "padding"),
                ("compiled", "memory_bound_kernel_mix"),
                ("loss-every-50", "sync_in_steps"),
            )
        },
    )
    second = verdict(
        _h200_run(tmp_path, "session2-baseline"),
        {"pad-longest-64": ("padding", _h200_run(tmp_path, "session2-pad-longest-64"))},
    )
    table = pd.concat([first, second]).set_index("variant")
    assert (table["steps_measured"] >= MIN_STEPS).all() and table["finding_gone"].all()
    assert not table["loss_changed"].fillna(False).any()
    fixed = table.loc["pad-longest-64"]
    assert 0.5 * fixed["predicted_gain_pct"] < fixed["measured_gain_pct"] < fixed["predicted_gain_pct"]
    assert fixed["real_tokens_per_s"] > 1.8 * fixed["baseline_real_tokens_per_s"]
    exact = table.loc["pad-longest"]
    assert exact["measured_gain_pct"] < 10 and exact["real_tokens_per_s"] < exact["baseline_real_tokens_per_s"]
    assert table.loc["compiled", "measured_gain_pct"] > 20


def test_baseline_runs_in_two_sessions_agree(tmp_path):
    row = verdict(_h200_run(tmp_path, "baseline"), {"again": (None, _h200_run(tmp_path, "session2-baseline"))}).iloc[0]
    assert abs(row["measured_gain_pct"]) < 2 and not row["loss_changed"]


def test_suggest_pads_to_a_multiple_the_gpu_plans_once(tmp_path):
    analysis = Analysis(source_path="baseline", span_ns=0, sources=[], findings=_h200_findings("baseline"))
    entry = {name: body for name, body, _, _ in suggest.suggest(analysis)}["pad-longest"]
    assert entry["sft"] == {"padding": "longest", "pad_to_multiple_of": 64}


def test_every_remedy_answers_a_finding_the_analysis_can_raise():
    """REMEDIES is keyed by finding rule ids: a key no rule of the registry returns would never be suggested."""
    raised = {rule_id for rule in registry.RULES for rule_id in re.split(r"[,\s]+", rule.name) if rule_id}
    assert set(suggest.REMEDIES) <= raised
    assert {backend for by in suggest.REMEDIES.values() for backend in by} == {"torch", "nemo"}


@pytest.mark.parametrize("overlapped", [False, True])
def test_exposed_communication_suggests_ddp_overlap_only_to_a_run_without_it(overlapped):
    """A remedy the run's facts say it already had would measure nothing: it is left out, with a reason."""
    analysis = Analysis("ranks", 0, [], findings=[_finding("exposed_communication", 20.0)])
    run = {"backend": "torch", "ddp_overlap": overlapped}
    names = [name for name, *_ in suggest.suggest(analysis, run=run)]
    assert names == ([] if overlapped else ["ddp-overlap"])
    assert bool(suggest.ruled_out(analysis, run)) == overlapped
    if overlapped:
        assert "is what the run already did" in suggest.ruled_out(analysis, run)[0]
